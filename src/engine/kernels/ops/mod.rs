//! The operators of the domain, one file each: its part of the contract, its attributes, shape
//! check and output shapes, its CPU kernel and how it runs on CUDA, and its tests.

pub(crate) mod attention;
pub(crate) mod bias_gelu;
pub(crate) mod bias_rms_norm;
pub(crate) mod bias_rms_norm_rope;
pub(crate) mod causal_conv3d;
pub(crate) mod gated_residual_layer_norm;
pub(crate) mod matmul_bias_gelu;
pub(crate) mod prefix_bias_rms_norm;
pub(crate) mod qkv_norm_rope_cache;

pub(crate) use attention::Attention;
pub(crate) use bias_gelu::BiasGelu;
pub(crate) use bias_rms_norm::BiasRmsNorm;
pub(crate) use bias_rms_norm_rope::BiasRmsNormRope;
pub(crate) use causal_conv3d::CausalConv3d;
pub(crate) use gated_residual_layer_norm::GatedResidualLayerNorm;
pub(crate) use matmul_bias_gelu::MatMulBiasGelu;
pub(crate) use prefix_bias_rms_norm::PrefixBiasRmsNorm;
pub(crate) use qkv_norm_rope_cache::QkvNormRopeCache;

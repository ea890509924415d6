//! The operators of the domain, one file each (its part of the contract, its attributes, shape
//! check and output shapes, its CPU kernel and how it runs on CUDA, with its tests beside it in
//! `<name>/tests.rs`), and the registry that lists them.

use super::operator::{Registration, entry};
#[cfg(test)]
use super::test_support::{Rng, Tolerance};

/// Declares each operator's module, re-exports its type, lists them all in [`REGISTRY`], and
/// runs each one's check through ONNX Runtime for the test that spans them.
macro_rules! operators {
    ($($module:ident :: $op:ident),* $(,)?) => {
        $(pub(crate) mod $module;)*
        $(pub(crate) use $module::$op;)*

        /// The operators of the domain, in the order they are added to it.
        pub(crate) const REGISTRY: &[Registration] = &[$(entry::<$op>()),*];

        /// Each operator's `tests::check_through_onnx_runtime`, in the registry's order, on cases
        /// drawn from `rng`.
        #[cfg(test)]
        pub(crate) fn check_through_onnx_runtime<T: Tolerance>(rng: &mut Rng) {
            $($module::tests::check_through_onnx_runtime::<T>(rng);)*
        }
    };
}

// The registry: one line per operator.
operators! {
    bias_rms_norm_rope::BiasRmsNormRope,
    bias_rms_norm::BiasRmsNorm,
    gated_residual_layer_norm::GatedResidualLayerNorm,
    qkv_norm_rope_cache::QkvNormRopeCache,
    bias_gelu::BiasGelu,
    prefix_bias_rms_norm::PrefixBiasRmsNorm,
    matmul_bias_gelu::MatMulBiasGelu,
    matmul_fp8::MatMulFp8,
    attention::Attention,
    causal_conv3d::CausalConv3d,
}

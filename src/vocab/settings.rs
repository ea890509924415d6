//! The settings' values: each concept is one type, defined here and reused by the manifest (its
//! schema and TOML form), the engine, the worker's command line (clap's `ValueEnum`) and the
//! records (`Display`). A setting's spelling is `snake_case` everywhere.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use super::values::ValueError;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Derives for a plain setting enum: serde and schema (snake_case), clap's value parser, and its
/// name as `Display` / `&'static str`.
macro_rules! setting_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize,
            JsonSchema, clap::ValueEnum, strum::Display, strum::EnumString, strum::IntoStaticStr, strum::VariantArray,
        )]
        #[serde(rename_all = "snake_case")]
        #[strum(serialize_all = "snake_case")]
        #[value(rename_all = "snake_case")]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            /// The setting's spelling in manifests, flags and records.
            pub fn name(self) -> &'static str {
                self.into()
            }
        }
    };
}

setting_enum! {
    /// The dtype of every float tensor the graphs take or give (fixed when a bundle is exported).
    pub enum Precision {
        Fp32,
        #[default]
        Fp16,
        Bf16,
        /// Opt-in reduced precision, never the default: float16 tensors as in an fp16 bundle,
        /// with the matrix multiplies of the DiT's blocks in `dit_fused` in float8 E4M3
        /// (per-channel weight and per-token activation scales), run by the runner's fused DiT
        /// on CUDA alone. Its times and scores are not those of full precision.
        Fp8,
    }
}

impl Precision {
    /// What a reduced-precision mode computes below its tensors' float type, as reports and
    /// comparisons say it; `None` for the full-precision ones.
    pub fn reduced(self) -> Option<&'static str> {
        match self {
            Precision::Fp8 => Some("DiT matrix multiplies in float8"),
            Precision::Fp32 | Precision::Fp16 | Precision::Bf16 => None,
        }
    }
}

setting_enum! {
    /// Which execution provider a run's sessions are built on.
    pub enum ProviderKind {
        /// ONNX Runtime's CPU provider (tests and small models).
        #[default]
        Cpu,
        /// ONNX Runtime's CUDA provider.
        Cuda,
        /// TensorRT, with CUDA registered after it for the nodes TensorRT does not take.
        Tensorrt,
    }
}

setting_enum! {
    /// The arithmetic of the DiT's self-attention in the runner's fused DiT.
    pub enum AttentionPrecision {
        /// In the bundle's float type (cuDNN's flash attention on CUDA): the exact mode.
        #[default]
        Fp16,
        /// Opt-in 8-bit attention, never the default: Q·Kᵀ in int8 (K less its mean over the
        /// keys, which leaves the softmax unchanged; one scale per 16 query rows and per 64 keys
        /// of a head) and P·V in float8 E4M3 (one scale per channel of V), float32
        /// accumulation. The runner's own kernel on Hopper GPUs (sm_90), its CPU reference on
        /// the CPU. Its times and scores are not those of full precision.
        Int8,
    }
}

impl AttentionPrecision {
    /// What the 8-bit mode computes below the tensors' float type, as reports and comparisons
    /// say it; `None` for the exact mode.
    pub fn reduced(self) -> Option<&'static str> {
        match self {
            AttentionPrecision::Int8 => Some("DiT self-attention in int8 and float8"),
            AttentionPrecision::Fp16 => None,
        }
    }
}

setting_enum! {
    /// The attention kernel. On the CUDA provider it is ONNX Runtime's `sdpa_kernel` option of
    /// `MultiHeadAttention`, which uses that kernel where it supports the inputs and its unfused
    /// kernel elsewhere; a kernel that can never run for the provider and precision is refused
    /// before any work. In the runner's fused DiT (`dit_kernels`, exporter 0.10.0 and later) the
    /// self-attention is the runner's own call of cuDNN's flash attention with `auto` and
    /// `cudnn_flash`; any other kernel keeps the fused DiT, its other kernels and CUDA graphs,
    /// and runs its self-attention as ONNX Runtime's `MultiHeadAttention` with that kernel.
    pub enum AttentionBackend {
        /// The fastest measured for the GPU and precision.
        #[default]
        Auto,
        /// Flash attention.
        Flash,
        /// FA2-class flash attention, the Blackwell (GB200) path of `gb200_speed.toml`; on ONNX
        /// Runtime it selects the same fused flash kernels as `flash` (its flash attention is
        /// FlashAttention-2), also for the fused DiT's self-attention, and results record that
        /// it was asked for.
        Fa2,
        /// cuDNN's flash attention.
        CudnnFlash,
        /// Memory-efficient attention.
        Efficient,
        /// Unfused reference attention.
        Math,
    }
}

setting_enum! {
    /// Which kernels do the per-row elementwise work of the DiT (`runtime.dit_kernels`) or of the
    /// VAE decoder (`runtime.vae_kernels`): the bundle's fused graphs with the runner's own
    /// operators (`ai.unstep`), or the standard graphs with ONNX Runtime's stock kernels.
    pub enum FusedKernels {
        /// The runner's own on CUDA when the bundle has the fused graphs and NVRTC, cuBLASLt and
        /// cuDNN load (for a DiT whose self-attention is the runner's, exporter 0.10.0 and later,
        /// not with an fp32 bundle); ONNX Runtime's otherwise.
        #[default]
        Auto,
        /// The runner's own, on any provider but TensorRT (on the CPU, for tests and
        /// comparisons).
        Unstep,
        /// ONNX Runtime's stock kernels on the standard graphs.
        Onnxruntime,
    }
}

setting_enum! {
    /// cuDNN convolution algorithm search of the CUDA provider (`cudnn_conv_algo_search`).
    pub enum ConvAlgoSearch {
        #[default]
        Exhaustive,
        Heuristic,
        Default,
    }
}

setting_enum! {
    /// How the CUDA memory arena grows (`arena_extend_strategy`).
    pub enum ArenaExtend {
        SameAsRequested,
        #[default]
        NextPowerOfTwo,
    }
}

setting_enum! {
    /// Which prediction becomes a block's output latent.
    pub enum Emit {
        /// The clean-cache pass's x0 prediction (`x_c - sigma_c * v_c`): the method's default.
        #[default]
        CachePass,
        /// The last denoising step's x0, ignoring the clean-cache pass's prediction.
        Denoised,
    }
}

/// Where the timed region of a prompt ends: [`TimedRegionEnd::Uint8Frames`] by default,
/// [`TimedRegionEnd::VaeOutput`] with `timing.exclude_final_output_layout`, and
/// [`TimedRegionEnd::Latents`] when nothing is decoded (`runner worker --latents-only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::Display)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum TimedRegionEnd {
    /// uint8 frames laid out on the device, device synchronised.
    Uint8Frames,
    /// The VAE output on the device; the final clamp and layout are outside.
    VaeOutput,
    /// The DiT's last block; nothing was decoded.
    Latents,
}

impl TimedRegionEnd {
    /// The end of a decoded prompt's timed region.
    pub fn of(exclude_final_output_layout: bool) -> TimedRegionEnd {
        if exclude_final_output_layout {
            TimedRegionEnd::VaeOutput
        } else {
            TimedRegionEnd::Uint8Frames
        }
    }
}

/// Low-rank factorisation of the DiT's linear layers at export: `none` or a positive rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SvdRank {
    #[default]
    None,
    Rank(u32),
}

impl FromStr for SvdRank {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        if s.trim() == "none" {
            return Ok(SvdRank::None);
        }
        match s.trim().parse::<u32>() {
            Ok(r) if r > 0 => Ok(SvdRank::Rank(r)),
            _ => Err(ValueError::SvdRank(s.to_string())),
        }
    }
}

impl fmt::Display for SvdRank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SvdRank::None => f.write_str("none"),
            SvdRank::Rank(r) => write!(f, "{r}"),
        }
    }
}

impl Serialize for SvdRank {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SvdRank::None => s.serialize_str("none"),
            SvdRank::Rank(r) => s.serialize_u32(*r),
        }
    }
}

impl<'de> Deserialize<'de> for SvdRank {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = SvdRank;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("`none` or a positive rank")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SvdRank, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<SvdRank, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<SvdRank, E> {
                self.visit_str(&v.to_string())
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for SvdRank {
    fn schema_name() -> Cow<'static, str> {
        "SvdRank".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [ { "const": "none" }, { "type": "integer", "minimum": 1 } ],
            "description": "`none`, or the rank of the low-rank factorisation of DiT linear layers."
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every spelling is the same in TOML/JSON, on the command line and in records.
    #[test]
    fn setting_names_are_snake_case_everywhere() {
        for &kernel in <AttentionBackend as strum::VariantArray>::VARIANTS {
            let json = serde_json::to_string(&kernel).unwrap();
            assert_eq!(json, format!("\"{}\"", kernel.name()));
            assert_eq!(kernel.to_string(), kernel.name());
            assert_eq!(kernel.name().parse::<AttentionBackend>(), Ok(kernel));
            let flag = <AttentionBackend as clap::ValueEnum>::from_str(kernel.name(), false);
            assert_eq!(flag, Ok(kernel));
        }
        assert_eq!(AttentionBackend::CudnnFlash.name(), "cudnn_flash");
        assert_eq!(ArenaExtend::SameAsRequested.name(), "same_as_requested");
        assert_eq!(Emit::CachePass.name(), "cache_pass");
        assert_eq!(ProviderKind::Tensorrt.name(), "tensorrt");
        for &precision in <Precision as strum::VariantArray>::VARIANTS {
            let json = serde_json::to_string(&precision).unwrap();
            assert_eq!(json, format!("\"{}\"", precision.name()));
            assert_eq!(precision.name().parse::<Precision>(), Ok(precision));
            let flag = <Precision as clap::ValueEnum>::from_str(precision.name(), false);
            assert_eq!(flag, Ok(precision));
        }
        assert_eq!(Precision::Fp8.name(), "fp8");
    }

    /// fp8 is opt-in: never the default, and the one reduced precision.
    #[test]
    fn fp8_is_the_opt_in_reduced_precision() {
        assert_eq!(Precision::default(), Precision::Fp16);
        for &precision in <Precision as strum::VariantArray>::VARIANTS {
            assert_eq!(
                precision.reduced().is_some(),
                precision == Precision::Fp8,
                "{precision}"
            );
        }
    }

    #[test]
    fn svd_ranks_are_none_or_positive() {
        assert_eq!("none".parse::<SvdRank>(), Ok(SvdRank::None));
        assert_eq!("8".parse::<SvdRank>(), Ok(SvdRank::Rank(8)));
        assert!("0".parse::<SvdRank>().is_err());
        assert_eq!(
            toml::from_str::<std::collections::BTreeMap<String, SvdRank>>("r = 16").unwrap()["r"],
            SvdRank::Rank(16)
        );
    }
}

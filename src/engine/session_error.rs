//! Why a bundle's sessions could not be built or cannot run as asked: what session building
//! (`session.rs`) and the checks of the runtime options (`options.rs`) both return.

use super::bundle::BundleError;
use super::ort_lib::OrtLoadError;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Runtime(#[from] OrtLoadError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(
        "register execution provider {provider} for {graph}: {source}; run `runner doctor` to see which providers this ONNX Runtime has"
    )]
    Provider {
        provider: &'static str,
        graph: String,
        source: ort::Error,
    },
    #[error("attention backend {backend} is not available on {provider}: {reason}")]
    AttentionUnavailable {
        backend: &'static str,
        provider: &'static str,
        reason: String,
    },
    #[error(
        "the runner's fused kernels ({setting}) are not available on {provider}: {reason}; use {setting} = \"onnxruntime\" (`--{flag} onnxruntime`)"
    )]
    KernelsUnavailable {
        setting: &'static str,
        flag: &'static str,
        provider: &'static str,
        reason: String,
    },
    #[error(
        "an fp8 bundle runs its DiT's 8-bit matrix multiplies only with the runner's kernels on its `dit_fused` graph (runtime.dit_kernels = \"auto\" or \"unstep\", `--dit-kernels`) on the CUDA provider: {reason}"
    )]
    Fp8NeedsRunnerKernels { reason: String },
    #[error(
        "the 8-bit attention (method.attention_precision = \"int8\") cannot run here: {reason}"
    )]
    Int8AttentionUnavailable { reason: String },
    #[error("load graph {graph}: {source}")]
    Load { graph: String, source: LoadCause },
    #[error(
        "rewrite graph {graph}'s self-attention as ONNX Runtime's MultiHeadAttention (attention_backend = \"{backend}\"): {source}; use attention_backend = \"auto\" or \"cudnn_flash\" for the runner's own"
    )]
    AttentionRewrite {
        graph: String,
        backend: &'static str,
        source: super::graph_rewrite::RewriteError,
    },
}

/// Why a graph's session could not be built: ONNX Runtime's error, a file or folder the build
/// reads or makes, or a diagnostic switch it cannot apply. Each keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum LoadCause {
    #[error(transparent)]
    Ort(#[from] ort::Error),
    #[error("{what} {}: {source}", path.display())]
    File {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("the folder of {} is not UTF-8", .0.display())]
    NotUtf8(std::path::PathBuf),
    #[error(transparent)]
    Diagnostics(#[from] DiagnosticsEnvError),
}

/// A builder's error, which hands the builder back, keeps only ONNX Runtime's error.
impl From<ort::Error<ort::session::builder::SessionBuilder>> for LoadCause {
    fn from(e: ort::Error<ort::session::builder::SessionBuilder>) -> Self {
        LoadCause::Ort(e.into())
    }
}

/// A diagnostic switch of the environment set to a value it does not take, and what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiagnosticsEnvError {
    /// `UNSTEP_ORT_LOG` set to a name not in `ORT_LOG_LEVELS` (`options.rs`).
    #[error(
        "{var}={0:?} is not a log level: set it to verbose, info or warning, or unset it",
        var = crate::env_vars::EnvVars::UNSTEP_ORT_LOG
    )]
    OrtLogLevel(String),
}

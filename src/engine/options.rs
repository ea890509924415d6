//! How sessions are built, as values: the execution provider and its options, the kernels of
//! the fused graphs, and how `auto` settings resolve for a provider and bundle. A worker receives
//! these (serialised in its job) and builds its sessions from them alone.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::bundle::Bundle;
pub use super::session_error::DiagnosticsEnvError;
use super::session_error::SessionError;
use super::settings::{
    ArenaExtend, AttentionBackend, AttentionPrecision, ConvAlgoSearch, FusedKernels, Precision,
    ProviderKind,
};

impl AttentionBackend {
    /// The kernel ONNX Runtime's `MultiHeadAttention` runs on CUDA with this setting (its
    /// `sdpa_kernel`), in words: its flash attention is FlashAttention-2, which `flash` and `fa2`
    /// both select.
    pub fn onnxruntime_kernel(self) -> &'static str {
        match self {
            AttentionBackend::Auto => "ONNX Runtime's default choice of kernel",
            AttentionBackend::Flash | AttentionBackend::Fa2 => "ONNX Runtime's FlashAttention-2",
            AttentionBackend::CudnnFlash => "cuDNN's flash attention through ONNX Runtime",
            AttentionBackend::Efficient => "ONNX Runtime's memory-efficient attention",
            AttentionBackend::Math => "ONNX Runtime's unfused attention",
        }
    }

    /// The kernel `auto` stands for, for a bundle of this precision: cuDNN's flash attention for
    /// fp16/bf16 (and fp8, whose attention is fp16's), the fastest measured on an H200
    /// (benches/README.md); ONNX Runtime's default for fp32, where the flash kernels cannot run.
    pub fn resolve(self, precision: Precision) -> AttentionBackend {
        match (self, precision) {
            (AttentionBackend::Auto, Precision::Fp16 | Precision::Bf16 | Precision::Fp8) => {
                AttentionBackend::CudnnFlash
            }
            (kernel, _) => kernel,
        }
    }

    /// Refuses, before any session is built, a kernel that cannot run for this provider and
    /// precision: ONNX Runtime would otherwise fall back to another kernel without a word, and the
    /// result would be labelled with a kernel that never ran.
    pub fn check(self, provider: &Provider, precision: Precision) -> Result<(), SessionError> {
        let unavailable = |reason: &str| {
            Err(SessionError::AttentionUnavailable {
                backend: self.name(),
                provider: provider.name(),
                reason: reason.to_string(),
            })
        };
        match (provider, self) {
            (_, AttentionBackend::Auto) => Ok(()),
            (Provider::Cpu, AttentionBackend::Math) => Ok(()),
            (Provider::Cpu, _) => {
                unavailable("the CPU provider has only the unfused kernel (auto or math)")
            }
            (Provider::TensorRt(_), _) => unavailable(
                "TensorRT chooses its own attention kernels; use attention_backend = auto",
            ),
            (
                Provider::Cuda(_),
                AttentionBackend::Flash | AttentionBackend::Fa2 | AttentionBackend::CudnnFlash,
            ) if precision == Precision::Fp32 => {
                unavailable("flash kernels need an fp16, bf16 or fp8 bundle; this bundle is fp32")
            }
            (Provider::Cuda(_), _) => Ok(()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CudaOptions {
    pub device_id: i32,
    /// Kernel for `com.microsoft.MultiHeadAttention`.
    pub attention: AttentionBackend,
    pub conv_algo_search: ConvAlgoSearch,
    pub arena_extend: ArenaExtend,
    /// Upper bound of the CUDA arena in bytes; `None` leaves ONNX Runtime's default.
    pub memory_limit: Option<usize>,
    /// ONNX Runtime's CUDA graph capture (`enable_cuda_graph`) in the DiT's session only: the
    /// generation loop captures one graph per block shape and replays it (`generate/capture.rs`).
    pub cuda_graphs: bool,
    /// NHWC convolutions (`prefer_nhwc`) in every session; the decoder's sessions use them
    /// whatever this says.
    pub prefer_nhwc: bool,
    /// Let cuDNN's algorithm search use as much workspace as the fastest convolution wants
    /// (`cudnn_conv_use_max_workspace`); off caps it at ONNX Runtime's 32 MiB.
    pub conv_max_workspace: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        Self {
            device_id: 0,
            attention: AttentionBackend::Auto,
            conv_algo_search: ConvAlgoSearch::Exhaustive,
            arena_extend: ArenaExtend::NextPowerOfTwo,
            memory_limit: None,
            cuda_graphs: false,
            prefer_nhwc: false,
            conv_max_workspace: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TensorRtOptions {
    pub device_id: i32,
    pub fp16: bool,
    pub engine_cache_dir: Option<PathBuf>,
    pub timing_cache_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Provider {
    #[default]
    Cpu,
    Cuda(CudaOptions),
    /// TensorRT, with CUDA registered after it for the nodes TensorRT does not take.
    #[serde(rename = "tensorrt")]
    TensorRt(TensorRtOptions),
}

impl Provider {
    pub fn kind(&self) -> ProviderKind {
        match self {
            Provider::Cpu => ProviderKind::Cpu,
            Provider::Cuda(_) => ProviderKind::Cuda,
            Provider::TensorRt(_) => ProviderKind::Tensorrt,
        }
    }

    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
}

/// Which kernel runs the DiT's self-attention, decided from the DiT's kernels, the provider and
/// the bundle alone (no CUDA library is loaded to decide it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DitAttention {
    /// ONNX Runtime's `MultiHeadAttention` as the graph has it (`dit.onnx`, and `dit_fused.onnx`
    /// before exporter 0.10.0), with the kernel of the provider's attention setting.
    OnnxRuntime,
    /// The runner's `ai.unstep::Attention` of `dit_fused.onnx` (exporter 0.10.0 and later): its
    /// call of cuDNN's flash attention on CUDA, its CPU kernel on the CPU.
    Runner,
    /// The same `dit_fused.onnx` with each `ai.unstep::Attention` node rewritten to ONNX Runtime's
    /// `com.microsoft::MultiHeadAttention` when the session is built
    /// ([`super::graph_rewrite`]): the CUDA provider runs it with the kernel `attention_backend`
    /// selects, inside the fused DiT with the runner's other kernels and CUDA graphs. On CUDA for
    /// every attention backend but `auto` and `cudnn_flash`, which are the runner's call.
    OnnxRuntimeInFused,
}

/// Why the 8-bit attention cannot run with these settings (its CUDA kernel and CPU kernel are
/// the runner's `Attention` in the fused DiT), before any bundle is opened: `None` when it may
/// (the bundle's graphs are checked when the sessions are built).
pub fn int8_attention_refusal(
    provider: ProviderKind,
    dit_kernels: FusedKernels,
    backend: AttentionBackend,
) -> Option<&'static str> {
    match (provider, dit_kernels, backend) {
        (ProviderKind::Tensorrt, _, _) => Some(
            "TensorRT chooses its own attention kernels; the 8-bit attention runs on \
             runtime.provider = \"cuda\" (or \"cpu\", for tests)",
        ),
        (_, FusedKernels::Onnxruntime, _) => Some(
            "the 8-bit attention is the runner's own, in its fused DiT; use runtime.dit_kernels = \
             \"auto\" or \"unstep\"",
        ),
        (ProviderKind::Cpu, FusedKernels::Auto, _) => Some(
            "on the CPU the 8-bit attention is the runner's CPU kernel in its fused DiT, which \
             `auto` does not choose there; set runtime.dit_kernels = \"unstep\"",
        ),
        (ProviderKind::Cuda, _, b)
            if !matches!(b, AttentionBackend::Auto | AttentionBackend::CudnnFlash) =>
        {
            Some(
                "the 8-bit attention takes the place of the runner's own attention call, which \
                 attention_backend = \"auto\" or \"cudnn_flash\" selects",
            )
        }
        _ => None,
    }
}

impl DitAttention {
    /// The self-attention of a DiT session built with `kernels` (resolved: `Unstep` or
    /// `Onnxruntime`) on `provider` for a bundle with this manifest.
    pub fn of(
        kernels: FusedKernels,
        provider: &Provider,
        manifest: &super::bundle::BundleManifest,
    ) -> DitAttention {
        let fused = kernels == FusedKernels::Unstep && manifest.graphs.dit_fused.is_some();
        if !fused || !manifest.fused_dit_has_runner_attention() {
            return DitAttention::OnnxRuntime;
        }
        match provider {
            Provider::Cuda(c)
                if c.attention.resolve(manifest.precision) != AttentionBackend::CudnnFlash =>
            {
                DitAttention::OnnxRuntimeInFused
            }
            #[cfg(test)]
            Provider::Cpu if tests::REWRITE_ON_CPU.get() => DitAttention::OnnxRuntimeInFused,
            _ => DitAttention::Runner,
        }
    }

    /// What runs the self-attention, as a run's records add it to the attention kernel's name;
    /// `None` where the kernel's name says it all (ONNX Runtime's attention as exported, the
    /// runner's CPU kernel). The runner's cuDNN call is followed by the wave shaping of the
    /// kernels this process has made (a worker describes it once its sessions are built; the
    /// 8-bit attention shapes no cuDNN call).
    pub fn describe(self, provider: &Provider, precision: Precision) -> Option<String> {
        match (self, provider) {
            (DitAttention::Runner, Provider::Cuda(_)) => {
                let call = "self-attention the runner's own cuDNN call";
                Some(match super::kernels::wave_shaping_used() {
                    Some(shaping) => format!("{call}, {shaping}"),
                    None => call.into(),
                })
            }
            (DitAttention::OnnxRuntimeInFused, Provider::Cuda(c)) => Some(format!(
                "self-attention {} in the fused DiT (MultiHeadAttention in place of the \
                 runner's cuDNN call)",
                c.attention.resolve(precision).onnxruntime_kernel()
            )),
            (DitAttention::OnnxRuntimeInFused, _) => {
                Some("self-attention ONNX Runtime's MultiHeadAttention in the fused DiT".into())
            }
            _ => None,
        }
    }
}

/// The graphs a [`FusedKernels`] setting is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedPart {
    /// `dit_fused` instead of `dit`.
    Dit,
    /// `vae_first_fused` and `vae_step_fused` instead of `vae_first` and `vae_step`.
    Vae,
}

impl FusedPart {
    fn setting(self) -> &'static str {
        match self {
            FusedPart::Dit => "dit_kernels",
            FusedPart::Vae => "vae_kernels",
        }
    }

    /// The error for kernels of this part that cannot be used. The DiT of an fp8 bundle has no
    /// other kernels to fall back to, so its error says what the fp8 bundle needs instead.
    pub(super) fn unavailable(
        self,
        provider: &Provider,
        precision: Precision,
        reason: String,
    ) -> SessionError {
        if self == FusedPart::Dit && precision == Precision::Fp8 {
            return SessionError::Fp8NeedsRunnerKernels {
                reason: without_onnxruntime_remedy(&reason),
            };
        }
        SessionError::KernelsUnavailable {
            setting: self.setting(),
            flag: match self {
                FusedPart::Dit => "dit-kernels",
                FusedPart::Vae => "vae-kernels",
            },
            provider: provider.name(),
            reason,
        }
    }

    /// The fused graphs of the bundle, when it has all of them.
    fn present(self, graphs: &super::bundle::Graphs) -> bool {
        match self {
            FusedPart::Dit => graphs.dit_fused.is_some(),
            FusedPart::Vae => graphs.vae_first_fused.is_some() && graphs.vae_step_fused.is_some(),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            FusedPart::Dit => "no `dit_fused` graph (exporter 0.4.0 and later write one)",
            FusedPart::Vae => {
                "no `vae_first_fused` and `vae_step_fused` graphs (exporter 0.5.0 and later write them)"
            }
        }
    }
}

impl FusedKernels {
    /// What `self` stands for with this provider and bundle for `part`'s graphs (never `Auto`),
    /// or why the runner's kernels cannot be used when they were asked for by name. The DiT of an
    /// fp8 bundle runs only with the runner's kernels on CUDA: its `dit` graph is the fp16 one,
    /// so there `auto` never falls back to ONNX Runtime's and `onnxruntime` is refused.
    pub fn resolve(
        self,
        part: FusedPart,
        provider: &Provider,
        bundle: &Bundle,
    ) -> Result<FusedKernels, SessionError> {
        let m = &bundle.manifest;
        let supported = m.precision != Precision::Bf16;
        let present = part.present(&m.graphs);
        let unavailable = |reason: String| Err(part.unavailable(provider, m.precision, reason));
        // From exporter 0.10.0 the fused DiT's self-attention is the runner's own (cuDNN's flash
        // attention, fp16, on CUDA), or ONNX Runtime's `MultiHeadAttention` in its place for
        // another attention backend; an fp32 bundle has neither on CUDA and keeps the standard
        // graph, whose every attention is ONNX Runtime's and follows the setting.
        let attention_conflict = (part == FusedPart::Dit
            && m.precision == Precision::Fp32
            && matches!(provider, Provider::Cuda(_))
            && DitAttention::of(FusedKernels::Unstep, provider, m)
                == DitAttention::OnnxRuntimeInFused)
            .then(|| {
                "the fused DiT's self-attention (exporter 0.10.0 and later) runs on CUDA for fp16 \
                 and fp8 bundles (the runner's call of cuDNN's flash attention, or ONNX Runtime's \
                 MultiHeadAttention in its place); this one is fp32"
                    .to_string()
            });
        if part == FusedPart::Dit && m.precision == Precision::Fp8 {
            return self.resolve_fp8_dit(provider, bundle, attention_conflict);
        }
        match self {
            FusedKernels::Onnxruntime => Ok(FusedKernels::Onnxruntime),
            // Without NVRTC, cuBLASLt or cuDNN the kernels cannot be built: `auto` keeps ONNX
            // Runtime's (and the records say so); asking for `unstep` by name is an error at
            // session build.
            FusedKernels::Auto => Ok(
                if matches!(provider, Provider::Cuda(_))
                    && present
                    && supported
                    && attention_conflict.is_none()
                    && super::kernels::cuda_libraries_available().is_ok()
                {
                    FusedKernels::Unstep
                } else {
                    FusedKernels::Onnxruntime
                },
            ),
            FusedKernels::Unstep => {
                if matches!(provider, Provider::TensorRt(_)) {
                    unavailable("TensorRT builds its own fused kernels".into())
                } else if !present {
                    unavailable(format!(
                        "the bundle (exporter {}) has {}: export the bundle again",
                        m.exporter_version,
                        part.describe()
                    ))
                } else if !supported {
                    unavailable("they exist for fp16 and fp32 bundles; this one is bf16".into())
                } else if let Some(reason) = attention_conflict {
                    unavailable(reason)
                } else {
                    Ok(FusedKernels::Unstep)
                }
            }
        }
    }

    /// [`FusedKernels::resolve`] for the DiT of an fp8 bundle: `Unstep` on the CUDA provider with
    /// the bundle's `dit_fused`, or why not. `auto` also needs NVRTC, cuBLASLt and cuDNN to load;
    /// `unstep` asked by name meets their absence when the session is built, as for any bundle.
    fn resolve_fp8_dit(
        self,
        provider: &Provider,
        bundle: &Bundle,
        attention_conflict: Option<String>,
    ) -> Result<FusedKernels, SessionError> {
        let refuse = |reason: String| Err(SessionError::Fp8NeedsRunnerKernels { reason });
        if self == FusedKernels::Onnxruntime {
            return refuse(
                "runtime.dit_kernels = \"onnxruntime\" would run the bundle's `dit` graph, which \
                 is the DiT in fp16; use runtime.dit_kernels = \"auto\" (`--dit-kernels auto`), \
                 or an fp16 bundle for ONNX Runtime's kernels"
                    .into(),
            );
        }
        if !matches!(provider, Provider::Cuda(_)) {
            return refuse(format!(
                "this run's provider is {}; use runtime.provider = \"cuda\" (`--provider cuda`)",
                provider.name()
            ));
        }
        if !FusedPart::Dit.present(&bundle.manifest.graphs) {
            return refuse(
                "the bundle has no `dit_fused` graph; quantize an fp16 bundle that has one again"
                    .into(),
            );
        }
        if let Some(reason) = attention_conflict {
            return refuse(reason);
        }
        if self == FusedKernels::Auto
            && let Err(error) = super::kernels::cuda_libraries_available()
        {
            return refuse(format!(
                "{}; `runner doctor` checks NVRTC, cuBLASLt and cuDNN",
                without_onnxruntime_remedy(&error.to_string())
            ));
        }
        Ok(FusedKernels::Unstep)
    }
}

/// A CUDA kernels' message without its last suggestion, ONNX Runtime's kernels
/// ([`super::kernels::REMEDY`]), which an fp8 bundle's DiT cannot run.
fn without_onnxruntime_remedy(message: &str) -> String {
    message.replace(&format!(", {}", super::kernels::REMEDY), "")
}

/// How sessions are built: where ONNX Runtime comes from, the provider and its options.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RuntimeOptions {
    /// An explicit libonnxruntime path (`runtime.ort_library`, `--ort-library`).
    pub ort_library: Option<PathBuf>,
    pub provider: Provider,
    /// Intra-op threads per session; `None` lets ONNX Runtime use one per core.
    pub intra_op_threads: Option<usize>,
    /// A folder where each graph's optimised model is written (`<graph>.optimized.onnx`), for
    /// inspection; a graph whose file is there already is not written again.
    pub optimized_model_dir: Option<PathBuf>,
    /// Decode each finished block with the VAE on a second thread (on GPUs, its own CUDA stream)
    /// while the DiT generates the next block.
    pub overlap_vae: bool,
    /// The DiT's graph and elementwise kernels.
    pub dit_kernels: FusedKernels,
    /// The VAE decoder's graphs and elementwise kernels.
    pub vae_kernels: FusedKernels,
    /// Diagnostic switches, from the environment.
    #[serde(default)]
    pub diagnostics: Diagnostics,
    /// Where the runner's CUDA kernels keep what they decide and compile between processes:
    /// convolution choices, attention plans, the compiled kernels (`runner apply`: the process's
    /// cache folder; `runner worker`: `UNSTEP_KERNEL_CACHE`).
    #[serde(default)]
    pub kernel_cache_dir: Option<PathBuf>,
    /// Where the prompts' text contexts are kept between processes, so that a process whose
    /// prompts an earlier one encoded (a probe's measurement after its warmup, a resumed shard)
    /// does not load the text encoder (`runner apply`: the process's cache folder's
    /// `text_contexts`).
    #[serde(default)]
    pub context_cache_dir: Option<PathBuf>,
    /// The arithmetic of the fused DiT's self-attention (`method.attention_precision`).
    #[serde(default)]
    pub attention_precision: AttentionPrecision,
}

/// The diagnostic switches: read from the environment once, by the command that resolves the
/// options ([`Diagnostics::from_env`]), and carried to its workers with the options.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Diagnostics {
    /// Write ONNX Runtime's per-node profile of every session here (`<graph>_<timestamp>.json`
    /// when the session ends); `UNSTEP_ORT_PROFILE`.
    #[serde(default)]
    pub ort_profile_dir: Option<PathBuf>,
    /// ONNX Runtime's log level for every session (`verbose`, `info`, `warning`), with the
    /// runner's CUDA kernels' creation times; `UNSTEP_ORT_LOG`.
    #[serde(default)]
    pub ort_log_level: Option<String>,
    /// The ONNX Runtime graph optimizers to leave out, by name, separated by commas, in place of
    /// the provider's own list (empty leaves every optimizer on);
    /// `UNSTEP_ORT_DISABLE_OPTIMIZERS`.
    #[serde(default)]
    pub disabled_optimizers: Option<String>,
    /// Print how each convolution engine was chosen; `UNSTEP_CONV_LOG=1`.
    #[serde(default)]
    pub conv_log: bool,
}

impl Diagnostics {
    /// The switches that are on, as `VARIABLE=value`, in a fixed order: what a run's record
    /// keeps, since ONNX Runtime's profiler and log slow a run down and left-out optimizers
    /// change its graphs.
    pub fn in_effect(&self) -> Vec<String> {
        use crate::env_vars::EnvVars;
        let mut on = Vec::new();
        if let Some(dir) = &self.ort_profile_dir {
            on.push(format!("{}={}", EnvVars::UNSTEP_ORT_PROFILE, dir.display()));
        }
        if let Some(level) = &self.ort_log_level {
            on.push(format!("{}={level}", EnvVars::UNSTEP_ORT_LOG));
        }
        if let Some(list) = &self.disabled_optimizers {
            on.push(format!("{}={list}", EnvVars::UNSTEP_ORT_DISABLE_OPTIMIZERS));
        }
        if self.conv_log {
            on.push(format!("{}=1", EnvVars::UNSTEP_CONV_LOG));
        }
        on
    }

    /// The switches set in the environment: the one place they are read.
    pub fn from_env() -> Self {
        use crate::env_vars::EnvVars;
        Self {
            ort_profile_dir: std::env::var_os(EnvVars::UNSTEP_ORT_PROFILE)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            ort_log_level: std::env::var(EnvVars::UNSTEP_ORT_LOG)
                .ok()
                .filter(|v| !v.is_empty()),
            disabled_optimizers: std::env::var(EnvVars::UNSTEP_ORT_DISABLE_OPTIMIZERS).ok(),
            conv_log: std::env::var_os(EnvVars::UNSTEP_CONV_LOG).is_some_and(|v| v == "1"),
        }
    }
}

/// The levels `UNSTEP_ORT_LOG` takes, and ONNX Runtime's for each.
const ORT_LOG_LEVELS: [(&str, ort::logging::LogLevel); 3] = [
    ("verbose", ort::logging::LogLevel::Verbose),
    ("info", ort::logging::LogLevel::Info),
    ("warning", ort::logging::LogLevel::Warning),
];

/// ONNX Runtime's log level named `name` (one of [`ORT_LOG_LEVELS`]), or what to do instead.
pub(crate) fn ort_log_level(name: &str) -> Result<ort::logging::LogLevel, DiagnosticsEnvError> {
    ORT_LOG_LEVELS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, level)| *level)
        .ok_or_else(|| DiagnosticsEnvError::OrtLogLevel(name.to_string()))
}

/// Checks the diagnostic switches of the environment that take one of a list of values, so that a
/// misspelt one stops a command that builds sessions before any work, not at its first session.
pub fn check_diagnostics_env() -> Result<(), DiagnosticsEnvError> {
    match &Diagnostics::from_env().ort_log_level {
        Some(level) => ort_log_level(level).map(|_| ()),
        None => Ok(()),
    }
}

impl RuntimeOptions {
    /// Takes the diagnostic switches from the environment ([`Diagnostics::from_env`]), and the
    /// kernel cache folder from `UNSTEP_KERNEL_CACHE` where none was given.
    pub fn with_diagnostics_from_env(mut self) -> Self {
        self.diagnostics = Diagnostics::from_env();
        if self.kernel_cache_dir.is_none() {
            self.kernel_cache_dir = std::env::var_os(crate::env_vars::EnvVars::UNSTEP_KERNEL_CACHE)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from);
        }
        self
    }

    /// Whether the DiT's session captures CUDA graphs (`cuda_graphs` on the CUDA provider).
    pub fn cuda_graphs(&self) -> bool {
        matches!(
            self.provider,
            Provider::Cuda(CudaOptions {
                cuda_graphs: true,
                ..
            })
        )
    }

    /// The same options without CUDA graph capture: every session but the DiT's.
    pub(crate) fn without_cuda_graphs(&self) -> RuntimeOptions {
        let mut options = self.clone();
        if let Provider::Cuda(cuda) = &mut options.provider {
            cuda.cuda_graphs = false;
        }
        options
    }
}

#[cfg(test)]
pub(crate) mod tests;

//! ONNX Runtime sessions for a bundle's graphs, and the execution providers they run on.
//!
//! A provider that was asked for and fails to register is an error: a silent fall-back to the
//! CPU would turn a GPU speed probe into a meaningless number.

use std::path::{Path, PathBuf};

use ort::ep::{self, ArenaExtendStrategy, ExecutionProvider};
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::{Outlet, TensorElementType};

use super::bundle::{Bundle, BundleError, Precision};
use super::ort_lib::{self, OrtLoadError, OrtRuntime};

/// cuDNN convolution algorithm search (`cudnn_conv_algo_search`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConvAlgoSearch {
    #[default]
    Exhaustive,
    Heuristic,
    Default,
}

/// How the CUDA memory arena grows (`arena_extend_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ArenaExtend {
    #[default]
    NextPowerOfTwo,
    SameAsRequested,
}

/// The attention kernels the CUDA provider may use for `com.microsoft.MultiHeadAttention`
/// (`method.attention_backend`), passed as the provider option `sdpa_kernel`, a bitmask of
/// ONNX Runtime's `AttentionBackend` (contrib_ops/cpu/bert/attention_common.h). With one bit set,
/// ONNX Runtime uses that kernel where it supports the inputs and its unfused kernel elsewhere;
/// [`AttentionKernel::check`] refuses the combinations where the kernel can never run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionKernel {
    /// ONNX Runtime's own choice (`sdpa_kernel` 0: flash, then memory-efficient, then unfused;
    /// cuDNN flash only when asked for); [`AttentionKernel::resolve`] says what it stands for.
    #[default]
    Auto,
    Flash,
    /// FA2-class flash attention: on ONNX Runtime the same fused flash kernel as `Flash` (its
    /// flash attention is FlashAttention-2); recorded as asked.
    Fa2,
    CudnnFlash,
    Efficient,
    Math,
}

impl AttentionKernel {
    pub const ALL: [AttentionKernel; 6] = [
        AttentionKernel::Auto,
        AttentionKernel::Flash,
        AttentionKernel::Fa2,
        AttentionKernel::CudnnFlash,
        AttentionKernel::Efficient,
        AttentionKernel::Math,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AttentionKernel::Auto => "auto",
            AttentionKernel::Flash => "flash",
            AttentionKernel::Fa2 => "fa2",
            AttentionKernel::CudnnFlash => "cudnn_flash",
            AttentionKernel::Efficient => "efficient",
            AttentionKernel::Math => "math",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The kernel `auto` stands for, for a bundle of this precision: cuDNN's flash attention for
    /// fp16/bf16, the fastest measured on one H200 with ONNX Runtime 1.31 (wan-1.3b, one video:
    /// DiT 3.57 s with cudnn_flash, 4.43 s flash, 6.06 s efficient; ONNX Runtime's own default
    /// order measured the same as cudnn_flash); ONNX Runtime's default for fp32, where the flash
    /// kernels cannot run.
    pub fn resolve(self, precision: Precision) -> AttentionKernel {
        match (self, precision) {
            (AttentionKernel::Auto, Precision::Fp16 | Precision::Bf16) => {
                AttentionKernel::CudnnFlash
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
            (_, AttentionKernel::Auto) => Ok(()),
            (Provider::Cpu, AttentionKernel::Math) => Ok(()),
            (Provider::Cpu, _) => {
                unavailable("the CPU provider has only the unfused kernel (auto or math)")
            }
            (Provider::TensorRt(_), _) => unavailable(
                "TensorRT chooses its own attention kernels; use attention_backend = auto",
            ),
            (
                Provider::Cuda(_),
                AttentionKernel::Flash | AttentionKernel::Fa2 | AttentionKernel::CudnnFlash,
            ) if precision == Precision::Fp32 => {
                unavailable("flash kernels need an fp16 or bf16 bundle; this bundle is fp32")
            }
            (Provider::Cuda(_), _) => Ok(()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaOptions {
    pub device_id: i32,
    /// Kernel for `com.microsoft.MultiHeadAttention`.
    pub attention: AttentionKernel,
    pub conv_algo_search: ConvAlgoSearch,
    pub arena_extend: ArenaExtend,
    /// Upper bound of the CUDA arena in bytes; `None` leaves ONNX Runtime's default.
    pub memory_limit: Option<usize>,
    /// ONNX Runtime's CUDA graph capture (`enable_cuda_graph`) in the DiT's session only: the
    /// device loop captures one graph per block shape and replays it (see `device.rs`).
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
            attention: AttentionKernel::Auto,
            conv_algo_search: ConvAlgoSearch::Exhaustive,
            arena_extend: ArenaExtend::NextPowerOfTwo,
            memory_limit: None,
            cuda_graphs: false,
            prefer_nhwc: false,
            conv_max_workspace: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TensorRtOptions {
    pub device_id: i32,
    pub fp16: bool,
    pub engine_cache_dir: Option<PathBuf>,
    pub timing_cache_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Provider {
    #[default]
    Cpu,
    Cuda(CudaOptions),
    /// TensorRT, with CUDA registered after it for the nodes TensorRT does not take.
    TensorRt(TensorRtOptions),
}

impl Provider {
    pub fn name(&self) -> &'static str {
        match self {
            Provider::Cpu => "cpu",
            Provider::Cuda(_) => "cuda",
            Provider::TensorRt(_) => "tensorrt",
        }
    }
}

/// Which kernels do the per-row elementwise work of the DiT (`runtime.dit_kernels`,
/// `--dit-kernels`) or of the VAE decoder (`runtime.vae_kernels`, `--vae-kernels`): the bundle's
/// fused graphs with the runner's own operators (`ai.unstep`, see `engine::kernels`), or the
/// standard graphs with ONNX Runtime's stock kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FusedKernels {
    /// The runner's own on CUDA when the bundle has the fused graphs (fp16 or fp32) and NVRTC,
    /// cuBLASLt and cuDNN load, ONNX Runtime's otherwise. For the DiT of exporter 0.10.0 and
    /// later, whose self-attention is the runner's cuDNN call, also only with an fp16 bundle and
    /// `attention_backend` auto or cudnn_flash.
    #[default]
    Auto,
    /// The runner's own, on any provider but TensorRT (on the CPU, for tests and comparisons).
    Unstep,
    Onnxruntime,
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

    /// The error for kernels of this part that cannot be used.
    fn unavailable(self, provider: &Provider, reason: String) -> SessionError {
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
    pub const ALL: [FusedKernels; 3] = [
        FusedKernels::Auto,
        FusedKernels::Unstep,
        FusedKernels::Onnxruntime,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FusedKernels::Auto => "auto",
            FusedKernels::Unstep => "unstep",
            FusedKernels::Onnxruntime => "onnxruntime",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// What `self` stands for with this provider and bundle for `part`'s graphs (never `Auto`),
    /// or why the runner's kernels cannot be used when they were asked for by name.
    pub fn resolve(
        self,
        part: FusedPart,
        provider: &Provider,
        bundle: &Bundle,
    ) -> Result<FusedKernels, SessionError> {
        let m = &bundle.manifest;
        let supported = m.precision != Precision::Bf16;
        let present = part.present(&m.graphs);
        let unavailable = |reason: String| Err(part.unavailable(provider, reason));
        // From exporter 0.10.0 the fused DiT's self-attention is the runner's own (cuDNN's flash
        // attention, fp16, on CUDA): another attention backend asked for, or an fp32 bundle, keeps
        // the standard graph, whose every attention is ONNX Runtime's and follows the setting.
        let attention_conflict = match provider {
            Provider::Cuda(c) if part == FusedPart::Dit && m.fused_dit_has_runner_attention() => {
                match c.attention.resolve(m.precision) {
                    AttentionKernel::CudnnFlash => None,
                    _ if m.precision == Precision::Fp32 => Some(
                        "the fused DiT's self-attention (exporter 0.10.0 and later) is cuDNN's \
                         flash attention, which runs fp16 bundles; this one is fp32"
                            .to_string(),
                    ),
                    kernel => Some(format!(
                        "the fused DiT's self-attention (exporter 0.10.0 and later) is the \
                         runner's own call of cuDNN's flash attention, and attention_backend = \
                         \"{}\" asks for ONNX Runtime's {} kernel; use attention_backend = \
                         \"auto\" or \"cudnn_flash\" with them",
                        c.attention.name(),
                        kernel.name()
                    )),
                }
            }
            _ => None,
        };
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
}

/// How sessions are built: where ONNX Runtime comes from, the provider and its options.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuntimeOptions {
    /// An explicit libonnxruntime path (`runtime.ort_library`, `--ort-library`).
    pub ort_library: Option<PathBuf>,
    pub provider: Provider,
    /// Intra-op threads per session; `None` lets ONNX Runtime use one per core.
    pub intra_op_threads: Option<usize>,
    /// A folder where each graph's optimised model is written (`<graph>.optimized.onnx`), for
    /// inspection and for the staging area's cache audit.
    pub optimized_model_dir: Option<PathBuf>,
    /// Run the device loop (IoBinding, device-resident buffers, scheduler arithmetic as graphs)
    /// also on the CPU provider. GPU providers always use it; on the CPU it exists so that tests
    /// can check the device loop against the golden files.
    pub io_binding: bool,
    /// Device loop: decode each finished block with the VAE on a second thread (its own CUDA
    /// stream) while the DiT generates the next block.
    pub overlap_vae: bool,
    /// The DiT's graph and elementwise kernels.
    pub dit_kernels: FusedKernels,
    /// The VAE decoder's graphs and elementwise kernels.
    pub vae_kernels: FusedKernels,
}

impl RuntimeOptions {
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

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Runtime(#[from] OrtLoadError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(
        "register execution provider {provider} for {graph}: {message}; run `runner doctor` to see which providers this ONNX Runtime has"
    )]
    Provider {
        provider: &'static str,
        graph: String,
        message: String,
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
    #[error("load graph {graph}: {message}")]
    Load { graph: String, message: String },
}

/// The sessions of a bundle. The text encoder's is `None` when the prompts were encoded before
/// the others were built ([`super::Generator::with_prompts`]).
pub struct GraphSessions {
    pub text_encoder: Option<Session>,
    pub dit: Session,
    /// The kernels the DiT session runs with (`Unstep` or `Onnxruntime`).
    pub dit_kernels: FusedKernels,
    pub vae_first: Session,
    pub vae_step: Session,
    /// The kernels the decoder's sessions run with (`Unstep` or `Onnxruntime`).
    pub vae_kernels: FusedKernels,
    /// How the DiT graph takes its KV cache.
    pub kv_interface: KvInterface,
    /// The bundle's `dit_context` graph, exactly when the DiT takes the context's keys and values
    /// ([`ContextInterface::KeysValues`]).
    pub dit_context: Option<Session>,
}

impl GraphSessions {
    /// How the DiT graph takes the text context: from `dit_context` when that session exists.
    pub fn context_interface(&self) -> ContextInterface {
        if self.dit_context.is_some() {
            ContextInterface::KeysValues
        } else {
            ContextInterface::Text
        }
    }
}

/// How a DiT graph takes the text context, read from its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextInterface {
    /// Input `context` `[1, text_len, text_dim]`: the graph embeds it and projects every layer's
    /// cross-attention keys and values from it, in every pass (`dit.onnx`, and `dit_fused.onnx`
    /// up to exporter 0.8.0).
    Text,
    /// Inputs `ctx_k.{i}` / `ctx_v.{i}` `[1, text_len, D]`: those keys and values, which depend on
    /// the prompt alone; the bundle's `dit_context` graph computes them from the context once per
    /// prompt (`dit_fused.onnx` of exporter 0.9.0 and later).
    KeysValues,
}

/// Whether `session`'s graph has an input `name`.
fn has_input(session: &Session, name: &str) -> bool {
    session.inputs().iter().any(|input| input.name() == name)
}

/// `[ctx_k.{i}, ctx_v.{i}]` per layer: `dit_context`'s outputs and the DiT's inputs of
/// [`ContextInterface::KeysValues`].
pub(crate) fn context_names(layers: usize) -> Vec<[String; 2]> {
    layer_pairs("ctx_k", "ctx_v", layers)
}

/// How a DiT graph takes the KV cache, read from its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvInterface {
    /// Inputs `past_k.{i}` / `past_v.{i}` `[1, P, D]`, the earlier blocks' keys and values;
    /// outputs `new_k.{i}` / `new_v.{i}` `[1, T, D]`, the block's (`dit.onnx`, and `dit_fused.onnx`
    /// of exporters 0.4.0 and 0.5.0).
    PastAndNew,
    /// Inputs `kv_k.{i}` / `kv_v.{i}` `[1, P + T, D]`: the earlier keys and values, then T rows
    /// the graph fills with the block's in place (`ai.unstep` QkvNormRopeCache), which its
    /// attention reads without a copy of the cache (`dit_fused.onnx` of exporter 0.6.0 and
    /// later). The caller owns the buffers and reads the block's keys and values from their last
    /// T rows after the run.
    InPlace,
}

impl KvInterface {
    /// The interface of a DiT session: in place when it has an input `kv_k.0`.
    fn of(dit: &Session) -> Self {
        if has_input(dit, "kv_k.0") {
            KvInterface::InPlace
        } else {
            KvInterface::PastAndNew
        }
    }
}

/// The DiT's KV cache inputs and outputs of each layer, `[keys, values]`, by name (no outputs
/// when the graph writes the cache in place), built once for a generation loop.
#[derive(Debug, Clone)]
pub(crate) struct KvNames {
    pub(crate) interface: KvInterface,
    pub(crate) inputs: Vec<[String; 2]>,
    pub(crate) outputs: Vec<[String; 2]>,
}

/// `{prefix}.0` .. `{prefix}.{n-1}`: the names of a graph's per-layer or per-cache inputs and
/// outputs.
pub(crate) fn indexed_names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}.{i}")).collect()
}

/// `[{k}.{i}, {v}.{i}]` for each of `layers` layers.
fn layer_pairs(k: &str, v: &str, layers: usize) -> Vec<[String; 2]> {
    let (k, v) = (indexed_names(k, layers), indexed_names(v, layers));
    k.into_iter().zip(v).map(|(k, v)| [k, v]).collect()
}

impl KvNames {
    pub(crate) fn new(interface: KvInterface, layers: usize) -> Self {
        let names = |k, v| layer_pairs(k, v, layers);
        let (inputs, outputs) = match interface {
            KvInterface::PastAndNew => (names("past_k", "past_v"), names("new_k", "new_v")),
            KvInterface::InPlace => (names("kv_k", "kv_v"), Vec::new()),
        };
        Self {
            interface,
            inputs,
            outputs,
        }
    }
}

/// The bundle's graphs the sessions are built from, by role.
struct GraphNames<'a> {
    dit: &'a str,
    vae_first: &'a str,
    vae_step: &'a str,
}

impl<'a> GraphNames<'a> {
    fn of(bundle: &'a Bundle, dit: FusedKernels, vae: FusedKernels) -> Self {
        let g = &bundle.manifest.graphs;
        let pick = |kernels: FusedKernels, fused: &'a Option<String>, stock: &'a String| match (
            kernels, fused,
        ) {
            (FusedKernels::Unstep, Some(fused)) => fused.as_str(),
            _ => stock.as_str(),
        };
        Self {
            dit: pick(dit, &g.dit_fused, &g.dit),
            vae_first: pick(vae, &g.vae_first_fused, &g.vae_first),
            vae_step: pick(vae, &g.vae_step_fused, &g.vae_step),
        }
    }
}

impl std::fmt::Debug for GraphSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphSessions").finish_non_exhaustive()
    }
}

impl GraphSessions {
    /// Loads ONNX Runtime if needed, builds a session per graph (the text encoder's only when
    /// `text_encoder`) and checks each graph's inputs and outputs against the bundle contract.
    pub fn build(
        bundle: &Bundle,
        options: &RuntimeOptions,
        text_encoder: bool,
    ) -> Result<Self, SessionError> {
        let runtime = ort_lib::runtime(options.ort_library.as_deref())?;
        let dit_options = &resolve_attention(bundle, options)?;
        // Only the DiT's session captures CUDA graphs; every other one runs as usual.
        let options = &dit_options.without_cuda_graphs();
        let dit_kernels = options
            .dit_kernels
            .resolve(FusedPart::Dit, &options.provider, bundle)?;
        let vae_kernels = options
            .vae_kernels
            .resolve(FusedPart::Vae, &options.provider, bundle)?;
        let names = GraphNames::of(bundle, dit_kernels, vae_kernels);
        // The runner's operators, for the sessions of fused graphs.
        let operators = |kernels: FusedKernels, part: FusedPart| {
            if kernels != FusedKernels::Unstep {
                return Ok(None);
            }
            let cuda = !matches!(options.provider, Provider::Cpu);
            super::kernels::operator_domain(cuda)
                .map(Some)
                .map_err(|e| part.unavailable(&options.provider, e.to_string()))
        };
        let dit_ops = operators(dit_kernels, FusedPart::Dit)?;
        let dit = build_graph_session(runtime, bundle, names.dit, dit_options, false, dit_ops)?;
        let kv_interface = KvInterface::of(&dit);
        // A DiT that takes the context's keys and values needs the graph that computes them.
        let dit_context = if has_input(&dit, "ctx_k.0") {
            let Some(graph) = &bundle.manifest.graphs.dit_context else {
                return Err(BundleError::GraphContract {
                    role: "dit",
                    name: names.dit.to_string(),
                    problem: "it takes the context's keys and values (ctx_k.0, ...) but [graphs] \
                              has no dit_context graph that computes them"
                        .into(),
                }
                .into());
            };
            Some(build_graph_session(
                runtime, bundle, graph, options, false, None,
            )?)
        } else {
            None
        };
        let sessions = Self {
            text_encoder: if text_encoder {
                Some(text_encoder_session(runtime, bundle, options)?)
            } else {
                None
            },
            dit,
            dit_kernels,
            // The decoder's sessions run without ONNX Runtime's memory pattern on GPUs: with it,
            // the first run allocates tensor by tensor and later runs ask for one block of the
            // planned peak, which the fragmented arena cannot serve, so it reserves the peak
            // twice (measured on wan-1.3b: 11.0 GiB reserved for 5.4 GiB ever in use by
            // `vae_step`). Without it, later runs reuse the first run's chunks.
            vae_first: build_graph_session(
                runtime,
                bundle,
                names.vae_first,
                options,
                true,
                operators(vae_kernels, FusedPart::Vae)?,
            )?,
            vae_step: build_graph_session(
                runtime,
                bundle,
                names.vae_step,
                options,
                true,
                operators(vae_kernels, FusedPart::Vae)?,
            )?,
            vae_kernels,
            kv_interface,
            dit_context,
        };
        sessions.check_contract(bundle)?;
        Ok(sessions)
    }

    /// The text encoder's session alone, its inputs and outputs checked.
    pub fn build_text_encoder(
        bundle: &Bundle,
        options: &RuntimeOptions,
    ) -> Result<Session, SessionError> {
        let runtime = ort_lib::runtime(options.ort_library.as_deref())?;
        let options = resolve_attention(bundle, options)?.without_cuda_graphs();
        text_encoder_session(runtime, bundle, &options)
    }

    /// Checks names, element types and ranks of every graph's inputs and outputs, so that a graph
    /// exported for another layer count (or the wrong file) fails here and not mid-generation.
    fn check_contract(&self, bundle: &Bundle) -> Result<(), BundleError> {
        let m = &bundle.manifest;
        let layers = m.architecture.layers;
        // Float tensors are in the bundle's precision, except the DiT's timestep (always float32).
        let f32_ = float_type(m.precision);
        let timestep_ty = TensorElementType::Float32;
        let i64_ = TensorElementType::Int64;

        let names = GraphNames::of(bundle, self.dit_kernels, self.vae_kernels);
        let mut dit = Contract::new("dit", names.dit);
        dit.input("x", f32_, 5)
            .input("timestep", timestep_ty, 2)
            .input("frame_offset", i64_, 1)
            .output("flow", f32_, 5);
        match &self.dit_context {
            None => {
                dit.input("context", f32_, 3);
            }
            Some(session) => {
                let graph = m.graphs.dit_context.as_deref().unwrap_or_default();
                let mut context = Contract::new("dit_context", graph);
                context.input("context", f32_, 3);
                for name in context_names(layers).iter().flatten() {
                    dit.input(name, f32_, 3);
                    context.output(name, f32_, 3);
                }
                context.check(session)?;
            }
        }
        let kv = KvNames::new(self.kv_interface, layers);
        for name in kv.inputs.iter().flatten() {
            dit.input(name, f32_, 3);
        }
        for name in kv.outputs.iter().flatten() {
            dit.output(name, f32_, 3);
        }
        dit.check(&self.dit)?;

        let caches = vae_cache_count(&self.vae_first);
        let mut first = Contract::new("vae_first", names.vae_first);
        first.input("z", f32_, 5).output("frames", f32_, 5);
        let mut step = Contract::new("vae_step", names.vae_step);
        step.input("z", f32_, 5).output("frames", f32_, 5);
        for j in 0..caches {
            first.output(&format!("cache_out.{j}"), f32_, 0);
            step.input(&format!("cache_in.{j}"), f32_, 0).output(
                &format!("cache_out.{j}"),
                f32_,
                0,
            );
        }
        first.check(&self.vae_first)?;
        step.check(&self.vae_step)?;
        Ok(())
    }
}

/// The text encoder's session (options already resolved), its inputs and outputs checked.
fn text_encoder_session(
    runtime: &OrtRuntime,
    bundle: &Bundle,
    options: &RuntimeOptions,
) -> Result<Session, SessionError> {
    let graph = &bundle.manifest.graphs.text_encoder;
    let session = build_session(runtime, bundle, graph, options, false)?;
    let i64_ = TensorElementType::Int64;
    let mut text = Contract::new("text_encoder", graph);
    text.input("input_ids", i64_, 2)
        .input("attention_mask", i64_, 2)
        .output("context", float_type(bundle.manifest.precision), 3);
    text.check(&session)?;
    Ok(session)
}

/// The options with the attention kernel checked for the bundle and `auto` resolved.
fn resolve_attention(
    bundle: &Bundle,
    options: &RuntimeOptions,
) -> Result<RuntimeOptions, SessionError> {
    let mut resolved = options.clone();
    if let Provider::Cuda(cuda) = &mut resolved.provider {
        cuda.attention
            .check(&options.provider, bundle.manifest.precision)?;
        cuda.attention = cuda.attention.resolve(bundle.manifest.precision);
    }
    Ok(resolved)
}

/// The element type of a bundle's float tensors.
pub fn float_type(precision: Precision) -> TensorElementType {
    match precision {
        Precision::Fp32 => TensorElementType::Float32,
        Precision::Fp16 => TensorElementType::Float16,
        Precision::Bf16 => TensorElementType::Bfloat16,
    }
}

/// The number of `cache_out.{j}` outputs of a VAE graph.
pub(crate) fn vae_cache_count(session: &Session) -> usize {
    session
        .outputs()
        .iter()
        .filter(|o| o.name().starts_with("cache_out."))
        .count()
}

/// The expected inputs and outputs of one graph. A rank of 0 means "any rank".
struct Contract {
    role: &'static str,
    name: String,
    inputs: Vec<(String, TensorElementType, usize)>,
    outputs: Vec<(String, TensorElementType, usize)>,
}

impl Contract {
    fn new(role: &'static str, name: &str) -> Self {
        Self {
            role,
            name: name.to_string(),
            inputs: Vec::new(),
            outputs: Vec::new(),
        }
    }

    fn input(&mut self, name: &str, ty: TensorElementType, rank: usize) -> &mut Self {
        self.inputs.push((name.to_string(), ty, rank));
        self
    }

    fn output(&mut self, name: &str, ty: TensorElementType, rank: usize) -> &mut Self {
        self.outputs.push((name.to_string(), ty, rank));
        self
    }

    fn check(&self, session: &Session) -> Result<(), BundleError> {
        let fail = |problem: String| BundleError::GraphContract {
            role: self.role,
            name: self.name.clone(),
            problem,
        };
        for (kind, expected, actual) in [
            ("input", &self.inputs, session.inputs()),
            ("output", &self.outputs, session.outputs()),
        ] {
            for (name, ty, rank) in expected {
                let Some(outlet) = actual.iter().find(|o| o.name() == name) else {
                    return Err(fail(format!("missing {kind} {name}")));
                };
                check_outlet(outlet, *ty, *rank)
                    .map_err(|problem| fail(format!("{kind} {name} {problem}")))?;
            }
            if let Some(extra) = actual
                .iter()
                .find(|o| !expected.iter().any(|(n, _, _)| n == o.name()))
            {
                return Err(fail(format!("unexpected {kind} {}", extra.name())));
            }
        }
        Ok(())
    }
}

fn check_outlet(outlet: &Outlet, ty: TensorElementType, rank: usize) -> Result<(), String> {
    let (Some(actual_ty), Some(shape)) =
        (outlet.dtype().tensor_type(), outlet.dtype().tensor_shape())
    else {
        return Err("is not a tensor".into());
    };
    if actual_ty != ty {
        return Err(format!("has element type {actual_ty:?}, expected {ty:?}"));
    }
    if rank != 0 && shape.len() != rank {
        return Err(format!("has rank {}, expected {rank}", shape.len()));
    }
    Ok(())
}

/// A session of one of the bundle's graphs. The decoder's graphs (`decoder`) are built without
/// ONNX Runtime's memory pattern on GPU providers (the CPU keeps its default) and, on CUDA, with
/// NHWC convolutions.
fn build_session(
    runtime: &OrtRuntime,
    bundle: &Bundle,
    graph: &str,
    options: &RuntimeOptions,
    decoder: bool,
) -> Result<Session, SessionError> {
    build_graph_session(runtime, bundle, graph, options, decoder, None)
}

/// [`build_session`], with an operator domain registered (the runner's, for `dit_fused`).
fn build_graph_session(
    runtime: &OrtRuntime,
    bundle: &Bundle,
    graph: &str,
    options: &RuntimeOptions,
    decoder: bool,
    operators: Option<ort::operator::OperatorDomain>,
) -> Result<Session, SessionError> {
    let load = |e: ort::Error| SessionError::Load {
        graph: graph.to_string(),
        message: e.to_string(),
    };
    let mut builder = if decoder {
        session_builder(runtime, graph, &decoder_options(options))?
    } else {
        session_builder(runtime, graph, options)?
    };
    if decoder && !matches!(options.provider, Provider::Cpu) {
        builder = builder
            .with_memory_pattern(false)
            .map_err(|e| load(e.into()))?;
    }
    if let Some(domain) = operators {
        builder = builder.with_operators(domain).map_err(|e| load(e.into()))?;
    }
    builder
        .commit_from_file(bundle.graph_path(graph))
        .map_err(load)
}

/// The decoder's sessions prefer NHWC convolutions on CUDA: cuDNN's fp16 convolutions run
/// channels-last, and the exported norms are channels-last permutations that ONNX Runtime's
/// transpose optimizer cancels against the ones it wraps around each NHWC convolution, where
/// NCHW convolutions convert every input and output inside cuDNN. Measured on wan-1.3b (one
/// H200, same run): VAE 1.456 s against 1.588 s per video, `vae_step` at most 2.33 GiB in use
/// against 5.64 GiB, peak device memory 20.0 GiB against 23.9 GiB.
fn decoder_options(options: &RuntimeOptions) -> RuntimeOptions {
    let mut options = options.clone();
    if let Provider::Cuda(cuda) = &mut options.provider {
        cuda.prefer_nhwc = true;
    }
    options
}

/// A session for one of the runner's own small graphs ([`super::onnx_graph`]), on the same
/// provider as the bundle's graphs.
pub(crate) fn build_small_session(
    name: &str,
    model: &[u8],
    options: &RuntimeOptions,
) -> Result<Session, SessionError> {
    let runtime = ort_lib::runtime(options.ort_library.as_deref())?;
    let options = RuntimeOptions {
        optimized_model_dir: None,
        ..options.without_cuda_graphs()
    };
    session_builder(runtime, name, &options)?
        .commit_from_memory(model)
        .map_err(|e| SessionError::Load {
            graph: name.to_string(),
            message: e.to_string(),
        })
}

fn session_builder(
    runtime: &OrtRuntime,
    graph: &str,
    options: &RuntimeOptions,
) -> Result<ort::session::builder::SessionBuilder, SessionError> {
    let load = |message: String| SessionError::Load {
        graph: graph.to_string(),
        message,
    };
    let mut builder = Session::builder(&runtime.environment)
        .and_then(|b| {
            b.with_optimization_level(GraphOptimizationLevel::All)
                .map_err(Into::into)
        })
        .map_err(|e| load(e.to_string()))?;
    if let Some(threads) = options.intra_op_threads {
        builder = builder
            .with_intra_threads(threads)
            .map_err(|e| load(e.to_string()))?;
    }
    if let Some(dir) = &options.optimized_model_dir {
        std::fs::create_dir_all(dir).map_err(|e| load(format!("create {}: {e}", dir.display())))?;
        let file = dir.join(format!("{}.optimized.onnx", graph_stem(graph)));
        builder = builder
            .with_optimized_model_path(file)
            .map_err(|e| load(e.to_string()))?;
    }
    // A diagnostic switch, not a setting: ONNX Runtime's per-node profile of every session,
    // written as `<dir>/<graph>_<timestamp>.json` when the session ends.
    if let Some(dir) = std::env::var_os("UNSTEP_ORT_PROFILE") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| load(format!("create {}: {e}", dir.display())))?;
        builder = builder
            .with_profiling(dir.join(graph_stem(graph)))
            .map_err(|e| load(e.to_string()))?;
    }
    let disabled = std::env::var("UNSTEP_ORT_DISABLE_OPTIMIZERS")
        .unwrap_or_else(|_| disabled_optimizers(&options.provider).to_string());
    if !disabled.is_empty() {
        builder = builder
            .with_config_entry("optimization.disable_specified_optimizers", disabled)
            .map_err(|e| load(e.to_string()))?;
    }
    let providers = execution_providers(&options.provider);
    if !providers.is_empty() {
        builder =
            builder
                .with_execution_providers(providers)
                .map_err(|e| SessionError::Provider {
                    provider: options.provider.name(),
                    graph: graph.to_string(),
                    message: e.to_string(),
                })?;
    }
    Ok(builder)
}

/// ONNX Runtime graph optimizers left out on this provider, by name, separated by commas
/// (`optimization.disable_specified_optimizers`). The environment variable
/// `UNSTEP_ORT_DISABLE_OPTIMIZERS` replaces the list (a diagnostic switch, to measure what a
/// fusion is worth; empty leaves every optimizer on).
///
/// On GPUs `MatMulAddFusion` is left out: it turns each biased projection into a `Gemm` whose
/// bias the CUDA provider first broadcasts into the output with a slow kernel (`BroadcastBias`,
/// 0.20 s per wan-1.3b video on an H200) before a `beta = 1` GEMM; a `MatMul` and a broadcast
/// `Add` measured 0.11 s faster per video (DiT 2.469 s against 2.578 s, same run).
fn disabled_optimizers(provider: &Provider) -> &'static str {
    match provider {
        Provider::Cpu => "",
        Provider::Cuda(_) | Provider::TensorRt(_) => "MatMulAddFusion",
    }
}

fn graph_stem(graph: &str) -> String {
    Path::new(graph)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| graph.to_string())
}

/// The execution providers to register, each erroring on failure. The CPU provider is ONNX
/// Runtime's own default and needs no registration.
fn execution_providers(provider: &Provider) -> Vec<ep::ExecutionProviderDispatch> {
    match provider {
        Provider::Cpu => Vec::new(),
        Provider::Cuda(cuda) => vec![cuda_provider(cuda).build().error_on_failure()],
        Provider::TensorRt(trt) => {
            let mut tensorrt = ep::TensorRT::default()
                .with_device_id(trt.device_id)
                .with_fp16(trt.fp16);
            if let Some(dir) = &trt.engine_cache_dir {
                tensorrt = tensorrt
                    .with_engine_cache(true)
                    .with_engine_cache_path(dir.display());
            }
            if let Some(dir) = &trt.timing_cache_dir {
                tensorrt = tensorrt
                    .with_timing_cache(true)
                    .with_timing_cache_path(dir.display());
            }
            let cuda = CudaOptions {
                device_id: trt.device_id,
                ..CudaOptions::default()
            };
            vec![
                tensorrt.build().error_on_failure(),
                cuda_provider(&cuda).build().error_on_failure(),
            ]
        }
    }
}

fn cuda_provider(options: &CudaOptions) -> ep::CUDA {
    let search = match options.conv_algo_search {
        ConvAlgoSearch::Exhaustive => ep::cuda::ConvAlgorithmSearch::Exhaustive,
        ConvAlgoSearch::Heuristic => ep::cuda::ConvAlgorithmSearch::Heuristic,
        ConvAlgoSearch::Default => ep::cuda::ConvAlgorithmSearch::Default,
    };
    let arena = match options.arena_extend {
        ArenaExtend::NextPowerOfTwo => ArenaExtendStrategy::NextPowerOfTwo,
        ArenaExtend::SameAsRequested => ArenaExtendStrategy::SameAsRequested,
    };
    let mut cuda = ep::CUDA::default()
        .with_device_id(options.device_id)
        .with_conv_algorithm_search(search)
        .with_arena_extend_strategy(arena)
        .with_cuda_graph(options.cuda_graphs)
        .with_prefer_nhwc(options.prefer_nhwc)
        .with_conv_max_workspace(options.conv_max_workspace);
    use ep::cuda::AttentionBackend as B;
    let kernel = match options.attention {
        AttentionKernel::Auto => None,
        AttentionKernel::Flash | AttentionKernel::Fa2 => Some(B::FLASH_ATTENTION),
        AttentionKernel::Efficient => Some(B::EFFICIENT_ATTENTION),
        AttentionKernel::CudnnFlash => Some(B::CUDNN_FLASH_ATTENTION),
        AttentionKernel::Math => Some(B::MATH),
    };
    if let Some(kernel) = kernel {
        cuda = cuda.with_attention_backend(kernel);
    }
    if let Some(limit) = options.memory_limit {
        cuda = cuda.with_memory_limit(limit);
    }
    cuda
}

/// Whether this ONNX Runtime build has each provider compiled in (not whether it will register:
/// that also needs the CUDA libraries and a GPU).
pub fn available_providers() -> Vec<(&'static str, Result<bool, String>)> {
    vec![
        ("cpu", ep::CPU::is_available().map_err(|e| e.to_string())),
        ("cuda", ep::CUDA::is_available().map_err(|e| e.to_string())),
        (
            "tensorrt",
            ep::TensorRT::is_available().map_err(|e| e.to_string()),
        ),
    ]
}

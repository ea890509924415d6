//! ONNX Runtime sessions for a bundle's graphs, and the execution providers they run on.
//!
//! A provider that was asked for and fails to register is an error: a silent fall-back to the
//! CPU would turn a GPU speed probe into a meaningless number.

use std::path::Path;

use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::{Outlet, TensorElementType};

use super::bundle::{Bundle, BundleError};
pub use super::options::{
    CudaOptions, DitAttention, FusedPart, Provider, RuntimeOptions, TensorRtOptions,
};
use super::ort_lib::{self, OrtRuntime};
pub use super::session_error::{LoadCause, SessionError};
pub use super::settings::{
    ArenaExtend, AttentionBackend, ConvAlgoSearch, FusedKernels, Precision, ProviderKind,
};
use crate::vocab::AttentionPrecision;
pub use crate::vocab::StartupTimes;

mod builder;
mod providers;
pub(crate) use builder::build_small_session;
use builder::*;
pub use providers::{ProviderQueryError, available_providers};
use providers::{disabled_optimizers, execution_providers};

/// The sessions of a bundle. The text encoder's is `None` when the prompts were encoded before
/// the others were built ([`super::Generator::with_prompts`]).
pub struct GraphSessions {
    pub text_encoder: Option<Session>,
    pub dit: Session,
    /// The kernels the DiT session runs with (`Unstep` or `Onnxruntime`).
    pub dit_kernels: FusedKernels,
    /// What runs the DiT's self-attention.
    pub dit_attention: DitAttention,
    pub vae_first: Session,
    pub vae_step: Session,
    /// The kernels the decoder's sessions run with (`Unstep` or `Onnxruntime`).
    pub vae_kernels: FusedKernels,
    /// How the DiT graph takes its KV cache.
    pub kv_interface: KvInterface,
    /// The bundle's `dit_context` graph, exactly when the DiT takes the context's keys and values
    /// ([`ContextInterface::KeysValues`]).
    pub dit_context: Option<Session>,
    /// How long the DiT's sessions and the decoder's took to build (the other parts 0).
    pub built_in: StartupTimes,
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
    /// Whether `dit` is the bundle's fused DiT graph.
    dit_is_fused: bool,
    /// Whether `dit`'s self-attention nodes are rewritten to ONNX Runtime's when it is loaded.
    dit_attention: DitAttention,
    vae_first: &'a str,
    vae_step: &'a str,
}

impl<'a> GraphNames<'a> {
    fn of(
        bundle: &'a Bundle,
        dit: FusedKernels,
        vae: FusedKernels,
        dit_attention: DitAttention,
    ) -> Self {
        let g = &bundle.manifest.graphs;
        let pick = |kernels: FusedKernels, fused: &'a Option<String>, stock: &'a String| match (
            kernels, fused,
        ) {
            (FusedKernels::Unstep, Some(fused)) => fused.as_str(),
            _ => stock.as_str(),
        };
        Self {
            dit: pick(dit, &g.dit_fused, &g.dit),
            dit_is_fused: dit == FusedKernels::Unstep && g.dit_fused.is_some(),
            dit_attention,
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
    /// `warm_decoder` runs on the decoder's sessions (`vae_first`, `vae_step`) on the thread that
    /// built them, beside the DiT's build, and says whether it ran them (its time is then
    /// [`StartupTimes::decoder_first_run_s`]).
    pub fn build(
        bundle: &Bundle,
        options: &RuntimeOptions,
        text_encoder: bool,
        warm_decoder: impl FnOnce(&mut Session, &mut Session) -> bool + Send,
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
        let dit_attention = DitAttention::of(dit_kernels, &options.provider, &bundle.manifest);
        if options.attention_precision == AttentionPrecision::Int8 {
            let attention = match &options.provider {
                Provider::Cuda(c) => c.attention,
                _ => AttentionBackend::Auto,
            };
            let refusal =
                super::int8_attention_refusal(options.provider.kind(), dit_kernels, attention);
            let reason = match (refusal, dit_attention) {
                (Some(reason), _) => Some(reason.to_string()),
                (None, DitAttention::Runner) => None,
                (None, _) => Some(
                    "the bundle's DiT has no runner attention of its own (a `dit_fused` graph of \
                     exporter 0.10.0 or later); export the bundle again"
                        .to_string(),
                ),
            };
            if let Some(reason) = reason {
                return Err(SessionError::Int8AttentionUnavailable { reason });
            }
        }
        let names = GraphNames::of(bundle, dit_kernels, vae_kernels, dit_attention);
        configure_kernels(options);
        // The runner's operators, for the sessions of fused graphs.
        let operators = |kernels: FusedKernels, part: FusedPart| {
            if kernels != FusedKernels::Unstep {
                return Ok(None);
            }
            let cuda = !matches!(options.provider, Provider::Cpu);
            super::kernels::operator_domain(cuda)
                .map(Some)
                .map_err(|e| {
                    part.unavailable(&options.provider, bundle.manifest.precision, e.to_string())
                })
        };
        // The decoder's sessions are built on a second thread beside the DiT's: each build is
        // mostly one thread's work (reading weights, optimising the graph, copying it to the
        // device), and neither needs the other.
        let (dit, decoder) = std::thread::scope(|scope| {
            let decoder = scope.spawn(|| {
                let started = std::time::Instant::now();
                // The decoder's sessions run without ONNX Runtime's memory pattern on GPUs: with
                // it, the first run allocates tensor by tensor and later runs ask for one block of
                // the planned peak, which the fragmented arena cannot serve, so it reserves the
                // peak twice (measured on wan-1.3b: 11.0 GiB reserved for 5.4 GiB ever in use by
                // `vae_step`). Without it, later runs reuse the first run's chunks.
                let decoder = |graph: &str| {
                    let ops = operators(vae_kernels, FusedPart::Vae)?;
                    build_graph_session(runtime, bundle, graph, options, true, ops)
                };
                let mut first = decoder(names.vae_first)?;
                let mut step = decoder(names.vae_step)?;
                let built = started.elapsed().as_secs_f64();
                let ran = warm_decoder(&mut first, &mut step);
                let total = started.elapsed().as_secs_f64();
                let first_run = if ran { total - built } else { 0.0 };
                Ok::<_, SessionError>((first, step, total, first_run))
            });
            let started = std::time::Instant::now();
            let dit = Self::build_dit(runtime, bundle, dit_options, options, &names, || {
                operators(dit_kernels, FusedPart::Dit)
            })
            .map(|(dit, context)| (dit, context, started.elapsed().as_secs_f64()));
            let decoder = decoder
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (dit, decoder)
        });
        let (dit, dit_context, dit_s) = dit?;
        let (vae_first, vae_step, decoder_s, decoder_first_run_s) = decoder?;
        let text_encoder = if text_encoder {
            Some(text_encoder_session(runtime, bundle, options)?)
        } else {
            None
        };
        let sessions = Self {
            text_encoder,
            kv_interface: KvInterface::of(&dit),
            dit,
            dit_kernels,
            dit_attention,
            vae_first,
            vae_step,
            vae_kernels,
            dit_context,
            built_in: StartupTimes {
                dit_sessions_s: dit_s,
                decoder_sessions_s: decoder_s,
                decoder_first_run_s,
                ..StartupTimes::default()
            },
        };
        sessions.check_contract(bundle)?;
        Ok(sessions)
    }

    /// The DiT's session (`dit_options`, with the runner's operators from `operators` for a fused
    /// graph) and, when it takes the context's keys and values, `dit_context`'s (`options`).
    fn build_dit(
        runtime: &OrtRuntime,
        bundle: &Bundle,
        dit_options: &RuntimeOptions,
        options: &RuntimeOptions,
        names: &GraphNames,
        operators: impl FnOnce() -> Result<Option<ort::operator::OperatorDomain>, SessionError>,
    ) -> Result<(Session, Option<Session>), SessionError> {
        let context_graph = bundle.manifest.graphs.dit_context.as_deref();
        let context_session =
            |graph: &str| build_graph_session(runtime, bundle, graph, options, false, None);
        // The fused DiT takes the context's keys and values, which the small `dit_context` graph
        // computes: its session is built on a thread beside the DiT's, and dropped should the DiT
        // turn out not to take them (a bundle of an earlier exporter).
        let beside = context_graph.filter(|_| names.dit_is_fused);
        let (dit, context) = std::thread::scope(|scope| {
            let context = beside.map(|graph| scope.spawn(move || context_session(graph)));
            let dit = operators().and_then(|ops| {
                let builder = graph_session_builder(runtime, names.dit, dit_options, false, ops)?;
                load_dit(builder, bundle, names, &dit_options.provider)
            });
            let context = context.map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            });
            (dit, context)
        });
        let dit = dit?;
        // A DiT that takes the context's keys and values needs the graph that computes them.
        if !has_input(&dit, "ctx_k.0") {
            return Ok((dit, None));
        }
        let context = match (context, context_graph) {
            (Some(built), _) => built?,
            (None, Some(graph)) => context_session(graph)?,
            (None, None) => {
                return Err(BundleError::GraphContract {
                    role: "dit",
                    name: names.dit.to_string(),
                    problem: "it takes the context's keys and values (ctx_k.0, ...) but [graphs] \
                              has no dit_context graph that computes them"
                        .into(),
                }
                .into());
            }
        };
        Ok((dit, Some(context)))
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

        let names = GraphNames::of(
            bundle,
            self.dit_kernels,
            self.vae_kernels,
            self.dit_attention,
        );
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

/// Sets the runner's CUDA kernels' settings (their cache folder, logs, attention arithmetic) from
/// `options`.
fn configure_kernels(options: &RuntimeOptions) {
    super::kernels::configure(super::kernels::KernelSettings {
        cache_dir: options.kernel_cache_dir.clone(),
        conv_log: options.diagnostics.conv_log,
        creation_log: options.diagnostics.ort_log_level.is_some(),
        attention_precision: options.attention_precision,
    });
}

/// Starts compiling the runner's CUDA kernels on a thread of their own when the DiT's or the
/// decoder's sessions of `bundle` will run them (the fused kernels resolve to the runner's on a
/// CUDA provider), for a process that has other work to do first (its text encoder); the
/// sessions built later find them loaded ([`super::kernels::compile_ahead`]). Nothing happens
/// otherwise, and a kernel setting that would fail is left for the sessions' build to report.
pub(crate) fn compile_kernels_ahead(bundle: &Bundle, options: &RuntimeOptions) {
    let Provider::Cuda(cuda) = &options.provider else {
        return;
    };
    let runs_them = |kernels: FusedKernels, part: FusedPart| {
        kernels
            .resolve(part, &options.provider, bundle)
            .is_ok_and(|k| k == FusedKernels::Unstep)
    };
    if runs_them(options.dit_kernels, FusedPart::Dit)
        || runs_them(options.vae_kernels, FusedPart::Vae)
    {
        configure_kernels(options);
        super::kernels::compile_ahead(cuda.device_id, options.attention_precision);
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

/// The element type of a bundle's float tensors. An fp8 bundle's are float16: its 8-bit values
/// live inside `dit_fused`'s matrix multiplies alone.
pub fn float_type(precision: Precision) -> TensorElementType {
    match precision {
        Precision::Fp32 => TensorElementType::Float32,
        Precision::Fp16 | Precision::Fp8 => TensorElementType::Float16,
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

/// Why a graph's input or output does not fit the bundle contract, said after its name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum OutletError {
    #[error("is not a tensor")]
    NotTensor,
    #[error("has element type {actual:?}, expected {expected:?}")]
    ElementType {
        actual: TensorElementType,
        expected: TensorElementType,
    },
    #[error("has rank {actual}, expected {expected}")]
    Rank { actual: usize, expected: usize },
}

fn check_outlet(outlet: &Outlet, ty: TensorElementType, rank: usize) -> Result<(), OutletError> {
    let (Some(actual_ty), Some(shape)) =
        (outlet.dtype().tensor_type(), outlet.dtype().tensor_shape())
    else {
        return Err(OutletError::NotTensor);
    };
    if actual_ty != ty {
        return Err(OutletError::ElementType {
            actual: actual_ty,
            expected: ty,
        });
    }
    if rank != 0 && shape.len() != rank {
        return Err(OutletError::Rank {
            actual: shape.len(),
            expected: rank,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An fp8 bundle's graphs take and give float16 tensors, as an fp16 bundle's do.
    #[test]
    fn fp8_graphs_have_float16_tensors() {
        assert_eq!(float_type(Precision::Fp8), TensorElementType::Float16);
        assert_eq!(float_type(Precision::Fp8), float_type(Precision::Fp16));
        assert_eq!(float_type(Precision::Fp32), TensorElementType::Float32);
    }
}

//! The generation loop of `docs/generation.md`: text encoding, block-causal denoising with a KV
//! cache the runner owns, the clean-cache pass, per-frame VAE decoding and the uint8 layout.
//!
//! One loop runs on every provider. Every tensor it touches lives where the provider computes (on
//! the GPU for the CUDA and TensorRT providers, in host memory for the CPU provider), in buffers
//! allocated once per [`Generator`] and bound to the sessions with ONNX Runtime's IoBinding, so
//! that nothing crosses the PCIe bus inside the timed region. The scheduler arithmetic between DiT
//! passes, the latent de-normalisation and the uint8 layout are the runner's own small graphs
//! ([`super::onnx_graph`]) on the same provider. ONNX Runtime synchronises the device at the end
//! of every `run`, so host clocks read after a run are device-synchronised phase boundaries.
//!
//! - this file: [`Generator`], its options, results and errors;
//! - `context`: the prompt's text context, encoded on the host and uploaded, and `dit_context`;
//! - `dims`: the bundle's shapes;
//! - `state`: the loop's buffers and small graphs, allocated once;
//! - `buffers`: allocations, views into them, IoBindings, host ↔ device copies;
//! - `prompt`: one prompt's phases (tables before the timed region, the timed region, copies
//!   after it);
//! - `dit`: the block loop, the DiT's bindings and passes, the scheduler arithmetic;
//! - `capture`: the DiT's CUDA graphs and the turns captures and the decoder thread take;
//! - `decode`: VAE decoding per latent frame and the uint8 layout;
//! - `arena`: device arena statistics logged after each prompt on GPUs.

mod arena;
mod buffers;
mod capture;
mod context;
mod decode;
mod dims;
mod dit;
mod prompt;
mod state;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bundle::{Bundle, BundleError, ExportSettings, Precision};
use super::one_time::OneTimeWork;
use super::schedule::{MethodSettings, Schedule, ScheduleError};
use super::session::{
    ContextInterface, FusedPart, GraphSessions, KvInterface, Provider, RuntimeOptions,
    SessionError, StartupTimes,
};
pub use super::settings::TimedRegionEnd;
use super::text::{PromptTokenizer, TokenizerError};
use crate::vocab::{ContextSource, TextContexts};
use context::{Ahead, encode_ahead, encode_to_host, text_encoder_released};
use dims::Dims;
use state::DeviceLoop;

/// Per-prompt options of a generation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerateOptions {
    pub method: MethodSettings,
    /// End the timed region when the VAE output exists, before the clamp and uint8 layout
    /// (`timing.exclude_final_output_layout`).
    pub exclude_final_output_layout: bool,
    /// Stop after the DiT: no VAE decode and no frames; the timed region ends with the last
    /// block's latents. For DiT-only probes and tests of the latents.
    pub latents_only: bool,
}

/// Wall-clock phase times of one prompt. The timed region starts when the text context is ready
/// and ends per [`TimedRegionEnd`]; `text_encoding` is outside it. `layout` is the layout's share
/// of the region: zero when the region ends before it (`exclude_final_output_layout`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PhaseTimes {
    pub text_encoding: Duration,
    pub dit: Duration,
    pub vae: Duration,
    pub layout: Duration,
    pub timed_total: Duration,
    /// Time inside `Session::run` within the timed region; the rest is the runner's overhead.
    /// With the VAE decoded beside the DiT it sums both threads' runs and can exceed
    /// `timed_total`.
    pub session_run: Duration,
}

impl PhaseTimes {
    /// The share of the timed region spent outside `Session::run`.
    pub fn overhead_share(&self) -> f64 {
        let total = self.timed_total.as_secs_f64();
        if total == 0.0 {
            return 0.0;
        }
        (total - self.session_run.as_secs_f64()).max(0.0) / total
    }
}

/// One generated video.
#[derive(Debug, Clone)]
pub struct Generated {
    pub prompt_index: u32,
    /// The final latents, `[1, channels, latent_frames, h, w]`, before de-normalisation.
    pub latents: Vec<f32>,
    pub latent_shape: [usize; 5],
    /// RGB frames, `[frames, height, width, 3]`; empty when only latents were asked for.
    pub frames: Vec<u8>,
    pub frame_shape: [usize; 4],
    pub times: PhaseTimes,
    /// The one-time work this prompt did (the first of a process, or one with a new shape).
    pub one_time: OneTimeWork,
    /// Whether this process encoded the prompt's text context or read one an earlier process
    /// kept.
    pub text_context: ContextSource,
    pub timed_region_end: TimedRegionEnd,
    /// Device memory in use after the prompt (an upper bound of its peak; see
    /// `engine::cuda_memory`); `None` on the CPU.
    pub peak_device_memory: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("invalid method settings: {0}")]
    Schedule(#[from] ScheduleError),
    #[error("run graph {graph}: {message}")]
    Run {
        graph: &'static str,
        message: String,
    },
    #[error(
        "graph {graph} gave output {name} {problem}; the bundle does not match its bundle.toml: export it again"
    )]
    Output {
        graph: &'static str,
        name: String,
        problem: String,
    },
}

/// The CPU provider runs fp32 bundles only; the DiT of an fp8 bundle runs only with the runner's
/// kernels, checked here so that a refusal comes before the text encoder runs.
fn check_provider_precision(
    bundle: &Bundle,
    runtime: &RuntimeOptions,
) -> Result<(), GenerateError> {
    let precision = bundle.manifest.precision;
    if runtime.provider == Provider::Cpu && precision != Precision::Fp32 {
        return Err(BundleError::UnsupportedPrecision(precision).into());
    }
    if precision == Precision::Fp8 {
        runtime
            .dit_kernels
            .resolve(FusedPart::Dit, &runtime.provider, bundle)?;
    }
    Ok(())
}

/// A bundle's sessions and buffers, ready to generate prompts one after another.
pub struct Generator {
    bundle: Bundle,
    /// The bundle's prompt tokenizer, for prompts encoded as they are generated.
    tokenizer: Arc<PromptTokenizer>,
    sessions: GraphSessions,
    dims: Dims,
    /// The loop's buffers and small graphs, where the provider computes.
    state: DeviceLoop,
    /// Contexts encoded ahead ([`Generator::with_prompts`]) by prompt text, with the time each
    /// encoding took.
    ahead: Ahead,
    /// How the contexts encoded ahead were come by; `None` when prompts are encoded as they are
    /// generated.
    text_contexts: Option<TextContexts>,
    startup: StartupTimes,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("bundle", &self.bundle.dir)
            .finish_non_exhaustive()
    }
}

impl Generator {
    /// Opens and checks a bundle (unpacking a `.zip` into `unpack_dir`), refuses export settings
    /// that differ from it, and builds its sessions.
    pub fn open(
        bundle_path: &Path,
        unpack_dir: &Path,
        export: &ExportSettings,
        runtime: &RuntimeOptions,
    ) -> Result<Self, GenerateError> {
        Self::new(Bundle::open_for(bundle_path, unpack_dir, export)?, runtime)
    }

    /// Builds the sessions of an opened bundle; prompts are encoded as they are generated.
    pub fn new(bundle: Bundle, runtime: &RuntimeOptions) -> Result<Self, GenerateError> {
        check_provider_precision(&bundle, runtime)?;
        Self::build(bundle, runtime, None)
    }

    /// Encodes every distinct prompt text of `prompts` with the bundle's text encoder alone,
    /// keeps the contexts on the host (`text_len × text_dim` values each, in the bundle's type) and
    /// drops the encoder, then builds the DiT's and the decoder's sessions: the encoder's weights
    /// and arena are never on the device together with theirs. Only these prompts can be
    /// generated; each generation records the encoding time of its prompt measured here.
    pub fn with_prompts<'a>(
        bundle: Bundle,
        runtime: &RuntimeOptions,
        prompts: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, GenerateError> {
        Self::with_prompts_and_later(bundle, runtime, prompts, [])
    }

    /// [`Generator::with_prompts`], and with [`RuntimeOptions::context_cache_dir`] also the
    /// contexts of `for_later`, prompts this process does not generate, encoded and kept in that
    /// folder for the processes after it (a generation's warmup does this for its shards, which
    /// then never load the text encoder). Contexts kept there already are not encoded again.
    pub fn with_prompts_and_later<'a>(
        bundle: Bundle,
        runtime: &RuntimeOptions,
        prompts: impl IntoIterator<Item = &'a str>,
        for_later: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, GenerateError> {
        check_provider_precision(&bundle, runtime)?;
        // The kernels compile on their own thread while the text encoder runs.
        super::session::compile_kernels_ahead(&bundle, runtime);
        let started = Instant::now();
        let (contexts, counts) = encode_ahead(&bundle, runtime, prompts, for_later)?;
        let text_encoder_s = started.elapsed().as_secs_f64();
        let mut generator = Self::build(bundle, runtime, Some(contexts))?;
        generator.startup.text_encoder_s = text_encoder_s;
        generator.text_contexts = Some(counts);
        Ok(generator)
    }

    /// The sessions and buffers; with `ahead`, the prompts' contexts instead of a text encoder.
    fn build(
        bundle: Bundle,
        runtime: &RuntimeOptions,
        ahead: Option<Ahead>,
    ) -> Result<Self, GenerateError> {
        let tokenizer = bundle.tokenizer()?;
        let dims = Dims::of(&bundle);
        // On CUDA the decoder runs once on zeros as soon as its sessions exist, beside the DiT's
        // build: its convolution choices and first allocations are then made before the first
        // prompt, where the DiT's graph captures would wait for them. Should that run fail, the
        // first prompt makes them (and meets the error again, in its place).
        let device = match &runtime.provider {
            Provider::Cuda(cuda) => Some(cuda.device_id),
            _ => None,
        };
        let model = super::session::float_type(bundle.manifest.precision);
        let warm_decoder = |first: &mut ort::session::Session, step: &mut ort::session::Session| {
            let Some(device) = device else { return false };
            if let Err(e) = decode::warm_up(first, step, &dims, model, Some(device)) {
                eprintln!(
                    "warning: the decoder's first run on zeros failed ({e}); its first prompt \
                     makes its choices instead"
                );
            }
            true
        };
        let sessions = GraphSessions::build(&bundle, runtime, ahead.is_none(), warm_decoder)?;
        let started = Instant::now();
        let state = DeviceLoop::new(&bundle, &sessions, runtime)?;
        let startup = StartupTimes {
            bundle_check_s: bundle.opened_in_s,
            buffers_s: started.elapsed().as_secs_f64(),
            ..sessions.built_in
        };
        Ok(Self {
            bundle,
            tokenizer,
            sessions,
            dims,
            state,
            ahead: ahead.unwrap_or_default(),
            text_contexts: None,
            startup,
        })
    }

    /// The kernels the DiT runs with (never `Auto`).
    pub fn dit_kernels(&self) -> super::FusedKernels {
        self.sessions.dit_kernels
    }

    /// What runs the DiT's self-attention.
    pub fn dit_attention(&self) -> super::DitAttention {
        self.sessions.dit_attention
    }

    /// The kernels the VAE decoder runs with (never `Auto`).
    pub fn vae_kernels(&self) -> super::FusedKernels {
        self.sessions.vae_kernels
    }

    /// How the DiT graph takes the KV cache (read from its inputs).
    pub fn kv_interface(&self) -> KvInterface {
        self.sessions.kv_interface
    }

    /// How the DiT session takes the text context (and so whether `dit_context` runs).
    pub fn context_interface(&self) -> ContextInterface {
        self.sessions.context_interface()
    }

    pub fn bundle(&self) -> &Bundle {
        &self.bundle
    }

    /// Where this generator's construction went.
    pub fn startup(&self) -> StartupTimes {
        self.startup
    }

    /// How many text contexts the generator encoded and read before its DiT's sessions
    /// ([`Generator::with_prompts`]); `None` when it encodes prompts as they are generated.
    pub fn text_contexts(&self) -> Option<TextContexts> {
        self.text_contexts
    }

    /// Generates one prompt. `prompt_index` is the prompt's global index: it selects the noise,
    /// so the same index gives the same video whatever else is generated around it.
    pub fn generate(
        &mut self,
        prompt_index: u32,
        prompt_text: &str,
        options: &GenerateOptions,
    ) -> Result<Generated, GenerateError> {
        let schedule = Schedule::new(&options.method)?;
        // The prompt's context: encoded ahead ([`Generator::with_prompts`]) or now.
        let encoded;
        let (context, encoding, source) = match self.ahead.get(prompt_text) {
            Some(ahead) => (&ahead.context, ahead.took, ahead.source),
            None => {
                let started = Instant::now();
                let encoder = self
                    .sessions
                    .text_encoder
                    .as_mut()
                    .ok_or_else(text_encoder_released)?;
                encoded = encode_to_host(encoder, &self.tokenizer, prompt_text)?;
                (&encoded, started.elapsed(), ContextSource::Encoded)
            }
        };
        let seed = options.method.seed;
        let noise = |draw: u32, out: &mut [f32]| {
            super::noise::fill_normal(seed, prompt_index, draw, out);
        };
        let out = self.state.generate(
            &mut self.sessions,
            context,
            encoding,
            &noise,
            &schedule,
            options,
        )?;
        let d = &self.dims;
        let video_frames = if out.frames.is_empty() {
            0
        } else {
            d.video_frames()
        };
        Ok(Generated {
            prompt_index,
            latents: out.latents,
            latent_shape: [1, d.channels, d.latent_frames, d.h, d.w],
            frames: out.frames,
            frame_shape: [video_frames, d.height, d.width, 3],
            times: out.times,
            one_time: super::one_time::take(),
            text_context: source,
            timed_region_end: out.end,
            peak_device_memory: out.peak_device_memory,
        })
    }
}

/// Maps an ONNX Runtime error of running `graph` to [`GenerateError::Run`].
fn run_error(graph: &'static str) -> impl Fn(ort::Error) -> GenerateError + Copy {
    move |e| GenerateError::Run {
        graph,
        message: e.to_string(),
    }
}

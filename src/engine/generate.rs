//! The generation loop of `docs/generation.md`: text encoding, block-causal denoising with a KV
//! cache the runner owns, the clean-cache pass, per-frame VAE decoding and the uint8 layout.
//!
//! Scheduler arithmetic between DiT passes runs on the host in float32. Every buffer the loop
//! touches per pass is allocated once per `Generator`, so the time outside `Session::run` stays a
//! small share of the timed region.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ort::session::{Session, SessionInputValue, SessionOutputs};
use ort::value::{DynValue, TensorElementType, TensorRef, TensorRefMut};

use super::bundle::{Bundle, BundleError, ExportSettings, Precision};
use super::noise::fill_normal;
use super::schedule::{Emit, MethodSettings, NoiseLevel, Schedule, ScheduleError};
use super::session::{
    ContextInterface, GraphSessions, KvInterface, KvNames, Provider, RuntimeOptions, SessionError,
    context_names, indexed_names, vae_cache_count,
};
use super::text::{PromptTokenizer, TokenizerError};

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

/// Where the timed region of a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimedRegionEnd {
    /// After the uint8 frames exist (the default).
    AfterLayout,
    /// After the VAE output, excluding the final clamp and layout.
    AfterVaeOutput,
    /// After the DiT's last block (`latents_only`: nothing was decoded).
    AfterLatents,
}

impl TimedRegionEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            TimedRegionEnd::AfterLayout => "after_layout",
            TimedRegionEnd::AfterVaeOutput => "after_vae_output",
            TimedRegionEnd::AfterLatents => "after_latents",
        }
    }
}

/// Wall-clock phase times of one prompt. The timed region starts when the text context is ready
/// and ends per [`TimedRegionEnd`]; `text_encoding` is outside it, `layout` is outside it when the
/// layout is excluded.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PhaseTimes {
    pub text_encoding: Duration,
    pub dit: Duration,
    pub vae: Duration,
    pub layout: Duration,
    pub timed_total: Duration,
    /// Time inside `Session::run` within the timed region; the rest is the runner's overhead.
    /// With the VAE decoded beside the DiT (device loop) it sums both threads' runs and can
    /// exceed `timed_total`.
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

/// The error for a prompt that needs the text encoder when the generator was built without it.
fn text_encoder_released() -> GenerateError {
    GenerateError::Run {
        graph: "text_encoder",
        message: "this generator encoded its prompts before loading the DiT and has no text \
                  encoder, and this prompt was not among them"
            .into(),
    }
}

/// The CPU provider runs fp32 bundles only.
fn check_provider_precision(bundle: &Bundle, runtime: &RuntimeOptions) -> Result<(), BundleError> {
    if runtime.provider == Provider::Cpu && bundle.manifest.precision != Precision::Fp32 {
        return Err(BundleError::UnsupportedPrecision(bundle.manifest.precision));
    }
    Ok(())
}

/// Tokenizes `prompt` with the bundle's tokenizer and runs a text encoder session on it; ONNX
/// Runtime hands the context back in host memory.
fn encode_to_host(
    encoder: &mut Session,
    tokenizer: &PromptTokenizer,
    prompt: &str,
) -> Result<HostContext, GenerateError> {
    const GRAPH: &str = "text_encoder";
    let e = run_error(GRAPH);
    let tokens = tokenizer.encode(prompt)?;
    let shape = [1i64, tokenizer.text_len() as i64];
    let outputs = encoder
        .run(ort::inputs![
            "input_ids" => TensorRef::from_array_view((shape, tokens.ids.as_slice())).map_err(e)?,
            "attention_mask" => TensorRef::from_array_view((shape, tokens.mask.as_slice())).map_err(e)?,
        ])
        .map_err(e)?;
    let value = &outputs["context"];
    let context = match value.dtype().tensor_type() {
        Some(TensorElementType::Float16) => HostContext::F16(
            value
                .try_extract_tensor::<half::f16>()
                .map_err(e)?
                .1
                .to_vec(),
        ),
        Some(TensorElementType::Bfloat16) => HostContext::Bf16(
            value
                .try_extract_tensor::<half::bf16>()
                .map_err(e)?
                .1
                .to_vec(),
        ),
        _ => HostContext::F32(value.try_extract_tensor::<f32>().map_err(e)?.1.to_vec()),
    };
    Ok(context)
}

/// A prompt's text context on the host, in the bundle's float type.
#[derive(Debug, Clone)]
pub(crate) enum HostContext {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    Bf16(Vec<half::bf16>),
}

/// Shapes derived from the bundle, in elements and tokens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) channels: usize,
    pub(crate) frames_per_block: usize,
    pub(crate) latent_frames: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) height: usize,
    pub(crate) width: usize,
    pub(crate) dim: usize,
    pub(crate) tokens_per_frame: usize,
    pub(crate) text_len: usize,
    pub(crate) text_dim: usize,
    /// Pixel frames per latent frame after the first (the VAE's temporal stride).
    pub(crate) frames_per_step: usize,
    pub(crate) layers: usize,
}

impl Dims {
    pub(crate) fn of(bundle: &Bundle) -> Self {
        let m = &bundle.manifest;
        let (h, w) = bundle.latent_hw();
        Self {
            channels: m.architecture.latent_channels,
            frames_per_block: m.export.frames_per_block,
            latent_frames: m.export.latent_frames,
            h,
            w,
            height: m.export.height,
            width: m.export.width,
            dim: m.architecture.dim,
            tokens_per_frame: m.architecture.tokens_per_frame,
            text_len: m.architecture.text_len,
            text_dim: m.architecture.text_dim,
            frames_per_step: m.architecture.vae_stride[0],
            layers: m.architecture.layers,
        }
    }

    pub(crate) fn blocks(&self) -> usize {
        self.latent_frames / self.frames_per_block
    }

    pub(crate) fn block_elems(&self) -> usize {
        self.channels * self.frames_per_block * self.h * self.w
    }

    /// The shape of one block's latents, `[1, C, F, h, w]`.
    pub(crate) fn block_shape(&self) -> [i64; 5] {
        [
            1,
            self.channels as i64,
            self.frames_per_block as i64,
            self.h as i64,
            self.w as i64,
        ]
    }

    pub(crate) fn block_tokens(&self) -> usize {
        self.frames_per_block * self.tokens_per_frame
    }

    pub(crate) fn video_frames(&self) -> usize {
        1 + self.frames_per_step * (self.latent_frames - 1)
    }

    pub(crate) fn frame_px(&self) -> usize {
        self.height * self.width
    }
}

/// The KV cache: one buffer per layer and kind, `latent_frames * tokens_per_frame` tokens of
/// `dim` each. A block's past is a contiguous prefix (or window suffix of that prefix), so it is
/// passed to the DiT without copying.
struct KvCache {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    /// Tokens written so far.
    len: usize,
}

/// The causal cache the VAE decoder passes from one latent frame to the next. The values ONNX
/// Runtime returns are kept as they are and handed back as the next call's inputs: copying them
/// to host buffers would cost more than the rest of the runner's work together.
struct VaeCache {
    names_in: Vec<String>,
    names_out: Vec<String>,
    values: Vec<Option<DynValue>>,
}

/// Host buffers reused by every prompt.
struct Buffers {
    context: Vec<f32>,
    /// With [`ContextInterface::KeysValues`], every layer's cross-attention keys and values of
    /// the prompt (`dit_context`'s outputs, named as `context_names`); empty otherwise.
    context_kv: Vec<[Vec<f32>; 2]>,
    /// `[ctx_k.{i}, ctx_v.{i}]` per layer.
    context_names: Vec<[String; 2]>,
    x: Vec<f32>,
    x0: Vec<f32>,
    flow: Vec<f32>,
    noise: Vec<f32>,
    latents: Vec<f32>,
    z: Vec<f32>,
    /// Decoded video, `[3, frames, height, width]` as the VAE gives it.
    video: Vec<f32>,
}

/// A bundle's sessions and buffers, ready to generate prompts one after another.
pub struct Generator {
    bundle: Bundle,
    /// The bundle's prompt tokenizer, for prompts encoded as they are generated.
    tokenizer: Arc<PromptTokenizer>,
    sessions: GraphSessions,
    dims: Dims,
    dit_names: KvNames,
    kv: KvCache,
    vae_cache: VaeCache,
    buffers: Buffers,
    /// The device loop; `None` runs the host loop (CPU provider, fp32).
    device: Option<super::device::DeviceLoop>,
    /// Contexts encoded ahead ([`Generator::with_prompts`]) by prompt text, with the time each
    /// encoding took.
    ahead: HashMap<String, (HostContext, Duration)>,
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
    /// keeps the contexts on the host (`text_len × text_dim` values each, in the bundle's type:
    /// 4 MiB a prompt for wan-1.3b in fp16) and drops the encoder, then builds the DiT's and the
    /// decoder's sessions: the encoder's weights and arena (0.85 GiB for the wan-1.3b preset's
    /// 2-layer encoder; UMT5-XXL's 24 layers weigh about 11 GB in 16 bits, the size of Wan's
    /// released encoder checkpoint, not measured here) are never on the device
    /// together with theirs. Only these prompts can be generated; each generation records the
    /// encoding time of its prompt measured here.
    pub fn with_prompts<'a>(
        bundle: Bundle,
        runtime: &RuntimeOptions,
        prompts: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, GenerateError> {
        check_provider_precision(&bundle, runtime)?;
        let tokenizer = bundle.tokenizer()?;
        let mut encoder = GraphSessions::build_text_encoder(&bundle, runtime)?;
        let mut contexts = HashMap::new();
        for text in prompts {
            if contexts.contains_key(text) {
                continue;
            }
            let started = Instant::now();
            let context = encode_to_host(&mut encoder, &tokenizer, text)?;
            contexts.insert(text.to_string(), (context, started.elapsed()));
        }
        drop(encoder);
        Self::build(bundle, runtime, Some(contexts))
    }

    /// The sessions and buffers; with `ahead`, the prompts' contexts instead of a text encoder.
    fn build(
        bundle: Bundle,
        runtime: &RuntimeOptions,
        ahead: Option<HashMap<String, (HostContext, Duration)>>,
    ) -> Result<Self, GenerateError> {
        let on_cpu = runtime.provider == Provider::Cpu;
        let tokenizer = bundle.tokenizer()?;
        let sessions = GraphSessions::build(&bundle, runtime, ahead.is_none())?;
        let device = if on_cpu && !runtime.io_binding {
            None
        } else {
            Some(super::device::DeviceLoop::new(&bundle, &sessions, runtime)?)
        };
        let dims = Dims::of(&bundle);
        let layers = bundle.manifest.architecture.layers;
        let dit_names = KvNames::new(sessions.kv_interface, layers);
        // The host loop's buffers; empty when the device loop holds its own.
        let host = |n: usize| if device.is_some() { 0 } else { n };
        let cache_tokens = dims.latent_frames * dims.tokens_per_frame;
        let kv = KvCache {
            keys: vec![vec![0.0; host(cache_tokens * dims.dim)]; layers],
            values: vec![vec![0.0; host(cache_tokens * dims.dim)]; layers],
            len: 0,
        };
        let caches = vae_cache_count(&sessions.vae_first);
        let vae_cache = VaeCache {
            names_in: indexed_names("cache_in", caches),
            names_out: indexed_names("cache_out", caches),
            values: (0..caches).map(|_| None).collect(),
        };
        let frame_elems = dims.channels * dims.h * dims.w;
        let context_kv = match sessions.context_interface() {
            ContextInterface::KeysValues if device.is_none() => {
                let n = dims.text_len * dims.dim;
                (0..layers).map(|_| [vec![0.0; n], vec![0.0; n]]).collect()
            }
            _ => Vec::new(),
        };
        let buffers = Buffers {
            context: vec![0.0; dims.text_len * dims.text_dim],
            context_kv,
            context_names: context_names(layers),
            x: vec![0.0; host(dims.block_elems())],
            x0: vec![0.0; host(dims.block_elems())],
            flow: vec![0.0; host(dims.block_elems())],
            noise: vec![0.0; host(dims.block_elems())],
            latents: vec![0.0; host(frame_elems * dims.latent_frames)],
            z: vec![0.0; host(frame_elems)],
            video: vec![0.0; host(3 * dims.video_frames() * dims.height * dims.width)],
        };
        Ok(Self {
            bundle,
            tokenizer,
            sessions,
            dims,
            dit_names,
            kv,
            vae_cache,
            buffers,
            device,
            ahead: ahead.unwrap_or_default(),
        })
    }

    /// Whether this generator runs the device loop (IoBinding, device-resident buffers).
    pub fn uses_device_loop(&self) -> bool {
        self.device.is_some()
    }

    /// The kernels the DiT runs with (never `Auto`).
    pub fn dit_kernels(&self) -> super::FusedKernels {
        self.sessions.dit_kernels
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
        let (context, encoding) = match self.ahead.get(prompt_text) {
            Some((context, encoding)) => (context, *encoding),
            None => {
                let started = Instant::now();
                let encoder = self
                    .sessions
                    .text_encoder
                    .as_mut()
                    .ok_or_else(text_encoder_released)?;
                encoded = encode_to_host(encoder, &self.tokenizer, prompt_text)?;
                (&encoded, started.elapsed())
            }
        };
        if let Some(device) = &mut self.device {
            let seed = options.method.seed;
            let noise = |draw: u32, out: &mut [f32]| {
                super::noise::fill_normal(seed, prompt_index, draw, out);
            };
            let out = device.generate(
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
            return Ok(Generated {
                prompt_index,
                latents: out.latents,
                latent_shape: [1, d.channels, d.latent_frames, d.h, d.w],
                frames: out.frames,
                frame_shape: [video_frames, d.height, d.width, 3],
                times: out.times,
                timed_region_end: out.end,
                peak_device_memory: out.peak_device_memory,
            });
        }
        let mut times = PhaseTimes::default();

        let HostContext::F32(context) = context else {
            unreachable!("the host loop runs fp32 bundles only");
        };
        self.buffers.context.copy_from_slice(context);
        times.text_encoding = encoding;

        // The timed region: from the moment the context is ready.
        let timed_start = Instant::now();
        self.context_keys_values(&mut times)?;
        self.denoise(prompt_index, &options.method, &schedule, &mut times)?;
        let dit_end = Instant::now();
        times.dit = dit_end - timed_start;
        let (frames, timed_region_end) = if options.latents_only {
            times.timed_total = dit_end - timed_start;
            (Vec::new(), TimedRegionEnd::AfterLatents)
        } else {
            self.decode(&mut times)?;
            let vae_end = Instant::now();
            times.vae = vae_end - dit_end;
            let frames = self.layout();
            let layout_end = Instant::now();
            times.layout = layout_end - vae_end;
            if options.exclude_final_output_layout {
                times.timed_total = vae_end - timed_start;
                (frames, TimedRegionEnd::AfterVaeOutput)
            } else {
                times.timed_total = layout_end - timed_start;
                (frames, TimedRegionEnd::AfterLayout)
            }
        };

        let d = &self.dims;
        let video_frames = if frames.is_empty() {
            0
        } else {
            d.video_frames()
        };
        Ok(Generated {
            prompt_index,
            latents: self.buffers.latents.clone(),
            latent_shape: [1, d.channels, d.latent_frames, d.h, d.w],
            frames,
            frame_shape: [video_frames, d.height, d.width, 3],
            times,
            timed_region_end,
            peak_device_memory: None,
        })
    }

    /// The block loop: denoising steps, then the clean-cache pass that writes the KV cache.
    fn denoise(
        &mut self,
        prompt: u32,
        method: &MethodSettings,
        schedule: &Schedule,
        times: &mut PhaseTimes,
    ) -> Result<(), GenerateError> {
        let d = self.dims;
        let steps = schedule.steps.len();
        let draws = schedule.draws_per_block();
        // `attention_window` >= 0 keeps that many latent frames of the past; -1 keeps all of it.
        let window_tokens = (method.attention_window >= 0)
            .then(|| method.attention_window as usize * d.tokens_per_frame);
        self.kv.len = 0;
        for block in 0..d.blocks() {
            let first_draw = block as u32 * draws;
            let frame_offset = (block * d.frames_per_block) as i64;
            let past_end = self.kv.len;
            let past_start = window_tokens.map_or(0, |w| past_end.saturating_sub(w));
            let past = past_start..past_end;
            let buf = &mut self.buffers;

            fill_noise(method.seed, prompt, first_draw, &mut buf.x);
            for (j, level) in schedule.steps.iter().enumerate() {
                self.dit_pass(*level, frame_offset, past.clone(), false, times)?;
                let buf = &mut self.buffers;
                for ((x0, &x), &v) in buf.x0.iter_mut().zip(&buf.x).zip(&buf.flow) {
                    *x0 = x - level.sigma * v;
                }
                if j + 1 < steps {
                    let next = schedule.steps[j + 1].sigma;
                    fill_noise(
                        method.seed,
                        prompt,
                        first_draw + j as u32 + 1,
                        &mut buf.noise,
                    );
                    renoise(&mut buf.x, &buf.x0, &buf.noise, next);
                }
            }

            // The clean-cache pass: re-noise the final x0 to clean_sigma and run once more, keeping
            // this pass's keys and values as the block's cache entry.
            let clean = schedule.clean;
            let buf = &mut self.buffers;
            fill_noise(
                method.seed,
                prompt,
                first_draw + steps as u32,
                &mut buf.noise,
            );
            renoise(&mut buf.x, &buf.x0, &buf.noise, clean.sigma);
            self.dit_pass(clean, frame_offset, past, true, times)?;
            self.kv.len += d.block_tokens();

            // The block's output goes to `x0`: the clean-cache pass's prediction, or the last
            // denoising step's x0 as it stands.
            let buf = &mut self.buffers;
            if method.emit == Emit::CachePass {
                for ((out, &x), &v) in buf.x0.iter_mut().zip(&buf.x).zip(&buf.flow) {
                    *out = x - clean.sigma * v;
                }
            }
            // Scatter the block [C, F, h, w] into the video's latents [C, latent_frames, h, w].
            let plane = d.frames_per_block * d.h * d.w;
            let frame_start = block * d.frames_per_block * d.h * d.w;
            let row = d.latent_frames * d.h * d.w;
            for c in 0..d.channels {
                buf.latents[c * row + frame_start..][..plane]
                    .copy_from_slice(&buf.x0[c * plane..][..plane]);
            }
        }
        Ok(())
    }

    /// With a `dit_context` graph, runs it on `buffers.context` into `buffers.context_kv`.
    fn context_keys_values(&mut self, times: &mut PhaseTimes) -> Result<(), GenerateError> {
        const GRAPH: &str = "dit_context";
        let Some(session) = self.sessions.dit_context.as_mut() else {
            return Ok(());
        };
        let d = self.dims;
        let context = TensorRef::from_array_view((
            [1i64, d.text_len as i64, d.text_dim as i64],
            self.buffers.context.as_slice(),
        ))
        .map_err(run_error(GRAPH))?;
        let run_start = Instant::now();
        let outputs = session
            .run(ort::inputs!["context" => context])
            .map_err(run_error(GRAPH))?;
        times.session_run += run_start.elapsed();
        let buf = &mut self.buffers;
        for (names, bufs) in buf.context_names.iter().zip(buf.context_kv.iter_mut()) {
            for (name, buf) in names.iter().zip(bufs.iter_mut()) {
                copy_output(&outputs, GRAPH, name, buf)?;
            }
        }
        Ok(())
    }

    /// One DiT pass over `buffers.x`; the flow goes to `buffers.flow`. On the clean-cache pass the
    /// new keys and values are written straight after the cache's current end.
    fn dit_pass(
        &mut self,
        level: NoiseLevel,
        frame_offset: i64,
        past: std::ops::Range<usize>,
        clean_cache_pass: bool,
        times: &mut PhaseTimes,
    ) -> Result<(), GenerateError> {
        const GRAPH: &str = "dit";
        let d = self.dims;
        let run_error = run_error(GRAPH);
        let buf = &self.buffers;
        let f = d.frames_per_block;
        let x_shape = [1i64, d.channels as i64, f as i64, d.h as i64, d.w as i64];
        let timestep = vec![level.timestep; f];
        let offset = [frame_offset];
        // The cache's rows the graph takes: `past`, and in place the block's own after them,
        // which the graph writes.
        let in_place = self.dit_names.interface == KvInterface::InPlace;
        let taken = past.start..past.end + if in_place { d.block_tokens() } else { 0 };
        let taken_shape = [1i64, taken.len() as i64, d.dim as i64];
        let taken_elems = taken.start * d.dim..taken.end * d.dim;

        let mut inputs: Vec<(Cow<'_, str>, SessionInputValue<'_>)> =
            Vec::with_capacity(4 + 2 * self.kv.keys.len());
        inputs.push((
            "x".into(),
            TensorRef::from_array_view((x_shape, buf.x.as_slice()))
                .map_err(run_error)?
                .into(),
        ));
        inputs.push((
            "timestep".into(),
            TensorRef::from_array_view(([1i64, f as i64], timestep.as_slice()))
                .map_err(run_error)?
                .into(),
        ));
        if buf.context_kv.is_empty() {
            inputs.push((
                "context".into(),
                TensorRef::from_array_view((
                    [1i64, d.text_len as i64, d.text_dim as i64],
                    buf.context.as_slice(),
                ))
                .map_err(run_error)?
                .into(),
            ));
        }
        let kv_shape = [1i64, d.text_len as i64, d.dim as i64];
        for (names, bufs) in buf.context_names.iter().zip(&buf.context_kv) {
            for (name, data) in names.iter().zip(bufs) {
                inputs.push((
                    Cow::Borrowed(name.as_str()),
                    TensorRef::from_array_view((kv_shape, data.as_slice()))
                        .map_err(run_error)?
                        .into(),
                ));
            }
        }
        inputs.push((
            "frame_offset".into(),
            TensorRef::from_array_view(([1i64], &offset[..]))
                .map_err(run_error)?
                .into(),
        ));
        let caches = self.kv.keys.iter_mut().zip(self.kv.values.iter_mut());
        for ((keys, values), names) in caches.zip(&self.dit_names.inputs) {
            for (cache, name) in [(keys, &names[0]), (values, &names[1])] {
                let cache = &mut cache[taken_elems.clone()];
                // In place the graph writes the block's rows: a mutable view of the cache.
                let value = if in_place {
                    TensorRefMut::from_array_view_mut((taken_shape, cache))
                        .map_err(run_error)?
                        .into()
                } else {
                    TensorRef::from_array_view((taken_shape, &*cache))
                        .map_err(run_error)?
                        .into()
                };
                inputs.push((Cow::Borrowed(name.as_str()), value));
            }
        }

        let run_start = Instant::now();
        let outputs = self.sessions.dit.run(inputs).map_err(run_error)?;
        times.session_run += run_start.elapsed();

        copy_output(&outputs, GRAPH, "flow", &mut self.buffers.flow)?;
        if clean_cache_pass {
            let new = self.kv.len * d.dim..(self.kv.len + d.block_tokens()) * d.dim;
            let caches = self.kv.keys.iter_mut().zip(self.kv.values.iter_mut());
            for ((keys, values), names) in caches.zip(&self.dit_names.outputs) {
                copy_output(&outputs, GRAPH, &names[0], &mut keys[new.clone()])?;
                copy_output(&outputs, GRAPH, &names[1], &mut values[new.clone()])?;
            }
        }
        Ok(())
    }

    /// Decodes the latents one latent frame at a time, passing the causal cache along.
    fn decode(&mut self, times: &mut PhaseTimes) -> Result<(), GenerateError> {
        let d = self.dims;
        let frame_px = d.height * d.width;
        let video_frames = d.video_frames();
        let latent_plane = d.h * d.w;
        let mean = &self.bundle.manifest.latent.mean;
        let std = &self.bundle.manifest.latent.std;
        let mut next_frame = 0;
        for t in 0..d.latent_frames {
            let graph: &'static str = if t == 0 { "vae_first" } else { "vae_step" };
            let run_error = run_error(graph);
            let buf = &mut self.buffers;
            for c in 0..d.channels {
                let src = &buf.latents[(c * d.latent_frames + t) * latent_plane..][..latent_plane];
                let dst = &mut buf.z[c * latent_plane..][..latent_plane];
                for (z, &l) in dst.iter_mut().zip(src) {
                    *z = l * std[c] + mean[c];
                }
            }
            let z_shape = [1i64, d.channels as i64, 1, d.h as i64, d.w as i64];
            let mut inputs: Vec<(Cow<'_, str>, SessionInputValue<'_>)> = vec![(
                "z".into(),
                TensorRef::from_array_view((z_shape, buf.z.as_slice()))
                    .map_err(run_error)?
                    .into(),
            )];
            let session: &mut Session = if t == 0 {
                &mut self.sessions.vae_first
            } else {
                let cache = &self.vae_cache;
                for (name, value) in cache.names_in.iter().zip(&cache.values) {
                    let value = value.as_ref().ok_or_else(|| GenerateError::Output {
                        graph: if t == 1 { "vae_first" } else { "vae_step" },
                        name: name.replace("cache_in", "cache_out"),
                        problem: "missing".into(),
                    })?;
                    inputs.push((Cow::Borrowed(name.as_str()), value.into()));
                }
                &mut self.sessions.vae_step
            };
            let run_start = Instant::now();
            let mut outputs = session.run(inputs).map_err(run_error)?;
            times.session_run += run_start.elapsed();

            let (shape, frames) = extract_f32(&outputs, graph, "frames")?;
            let n = if t == 0 { 1 } else { d.frames_per_step };
            let expected = [1, 3, n as i64, d.height as i64, d.width as i64];
            if shape != expected {
                return Err(GenerateError::Output {
                    graph,
                    name: "frames".into(),
                    problem: format!("with shape {shape:?}, expected {expected:?}"),
                });
            }
            for c in 0..3 {
                let src = &frames[c * n * frame_px..][..n * frame_px];
                self.buffers.video[(c * video_frames + next_frame) * frame_px..][..n * frame_px]
                    .copy_from_slice(src);
            }
            next_frame += n;
            let cache = &mut self.vae_cache;
            for (name, slot) in cache.names_out.iter().zip(cache.values.iter_mut()) {
                let value = outputs
                    .remove(name.as_str())
                    .ok_or_else(|| GenerateError::Output {
                        graph,
                        name: name.clone(),
                        problem: "missing".into(),
                    })?;
                *slot = Some(value);
            }
        }
        Ok(())
    }

    /// Clamp to [-1, 1], map to uint8 and lay out as frames × height × width × RGB.
    fn layout(&self) -> Vec<u8> {
        let d = &self.dims;
        let frames = d.video_frames();
        let frame_px = d.height * d.width;
        let video = &self.buffers.video;
        let mut out = vec![0u8; frames * frame_px * 3];
        for (f, frame_out) in out.chunks_exact_mut(frame_px * 3).enumerate() {
            for c in 0..3 {
                let plane = &video[(c * frames + f) * frame_px..][..frame_px];
                for (pixel, &value) in frame_out.chunks_exact_mut(3).zip(plane) {
                    pixel[c] = to_u8(value);
                }
            }
        }
        out
    }
}

/// `round((clamp(x, -1, 1) + 1) * 127.5)` in float32, rounding half away from zero as the
/// exporter's reference does (the only exact tie in range is x = 0, which gives 128 either way).
fn to_u8(x: f32) -> u8 {
    ((x.clamp(-1.0, 1.0) + 1.0) * 127.5).round() as u8
}

/// `x = (1 - sigma) * x0 + sigma * noise`.
fn renoise(x: &mut [f32], x0: &[f32], noise: &[f32], sigma: f32) {
    for ((x, &x0), &n) in x.iter_mut().zip(x0).zip(noise) {
        *x = (1.0 - sigma) * x0 + sigma * n;
    }
}

/// Noise of one draw; large buffers are split over threads (noise is a pure function of the
/// element index, so the split does not change a bit).
fn fill_noise(seed: u64, prompt: u32, draw: u32, out: &mut [f32]) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    if out.len() <= CHUNK {
        fill_normal(seed, prompt, draw, out);
        return;
    }
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(i, chunk)| {
            super::noise::fill_normal_at(seed, prompt, draw, i * CHUNK, chunk);
        });
}

/// Maps an ONNX Runtime error of running `graph` to [`GenerateError::Run`].
pub(super) fn run_error(graph: &'static str) -> impl Fn(ort::Error) -> GenerateError + Copy {
    move |e| GenerateError::Run {
        graph,
        message: e.to_string(),
    }
}

fn extract_f32<'o>(
    outputs: &'o SessionOutputs<'_>,
    graph: &'static str,
    name: &str,
) -> Result<(&'o [i64], &'o [f32]), GenerateError> {
    let output_error = |problem: String| GenerateError::Output {
        graph,
        name: name.to_string(),
        problem,
    };
    let value = outputs
        .get(name)
        .ok_or_else(|| output_error("missing".into()))?;
    let (shape, data) = value
        .try_extract_tensor::<f32>()
        .map_err(|e| output_error(format!("not a float32 tensor ({e})")))?;
    Ok((&shape[..], data))
}

fn copy_output(
    outputs: &SessionOutputs<'_>,
    graph: &'static str,
    name: &str,
    dst: &mut [f32],
) -> Result<(), GenerateError> {
    let (_, data) = extract_f32(outputs, graph, name)?;
    if data.len() != dst.len() {
        return Err(GenerateError::Output {
            graph,
            name: name.to_string(),
            problem: format!("with {} elements, expected {}", data.len(), dst.len()),
        });
    }
    dst.copy_from_slice(data);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uint8_mapping_clamps_and_rounds() {
        let cases = [(-2.0, 0), (-1.0, 0), (1.0, 255), (3.0, 255), (0.0, 128)];
        for (x, expected) in cases {
            assert_eq!(to_u8(x), expected, "{x}");
        }
    }

    #[test]
    fn parallel_noise_equals_serial_noise() {
        let mut serial = vec![0.0f32; (1 << 16) * 3 + 5];
        let mut parallel = serial.clone();
        fill_normal(3, 1, 2, &mut serial);
        fill_noise(3, 1, 2, &mut parallel);
        assert_eq!(serial, parallel);
    }
}

//! `runner worker`: the hidden subcommand a run's warmup and measurement processes execute. It
//! generates the given prompts of a prompt file with one set of sessions and writes a JSON line
//! of phase times per prompt; tests and benchmarks also use it directly.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::engine::{
    ArenaExtend, AttentionKernel, Bundle, ConvAlgoSearch, CudaOptions, Emit, ExportSettings,
    FusedKernels, GenerateError, GenerateOptions, Generated, Generator, MethodSettings, Precision,
    Provider, RuntimeOptions, SessionError, SvdRank, TensorRtOptions,
};
use crate::exit;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProviderArg {
    Cpu,
    Cuda,
    Tensorrt,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmitArg {
    /// The clean-cache pass's x0 prediction.
    #[value(name = "cache_pass", alias = "cache-pass")]
    CachePass,
    /// The last denoising step's x0.
    Denoised,
}

/// Generate prompts with one set of ONNX Runtime sessions (started by `runner apply`).
// The doc comments are the flags' help text, where `<index>` is a placeholder, not HTML.
#[allow(rustdoc::invalid_html_tags)]
#[derive(Debug, Args)]
#[command(
    after_help = "Prompt indices are global: prompt i gets the same noise whatever other prompts are generated with it.\nFiles written with --save-latents / --save-frames are raw little-endian arrays:\n  latents_<index>.f32   [1, channels, latent_frames, h, w] float32\n  frames_<index>.u8     [frames, height, width, 3] uint8 RGB"
)]
pub struct WorkerArgs {
    /// Run the process spec that `runner apply` wrote (every other flag is then ignored).
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,
    /// Asset bundle: a directory with bundle.toml, or a .zip of one.
    #[arg(long, value_name = "PATH", required_unless_present = "spec")]
    pub bundle: Option<PathBuf>,
    /// Prompt file, one prompt per line.
    #[arg(long, value_name = "FILE", required_unless_present = "spec")]
    pub prompts: Option<PathBuf>,
    /// Prompts to generate: a sorted comma list of indices and ranges, e.g. 0,3,5-7.
    #[arg(long, value_name = "LIST", required_unless_present = "spec")]
    pub indices: Option<String>,
    /// Noise seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Noise level of the clean-cache pass (default 0.02).
    #[arg(long, value_name = "SIGMA")]
    pub clean_sigma_override: Option<f32>,
    /// Denoising steps on the 1000-step scale, highest first (default 1000,750,500,250).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub denoising_steps: Option<Vec<u32>>,
    /// Warp the denoising steps with the timestep shift (default true).
    #[arg(long, value_name = "BOOL")]
    pub warp_denoising_steps: Option<bool>,
    /// Timestep shift of the warped schedule (default 5.0).
    #[arg(long, value_name = "SHIFT")]
    pub timestep_shift: Option<f64>,
    /// Which prediction becomes a block's output (default cache_pass).
    #[arg(long, value_enum)]
    pub emit: Option<EmitArg>,
    /// Latent frames of past keys and values a block attends to; -1 = all (default).
    #[arg(long, value_name = "FRAMES", allow_negative_numbers = true)]
    pub attention_window: Option<i64>,
    /// End the timed region after the VAE output, before the uint8 layout.
    #[arg(long)]
    pub exclude_final_output_layout: bool,
    /// Stop after the DiT: no VAE decode, no frames (the timed region ends with the latents).
    #[arg(long)]
    pub latents_only: bool,
    /// Append one JSON line of phase times per prompt to this file.
    #[arg(long, value_name = "FILE")]
    pub timings: Option<PathBuf>,
    /// Write each prompt's final latents to DIR/latents_<index>.f32.
    #[arg(long, value_name = "DIR")]
    pub save_latents: Option<PathBuf>,
    /// Write each prompt's uint8 frames to DIR/frames_<index>.u8.
    #[arg(long, value_name = "DIR")]
    pub save_frames: Option<PathBuf>,
    /// Execution provider.
    #[arg(long, value_enum, default_value_t = ProviderArg::Cpu)]
    pub provider: ProviderArg,
    /// GPU of the CUDA or TensorRT provider.
    #[arg(long, default_value_t = 0)]
    pub device_id: i32,
    /// TensorRT: build fp16 engines.
    #[arg(long)]
    pub trt_fp16: bool,
    /// TensorRT engine cache folder.
    #[arg(long, value_name = "DIR")]
    pub trt_engine_cache: Option<PathBuf>,
    /// TensorRT timing cache folder.
    #[arg(long, value_name = "DIR")]
    pub trt_timing_cache: Option<PathBuf>,
    /// CUDA: NHWC convolutions in the text encoder and DiT sessions too (the decoder's sessions
    /// always use them).
    #[arg(long)]
    pub prefer_nhwc: bool,
    /// CUDA: capture the DiT's passes as CUDA graphs, one per block shape, and replay them
    /// (ONNX Runtime's `enable_cuda_graph`, in the DiT's session). The first prompt of the process
    /// captures them (one capture per block, the decoder waiting out each); later prompts replay
    /// them.
    #[arg(long)]
    pub cuda_graphs: bool,
    /// CUDA: kernel for the attention op (auto, flash, fa2, cudnn_flash, efficient, math).
    #[arg(long, value_name = "NAME", default_value = "auto", value_parser = parse_attention)]
    pub attention_backend: AttentionKernel,
    /// CUDA: cuDNN convolution algorithm search (exhaustive, heuristic, default).
    #[arg(long, value_name = "MODE", default_value = "exhaustive", value_parser = parse_conv_search)]
    pub conv_algo_search: ConvAlgoSearch,
    /// Kernels for the DiT's elementwise work: auto, unstep (the runner's fused kernels on the
    /// bundle's `dit_fused` graph), onnxruntime (stock kernels on `dit`).
    #[arg(long, value_name = "NAME", default_value = "auto", value_parser = parse_fused_kernels)]
    pub dit_kernels: FusedKernels,
    /// Kernels for the VAE decoder's norms and SiLU: auto, unstep (the runner's fused kernels on
    /// the bundle's `vae_first_fused` / `vae_step_fused`), onnxruntime.
    #[arg(long, value_name = "NAME", default_value = "auto", value_parser = parse_fused_kernels)]
    pub vae_kernels: FusedKernels,
    /// Run the device loop (IoBinding, scheduler arithmetic as graphs) on the CPU provider too;
    /// GPU providers always use it.
    #[arg(long)]
    pub io_binding: bool,
    /// Device loop: decode the VAE after the DiT instead of beside it (block b while the DiT
    /// generates block b + 1).
    #[arg(long)]
    pub no_overlap_vae: bool,
    /// CUDA: how the memory arena grows (same_as_requested, next_power_of_two), like
    /// `runtime.cuda_arena`.
    #[arg(long, value_name = "MODE", default_value = "same_as_requested", value_parser = parse_arena)]
    pub cuda_arena: ArenaExtend,
    /// CUDA: cap cuDNN's convolution workspace at 32 MiB (cudnn_conv_use_max_workspace = 0).
    #[arg(long)]
    pub conv_workspace_cap: bool,
    /// Benchmark: generate the first prompt this many times unrecorded before one measured round
    /// (instead of a whole warmup round).
    #[arg(long, value_name = "N")]
    pub warmup: Option<usize>,
    /// Intra-op threads per session (default: one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// libonnxruntime to load (default: ORT_DYLIB_PATH, the onnxruntime Python package,
    /// then $UNSTEP_ORT_CACHE_DIR).
    #[arg(long, value_name = "FILE")]
    pub ort_library: Option<PathBuf>,
    /// Write each graph's optimised model to this folder.
    #[arg(long, value_name = "DIR")]
    pub optimized_model_dir: Option<PathBuf>,
    /// Where a .zip bundle is unpacked (default: a temporary folder removed at exit).
    #[arg(long, value_name = "DIR")]
    pub unpack_dir: Option<PathBuf>,
    /// Refuse a bundle not exported with this many latent frames per block.
    #[arg(long, value_name = "N")]
    pub frames_per_block: Option<usize>,
    /// Refuse a bundle not exported with this many latent frames.
    #[arg(long, value_name = "N")]
    pub latent_frames: Option<usize>,
    /// Refuse a bundle not exported at this pixel height.
    #[arg(long, value_name = "PX")]
    pub height: Option<usize>,
    /// Refuse a bundle not exported at this pixel width.
    #[arg(long, value_name = "PX")]
    pub width: Option<usize>,
    /// Refuse a bundle not exported at this precision (fp32, fp16, bf16).
    #[arg(long, value_name = "DTYPE")]
    pub precision: Option<Precision>,
    /// Refuse a bundle not exported with this SVD rank ("none" or an integer).
    #[arg(long, value_name = "RANK")]
    pub svd_rank: Option<SvdRank>,
    /// Benchmark: generate the prompts once to warm up, then again measured, and print seconds
    /// per video and the share of the timed region spent outside ONNX Runtime's `run`.
    #[arg(long)]
    pub bench: bool,
}

#[derive(Debug, thiserror::Error)]
enum WorkerError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Io(String),
    #[error(transparent)]
    Generate(#[from] GenerateError),
}

impl WorkerError {
    fn exit_code(&self) -> i32 {
        match self {
            WorkerError::Usage(_) => exit::USAGE,
            WorkerError::Io(_) => exit::INTERNAL,
            // A bundle that fails its checks is the user's input to fix; ONNX Runtime or graph
            // failures are failures of the run.
            WorkerError::Generate(GenerateError::Bundle(_))
            | WorkerError::Generate(GenerateError::Session(SessionError::Bundle(_)))
            | WorkerError::Generate(GenerateError::Schedule(_)) => exit::USAGE,
            WorkerError::Generate(_) => exit::FAILURE,
        }
    }
}

/// Runs the worker and returns the process exit status.
pub fn run(args: WorkerArgs) -> i32 {
    if let Some(spec) = &args.spec {
        let result = crate::execute::spec::ProcessSpec::read(spec)
            .and_then(|spec| crate::execute::spec::run(&spec));
        return match result {
            Ok(()) => exit::OK,
            Err(error) => {
                eprintln!("error: failed to generate: {error}");
                exit::FAILURE
            }
        };
    }
    let temp_unpack = args
        .unpack_dir
        .is_none()
        .then(|| std::env::temp_dir().join(format!("unstep-worker-{}", std::process::id())));
    let result = run_inner(&args, temp_unpack.as_deref());
    if let Some(dir) = &temp_unpack {
        let _ = std::fs::remove_dir_all(dir);
    }
    match result {
        Ok(()) => exit::OK,
        Err(error) => {
            eprintln!("error: failed to generate: {error}");
            error.exit_code()
        }
    }
}

fn run_inner(args: &WorkerArgs, temp_unpack: Option<&Path>) -> Result<(), WorkerError> {
    let prompts = read_prompts(args.prompts.as_deref().expect("clap requires --prompts"))?;
    let indices = parse_indices(args.indices.as_deref().unwrap_or_default(), prompts.len())
        .map_err(WorkerError::Usage)?;
    let options = generate_options(args);
    if args.cuda_graphs && args.provider != ProviderArg::Cuda {
        return Err(WorkerError::Usage(
            "--cuda-graphs needs --provider cuda (ONNX Runtime's CUDA provider captures the \
             graphs); leave the flag out on this provider"
                .into(),
        ));
    }
    let runtime = runtime_options(args);
    let export = ExportSettings {
        frames_per_block: args.frames_per_block,
        latent_frames: args.latent_frames,
        height: args.height,
        width: args.width,
        precision: args.precision,
        svd_rank: args.svd_rank,
    };
    let unpack_dir = args
        .unpack_dir
        .as_deref()
        .or(temp_unpack)
        .unwrap_or(Path::new("."));
    // Schedule errors are reported before the (slow) session build.
    crate::engine::Schedule::new(&options.method).map_err(GenerateError::from)?;
    // Every prompt's context first, with the text encoder alone on the device; then the DiT
    // and the decoder (docs/generation.md).
    let bundle = Bundle::open_for(
        args.bundle.as_deref().expect("clap requires --bundle"),
        unpack_dir,
        &export,
    )
    .map_err(GenerateError::from)?;
    let mut generator = Generator::with_prompts(
        bundle,
        &runtime,
        indices.iter().map(|&i| prompts[i as usize].as_str()),
    )?;
    if let Ok(ort) = crate::engine::ort_lib::runtime(runtime.ort_library.as_deref()) {
        eprintln!(
            "worker: onnx runtime {} from {} ({}), provider {}, attention {}, DiT kernels {}, VAE kernels {}, {} loop{}",
            ort.version,
            ort.location.path.display(),
            ort.location.source,
            runtime.provider.name(),
            attention_name(&runtime.provider, &generator),
            generator.dit_kernels().name(),
            generator.vae_kernels().name(),
            if generator.uses_device_loop() {
                "device (io binding)"
            } else {
                "host"
            },
            if runtime.cuda_graphs() {
                ", DiT as CUDA graphs"
            } else {
                ""
            }
        );
    }

    for dir in [&args.save_latents, &args.save_frames]
        .into_iter()
        .flatten()
    {
        std::fs::create_dir_all(dir)
            .map_err(|e| WorkerError::Io(format!("create {}: {e}", dir.display())))?;
    }
    let mut timings = match &args.timings {
        Some(path) => Some(BufWriter::new(
            File::options()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| WorkerError::Io(format!("open {}: {e}", path.display())))?,
        )),
        None => None,
    };

    if let (Some(n), Some(&first)) = (args.warmup, indices.first()) {
        for _ in 0..n {
            generator.generate(first, &prompts[first as usize], &options)?;
        }
    }
    let rounds = if args.bench && args.warmup.is_none() {
        2
    } else {
        1
    };
    let mut measured: Vec<Generated> = Vec::new();
    for round in 0..rounds {
        for &index in &indices {
            let generated = generator.generate(index, &prompts[index as usize], &options)?;
            if round + 1 < rounds {
                continue;
            }
            if let Some(out) = timings.as_mut() {
                let line = timing_record(&generated, runtime.provider.name());
                writeln!(out, "{line}")
                    .and_then(|_| out.flush())
                    .map_err(|e| WorkerError::Io(format!("write timings: {e}")))?;
            }
            save_outputs(args, &generated)?;
            if args.bench {
                measured.push(generated);
            }
        }
    }
    if args.bench {
        print_bench(&measured);
    }
    Ok(())
}

fn read_prompts(path: &Path) -> Result<Vec<String>, WorkerError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| WorkerError::Usage(format!("read prompt file {}: {e}", path.display())))?;
    Ok(text.lines().map(str::to_string).collect())
}

/// Parses `0,3,5-7`: sorted, without duplicates, every index inside the prompt file.
pub fn parse_indices(list: &str, prompt_count: usize) -> Result<Vec<u32>, String> {
    let mut indices: Vec<u32> = Vec::new();
    for part in list.split(',').map(str::trim) {
        let number = |s: &str| {
            s.trim().parse::<u32>().map_err(|_| {
                format!("prompt index `{s}` in `{list}` is not a non-negative integer")
            })
        };
        let (start, end) = match part.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => (number(part)?, number(part)?),
        };
        if end < start {
            return Err(format!(
                "prompt range `{part}` runs backwards; write it as {end}-{start}"
            ));
        }
        for index in start..=end {
            if let Some(&last) = indices.last()
                && index <= last
            {
                return Err(format!(
                    "prompt indices `{list}` must be sorted and without duplicates (at {index})"
                ));
            }
            if index as usize >= prompt_count {
                return Err(format!(
                    "prompt index {index} is beyond the prompt file's {prompt_count} prompts"
                ));
            }
            indices.push(index);
        }
    }
    Ok(indices)
}

fn generate_options(args: &WorkerArgs) -> GenerateOptions {
    let defaults = MethodSettings::default();
    GenerateOptions {
        method: MethodSettings {
            clean_sigma: args.clean_sigma_override.unwrap_or(defaults.clean_sigma),
            denoising_steps: args
                .denoising_steps
                .clone()
                .unwrap_or(defaults.denoising_steps),
            warp_denoising_steps: args
                .warp_denoising_steps
                .unwrap_or(defaults.warp_denoising_steps),
            timestep_shift: args.timestep_shift.unwrap_or(defaults.timestep_shift),
            emit: match args.emit {
                Some(EmitArg::Denoised) => Emit::Denoised,
                Some(EmitArg::CachePass) | None => Emit::CachePass,
            },
            attention_window: args.attention_window.unwrap_or(defaults.attention_window),
            seed: args.seed,
        },
        exclude_final_output_layout: args.exclude_final_output_layout,
        latents_only: args.latents_only,
    }
}

fn runtime_options(args: &WorkerArgs) -> RuntimeOptions {
    let provider = match args.provider {
        ProviderArg::Cpu => Provider::Cpu,
        ProviderArg::Cuda => Provider::Cuda(CudaOptions {
            device_id: args.device_id,
            cuda_graphs: args.cuda_graphs,
            prefer_nhwc: args.prefer_nhwc,
            attention: args.attention_backend,
            conv_algo_search: args.conv_algo_search,
            arena_extend: args.cuda_arena,
            conv_max_workspace: !args.conv_workspace_cap,
            ..CudaOptions::default()
        }),
        ProviderArg::Tensorrt => Provider::TensorRt(TensorRtOptions {
            device_id: args.device_id,
            fp16: args.trt_fp16,
            engine_cache_dir: args.trt_engine_cache.clone(),
            timing_cache_dir: args.trt_timing_cache.clone(),
        }),
    };
    RuntimeOptions {
        ort_library: args.ort_library.clone(),
        provider,
        intra_op_threads: args.threads,
        optimized_model_dir: args.optimized_model_dir.clone(),
        io_binding: args.io_binding,
        overlap_vae: !args.no_overlap_vae,
        dit_kernels: args.dit_kernels,
        vae_kernels: args.vae_kernels,
    }
}

fn parse_arena(name: &str) -> Result<ArenaExtend, String> {
    match name {
        "same_as_requested" => Ok(ArenaExtend::SameAsRequested),
        "next_power_of_two" => Ok(ArenaExtend::NextPowerOfTwo),
        _ => Err(format!(
            "unknown arena growth {name:?}; use same_as_requested or next_power_of_two"
        )),
    }
}

fn parse_attention(name: &str) -> Result<AttentionKernel, String> {
    AttentionKernel::parse(name).ok_or_else(|| {
        let names: Vec<&str> = AttentionKernel::ALL.iter().map(|k| k.name()).collect();
        format!(
            "unknown attention backend `{name}`; one of {}",
            names.join(", ")
        )
    })
}

fn parse_fused_kernels(name: &str) -> Result<FusedKernels, String> {
    FusedKernels::parse(name).ok_or_else(|| {
        let names: Vec<&str> = FusedKernels::ALL.iter().map(|k| k.name()).collect();
        format!("unknown kernels `{name}`; one of {}", names.join(", "))
    })
}

fn parse_conv_search(name: &str) -> Result<ConvAlgoSearch, String> {
    match name {
        "exhaustive" => Ok(ConvAlgoSearch::Exhaustive),
        "heuristic" => Ok(ConvAlgoSearch::Heuristic),
        "default" => Ok(ConvAlgoSearch::Default),
        _ => Err(format!(
            "unknown cuDNN search `{name}`; one of exhaustive, heuristic, default"
        )),
    }
}

/// The attention kernel a generator's provider was configured with, as results record it; with a
/// fused DiT whose self-attention is the runner's own call of cuDNN (exporter 0.10.0 and later),
/// also that.
pub fn attention_name(provider: &Provider, generator: &crate::engine::Generator) -> String {
    let manifest = &generator.bundle().manifest;
    let name = provider_attention_name(provider, manifest.precision);
    let runner = matches!(provider, Provider::Cuda(_))
        && generator.dit_kernels() == crate::engine::FusedKernels::Unstep
        && manifest.fused_dit_has_runner_attention();
    if runner {
        format!("{name}, self-attention the runner's own cuDNN call")
    } else {
        name
    }
}

/// The attention kernel a provider was configured with.
fn provider_attention_name(provider: &Provider, precision: Precision) -> String {
    match provider {
        Provider::Cpu => "math (cpu)".into(),
        Provider::Cuda(c) => match (c.attention, c.attention.resolve(precision)) {
            (AttentionKernel::Auto, AttentionKernel::Auto) => {
                "auto (onnxruntime's default order)".into()
            }
            (AttentionKernel::Auto, kernel) => format!("{} (auto)", kernel.name()),
            (asked, _) => asked.name().into(),
        },
        Provider::TensorRt(_) => "tensorrt's own".into(),
    }
}

fn timing_record(generated: &Generated, provider: &str) -> serde_json::Value {
    let t = &generated.times;
    serde_json::json!({
        "prompt_index": generated.prompt_index,
        "text_encoding_s": t.text_encoding.as_secs_f64(),
        "dit_s": t.dit.as_secs_f64(),
        "vae_s": t.vae.as_secs_f64(),
        "layout_s": t.layout.as_secs_f64(),
        "timed_total_s": t.timed_total.as_secs_f64(),
        "session_run_s": t.session_run.as_secs_f64(),
        "timed_region_end": generated.timed_region_end.as_str(),
        "provider": provider,
        "peak_device_memory_bytes": generated.peak_device_memory,
    })
}

fn save_outputs(args: &WorkerArgs, generated: &Generated) -> Result<(), WorkerError> {
    let write = |path: PathBuf, bytes: &[u8]| {
        std::fs::write(&path, bytes)
            .map_err(|e| WorkerError::Io(format!("write {}: {e}", path.display())))
    };
    let index = generated.prompt_index;
    if let Some(dir) = &args.save_latents {
        let bytes: Vec<u8> = generated
            .latents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        write(dir.join(format!("latents_{index}.f32")), &bytes)?;
    }
    if let Some(dir) = args
        .save_frames
        .as_ref()
        .filter(|_| !generated.frames.is_empty())
    {
        write(dir.join(format!("frames_{index}.u8")), &generated.frames)?;
    }
    Ok(())
}

fn print_bench(measured: &[Generated]) {
    if measured.is_empty() {
        return;
    }
    let n = measured.len() as f64;
    let mean = |f: fn(&Generated) -> Duration| {
        measured.iter().map(|g| f(g).as_secs_f64()).sum::<f64>() / n
    };
    let total = mean(|g| g.times.timed_total);
    let run = mean(|g| g.times.session_run);
    let peak = measured.iter().filter_map(|g| g.peak_device_memory).max();
    println!(
        "bench: {} videos, {:.4} s per video (timed region; dit {:.4} s, vae {:.4} s, layout {:.4} s), session.run {:.4} s, outside session.run {:.2}%, peak device memory {}",
        measured.len(),
        total,
        mean(|g| g.times.dit),
        mean(|g| g.times.vae),
        mean(|g| g.times.layout),
        run,
        100.0 * (total - run).max(0.0) / total,
        peak.map_or("n/a".to_string(), |b| format!(
            "{:.2} GiB",
            b as f64 / (1u64 << 30) as f64
        )),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::BundleError;

    #[test]
    fn indices_parse_lists_and_ranges() {
        let ok = [
            ("0", vec![0]),
            ("0,3,5-7", vec![0, 3, 5, 6, 7]),
            ("2-2", vec![2]),
            (" 1 , 4", vec![1, 4]),
        ];
        for (list, expected) in ok {
            assert_eq!(parse_indices(list, 10).unwrap(), expected, "{list}");
        }
    }

    #[test]
    fn bad_index_lists_are_refused() {
        let bad = [
            ("3,1", "sorted"),
            ("1,1", "sorted"),
            ("5-3", "backwards"),
            ("10", "beyond"),
            ("a", "integer"),
            ("", "integer"),
        ];
        for (list, fragment) in bad {
            let error = parse_indices(list, 10).unwrap_err();
            assert!(error.contains(fragment), "{list}: {error}");
        }
    }

    #[test]
    fn bundle_errors_are_usage_errors() {
        let error = WorkerError::Generate(GenerateError::Bundle(BundleError::Format { found: 9 }));
        assert_eq!(error.exit_code(), exit::USAGE);
    }
}

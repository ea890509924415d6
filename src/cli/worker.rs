//! `runner worker`: the hidden subcommand a run's warmup and measurement processes execute
//! (`--spec`, the job `runner apply` wrote), and a front for benchmarks and tests whose flags build
//! the same job ([`crate::execute::job::JobSpec`]) and run it through the same worker code, which
//! writes the same timing records.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::engine::{
    ArenaExtend, ConvAlgoSearch, ExportSettings, FusedKernels, MethodSettings, Provider,
    ProviderKind, RuntimeOptions,
};
use crate::execute::config::engine_options;
use crate::execute::job::{BenchOptions, JobLabel, JobSpec, PromptSpec};
use crate::execute::worker::{self, WorkerError};
use crate::exit;
use crate::manifest::{Runtime, VideoNaming};
use crate::results::records::ProcessRole;
use crate::vocab::{Method, MethodFlags};

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
    // The method settings, each over its default; the export settings given are checked
    // against the bundle's.
    #[command(flatten)]
    pub method: MethodFlags,
    /// End the timed region after the VAE output, before the uint8 layout.
    #[arg(long)]
    pub exclude_final_output_layout: bool,
    /// Stop after the DiT: no VAE decode, no frames (the timed region ends with the latents).
    #[arg(long)]
    pub latents_only: bool,
    /// Append one timing record per prompt to this file (the JSON lines of a run's timings).
    #[arg(long, value_name = "FILE")]
    pub timings: Option<PathBuf>,
    /// Write each prompt's final latents to DIR/latents_<index>.f32.
    #[arg(long, value_name = "DIR")]
    pub save_latents: Option<PathBuf>,
    /// Write each prompt's uint8 frames to DIR/frames_<index>.u8.
    #[arg(long, value_name = "DIR")]
    pub save_frames: Option<PathBuf>,
    /// Execution provider.
    #[arg(long, value_enum, default_value_t = ProviderKind::Cpu)]
    pub provider: ProviderKind,
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
    /// `runtime.cuda_graphs`: capture the DiT's passes as CUDA graphs and replay them (CUDA).
    #[arg(long)]
    pub cuda_graphs: bool,
    /// `runtime.cudnn_conv_algo_search` (default: as in a manifest).
    #[arg(long, value_name = "MODE", value_enum)]
    pub conv_algo_search: Option<ConvAlgoSearch>,
    /// `runtime.dit_kernels` (default: as in a manifest).
    #[arg(long, value_name = "NAME", value_enum)]
    pub dit_kernels: Option<FusedKernels>,
    /// `runtime.vae_kernels` (default: as in a manifest).
    #[arg(long, value_name = "NAME", value_enum)]
    pub vae_kernels: Option<FusedKernels>,
    /// Decode the VAE after the DiT instead of beside it (block b while the DiT generates
    /// block b + 1).
    #[arg(long)]
    pub no_overlap_vae: bool,
    /// `runtime.cuda_arena` (default: as in a manifest).
    #[arg(long, value_name = "MODE", value_enum)]
    pub cuda_arena: Option<ArenaExtend>,
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
    /// Benchmark: generate the prompts once to warm up, then again measured, and print seconds
    /// per video and the share of the timed region spent outside ONNX Runtime's `run`.
    #[arg(long)]
    pub bench: bool,
}

/// Runs the worker and returns the process exit status.
pub fn run(args: WorkerArgs) -> i32 {
    if let Some(spec) = &args.spec {
        let result = JobSpec::read(spec)
            .map_err(WorkerError::from)
            .and_then(|job| worker::run(&job));
        return report(result);
    }
    let temp_unpack = args
        .unpack_dir
        .is_none()
        .then(|| std::env::temp_dir().join(format!("unstep-worker-{}", std::process::id())));
    let result = job_from_args(&args, temp_unpack.as_deref()).and_then(|job| worker::run(&job));
    if let Some(dir) = &temp_unpack {
        let _ = std::fs::remove_dir_all(dir);
    }
    report(result)
}

fn report(result: Result<(), WorkerError>) -> i32 {
    match result {
        Ok(()) => exit::OK,
        Err(error) => exit::report(&error),
    }
}

/// The job the flags describe: the prompts of a prompt file, the engine and method settings, and
/// the benchmark options.
fn job_from_args(args: &WorkerArgs, temp_unpack: Option<&Path>) -> Result<JobSpec, WorkerError> {
    if args.cuda_graphs && args.provider != ProviderKind::Cuda {
        return Err(WorkerError::Usage(
            "--cuda-graphs needs --provider cuda (ONNX Runtime's CUDA provider captures the \
             graphs); leave the flag out on this provider"
                .into(),
        ));
    }
    let method = args.method.over(Method::default());
    let path = args.prompts.as_deref().expect("clap requires --prompts");
    let prompts = crate::manifest::inputs::read_prompt_file(path)
        .map_err(|e| WorkerError::Usage(format!("prompt file {} {e}", path.display())))?;
    let list = args.indices.as_deref().unwrap_or_default();
    let indices = prompt_indices(list, prompts.len()).map_err(WorkerError::Usage)?;
    let unpack_dir = args
        .unpack_dir
        .as_deref()
        .or(temp_unpack)
        .unwrap_or(Path::new("."));
    Ok(JobSpec {
        label: JobLabel {
            run: "worker".into(),
            process: 0,
            role: ProcessRole::Measurement,
            shard: None,
            slot: format!("{}{}", args.provider.name(), args.device_id),
        },
        bundle: args.bundle.clone().expect("clap requires --bundle"),
        bundle_sha256: Default::default(),
        bundle_stamps: Default::default(),
        unpack_dir: unpack_dir.to_path_buf(),
        prompts: indices
            .into_iter()
            .map(|index| PromptSpec {
                index,
                text: prompts[index as usize].clone(),
                video: None,
            })
            .collect(),
        contexts_for_later: Vec::new(),
        engine: runtime_options(args, &method),
        method: MethodSettings::of(&method, args.seed),
        export: ExportSettings::asked(&args.method),
        exclude_final_output_layout: args.exclude_final_output_layout,
        video_naming: VideoNaming::Indexed,
        timings: args.timings.clone(),
        run_dir: PathBuf::from("."),
        videos: None,
        latents: args.save_latents.clone(),
        frames: args.save_frames.clone(),
        config_hash: String::new(),
        events: false,
        bench: BenchOptions {
            warmup: args.warmup.unwrap_or(0),
            // `--bench` without `--warmup` warms up with a whole unrecorded round.
            warm_rounds: usize::from(args.bench && args.warmup.is_none()),
            latents_only: args.latents_only,
            summary: args.bench,
        },
    })
}

/// `--indices`: the manifest's index-list syntax, every index inside the prompt file.
fn prompt_indices(list: &str, prompt_count: usize) -> Result<Vec<u32>, String> {
    let indices = match list
        .parse::<crate::manifest::IndexList>()
        .map_err(|e| e.to_string())?
    {
        crate::manifest::IndexList::All => (0..prompt_count as u32).collect(),
        crate::manifest::IndexList::List(indices) => indices,
    };
    match indices.iter().find(|&&i| i as usize >= prompt_count) {
        Some(i) => Err(format!(
            "prompt index {i} is beyond the prompt file's {prompt_count} prompts"
        )),
        None => Ok(indices),
    }
}

/// The session options: the manifest's `[runtime]` table at its defaults with the flags that
/// set its settings ([`execute::config::engine_options`], as `runner apply` resolves a run's),
/// then what a benchmark varies beyond it (the GPU, NHWC, the workspace cap, threads, the VAE's
/// overlap, TensorRT's options, the optimised models' folder).
fn runtime_options(args: &WorkerArgs, method: &Method) -> RuntimeOptions {
    let defaults = Runtime::default();
    let runtime = Runtime {
        provider: args.provider,
        cudnn_conv_algo_search: args
            .conv_algo_search
            .unwrap_or(defaults.cudnn_conv_algo_search),
        cuda_graphs: args.cuda_graphs,
        cuda_arena: args.cuda_arena.unwrap_or(defaults.cuda_arena),
        dit_kernels: args.dit_kernels.unwrap_or(defaults.dit_kernels),
        vae_kernels: args.vae_kernels.unwrap_or(defaults.vae_kernels),
        ..defaults
    };
    let mut engine = engine_options(&runtime, method, args.ort_library.clone());
    engine.intra_op_threads = args.threads;
    engine.optimized_model_dir = args.optimized_model_dir.clone();
    engine.overlap_vae = !args.no_overlap_vae;
    match &mut engine.provider {
        Provider::Cpu => {}
        Provider::Cuda(cuda) => {
            cuda.device_id = args.device_id;
            cuda.prefer_nhwc = args.prefer_nhwc;
            cuda.conv_max_workspace = !args.conv_workspace_cap;
        }
        Provider::TensorRt(trt) => {
            trt.device_id = args.device_id;
            trt.fp16 = args.trt_fp16;
            trt.engine_cache_dir = args.trt_engine_cache.clone();
            trt.timing_cache_dir = args.trt_timing_cache.clone();
        }
    }
    engine
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the flags a benchmark varies, the worker's session options are a manifest's
    /// at its defaults: the flags are a layer over the `[runtime]` table, not a second default.
    #[test]
    fn the_workers_session_options_default_to_a_manifests() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: WorkerArgs,
        }
        let parse = |extra: &[&str]| {
            let base = [
                "worker",
                "--bundle",
                "b",
                "--prompts",
                "p",
                "--indices",
                "0",
            ];
            <Cli as clap::Parser>::try_parse_from(base.iter().chain(extra))
                .unwrap()
                .args
        };
        let method = Method::default();
        for provider in [ProviderKind::Cuda, ProviderKind::Cpu] {
            let worker = runtime_options(&parse(&["--provider", provider.name()]), &method);
            let runtime = Runtime {
                provider,
                ..Runtime::default()
            };
            let manifest = engine_options(&runtime, &method, None);
            assert_eq!(worker.provider, manifest.provider, "{provider:?}");
            assert_eq!(
                (worker.dit_kernels, worker.vae_kernels, worker.overlap_vae),
                (
                    manifest.dit_kernels,
                    manifest.vae_kernels,
                    manifest.overlap_vae
                )
            );
        }
        // A flag replaces its setting's default.
        let worker = runtime_options(
            &parse(&["--provider", "cuda", "--cuda-arena", "next_power_of_two"]),
            &method,
        );
        let Provider::Cuda(cuda) = worker.provider else {
            panic!("{:?}", worker.provider)
        };
        assert_eq!(cuda.arena_extend, ArenaExtend::NextPowerOfTwo);
    }

    #[test]
    fn indices_parse_lists_and_ranges() {
        let ok = [
            ("0", vec![0]),
            ("0,3,5-7", vec![0, 3, 5, 6, 7]),
            ("2-2", vec![2]),
            (" 1 , 4", vec![1, 4]),
            ("all", (0..10).collect()),
        ];
        for (list, expected) in ok {
            assert_eq!(prompt_indices(list, 10).unwrap(), expected, "{list}");
        }
    }

    #[test]
    fn bad_index_lists_are_refused() {
        let bad = [
            ("3,1", "sorted"),
            ("1,1", "twice"),
            ("5-3", "backwards"),
            ("10", "beyond"),
            ("a", "not a prompt index"),
            ("", "empty"),
        ];
        for (list, fragment) in bad {
            let error = prompt_indices(list, 10).unwrap_err();
            assert!(error.contains(fragment), "{list}: {error}");
        }
    }
}

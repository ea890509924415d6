//! The settings of a run: one struct per manifest table. These types are the single source of
//! the JSON Schema (`runner schema`), of the built-in defaults, and of the validated form that
//! planning reads. Every setting exists in every layer; see [`super::layers`] for precedence.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use super::evaluation::{CommandTemplate, Dimensions, ScoresFile};
use super::values::{Bounded, IndexList, RunName};
pub use crate::vocab::Method;
pub use crate::vocab::settings::{
    ArenaExtend, AttentionBackend, ConvAlgoSearch, Emit, FusedKernels, Precision, ProviderKind,
    SvdRank,
};

/// A sweep: one manifest expanded into several runs, one per point (see docs/runs.md). It
/// belongs to the manifest that is run and is not inherited through `extends`.
// Read by `super::sweep` from the file's spans, never merged as a setting: this type gives the
// table its place in the schema.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Sweep {
    /// `product`: every combination of the lists (the default); `zip`: the lists side by side,
    /// which must then have equal lengths.
    #[serde(default)]
    pub mode: SweepMode,
    /// Every other key is a setting's dotted name (`"method.clean_sigma"`) with its list of
    /// values. Export-class settings (fixed by the bundle), `name`, `extends`, `kind` and
    /// `outputs.dir` cannot be swept.
    #[serde(flatten)]
    pub settings: std::collections::BTreeMap<String, Vec<serde_json::Value>>,
}

/// How the lists of a `[sweep]` combine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SweepMode {
    #[default]
    Product,
    Zip,
}

/// What a manifest runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Time a few prompts after separate warmup processes; no videos kept.
    Probe,
    /// Generate (and keep) videos for a prompt set, in contiguous shards over GPUs.
    Generation,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Probe => "probe",
            Kind::Generation => "generation",
        }
    }
}

/// A whole manifest. `extends` and `name` belong to one file and are never inherited.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "unstep experiment manifest")]
pub struct Manifest {
    /// `probe` or `generation`; inherited through `extends`.
    pub kind: Kind,
    /// The run name (default: the manifest's file stem). Results go to `results/<name>/`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<RunName>,
    /// A manifest this one builds on, relative to this file. Its values are replaced by ours.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extends: Option<String>,
    pub prompts: Prompts,
    pub warmup: Warmup,
    pub shards: Shards,
    pub noise: Noise,
    pub timing: Timing,
    pub runtime: Runtime,
    pub cache: Cache,
    pub staging: Staging,
    pub method: Method,
    pub outputs: Outputs,
    pub assets: Assets,
    #[serde(default)]
    pub evaluation: Evaluation,
    #[serde(default)]
    pub executor: Executor,
}

/// Which prompts are generated.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Prompts {
    /// Prompt file, one prompt per line (relative to the manifest that sets it).
    pub file: String,
    /// `all` or a sorted comma list with ranges. Env: `PROMPT_INDICES` (probes).
    pub indices: IndexList,
    /// Refuse to run unless the prompt file has exactly this many prompts (946 for VBench).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expect_count: Option<u32>,
    /// Standard prompts, one a line, line-aligned with `file` (relative to the manifest that
    /// sets it): with `outputs.video_naming = "vbench"`, each video is named after the standard
    /// prompt of its line, as VBench's standard mode looks it up (`<prompt>-<sample>.mp4`). For
    /// the 946 VBench prompts: VBench's `prompts/all_dimension.txt`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub names_file: Option<String>,
}

/// Warmup processes that run before measurement, in processes of their own.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Warmup {
    /// Prompts of each warmup process (probe default: the measured prompts; generation default:
    /// the first prompt of the worker's first shard). Env: `WARMUP_PROMPT_INDICES`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub indices: Option<IndexList>,
    /// Separate warmup processes before a probe's measurement (0 allowed). Env: `WARMUP_REPEATS`.
    pub repeats: Bounded<0, 100>,
}

/// How a generation's prompts are split over GPUs.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Shards {
    /// Contiguous shards (probe: always 1).
    pub count: Bounded<1, 1024>,
    /// Explicit GPU slot of each shard (position in the visible GPU list); default round-robin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_map: Option<Vec<u32>>,
}

/// How noise is drawn.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Noise {
    pub seed: u64,
    /// `sequential_global`: one stream over prompts in global order, entered at any prompt.
    pub mode: NoiseMode,
    /// `initial_only`: seed once per run.
    pub reseed: Reseed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NoiseMode {
    SequentialGlobal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Reseed {
    InitialOnly,
}

/// The timed region and what runs inside it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Timing {
    /// Accepted for the reference scripts' `DISABLE_GC_DURING_MEASUREMENT`; it changes nothing:
    /// a probe's workers never do background work inside the timed region (progress is drawn by
    /// the orchestrator, records are written after each prompt's region ends), and a value set
    /// explicitly is warned about. (A generation's workers encode each video on a second thread
    /// while the next prompt is generated: docs/generation.md.)
    pub quiet_measurement: bool,
    /// End the timed region after the VAE output, before the final clamp and uint8 layout.
    /// Env: `EXCLUDE_FINAL_OUTPUT_LAYOUT_TIMING`.
    pub exclude_final_output_layout: bool,
}

/// ONNX Runtime and the processes that host it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// Execution provider: `cuda`, `tensorrt`, or `cpu` (tests and small models).
    pub provider: ProviderKind,
    /// CPU threads of each worker process. Env: `UNSTEP_CPU_THREADS_PER_PROCESS`.
    pub cpu_threads_per_process: Bounded<1, 1024>,
    /// Accepted for the reference scripts' `TORCHINDUCTOR_COMPILE_THREADS` /
    /// `UNSTEP_COMPILE_THREADS`; it changes nothing: nothing the runner compiles (ONNX Runtime's
    /// graph optimisation, NVRTC) takes a thread count, and a value set explicitly is warned
    /// about.
    pub compile_threads: Bounded<1, 1024>,
    /// With `provider = "cpu"`: worker slots that stand in for GPUs.
    pub cpu_slots: Bounded<1, 64>,
    /// Visible GPUs, as in `CUDA_VISIBLE_DEVICES` (default: GPU 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub visible_devices: Option<String>,
    /// Path of `libonnxruntime` to load (default: found automatically).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ort_library: Option<String>,
    /// cuDNN convolution algorithm search on CUDA.
    pub cudnn_conv_algo_search: ConvAlgoSearch,
    /// CUDA provider: capture the DiT's passes as CUDA graphs, one per block shape, and replay
    /// them (ONNX Runtime's `enable_cuda_graph`, in the DiT's session). Each process captures
    /// them in its first prompt (seconds slower); every later prompt is faster (about 30 ms on
    /// wan-1.3b), so they pay off in speed probes and in long processes.
    pub cuda_graphs: bool,
    /// How the CUDA memory arena grows: `same_as_requested` (measured on an H200: 36.5 GiB in
    /// use for wan-1.3b at the same speed) or `next_power_of_two` (40.6 GiB).
    pub cuda_arena: ArenaExtend,
    /// Kernels for the DiT's norms, rotary embedding, bias and gated residual adds, its FFN's
    /// first layer with GELU and (exporter 0.10.0 and later) its self-attention: `unstep` (the
    /// runner's own fused CUDA kernels, on the bundle's `dit_fused` graph), `onnxruntime` (the
    /// stock kernels, on `dit`), or `auto` (the runner's on CUDA when the bundle has `dit_fused`
    /// and NVRTC, cuBLASLt and cuDNN load; with a 0.10.0 bundle, not for fp32 bundles). The
    /// fused DiT's self-attention is the runner's call of cuDNN's flash attention with
    /// `attention_backend` auto or cudnn_flash, and ONNX Runtime's `MultiHeadAttention` with the
    /// kernel the setting selects otherwise.
    pub dit_kernels: FusedKernels,
    /// Kernels for the VAE decoder's norms and SiLU: `unstep` (the runner's own fused kernels,
    /// on the bundle's `vae_first_fused` / `vae_step_fused` graphs), `onnxruntime`, or `auto`
    /// (the runner's on CUDA when the bundle has those graphs and NVRTC, cuBLASLt and cuDNN
    /// load).
    pub vae_kernels: FusedKernels,
}

impl Default for Runtime {
    /// The same for probes and generations; `runner worker`'s flags are a layer over it.
    fn default() -> Self {
        Runtime {
            provider: ProviderKind::Cuda,
            cpu_threads_per_process: Bounded(32),
            compile_threads: Bounded(32),
            cpu_slots: Bounded(1),
            visible_devices: None,
            ort_library: None,
            cudnn_conv_algo_search: ConvAlgoSearch::Exhaustive,
            cuda_graphs: false,
            cuda_arena: ArenaExtend::SameAsRequested,
            dit_kernels: FusedKernels::Auto,
            vae_kernels: FusedKernels::Auto,
        }
    }
}

/// Compiler caches: ORT optimised models, TensorRT engines and timing caches, CUDA's JIT cache.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cache {
    /// `isolated`: fresh per-run caches; `shared`: warm per-shard state reused across runs.
    /// Env: `UNSTEP_CACHE_MODE`.
    pub mode: CacheMode,
    /// `run_gpu`: one warmup per GPU, cache reused across its shards; `shard`: per shard.
    /// Env: `UNSTEP_CACHE_SCOPE`.
    pub scope: CacheScope,
    /// Purge the user-level compiler caches first: CUDA's JIT cache (`~/.nv/ComputeCache`, and
    /// the folder `CUDA_CACHE_PATH` names when set). Other jobs of this user use them too: opt in
    /// only when no other jobs use those caches. A run's processes never read them (each has its
    /// own). Env: `UNSTEP_CLEAR_GLOBAL_RUNTIME_CACHES`.
    pub clear_global: bool,
    /// Where shared-mode state lives, per shard. Env: `UNSTEP_SHARED_RUNTIME_STATE_DIR`. The
    /// default, `.runtime_state/full946_generation`, is one folder for every generation, as the
    /// benchmark guide has it: an ablation (`sigma001`) starts warm from the state `full946`
    /// left, and is labelled warm-cache. The runner's caches there are keyed by the bundle's
    /// contents (prompt contexts) or by kernel and shape (compiled kernels, convolution and
    /// attention plans), so a run of another bundle does not take its state as its own.
    pub shared_state_dir: String,
    /// Where a probe's compiler state lives (default: `runtime_state/` in the run's folder,
    /// under `outputs.dir`). Env: `UNSTEP_RUN_STATE_ROOT`.
    pub run_state_root: String,
    /// Accept existing probe state instead of refusing it. Env: `UNSTEP_REUSE_RUNTIME_STATE`.
    pub reuse_runtime_state: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    Isolated,
    Shared,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CacheScope {
    RunGpu,
    Shard,
}

/// The staging area a run executes from.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Staging {
    /// Work root, held under an exclusive lock for the whole run. Env: `UNSTEP_WORK_ROOT`.
    pub work_root: String,
}

/// What a run keeps.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Outputs {
    /// Results root; the run writes `<dir>/<name>/`. The default `results` is in the checkout
    /// that holds the manifest (the current folder for a manifest outside any checkout), as is
    /// every built-in default path.
    pub dir: String,
    /// Write MP4s (generation: kept under `videos/`; probe: debug saves, deleted after each
    /// process). Extra arg: `--save-videos`.
    pub save_videos: bool,
    /// Keep each measured prompt's final latents as `latents/latents_<index>.f32` (raw
    /// little-endian float32, `[1, 16, latent frames, height / 8, width / 8]`: 8.4 MB a prompt at
    /// 480×832), so that `runner compare` measures another run against this one on the same
    /// noise (relative L2 error). Warmup processes keep none.
    pub save_latents: bool,
    /// Keep each measured prompt's decoded frames as `frames/frames_<index>.u8` (raw uint8 RGB,
    /// `[frames, height, width, 3]`: 97 MB a prompt at 81 frames of 480×832), so that `runner
    /// compare` measures another run against this one on the same noise (PSNR, pixel
    /// differences), without the videos' compression between them. Warmup processes keep none.
    pub save_frames: bool,
    /// Video file names: `vbench` (the standard prompt of `prompts.names_file` and its sample
    /// index, `<prompt>-<sample>.mp4`; without a names file, the prompt's first 180 characters and
    /// `-0.mp4`) or `indexed` (`NNNN.mp4`).
    pub video_naming: VideoNaming,
}

impl Outputs {
    /// Whether the run keeps each measured prompt's arrays of `kind`.
    pub fn keeps(&self, kind: crate::vocab::ArrayKind) -> bool {
        match kind {
            crate::vocab::ArrayKind::Latents => self.save_latents,
            crate::vocab::ArrayKind::Frames => self.save_frames,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum VideoNaming {
    Vbench,
    Indexed,
}

/// The exported model.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Assets {
    /// Asset bundle directory (or .zip), relative to the manifest that sets it.
    pub bundle: String,
    /// Lets a generation with an `[evaluation]` score a bundle whose weights are not all
    /// released ones (seeded random weights score like real ones, and mean nothing). Off: such a
    /// run is refused before anything is written.
    #[serde(default)]
    pub allow_random_weights: bool,
}

/// Scoring after a whole generation (`docs/vbench.md`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Evaluation {
    /// Command run once every prompt of a generation has its video, and by `runner evaluate`:
    /// the program and its arguments as a list, run without a shell, in the run's results
    /// folder. Placeholders, filled inside each argument: `{videos}`, `{run_dir}`,
    /// `{run}`, `{names_file}`, `{dimensions}` (space-separated, one argument), `{eval_dir}`,
    /// `{scores_file}`. Its output goes to `logs/evaluation.log`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<CommandTemplate>,
    /// The dimensions to score (VBench's names, e.g. `subject_consistency`); every one must
    /// have a score in the scores file.
    #[serde(default)]
    pub dimensions: Dimensions,
    /// The JSON file the command writes, relative to `results/<name>/eval/`: an object of
    /// dimension -> score (a number, or VBench's `[score, per-video results]`). Its file name may
    /// hold one `*` (VBench's `results_<time>_eval_results.json`).
    #[serde(default)]
    pub scores_file: ScoresFile,
    /// Seconds the command may run, 1 to 31536000 (a year); past them it is stopped (SIGTERM to
    /// its process group, then SIGKILL) and the run ends `evaluation_failed`, its videos kept.
    /// Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<EvaluationTimeout>,
}

/// `evaluation.timeout_seconds`: bounded so that the deadline it sets is a time the clock can
/// hold.
pub type EvaluationTimeout = Bounded<1, 31_536_000>;

/// Where the workers run: local processes, or the tasks of one Slurm job array.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Executor {
    /// `local`: worker processes on this machine; `slurm`: one job array, one task per worker
    /// slot (see docs/cluster.md).
    #[serde(default)]
    pub kind: ExecutorKind,
    /// Slurm partition (`sbatch --partition`; default: the cluster's default partition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Slurm account to charge (`sbatch --account`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Time limit of each task, as sbatch takes it (`--time`, e.g. `02:00:00`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// GPUs of each task (`--gpus-per-task`; default: 1 with a GPU provider, none on the CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_task: Option<u32>,
    /// CPUs of each task (`--cpus-per-task`; default: `runtime.cpu_threads_per_process`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<u32>,
    /// Memory of each task, as sbatch takes it (`--mem`, e.g. `64G`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<String>,
    /// More sbatch arguments, each one argument (`["--qos=high", "--constraint=h200"]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra: Vec<String>,
    /// The work root and the results folder are on a filesystem every node shares. Slurm runs
    /// refuse a work root or results folder under /tmp unless this says so.
    #[serde(default)]
    pub shared_filesystem: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecutorKind {
    #[default]
    Local,
    Slurm,
}

/// The default `cache.shared_state_dir`: one folder every shared-cache generation warms and
/// reuses (the benchmark guide's default).
pub const SHARED_STATE_DIR: &str = ".runtime_state/full946_generation";

impl Manifest {
    /// Whether the run's processes keep their state in the shared folder
    /// (`cache.shared_state_dir`), where earlier runs' state may be: a generation with
    /// `cache.mode = "shared"`. A probe's state is always its own (`cache.run_state_root`), so
    /// the mode does not make a probe share anything.
    pub fn shares_state(&self) -> bool {
        self.kind == Kind::Generation && self.cache.mode == CacheMode::Shared
    }

    /// The built-in defaults for a kind of run named `name`: the lowest layer.
    pub fn defaults(kind: Kind, name: &str) -> Manifest {
        let probe = kind == Kind::Probe;
        Manifest {
            kind,
            name: None,
            extends: None,
            prompts: Prompts {
                file: "assets/prompts/vbench_extended.txt".into(),
                indices: if probe {
                    IndexList::List((0..20).collect())
                } else {
                    IndexList::All
                },
                expect_count: None,
                names_file: None,
            },
            warmup: Warmup {
                indices: None,
                repeats: Bounded(1),
            },
            shards: Shards {
                count: Bounded(if probe { 1 } else { 8 }),
                gpu_map: None,
            },
            noise: Noise {
                seed: 0,
                mode: NoiseMode::SequentialGlobal,
                reseed: Reseed::InitialOnly,
            },
            timing: Timing {
                quiet_measurement: true,
                exclude_final_output_layout: false,
            },
            runtime: Runtime::default(),
            cache: Cache {
                mode: CacheMode::Isolated,
                scope: CacheScope::RunGpu,
                clear_global: false,
                shared_state_dir: SHARED_STATE_DIR.into(),
                run_state_root: format!("results/{name}/runtime_state"),
                reuse_runtime_state: false,
            },
            staging: Staging {
                work_root: if probe {
                    "${TMPDIR:-/tmp}/unstep_speed_probe_stage".into()
                } else {
                    "${TMPDIR:-/tmp}/unstep_full946_generation".into()
                },
            },
            method: Method::default(),
            outputs: Outputs {
                dir: "results".into(),
                save_videos: !probe,
                save_latents: false,
                save_frames: false,
                video_naming: VideoNaming::Vbench,
            },
            assets: Assets {
                bundle: "assets/wan-1.3b".into(),
                allow_random_weights: false,
            },
            evaluation: Evaluation::default(),
            executor: Executor::default(),
        }
    }
}

//! What one worker process is asked to do ([`ProcessSpec`], written as JSON by `runner apply`
//! and read by `runner worker --spec`), the events it reports on stdout, and the worker side that
//! turns a spec into generated prompts.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::{self, GenerateOptions, Generator, MethodSettings, RuntimeOptions};
use crate::manifest::{self, Manifest, VideoNaming};
use crate::results::files::append_jsonl;
use crate::results::records::{ProcessRole, TimedRegionEnd, TimingRecord};

/// One prompt to generate: its global index and text.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PromptSpec {
    pub index: u32,
    pub text: String,
}

/// Everything a worker process needs; it reads nothing else.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessSpec {
    pub run: String,
    pub process: usize,
    pub role: ProcessRole,
    pub shard: Option<usize>,
    /// Slot label (`gpu0`, `cpu1`).
    pub slot: String,
    /// The staged bundle.
    pub bundle: PathBuf,
    /// sha256 of the staged bundle's files by their name in `bundle.toml`, from the staging
    /// audit: the worker checks them against `bundle.toml` without reading the files again.
    #[serde(default)]
    pub bundle_sha256: BTreeMap<String, String>,
    pub prompts: Vec<PromptSpec>,
    /// The resolved manifest (method, noise, timing and runtime settings).
    pub manifest: Manifest,
    /// This process's compiler caches.
    pub cache_dir: PathBuf,
    /// Where this process appends its timing records.
    pub timings: PathBuf,
    /// The run directory; `video` paths in records are relative to it.
    pub run_dir: PathBuf,
    /// Where videos go, when they are written.
    pub videos: Option<PathBuf>,
    pub config_hash: String,
    pub ort_library: Option<PathBuf>,
}

/// A worker's report to `runner apply`, one JSON line on stdout each. `Ready` is by far the
/// largest variant; a worker sends it once, so it stays unboxed (plain patterns on its fields).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)]
pub enum WorkerEvent {
    /// Sessions are built; generation starts.
    Ready {
        provider: String,
        ort_version: String,
        /// The attention kernel choice `auto` (or the request) resolved to.
        attention_backend: String,
        /// The DiT's elementwise kernels: `unstep` (the runner's fused ones) or `onnxruntime`.
        #[serde(default)]
        dit_kernels: Option<String>,
        /// The VAE decoder's: `unstep` or `onnxruntime`.
        #[serde(default)]
        vae_kernels: Option<String>,
        /// The opened bundle's preset and exporter version (its `bundle.toml`).
        #[serde(default)]
        bundle_preset: Option<String>,
        #[serde(default)]
        bundle_exporter_version: Option<String>,
        /// Versions of the CUDA runtime and cuDNN libraries the process loaded, if any.
        #[serde(default)]
        cuda_version: Option<String>,
        #[serde(default)]
        cudnn_version: Option<String>,
    },
    /// One prompt is done (and its video written, when asked).
    Prompt { prompt: u32, timed_total_s: f64 },
}

/// Videos are written at 16 frames per second, as the model's training data.
pub const FPS: u32 = 16;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot read process spec {}: {reason}", .path.display())]
    Spec { path: PathBuf, reason: String },
    #[error(transparent)]
    Generate(#[from] engine::GenerateError),
    #[error(transparent)]
    Ort(#[from] engine::OrtLoadError),
    #[error("cannot record timings: {0}")]
    Record(#[from] crate::results::files::RecordError),
    #[error("cannot write video {}: {reason}", .path.display())]
    Video { path: PathBuf, reason: String },
}

impl ProcessSpec {
    pub fn read(path: &Path) -> Result<ProcessSpec, WorkerError> {
        let err = |reason: String| WorkerError::Spec {
            path: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| err(e.to_string()))
    }
}

/// The engine's method settings for a manifest.
pub fn method_settings(m: &Manifest) -> MethodSettings {
    MethodSettings {
        clean_sigma: m.method.clean_sigma.0 as f32,
        denoising_steps: m.method.denoising_steps.0.clone(),
        warp_denoising_steps: m.method.warp_denoising_steps,
        timestep_shift: m.method.timestep_shift.0,
        emit: match m.method.emit {
            manifest::Emit::CachePass => engine::Emit::CachePass,
            manifest::Emit::Denoised => engine::Emit::Denoised,
        },
        attention_window: m.method.attention_window.0,
        seed: m.noise.seed,
    }
}

/// The export-time settings a manifest asks of its bundle.
pub fn export_settings(m: &Manifest) -> engine::ExportSettings {
    engine::ExportSettings {
        frames_per_block: Some(m.method.frames_per_block.0 as usize),
        latent_frames: Some(m.method.latent_frames.0 as usize),
        height: Some(m.method.height.0 as usize),
        width: Some(m.method.width.0 as usize),
        precision: Some(match m.method.precision {
            manifest::Precision::Fp32 => engine::Precision::Fp32,
            manifest::Precision::Fp16 => engine::Precision::Fp16,
            manifest::Precision::Bf16 => engine::Precision::Bf16,
        }),
        svd_rank: Some(match m.method.svd_rank {
            manifest::SvdRank::None => engine::SvdRank::None,
            manifest::SvdRank::Rank(r) => engine::SvdRank::Rank(r),
        }),
    }
}

/// Session options for a manifest's runtime table. Inside a worker the GPU is always device 0:
/// `runner apply` narrows `CUDA_VISIBLE_DEVICES` to the slot's GPU.
pub fn runtime_options(m: &Manifest, cache_dir: &Path, ort: Option<PathBuf>) -> RuntimeOptions {
    let rt = &m.runtime;
    let conv = match rt.cudnn_conv_algo_search {
        manifest::ConvAlgoSearch::Exhaustive => engine::ConvAlgoSearch::Exhaustive,
        manifest::ConvAlgoSearch::Heuristic => engine::ConvAlgoSearch::Heuristic,
        manifest::ConvAlgoSearch::Default => engine::ConvAlgoSearch::Default,
    };
    let provider = match rt.provider {
        manifest::Provider::Cpu => engine::Provider::Cpu,
        manifest::Provider::Cuda => engine::Provider::Cuda(engine::CudaOptions {
            device_id: 0,
            attention: match m.method.attention_backend {
                manifest::AttentionBackend::Auto => engine::AttentionKernel::Auto,
                manifest::AttentionBackend::Flash => engine::AttentionKernel::Flash,
                manifest::AttentionBackend::Fa2 => engine::AttentionKernel::Fa2,
                manifest::AttentionBackend::CudnnFlash => engine::AttentionKernel::CudnnFlash,
                manifest::AttentionBackend::Efficient => engine::AttentionKernel::Efficient,
                manifest::AttentionBackend::Math => engine::AttentionKernel::Math,
            },
            conv_algo_search: conv,
            arena_extend: match rt.cuda_arena {
                manifest::CudaArena::SameAsRequested => engine::ArenaExtend::SameAsRequested,
                manifest::CudaArena::NextPowerOfTwo => engine::ArenaExtend::NextPowerOfTwo,
            },
            cuda_graphs: rt.cuda_graphs,
            ..Default::default()
        }),
        manifest::Provider::Tensorrt => engine::Provider::TensorRt(engine::TensorRtOptions {
            device_id: 0,
            fp16: m.method.precision != manifest::Precision::Fp32,
            engine_cache_dir: Some(cache_dir.join("tensorrt_engines")),
            timing_cache_dir: Some(cache_dir.join("tensorrt_timing")),
        }),
    };
    RuntimeOptions {
        ort_library: ort,
        provider,
        intra_op_threads: Some(rt.cpu_threads_per_process.0 as usize),
        optimized_model_dir: Some(cache_dir.join("ort_optimized")),
        io_binding: false,
        overlap_vae: true,
        dit_kernels: fused_kernels(rt.dit_kernels),
        vae_kernels: fused_kernels(rt.vae_kernels),
    }
}

fn fused_kernels(k: manifest::FusedKernels) -> engine::FusedKernels {
    match k {
        manifest::FusedKernels::Auto => engine::FusedKernels::Auto,
        manifest::FusedKernels::Unstep => engine::FusedKernels::Unstep,
        manifest::FusedKernels::Onnxruntime => engine::FusedKernels::Onnxruntime,
    }
}

/// The video file name of a prompt: VBench names videos by prompt text and sample index.
pub fn video_name(naming: VideoNaming, prompt: &PromptSpec) -> String {
    match naming {
        VideoNaming::Indexed => format!("{:04}.mp4", prompt.index),
        VideoNaming::Vbench => {
            // The prompt is the file name: keep it readable, but never a path.
            let text: String = prompt
                .text
                .chars()
                .map(|c| if c == '/' || c == '\0' { '_' } else { c })
                .collect();
            let text: String = text.trim().chars().take(180).collect();
            format!("{text}-0.mp4")
        }
    }
}

fn event(e: &WorkerEvent) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, e);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// The version suffix of a shared library this process has mapped (`libcudnn.so.9.10.2` →
/// `9.10.2`), read from `/proc/self/maps`: the libraries actually loaded, whatever their path.
fn loaded_version(maps: &str, stem: &str) -> Option<String> {
    let path = engine::mapped_library(maps, stem)?;
    engine::file_name(path)
        .strip_prefix(stem)
        .map(str::to_string)
}

/// Runs a process spec: builds the sessions, generates every prompt in order, appends one
/// timing record per prompt and writes videos when asked.
pub fn run(spec: &ProcessSpec) -> Result<(), WorkerError> {
    let m = &spec.manifest;
    let ort = engine::ort_lib::runtime(spec.ort_library.as_deref())?;
    let unpack = spec.cache_dir.join("bundle_unpacked");
    let runtime = runtime_options(m, &spec.cache_dir, spec.ort_library.clone());
    let bundle = engine::Bundle::open_with_known_hashes(&spec.bundle, &unpack, &spec.bundle_sha256)
        .map_err(engine::GenerateError::from)?;
    bundle
        .check_export(&export_settings(m))
        .map_err(engine::GenerateError::from)?;
    // Every prompt's context first, with the text encoder alone on the device; then the DiT
    // and the decoder (docs/generation.md). The timed region starts from the ready context.
    let prompts = spec.prompts.iter().map(|p| p.text.as_str());
    let mut generator = Generator::with_prompts(bundle, &runtime, prompts)?;
    let attention_backend = crate::cli::worker::attention_name(&runtime.provider, &generator);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    event(&WorkerEvent::Ready {
        provider: runtime.provider.name().into(),
        ort_version: ort.version.clone(),
        attention_backend,
        dit_kernels: Some(generator.dit_kernels().name().into()),
        vae_kernels: Some(generator.vae_kernels().name().into()),
        bundle_preset: Some(generator.bundle().manifest.preset.clone()),
        bundle_exporter_version: Some(generator.bundle().manifest.exporter_version.clone()),
        cuda_version: loaded_version(&maps, "libcudart.so."),
        cudnn_version: loaded_version(&maps, "libcudnn.so."),
    });
    let options = GenerateOptions {
        method: method_settings(m),
        exclude_final_output_layout: m.timing.exclude_final_output_layout,
        latents_only: false,
    };
    for prompt in &spec.prompts {
        let generated = generator.generate(prompt.index, &prompt.text, &options)?;
        let t = &generated.times;
        let video = match &spec.videos {
            Some(dir) => {
                let path = dir.join(video_name(m.outputs.video_naming, prompt));
                let [n, h, w, _] = generated.frame_shape;
                crate::video::write_mp4(&path, &generated.frames, n, h, w, FPS).map_err(|e| {
                    WorkerError::Video {
                        path: path.clone(),
                        reason: e.to_string(),
                    }
                })?;
                Some(
                    path.strip_prefix(&spec.run_dir)
                        .unwrap_or(&path)
                        .display()
                        .to_string(),
                )
            }
            None => None,
        };
        let record = TimingRecord {
            process: spec.process,
            role: spec.role,
            shard: spec.shard,
            slot: spec.slot.clone(),
            prompt: prompt.index,
            text_encoding_s: t.text_encoding.as_secs_f64(),
            dit_s: t.dit.as_secs_f64(),
            vae_s: t.vae.as_secs_f64(),
            layout_s: t.layout.as_secs_f64(),
            timed_total_s: t.timed_total.as_secs_f64(),
            peak_device_memory_bytes: generated.peak_device_memory,
            timed_region_ends: if m.timing.exclude_final_output_layout {
                TimedRegionEnd::VaeOutput
            } else {
                TimedRegionEnd::Uint8Frames
            },
            config_hash: spec.config_hash.clone(),
            prompt_sha256: Some(crate::results::prompt_hash(&prompt.text)),
            video,
        };
        // The record is written last: a prompt counts as done only once its video exists.
        append_jsonl(&spec.timings, &record)?;
        event(&WorkerEvent::Prompt {
            prompt: prompt.index,
            timed_total_s: record.timed_total_s,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loaded_library_versions_come_from_the_mapped_file_names() {
        let maps = "7f0-7f1 r-xp 0 08:01 1 /usr/lib/libcudnn.so.9\n\
                    7f1-7f2 r-xp 0 08:01 2 /opt/nvidia/cudnn/lib/libcudnn.so.9.10.2\n\
                    7f2-7f3 r-xp 0 08:01 3 /usr/local/cuda/lib/libcudart.so.13.0.48\n";
        assert_eq!(
            loaded_version(maps, "libcudnn.so.").as_deref(),
            Some("9.10.2")
        );
        assert_eq!(
            loaded_version(maps, "libcudart.so.").as_deref(),
            Some("13.0.48")
        );
        assert_eq!(loaded_version(maps, "libnvinfer.so."), None);
    }

    #[test]
    fn vbench_names_are_the_prompt_and_never_a_path() {
        let p = PromptSpec {
            index: 3,
            text: "a cat/dog on a skateboard".into(),
        };
        assert_eq!(
            video_name(VideoNaming::Vbench, &p),
            "a cat_dog on a skateboard-0.mp4"
        );
        assert_eq!(video_name(VideoNaming::Indexed, &p), "0003.mp4");
    }
}

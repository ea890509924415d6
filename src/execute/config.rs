//! The typed configuration a run executes with, resolved once from the manifest: the engine's
//! session options, the method and export settings, and what each process records. Preflight
//! checks and every worker's job are built from it; no worker sees the manifest.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::{
    CudaOptions, Diagnostics, ExportSettings, MethodSettings, Precision, Provider, ProviderKind,
    RuntimeOptions, TensorRtOptions,
};
use crate::manifest::{Kind, Manifest, Resolved, Runtime, VideoNaming};
use crate::vocab::Method;

/// The engine's session options of a `[runtime]` table and the method it runs with (its
/// attention backend; TensorRT builds fp16 engines unless the method's precision is fp32).
/// Inside a worker the GPU is always device 0: `runner apply` narrows `CUDA_VISIBLE_DEVICES` to
/// the slot's GPU. `runner worker`'s flags are a layer over the same table, and set what a
/// benchmark varies beyond it on the result.
pub fn engine_options(
    rt: &Runtime,
    method: &Method,
    ort_library: Option<PathBuf>,
) -> RuntimeOptions {
    let provider = match rt.provider {
        ProviderKind::Cpu => Provider::Cpu,
        ProviderKind::Cuda => Provider::Cuda(CudaOptions {
            device_id: 0,
            attention: method.attention_backend,
            conv_algo_search: rt.cudnn_conv_algo_search,
            arena_extend: rt.cuda_arena,
            cuda_graphs: rt.cuda_graphs,
            ..CudaOptions::default()
        }),
        ProviderKind::Tensorrt => Provider::TensorRt(TensorRtOptions {
            device_id: 0,
            fp16: method.precision != Precision::Fp32,
            engine_cache_dir: None,
            timing_cache_dir: None,
        }),
    };
    RuntimeOptions {
        ort_library,
        provider,
        intra_op_threads: Some(rt.cpu_threads_per_process.0 as usize),
        optimized_model_dir: None,
        overlap_vae: true,
        dit_kernels: rt.dit_kernels,
        vae_kernels: rt.vae_kernels,
        diagnostics: Diagnostics::default(),
        kernel_cache_dir: None,
        context_cache_dir: None,
        attention_precision: method.attention_precision,
    }
    .with_diagnostics_from_env()
}

/// Everything about how prompts are generated that is the same for every process of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// Session options; [`RunConfig::engine_for`] adds a process's cache folders.
    pub engine: RuntimeOptions,
    pub method: MethodSettings,
    /// What the run asks of its bundle (every field set: a manifest states each).
    pub export: ExportSettings,
    /// End the timed region at the VAE output (`timing.exclude_final_output_layout`).
    pub exclude_final_output_layout: bool,
    /// How videos are named (a probe's debug videos are always `indexed`).
    pub video_naming: VideoNaming,
}

impl RunConfig {
    /// The configuration of a resolved manifest. Inside a worker the GPU is always device 0:
    /// `runner apply` narrows `CUDA_VISIBLE_DEVICES` to the slot's GPU.
    pub fn resolve(r: &Resolved) -> RunConfig {
        Self::of(&r.manifest, r.paths.ort_library.clone())
    }

    pub fn of(m: &Manifest, ort_library: Option<PathBuf>) -> RunConfig {
        let engine = engine_options(&m.runtime, &m.method, ort_library);
        RunConfig {
            engine,
            method: MethodSettings::of(&m.method, m.noise.seed),
            export: ExportSettings::of(&m.method),
            exclude_final_output_layout: m.timing.exclude_final_output_layout,
            // A probe's debug videos go to `indexed_videos`, named by prompt index.
            video_naming: match m.kind {
                Kind::Probe => VideoNaming::Indexed,
                Kind::Generation => m.outputs.video_naming,
            },
        }
    }

    /// The session options of a process whose compiler caches live in `cache_dir`.
    pub fn engine_for(&self, cache_dir: &Path) -> RuntimeOptions {
        let mut engine = self.engine.clone();
        engine.optimized_model_dir = Some(cache_dir.join("ort_optimized"));
        engine.kernel_cache_dir = Some(cache_dir.to_path_buf());
        engine.context_cache_dir = Some(cache_dir.join("text_contexts"));
        if let Provider::TensorRt(trt) = &mut engine.provider {
            trt.engine_cache_dir = Some(cache_dir.join("tensorrt_engines"));
            trt.timing_cache_dir = Some(cache_dir.join("tensorrt_timing"));
        }
        engine
    }
}

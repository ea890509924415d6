//! The VAE decoder's side of the loop: latent frames de-normalised by the runner's
//! `latent_frame` graph, decoded one latent frame per call (`vae_first`, then `vae_step` with the
//! causal cache of the frame before), and the clamp and uint8 layout of the decoded video. It runs
//! on the caller's thread after the DiT, or on a decoder thread beside it (`overlap_vae`).

use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use ort::memory::{Allocator, MemoryInfo};
use ort::session::{IoBinding, RunOptions, Session};
use ort::value::{Tensor, TensorElementType};

use super::buffers::{Bound, Buf, View, device_memory_info};
use super::capture::CaptureGate;
use super::dims::Dims;
use super::{GenerateError, PhaseTimes, run_error};
use crate::engine::onnx_graph;
use crate::engine::session::{
    GraphSessions, RuntimeOptions, build_small_session, indexed_names, vae_cache_count,
};

/// What the VAE decoder needs: its own small-graph sessions and buffers read through views.
pub(super) struct VaeParts {
    pub(super) latent_frame: Session,
    pub(super) layout: Session,
    pub(super) bufs: VaeBufs,
}

pub(super) struct VaeBufs {
    /// Final latents, block after block: `[blocks][1, C, F, h, w]`, float32 (written by the
    /// DiT side, read by the decoder once the block's index was handed over).
    pub(super) latents: Buf,
    indices: Buf,
    std: Buf,
    mean: Buf,
    z: Buf,
    /// The decoder's output, call after call (`[1, 3, n, H, W]` each), in the bundle's type.
    video: Buf,
    /// The causal cache of the VAE, two sets used in turn (inputs of one call, outputs of it).
    cache: [Vec<Buf>; 2],
    cache_shapes: Vec<Vec<i64>>,
    cache_in: Vec<String>,
    cache_out: Vec<String>,
    /// The uint8 frames, `[frames, H, W, 3]`.
    pub(super) frames_u8: Buf,
    d: Dims,
    /// The CUDA device, or `None` on the CPU (a decoder thread makes its own `MemoryInfo`).
    device: Option<i32>,
}

impl VaeParts {
    /// The decoder's small graphs (in the bundle's float type `model`) and buffers.
    pub(super) fn new(
        sessions: &GraphSessions,
        runtime: &RuntimeOptions,
        alloc: &Allocator,
        d: Dims,
        model: TensorElementType,
        device: Option<i32>,
    ) -> Result<Self, GenerateError> {
        let buf = |ty, len| Buf::alloc(alloc, ty, len);
        let cache_shapes = vae_cache_shapes(&sessions.vae_first)?;
        let cache_set = || -> Result<Vec<Buf>, GenerateError> {
            cache_shapes
                .iter()
                .map(|s| buf(model, s.iter().product::<i64>() as usize))
                .collect()
        };
        let cache = [cache_set()?, cache_set()?];
        let caches = cache_shapes.len();
        let frame_elems = 3 * d.video_frames() * d.frame_px();
        let f32_ = TensorElementType::Float32;
        let small = |name: &str, bytes: Vec<u8>| build_small_session(name, &bytes, runtime);
        Ok(Self {
            latent_frame: small("latent_frame", onnx_graph::latent_frame(model))?,
            layout: small("layout", onnx_graph::layout(model))?,
            bufs: VaeBufs {
                latents: buf(f32_, d.blocks() * d.block_elems())?,
                indices: buf(TensorElementType::Int64, d.frames_per_block)?,
                std: buf(f32_, d.channels)?,
                mean: buf(f32_, d.channels)?,
                z: buf(model, d.channels * d.h * d.w)?,
                video: buf(model, frame_elems)?,
                cache,
                cache_shapes,
                cache_in: indexed_names("cache_in", caches),
                cache_out: indexed_names("cache_out", caches),
                frames_u8: buf(TensorElementType::Uint8, frame_elems)?,
                d,
                device,
            },
        })
    }
}

impl VaeBufs {
    /// Uploads the bundle's constants: the frame indices within a block and the latents'
    /// statistics.
    pub(super) fn upload_constants(
        &self,
        identity_i64: &mut Session,
        identity_f32: &mut Session,
        mem: &MemoryInfo<'static>,
        latent: &crate::engine::bundle::LatentStats,
    ) -> ort::Result<()> {
        let indices: Vec<i64> = (0..self.d.frames_per_block as i64).collect();
        self.indices.upload(identity_i64, mem, &indices)?;
        self.std.upload(identity_f32, mem, &latent.std)?;
        self.mean.upload(identity_f32, mem, &latent.mean)
    }
}

/// The shapes of the decoder's causal cache, read from `vae_first`'s `cache_out.{j}` outputs;
/// they must be static, as the loop allocates the cache once.
fn vae_cache_shapes(vae_first: &Session) -> Result<Vec<Vec<i64>>, GenerateError> {
    let caches = vae_cache_count(vae_first);
    let mut shapes = Vec::with_capacity(caches);
    for j in 0..caches {
        let name = format!("cache_out.{j}");
        let outlet = vae_first
            .outputs()
            .iter()
            .find(|o| o.name() == name)
            .expect("counted above");
        let shape: Vec<i64> = outlet
            .dtype()
            .tensor_shape()
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        if shape.iter().any(|&x| x < 0) {
            return Err(GenerateError::Output {
                graph: "vae_first",
                name,
                problem: format!(
                    "has a symbolic shape {shape:?}; the device loop needs static cache shapes (export the bundle again)"
                ),
            });
        }
        shapes.push(shape);
    }
    Ok(shapes)
}

/// Runs a session that runs once per prompt (`vae_first`), or once at all (the decoder's run at
/// start, [`warm_up`]). On a GPU the run hands the session's free arena memory back to CUDA at its
/// end (`memory.enable_memory_arena_shrinkage`): the arena would otherwise keep its peak for the
/// whole process.
fn run_and_shrink(
    session: &mut Session,
    binding: &IoBinding,
    device: Option<i32>,
) -> ort::Result<()> {
    match device {
        Some(device) => {
            let mut shrink = RunOptions::new()?;
            shrink.set(
                "memory.enable_memory_arena_shrinkage",
                format!("gpu:{device}"),
            )?;
            session.run_binding_with_options(binding, &shrink)?;
        }
        None => {
            session.run_binding(binding)?;
        }
    }
    Ok(())
}

/// Runs the decoder once on zeros, `vae_first` and then `vae_step` on its causal cache, so that
/// what a decoder's first runs decide (the convolutions' engines, ONNX Runtime's algorithm
/// searches, its arenas' first chunks) is done before the first prompt: [`super::Generator`] has
/// it run on the thread that builds the decoder's sessions beside the DiT's.
///
/// The causal caches stay where the provider computes: on a GPU they are some 2 GB at 480×832,
/// and the host copies of them (out of `vae_first`, into and out of `vae_step`) took about as
/// long as the two runs themselves. They live in memory of the runner's own
/// ([`Buf::own_device`]), freed at the end, not in an arena,
/// which would keep them for the whole process. On a GPU (`device`), both runs hand their
/// arenas' free memory back at their end (as `vae_first` does in every prompt,
/// [`run_and_shrink`]): ONNX Runtime's algorithm searches size their workspaces by the
/// memory free at the time, which before the DiT's first pass is most of the device, and an
/// arena keeps what it once held for the whole process.
pub(super) fn warm_up(
    vae_first: &mut Session,
    vae_step: &mut Session,
    d: &Dims,
    model: TensorElementType,
    device: Option<i32>,
) -> Result<(), GenerateError> {
    let fail = run_error("the decoder's run at start");
    let shapes = vae_cache_shapes(vae_first)?;
    let set_len: usize = shapes
        .iter()
        .map(|s| s.iter().product::<i64>() as usize)
        .sum();
    // Two sets of caches: `vae_first`'s outputs, which `vae_step` reads, and `vae_step`'s; on a
    // GPU in memory of the runner's own, freed at the end.
    let scratch = match device {
        Some(ordinal) => Buf::own_device(ordinal, model, 2 * set_len)?,
        None => Buf::alloc(&Allocator::default(), model, 2 * set_len)?,
    };
    let mem = device_memory_info(device).map_err(fail)?;
    let set = |start: usize| -> ort::Result<Vec<(usize, View)>> {
        let mut offset = start;
        let mut views = Vec::with_capacity(shapes.len());
        for (j, shape) in shapes.iter().enumerate() {
            views.push((j, scratch.view(&mem, offset, shape)?));
            offset += shape.iter().product::<i64>() as usize;
        }
        Ok(views)
    };
    let z_shape = vec![1, d.channels as i64, 1, d.h as i64, d.w as i64];
    let zeros = d.channels * d.h * d.w;
    let z = || -> ort::Result<ort::value::DynValue> {
        Ok(match model {
            TensorElementType::Float16 => {
                Tensor::from_array((z_shape.clone(), vec![half::f16::ZERO; zeros]))?.into_dyn()
            }
            TensorElementType::Bfloat16 => {
                Tensor::from_array((z_shape.clone(), vec![half::bf16::ZERO; zeros]))?.into_dyn()
            }
            _ => Tensor::from_array((z_shape.clone(), vec![0f32; zeros]))?.into_dyn(),
        })
    };
    // A binding of zeros in and frames out on the device; the caches are bound apart.
    let bound = |session: &Session| -> ort::Result<Bound> {
        let mut bound = Bound::new(session.create_binding()?);
        bound.binding.bind_input("z", &z()?)?;
        bound.binding.bind_output_to_device("frames", &mem)?;
        Ok(bound)
    };
    let first = (|| -> ort::Result<Bound> {
        let mut first = bound(vae_first)?;
        for (j, view) in set(0)? {
            first.output(&format!("cache_out.{j}"), view)?;
        }
        run_and_shrink(vae_first, &first.binding, device)?;
        Ok(first)
    })()
    .map_err(run_error("vae_first"))?;
    let step = (|| -> ort::Result<Bound> {
        let mut step = bound(vae_step)?;
        for (j, view) in set(0)? {
            step.input(&format!("cache_in.{j}"), view)?;
        }
        for (j, view) in set(set_len)? {
            step.output(&format!("cache_out.{j}"), view)?;
        }
        run_and_shrink(vae_step, &step.binding, device)?;
        Ok(step)
    })()
    .map_err(run_error("vae_step"))?;
    // The bindings hold views of the scratch memory: they go first.
    drop((first, step));
    drop(scratch);
    Ok(())
}

/// Decodes the blocks whose indices arrive on `blocks`, in order, one latent frame per call,
/// passing the causal cache between the two buffer sets. Runs on the caller's thread or on a
/// decoder thread beside the DiT; returns the time spent in `Session::run`.
pub(super) fn decode_blocks(
    v: &VaeBufs,
    latent_frame: &mut Session,
    vae_first: &mut Session,
    vae_step: &mut Session,
    blocks: Receiver<usize>,
    gate: &CaptureGate,
) -> Result<Duration, GenerateError> {
    let mem = device_memory_info(v.device).map_err(run_error("device setup"))?;
    let mut run = Duration::ZERO;
    for b in blocks {
        for f in 0..v.d.frames_per_block {
            // Not while the DiT captures a CUDA graph beside this thread (see `GraphCapture`).
            run +=
                gate.decode(|| decode_frame(v, &mem, latent_frame, vae_first, vae_step, b, f))?;
        }
    }
    Ok(run)
}

/// Decodes every block on the caller's thread, after the DiT; returns the time spent in
/// `Session::run`.
pub(super) fn decode_all(
    v: &VaeBufs,
    latent_frame: &mut Session,
    vae_first: &mut Session,
    vae_step: &mut Session,
    gate: &CaptureGate,
) -> Result<Duration, GenerateError> {
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    for b in 0..v.d.blocks() {
        let _ = tx.send(b);
    }
    drop(tx);
    decode_blocks(v, latent_frame, vae_first, vae_step, rx, gate)
}

/// Decodes latent frame `f` of block `b` into the video buffer: `latent_frame` (z = the frame's
/// latents · std + mean, in the bundle's type), then `vae_first` (the video's first latent frame)
/// or `vae_step` with the causal cache of the frame before. Returns the time spent in
/// `Session::run`.
fn decode_frame(
    v: &VaeBufs,
    mem: &MemoryInfo<'static>,
    latent_frame: &mut Session,
    vae_first: &mut Session,
    vae_step: &mut Session,
    b: usize,
    f: usize,
) -> Result<Duration, GenerateError> {
    let d = v.d;
    let view = |buf: &Buf, offset: usize, shape: &[i64]| {
        buf.view(mem, offset, shape)
            .map_err(run_error("device view"))
    };
    let z_shape = [1, d.channels as i64, 1, d.h as i64, d.w as i64];
    let t = b * d.frames_per_block + f;
    // Pixel frames before latent frame t: 1 for the first, `frames_per_step` for others.
    let next_frame = if t == 0 {
        0
    } else {
        1 + d.frames_per_step * (t - 1)
    };
    let mut run = Duration::ZERO;
    {
        let e = run_error("latent_frame");
        let mut binding = latent_frame.create_binding().map(Bound::new).map_err(e)?;
        let stat = [1, d.channels as i64, 1, 1, 1];
        binding
            .input(
                "lat",
                view(&v.latents, b * d.block_elems(), &d.block_shape())?,
            )
            .map_err(e)?;
        binding
            .input("idx", view(&v.indices, f, &[1])?)
            .map_err(e)?;
        binding.input("std", view(&v.std, 0, &stat)?).map_err(e)?;
        binding.input("mean", view(&v.mean, 0, &stat)?).map_err(e)?;
        binding.output("z", view(&v.z, 0, &z_shape)?).map_err(e)?;
        let start = Instant::now();
        latent_frame.run_binding(&binding.binding).map_err(e)?;
        run += start.elapsed();
    }
    let (graph, session, n) = if t == 0 {
        ("vae_first", vae_first, 1)
    } else {
        ("vae_step", vae_step, d.frames_per_step)
    };
    let e = run_error(graph);
    let mut binding = session.create_binding().map(Bound::new).map_err(e)?;
    binding.input("z", view(&v.z, 0, &z_shape)?).map_err(e)?;
    let (cache_in, cache_out) = (&v.cache[(t + 1) % 2], &v.cache[t % 2]);
    for (j, shape) in v.cache_shapes.iter().enumerate() {
        if t > 0 {
            binding
                .input(v.cache_in[j].as_str(), view(&cache_in[j], 0, shape)?)
                .map_err(e)?;
        }
        binding
            .output(v.cache_out[j].as_str(), view(&cache_out[j], 0, shape)?)
            .map_err(e)?;
    }
    let frames_shape = [1, 3, n as i64, d.height as i64, d.width as i64];
    binding
        .output(
            "frames",
            view(&v.video, 3 * next_frame * d.frame_px(), &frames_shape)?,
        )
        .map_err(e)?;
    let start = Instant::now();
    if t == 0 {
        run_and_shrink(session, &binding.binding, v.device).map_err(e)?;
    } else {
        session.run_binding(&binding.binding).map_err(e)?;
    }
    Ok(run + start.elapsed())
}

/// Clamp and uint8 layout of every decoder call's frames into `[frames, H, W, 3]`.
pub(super) fn layout_frames(
    v: &VaeBufs,
    layout: &mut Session,
    mem: &MemoryInfo<'static>,
    times: &mut PhaseTimes,
) -> Result<(), GenerateError> {
    let d = v.d;
    let e = run_error("layout");
    let mut next_frame = 0usize;
    for t in 0..d.latent_frames {
        let n = if t == 0 { 1 } else { d.frames_per_step };
        let mut binding = layout.create_binding().map(Bound::new).map_err(e)?;
        let offset = 3 * next_frame * d.frame_px();
        let shape_in = [1, 3, n as i64, d.height as i64, d.width as i64];
        let shape_out = [1, n as i64, d.height as i64, d.width as i64, 3];
        binding
            .input("frames", v.video.view(mem, offset, &shape_in).map_err(e)?)
            .map_err(e)?;
        binding
            .output("rgb", v.frames_u8.view(mem, offset, &shape_out).map_err(e)?)
            .map_err(e)?;
        let start = Instant::now();
        layout.run_binding(&binding.binding).map_err(e)?;
        times.session_run += start.elapsed();
        next_frame += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::bundle::Bundle;
    use crate::engine::session::float_type;

    /// The decoder's first run on zeros finds its inputs by name and shape: `vae_first` on a
    /// zero latent frame, then `vae_step` on that frame's causal cache (the tiny bundle, CPU), on
    /// the thread that built the decoder's sessions; its time is recorded apart from the build's,
    /// and is 0 when no run was made.
    #[test]
    fn the_decoder_runs_once_on_zeros_through_both_graphs() {
        let dir = tempfile::tempdir().unwrap();
        let tiny = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/tiny");
        let bundle = Bundle::open(&tiny, dir.path()).unwrap();
        let runtime = RuntimeOptions {
            intra_op_threads: Some(1),
            ..RuntimeOptions::default()
        };
        let model = float_type(bundle.manifest.precision);
        let dims = Dims::of(&bundle);
        let ran = std::sync::Mutex::new(None);
        let sessions = GraphSessions::build(&bundle, &runtime, false, |first, step| {
            *ran.lock().unwrap() = Some(warm_up(first, step, &dims, model, None));
            true
        })
        .unwrap();
        ran.into_inner()
            .unwrap()
            .expect("the run was made")
            .unwrap();
        let times = sessions.built_in;
        assert!(
            times.decoder_first_run_s > 0.0
                && times.decoder_first_run_s <= times.decoder_sessions_s,
            "{times:?}"
        );
        let sessions = GraphSessions::build(&bundle, &runtime, false, |_, _| false).unwrap();
        assert_eq!(sessions.built_in.decoder_first_run_s, 0.0);
    }
}

//! The generation loop with every tensor where the provider computes (on the GPU for the CUDA
//! provider): the same semantics as the host loop of [`super::generate`], but bound with
//! ONNX Runtime's IoBinding to buffers allocated once per `Generator`, so that nothing crosses the
//! PCIe bus inside the timed region.
//!
//! - The KV cache is one buffer per layer and kind; `past_*.{i}` are bound as views of its prefix
//!   (or of the window's suffix of it) and `new_*.{i}` as views straight after it; a graph that
//!   writes the cache in place ([`KvInterface::InPlace`]) takes `kv_*.{i}`, one view of the prefix
//!   and the block's rows after it. Every pass writes its keys and values there; only the
//!   clean-cache pass's survive, because the next block's prefix is extended only after it.
//! - The scheduler arithmetic between passes, the latent de-normalisation and the uint8 layout are
//!   the runner's own small graphs ([`super::onnx_graph`]) on the same provider.
//! - All noise of a prompt is drawn on the host before the timed region and uploaded in one copy,
//!   as the exporter's reference does.
//!
//! ONNX Runtime synchronises the device at the end of every `run`, so host clocks read after a run
//! are device-synchronised phase boundaries.
//!
//! The same code runs on the CPU provider (host memory "bound" in place), which is how the CPU tests
//! check it against the golden files.

use std::ffi::c_void;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use ort::AsPointer;
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, RunOptions, Session};
use ort::value::{
    DynTensor, DynTensorRefMut, DynTensorValueType, Tensor, TensorElementType, TensorRefMut,
};

use super::bundle::Bundle;
use super::generate::{
    Dims, GenerateError, GenerateOptions, HostContext, PhaseTimes, TimedRegionEnd, run_error,
};
use super::onnx_graph;
use super::schedule::{Emit, Schedule};
use super::session::{
    ContextInterface, GraphSessions, KvInterface, KvNames, Provider, RuntimeOptions,
    build_small_session, context_names, float_type, indexed_names, vae_cache_count,
};

type View = DynTensorRefMut<'static>;

fn elem_size(ty: TensorElementType) -> usize {
    match ty {
        TensorElementType::Float32 => 4,
        TensorElementType::Float16 | TensorElementType::Bfloat16 => 2,
        TensorElementType::Int64 => 8,
        TensorElementType::Uint8 => 1,
        other => unreachable!("the device loop uses no {other:?} buffers"),
    }
}

/// One allocation on the device, and typed views into it.
struct Buf {
    tensor: DynTensor,
    ty: TensorElementType,
    len: usize,
}

impl Buf {
    fn new(alloc: &Allocator, ty: TensorElementType, len: usize) -> ort::Result<Self> {
        // A zero-length allocation has no pointer; keep every buffer at least one element long.
        let tensor = DynTensor::new(alloc, ty, [len.max(1)])?;
        Ok(Self { tensor, ty, len })
    }

    /// A tensor over `shape` starting `offset` elements into the buffer.
    fn view(&self, mem: &MemoryInfo<'static>, offset: usize, shape: &[i64]) -> ort::Result<View> {
        let count: i64 = shape.iter().product();
        assert!(
            offset + count as usize <= self.len.max(1),
            "view {offset}+{count} past a buffer of {}",
            self.len
        );
        let base = self.tensor.data_ptr().cast::<u8>().cast_mut();
        // SAFETY: the view lies inside the allocation (checked above), the allocation is owned by
        // the device loop and outlives every binding made from it (bindings are cleared or
        // dropped with the loop), and views are only handed to ONNX Runtime.
        let ptr = unsafe { base.add(offset * elem_size(self.ty)) }.cast::<c_void>();
        let shape = ort::value::Shape::new(shape.iter().copied());
        unsafe {
            Ok(match self.ty {
                TensorElementType::Float32 => {
                    TensorRefMut::<f32>::from_raw(mem.clone(), ptr.cast(), shape)?
                        .into_dyn()
                        .downcast::<DynTensorValueType>()?
                }
                TensorElementType::Float16 => {
                    TensorRefMut::<half::f16>::from_raw(mem.clone(), ptr.cast(), shape)?
                        .into_dyn()
                        .downcast::<DynTensorValueType>()?
                }
                TensorElementType::Bfloat16 => {
                    TensorRefMut::<half::bf16>::from_raw(mem.clone(), ptr.cast(), shape)?
                        .into_dyn()
                        .downcast::<DynTensorValueType>()?
                }
                TensorElementType::Int64 => {
                    TensorRefMut::<i64>::from_raw(mem.clone(), ptr.cast(), shape)?
                        .into_dyn()
                        .downcast::<DynTensorValueType>()?
                }
                TensorElementType::Uint8 => {
                    TensorRefMut::<u8>::from_raw(mem.clone(), ptr.cast(), shape)?
                        .into_dyn()
                        .downcast::<DynTensorValueType>()?
                }
                other => unreachable!("no {other:?} views"),
            })
        }
    }

    /// Copies host data into the start of the buffer (outside the timed region), through the
    /// runner's identity graph: ONNX Runtime copies a host input to the device itself.
    /// (ort's `copy_into` was seen to hang on its shared identity sessions.)
    fn upload<T: ort::value::PrimitiveTensorElementType + Clone + std::fmt::Debug + 'static>(
        &self,
        identity: &mut Session,
        mem: &MemoryInfo<'static>,
        data: &[T],
    ) -> ort::Result<()> {
        let host = Tensor::from_array(([data.len()], data.to_vec().into_boxed_slice()))?;
        let mut binding = Bound::new(identity.create_binding()?);
        binding.binding.bind_input("x", &host)?;
        binding.output("y", self.view(mem, 0, &[data.len() as i64])?)?;
        identity.run_binding(&binding.binding)?;
        Ok(())
    }

    /// Copies the first `len` elements to the host (outside the timed region).
    fn download<T: ort::value::PrimitiveTensorElementType + Clone + std::fmt::Debug + 'static>(
        &self,
        identity: &mut Session,
        mem: &MemoryInfo<'static>,
        len: usize,
    ) -> ort::Result<Vec<T>> {
        let mut host = DynTensor::new(&Allocator::default(), self.ty, [len])?;
        let mut binding = Bound::new(identity.create_binding()?);
        binding.input("x", self.view(mem, 0, &[len as i64])?)?;
        binding.binding.bind_output("y", &mut host)?;
        identity.run_binding(&binding.binding)?;
        drop(binding);
        let (_, data) = host.try_extract_tensor::<T>()?;
        Ok(data.to_vec())
    }
}

/// An IoBinding and the views bound to it, kept alive as long as the binding may use them.
///
/// Inputs are bound through the C API rather than `IoBinding::bind_input`: ort deep-copies a
/// borrowed tensor there (through an identity session) to rule out aliasing, which for the device
/// loop would copy the KV cache on every bind. Here the loop owns every buffer and no output of a
/// run overlaps one of its inputs.
struct Bound {
    binding: IoBinding,
    held: Vec<View>,
}

impl Bound {
    fn new(binding: IoBinding) -> Self {
        Self {
            binding,
            held: Vec::new(),
        }
    }

    fn input(&mut self, name: &str, value: View) -> ort::Result<()> {
        let name = std::ffi::CString::new(name).expect("graph names have no NUL");
        // SAFETY: both pointers are valid; the value is kept in `held` for the binding's life.
        let status =
            unsafe { (ort::api().BindInput)(self.binding.ptr_mut(), name.as_ptr(), value.ptr()) };
        self.held.push(value);
        status_result(status)
    }

    fn output(&mut self, name: &str, value: View) -> ort::Result<()> {
        self.binding.bind_output(name, value)
    }
}

fn status_result(status: ort::sys::OrtStatusPtr) -> ort::Result<()> {
    if status.0.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null status is a valid OrtStatus that we own and release once.
    let message = unsafe {
        let text = std::ffi::CStr::from_ptr((ort::api().GetErrorMessage)(status.0))
            .to_string_lossy()
            .into_owned();
        (ort::api().ReleaseStatus)(status.0);
        text
    };
    Err(ort::Error::new(message))
}

/// The runner's small graphs.
struct SmallGraphs {
    /// `axpby` with `q` in float32 (noise, x0).
    axpby_f32: Session,
    /// `axpby` with `q` in the bundle's float type (the DiT's flow).
    axpby_model: Session,
    /// `Identity` per element type, for host ↔ device copies.
    identity_f32: Session,
    identity_i64: Session,
    identity_u8: Session,
    /// `Identity` in the bundle's float type (text contexts encoded ahead).
    identity_model: Session,
}

/// Coefficient pairs (a, b) of [`onnx_graph::axpby`] used by one schedule, uploaded once per
/// prompt: index `2k` holds a, `2k + 1` holds b.
struct Coefficients {
    values: Vec<f32>,
}

impl Coefficients {
    fn push(&mut self, a: f32, b: f32) -> usize {
        self.values.push(a);
        self.values.push(b);
        self.values.len() / 2 - 1
    }
}

/// Indices into the coefficient table for one schedule.
struct Plan {
    /// (1, 0): a copy.
    copy: usize,
    /// Per step j: (1, −σ_j), giving x0.
    x0: Vec<usize>,
    /// Per step j > 0: (1 − σ_j, σ_j), the re-noising to step j.
    renoise: Vec<usize>,
    /// (1 − σ_c, σ_c), the re-noising to the clean-cache level.
    clean: usize,
    /// (1, −σ_c), the clean-cache pass's x0.
    clean_x0: usize,
}

fn plan(schedule: &Schedule) -> (Coefficients, Plan) {
    let mut c = Coefficients { values: Vec::new() };
    let copy = c.push(1.0, 0.0);
    let x0 = schedule
        .steps
        .iter()
        .map(|l| c.push(1.0, -l.sigma))
        .collect();
    let renoise = schedule
        .steps
        .iter()
        .map(|l| c.push(1.0 - l.sigma, l.sigma))
        .collect();
    let sc = schedule.clean.sigma;
    let clean = c.push(1.0 - sc, sc);
    let clean_x0 = c.push(1.0, -sc);
    (
        c,
        Plan {
            copy,
            x0,
            renoise,
            clean,
            clean_x0,
        },
    )
}

/// The device-resident state of a generator.
pub(crate) struct DeviceLoop {
    mem: MemoryInfo<'static>,
    alloc: Allocator,
    d: Dims,
    graphs: SmallGraphs,
    kv_k: Vec<Buf>,
    kv_v: Vec<Buf>,
    /// Where the last block's passes write their keys and values (`[keys, values]`).
    kv_scratch: [Buf; 2],
    context: Buf,
    /// With [`ContextInterface::KeysValues`], every layer's cross-attention keys and values of
    /// the prompt (`[ctx_k.{i}, ctx_v.{i}]`, `dit_context`'s outputs, once per prompt); empty
    /// when the DiT takes `context` itself.
    context_kv: Vec<[Buf; 2]>,
    context_names: Vec<[String; 2]>,
    /// Latents of the block being denoised, float32, and the same in the bundle's type.
    x: Buf,
    x_model: Buf,
    x0: Buf,
    flow: Buf,
    /// Outputs nobody reads (the `y_model` of updates whose result stays float32).
    scratch: Buf,
    noise: Buf,
    coefficients: Buf,
    timesteps: Buf,
    offsets: Buf,
    /// The decoder's sessions and buffers; taken out of the loop while a prompt runs, so that a
    /// decoder thread can hold them while the DiT runs on the caller's thread.
    vae: Option<VaeParts>,
    /// Decode each block while the DiT generates the next.
    overlap_vae: bool,
    /// CUDA graphs of the DiT's session, one per block shape (`runtime.cuda_graphs`).
    capture: Option<GraphCapture>,
    names: KvNames,
    /// Peak device memory reader (CUDA runtime), when the provider is on a GPU.
    memory: Option<super::cuda_memory::MemoryProbe>,
}

/// The DiT's CUDA graphs (ONNX Runtime's `enable_cuda_graph`, in the DiT's session only).
///
/// ONNX Runtime replays a captured graph with the addresses and shapes of its capture. Every pass
/// of a block binds the same views (the KV cache's prefix and the block's rows, `x`, `flow`, the
/// context's keys and values, the block's frame offset) and its timestep is copied into one
/// buffer before the pass, so one graph per block shape serves all its passes, in every prompt.
/// A shape's first two passes run as usual (`gpu_graph_id = -1`): the first sizes the arena, the
/// second allocates ONNX Runtime's memory pattern, so the capture (the third) allocates nothing
/// new; later passes replay it.
///
/// ONNX Runtime captures in CUDA's global mode, in which another thread's allocation or
/// synchronisation breaks the capture: a capturing pass and the decoder beside the DiT take turns
/// through a [`CaptureGate`], so the decoder waits out the seven captures of a process's first
/// prompt and runs beside every other pass.
struct GraphCapture {
    ids: GraphIds,
    /// The timestep of the pass being run, `[1, frames_per_block]` float32, at one address.
    timestep: Buf,
}

/// Which graph each pass of the DiT runs as.
#[derive(Default, Debug)]
struct GraphIds {
    /// The block shapes seen, each with the passes run so far with it; a shape's graph id is its
    /// position here plus one (0 is ONNX Runtime's default id, -1 a plain run).
    shapes: Vec<(BlockShape, u32)>,
    /// Set when a buffer of the DiT's arena was reallocated after a capture: the chunks a graph
    /// captured may now hold that buffer, so no graph is replayed again.
    stale: bool,
}

/// What distinguishes one block's DiT binding from another's.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct BlockShape {
    block: usize,
    past_start: usize,
    kv_len: usize,
}

/// Regular runs of a block shape before its capture (see [`GraphCapture`]).
const RUNS_BEFORE_CAPTURE: u32 = 2;

impl GraphIds {
    /// The `gpu_graph_id` of the next pass with this shape: -1 (a plain run) for its first
    /// passes or when the graphs went stale, else the shape's graph; and whether that pass
    /// captures it (its first use).
    fn next_id(&mut self, shape: BlockShape) -> (i32, bool) {
        if self.stale {
            return (-1, false);
        }
        let index = match self.shapes.iter().position(|(s, _)| *s == shape) {
            Some(index) => index,
            None => {
                self.shapes.push((shape, 0));
                self.shapes.len() - 1
            }
        };
        let runs = &mut self.shapes[index].1;
        *runs = runs.saturating_add(1);
        if *runs <= RUNS_BEFORE_CAPTURE {
            (-1, false)
        } else {
            (index as i32 + 1, *runs == RUNS_BEFORE_CAPTURE + 1)
        }
    }
}

/// Turns between the DiT's capturing passes and the decoder's runs (see [`GraphCapture`]): a
/// capture waits for the decoder's run in progress, and a decoder run waits while a capture is
/// wanted or under way, so a capture waits for one decoder run at most (a plain mutex lets the
/// decoder take it back run after run).
#[derive(Default)]
struct CaptureGate {
    state: std::sync::Mutex<GateState>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct GateState {
    /// A capture asked for its turn, or has it.
    capture: bool,
    /// A decoder run is under way.
    decoding: bool,
}

impl CaptureGate {
    fn wait_while<'a>(
        &'a self,
        state: std::sync::MutexGuard<'a, GateState>,
        busy: impl Fn(&GateState) -> bool,
    ) -> std::sync::MutexGuard<'a, GateState> {
        self.changed
            .wait_while(state, |s| busy(s))
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` as a capture: after the decoder's run in progress, with no decoder run beside it.
    fn capture<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut state = self.lock();
        state.capture = true;
        drop(self.wait_while(state, |s| s.decoding));
        let _turn = Turn(self, |s: &mut GateState| s.capture = false);
        f()
    }

    /// Runs `f` as a decoder run: when no capture is wanted or under way.
    fn decode<T>(&self, f: impl FnOnce() -> T) -> T {
        let state = self.lock();
        self.wait_while(state, |s| s.capture).decoding = true;
        let _turn = Turn(self, |s: &mut GateState| s.decoding = false);
        f()
    }
}

/// Ends a turn of the [`CaptureGate`] when dropped, also when the turn's work panics, so that the
/// other thread never waits for a turn that will not end.
struct Turn<'a, F: Fn(&mut GateState)>(&'a CaptureGate, F);

impl<F: Fn(&mut GateState)> Drop for Turn<'_, F> {
    fn drop(&mut self) {
        (self.1)(&mut self.0.lock());
        self.0.changed.notify_all();
    }
}

/// What the VAE decoder needs: its own small-graph sessions and buffers read through views.
struct VaeParts {
    latent_frame: Session,
    layout: Session,
    bufs: VaeBufs,
}

struct VaeBufs {
    /// Final latents, block after block: `[blocks][1, C, F, h, w]`, float32 (written by the
    /// DiT side, read by the decoder once the block's index was handed over).
    latents: Buf,
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
    frames_u8: Buf,
    d: Dims,
    /// The CUDA device, or `None` on the CPU (a decoder thread makes its own `MemoryInfo`).
    device: Option<i32>,
}

/// Where the loop's buffers live: the CUDA device, or host memory for the CPU provider.
fn device_memory_info(device: Option<i32>) -> ort::Result<MemoryInfo<'static>> {
    match device {
        Some(id) => MemoryInfo::new(
            AllocationDevice::CUDA,
            id,
            AllocatorType::Device,
            MemoryType::Default,
        ),
        None => MemoryInfo::new(
            AllocationDevice::CPU,
            0,
            AllocatorType::Device,
            MemoryType::Default,
        ),
    }
}

/// Runs a session that runs once per prompt (`vae_first`). On a GPU the run
/// hands the session's free arena memory back to CUDA at its end
/// (`memory.enable_memory_arena_shrinkage`): the arena would otherwise keep its peak for the whole
/// process.
fn run_once_per_prompt(
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

/// Results of one prompt on the device loop, copied to the host.
pub(crate) struct DeviceOutput {
    pub latents: Vec<f32>,
    pub frames: Vec<u8>,
    pub times: PhaseTimes,
    pub end: TimedRegionEnd,
    pub peak_device_memory: Option<u64>,
}

impl DeviceLoop {
    pub(crate) fn new(
        bundle: &Bundle,
        sessions: &GraphSessions,
        runtime: &RuntimeOptions,
    ) -> Result<Self, GenerateError> {
        let m = &bundle.manifest;
        let d = Dims::of(bundle);
        let model = float_type(m.precision);
        let setup = run_error("device setup");
        let on_gpu = !matches!(runtime.provider, Provider::Cpu);
        let device_id = match &runtime.provider {
            Provider::Cuda(c) => Some(c.device_id),
            Provider::TensorRt(t) => Some(t.device_id),
            Provider::Cpu => None,
        };
        let (mem, alloc) = if on_gpu {
            let mem = device_memory_info(device_id).map_err(setup)?;
            let alloc = Allocator::new(&sessions.dit, mem.clone()).map_err(setup)?;
            (mem, alloc)
        } else {
            let mem = device_memory_info(None).map_err(setup)?;
            (mem, Allocator::default())
        };

        let small = |name: &str, bytes: Vec<u8>| build_small_session(name, &bytes, runtime);
        let graphs = SmallGraphs {
            axpby_f32: small(
                "axpby_f32",
                onnx_graph::axpby(TensorElementType::Float32, model),
            )?,
            axpby_model: small("axpby_model", onnx_graph::axpby(model, model))?,
            identity_f32: small(
                "identity_f32",
                onnx_graph::identity(TensorElementType::Float32),
            )?,
            identity_i64: small(
                "identity_i64",
                onnx_graph::identity(TensorElementType::Int64),
            )?,
            identity_u8: small(
                "identity_u8",
                onnx_graph::identity(TensorElementType::Uint8),
            )?,
            identity_model: small("identity_model", onnx_graph::identity(model))?,
        };

        let f32_ = TensorElementType::Float32;
        let buf = |ty, len| Buf::new(&alloc, ty, len).map_err(setup);
        // No later block reads the last block's keys and values: with a graph that outputs them
        // (`KvInterface::PastAndNew`) the cache holds the blocks before it, and the last block's
        // passes write theirs into two scratch buffers shared by all layers (a layer's new keys
        // are read by its own attention before the next layer writes; keys and values have one
        // scratch each). A graph that writes them in place reads them from the cache, straight
        // after the earlier blocks': the cache holds every block.
        let in_place = sessions.kv_interface == KvInterface::InPlace;
        let cached_blocks = if in_place { d.blocks() } else { d.blocks() - 1 };
        let cache_len = cached_blocks * d.block_tokens() * d.dim;
        let scratch_len = if in_place {
            1
        } else {
            d.block_tokens() * d.dim
        };
        let mut kv_k = Vec::with_capacity(d.layers);
        let mut kv_v = Vec::with_capacity(d.layers);
        for _ in 0..d.layers {
            kv_k.push(buf(model, cache_len.max(1))?);
            kv_v.push(buf(model, cache_len.max(1))?);
        }
        let kv_scratch = [buf(model, scratch_len)?, buf(model, scratch_len)?];
        let block = d.block_elems();
        // Sized for the default schedule (4 steps + the clean pass); `generate` grows them.
        let draws_per_block = 5;
        let caches = vae_cache_count(&sessions.vae_first);
        let mut vae_cache_shapes = Vec::with_capacity(caches);
        for j in 0..caches {
            let name = format!("cache_out.{j}");
            let outlet = sessions
                .vae_first
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
            vae_cache_shapes.push(shape);
        }
        let cache_set = |_: usize| -> Result<Vec<Buf>, GenerateError> {
            vae_cache_shapes
                .iter()
                .map(|s| buf(model, s.iter().product::<i64>() as usize))
                .collect()
        };
        let vae_cache = [cache_set(0)?, cache_set(1)?];
        let frame_elems = 3 * d.video_frames() * d.frame_px();
        let context_kv = match sessions.context_interface() {
            ContextInterface::Text => Vec::new(),
            ContextInterface::KeysValues => (0..d.layers)
                .map(|_| {
                    Ok([
                        buf(model, d.text_len * d.dim)?,
                        buf(model, d.text_len * d.dim)?,
                    ])
                })
                .collect::<Result<_, GenerateError>>()?,
        };
        let mut this = Self {
            kv_k,
            kv_v,
            kv_scratch,
            context: buf(model, d.text_len * d.text_dim)?,
            context_kv,
            context_names: context_names(d.layers),
            x: buf(f32_, block)?,
            x_model: buf(model, block)?,
            x0: buf(f32_, block)?,
            flow: buf(model, block)?,
            scratch: buf(model, block)?,
            noise: buf(f32_, d.blocks() * draws_per_block * block)?,
            coefficients: buf(f32_, 64)?,
            timesteps: buf(f32_, 16 * d.frames_per_block)?,
            offsets: buf(TensorElementType::Int64, d.blocks())?,
            vae: Some(VaeParts {
                latent_frame: small("latent_frame", onnx_graph::latent_frame(model))?,
                layout: small("layout", onnx_graph::layout(model))?,
                bufs: VaeBufs {
                    latents: buf(f32_, d.blocks() * block)?,
                    indices: buf(TensorElementType::Int64, d.frames_per_block)?,
                    std: buf(f32_, d.channels)?,
                    mean: buf(f32_, d.channels)?,
                    z: buf(model, d.channels * d.h * d.w)?,
                    video: buf(model, frame_elems)?,
                    cache: vae_cache,
                    cache_shapes: vae_cache_shapes,
                    cache_in: indexed_names("cache_in", caches),
                    cache_out: indexed_names("cache_out", caches),
                    frames_u8: buf(TensorElementType::Uint8, frame_elems)?,
                    d,
                    device: device_id,
                },
            }),
            overlap_vae: runtime.overlap_vae,
            capture: if runtime.cuda_graphs() {
                Some(GraphCapture {
                    ids: GraphIds::default(),
                    timestep: buf(f32_, d.frames_per_block)?,
                })
            } else {
                None
            },
            names: KvNames::new(sessions.kv_interface, d.layers),
            memory: if on_gpu {
                super::cuda_memory::MemoryProbe::open()
            } else {
                None
            },
            graphs,
            mem,
            alloc,
            d,
        };
        // Constants of the bundle: offsets, frame indices, latent statistics.
        let offsets: Vec<i64> = (0..d.blocks())
            .map(|b| (b * d.frames_per_block) as i64)
            .collect();
        let g = &mut this.graphs;
        this.offsets
            .upload(&mut g.identity_i64, &this.mem, &offsets)
            .map_err(setup)?;
        let indices: Vec<i64> = (0..d.frames_per_block as i64).collect();
        let vae = &this.vae.as_ref().expect("just built").bufs;
        vae.indices
            .upload(&mut g.identity_i64, &this.mem, &indices)
            .map_err(setup)?;
        vae.std
            .upload(&mut g.identity_f32, &this.mem, &m.latent.std)
            .map_err(setup)?;
        vae.mean
            .upload(&mut g.identity_f32, &this.mem, &m.latent.mean)
            .map_err(setup)?;
        if let Some(bytes) = this.memory.as_ref().and_then(|m| m.in_use()) {
            eprintln!(
                "device memory in use after loading the graphs and the loop's buffers: {:.2} GiB",
                bytes as f64 / (1u64 << 30) as f64
            );
        }
        Ok(this)
    }

    fn view(&self, b: &Buf, offset: usize, shape: &[i64]) -> Result<View, GenerateError> {
        b.view(&self.mem, offset, shape)
            .map_err(run_error("device view"))
    }

    /// `out = a·p + b·q` (and its bundle-typed copy into `out_model`).
    #[allow(clippy::too_many_arguments)]
    fn axpby(
        &mut self,
        q_is_model: bool,
        p: (&Buf, usize),
        q: (&Buf, usize),
        coefficient: usize,
        out: (&Buf, usize),
        out_model: (&Buf, usize),
        times: &mut PhaseTimes,
    ) -> Result<(), GenerateError> {
        let e = run_error("axpby");
        let n = self.d.block_elems() as i64;
        let one = [1i64];
        let mut binding = if q_is_model {
            self.graphs.axpby_model.create_binding().map(Bound::new)
        } else {
            self.graphs.axpby_f32.create_binding().map(Bound::new)
        }
        .map_err(e)?;
        binding.input("p", self.view(p.0, p.1, &[n])?).map_err(e)?;
        binding.input("q", self.view(q.0, q.1, &[n])?).map_err(e)?;
        binding
            .input("a", self.view(&self.coefficients, 2 * coefficient, &one)?)
            .map_err(e)?;
        binding
            .input(
                "b",
                self.view(&self.coefficients, 2 * coefficient + 1, &one)?,
            )
            .map_err(e)?;
        binding
            .output("y", self.view(out.0, out.1, &[n])?)
            .map_err(e)?;
        binding
            .output("y_model", self.view(out_model.0, out_model.1, &[n])?)
            .map_err(e)?;
        let session = if q_is_model {
            &mut self.graphs.axpby_model
        } else {
            &mut self.graphs.axpby_f32
        };
        let start = Instant::now();
        session.run_binding(&binding.binding).map_err(e)?;
        times.session_run += start.elapsed();
        Ok(())
    }

    /// Generates one prompt from its text context (encoded on the host, in `encoding`).
    pub(crate) fn generate(
        &mut self,
        sessions: &mut GraphSessions,
        context: &HostContext,
        encoding: Duration,
        noise: &(dyn Fn(u32, &mut [f32]) + Sync),
        schedule: &Schedule,
        options: &GenerateOptions,
    ) -> Result<DeviceOutput, GenerateError> {
        let mut vae = self.vae.take().ok_or_else(|| GenerateError::Run {
            graph: "device loop",
            message: "the decoder state was lost by an earlier panic".into(),
        })?;
        // Outside the timed region, like the noise and tables `generate_with` uploads.
        self.upload_context(context)?;
        let result = self
            .generate_with(&mut vae, sessions, noise, schedule, options)
            .map(|mut out| {
                out.times.text_encoding = encoding;
                out
            });
        self.vae = Some(vae);
        if self.memory.is_some() {
            log_arenas(sessions, &self.mem);
        }
        result
    }

    fn generate_with(
        &mut self,
        vae: &mut VaeParts,
        sessions: &mut GraphSessions,
        noise: &(dyn Fn(u32, &mut [f32]) + Sync),
        schedule: &Schedule,
        options: &GenerateOptions,
    ) -> Result<DeviceOutput, GenerateError> {
        let d = self.d;
        let method = &options.method;
        let mut times = PhaseTimes::default();
        let setup = run_error("device upload");

        // --- Outside the timed region: noise, tables. ---

        let steps = schedule.steps.len();
        let draws = schedule.draws_per_block() as usize;
        let block = d.block_elems();
        let total_draws = d.blocks() * draws;
        // Tables sized for the default schedule; a longer one gets larger buffers once.
        let grow =
            |buf: &mut Buf, ty, len: usize, alloc: &Allocator| -> Result<bool, GenerateError> {
                if buf.len < len {
                    *buf = Buf::new(alloc, ty, len).map_err(run_error("device setup"))?;
                    return Ok(true);
                }
                Ok(false)
            };
        let f32_ = TensorElementType::Float32;
        let grown = grow(&mut self.noise, f32_, total_draws * block, &self.alloc)?
            | grow(
                &mut self.coefficients,
                f32_,
                2 * (2 * steps + 3),
                &self.alloc,
            )?
            | grow(
                &mut self.timesteps,
                f32_,
                (steps + 1) * d.frames_per_block,
                &self.alloc,
            )?;
        if let Some(GraphCapture { ids, .. }) = &mut self.capture
            && grown
            && !ids.shapes.is_empty()
            && !ids.stale
        {
            ids.stale = true;
            eprintln!(
                "warning: the schedule outgrew the loop's buffers after the DiT's CUDA graphs were \
                 captured; this process runs the DiT without them from now on"
            );
        }
        let mut host_noise = vec![0.0f32; total_draws * block];
        {
            use rayon::prelude::*;
            host_noise
                .par_chunks_mut(block)
                .enumerate()
                .for_each(|(draw, chunk)| noise(draw as u32, chunk));
        }
        self.noise
            .upload(&mut self.graphs.identity_f32, &self.mem, &host_noise)
            .map_err(setup)?;
        let (coefficients, plan) = plan(schedule);
        self.coefficients
            .upload(
                &mut self.graphs.identity_f32,
                &self.mem,
                &coefficients.values,
            )
            .map_err(setup)?;
        // Timesteps: per step level, then the clean level, `fpb` values each.
        let mut ts = Vec::with_capacity((steps + 1) * d.frames_per_block);
        for level in schedule.steps.iter().chain([&schedule.clean]) {
            ts.extend(std::iter::repeat_n(level.timestep, d.frames_per_block));
        }
        self.timesteps
            .upload(&mut self.graphs.identity_f32, &self.mem, &ts)
            .map_err(setup)?;

        // --- The timed region. ---
        let timed_start = Instant::now();
        let GraphSessions {
            dit,
            dit_context,
            vae_first,
            vae_step,
            ..
        } = sessions;
        if let Some(session) = dit_context {
            self.context_keys_values(session, &mut times)?;
        }
        let VaeParts {
            latent_frame,
            layout,
            bufs,
        } = vae;
        let bufs: &VaeBufs = bufs;
        let overlap = self.overlap_vae && !options.latents_only;
        // Turns between a DiT pass that captures a CUDA graph and the decoder's runs.
        let gate = CaptureGate::default();
        let gate = &gate;
        let (dit_result, dit_end, decoded) = std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel::<usize>();
            let decoder = if overlap {
                let (lf, first, step) = (&mut *latent_frame, &mut *vae_first, &mut *vae_step);
                Some(scope.spawn(move || decode_blocks(bufs, lf, first, step, rx, gate)))
            } else {
                None
            };
            let dit_result = self.denoise(
                dit,
                gate,
                &bufs.latents,
                schedule,
                &plan,
                method,
                draws,
                &mut times,
                &mut |b| {
                    if overlap {
                        // A closed channel means the decoder failed; its error is reported below.
                        let _ = tx.send(b);
                    }
                },
            );
            drop(tx);
            let dit_end = Instant::now();
            let decoded = decoder.map(|h| h.join().expect("the VAE decoder thread panicked"));
            (dit_result, dit_end, decoded)
        });
        dit_result?;
        times.dit = dit_end - timed_start;

        let end = if options.latents_only {
            times.timed_total = times.dit;
            TimedRegionEnd::AfterLatents
        } else {
            // With the overlap, what is left of the decode after the DiT's last block; otherwise
            // the whole decode, here on this thread.
            let decode_run = match decoded {
                Some(result) => result?,
                None => {
                    let (tx, rx) = std::sync::mpsc::channel::<usize>();
                    for b in 0..d.blocks() {
                        let _ = tx.send(b);
                    }
                    drop(tx);
                    decode_blocks(bufs, latent_frame, vae_first, vae_step, rx, gate)?
                }
            };
            times.session_run += decode_run;
            let vae_end = Instant::now();
            times.vae = vae_end - dit_end;
            layout_frames(bufs, layout, &self.mem, &mut times)?;
            let layout_end = Instant::now();
            times.layout = layout_end - vae_end;
            if options.exclude_final_output_layout {
                times.timed_total = vae_end - timed_start;
                TimedRegionEnd::AfterVaeOutput
            } else {
                times.timed_total = layout_end - timed_start;
                TimedRegionEnd::AfterLayout
            }
        };
        let peak_device_memory = self.memory.as_ref().and_then(|m| m.in_use());

        // --- After the timed region: copies to the host. ---
        let down = run_error("device download");
        let blocks_f32: Vec<f32> = bufs
            .latents
            .download(&mut self.graphs.identity_f32, &self.mem, d.blocks() * block)
            .map_err(down)?;
        // [blocks][C][F][h][w] → [C][latent_frames][h][w].
        let plane = d.h * d.w;
        let mut latents = vec![0.0f32; blocks_f32.len()];
        for b in 0..d.blocks() {
            for c in 0..d.channels {
                for f in 0..d.frames_per_block {
                    let src =
                        &blocks_f32[b * block + (c * d.frames_per_block + f) * plane..][..plane];
                    let t = b * d.frames_per_block + f;
                    latents[(c * d.latent_frames + t) * plane..][..plane].copy_from_slice(src);
                }
            }
        }
        let frames = if options.latents_only {
            Vec::new()
        } else {
            bufs.frames_u8
                .download(&mut self.graphs.identity_u8, &self.mem, bufs.frames_u8.len)
                .map_err(down)?
        };
        Ok(DeviceOutput {
            latents,
            frames,
            times,
            end,
            peak_device_memory,
        })
    }

    /// The block loop: denoising steps, the clean-cache pass, the block's output latents.
    #[allow(clippy::too_many_arguments)]
    fn denoise(
        &mut self,
        dit: &mut Session,
        gate: &CaptureGate,
        latents: &Buf,
        schedule: &Schedule,
        plan: &Plan,
        method: &super::schedule::MethodSettings,
        draws: usize,
        times: &mut PhaseTimes,
        on_block: &mut dyn FnMut(usize),
    ) -> Result<(), GenerateError> {
        let d = self.d;
        let steps = schedule.steps.len();
        let block = d.block_elems();
        for (b, shape) in self.block_shapes(method).into_iter().enumerate() {
            let mut binding = self.dit_binding(dit, shape)?;
            let noise_at = |k: usize| (b * draws + k) * block;
            // x = ε_0 (and its bundle-typed copy for the DiT).
            let (x, xm, x0, flow, scratch, nz) = (
                &self.x as *const Buf,
                &self.x_model as *const Buf,
                &self.x0 as *const Buf,
                &self.flow as *const Buf,
                &self.scratch as *const Buf,
                &self.noise as *const Buf,
            );
            // SAFETY: the buffers are fields of `self` that `axpby` only reads through views; the
            // raw pointers only sidestep borrowing `self` mutably (for the session) and immutably
            // (for the buffers) in the same call.
            let (x, xm, x0, flow, scratch, nz) =
                unsafe { (&*x, &*xm, &*x0, &*flow, &*scratch, &*nz) };
            self.axpby(
                false,
                (nz, noise_at(0)),
                (nz, noise_at(0)),
                plan.copy,
                (x, 0),
                (xm, 0),
                times,
            )?;
            for j in 0..steps {
                self.dit_pass(dit, &mut binding, shape, gate, j, times)?;
                self.axpby(
                    true,
                    (x, 0),
                    (flow, 0),
                    plan.x0[j],
                    (x0, 0),
                    (scratch, 0),
                    times,
                )?;
                if j + 1 < steps {
                    self.axpby(
                        false,
                        (x0, 0),
                        (nz, noise_at(j + 1)),
                        plan.renoise[j + 1],
                        (x, 0),
                        (xm, 0),
                        times,
                    )?;
                }
            }
            // The clean-cache pass fills the KV cache for later blocks; after the last block it
            // only matters when its output is what the block emits.
            let last = b + 1 == d.blocks();
            if !last || method.emit == Emit::CachePass {
                self.axpby(
                    false,
                    (x0, 0),
                    (nz, noise_at(steps)),
                    plan.clean,
                    (x, 0),
                    (xm, 0),
                    times,
                )?;
                self.dit_pass(dit, &mut binding, shape, gate, steps, times)?;
            }
            match method.emit {
                Emit::CachePass => self.axpby(
                    true,
                    (x, 0),
                    (flow, 0),
                    plan.clean_x0,
                    (latents, b * block),
                    (scratch, 0),
                    times,
                )?,
                Emit::Denoised => self.axpby(
                    false,
                    (x0, 0),
                    (x0, 0),
                    plan.copy,
                    (latents, b * block),
                    (scratch, 0),
                    times,
                )?,
            }
            // The block's latents are final on the device (the run has synchronised): hand it
            // to the decoder.
            on_block(b);
        }
        Ok(())
    }

    /// Runs `dit_context` on the prompt's context into the loop's buffers of the cross-attention
    /// keys and values (the first DiT work of the timed region, once per prompt).
    fn context_keys_values(
        &self,
        session: &mut Session,
        times: &mut PhaseTimes,
    ) -> Result<(), GenerateError> {
        let e = run_error("dit_context");
        let mut binding = session.create_binding().map(Bound::new).map_err(e)?;
        binding.input("context", self.context_view()?).map_err(e)?;
        for (name, view) in self.context_kv_views()? {
            binding.output(name, view).map_err(e)?;
        }
        let start = Instant::now();
        session.run_binding(&binding.binding).map_err(e)?;
        times.session_run += start.elapsed();
        Ok(())
    }

    /// The prompt's text context `[1, text_len, text_dim]`.
    fn context_view(&self) -> Result<View, GenerateError> {
        let d = self.d;
        self.view(&self.context, 0, &[1, d.text_len as i64, d.text_dim as i64])
    }

    /// The context's keys and values `[1, text_len, D]` by name: `dit_context`'s outputs and the
    /// DiT's inputs (none when the DiT takes the context itself).
    fn context_kv_views(&self) -> Result<Vec<(&str, View)>, GenerateError> {
        let shape = [1, self.d.text_len as i64, self.d.dim as i64];
        let mut views = Vec::with_capacity(2 * self.context_kv.len());
        for (names, bufs) in self.context_names.iter().zip(&self.context_kv) {
            for (name, buf) in names.iter().zip(bufs) {
                views.push((name.as_str(), self.view(buf, 0, &shape)?));
            }
        }
        Ok(views)
    }

    /// Copies a prompt's context into the loop's context buffer.
    fn upload_context(&mut self, context: &HostContext) -> Result<(), GenerateError> {
        let (identity, mem) = (&mut self.graphs.identity_model, &self.mem);
        let e = run_error("context upload");
        match context {
            HostContext::F32(v) => self.context.upload(identity, mem, v),
            HostContext::F16(v) => self.context.upload(identity, mem, v),
            HostContext::Bf16(v) => self.context.upload(identity, mem, v),
        }
        .map_err(e)
    }

    /// Each block's rows of the KV cache: the earlier blocks' (`kv_len`), of which the DiT takes
    /// those from `past_start` (the attention window's first).
    fn block_shapes(&self, method: &super::schedule::MethodSettings) -> Vec<BlockShape> {
        let d = self.d;
        let window_tokens = (method.attention_window >= 0)
            .then(|| method.attention_window as usize * d.tokens_per_frame);
        (0..d.blocks())
            .map(|block| {
                let kv_len = block * d.block_tokens();
                BlockShape {
                    block,
                    past_start: window_tokens.map_or(0, |w| kv_len.saturating_sub(w)),
                    kv_len,
                }
            })
            .collect()
    }

    /// The DiT binding of one block: the same for all its passes, but for the timestep, which
    /// `dit_pass` binds (or, with CUDA graphs, copies into the one buffer bound here).
    fn dit_binding(&self, dit: &Session, shape: BlockShape) -> Result<Bound, GenerateError> {
        let e = run_error("dit");
        let d = self.d;
        let BlockShape {
            block,
            past_start,
            kv_len,
        } = shape;

        let mut binding = dit.create_binding().map(Bound::new).map_err(e)?;
        if let Some(capture) = &self.capture {
            let f = d.frames_per_block as i64;
            binding
                .input("timestep", self.view(&capture.timestep, 0, &[1, f])?)
                .map_err(e)?;
        }
        let x_shape = d.block_shape();
        binding
            .input("x", self.view(&self.x_model, 0, &x_shape)?)
            .map_err(e)?;
        // The context itself, or (from `dit_context`) its keys and values, as the host loop does.
        if self.context_kv.is_empty() {
            binding.input("context", self.context_view()?).map_err(e)?;
        }
        for (name, view) in self.context_kv_views()? {
            binding.input(name, view).map_err(e)?;
        }
        binding
            .input("frame_offset", self.view(&self.offsets, block, &[1])?)
            .map_err(e)?;
        // The cache's rows the graph takes: the earlier blocks' (from `past_start`, the attention
        // window's first), and in place the block's own after them.
        let in_place = self.names.interface == KvInterface::InPlace;
        let taken = kv_len - past_start + if in_place { d.block_tokens() } else { 0 };
        let past = [1, taken as i64, d.dim as i64];
        let new = [1, d.block_tokens() as i64, d.dim as i64];
        let last = block + 1 == d.blocks();
        for layer in 0..d.layers {
            for (kind, cache, scratch) in [
                (0, &self.kv_k[layer], &self.kv_scratch[0]),
                (1, &self.kv_v[layer], &self.kv_scratch[1]),
            ] {
                binding
                    .input(
                        self.names.inputs[layer][kind].as_str(),
                        self.view(cache, past_start * d.dim, &past)?,
                    )
                    .map_err(e)?;
                let Some(outputs) = self.names.outputs.get(layer) else {
                    continue;
                };
                let new_view = if last {
                    self.view(scratch, 0, &new)?
                } else {
                    self.view(cache, kv_len * d.dim, &new)?
                };
                binding
                    .output(outputs[kind].as_str(), new_view)
                    .map_err(e)?;
            }
        }
        binding
            .output("flow", self.view(&self.flow, 0, &x_shape)?)
            .map_err(e)?;
        Ok(binding)
    }

    /// One DiT pass at level `level` (steps, then the clean level).
    fn dit_pass(
        &mut self,
        dit: &mut Session,
        binding: &mut Bound,
        shape: BlockShape,
        gate: &CaptureGate,
        level: usize,
        times: &mut PhaseTimes,
    ) -> Result<(), GenerateError> {
        let e = run_error("dit");
        let f = self.d.frames_per_block;
        let timestep = self.view(&self.timesteps, level * f, &[1, f as i64])?;
        let start = Instant::now();
        match &mut self.capture {
            None => {
                binding.input("timestep", timestep).map_err(e)?;
                dit.run_binding(&binding.binding).map_err(e)?;
            }
            Some(capture) => {
                // The level's timestep into the buffer every pass of the graph reads.
                let copy = run_error("timestep copy");
                let identity = &mut self.graphs.identity_f32;
                let mut copy_binding = identity.create_binding().map(Bound::new).map_err(copy)?;
                copy_binding.input("x", timestep).map_err(copy)?;
                copy_binding
                    .output(
                        "y",
                        capture
                            .timestep
                            .view(&self.mem, 0, &[1, f as i64])
                            .map_err(copy)?,
                    )
                    .map_err(copy)?;
                identity.run_binding(&copy_binding.binding).map_err(copy)?;
                let (id, capturing) = capture.ids.next_id(shape);
                let mut options = RunOptions::new().map_err(e)?;
                options.set("gpu_graph_id", id.to_string()).map_err(e)?;
                let mut run = || {
                    dit.run_binding_with_options(&binding.binding, &options)
                        .map(drop)
                };
                let result = if capturing { gate.capture(run) } else { run() };
                result.map_err(e)?;
            }
        }
        times.session_run += start.elapsed();
        Ok(())
    }
}

/// Decodes the blocks whose indices arrive on `blocks`, in order, one latent frame per call,
/// passing the causal cache between the two buffer sets. Runs on the caller's thread or on a
/// decoder thread beside the DiT; returns the time spent in `Session::run`.
fn decode_blocks(
    v: &VaeBufs,
    latent_frame: &mut Session,
    vae_first: &mut Session,
    vae_step: &mut Session,
    blocks: std::sync::mpsc::Receiver<usize>,
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
        run_once_per_prompt(session, &binding.binding, v.device).map_err(e)?;
    } else {
        session.run_binding(&binding.binding).map_err(e)?;
    }
    Ok(run + start.elapsed())
}

/// Clamp and uint8 layout of every decoder call's frames into `[frames, H, W, 3]`.
fn layout_frames(
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

/// One log line with every bundle session's arena (on GPUs, after each prompt).
fn log_arenas(sessions: &GraphSessions, mem: &MemoryInfo<'static>) {
    let arenas: Vec<String> = [
        ("text encoder", sessions.text_encoder.as_ref()),
        ("dit", Some(&sessions.dit)),
        ("vae_first", Some(&sessions.vae_first)),
        ("vae_step", Some(&sessions.vae_step)),
    ]
    .into_iter()
    .filter_map(|(name, s)| arena_summary(s?, mem).map(|a| format!("{name} {a}")))
    .collect();
    if !arenas.is_empty() {
        eprintln!(
            "device arenas (in use / max in use / reserved): {}",
            arenas.join(", ")
        );
    }
}

/// ONNX Runtime's statistics of `session`'s device arena (`AllocatorGetStats`): bytes in use,
/// the most ever in use, and what the arena holds from CUDA, as "in use / max / reserved" GiB.
fn arena_summary(session: &Session, mem: &MemoryInfo<'static>) -> Option<String> {
    use ort::AsPointer;
    let arena = MemoryInfo::new(
        AllocationDevice::CUDA,
        mem.device_id(),
        AllocatorType::Arena,
        MemoryType::Default,
    )
    .ok()?;
    let allocator = ort::memory::Allocator::new(session, arena).ok()?;
    let mut kvps: *mut ort::sys::OrtKeyValuePairs = std::ptr::null_mut();
    // SAFETY: the allocator is alive for the call; on success `kvps` is a new key/value list that
    // is read and released below.
    let status = unsafe { (ort::api().AllocatorGetStats)(allocator.ptr(), &mut kvps) };
    status_result(status).ok()?;
    if kvps.is_null() {
        return None;
    }
    let mut stats = std::collections::HashMap::new();
    // SAFETY: `kvps` is valid until released; keys and values are NUL-terminated strings it owns.
    unsafe {
        let (mut keys, mut values, mut n) = (std::ptr::null(), std::ptr::null(), 0usize);
        (ort::api().GetKeyValuePairs)(kvps, &mut keys, &mut values, &mut n);
        for i in 0..n {
            let k = std::ffi::CStr::from_ptr(*keys.add(i))
                .to_string_lossy()
                .into_owned();
            let v = std::ffi::CStr::from_ptr(*values.add(i))
                .to_string_lossy()
                .into_owned();
            stats.insert(k, v);
        }
        (ort::api().ReleaseKeyValuePairs)(kvps);
    }
    let gib = |key: &str| {
        stats
            .get(key)
            .and_then(|v| v.parse::<f64>().ok())
            .map_or("?".to_string(), |b| {
                format!("{:.2}", b / (1u64 << 30) as f64)
            })
    };
    Some(format!(
        "{} / {} / {} GiB",
        gib("InUse"),
        gib("MaxInUse"),
        gib("TotalAllocated")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(block: usize) -> BlockShape {
        BlockShape {
            block,
            past_start: 0,
            kv_len: block * 10,
        }
    }

    /// Each block shape runs twice as usual, then captures its own graph once and replays it;
    /// the next prompt replays every block's graph from its first pass.
    #[test]
    fn each_block_shape_runs_plainly_twice_then_captures_one_graph_and_replays_it() {
        let mut ids = GraphIds::default();
        let shapes = [shape(0), shape(1)];
        let plain = (-1, false);
        let first: Vec<_> = (0..5).map(|_| ids.next_id(shapes[0])).collect();
        assert_eq!(first, [plain, plain, (1, true), (1, false), (1, false)]);
        let second: Vec<_> = (0..5).map(|_| ids.next_id(shapes[1])).collect();
        assert_eq!(second, [plain, plain, (2, true), (2, false), (2, false)]);
        // Another prompt: every pass replays, none captures.
        assert_eq!(ids.next_id(shapes[0]), (1, false));
        assert_eq!(ids.next_id(shapes[1]), (2, false));
        // A shape not seen before (another attention window) gets its own graph, after two
        // plain passes.
        let windowed = BlockShape {
            past_start: 10,
            ..shape(2)
        };
        let third: Vec<_> = (0..3).map(|_| ids.next_id(windowed)).collect();
        assert_eq!(third, [plain, plain, (3, true)]);
    }

    /// A capture asked for while the decoder runs waits for that run alone: the decoder starts no
    /// run while the capture is wanted or under way (real threads; the decoder's first run lasts
    /// until the capture has asked for its turn).
    #[test]
    fn a_capture_waits_for_the_decoder_run_in_progress_and_no_more() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let gate = CaptureGate::default();
        let decoding = AtomicBool::new(false);
        let finished = AtomicUsize::new(0);
        let (started, first_started) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for run in 0..4 {
                    gate.decode(|| {
                        decoding.store(true, Ordering::SeqCst);
                        if run == 0 {
                            started.send(()).unwrap();
                            while !gate.lock().capture {
                                std::thread::yield_now();
                            }
                        }
                        decoding.store(false, Ordering::SeqCst);
                        finished.fetch_add(1, Ordering::SeqCst);
                    });
                }
            });
            first_started.recv().unwrap();
            let seen = gate.capture(|| {
                assert!(
                    !decoding.load(Ordering::SeqCst),
                    "a decoder run beside the capture"
                );
                finished.load(Ordering::SeqCst)
            });
            assert_eq!(
                seen, 1,
                "the capture waited for the run in progress and no other"
            );
        });
        assert_eq!(
            finished.load(Ordering::SeqCst),
            4,
            "the decoder went on after it"
        );
    }

    /// A turn that panics still ends: the other side does not wait for it forever.
    #[test]
    fn a_panicking_turn_ends_its_turn() {
        let gate = CaptureGate::default();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            gate.decode(|| panic!("a decoder run failed"))
        }));
        assert!(caught.is_err());
        assert_eq!(gate.capture(|| 7), 7, "the capture got its turn");
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            gate.capture(|| panic!("a capture failed"))
        }));
        assert!(caught.is_err());
        assert_eq!(gate.decode(|| 8), 8, "the decoder got its turn");
    }

    /// Stale graphs are never replayed: every pass runs plainly, and none captures.
    #[test]
    fn stale_graphs_are_never_replayed() {
        let mut ids = GraphIds::default();
        for _ in 0..3 {
            ids.next_id(shape(0));
        }
        ids.stale = true;
        assert_eq!(ids.next_id(shape(0)), (-1, false));
        assert_eq!(ids.next_id(shape(1)), (-1, false));
    }

    /// Contexts encoded ahead reach the loop through `Buf::upload` on the bundle's float type; in
    /// half precision the values must come back bit for bit (CPU provider, real ONNX Runtime).
    #[test]
    fn a_half_precision_buffer_round_trips_through_the_identity_graph() {
        let options = RuntimeOptions {
            intra_op_threads: Some(1),
            ..RuntimeOptions::default()
        };
        let graph = onnx_graph::identity(TensorElementType::Float16);
        let mut identity = build_small_session("identity_f16", &graph, &options).unwrap();
        let mem = device_memory_info(None).unwrap();
        let alloc = Allocator::new(&identity, mem.clone()).unwrap();
        let buf = Buf::new(&alloc, TensorElementType::Float16, 6).unwrap();
        let data: Vec<half::f16> = [0.5, -1.25, 3.0, 65504.0, 1e-3, -0.0]
            .map(half::f16::from_f32)
            .to_vec();
        buf.upload(&mut identity, &mem, &data).unwrap();
        let back: Vec<half::f16> = buf.download(&mut identity, &mem, data.len()).unwrap();
        assert_eq!(
            back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            data.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}

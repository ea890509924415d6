//! `CausalConv3d` on CUDA: cuDNN's convolution (its backend API), channels last, with the
//! engine picked by timing.
//!
//! - X `[N, T, H, W, C]`, W `[K, kT, kH, kW, C]` and Y `[N, T', H, W, K]` are handed to cuDNN as
//!   NCDHW tensors with channels-last strides: no layout conversion.
//! - **The engine.** ONNX Runtime's `Conv` picks among cuDNN's legacy algorithms
//!   (`cudnnFindConvolutionForwardAlgorithmEx`), and PyTorch's benchmark mode times the first 10
//!   engine configurations of cuDNN's heuristics; for the decoder's 96-channel convolutions at
//!   full resolution both land on a kernel markedly slower than a later configuration of the same
//!   heuristics (`benches/conv_shapes.py` with `CUDNN_LIMIT=0`; `benches/README.md`). So the
//!   first call of a shape builds every execution plan the heuristics (instant and fallback
//!   modes) offer, leaves out those whose arithmetic differs (reduced-precision accumulation,
//!   FFT, Winograd, non-deterministic, and for float32 inputs tensor cores' TF32 or inputs
//!   down-converted to a smaller type) or that need more than [`MAX_WORKSPACE`] bytes, times each
//!   on the call's own tensors (one cold run, then [`TIMED_REPS`] runs for those whose cold run is
//!   within [`SLOW_CUT`] times the best so far: the fallback engines run a large convolution for
//!   tens of milliseconds; CUDA events on ONNX Runtime's stream) and keeps the fastest for the
//!   process (per device, shape and type; one cuDNN handle per device, pointed at each call's
//!   stream). A first call made while the stream is being captured into a CUDA graph cannot wait
//!   for timings: it takes the first plan that builds, and so does every later call of that
//!   shape.
//! - **Kept between processes.** With a kernel cache folder ([`super::KernelSettings`]), each
//!   choice is also written under its `cudnn_conv/`, one small file per GPU kind, cuDNN version,
//!   shape and type, naming the plan's place in the heuristics' list and its engine; a later
//!   process (the measurement after the warmup) builds that one plan and takes it without
//!   timing, when the heuristics still offer the same engine there. Beside it, when cuDNN can
//!   serialise the plan, the plan itself (`.plan.json`): a later process restores it without
//!   building the operation graph or asking the heuristics (about 70 ms a shape on an H200). A
//!   missing, unreadable or stale file means building or timing again; a file that cannot be
//!   written only costs the next process that work.
//! - `conv_log` (`UNSTEP_CONV_LOG=1`) prints each shape's choice to standard error: the plans
//!   timed, the engine kept and its time against the heuristics' first plan, and how long the
//!   choice took.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use cudarc::cudnn::sys as dnn;
use cudarc::driver::{result as driver, sys};
use ort::value::TensorElementType;

use super::DOMAIN;
use super::cuda::{CudaError, CurrentContext, Handle, REMEDY, primary_context};
use super::cudnn::{
    Attr, CudnnError, Desc, DescPtr, Kind, Type, check_aligned, check_cudnn, create_handle,
    deserialize_plan, device_kind, engine_configs, execute_plan, execution_plan, listed,
    serialize_plan, set_stream,
};
use crate::engine::one_time::{self, Work};

/// The tensors of a call, by unique id.
const UID_X: i64 = 1;
const UID_W: i64 = 2;
const UID_Y: i64 = 3;

/// The most workspace a plan may need to be timed and kept.
const MAX_WORKSPACE: usize = 256 << 20;
/// Timed runs of each plan, after one cold run.
const TIMED_REPS: usize = 3;
/// A plan whose cold run takes more than this many times the best plan's time so far is not
/// timed further.
const SLOW_CUT: f32 = 4.0;
/// cuDNN's numerical notes (`cudnnBackendNumericalNote_t`) that change a convolution's arithmetic
/// (tensor cores: TF32 for float32 inputs).
const NOTE_TENSOR_CORE: u32 = 0;
const NOTE_DOWN_CONVERT_INPUTS: u32 = 1;
const NOTE_REDUCED_PRECISION_REDUCTION: u32 = 2;
const NOTE_FFT: u32 = 3;
const NOTE_NONDETERMINISTIC: u32 = 4;
const NOTE_WINOGRAD: [u32; 4] = [5, 6, 7, 8];

/// An error of the `CausalConv3d` kernel, in the words a user reads.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ConvError {
    #[error(
        "{DOMAIN} CausalConv3d: element type {0:?} is not supported (float32 and float16 are), \
         {REMEDY}"
    )]
    ElementType(TensorElementType),
    /// A call given other pointers than X, W and Y.
    #[error("{0} pointers, expected X, W and Y")]
    Pointers(usize),
    #[error("cuMemAlloc of {kib} KiB of convolution workspace on CUDA device {ordinal}: {source}")]
    WorkspaceAlloc {
        kib: usize,
        ordinal: i32,
        source: driver::DriverError,
    },
    /// The heuristics of `mode` gave no configurations.
    #[error("{mode:?}: {source}")]
    Heuristics {
        mode: dnn::cudnnBackendHeurMode_t,
        source: CudnnError,
    },
    /// An engine's plan does not build.
    #[error("engine {engine}: {source}")]
    Engine { engine: i64, source: CudnnError },
    /// An engine's plan needs more than [`MAX_WORKSPACE`].
    #[error("engine {engine} needs {mib} MiB of workspace")]
    EngineWorkspace { engine: i64, mib: usize },
    /// No offer's plan builds (`shape`: the call's tensors and type): why each did not.
    #[error("cuDNN has no engine for this convolution ({shape}){}", listed(reasons.as_slice()))]
    NoEngine {
        shape: String,
        reasons: Vec<ConvError>,
    },
    /// No plan that built ran when timed.
    #[error("no execution plan of cuDNN ran this convolution ({0})")]
    NoPlanRan(String),
    /// A CUDA event call of the timing failed.
    #[error("{call}: {source}")]
    Event {
        call: &'static str,
        source: driver::DriverError,
    },
    #[error(transparent)]
    Cudnn(#[from] CudnnError),
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// One execution plan, ready to run: the descriptors it was built from are kept alive with it.
struct Tuned {
    plan: Desc,
    workspace: usize,
    _parts: Vec<Desc>,
}

/// What the convolutions of one device share, for the process: one cuDNN handle (pointed at the
/// call's stream before each call), the plans chosen so far by (sizes, float16), and one
/// workspace (grown as a plan needs; the smaller buffers are kept, a captured graph may point at
/// them). The calls come on the streams of several sessions (`vae_first`'s and `vae_step`'s);
/// choices kept per stream would be timed again for every stream, so nothing here depends on the
/// stream. The lock orders the host
/// side; the shared workspace relies on the decoder's sessions running one after another, never
/// two convolutions at once on different streams.
struct Device {
    ordinal: i32,
    /// The GPU kind and cuDNN version, for the names of kept choices: `sm90-132sms-cudnn91900`.
    kind: String,
    handle: Handle<dnn::cudnnHandle_t>,
    tuned: Vec<((ConvDims, bool), Tuned)>,
    workspaces: Vec<(usize, u64)>,
}

static DEVICES: Mutex<Vec<Device>> = Mutex::new(Vec::new());

impl Device {
    /// Device `ordinal`'s state, with a new cuDNN handle (its primary context current).
    fn new(ordinal: i32) -> Result<Self, CudnnError> {
        Ok(Self {
            ordinal,
            kind: device_kind(ordinal)?,
            handle: create_handle(ordinal)?,
            tuned: Vec::new(),
            workspaces: Vec::new(),
        })
    }

    /// At least `bytes` of workspace.
    fn workspace(&mut self, bytes: usize) -> Result<u64, ConvError> {
        if let Some(&(_, ptr)) = self.workspaces.last().filter(|(n, _)| *n >= bytes) {
            return Ok(ptr);
        }
        // SAFETY: a plain allocation in the current (primary) context, kept for the process.
        let ptr = unsafe { driver::malloc_sync(bytes.max(256)) }.map_err(|source| {
            ConvError::WorkspaceAlloc {
                kib: bytes.div_ceil(1024),
                ordinal: self.ordinal,
                source,
            }
        })?;
        self.workspaces.push((bytes, ptr));
        Ok(ptr)
    }
}

/// The sizes of a `CausalConv3d` call: X `[n, t, h, w, c]`, W `[k, kt, kh, kw, c]`, Y
/// `[n, t − kt + 1, h, w, k]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub(crate) struct ConvDims {
    pub(crate) n: usize,
    pub(crate) t: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) c: usize,
    pub(crate) k: usize,
    pub(crate) kt: usize,
    pub(crate) kh: usize,
    pub(crate) kw: usize,
}

impl ConvDims {
    /// The output's frames: `t − kt + 1`.
    pub(crate) fn out_t(&self) -> usize {
        self.t + 1 - self.kt
    }

    /// The output's pixels (rows of K).
    pub(crate) fn rows(&self) -> usize {
        self.n * self.out_t() * self.h * self.w
    }
}

/// A `CausalConv3d` node's CUDA kernel.
pub(crate) struct ConvKernel {
    ty: TensorElementType,
    ordinal: i32,
    context: Handle<sys::CUcontext>,
}

impl ConvKernel {
    /// The kernel of element type `ty` (float32 or float16) on device `ordinal`.
    pub(crate) fn new(ty: TensorElementType, ordinal: i32) -> Result<Self, ConvError> {
        if !matches!(ty, TensorElementType::Float16 | TensorElementType::Float32) {
            return Err(ConvError::ElementType(ty));
        }
        check_cudnn()?;
        Ok(Self {
            ty,
            ordinal,
            context: primary_context(ordinal)?,
        })
    }

    /// Queues `Y = conv(X, W)` on `stream` over `pointers` (X, W, Y: device addresses of this
    /// device) with the sizes `dims`.
    pub(crate) fn launch_conv(
        &mut self,
        dims: &ConvDims,
        pointers: &[u64],
        stream: sys::CUstream,
    ) -> Result<(), ConvError> {
        let [x, w, y] = pointers[..] else {
            return Err(ConvError::Pointers(pointers.len()));
        };
        if dims.rows() == 0 {
            return Ok(());
        }
        check_aligned(&[("X", x), ("W", w), ("Y", y)])?;
        let _current = CurrentContext::push(self.context)?;
        let half = self.ty == TensorElementType::Float16;
        let mut devices = DEVICES.lock().unwrap_or_else(PoisonError::into_inner);
        let device = match devices.iter().position(|d| d.ordinal == self.ordinal) {
            Some(index) => &mut devices[index],
            None => {
                devices.push(Device::new(self.ordinal)?);
                devices.last_mut().expect("just pushed")
            }
        };
        set_stream(device.handle, stream)?;
        let key = (*dims, half);
        let index = match device.tuned.iter().position(|(k, _)| *k == key) {
            Some(index) => index,
            None => {
                let chosen = one_time::timed(Work::ConvChoices, || {
                    tune(device, dims, half, [x, w, y], stream)
                })?;
                device.tuned.push((key, chosen));
                device.tuned.len() - 1
            }
        };
        let bytes = device.tuned[index].1.workspace;
        let workspace = device.workspace(bytes)?;
        Ok(execute(
            device.handle.0,
            &device.tuned[index].1.plan,
            [x, w, y],
            workspace,
        )?)
    }
}

/// The descriptors of one convolution: X, W, Y, the convolution, its operation and the
/// operation graph (last).
fn graph(handle: dnn::cudnnHandle_t, g: &ConvDims, half: bool) -> Result<Vec<Desc>, CudnnError> {
    use dnn::cudnnDataType_t::{CUDNN_DATA_FLOAT as F32, CUDNN_DATA_HALF as F16};
    let ty = if half { F16 } else { F32 };
    let [n, t, h, w, c, k, kt, kh, kw] =
        [g.n, g.t, g.h, g.w, g.c, g.k, g.kt, g.kh, g.kw].map(|v| v as i64);
    let out_t = g.out_t() as i64;
    // NCDHW dimensions, NDHWC strides.
    let channels_last = |[_, c, t, h, w]: [i64; 5]| [t * h * w * c, 1, h * w * c, w * c, c];
    let tensor = |uid, dims: [i64; 5]| Desc::tensor(uid, ty, &dims, &channels_last(dims), false);
    let x = tensor(UID_X, [n, c, t, h, w])?;
    let wt = tensor(UID_W, [k, c, kt, kh, kw])?;
    let y = tensor(UID_Y, [n, k, out_t, h, w])?;
    let conv = Desc::new(Kind::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    let compute = F32;
    let mode = dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION;
    // SAFETY: one enum value each.
    unsafe {
        conv.set(
            Attr::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
            Type::CUDNN_TYPE_DATA_TYPE,
            1,
            (&compute as *const dnn::cudnnDataType_t).cast(),
        )?;
        conv.set(
            Attr::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
            Type::CUDNN_TYPE_CONVOLUTION_MODE,
            1,
            (&mode as *const dnn::cudnnConvolutionMode_t).cast(),
        )?;
    }
    conv.set_i64s(Attr::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[3])?;
    conv.set_i64s(Attr::CUDNN_ATTR_CONVOLUTION_DILATIONS, &[1, 1, 1])?;
    conv.set_i64s(Attr::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &[1, 1, 1])?;
    let pads = [0, kh / 2, kw / 2];
    conv.set_i64s(Attr::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &pads)?;
    conv.set_i64s(Attr::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &pads)?;
    let conv = conv.finalize("convolution")?;
    let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?;
    op.set_desc(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, &x)?;
    op.set_desc(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, &wt)?;
    op.set_desc(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, &y)?;
    op.set_desc(
        Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
        &conv,
    )?;
    let (alpha, beta) = (1f32, 0f32);
    // SAFETY: one float each (the scaling type of float16 and float32 convolutions).
    unsafe {
        op.set(
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
            Type::CUDNN_TYPE_FLOAT,
            1,
            (&alpha as *const f32).cast(),
        )?;
        op.set(
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            Type::CUDNN_TYPE_FLOAT,
            1,
            (&beta as *const f32).cast(),
        )?;
    }
    let op = op.finalize("convolution forward operation")?;
    let graph = Desc::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set_handle(Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle)?;
    graph.set_desc(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, &op)?;
    let graph = graph.finalize("operation graph")?;
    Ok(vec![x, wt, y, conv, op, graph])
}

/// An engine configuration the heuristics offered whose arithmetic is the plain one: its engine's
/// global index and the configuration.
struct Offer {
    engine: i64,
    config: Desc,
}

/// An offer's execution plan, built, and the bytes of workspace it needs.
struct Candidate {
    plan: Desc,
    workspace: usize,
}

/// The engine of `config`: its global index and whether its arithmetic is the plain one (see the
/// module's notes).
fn engine_of(config: &Desc, half: bool) -> Result<(i64, bool), CudnnError> {
    let engine = Desc::new(Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    let mut ptr = engine.0;
    // SAFETY: one descriptor for cuDNN to fill (created above, of the engine kind).
    unsafe {
        config.get(
            Attr::CUDNN_ATTR_ENGINECFG_ENGINE,
            Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            1,
            (&mut ptr as *mut DescPtr).cast(),
        )?
    };
    let mut index = -1i64;
    let mut notes = [u32::MAX; 16];
    // SAFETY: one int64; up to 16 enum values (4 bytes each).
    let count = unsafe {
        engine.get(
            Attr::CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
            Type::CUDNN_TYPE_INT64,
            1,
            (&mut index as *mut i64).cast(),
        )?;
        engine.get(
            Attr::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
            Type::CUDNN_TYPE_NUMERICAL_NOTE,
            notes.len() as i64,
            notes.as_mut_ptr().cast(),
        )?
    };
    let notes = &notes[..(count.max(0) as usize).min(notes.len())];
    let plain = !notes.iter().any(|&note| {
        note == NOTE_REDUCED_PRECISION_REDUCTION
            || note == NOTE_FFT
            || note == NOTE_NONDETERMINISTIC
            || NOTE_WINOGRAD.contains(&note)
            || (!half && (note == NOTE_DOWN_CONVERT_INPUTS || note == NOTE_TENSOR_CORE))
    });
    Ok((index, plain))
}

/// The heuristics' offers for `graph` with the plain arithmetic, instant mode's first, then the
/// fallback's; the heuristics descriptors (kept alive with them); why others were left out.
fn offers(graph: &Desc, half: bool) -> (Vec<Offer>, Vec<Desc>, Vec<ConvError>) {
    let mut found = Vec::new();
    let mut keep = Vec::new();
    let mut reasons = Vec::new();
    for mode in [
        dnn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_INSTANT,
        dnn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK,
    ] {
        match engine_configs(graph, mode) {
            Ok((heur, configs)) => {
                keep.push(heur);
                for config in configs {
                    match engine_of(&config, half) {
                        Ok((engine, true)) => found.push(Offer { engine, config }),
                        Ok((_, false)) => {}
                        Err(e) => reasons.push(e.into()),
                    }
                }
            }
            Err(source) => reasons.push(ConvError::Heuristics { mode, source }),
        }
    }
    (found, keep, reasons)
}

/// The execution plan of `offer` on `handle`, when it builds and needs at most
/// [`MAX_WORKSPACE`] bytes of workspace.
fn build(handle: dnn::cudnnHandle_t, offer: &Offer) -> Result<Candidate, ConvError> {
    let engine = offer.engine;
    let (plan, workspace) = execution_plan(handle, &offer.config)
        .map_err(|source| ConvError::Engine { engine, source })?;
    if workspace > MAX_WORKSPACE {
        return Err(ConvError::EngineWorkspace {
            engine,
            mib: workspace >> 20,
        });
    }
    Ok(Candidate { plan, workspace })
}

/// Queues the plan on the handle's stream over X, W, Y and the workspace.
fn execute(
    handle: dnn::cudnnHandle_t,
    plan: &Desc,
    [x, w, y]: [u64; 3],
    workspace: u64,
) -> Result<(), CudnnError> {
    let pointers: [*mut c_void; 3] = [x as _, w as _, y as _];
    // SAFETY: X, W and Y are the call's device tensors of the plan's shapes, and the workspace has
    // the plan's bytes (the callers').
    unsafe { execute_plan(handle, plan, &[UID_X, UID_W, UID_Y], &pointers, workspace) }
}

/// The mean milliseconds of `reps` runs of `plan` on `stream`, or why it could not run.
fn time_runs(
    handle: dnn::cudnnHandle_t,
    plan: &Desc,
    pointers: [u64; 3],
    workspace: u64,
    stream: sys::CUstream,
    reps: usize,
) -> Result<f32, ConvError> {
    let event =
        |call: &'static str| move |source: driver::DriverError| ConvError::Event { call, source };
    let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
    let start = driver::event::create(flags).map_err(event("cuEventCreate"))?;
    let end = driver::event::create(flags).map_err(event("cuEventCreate"))?;
    // SAFETY: events of the current context, recorded on its stream and waited for here.
    let timed = (|| unsafe {
        driver::event::record(start, stream).map_err(event("cuEventRecord"))?;
        for _ in 0..reps {
            execute(handle, plan, pointers, workspace)?;
        }
        driver::event::record(end, stream).map_err(event("cuEventRecord"))?;
        driver::event::synchronize(end).map_err(event("cuEventSynchronize"))?;
        driver::event::elapsed(start, end).map_err(event("cuEventElapsedTime"))
    })();
    // SAFETY: the events are not used after this.
    unsafe {
        let _ = driver::event::destroy(start);
        let _ = driver::event::destroy(end);
    }
    timed.map(|ms| ms / reps.max(1) as f32)
}

/// Times plans 0..`count` in order with `time(plan, runs)` (the mean of `runs` runs, None when the
/// plan failed): one cold run each, then [`TIMED_REPS`] runs for those within [`SLOW_CUT`] of the
/// best mean so far. Each plan's time (its cold run's where it was cut, which is more than the
/// best), None where it failed.
pub(crate) fn time_in_order(
    count: usize,
    mut time: impl FnMut(usize, usize) -> Option<f32>,
) -> Vec<Option<f32>> {
    let mut best = f32::INFINITY;
    (0..count)
        .map(|plan| {
            let cold = time(plan, 1)?;
            if cold > SLOW_CUT * best {
                return Some(cold);
            }
            let mean = time(plan, TIMED_REPS)?;
            best = best.min(mean);
            Some(mean)
        })
        .collect()
}

/// The plan with the least time (the first of equals), None when none ran.
pub(crate) fn fastest(times: &[Option<f32>]) -> Option<usize> {
    times
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (i, t)))
        .fold(None, |best: Option<(usize, f32)>, (i, t)| match best {
            Some((_, b)) if b <= t => best,
            _ => Some((i, t)),
        })
        .map(|(i, _)| i)
}

/// The file a choice is kept in, under the choices' directory.
pub(crate) fn choice_file(dir: &Path, kind: &str, dims: &ConvDims, half: bool) -> PathBuf {
    let g = dims;
    dir.join(format!(
        "{kind}-{}-x{}x{}x{}x{}x{}-w{}x{}x{}x{}.txt",
        if half { "f16" } else { "f32" },
        g.n,
        g.t,
        g.h,
        g.w,
        g.c,
        g.k,
        g.kt,
        g.kh,
        g.kw
    ))
}

/// The file that keeps the plan of the choice kept in `choice` (its serialised form).
pub(crate) fn plan_file(choice: &Path) -> PathBuf {
    choice.with_extension("plan.json")
}

/// A kept choice's text: the plan's place in the heuristics' list and its engine's global index.
pub(crate) fn format_choice(index: usize, engine: i64) -> String {
    format!("plan {index} engine {engine}\n")
}

/// The (place, engine) of a kept choice's text; None for anything else.
pub(crate) fn parse_choice(text: &str) -> Option<(usize, i64)> {
    match text.split_whitespace().collect::<Vec<_>>()[..] {
        ["plan", index, "engine", engine] => Some((index.parse().ok()?, engine.parse().ok()?)),
        _ => None,
    }
}

/// The kept choice among plans whose engines are `engines` (in the heuristics' order), when the
/// file names a place they have with the same engine.
pub(crate) fn kept_choice(file: &Path, engines: &[i64]) -> Option<usize> {
    let (index, engine) = parse_choice(&std::fs::read_to_string(file).ok()?)?;
    (*engines.get(index)? == engine).then_some(index)
}

/// Writes a choice (a temporary file renamed into place, so a reader sees all of it or none).
pub(crate) fn keep_choice(file: &Path, index: usize, engine: i64) -> std::io::Result<()> {
    crate::atomic_file::write_making_folder(file, format_choice(index, engine).as_bytes())
}

/// The plan a shape keeps: the one an earlier process kept, when the heuristics
/// still offer its engine at its place and its plan builds (one plan built, none timed);
/// otherwise [`choose`]'s.
fn tune(
    device: &mut Device,
    dims: &ConvDims,
    half: bool,
    pointers: [u64; 3],
    stream: sys::CUstream,
) -> Result<Tuned, ConvError> {
    let started = std::time::Instant::now();
    let settings = super::settings();
    let file = settings
        .cache_dir
        .as_deref()
        .map(|dir| choice_file(&dir.join("cudnn_conv"), &device.kind, dims, half));
    let plan_file = file.as_deref().map(plan_file);
    let restored = plan_file
        .as_deref()
        .and_then(|f| std::fs::read(f).ok())
        .and_then(|json| deserialize_plan(device.handle.0, &json).ok());
    if let Some((plan, workspace)) = restored {
        if settings.conv_log {
            eprintln!(
                "CausalConv3d {dims:?} on stream {stream:?}: the plan kept by an earlier process, \
                 restored in {:.3} s",
                started.elapsed().as_secs_f64()
            );
        }
        return Ok(Tuned {
            plan,
            workspace,
            _parts: Vec::new(),
        });
    }
    let mut parts = graph(device.handle.0, dims, half)?;
    let graph = parts.last().expect("the graph is the last descriptor");
    let (offers, keep, reasons) = offers(graph, half);
    let describe = format!(
        "X [{}, {}, {}, {}, {}], W [{}, {}, {}, {}, {}], {}",
        dims.n,
        dims.t,
        dims.h,
        dims.w,
        dims.c,
        dims.k,
        dims.kt,
        dims.kh,
        dims.kw,
        dims.c,
        if half { "float16" } else { "float32" }
    );
    let engines: Vec<i64> = offers.iter().map(|o| o.engine).collect();
    let kept = file
        .as_deref()
        .and_then(|f| kept_choice(f, &engines))
        .and_then(|place| Some((place, build(device.handle.0, &offers[place]).ok()?)));
    let (place, candidate, how) = match kept {
        Some((place, candidate)) => (place, candidate, "kept by an earlier process".to_string()),
        None => choose(
            device,
            &offers,
            reasons,
            pointers,
            stream,
            &describe,
            file.as_deref(),
        )?,
    };
    if settings.conv_log {
        eprintln!(
            "CausalConv3d {describe} on stream {stream:?}: engine {} kept ({how}); chosen in \
             {:.2} s",
            offers[place].engine,
            started.elapsed().as_secs_f64()
        );
    }
    // The plan itself is kept once its choice is (timed now, or kept earlier).
    if let (Some(choice), Some(plan_file)) = (&file, &plan_file)
        && choice.is_file()
        && kept_choice(choice, &engines) == Some(place)
        && let Ok(json) = serialize_plan(&candidate.plan)
    {
        super::keep(plan_file, &json, "builds the convolution's plan");
    }
    let offer = offers.into_iter().nth(place).expect("place is an offer's");
    parts.push(offer.config);
    parts.extend(keep);
    Ok(Tuned {
        plan: candidate.plan,
        workspace: candidate.workspace,
        _parts: parts,
    })
}

/// Builds every offer's plan and keeps the fastest on the call's own tensors ([`time_in_order`]),
/// writing the choice to `file` for later processes; or, untimed and not written, the first that
/// builds while the stream is being captured (a capture cannot wait for timings). Returns its
/// place among the offers, its plan and how it was chosen (for the log).
fn choose(
    device: &mut Device,
    offers: &[Offer],
    mut reasons: Vec<ConvError>,
    pointers: [u64; 3],
    stream: sys::CUstream,
    describe: &str,
    file: Option<&Path>,
) -> Result<(usize, Candidate, String), ConvError> {
    let handle = device.handle.0;
    let mut built = Vec::new();
    for (place, offer) in offers.iter().enumerate() {
        match build(handle, offer) {
            Ok(candidate) => built.push((place, candidate)),
            Err(e) => reasons.push(e),
        }
    }
    if built.is_empty() {
        return Err(ConvError::NoEngine {
            shape: describe.to_string(),
            reasons,
        });
    }
    // SAFETY: the stream is ONNX Runtime's, alive for the call.
    let capturing = unsafe { driver::stream::is_capturing(stream) }
        .map(|s| s != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
        .unwrap_or(true);
    let mut times = vec![None; built.len()];
    let mut best = 0;
    if !capturing && built.len() > 1 {
        let most = built.iter().map(|(_, c)| c.workspace).max().unwrap_or(0);
        let workspace = device.workspace(most)?;
        times = time_in_order(built.len(), |i, runs| {
            time_runs(handle, &built[i].1.plan, pointers, workspace, stream, runs).ok()
        });
        best = fastest(&times).ok_or_else(|| ConvError::NoPlanRan(describe.to_string()))?;
        let place = built[best].0;
        if let Some(file) = file
            && let Err(e) = keep_choice(file, place, offers[place].engine)
        {
            eprintln!(
                "warning: {DOMAIN} CausalConv3d: could not keep the convolution's engine choice \
                 in {}: {e}; the next process times the plans again",
                file.display()
            );
        }
    }
    let us = |i: usize| times[i].map_or("untimed".to_string(), |ms| format!("{:.1} µs", ms * 1e3));
    let how = format!(
        "{} of {} plans built, {}; the first, engine {}, {}",
        built.len(),
        offers.len(),
        us(best),
        offers[built[0].0].engine,
        us(0)
    );
    let (place, candidate) = built.swap_remove(best);
    Ok((place, candidate, how))
}

//! `CausalConv3d` on CUDA: cuDNN's convolution (its backend API), channels last, with the
//! engine picked by timing.
//!
//! - X `[N, T, H, W, C]`, W `[K, kT, kH, kW, C]` and Y `[N, T', H, W, K]` are handed to cuDNN as
//!   NCDHW tensors with channels-last strides: no layout conversion.
//! - **The engine.** ONNX Runtime's `Conv` picks among cuDNN's legacy algorithms
//!   (`cudnnFindConvolutionForwardAlgorithmEx`), and PyTorch's benchmark mode times the first 10
//!   engine configurations of cuDNN's heuristics; for the decoder's 96-channel convolutions at
//!   full resolution both land on a kernel at about 430 TFLOP/s, where a later configuration of
//!   the same heuristics runs at about 640 (`benches/conv_shapes.py` with `CUDNN_LIMIT=0`). So the
//!   first call of a shape builds every execution plan the heuristics (instant and fallback
//!   modes) offer, leaves out those whose arithmetic differs (reduced-precision accumulation,
//!   FFT, Winograd, non-deterministic, and for float32 inputs tensor cores' TF32 or inputs
//!   down-converted to a smaller type)
//!   or that need more than [`MAX_WORKSPACE`] bytes, times each on the call's own tensors
//!   ([`TIMED_REPS`] runs after one warm run, CUDA events on ONNX Runtime's stream) and keeps the
//!   fastest for the process (per device, stream, shape and type). A first call made while the
//!   stream is being captured into a CUDA graph cannot wait for timings: it takes the
//!   heuristics' first plan, and so does every later call of that shape.
//! - `UNSTEP_CONV_LOG=1` prints each shape's choice to standard error: the plans timed, the
//!   engine kept and its time against the heuristics' first plan.

use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use cudarc::cudnn::sys as dnn;
use cudarc::driver::{result as driver, sys};
use ort::operator::ComputeContext;
use ort::value::TensorElementType;

use super::cuda::{CurrentContext, Handle, REMEDY, prepare, primary_context};
use super::cudnn::{Attr, Desc, DescPtr, Kind, Type, check, check_cudnn, handle, scratch};
use super::{Attrs, ConvDims, DOMAIN, Op, Plan, op_error};

/// The tensors of a call, by unique id.
const UID_X: i64 = 1;
const UID_W: i64 = 2;
const UID_Y: i64 = 3;

/// The most workspace a plan may need to be timed and kept.
pub(crate) const MAX_WORKSPACE: usize = 256 << 20;
/// Timed runs of each plan, after one warm run.
const TIMED_REPS: usize = 3;

/// cuDNN's numerical notes (`cudnnBackendNumericalNote_t`) that change a convolution's arithmetic
/// (tensor cores: TF32 for float32 inputs).
const NOTE_TENSOR_CORE: u32 = 0;
const NOTE_DOWN_CONVERT_INPUTS: u32 = 1;
const NOTE_REDUCED_PRECISION_REDUCTION: u32 = 2;
const NOTE_FFT: u32 = 3;
const NOTE_NONDETERMINISTIC: u32 = 4;
const NOTE_WINOGRAD: [u32; 4] = [5, 6, 7, 8];

/// One execution plan, ready to run: the descriptors it was built from are kept alive with it.
struct Tuned {
    plan: Desc,
    workspace: usize,
    _parts: Vec<Desc>,
}

/// (device, stream, sizes, float16).
type Key = (i32, usize, ConvDims, bool);

/// The plans chosen so far in this process.
static TUNED: Mutex<Vec<(Key, Tuned)>> = Mutex::new(Vec::new());

/// A `CausalConv3d` node's CUDA kernel.
pub(super) struct ConvKernel {
    ty: TensorElementType,
    ordinal: i32,
    context: Handle<sys::CUcontext>,
}

impl ConvKernel {
    pub(super) fn new(ty: TensorElementType, ordinal: i32) -> Result<Self, String> {
        if !matches!(ty, TensorElementType::Float16 | TensorElementType::Float32) {
            return Err(format!(
                "{DOMAIN} CausalConv3d: element type {ty:?} is not supported (float32 and float16 \
                 are), {REMEDY}"
            ));
        }
        check_cudnn()?;
        Ok(Self {
            ty,
            ordinal,
            context: primary_context(ordinal)?,
        })
    }

    /// Checks the call and queues it on ONNX Runtime's stream.
    pub(super) fn compute(&mut self, attrs: &Attrs, ctx: &ComputeContext) -> ort::Result<()> {
        let op = Op::CausalConv3d;
        let Some(call) = prepare(op, self.ty, self.ordinal, attrs, ctx)? else {
            return Ok(());
        };
        self.launch(&call.plan, &call.pointers, call.stream)
            .map_err(|message| op_error(op, format!("(CUDA) {message}")))
    }

    /// Queues `Y = conv(X, W)` on `stream` over `pointers` (X, W, Y: device addresses of this
    /// device) with the sizes of `plan`.
    pub(crate) fn launch(
        &mut self,
        plan: &Plan,
        pointers: &[u64],
        stream: sys::CUstream,
    ) -> Result<(), String> {
        let [x, w, y] = pointers[..] else {
            return Err(format!("{} pointers, expected X, W and Y", pointers.len()));
        };
        if plan.rows == 0 {
            return Ok(());
        }
        if let Some((name, p)) = [("X", x), ("W", w), ("Y", y)]
            .into_iter()
            .find(|(_, p)| p % 16 != 0)
        {
            return Err(format!(
                "{name} at {p:#x} is not aligned to 16 bytes, as cuDNN needs"
            ));
        }
        let _current =
            CurrentContext::enter(self.context.0).map_err(|e| format!("cuCtxPushCurrent: {e}"))?;
        let handle = handle(self.ordinal, stream)?;
        let half = self.ty == TensorElementType::Float16;
        let key = (self.ordinal, stream as usize, plan.conv, half);
        let mut tuned = TUNED.lock().unwrap_or_else(PoisonError::into_inner);
        let index = match tuned.iter().position(|(k, _)| *k == key) {
            Some(index) => index,
            None => {
                let chosen = tune(handle.0, &plan.conv, half, [x, w, y], self.ordinal, stream)?;
                tuned.push((key, chosen));
                tuned.len() - 1
            }
        };
        let chosen = &tuned[index].1;
        let workspace = scratch(self.ordinal, stream, chosen.workspace)?;
        execute(handle.0, &chosen.plan, [x, w, y], workspace)
    }
}

/// The descriptors of one convolution: X, W, Y, the convolution, its operation and the
/// operation graph (last).
fn graph(handle: dnn::cudnnHandle_t, g: &ConvDims, half: bool) -> Result<Vec<Desc>, String> {
    use dnn::cudnnDataType_t::{CUDNN_DATA_FLOAT as F32, CUDNN_DATA_HALF as F16};
    let ty = if half { F16 } else { F32 };
    let [n, t, h, w, c, k, kt, kh, kw] =
        [g.n, g.t, g.h, g.w, g.c, g.k, g.kt, g.kh, g.kw].map(|v| v as i64);
    let out_t = g.out_t() as i64;
    // NCDHW dimensions, NDHWC strides.
    let channels_last = |[_, c, t, h, w]: [i64; 5]| [t * h * w * c, 1, h * w * c, w * c, c];
    let x = Desc::tensor(
        UID_X,
        ty,
        &[n, c, t, h, w],
        &channels_last([n, c, t, h, w]),
        false,
    )?;
    let wt = Desc::tensor(
        UID_W,
        ty,
        &[k, c, kt, kh, kw],
        &channels_last([k, c, kt, kh, kw]),
        false,
    )?;
    let y = Desc::tensor(
        UID_Y,
        ty,
        &[n, k, out_t, h, w],
        &channels_last([n, k, out_t, h, w]),
        false,
    )?;
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

/// A plan the heuristics offered, built.
struct Candidate {
    plan: Desc,
    workspace: usize,
    engine: i64,
    config: Desc,
}

/// The engine configurations of `graph` in heuristics mode `mode`, in the heuristics' order,
/// with the heuristics descriptor (kept alive with them).
fn configs(graph: &Desc, mode: dnn::cudnnBackendHeurMode_t) -> Result<(Desc, Vec<Desc>), String> {
    let heur = Desc::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.set_desc(Attr::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)?;
    // SAFETY: one heuristics mode enum value.
    unsafe {
        heur.set(
            Attr::CUDNN_ATTR_ENGINEHEUR_MODE,
            Type::CUDNN_TYPE_HEUR_MODE,
            1,
            (&mode as *const dnn::cudnnBackendHeurMode_t).cast(),
        )?
    };
    let heur = heur.finalize("engine heuristics")?;
    let results = Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS;
    let descriptors = Type::CUDNN_TYPE_BACKEND_DESCRIPTOR;
    // SAFETY: asks for the number of results only.
    let count = unsafe { heur.get(results, descriptors, 0, std::ptr::null_mut())? };
    let configs = (0..count.max(0))
        .map(|_| Desc::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Result<Vec<_>, _>>()?;
    let mut handles: Vec<DescPtr> = configs.iter().map(|c| c.0).collect();
    // SAFETY: `handles` holds `count` engine configuration descriptors for cuDNN to fill.
    let got = unsafe { heur.get(results, descriptors, count, handles.as_mut_ptr().cast())? };
    let configs = configs.into_iter().take(got.max(0) as usize).collect();
    Ok((heur, configs))
}

/// The engine of `config`: its global index and whether its arithmetic is the plain one (see the
/// module's notes).
fn engine_of(config: &Desc, half: bool) -> Result<(i64, bool), String> {
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

/// Every plan the heuristics offer for `graph` that keeps the arithmetic and fits the workspace
/// cap, instant mode's first, then the fallback's; and why the others were left out.
fn candidates(
    handle: dnn::cudnnHandle_t,
    graph: &Desc,
    half: bool,
) -> Result<(Vec<Candidate>, Vec<Desc>, Vec<String>), String> {
    let mut found = Vec::new();
    let mut keep = Vec::new();
    let mut reasons = Vec::new();
    for mode in [
        dnn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_INSTANT,
        dnn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK,
    ] {
        let (heur, configs) = match configs(graph, mode) {
            Ok(found) => found,
            Err(e) => {
                reasons.push(format!("{mode:?}: {e}"));
                continue;
            }
        };
        keep.push(heur);
        for config in configs {
            let (engine, plain) = match engine_of(&config, half) {
                Ok(found) => found,
                Err(e) => {
                    reasons.push(e);
                    continue;
                }
            };
            if !plain {
                continue;
            }
            let built = (|| {
                let plan = Desc::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
                plan.set_handle(Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle)?;
                plan.set_desc(Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &config)?;
                let plan = plan.finalize("execution plan")?;
                let mut workspace = 0i64;
                // SAFETY: one int64 out-value.
                unsafe {
                    plan.get(
                        Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                        Type::CUDNN_TYPE_INT64,
                        1,
                        (&mut workspace as *mut i64).cast(),
                    )?
                };
                Ok::<_, String>((plan, workspace.max(0) as usize))
            })();
            match built {
                Ok((_, workspace)) if workspace > MAX_WORKSPACE => reasons.push(format!(
                    "engine {engine} needs {} MiB of workspace",
                    workspace >> 20
                )),
                Ok((plan, workspace)) => found.push(Candidate {
                    plan,
                    workspace,
                    engine,
                    config,
                }),
                Err(e) => reasons.push(format!("engine {engine}: {e}")),
            }
        }
    }
    Ok((found, keep, reasons))
}

/// Queues the plan on the handle's stream over X, W, Y and the workspace.
fn execute(
    handle: dnn::cudnnHandle_t,
    plan: &Desc,
    [x, w, y]: [u64; 3],
    workspace: u64,
) -> Result<(), String> {
    let pack = Desc::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    pack.set_i64s(
        Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
        &[UID_X, UID_W, UID_Y],
    )?;
    let pointers: [*mut c_void; 3] = [x as _, w as _, y as _];
    let workspace = workspace as *mut c_void;
    // SAFETY: one device pointer per id, and one workspace pointer.
    unsafe {
        pack.set(
            Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            Type::CUDNN_TYPE_VOID_PTR,
            3,
            pointers.as_ptr().cast(),
        )?;
        pack.set(
            Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            Type::CUDNN_TYPE_VOID_PTR,
            1,
            (&workspace as *const *mut c_void).cast(),
        )?;
    }
    let pack = pack.finalize("variant pack")?;
    // SAFETY: the plan and pack are alive; the pointers are device memory of the handle's device
    // holding the plan's tensors, and the workspace has the plan's bytes.
    check(
        pack.1,
        unsafe { (pack.1.execute)(handle, plan.0, pack.0) },
        "cudnnBackendExecute",
    )
}

/// Milliseconds of `TIMED_REPS` runs of `plan` on `stream` (after one warm run), or why it
/// could not run.
fn time_plan(
    handle: dnn::cudnnHandle_t,
    plan: &Desc,
    pointers: [u64; 3],
    workspace: u64,
    stream: sys::CUstream,
) -> Result<f32, String> {
    let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
    let start = driver::event::create(flags).map_err(|e| format!("cuEventCreate: {e}"))?;
    let end = driver::event::create(flags).map_err(|e| format!("cuEventCreate: {e}"))?;
    let timed = (|| {
        execute(handle, plan, pointers, workspace)?;
        // SAFETY: events of the current context, recorded on its stream and waited for here.
        unsafe {
            driver::event::record(start, stream).map_err(|e| format!("cuEventRecord: {e}"))?;
            for _ in 0..TIMED_REPS {
                execute(handle, plan, pointers, workspace)?;
            }
            driver::event::record(end, stream).map_err(|e| format!("cuEventRecord: {e}"))?;
            driver::event::synchronize(end).map_err(|e| format!("cuEventSynchronize: {e}"))?;
            driver::event::elapsed(start, end).map_err(|e| format!("cuEventElapsedTime: {e}"))
        }
    })();
    // SAFETY: the events are not used after this.
    unsafe {
        let _ = driver::event::destroy(start);
        let _ = driver::event::destroy(end);
    }
    timed.map(|ms| ms / TIMED_REPS as f32)
}

/// The plan a shape keeps: the fastest of the candidates on the call's own tensors, or the
/// heuristics' first while the stream is being captured.
fn tune(
    handle: dnn::cudnnHandle_t,
    dims: &ConvDims,
    half: bool,
    pointers: [u64; 3],
    ordinal: i32,
    stream: sys::CUstream,
) -> Result<Tuned, String> {
    let mut parts = graph(handle, dims, half)?;
    let graph = parts.last().expect("the graph is the last descriptor");
    let (found, keep, reasons) = candidates(handle, graph, half)?;
    let describe = || {
        format!(
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
        )
    };
    if found.is_empty() {
        return Err(format!(
            "cuDNN has no engine for this convolution ({}){}{}",
            describe(),
            if reasons.is_empty() { "" } else { ": " },
            reasons.join("; ")
        ));
    }
    // SAFETY: the stream is ONNX Runtime's, alive for the call.
    let capturing = unsafe { driver::stream::is_capturing(stream) }
        .map(|s| s != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
        .unwrap_or(true);
    let mut best = 0;
    let mut times = Vec::new();
    if !capturing && found.len() > 1 {
        let most = found.iter().map(|c| c.workspace).max().unwrap_or(0);
        let workspace = scratch(ordinal, stream, most)?;
        times = found
            .iter()
            .map(|c| time_plan(handle, &c.plan, pointers, workspace, stream).ok())
            .collect();
        best = (0..found.len())
            .filter(|&i| times[i].is_some())
            .min_by(|&a, &b| times[a].partial_cmp(&times[b]).expect("times are finite"))
            .ok_or_else(|| {
                format!(
                    "no execution plan of cuDNN ran this convolution ({})",
                    describe()
                )
            })?;
    }
    if std::env::var_os("UNSTEP_CONV_LOG").is_some_and(|v| v == "1") {
        let us = |i: usize| {
            times
                .get(i)
                .copied()
                .flatten()
                .map_or("untimed".to_string(), |ms| format!("{:.1} µs", ms * 1e3))
        };
        eprintln!(
            "CausalConv3d {}: {} plans, engine {} kept ({}), the heuristics' first engine {} ({})",
            describe(),
            found.len(),
            found[best].engine,
            us(best),
            found[0].engine,
            us(0)
        );
    }
    let chosen = found
        .into_iter()
        .nth(best)
        .expect("best is an index of found");
    parts.push(chosen.config);
    parts.extend(keep);
    Ok(Tuned {
        plan: chosen.plan,
        workspace: chosen.workspace,
        _parts: parts,
    })
}

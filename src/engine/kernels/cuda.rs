//! The CUDA kernels of the `ai.unstep` operators.
//!
//! - The CUDA driver (`libcuda.so`) and NVRTC (`libnvrtc.so.13`) are loaded at run time (cudarc's
//!   dynamic loading): the runner builds and runs without CUDA, and a missing library is an error
//!   when a session asks for these kernels.
//! - `kernels.cu` is compiled by NVRTC once per device and process, when the first kernel is
//!   created (session creation), to a cubin for the device's compute capability (`sm_XY`), and
//!   loaded with `cuModuleLoadData` into the device's primary context, the context ONNX Runtime's
//!   CUDA provider works in through the runtime API. A cubin rather than PTX, so that an NVRTC
//!   newer than the driver (within one CUDA major version) still works: the driver does not JIT
//!   PTX of a newer ISA.
//! - Each compute reads the device pointers of its inputs and outputs (`Tensor::data_ptr`,
//!   ONNX Runtime allocates them on the device, as the operators are registered for
//!   `CUDAExecutionProvider`) and the provider's `cudaStream_t`
//!   (`KernelContext_GetGPUComputeStream`, [`ComputeContext::stream`]), and launches one kernel on
//!   that stream with `cuLaunchKernel` (`PrefixBiasRmsNorm` too: its kernel copies the prefix
//!   rows and writes the tail beside the normalised rows). Nothing synchronises: ONNX Runtime
//!   orders the stream.
//! - Each operator and element type has three kernels, one per row layout ([`Layout`]); each
//!   launch picks one from D and the tensors' alignment: a group of up to 32 threads per row,
//!   with up to four 16-byte accesses each, for D ≤ [`GROUP_MAX_D`] (the VAE's channels-last
//!   rows, D = 96 to 384, a million rows and more), otherwise one block of [`THREADS`] threads
//!   per row with 4-element accesses (the DiT's D = 1536) or pairs. The elementwise `BiasGelu`
//!   takes only a layout's access width ([`Layout::choose_elementwise`]), over a grid-stride loop.

use std::ffi::{CStr, CString, c_void};
use std::sync::{Mutex, OnceLock, PoisonError};

use cudarc::driver::{result as driver, sys};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use ort::memory::AllocationDevice;
use ort::operator::ComputeContext;
use ort::value::{DynTensorValueType, TensorElementType};

use super::{Attrs, DOMAIN, Op, Plan, op_error, plan};

/// The CUDA C source of the kernels.
pub(crate) const SOURCE: &str = include_str!("kernels.cu");
/// `WARP` of `kernels.cu`.
const WARP: u32 = 32;
/// `THREADS` of `kernels.cu`: the block layout's threads per row (one block per row).
pub(crate) const THREADS: u32 = 128;
/// `GROUP_THREADS` of `kernels.cu`: the group layout's threads per block.
pub(crate) const GROUP_THREADS: u32 = 256;
/// `ROW_FLOATS` of `kernels.cu`: the floats of its row a thread holds at most.
pub(crate) const ROW_FLOATS: usize = 16;
/// The largest D the kernels keep in registers (the block layout's).
pub(crate) const MAX_D: usize = THREADS as usize * ROW_FLOATS;
/// The largest D of the group layout (a group is at most one warp).
pub(crate) const GROUP_MAX_D: usize = WARP as usize * ROW_FLOATS;
/// The group layout's unit: the bytes one thread loads or stores in one access.
pub(crate) const UNIT_BYTES: usize = 16;
/// `GROUP_UNITS` of `kernels.cu`: the units of its row a thread of the group layout holds at
/// most, and is given where the row has that many per lane.
pub(crate) const GROUP_UNITS: usize = 4;

/// How a kernel lays a row on the threads (`BlockRow` and `GroupRow` of `kernels.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// One block of [`THREADS`] threads per row, pairs of elements: D even, up to [`MAX_D`].
    Block,
    /// One block of [`THREADS`] threads per row, 4 elements per access: D a multiple of 4, up to
    /// [`MAX_D`], every tensor aligned to 4 elements (wan-1.3b's D = 1536: 3 accesses per
    /// thread instead of 6).
    BlockQuad,
    /// `lanes` threads of a warp per row (a power of two up to 32), [`UNIT_BYTES`] per access,
    /// up to [`GROUP_UNITS`] accesses per thread: D a multiple of a unit, up to [`GROUP_MAX_D`],
    /// and every tensor aligned to a unit. Against a block of 128 threads, which would leave most
    /// of them idle on a short row, and one warp of pairs, which keeps few bytes in flight.
    Group { lanes: u32 },
}

impl Layout {
    /// The entry point kinds, one per layout.
    pub(crate) const KINDS: [Layout; 3] = [
        Layout::Block,
        Layout::BlockQuad,
        Layout::Group { lanes: WARP },
    ];

    /// The layout of rows of D elements of `elem_bytes` bytes whose tensors are all aligned to
    /// `alignment` bytes: the group layout where it can take the row, with the fewest lanes that
    /// hold at most [`GROUP_UNITS`] units each (a power of two, up to a warp); else blocks of
    /// 4-element accesses where D and the alignment allow; else blocks of pairs.
    pub(crate) fn choose(d: usize, elem_bytes: usize, alignment: usize) -> Layout {
        let unit = UNIT_BYTES / elem_bytes;
        if alignment.is_multiple_of(UNIT_BYTES) && d.is_multiple_of(unit) && d <= GROUP_MAX_D {
            let lanes = (d / unit)
                .div_ceil(GROUP_UNITS)
                .next_power_of_two()
                .min(WARP as usize);
            Layout::Group {
                lanes: lanes as u32,
            }
        } else if alignment.is_multiple_of(4 * elem_bytes) && d.is_multiple_of(4) {
            Layout::BlockQuad
        } else {
            Layout::Block
        }
    }

    /// The layout of an elementwise operator ([`Op::elementwise`]) over rows of D: only its unit
    /// matters (16 bytes, 4 elements or a pair, as D and the alignment allow).
    pub(crate) fn choose_elementwise(d: usize, elem_bytes: usize, alignment: usize) -> Layout {
        let group = Layout::Group { lanes: WARP };
        [group, Layout::BlockQuad]
            .into_iter()
            .find(|layout| {
                let unit = layout.unit(elem_bytes);
                alignment.is_multiple_of(unit * elem_bytes) && d.is_multiple_of(unit)
            })
            .unwrap_or(Layout::Block)
    }

    /// The elements one thread loads or stores in one access (`V` of `kernels.cu`).
    pub(crate) fn unit(self, elem_bytes: usize) -> usize {
        match self {
            Layout::Block => 2,
            Layout::BlockQuad => 4,
            Layout::Group { .. } => UNIT_BYTES / elem_bytes,
        }
    }

    /// The threads of a block: the `__launch_bounds__` of the layout's entry points.
    fn threads(self) -> u32 {
        match self {
            Layout::Block | Layout::BlockQuad => THREADS,
            Layout::Group { .. } => GROUP_THREADS,
        }
    }

    /// The grid and block sizes of an elementwise launch over `n` elements of `elem_bytes`:
    /// one access per thread up to a grid-stride cap.
    pub(crate) fn elementwise_dims(self, n: usize, elem_bytes: usize) -> (u32, u32) {
        const MAX_BLOCKS: usize = 1 << 14;
        let threads = self.threads();
        let accesses = n / self.unit(elem_bytes);
        let blocks = accesses.div_ceil(threads as usize).clamp(1, MAX_BLOCKS);
        (blocks as u32, threads)
    }

    /// The grid and block sizes of a launch over `rows` rows, or why there are too many.
    fn launch_dims(self, rows: usize) -> Result<(u32, u32), String> {
        let blocks = match self {
            Layout::Block | Layout::BlockQuad => rows,
            Layout::Group { lanes } => rows.div_ceil((GROUP_THREADS / lanes) as usize),
        };
        let threads = self.threads();
        // The largest grid x dimension CUDA allows.
        match u32::try_from(blocks) {
            Ok(blocks) if blocks <= i32::MAX as u32 => Ok((blocks, threads)),
            _ => Err(format!("{rows} rows are too many for one launch")),
        }
    }
}

pub(super) const REMEDY: &str =
    "or run with `--dit-kernels onnxruntime` (runtime.dit_kernels = \"onnxruntime\")";

/// Refuses a row length `op`'s kernels cannot take: they load element pairs (D even), and those
/// of the row operators keep a row in registers (D at most [`MAX_D`]).
pub(crate) fn check_d(op: Op, d: usize) -> Result<(), String> {
    if op.elementwise() {
        if !d.is_multiple_of(2) {
            return Err(format!("D = {d}: the CUDA kernel needs an even D"));
        }
    } else if !d.is_multiple_of(2) || d > MAX_D {
        return Err(format!(
            "D = {d}: the CUDA kernels need an even D of at most {MAX_D}"
        ));
    }
    Ok(())
}

/// The kernel entry point of an operator, element type and row layout, e.g.
/// `unstep_bias_rms_norm_f16` (block layout) and `unstep_bias_rms_norm_f16_g` (group layout).
pub(crate) fn entry_point(op: Op, ty: TensorElementType, layout: Layout) -> Option<String> {
    let op = match op {
        Op::BiasRmsNormRope => "bias_rms_norm_rope",
        Op::BiasRmsNorm => "bias_rms_norm",
        Op::PrefixBiasRmsNorm => "prefix_bias_rms_norm",
        Op::GatedResidualLayerNorm => "gated_residual_layer_norm",
        Op::QkvNormRopeCache => "qkv_norm_rope_cache",
        Op::BiasGelu => "bias_gelu",
        // A cuBLASLt matmul (gemm.rs), cuDNN's attention (attention.rs) and convolution
        // (conv.rs), no row kernel of kernels.cu.
        Op::MatMulBiasGelu | Op::Attention | Op::CausalConv3d => return None,
    };
    let ty = match ty {
        TensorElementType::Float32 => "f32",
        TensorElementType::Float16 => "f16",
        _ => return None,
    };
    let layout = match layout {
        Layout::Block => "",
        Layout::BlockQuad => "_q",
        Layout::Group { .. } => "_g",
    };
    Some(format!("unstep_{op}_{ty}{layout}"))
}

/// Loads the CUDA driver and NVRTC libraries and initialises the driver, once per process.
pub(super) fn check_libraries() -> Result<(), String> {
    static CHECK: OnceLock<Result<(), String>> = OnceLock::new();
    CHECK
        .get_or_init(|| {
            // SAFETY: as in `check_nvrtc`.
            if !unsafe { sys::is_culib_present() } {
                return Err(format!(
                    "unstep CUDA kernels: could not load the CUDA driver library (libcuda.so.1): {}; \
                     install the NVIDIA driver, {REMEDY}",
                    open_error("libcuda.so.1")
                ));
            }
            check_nvrtc()?;
            driver::init()
                .map_err(|e| format!("unstep CUDA kernels: cuInit failed: {e}; {REMEDY}"))
        })
        .clone()
}

/// Loads NVRTC (enough to compile; no GPU needed).
pub(crate) fn check_nvrtc() -> Result<(), String> {
    // SAFETY: only opens the library (its initialisers have no preconditions); cudarc keeps its
    // own handle, opened by the same names, for the calls.
    if unsafe { nvrtc_sys::is_culib_present() } {
        return Ok(());
    }
    Err(format!(
        "unstep CUDA kernels: could not load NVRTC (libnvrtc.so.13): {}; put CUDA 13's NVRTC on \
         LD_LIBRARY_PATH (`pip install nvidia-cuda-nvrtc==13.*` puts it in \
         site-packages/nvidia/cu13/lib), {REMEDY}",
        open_error("libnvrtc.so.13")
    ))
}

/// Why `name` cannot be opened, in the dynamic loader's words.
fn open_error(name: &str) -> String {
    // SAFETY: as in `check_nvrtc`; the library, if it opens after all, is closed again.
    match unsafe { libloading::Library::new(name) } {
        Ok(_) => "found, but under none of the names cudarc tries".to_string(),
        Err(e) => crate::engine::loader_message(&e),
    }
}

/// NVRTC's version, for messages.
fn nvrtc_version() -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two plain out-parameters.
    match unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }.result() {
        Ok(()) => format!("{major}.{minor}"),
        Err(_) => "unknown".to_string(),
    }
}

/// Compiles `kernels.cu` with NVRTC for `arch` (`sm_90` gives a cubin, `compute_90` PTX) and
/// returns the image. Needs NVRTC, not a GPU.
pub(crate) fn compile(arch: &str) -> Result<Vec<u8>, String> {
    let fail = |what: &str, e: nvrtc::NvrtcError| {
        format!(
            "unstep CUDA kernels: NVRTC {} could not {what} for {arch}: {e}",
            nvrtc_version()
        )
    };
    let source = CString::new(SOURCE).expect("kernels.cu has no NUL byte");
    let name = c"unstep_kernels.cu";
    let program =
        nvrtc::create_program(&source, Some(name)).map_err(|e| fail("create the program", e))?;
    // `--fmad=false`: no contraction of a·b + c, so that the results are the CPU kernels' up to
    // the order of the row sums.
    let options = [
        format!("--gpu-architecture={arch}"),
        "--fmad=false".to_string(),
        "--std=c++17".to_string(),
    ];
    let cubin = arch.starts_with("sm_");
    // SAFETY: `program` is valid until destroyed below; `source` and `name` outlive it.
    let result = unsafe {
        nvrtc::compile_program(program, &options)
            .map_err(|e| {
                let log = nvrtc::get_program_log(program)
                    .map(|log| CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned())
                    .unwrap_or_default();
                format!("{}:\n{log}", fail("compile kernels.cu", e))
            })
            .and_then(|()| {
                if cubin {
                    let mut size = 0usize;
                    nvrtc_sys::nvrtcGetCUBINSize(program, &mut size)
                        .result()
                        .map_err(|e| fail("get the cubin", e))?;
                    let mut image = vec![0u8; size];
                    nvrtc_sys::nvrtcGetCUBIN(program, image.as_mut_ptr().cast())
                        .result()
                        .map_err(|e| fail("get the cubin", e))?;
                    Ok(image)
                } else {
                    let ptx = nvrtc::get_ptx(program).map_err(|e| fail("get the PTX", e))?;
                    // PTX is NUL-terminated text; keep the NUL for cuModuleLoadData.
                    Ok(ptx.iter().map(|&c| c as u8).collect())
                }
            })
    };
    // SAFETY: created above and not destroyed before.
    let _ = unsafe { nvrtc::destroy_program(program) };
    result
}

/// A raw CUDA handle, shared between threads: CUDA's handles may be used from any thread.
#[derive(Clone, Copy)]
pub(super) struct Handle<T>(pub(super) T);
// SAFETY: contexts and functions are process-wide driver objects, valid on every thread.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as above; nothing mutates them through a shared reference.
unsafe impl<T> Sync for Handle<T> {}

/// The kernels loaded into one device's primary context. Never unloaded: the primary context is
/// retained for the rest of the process.
struct DeviceModule {
    context: Handle<sys::CUcontext>,
    functions: Vec<(String, Handle<sys::CUfunction>)>,
}

/// The module of device `ordinal`, compiled and loaded on first use; a failure is kept too, so
/// every session of the process reports the same error.
fn device_module(ordinal: i32) -> Result<&'static DeviceModule, String> {
    type Loaded = Vec<(i32, Result<&'static DeviceModule, String>)>;
    static MODULES: Mutex<Loaded> = Mutex::new(Vec::new());
    let mut modules = MODULES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, module)) = modules.iter().find(|(o, _)| *o == ordinal) {
        return module.clone();
    }
    let module = load_module(ordinal).map(|m| &*Box::leak(Box::new(m)));
    modules.push((ordinal, module.clone()));
    module
}

/// The primary context of device `ordinal` (the one ONNX Runtime's CUDA provider works in),
/// retained for the rest of the process.
pub(super) fn primary_context(ordinal: i32) -> Result<Handle<sys::CUcontext>, String> {
    check_libraries()?;
    let fail = |what: &str, e: driver::DriverError| format!("{what} on CUDA device {ordinal}: {e}");
    let device = driver::device::get(ordinal).map_err(|e| fail("cuDeviceGet", e))?;
    // SAFETY: `device` came from cuDeviceGet. The reference is never released.
    let context = unsafe { driver::primary_ctx::retain(device) }
        .map_err(|e| fail("cuDevicePrimaryCtxRetain", e))?;
    Ok(Handle(context))
}

/// What the kernels need to know of a device: its compute capability and its SM count.
pub(super) struct DeviceInfo {
    pub(super) major: i32,
    pub(super) minor: i32,
    pub(super) sms: i32,
}

/// [`DeviceInfo`] of device `ordinal` (loads the driver first).
pub(super) fn device_info(ordinal: i32) -> Result<DeviceInfo, String> {
    check_libraries()?;
    let fail = |what: &str, e: driver::DriverError| format!("{what} on CUDA device {ordinal}: {e}");
    let device = driver::device::get(ordinal).map_err(|e| fail("cuDeviceGet", e))?;
    let attribute = |a| {
        // SAFETY: `device` came from cuDeviceGet.
        unsafe { driver::device::get_attribute(device, a) }
            .map_err(|e| fail("cuDeviceGetAttribute", e))
    };
    use sys::CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as MAJOR,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as MINOR,
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as SMS,
    };
    Ok(DeviceInfo {
        major: attribute(MAJOR)?,
        minor: attribute(MINOR)?,
        sms: attribute(SMS)?,
    })
}

fn load_module(ordinal: i32) -> Result<DeviceModule, String> {
    let fail = |what: &str, e: driver::DriverError| {
        format!("unstep CUDA kernels: {what} on CUDA device {ordinal}: {e}")
    };
    let info = device_info(ordinal).map_err(|e| format!("unstep CUDA kernels: {e}"))?;
    let arch = format!("sm_{}{}", info.major, info.minor);
    let image = compile(&arch).map_err(|e| format!("{e}; {REMEDY}"))?;
    let context = primary_context(ordinal)
        .map_err(|e| format!("unstep CUDA kernels: {e}"))?
        .0;
    let _current = CurrentContext::enter(context).map_err(|e| fail("cuCtxPushCurrent", e))?;
    // SAFETY: `image` is a complete cubin; the context is current.
    let module = unsafe { driver::module::load_data(image.as_ptr().cast()) }.map_err(|e| {
        format!(
            "{}; the driver may be older than NVRTC {} (use the NVRTC of the driver's CUDA version), {REMEDY}",
            fail(&format!("cuModuleLoadData ({arch} cubin)"), e),
            nvrtc_version()
        )
    })?;
    let mut functions = Vec::new();
    for name in OTHER_ENTRY_POINTS {
        let c_name = CString::new(name).expect("entry point names have no NUL byte");
        // SAFETY: `module` was just loaded and is never unloaded.
        let function = unsafe { driver::module::get_function(module, c_name) }
            .map_err(|e| fail(&format!("cuModuleGetFunction {name}"), e))?;
        functions.push((name.to_string(), Handle(function)));
    }
    let row_ops = Op::ALL
        .into_iter()
        .filter(|&op| entry_point(op, TensorElementType::Float32, Layout::Block).is_some());
    for op in row_ops {
        for ty in [TensorElementType::Float32, TensorElementType::Float16] {
            for layout in Layout::KINDS {
                let name = entry_point(op, ty, layout)
                    .expect("every operator has float32 and float16 kernels");
                if functions.iter().any(|(n, _)| *n == name) {
                    continue;
                }
                let c_name =
                    CString::new(name.as_str()).expect("entry point names have no NUL byte");
                // SAFETY: `module` was just loaded and is never unloaded.
                let function = unsafe { driver::module::get_function(module, c_name) }
                    .map_err(|e| fail(&format!("cuModuleGetFunction {name}"), e))?;
                functions.push((name, Handle(function)));
            }
        }
    }
    Ok(DeviceModule {
        context: Handle(context),
        functions,
    })
}

/// The entry points of `kernels.cu` that are no operator's row kernel: the attention's merge
/// (attention.rs).
pub(crate) const OTHER_ENTRY_POINTS: [&str; 1] = ["unstep_attention_merge_f16"];

/// The function `name` of `kernels.cu` on device `ordinal` (compiled and loaded on first use)
/// and the context it is loaded in.
pub(super) fn device_function(
    ordinal: i32,
    name: &str,
) -> Result<(Handle<sys::CUcontext>, Handle<sys::CUfunction>), String> {
    let module = device_module(ordinal)?;
    let function = module
        .functions
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, f)| *f)
        .ok_or_else(|| format!("unstep CUDA kernels: kernels.cu has no entry point {name}"))?;
    Ok((module.context, function))
}

/// Makes a context current on this thread for the guard's life (the primary context of the
/// device, where ONNX Runtime already made it current, the usual case, costs one query).
pub(super) struct CurrentContext {
    pushed: bool,
}

impl CurrentContext {
    pub(super) fn enter(context: sys::CUcontext) -> Result<Self, driver::DriverError> {
        if driver::ctx::get_current()? == Some(context) {
            return Ok(Self { pushed: false });
        }
        // SAFETY: `context` is a retained primary context, alive for the rest of the process.
        unsafe { sys::cuCtxPushCurrent_v2(context) }.result()?;
        Ok(Self { pushed: true })
    }
}

impl Drop for CurrentContext {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped = std::ptr::null_mut();
            // SAFETY: pops the context `enter` pushed on this thread.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

/// A checked call of an operator on CUDA, ready to launch.
pub(super) struct Call {
    pub(super) plan: Plan,
    /// Device addresses of the inputs, then the outputs, in the operator's order.
    pub(super) pointers: Vec<u64>,
    /// ONNX Runtime's compute stream.
    pub(super) stream: sys::CUstream,
}

/// Checks a call of `op` on CUDA device `ordinal` with element type `ty` against the contract
/// (types, devices, shapes, alignment to element pairs) and allocates its outputs; `None` when
/// the outputs are empty (nothing to launch).
pub(super) fn prepare(
    op: Op,
    ty: TensorElementType,
    ordinal: i32,
    attrs: &Attrs,
    ctx: &ComputeContext,
) -> ort::Result<Option<Call>> {
    let fail = |message: String| op_error(op, format!("(CUDA) {message}"));
    let elem_bytes = elem_bytes(ty);
    // `kind` and `name` are formatted only when the check fails: this runs on every call.
    let on_device = |kind: &str, name: &str, mem: &ort::memory::MemoryInfo<'_>| {
        if mem.allocation_device() == AllocationDevice::CUDA && mem.device_id() == ordinal {
            Ok(())
        } else {
            Err(fail(format!(
                "{kind} {name} is in {} memory of device {}; the kernel runs on CUDA device {}",
                mem.allocation_device().as_str(),
                mem.device_id(),
                ordinal
            )))
        }
    };
    let names = op.inputs();
    let mut inputs = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let tensor = ctx
            .input(i)?
            .ok_or_else(|| fail(format!("input {name} is missing")))?
            .downcast::<DynTensorValueType>()?;
        if *tensor.data_type() != ty {
            return Err(fail(format!(
                "input {name} is {:?}, the node's type is {:?}",
                tensor.data_type(),
                ty
            )));
        }
        on_device("input", name, tensor.memory_info())?;
        inputs.push(tensor);
    }
    let shapes: Vec<&[i64]> = inputs.iter().map(|t| &**t.shape()).collect();
    let plan = plan(op, attrs, &shapes).map_err(ort::Error::new)?;
    let mut pointers: Vec<u64> = inputs.iter().map(|t| t.data_ptr() as u64).collect();
    for (idx, name) in op.outputs().iter().enumerate() {
        let tensor = ctx
            .output(idx, op.output_shape(&shapes, idx))?
            .ok_or_else(|| fail(format!("ONNX Runtime gave no output {name}")))?
            .downcast::<DynTensorValueType>()?;
        on_device("output", name, tensor.memory_info())?;
        // `data_ptr` is ONNX Runtime's GetTensorMutableData: the output's writable memory,
        // which stays ONNX Runtime's; the kernel writes it on the stream.
        pointers.push(tensor.data_ptr() as u64);
    }
    if plan.output_rows() == 0 {
        return Ok(None);
    }
    // Every layout loads and stores at least a pair of elements in one access (the block
    // layout's unit; the group layout's is checked in the launch, which falls back to blocks).
    let all_names = names.iter().chain(op.outputs());
    for (&pointer, name) in pointers.iter().zip(all_names) {
        if pointer % (2 * elem_bytes as u64) != 0 {
            return Err(fail(format!(
                "{name} at {pointer:#x} is not aligned to {} bytes",
                2 * elem_bytes
            )));
        }
    }
    let stream = ctx
        .stream()?
        .ok_or_else(|| fail("ONNX Runtime gave no CUDA compute stream".to_string()))?
        .as_ptr() as sys::CUstream;
    Ok(Some(Call {
        plan,
        pointers,
        stream,
    }))
}

/// The bytes of one element of `ty` (float16 or float32).
fn elem_bytes(ty: TensorElementType) -> usize {
    match ty {
        TensorElementType::Float16 => 2,
        _ => 4,
    }
}

/// A node's CUDA kernel.
pub(super) struct CudaKernel {
    op: Op,
    ty: TensorElementType,
    ordinal: i32,
    module: &'static DeviceModule,
    /// The kernels of the operator and type, per layout.
    block: Handle<sys::CUfunction>,
    block_quad: Handle<sys::CUfunction>,
    group: Handle<sys::CUfunction>,
}

impl CudaKernel {
    /// Compiles and loads the kernels for device `ordinal` if this process has not yet.
    pub(super) fn new(op: Op, ty: TensorElementType, ordinal: i32) -> Result<Self, String> {
        let names = Layout::KINDS.map(|layout| entry_point(op, ty, layout));
        let [Some(block), Some(block_quad), Some(group)] = names else {
            return Err(format!(
                "{DOMAIN} {}: element type {ty:?} is not supported (float32 and float16 are)",
                op.name()
            ));
        };
        let module = device_module(ordinal)?;
        let function = |name: &str| {
            module
                .functions
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, f)| *f)
                .expect("the module has every entry point")
        };
        Ok(Self {
            op,
            ty,
            ordinal,
            module,
            block: function(&block),
            block_quad: function(&block_quad),
            group: function(&group),
        })
    }

    /// The bytes of one element of the kernel's type.
    fn elem_bytes(&self) -> usize {
        elem_bytes(self.ty)
    }

    /// Checks the call and launches the kernel on ONNX Runtime's stream.
    pub(super) fn compute(&self, attrs: &Attrs, ctx: &ComputeContext) -> ort::Result<()> {
        let Some(call) = prepare(self.op, self.ty, self.ordinal, attrs, ctx)? else {
            return Ok(());
        };
        // The launch refuses a D the kernels cannot take (odd, or past MAX_D).
        self.launch(&call.plan, attrs, &call.pointers, call.stream)
            .map_err(|message| op_error(self.op, format!("(CUDA) {message}")))
    }

    /// Launches the kernel of the call's layout ([`Layout::choose`]) on `stream` over `pointers`
    /// (device addresses of the inputs, then the outputs, in the operator's order) with the sizes
    /// of `plan`. Checks nothing but the launch.
    pub(crate) fn launch(
        &self,
        plan: &Plan,
        attrs: &Attrs,
        pointers: &[u64],
        stream: sys::CUstream,
    ) -> Result<(), String> {
        let op = self.op;
        assert_eq!(pointers.len(), op.inputs().len() + op.outputs().len());
        // The kernels load element pairs: an odd D would read misaligned pairs.
        check_d(op, plan.d)?;
        // PrefixBiasRmsNorm's threads cover Y's rows: the prefix's, then the normalised ones.
        let launch_rows = plan.output_rows();
        if launch_rows == 0 {
            return Ok(());
        }
        let _current = CurrentContext::enter(self.module.context.0)
            .map_err(|e| format!("cuCtxPushCurrent: {e}"))?;
        let elem_bytes = self.elem_bytes();
        // The largest power of two (up to a unit) every pointer is aligned to.
        let alignment = pointers
            .iter()
            .map(|&p| 1usize << p.trailing_zeros().min(UNIT_BYTES.trailing_zeros()))
            .min()
            .unwrap_or(UNIT_BYTES);
        let (layout, (blocks, threads)) = if op.elementwise() {
            let layout = Layout::choose_elementwise(plan.d, elem_bytes, alignment);
            (
                layout,
                layout.elementwise_dims(plan.rows * plan.d, elem_bytes),
            )
        } else {
            let layout = Layout::choose(plan.d, elem_bytes, alignment);
            (layout, layout.launch_dims(launch_rows)?)
        };
        let (function, mut lanes) = match layout {
            Layout::Block => (self.block, 0i32),
            Layout::BlockQuad => (self.block_quad, 0i32),
            Layout::Group { lanes } => (self.group, lanes as i32),
        };
        // The kernel's arguments, in the order of its signature in kernels.cu: the input
        // pointers, the output pointers, then the sizes and attributes.
        let mut rows = plan.rows as i64;
        let mut d = plan.d as i32;
        let mut epsilon = attrs.epsilon;
        let mut silu = i32::from(attrs.silu);
        let mut half_hd = plan.half_hd as i32;
        let mut table_rows = plan.table_rows as i64;
        let mut block_rows = plan.block_rows as i64;
        let mut cache_rows = plan.cache_rows as i64;
        let mut prefix_rows = plan.prefix_rows as i64;
        let mut divs = plan.divs.map(|div| div as i64);
        let mut pointers = pointers.to_vec();
        let mut params: Vec<*mut c_void> = pointers
            .iter_mut()
            .map(|p| (p as *mut u64).cast::<c_void>())
            .collect();
        params.push((&mut rows as *mut i64).cast());
        params.push((&mut d as *mut i32).cast());
        params.push((&mut epsilon as *mut f32).cast());
        match op {
            Op::BiasRmsNormRope => {
                params.push((&mut half_hd as *mut i32).cast());
                params.push((&mut table_rows as *mut i64).cast());
            }
            Op::QkvNormRopeCache => {
                params.push((&mut half_hd as *mut i32).cast());
                params.push((&mut table_rows as *mut i64).cast());
                params.push((&mut block_rows as *mut i64).cast());
                params.push((&mut cache_rows as *mut i64).cast());
            }
            Op::BiasRmsNorm => params.push((&mut silu as *mut i32).cast()),
            Op::PrefixBiasRmsNorm => {
                params.push((&mut prefix_rows as *mut i64).cast());
                params.push((&mut silu as *mut i32).cast());
            }
            Op::BiasGelu => {}
            Op::MatMulBiasGelu | Op::Attention | Op::CausalConv3d => {
                unreachable!("a cuBLASLt matmul or a cuDNN call, not a row kernel")
            }
            Op::GatedResidualLayerNorm => {
                for div in divs.iter_mut() {
                    params.push((div as *mut i64).cast());
                }
            }
        }
        params.push((&mut lanes as *mut i32).cast());
        // QkvNormRopeCache: Q, K and V are three launches' worth of rows in one (grid.y).
        let grid_y = if op == Op::QkvNormRopeCache { 3 } else { 1 };
        // SAFETY: the function was loaded from kernels.cu into the current context; `params`
        // points at one value per kernel parameter, of the parameter's type (device pointers as
        // u64, `long long` as i64, `int` as i32, `float` as f32), alive for the call, which copies
        // them; the caller gives device memory of this device, sized by `plan` (checked against
        // the contract) and aligned to element pairs, and a stream of the same (primary) context.
        unsafe {
            driver::launch_kernel(
                function.0,
                (blocks, grid_y, 1),
                (threads, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .map_err(|e| format!("cuLaunchKernel: {e}"))
    }
}

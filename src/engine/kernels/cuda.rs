//! What the CUDA kernels of the `ai.unstep` operators share: the CUDA driver and NVRTC, the module
//! of `kernels.cu` per device, the primary context, and the checked call.
//!
//! - The CUDA driver (`libcuda.so`) and NVRTC (`libnvrtc.so.13`) are loaded at run time (cudarc's
//!   dynamic loading): the runner builds and runs without CUDA, and a missing library is an error
//!   when a session asks for these kernels.
//! - `kernels.cu` is compiled by NVRTC once per device and process, when the first kernel is
//!   created (session creation), to a cubin for the device's compute capability (`sm_XY`), and
//!   loaded with `cuModuleLoadData` into the device's primary context, the context ONNX Runtime's
//!   CUDA provider works in through the runtime API. A cubin rather than PTX, so that an NVRTC
//!   newer than the driver (within one CUDA major version) still works: the driver does not JIT
//!   PTX of a newer ISA. With a kernel cache folder the cubin is kept under its `nvrtc/`
//!   ([`image_file`]): a later process loads it instead of compiling, and compiles only when the
//!   kept image does not load.
//! - [`prepare`] checks a call of any operator against the contract and its CUDA needs (element
//!   types, tensors on the kernel's device, shapes, alignment to element pairs), allocates its
//!   outputs, and reads the device pointers of its inputs and outputs (`Tensor::data_ptr`: ONNX
//!   Runtime allocates them on the device, as the operators are registered for
//!   `CUDAExecutionProvider`) and the provider's `cudaStream_t`
//!   (`KernelContext_GetGPUComputeStream`, [`ComputeContext::stream`]); the operator's
//!   [`CudaKernel`](super::operator::CudaKernel) then queues its work on that stream. Nothing
//!   synchronises: ONNX Runtime orders the stream.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};

use cudarc::driver::{result as driver, sys};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use ort::memory::AllocationDevice;
use ort::operator::ComputeContext;
use ort::value::{DynTensorValueType, TensorElementType};

use super::operator::{UnstepOp, check, op_error};
use super::row_launch::{Layout, elem_bytes, entry_point};
use crate::engine::one_time::{self, Work};

/// The CUDA C source of the kernels.
pub(crate) const SOURCE: &str = include_str!("kernels.cu");

/// What a CUDA error message suggests instead, last, after ", " (an fp8 DiT's refusals take it
/// out: it has no ONNX Runtime kernels to fall back to).
pub(crate) const REMEDY: &str =
    "or run with `--dit-kernels onnxruntime` (runtime.dit_kernels = \"onnxruntime\")";

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

/// NVRTC's options besides the architecture. `--fmad=false`: no contraction of a·b + c, so that
/// the results are the CPU kernels' up to the order of the row sums.
const NVRTC_OPTIONS: [&str; 2] = ["--fmad=false", "--std=c++17"];

/// The file under the kernel cache folder's `nvrtc/` that keeps `kernels.cu`'s image for `arch`:
/// named by a hash of everything the image depends on (the source, NVRTC's options and version,
/// the architecture), so that another build of the runner or another NVRTC never reads it.
pub(crate) fn image_file(cache_dir: &Path, arch: &str, nvrtc: &str) -> PathBuf {
    let key = crate::engine::bundle::sha256_hex(
        format!("{SOURCE}\0{}\0{arch}\0{nvrtc}", NVRTC_OPTIONS.join(" ")).as_bytes(),
    );
    cache_dir
        .join("nvrtc")
        .join(format!("kernels-{arch}-{}.cubin", &key[..16]))
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
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(NVRTC_OPTIONS.iter().map(|o| o.to_string()));
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
    let context = primary_context(ordinal)
        .map_err(|e| format!("unstep CUDA kernels: {e}"))?
        .0;
    let _current = CurrentContext::enter(context).map_err(|e| fail("cuCtxPushCurrent", e))?;
    let load = |image: &[u8]| {
        // SAFETY: the context is current; a damaged image is refused by the driver.
        unsafe { driver::module::load_data(image.as_ptr().cast()) }
    };
    // The image an earlier process kept, when it loads; otherwise compiled now, and kept.
    let file = super::settings()
        .cache_dir
        .map(|dir| image_file(&dir, &arch, &nvrtc_version()));
    let kept = one_time::timed(Work::KernelCompile, || {
        let image = std::fs::read(file.as_deref()?).ok()?;
        load(&image).ok()
    });
    let module = match kept {
        Some(module) => module,
        None => {
            let image = one_time::timed(Work::KernelCompile, || compile(&arch))
                .map_err(|e| format!("{e}; {REMEDY}"))?;
            if let Some(file) = &file {
                super::keep(file, &image, "compiles the kernels");
            }
            load(&image).map_err(|e| {
                format!(
                    "{}; the driver may be older than NVRTC {} (use the NVRTC of the driver's CUDA version), {REMEDY}",
                    fail(&format!("cuModuleLoadData ({arch} cubin)"), e),
                    nvrtc_version()
                )
            })?
        }
    };
    let mut functions = Vec::new();
    for name in OTHER_ENTRY_POINTS {
        let c_name = CString::new(name).expect("entry point names have no NUL byte");
        // SAFETY: `module` was just loaded and is never unloaded.
        let function = unsafe { driver::module::get_function(module, c_name) }
            .map_err(|e| fail(&format!("cuModuleGetFunction {name}"), e))?;
        functions.push((name.to_string(), Handle(function)));
    }
    for base in super::row_kernels() {
        for ty in [TensorElementType::Float32, TensorElementType::Float16] {
            for layout in Layout::KINDS {
                let name = entry_point(base, ty, layout)
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
/// (attention.rs) and `MatMulFp8`'s quantisation of X (gemm.rs).
pub(crate) const OTHER_ENTRY_POINTS: [&str; 2] = [
    "unstep_attention_merge_f16",
    "unstep_quantize_e4m3_rows_f16",
];

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

/// Device memory of the runner's own in device `ordinal`'s primary context, outside ONNX
/// Runtime's arenas, freed when dropped: for buffers that an arena, which keeps what it once held,
/// must not keep (the decoder's causal caches of its run at start).
pub(crate) struct DeviceMemory {
    ptr: u64,
    context: Handle<sys::CUcontext>,
}

impl DeviceMemory {
    /// `bytes` (at least 256) of uninitialised device memory.
    pub(crate) fn new(ordinal: i32, bytes: usize) -> Result<Self, String> {
        let context = primary_context(ordinal)?;
        let _current = CurrentContext::push(context)?;
        // SAFETY: a plain allocation in the current (primary) context, freed once in `drop`.
        let ptr = unsafe { driver::malloc_sync(bytes.max(256)) }.map_err(|e| {
            format!(
                "cuMemAlloc of {} MiB on CUDA device {ordinal}: {e}",
                bytes.div_ceil(1 << 20)
            )
        })?;
        Ok(Self { ptr, context })
    }

    /// The allocation's device address.
    pub(crate) fn ptr(&self) -> *mut std::ffi::c_void {
        self.ptr as *mut std::ffi::c_void
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // cuMemFree waits for the work queued on the memory (it synchronises the context).
        if let Ok(_current) = CurrentContext::push(self.context) {
            // SAFETY: allocated in `new` in this context, freed once.
            let _ = unsafe { driver::free_sync(self.ptr) };
        }
    }
}

/// Makes a context current on this thread for the guard's life (the primary context of the
/// device, where ONNX Runtime already made it current, the usual case, costs one query).
pub(super) struct CurrentContext {
    pushed: bool,
}

impl CurrentContext {
    /// [`Self::enter`], with an error message naming the call.
    pub(super) fn push(context: Handle<sys::CUcontext>) -> Result<Self, String> {
        Self::enter(context.0).map_err(|e| format!("cuCtxPushCurrent: {e}"))
    }

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
pub(super) struct Call<S> {
    pub(super) sizes: S,
    /// Device addresses of the inputs, then the outputs, in the operator's order.
    pub(super) pointers: Vec<u64>,
    /// ONNX Runtime's compute stream.
    pub(super) stream: sys::CUstream,
}

/// Checks a call of `O` on CUDA device `ordinal` with element type `ty` against the contract
/// (types, devices, shapes, alignment to element pairs) and allocates its outputs; `None` when
/// the outputs are empty (nothing to launch).
pub(super) fn prepare<O: UnstepOp>(
    ty: TensorElementType,
    ordinal: i32,
    attrs: &O::Attrs,
    ctx: &ComputeContext,
) -> ort::Result<Option<Call<O::Sizes>>> {
    let info = &O::INFO;
    let fail = |message: String| op_error(info, format!("(CUDA) {message}"));
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
    let names = info.inputs;
    let mut inputs = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let tensor = ctx
            .input(i)?
            .ok_or_else(|| fail(format!("input {name} is missing")))?
            .downcast::<DynTensorValueType>()?;
        let expected = info.input_type(i, ty);
        if *tensor.data_type() != expected {
            return Err(fail(format!(
                "input {name} is {:?}, it must be {expected:?} (the node's type is {ty:?})",
                tensor.data_type(),
            )));
        }
        on_device("input", name, tensor.memory_info())?;
        inputs.push(tensor);
    }
    let shapes: Vec<&[i64]> = inputs.iter().map(|t| &**t.shape()).collect();
    let sizes = check::<O>(attrs, &shapes).map_err(ort::Error::new)?;
    let mut pointers: Vec<u64> = inputs.iter().map(|t| t.data_ptr() as u64).collect();
    for (idx, name) in info.outputs.iter().enumerate() {
        let tensor = ctx
            .output(idx, O::output_shape(&shapes, idx))?
            .ok_or_else(|| fail(format!("ONNX Runtime gave no output {name}")))?
            .downcast::<DynTensorValueType>()?;
        on_device("output", name, tensor.memory_info())?;
        // `data_ptr` is ONNX Runtime's GetTensorMutableData: the output's writable memory,
        // which stays ONNX Runtime's; the kernel writes it on the stream.
        pointers.push(tensor.data_ptr() as u64);
    }
    if O::is_empty(&sizes) {
        return Ok(None);
    }
    // Every layout loads and stores at least a pair of elements in one access (the block
    // layout's unit; the group layout's is checked in the launch, which falls back to blocks).
    let all_names = names.iter().chain(info.outputs);
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
        sizes,
        pointers,
        stream,
    }))
}

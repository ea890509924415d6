//! What the CUDA kernels of the `ai.unstep` operators share: the CUDA driver and NVRTC, the modules
//! of `kernels.cu` and `attention8.cu` per device, the primary context, and the checked call.
//!
//! - The CUDA driver (`libcuda.so`) and NVRTC (`libnvrtc.so.13`) are loaded at run time (cudarc's
//!   dynamic loading): the runner builds and runs without CUDA, and a missing library is an error
//!   when a session asks for these kernels.
//! - `kernels.cu` is compiled by NVRTC once per device and process, when the first kernel is
//!   created (session creation), to a cubin for the device's compute capability (`sm_XY`;
//!   `attention8.cu`, the 8-bit attention's, for `sm_90a`, Hopper's own instructions, when an
//!   `Attention` kernel in that mode is created), and
//!   loaded with `cuModuleLoadData` into the device's primary context, the context ONNX Runtime's
//!   CUDA provider works in through the runtime API. A cubin rather than PTX, so that an NVRTC
//!   newer than the driver (within one CUDA major version) still works: the driver does not JIT
//!   PTX of a newer ISA. With a kernel cache folder the cubin is kept under its `nvrtc/`
//!   ([`image_file`]): a later process loads it instead of compiling, and compiles only when the
//!   kept image does not load.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::engine::one_time::{self, Work};

/// An error of the CUDA driver, NVRTC or the module of `kernels.cu`, in the words a user reads.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum CudaError {
    /// The CUDA driver library does not load.
    #[error(
        "unstep CUDA kernels: could not load the CUDA driver library (libcuda.so.1): {reason}; \
         install the NVIDIA driver, {REMEDY}"
    )]
    NoDriver { reason: String },
    /// NVRTC does not load.
    #[error(
        "unstep CUDA kernels: could not load NVRTC (libnvrtc.so.13): {reason}; put CUDA 13's \
         NVRTC on LD_LIBRARY_PATH (`pip install nvidia-cuda-nvrtc==13.*` puts it in \
         site-packages/nvidia/cu13/lib), {REMEDY}"
    )]
    NoNvrtc { reason: String },
    #[error("unstep CUDA kernels: cuInit failed: {0}; {REMEDY}")]
    Init(driver::DriverError),
    /// A driver call on a device failed.
    #[error("{call} on CUDA device {ordinal}: {source}")]
    Driver {
        call: String,
        ordinal: i32,
        source: driver::DriverError,
    },
    #[error("cuCtxPushCurrent: {0}")]
    PushContext(driver::DriverError),
    #[error("cuMemAlloc of {mib} MiB on CUDA device {ordinal}: {source}")]
    Alloc {
        mib: usize,
        ordinal: i32,
        source: driver::DriverError,
    },
    /// An NVRTC call failed; `log` is the compile log of a failed compile.
    #[error(
        "unstep CUDA kernels: NVRTC {version} could not {what} for {arch}: {source}{}",
        log.as_deref().map(|log| format!(":\n{log}")).unwrap_or_default()
    )]
    Nvrtc {
        version: String,
        what: &'static str,
        arch: String,
        source: nvrtc::NvrtcError,
        log: Option<String>,
    },
    /// The compiled image does not load.
    #[error(
        "{load}; the driver may be older than NVRTC {version} (use the NVRTC of the driver's CUDA \
         version), {REMEDY}"
    )]
    LoadImage {
        load: Box<CudaError>,
        version: String,
    },
    #[error("unstep CUDA kernels: kernels.cu has no entry point {0}")]
    NoEntryPoint(String),
    /// An error of the kernels' setup, said as theirs.
    #[error("unstep CUDA kernels: {0}")]
    Kernels(Box<CudaError>),
    /// An error with the remedy after it.
    #[error("{0}; {REMEDY}")]
    WithRemedy(Box<CudaError>),
}
use cudarc::driver::{result as driver, sys};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

/// The CUDA C source of the kernels.
pub(crate) const SOURCE: &str = include_str!("kernels.cu");

/// A CUDA C source of the runner's kernels, compiled per device: what its module is built from.
pub(crate) struct KernelSource {
    /// Its file's name (messages, kept images).
    pub(crate) file: &'static str,
    /// What compiling it is called in an NVRTC error.
    pub(crate) compiling: &'static str,
    pub(crate) text: &'static str,
    /// The NVRTC architecture of a device of compute capability (major, minor).
    pub(crate) arch: fn(i32, i32) -> String,
    /// The functions a module of it must have.
    pub(crate) entry_points: fn() -> Vec<String>,
}

impl KernelSource {
    /// The architecture this source is compiled for on a device of compute capability
    /// (major, minor).
    pub(crate) fn arch_of(&self, major: i32, minor: i32) -> String {
        (self.arch)(major, minor)
    }
}

/// `kernels.cu`: the row kernels and helpers, for the device's own compute capability.
pub(crate) static KERNELS: KernelSource = KernelSource {
    file: "kernels.cu",
    compiling: "compile kernels.cu",
    text: SOURCE,
    arch: |major, minor| format!("sm_{major}{minor}"),
    entry_points: super::entry_points,
};

/// What a CUDA error message suggests instead, last, after ", " (an fp8 DiT's refusals take it
/// out: it has no ONNX Runtime kernels to fall back to).
pub(crate) const REMEDY: &str =
    "or run with `--dit-kernels onnxruntime` (runtime.dit_kernels = \"onnxruntime\")";

/// Loads the CUDA driver and NVRTC libraries and initialises the driver, once per process.
pub(super) fn check_libraries() -> Result<(), CudaError> {
    static CHECK: OnceLock<Result<(), CudaError>> = OnceLock::new();
    CHECK
        .get_or_init(|| {
            // SAFETY: as in `check_nvrtc`.
            if !unsafe { sys::is_culib_present() } {
                return Err(CudaError::NoDriver {
                    reason: open_error("libcuda.so.1"),
                });
            }
            check_nvrtc()?;
            driver::init().map_err(CudaError::Init)
        })
        .clone()
}

/// Loads NVRTC (enough to compile; no GPU needed).
pub(crate) fn check_nvrtc() -> Result<(), CudaError> {
    // SAFETY: only opens the library (its initialisers have no preconditions); cudarc keeps its
    // own handle, opened by the same names, for the calls.
    if unsafe { nvrtc_sys::is_culib_present() } {
        return Ok(());
    }
    Err(CudaError::NoNvrtc {
        reason: open_error("libnvrtc.so.13"),
    })
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

/// The file under the kernel cache folder's `nvrtc/` that keeps `source`'s image for `arch`:
/// named by a hash of everything the image depends on (the source, NVRTC's options and version,
/// the architecture), so that another build of the runner or another NVRTC never reads it.
pub(crate) fn image_file(
    cache_dir: &Path,
    source: &KernelSource,
    arch: &str,
    nvrtc: &str,
) -> PathBuf {
    let key = crate::engine::bundle::sha256_hex(
        format!(
            "{}\0{}\0{arch}\0{nvrtc}",
            source.text,
            NVRTC_OPTIONS.join(" ")
        )
        .as_bytes(),
    );
    let stem = source.file.trim_end_matches(".cu");
    cache_dir
        .join("nvrtc")
        .join(format!("{stem}-{arch}-{}.cubin", &key[..16]))
}

/// Compiles `kernels.cu` with NVRTC for `arch` (`sm_90` gives a cubin, `compute_90` PTX) and
/// returns the image. Needs NVRTC, not a GPU.
#[cfg(test)]
pub(crate) fn compile(arch: &str) -> Result<Vec<u8>, CudaError> {
    compile_source(&KERNELS, arch)
}

/// Compiles `source` with NVRTC for `arch`, as [`compile`] does `kernels.cu`.
pub(crate) fn compile_source(source: &KernelSource, arch: &str) -> Result<Vec<u8>, CudaError> {
    let error = |what: &'static str, e: nvrtc::NvrtcError, log: Option<String>| CudaError::Nvrtc {
        version: nvrtc_version(),
        what,
        arch: arch.to_string(),
        source: e,
        log,
    };
    let fail = |what: &'static str, e: nvrtc::NvrtcError| error(what, e, None);
    let (file, compiling) = (source.file, source.compiling);
    let source = CString::new(source.text).expect("a kernel source has no NUL byte");
    let name = CString::new(format!("unstep_{file}")).expect("a file name has no NUL byte");
    let program =
        nvrtc::create_program(&source, Some(&name)).map_err(|e| fail("create the program", e))?;
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
                error(compiling, e, Some(log))
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

/// The module of `source` on device `ordinal`, compiled and loaded on first use; a failure is
/// kept too, so every session of the process reports the same error.
fn device_module(
    source: &'static KernelSource,
    ordinal: i32,
) -> Result<&'static DeviceModule, CudaError> {
    type Loaded = Vec<(&'static str, i32, Result<&'static DeviceModule, CudaError>)>;
    static MODULES: Mutex<Loaded> = Mutex::new(Vec::new());
    let mut modules = MODULES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, _, module)) = modules
        .iter()
        .find(|(f, o, _)| *f == source.file && *o == ordinal)
    {
        return module.clone();
    }
    let module = load_module(source, ordinal).map(|m| &*Box::leak(Box::new(m)));
    modules.push((source.file, ordinal, module.clone()));
    module
}

/// Compiles and loads `source` on device `ordinal` unless it is already: for a thread that does
/// it ahead of the sessions ([`super::compile_ahead`]), which find the outcome kept.
pub(super) fn load_ahead(source: &'static KernelSource, ordinal: i32) {
    let _kept = device_module(source, ordinal);
}

/// The primary context of device `ordinal` (the one ONNX Runtime's CUDA provider works in),
/// retained for the rest of the process.
pub(super) fn primary_context(ordinal: i32) -> Result<Handle<sys::CUcontext>, CudaError> {
    check_libraries()?;
    let fail = |what: &str, e| driver_error(what, ordinal, e);
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
pub(super) fn device_info(ordinal: i32) -> Result<DeviceInfo, CudaError> {
    check_libraries()?;
    let fail = |what: &str, e| driver_error(what, ordinal, e);
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

/// A failed driver call `what` on device `ordinal`.
fn driver_error(what: &str, ordinal: i32, source: driver::DriverError) -> CudaError {
    CudaError::Driver {
        call: what.to_string(),
        ordinal,
        source,
    }
}

fn load_module(source: &KernelSource, ordinal: i32) -> Result<DeviceModule, CudaError> {
    let kernels = |e: CudaError| CudaError::Kernels(Box::new(e));
    let fail = |what: &str, e| kernels(driver_error(what, ordinal, e));
    let info = device_info(ordinal).map_err(kernels)?;
    let arch = source.arch_of(info.major, info.minor);
    let context = primary_context(ordinal).map_err(kernels)?.0;
    let _current = CurrentContext::enter(context).map_err(|e| fail("cuCtxPushCurrent", e))?;
    let load = |image: &[u8]| {
        // SAFETY: the context is current; a damaged image is refused by the driver.
        unsafe { driver::module::load_data(image.as_ptr().cast()) }
    };
    // The image an earlier process kept, when it loads; otherwise compiled now, and kept.
    let file = super::settings()
        .cache_dir
        .map(|dir| image_file(&dir, source, &arch, &nvrtc_version()));
    let kept = one_time::timed(Work::KernelCompile, || {
        let image = std::fs::read(file.as_deref()?).ok()?;
        load(&image).ok()
    });
    let module = match kept {
        Some(module) => module,
        None => {
            let image = one_time::timed(Work::KernelCompile, || compile_source(source, &arch))
                .map_err(|e| CudaError::WithRemedy(Box::new(e)))?;
            if let Some(file) = &file {
                super::keep(file, &image, "compiles the kernels");
            }
            load(&image).map_err(|e| CudaError::LoadImage {
                load: Box::new(fail(&format!("cuModuleLoadData ({arch} cubin)"), e)),
                version: nvrtc_version(),
            })?
        }
    };
    let mut functions = Vec::new();
    for name in (source.entry_points)() {
        let c_name = CString::new(name.as_str()).expect("entry point names have no NUL byte");
        // SAFETY: `module` was just loaded and is never unloaded.
        let function = unsafe { driver::module::get_function(module, c_name) }
            .map_err(|e| fail(&format!("cuModuleGetFunction {name}"), e))?;
        functions.push((name, Handle(function)));
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
) -> Result<(Handle<sys::CUcontext>, Handle<sys::CUfunction>), CudaError> {
    source_function(&KERNELS, ordinal, name)
}

/// The function `name` of `source` on device `ordinal`, as [`device_function`].
pub(super) fn source_function(
    source: &'static KernelSource,
    ordinal: i32,
    name: &str,
) -> Result<(Handle<sys::CUcontext>, Handle<sys::CUfunction>), CudaError> {
    let module = device_module(source, ordinal)?;
    let function = module
        .functions
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, f)| *f)
        .ok_or_else(|| CudaError::NoEntryPoint(name.to_string()))?;
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
    pub(crate) fn new(ordinal: i32, bytes: usize) -> Result<Self, CudaError> {
        let context = primary_context(ordinal)?;
        let _current = CurrentContext::push(context)?;
        // SAFETY: a plain allocation in the current (primary) context, freed once in `drop`.
        let ptr =
            unsafe { driver::malloc_sync(bytes.max(256)) }.map_err(|source| CudaError::Alloc {
                mib: bytes.div_ceil(1 << 20),
                ordinal,
                source,
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
    pub(super) fn push(context: Handle<sys::CUcontext>) -> Result<Self, CudaError> {
        Self::enter(context.0).map_err(CudaError::PushContext)
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

//! cuDNN for the runner's operators (`Attention`, `CausalConv3d`): the library, loaded at run
//! time by its soname `libcudnn.so.9` so that the process has the one ONNX Runtime's CUDA provider
//! loaded, the backend API's descriptors, and one handle and one scratch buffer per device and
//! stream, kept for the process (a captured CUDA graph keeps pointing at them).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Mutex, OnceLock, PoisonError};

use cudarc::cudnn::sys as dnn;
use cudarc::driver::{result as driver, sys};

use super::DOMAIN;
use super::cuda::{CudaError, Handle, REMEDY};

pub(super) use dnn::cudnnBackendAttributeName_t as Attr;
pub(super) use dnn::cudnnBackendAttributeType_t as Type;
pub(super) use dnn::cudnnBackendDescriptorType_t as Kind;

/// The cuDNN library name: the soname ONNX Runtime's CUDA provider links.
const LIBRARY: &str = "libcudnn.so.9";
/// The first cuDNN with the SDPA forward operation of the backend API (`Attention`).
const MIN_VERSION: usize = 91301;
/// What a cuDNN that does not load or is too old suggests, before [`REMEDY`].
const INSTALL: &str = "put cuDNN 9.13.1 or later on LD_LIBRARY_PATH (`pip install \
                       nvidia-cudnn-cu13` puts it in site-packages/nvidia/cudnn/lib)";

/// An error of cuDNN: the library, a call, or what a call needs of its tensors, in the words a
/// user reads.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum CudnnError {
    /// `libcudnn.so.9` does not load.
    #[error(
        "{DOMAIN} Attention and CausalConv3d: could not load cuDNN ({LIBRARY}): {reason}; \
         {INSTALL}, {REMEDY}"
    )]
    NotLoaded { reason: String },
    /// The cuDNN loaded is older than [`MIN_VERSION`].
    #[error(
        "{DOMAIN} Attention and CausalConv3d: cuDNN {version} has no SDPA operation (9.13.1 and \
         later have it); {INSTALL}, {REMEDY}"
    )]
    TooOld { version: usize },
    /// The library loaded lacks an entry point.
    #[error("{LIBRARY} has no {name}: {reason}")]
    NoSymbol { name: &'static str, reason: String },
    /// A cuDNN call failed: what it was, and cuDNN's name for the status.
    #[error("{what}: {name} ({status})")]
    Call {
        what: String,
        name: String,
        status: Status,
    },
    #[error("cuMemAlloc of {kib} KiB of cuDNN scratch on CUDA device {ordinal}: {source}")]
    ScratchAlloc {
        kib: usize,
        ordinal: i32,
        source: driver::DriverError,
    },
    /// A tensor that does not start on 16 bytes.
    #[error("{name} at {address:#x} is not aligned to 16 bytes, as cuDNN needs")]
    Misaligned { name: &'static str, address: u64 },
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

pub(super) type Status = c_int;
pub(super) type DescPtr = dnn::cudnnBackendDescriptor_t;

/// The cuDNN entry points this kernel calls (statuses as plain ints: a value this build does not
/// know must not become an invalid enum).
pub(super) struct Cudnn {
    _library: libloading::Library,
    /// `cudnnGetVersion`, e.g. 91900 for 9.19.0.
    pub(super) version: usize,
    create: unsafe extern "C" fn(*mut dnn::cudnnHandle_t) -> Status,
    set_stream: unsafe extern "C" fn(dnn::cudnnHandle_t, dnn::cudaStream_t) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    create_descriptor: unsafe extern "C" fn(Kind, *mut DescPtr) -> Status,
    destroy_descriptor: unsafe extern "C" fn(DescPtr) -> Status,
    set_attribute: unsafe extern "C" fn(DescPtr, Attr, Type, i64, *const c_void) -> Status,
    get_attribute: unsafe extern "C" fn(DescPtr, Attr, Type, i64, *mut i64, *mut c_void) -> Status,
    finalize: unsafe extern "C" fn(DescPtr) -> Status,
    pub(super) execute: unsafe extern "C" fn(dnn::cudnnHandle_t, DescPtr, DescPtr) -> Status,
}

/// cuDNN, loaded on first use (no GPU needed); a failure is kept, so every session of the process
/// reports the same error.
pub(super) fn cudnn() -> Result<&'static Cudnn, CudnnError> {
    static CUDNN: OnceLock<Result<Cudnn, CudnnError>> = OnceLock::new();
    CUDNN.get_or_init(load_cudnn).as_ref().map_err(Clone::clone)
}

fn load_cudnn() -> Result<Cudnn, CudnnError> {
    // SAFETY: cuDNN's initialisers have no preconditions.
    let library =
        unsafe { libloading::Library::new(LIBRARY) }.map_err(|e| CudnnError::NotLoaded {
            reason: crate::engine::loader_message(&e),
        })?;
    /// One entry point, by name, as the function type it is stored as.
    ///
    /// # Safety
    /// `T` is the C signature of `name`.
    unsafe fn symbol<T: Copy>(
        library: &libloading::Library,
        name: &'static str,
    ) -> Result<T, CudnnError> {
        // SAFETY: the caller's promise.
        unsafe { library.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| CudnnError::NoSymbol {
                name,
                reason: e.to_string(),
            })
    }
    // SAFETY: each type is the entry point's signature in cudnn_graph.h / cudnn_ops.h (cuDNN 9).
    let loaded = unsafe {
        let version: unsafe extern "C" fn() -> usize = symbol(&library, "cudnnGetVersion")?;
        let version = version();
        if version < MIN_VERSION {
            return Err(CudnnError::TooOld { version });
        }
        Cudnn {
            version,
            create: symbol(&library, "cudnnCreate")?,
            set_stream: symbol(&library, "cudnnSetStream")?,
            error_string: symbol(&library, "cudnnGetErrorString")?,
            create_descriptor: symbol(&library, "cudnnBackendCreateDescriptor")?,
            destroy_descriptor: symbol(&library, "cudnnBackendDestroyDescriptor")?,
            set_attribute: symbol(&library, "cudnnBackendSetAttribute")?,
            get_attribute: symbol(&library, "cudnnBackendGetAttribute")?,
            finalize: symbol(&library, "cudnnBackendFinalize")?,
            execute: symbol(&library, "cudnnBackendExecute")?,
            _library: library,
        }
    };
    Ok(loaded)
}

/// Loads cuDNN (no GPU needed).
pub(super) fn check_cudnn() -> Result<(), CudnnError> {
    cudnn().map(|_| ())
}

/// A cuDNN call's error: what failed and cuDNN's name for the status.
pub(super) fn check(lib: &Cudnn, status: Status, what: &str) -> Result<(), CudnnError> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: cuDNN returns a static NUL-terminated string for any status.
    let name = unsafe { CStr::from_ptr((lib.error_string)(status)) };
    Err(CudnnError::Call {
        what: what.to_string(),
        name: name.to_string_lossy().into_owned(),
        status,
    })
}

/// A cuDNN backend descriptor, destroyed on drop.
pub(super) struct Desc(pub(super) DescPtr, pub(super) &'static Cudnn);

// SAFETY: backend descriptors are plain host objects; a kernel uses its own from one thread at a
// time (ONNX Runtime calls a node's compute from one thread at a time).
unsafe impl Send for Desc {}
// SAFETY: shared descriptors are finalized ones that are only read or executed: the attention's
// plans, shared by the nodes of a handle (one stream, whose calls come one at a time).
unsafe impl Sync for Desc {}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `Desc::new`, destroyed once.
        let _ = unsafe { (self.1.destroy_descriptor)(self.0) };
    }
}

impl Desc {
    pub(super) fn new(kind: Kind) -> Result<Self, CudnnError> {
        let lib = cudnn()?;
        let mut desc = std::ptr::null_mut();
        // SAFETY: an out-parameter.
        check(
            lib,
            unsafe { (lib.create_descriptor)(kind, &mut desc) },
            &format!("cudnnBackendCreateDescriptor ({kind:?})"),
        )?;
        Ok(Self(desc, lib))
    }

    /// Reads `attr`: up to `capacity` values of `ty` into `values`; returns how many there are.
    ///
    /// # Safety
    /// `values` has room for `capacity` values of the C type of `ty` (or is null with 0).
    pub(super) unsafe fn get(
        &self,
        attr: Attr,
        ty: Type,
        capacity: i64,
        values: *mut c_void,
    ) -> Result<i64, CudnnError> {
        let mut count = 0i64;
        // SAFETY: the caller's promise; the descriptor is alive.
        check(
            self.1,
            unsafe { (self.1.get_attribute)(self.0, attr, ty, capacity, &mut count, values) },
            &format!("cudnnBackendGetAttribute ({attr:?})"),
        )?;
        Ok(count)
    }

    /// Sets `attr` to `count` values of `ty` at `values`.
    ///
    /// # Safety
    /// `values` points at `count` values of the C type of `ty`.
    pub(super) unsafe fn set(
        &self,
        attr: Attr,
        ty: Type,
        count: i64,
        values: *const c_void,
    ) -> Result<(), CudnnError> {
        // SAFETY: the caller's promise; the descriptor is alive.
        check(
            self.1,
            unsafe { (self.1.set_attribute)(self.0, attr, ty, count, values) },
            &format!("cudnnBackendSetAttribute ({attr:?})"),
        )
    }

    pub(super) fn set_i64s(&self, attr: Attr, values: &[i64]) -> Result<(), CudnnError> {
        // SAFETY: int64 values.
        unsafe {
            self.set(
                attr,
                Type::CUDNN_TYPE_INT64,
                values.len() as i64,
                values.as_ptr().cast(),
            )
        }
    }

    pub(super) fn set_desc(&self, attr: Attr, desc: &Desc) -> Result<(), CudnnError> {
        // SAFETY: one descriptor handle.
        unsafe {
            self.set(
                attr,
                Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                1,
                (&desc.0 as *const dnn::cudnnBackendDescriptor_t).cast(),
            )
        }
    }

    pub(super) fn set_handle(
        &self,
        attr: Attr,
        handle: dnn::cudnnHandle_t,
    ) -> Result<(), CudnnError> {
        // SAFETY: one handle.
        unsafe {
            self.set(
                attr,
                Type::CUDNN_TYPE_HANDLE,
                1,
                (&handle as *const dnn::cudnnHandle_t).cast(),
            )
        }
    }

    pub(super) fn finalize(self, what: &str) -> Result<Self, CudnnError> {
        // SAFETY: the descriptor is alive.
        check(
            self.1,
            unsafe { (self.1.finalize)(self.0) },
            &format!("cudnnBackendFinalize ({what})"),
        )?;
        Ok(self)
    }

    /// A tensor: `dims` and `strides` in elements (cuDNN's order: batch, then channels or heads,
    /// then the rest), 16-byte aligned.
    pub(super) fn tensor(
        uid: i64,
        ty: dnn::cudnnDataType_t,
        dims: &[i64],
        strides: &[i64],
        by_value: bool,
    ) -> Result<Self, CudnnError> {
        let t = Desc::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        // SAFETY: one data type enum value.
        unsafe {
            t.set(
                Attr::CUDNN_ATTR_TENSOR_DATA_TYPE,
                Type::CUDNN_TYPE_DATA_TYPE,
                1,
                (&ty as *const dnn::cudnnDataType_t).cast(),
            )?
        };
        t.set_i64s(Attr::CUDNN_ATTR_TENSOR_DIMENSIONS, dims)?;
        t.set_i64s(Attr::CUDNN_ATTR_TENSOR_STRIDES, strides)?;
        t.set_i64s(Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
        t.set_i64s(Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[16])?;
        if by_value {
            let yes = true;
            // SAFETY: one C bool.
            unsafe {
                t.set(
                    Attr::CUDNN_ATTR_TENSOR_IS_BY_VALUE,
                    Type::CUDNN_TYPE_BOOLEAN,
                    1,
                    (&yes as *const bool).cast(),
                )?
            };
        }
        t.finalize("tensor")
    }
}

/// The cuDNN handle of `stream` on device `ordinal` (its primary context current), created on
/// first use and never destroyed.
pub(super) fn handle(
    ordinal: i32,
    stream: sys::CUstream,
) -> Result<Handle<dnn::cudnnHandle_t>, CudnnError> {
    type Handles = Vec<(i32, usize, Handle<dnn::cudnnHandle_t>)>;
    static HANDLES: Mutex<Handles> = Mutex::new(Vec::new());
    let mut handles = HANDLES.lock().unwrap_or_else(PoisonError::into_inner);
    let key = stream as usize;
    if let Some((_, _, h)) = handles.iter().find(|(o, s, _)| *o == ordinal && *s == key) {
        return Ok(*h);
    }
    let h = create_handle(ordinal)?;
    set_stream(h, stream)?;
    handles.push((ordinal, key, h));
    Ok(h)
}

/// A new cuDNN handle on device `ordinal` (its primary context current), never destroyed.
pub(super) fn create_handle(ordinal: i32) -> Result<Handle<dnn::cudnnHandle_t>, CudnnError> {
    let lib = cudnn()?;
    let mut h = std::ptr::null_mut();
    // SAFETY: an out-parameter; the device's primary context is current.
    check(
        lib,
        unsafe { (lib.create)(&mut h) },
        &format!("cudnnCreate on CUDA device {ordinal}"),
    )?;
    Ok(Handle(h))
}

/// Makes `handle` queue its work on `stream` (of the handle's device).
pub(super) fn set_stream(
    handle: Handle<dnn::cudnnHandle_t>,
    stream: sys::CUstream,
) -> Result<(), CudnnError> {
    let lib = cudnn()?;
    // SAFETY: a live handle; the stream belongs to the current context, its device's.
    check(
        lib,
        unsafe { (lib.set_stream)(handle.0, stream as dnn::cudaStream_t) },
        "cudnnSetStream",
    )
}

/// At least `bytes` of scratch for `stream` on device `ordinal`: the buffer of a smaller earlier
/// request is kept (a captured graph may point at it) and a larger one allocated beside it.
pub(super) fn scratch(
    ordinal: i32,
    stream: sys::CUstream,
    bytes: usize,
) -> Result<u64, CudnnError> {
    type Buffers = Vec<(i32, usize, usize, u64)>;
    static BUFFERS: Mutex<Buffers> = Mutex::new(Vec::new());
    let mut buffers = BUFFERS.lock().unwrap_or_else(PoisonError::into_inner);
    let key = stream as usize;
    if let Some((_, _, _, ptr)) = buffers
        .iter()
        .rev()
        .find(|(o, s, n, _)| *o == ordinal && *s == key && *n >= bytes)
    {
        return Ok(*ptr);
    }
    // SAFETY: a plain allocation in the current (primary) context, kept for the process.
    let ptr = unsafe { driver::malloc_sync(bytes.max(256)) }.map_err(|source| {
        CudnnError::ScratchAlloc {
            kib: bytes.div_ceil(1024),
            ordinal,
            source,
        }
    })?;
    buffers.push((ordinal, key, bytes, ptr));
    Ok(ptr)
}

/// The engine configurations cuDNN's heuristics offer for `graph` in `mode`, in their order, and
/// the heuristics descriptor they came from (kept alive with them).
pub(super) fn engine_configs(
    graph: &Desc,
    mode: dnn::cudnnBackendHeurMode_t,
) -> Result<(Desc, Vec<Desc>), CudnnError> {
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

/// The execution plan of `config` on `handle`, and the bytes of workspace it needs.
pub(super) fn execution_plan(
    handle: dnn::cudnnHandle_t,
    config: &Desc,
) -> Result<(Desc, usize), CudnnError> {
    let plan = Desc::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    plan.set_handle(Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle)?;
    plan.set_desc(Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config)?;
    let plan = plan.finalize("execution plan")?;
    let workspace = plan_workspace(&plan)?;
    Ok((plan, workspace))
}

/// Queues `plan` on `handle`'s stream: tensor `uids[i]` at `pointers[i]` (device memory of the
/// handle's device, or host memory for a by-value tensor, read before this returns) and the
/// plan's workspace.
///
/// # Safety
/// The pointers hold the plan's tensors (of the shapes and types it was built for) and the
/// workspace at least the plan's bytes, until the queued work has run.
pub(super) unsafe fn execute_plan(
    handle: dnn::cudnnHandle_t,
    plan: &Desc,
    uids: &[i64],
    pointers: &[*mut c_void],
    workspace: u64,
) -> Result<(), CudnnError> {
    let pack = Desc::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    pack.set_i64s(Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)?;
    let workspace = workspace as *mut c_void;
    // SAFETY: one pointer per id, and one workspace pointer.
    unsafe {
        pack.set(
            Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            Type::CUDNN_TYPE_VOID_PTR,
            pointers.len() as i64,
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
    // SAFETY: the plan and pack are alive; the caller's promise for the memory.
    check(
        pack.1,
        unsafe { (pack.1.execute)(handle, plan.0, pack.0) },
        "cudnnBackendExecute",
    )
}

/// The GPU kind and cuDNN version of device `ordinal`, for the names of what the kernels keep
/// between processes: `sm90-132sms-cudnn91900`.
pub(super) fn device_kind(ordinal: i32) -> Result<String, CudnnError> {
    let info = super::cuda::device_info(ordinal)?;
    Ok(format!(
        "sm{}{}-{}sms-cudnn{}",
        info.major,
        info.minor,
        info.sms,
        cudnn()?.version
    ))
}

/// A finalized execution plan's serialised form (cuDNN's JSON representation), or why there is
/// none (cuDNN serialises the plans of its runtime-compiled engines only).
pub(super) fn serialize_plan(plan: &Desc) -> Result<Vec<u8>, CudnnError> {
    let ty = Type::CUDNN_TYPE_CHAR;
    let attr = Attr::CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION;
    // SAFETY: asks for the length only.
    let len = unsafe { plan.get(attr, ty, 0, std::ptr::null_mut())? };
    let mut bytes = vec![0u8; len.max(0) as usize];
    // SAFETY: room for `len` chars.
    let got = unsafe { plan.get(attr, ty, len, bytes.as_mut_ptr().cast())? };
    bytes.truncate(got.max(0) as usize);
    Ok(bytes)
}

/// The execution plan serialised by [`serialize_plan`], restored on `handle` (a device of the same
/// kind and the same cuDNN), and the bytes of workspace it needs.
pub(super) fn deserialize_plan(
    handle: dnn::cudnnHandle_t,
    json: &[u8],
) -> Result<(Desc, usize), CudnnError> {
    let plan = Desc::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    plan.set_handle(Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle)?;
    // SAFETY: `json.len()` chars.
    unsafe {
        plan.set(
            Attr::CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
            Type::CUDNN_TYPE_CHAR,
            json.len() as i64,
            json.as_ptr().cast(),
        )?
    };
    let plan = plan.finalize("execution plan (kept)")?;
    let workspace = plan_workspace(&plan)?;
    Ok((plan, workspace))
}

fn plan_workspace(plan: &Desc) -> Result<usize, CudnnError> {
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
    Ok(workspace.max(0) as usize)
}

/// Checks that every tensor (name, device address) starts on 16 bytes, as cuDNN needs.
pub(super) fn check_aligned(tensors: &[(&'static str, u64)]) -> Result<(), CudnnError> {
    match tensors.iter().find(|(_, p)| p % 16 != 0) {
        Some(&(name, address)) => Err(CudnnError::Misaligned { name, address }),
        None => Ok(()),
    }
}

/// `reasons` after ": ", joined by "; " (nothing when there are none): why the engines a call
/// was offered did not build, for an error that no engine did.
pub(super) fn listed<E: std::fmt::Display>(reasons: &[E]) -> String {
    if reasons.is_empty() {
        return String::new();
    }
    let reasons: Vec<String> = reasons.iter().map(E::to_string).collect();
    format!(": {}", reasons.join("; "))
}

//! `MatMulBiasGelu` on CUDA: one cuBLASLt matmul whose epilogue adds the bias and applies GELU
//! (`CUBLASLT_EPILOGUE_GELU_BIAS`, GELU's tanh form) before the product is rounded and stored.
//! Against ONNX Runtime's `MatMul` followed by `BiasGelu`, the N-wide product is written and read
//! once less (the DiT's FFN: 4,680 × 8,960 half floats per call).
//!
//! - cuBLASLt (`libcublasLt.so.13`, beside the cuBLAS ONNX Runtime's CUDA provider loads) is
//!   loaded at run time, like the driver: a missing library is an error when a session creates
//!   the kernel.
//! - Row-major `Y[M, N] = X[M, K] · W[N, K]ᵀ` is column-major `Yᵀ = op(W)·Xᵀ` with op(W) the
//!   transpose of the K × N column-major view of W: cuBLAS's "TN" product, as `torch.nn.Linear`
//!   calls it. The bias runs along Yᵀ's rows, as the epilogue wants it.
//! - Accumulation and the epilogue are float32 (`CUBLAS_COMPUTE_32F`, also for float32 tensors:
//!   no TF32); the output is rounded to T once.
//! - `MatMulFp8` (float16 only) is the same product in float8 E4M3: X is first quantised per row
//!   by `unstep_quantize_e4m3_rows_f16` of `kernels.cu` into a buffer of the stream (the codes,
//!   then one float32 scale per row), and the matmul reads W's and X's codes with cuBLASLt's
//!   outer-vector scaling (`CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F`: W's scale per output
//!   channel, X's per row; cuBLAS 12.9 or later on compute capability 9.0 or later) and a bias
//!   or bias-GELU epilogue. cuBLASLt's float8 matmul takes W transposed and X as it is (its
//!   "TN" form), which is this product's. The scale and bias pointers are set before the
//!   heuristic is asked (without them it answers `CUBLAS_STATUS_INVALID_VALUE` for outer-vector
//!   scales). Fast accumulation (no periodic promotion of the float8 partial sums) is left off:
//!   on an H200 it took 10-15 % off the wan-1.3b products but multiplied their largest error
//!   against the float64-summed CPU kernel by 3 to 13 (the GPU test `cuda_fp8_configurations`).
//! - One handle per device, and one workspace of [`WORKSPACE_BYTES`] per device and stream
//!   (allocated on first use, kept for the process): the calls of one stream run in order, so
//!   they can share it. The algorithm is cuBLASLt's first heuristic choice for the call's sizes
//!   and pointer alignment, kept per kernel for the next calls of the same sizes.

use std::ffi::c_void;
use std::mem::size_of;
use std::sync::{Mutex, PoisonError};

use cudarc::cublaslt::result::{self as lt, CublasError};
use cudarc::cublaslt::sys as lt_sys;
use cudarc::cublaslt::sys::cublasLtMatmulDescAttributes_t as Desc;
use cudarc::driver::{result as driver, sys};
use ort::value::TensorElementType;

use super::DOMAIN;
use super::cuda::{
    CudaError, CurrentContext, Handle, REMEDY, device_function, device_info, primary_context,
};
use crate::engine::one_time::{self, Work};

/// The bytes of cuBLASLt workspace per device and stream (what cuBLAS recommends on Hopper).
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

/// `cublasOperation_t::CUBLAS_OP_N` and `CUBLAS_OP_T` (int32 values of the TRANSA/TRANSB
/// attributes).
const OP_N: i32 = 0;
const OP_T: i32 = 1;

/// `cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F` (an int32 value of
/// the A/B_SCALE_MODE attributes): a float32 scale per row of op(A) (W's output channels) and
/// per column of op(B) (X's rows).
const SCALE_OUTER_VEC_32F: i32 = 3;

/// The quantisation kernel's threads per block (one block per row; `QUANT_THREADS` of
/// `kernels.cu`).
pub(crate) const QUANT_THREADS: u32 = 256;

/// What a kernel's matmul is: `MatMulBiasGelu`'s (T inputs, bias-GELU epilogue) or
/// `MatMulFp8`'s (E4M3 codes with per-channel and per-row scales, bias or bias-GELU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    BiasGelu,
    Fp8 { gelu: bool },
}

/// An error of the cuBLASLt kernels (`MatMulBiasGelu`, `MatMulFp8`), in the words a user reads.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum GemmError {
    #[error(
        "{DOMAIN} MatMulBiasGelu: could not load cuBLASLt (libcublasLt.so.13); put CUDA 13's \
         cuBLAS on LD_LIBRARY_PATH (`pip install nvidia-cublas==13.*` puts it in \
         site-packages/nvidia/cu13/lib), {REMEDY}"
    )]
    NoCublasLt,
    #[error(
        "{DOMAIN} MatMulBiasGelu: element type {0:?} is not supported (float32 and float16 are)"
    )]
    BiasGeluType(TensorElementType),
    #[error(
        "{DOMAIN} MatMulFp8: element type {0:?} is not supported on CUDA (float16 is; fp8 \
         bundles are float16 bundles with 8-bit matrix multiplies)"
    )]
    Fp8Type(TensorElementType),
    #[error(
        "{DOMAIN} MatMulFp8: CUDA device {ordinal} has compute capability {major}.{minor}; the \
         float8 matrix multiplies with per-channel scales need 9.0 or later (Hopper): run an \
         fp16 bundle of the same weights on this GPU"
    )]
    Fp8Capability {
        ordinal: i32,
        major: i32,
        minor: i32,
    },
    #[error("cublasLtCreate on CUDA device {ordinal}: {source}")]
    CreateHandle { ordinal: i32, source: CublasError },
    #[error(
        "cuMemAlloc of the {} MiB cuBLASLt workspace on CUDA device {ordinal}: {source}",
        WORKSPACE_BYTES >> 20
    )]
    WorkspaceAlloc {
        ordinal: i32,
        source: driver::DriverError,
    },
    #[error(
        "cuMemAlloc of the {mib} MiB buffer of MatMulFp8's quantised rows on CUDA device \
         {ordinal}: {source}"
    )]
    QuantisedAlloc {
        mib: usize,
        ordinal: i32,
        source: driver::DriverError,
    },
    /// A call given other pointers than its operator's tensors.
    #[error("{count} pointers, expected {expected}")]
    Pointers {
        count: usize,
        expected: &'static str,
    },
    #[error("K = {0}: cuBLASLt's float8 matrix multiplies need K a multiple of 16")]
    Fp8K(usize),
    #[error("cuLaunchKernel (quantise): {0}")]
    Quantise(driver::DriverError),
    /// A cuBLASLt call of the preparation of a call shape failed.
    #[error("{call}: {source}")]
    Call {
        call: &'static str,
        source: CublasError,
    },
    /// As [`GemmError::Call`], for a float8 matmul, with what it needs.
    #[error(
        "{call}: {source} (float8 matrix multiplies with per-channel scales need cuBLAS 12.9 or \
         later on compute capability 9.0 or later, and K a multiple of 16)"
    )]
    Fp8Call {
        call: &'static str,
        source: CublasError,
    },
    /// `cublasLtMatmul` itself failed.
    #[error("{0}")]
    Matmul(CublasError),
    /// A failure of a matmul of M × K × N, `fp8` for `MatMulFp8`'s.
    #[error(
        "cublasLtMatmul ({}{m} × {k} × {n}): {source}",
        if *fp8 { "float8, " } else { "" }
    )]
    Sizes {
        fp8: bool,
        m: usize,
        k: usize,
        n: usize,
        source: Box<GemmError>,
    },
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// Loads cuBLASLt (no GPU needed).
pub(super) fn check_cublaslt() -> Result<(), GemmError> {
    // SAFETY: only opens the library, as `cuda::check_nvrtc` does.
    if unsafe { lt_sys::is_culib_present() } {
        return Ok(());
    }
    Err(GemmError::NoCublasLt)
}

/// The cuBLASLt handle of device `ordinal`, created on first use with the device's primary
/// context current, and never destroyed.
fn handle(ordinal: i32) -> Result<Handle<lt_sys::cublasLtHandle_t>, GemmError> {
    type Handles = Vec<(i32, Handle<lt_sys::cublasLtHandle_t>)>;
    static HANDLES: Mutex<Handles> = Mutex::new(Vec::new());
    let mut handles = HANDLES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, h)) = handles.iter().find(|(o, _)| *o == ordinal) {
        return Ok(*h);
    }
    let h = lt::create_handle().map_err(|source| GemmError::CreateHandle { ordinal, source })?;
    handles.push((ordinal, Handle(h)));
    Ok(Handle(h))
}

/// The workspace of `stream` on device `ordinal` (the device's primary context is current),
/// allocated on first use and never freed.
fn workspace(ordinal: i32, stream: sys::CUstream) -> Result<u64, GemmError> {
    type Workspaces = Vec<(i32, usize, u64)>;
    static WORKSPACES: Mutex<Workspaces> = Mutex::new(Vec::new());
    let mut workspaces = WORKSPACES.lock().unwrap_or_else(PoisonError::into_inner);
    let key = stream as usize;
    if let Some((_, _, ptr)) = workspaces
        .iter()
        .find(|(o, s, _)| *o == ordinal && *s == key)
    {
        return Ok(*ptr);
    }
    // SAFETY: a plain allocation in the current (primary) context, kept for the process.
    let ptr = unsafe { driver::malloc_sync(WORKSPACE_BYTES) }
        .map_err(|source| GemmError::WorkspaceAlloc { ordinal, source })?;
    workspaces.push((ordinal, key, ptr));
    Ok(ptr)
}

/// cuBLASLt's types for an element type: the matrices' and the scale's (alpha, beta).
fn data_type(ty: TensorElementType) -> Option<lt_sys::cudaDataType> {
    match ty {
        TensorElementType::Float32 => Some(lt_sys::cudaDataType::CUDA_R_32F),
        TensorElementType::Float16 => Some(lt_sys::cudaDataType::CUDA_R_16F),
        _ => None,
    }
}

/// The quantised X of a `MatMulFp8` call on `stream` of device `ordinal`: a buffer of at least
/// `bytes`, allocated on first use and when a call needs more, never freed (a captured CUDA graph
/// keeps pointing at the buffer it was captured with; the calls of one stream run in order, so
/// they can share it).
fn quantised(ordinal: i32, stream: sys::CUstream, bytes: usize) -> Result<u64, GemmError> {
    type Buffers = Vec<(i32, usize, u64, usize)>;
    static BUFFERS: Mutex<Buffers> = Mutex::new(Vec::new());
    let mut buffers = BUFFERS.lock().unwrap_or_else(PoisonError::into_inner);
    let key = stream as usize;
    let slot = buffers
        .iter()
        .position(|(o, s, _, _)| *o == ordinal && *s == key);
    if let Some(i) = slot
        && buffers[i].3 >= bytes
    {
        return Ok(buffers[i].2);
    }
    // Whole MiB, so that the next slightly larger call does not allocate again.
    let size = bytes.next_multiple_of(1 << 20);
    // SAFETY: a plain allocation in the current (primary) context, kept for the process.
    let ptr = unsafe { driver::malloc_sync(size) }.map_err(|source| GemmError::QuantisedAlloc {
        mib: size >> 20,
        ordinal,
        source,
    })?;
    match slot {
        Some(i) => buffers[i] = (ordinal, key, ptr, size),
        None => buffers.push((ordinal, key, ptr, size)),
    }
    Ok(ptr)
}

/// A pointer attribute of a matmul descriptor (the bias, the scales), the device address, and
/// the call that sets it as an error names it.
type Pointer = (Desc, u64, &'static str);

const BIAS: &str = "cublasLtMatmulDescSetAttribute (bias)";
const W_SCALES: &str = "cublasLtMatmulDescSetAttribute (W's scales)";
const X_SCALES: &str = "cublasLtMatmulDescSetAttribute (X's scales)";

/// Sets pointer attributes of `desc`.
fn set_pointers(
    desc: lt_sys::cublasLtMatmulDesc_t,
    pointers: &[Pointer],
) -> Result<(), (&'static str, CublasError)> {
    for &(attr, pointer, what) in pointers {
        let pointer = pointer as *const c_void;
        // SAFETY: the caller's descriptor is alive; the attribute is a pointer-sized value.
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                attr,
                (&pointer as *const *const c_void).cast(),
                size_of::<*const c_void>(),
            )
        }
        .map_err(|e| (what, e))?;
    }
    Ok(())
}

/// The descriptors and algorithm of one call shape: M rows, K, N, and the alignment of the
/// pointers the algorithm was chosen for, and the matmul's mode.
struct Prepared {
    key: (usize, usize, usize, usize, Mode),
    desc: Handle<lt_sys::cublasLtMatmulDesc_t>,
    /// A (W, K × N column-major), B (X, K × M), C = D (Y, N × M).
    layouts: [Handle<lt_sys::cublasLtMatrixLayout_t>; 3],
    algo: lt_sys::cublasLtMatmulAlgo_t,
}

impl Prepared {
    /// The algorithm's configuration as cuBLASLt numbers it (algorithm, tile, stages, split-K,
    /// cluster shape): what tells the candidates of `cuda_gemm_algorithms` apart.
    #[cfg(test)]
    pub(super) fn describe(&self) -> String {
        use lt_sys::cublasLtMatmulAlgoConfigAttributes_t as Config;
        let attrs = [
            ("algo", Config::CUBLASLT_ALGO_CONFIG_ID),
            ("tile", Config::CUBLASLT_ALGO_CONFIG_TILE_ID),
            ("stages", Config::CUBLASLT_ALGO_CONFIG_STAGES_ID),
            ("split-k", Config::CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
            ("cluster", Config::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
        ];
        let parts: Vec<String> = attrs
            .into_iter()
            .map(|(name, attr)| {
                let (mut value, mut size) = (0u64, 0usize);
                // SAFETY: first the attribute's size (no buffer), then the attribute into the
                // low bytes of a zeroed u64 (sizes of at most 4 bytes, little-endian).
                let status = unsafe {
                    lt_sys::cublasLtMatmulAlgoConfigGetAttribute(
                        &self.algo,
                        attr,
                        std::ptr::null_mut(),
                        0,
                        &mut size,
                    )
                    .result()
                    .and_then(|()| {
                        let mut written = 0usize;
                        lt_sys::cublasLtMatmulAlgoConfigGetAttribute(
                            &self.algo,
                            attr,
                            (&mut value as *mut u64).cast(),
                            size.min(8),
                            &mut written,
                        )
                        .result()
                    })
                };
                match status {
                    Ok(()) => format!("{name} {value}"),
                    Err(e) => format!("{name} ? ({e:?})"),
                }
            })
            .collect();
        parts.join(", ")
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        // SAFETY: created by `GemmKernel::prepare` and used by nothing else; a call still queued
        // on a stream took its own copy of what it needs.
        unsafe {
            for layout in self.layouts.iter().filter(|l| !l.0.is_null()) {
                let _ = lt::destroy_matrix_layout(layout.0);
            }
            let _ = lt::destroy_matmul_desc(self.desc.0);
        }
    }
}

/// The sizes of a `MatMulBiasGelu` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MatMulSizes {
    /// M, the rows of X.
    pub(crate) rows: usize,
    /// K = D, the last axis of X.
    pub(crate) d: usize,
    /// N, the columns of Y (W's rows).
    pub(crate) cols: usize,
}

/// A `MatMulBiasGelu` or `MatMulFp8` node's CUDA kernel.
pub(crate) struct GemmKernel {
    ty: TensorElementType,
    ordinal: i32,
    context: Handle<sys::CUcontext>,
    /// `MatMulFp8`'s quantisation kernel (`None` for `MatMulBiasGelu`).
    quantise: Option<Handle<sys::CUfunction>>,
    /// The shapes seen so far (one or two in a session).
    prepared: Vec<Prepared>,
    /// Which of cuBLASLt's heuristic results the shapes take: 0, its first choice, in the
    /// product; the GPU test `cuda_gemm_algorithms` times the others.
    pub(super) algo_rank: usize,
    /// Other configurations for the GPU test `cuda_fp8_configurations`.
    #[cfg(test)]
    pub(super) probe: Probe,
}

/// A configuration other than the product's, for a GPU test to try.
#[cfg(test)]
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Probe {
    /// This epilogue instead of the mode's.
    pub(super) epilogue: Option<lt_sys::cublasLtEpilogue_t>,
    /// `CUBLASLT_MATMUL_DESC_FAST_ACCUM` (float8: no periodic promotion of the partial sums).
    pub(super) fast_accumulation: bool,
}

impl GemmKernel {
    /// `MatMulBiasGelu`'s kernel of element type `ty` (float32 or float16) on device `ordinal`.
    pub(crate) fn bias_gelu(ty: TensorElementType, ordinal: i32) -> Result<Self, GemmError> {
        if data_type(ty).is_none() {
            return Err(GemmError::BiasGeluType(ty));
        }
        check_cublaslt()?;
        Ok(Self::with(ty, ordinal, primary_context(ordinal)?, None))
    }

    /// `MatMulFp8`'s kernel of element type `ty` (float16 only) on device `ordinal` (compute
    /// capability 9.0 or later).
    pub(crate) fn fp8(ty: TensorElementType, ordinal: i32) -> Result<Self, GemmError> {
        if ty != TensorElementType::Float16 {
            return Err(GemmError::Fp8Type(ty));
        }
        check_cublaslt()?;
        let info = device_info(ordinal)?;
        if info.major < 9 {
            return Err(GemmError::Fp8Capability {
                ordinal,
                major: info.major,
                minor: info.minor,
            });
        }
        let context = primary_context(ordinal)?;
        let (module_context, quantise) = device_function(ordinal, "unstep_quantize_e4m3_rows_f16")?;
        debug_assert_eq!(module_context.0, context.0);
        Ok(Self::with(ty, ordinal, context, Some(quantise)))
    }

    /// A kernel of no prepared shapes, cuBLASLt's first choices.
    fn with(
        ty: TensorElementType,
        ordinal: i32,
        context: Handle<sys::CUcontext>,
        quantise: Option<Handle<sys::CUfunction>>,
    ) -> Self {
        Self {
            ty,
            ordinal,
            context,
            quantise,
            prepared: Vec::new(),
            algo_rank: 0,
            #[cfg(test)]
            probe: Probe::default(),
        }
    }

    /// The algorithms of the shapes prepared so far, described ([`Prepared::describe`]).
    #[cfg(test)]
    pub(super) fn algorithms(&self) -> Vec<String> {
        self.prepared.iter().map(Prepared::describe).collect()
    }

    /// Queues `Y = GELU(X·Wᵀ + bias)` on `stream` over `pointers` (X, W, bias, Y: device
    /// addresses of this device) with `sizes` (checked against the contract).
    pub(crate) fn launch_matmul(
        &mut self,
        sizes: &MatMulSizes,
        pointers: &[u64],
        stream: sys::CUstream,
    ) -> Result<(), GemmError> {
        let [x, w, bias, y] = pointers[..] else {
            return Err(GemmError::Pointers {
                count: pointers.len(),
                expected: "X, W, bias and Y",
            });
        };
        if sizes.rows == 0 {
            return Ok(());
        }
        let _current = CurrentContext::push(self.context)?;
        let pointers = [(Desc::CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, BIAS)];
        let (m, k, n) = (sizes.rows, sizes.d, sizes.cols);
        self.matmul((m, k, n), Mode::BiasGelu, &pointers, [w, x, y], stream)
            .map_err(|e| GemmError::Sizes {
                fp8: false,
                m,
                k,
                n,
                source: Box::new(e),
            })
    }

    /// Queues `Y = epilogue(X·Wᵀ)` on `stream` (this kernel's context is current): W, X and Y
    /// (`operands`, as `mode` types them) of M rows, K and N (`sizes`) with the descriptor's
    /// `pointers` (bias, scales), the algorithm prepared on the first call of these sizes,
    /// pointer alignment and mode.
    fn matmul(
        &mut self,
        (m, k, n): (usize, usize, usize),
        mode: Mode,
        pointers: &[Pointer],
        [w, x, y]: [u64; 3],
        stream: sys::CUstream,
    ) -> Result<(), GemmError> {
        let handle = handle(self.ordinal)?;
        let workspace = workspace(self.ordinal, stream)?;
        // The largest power of two up to 256 bytes that all of W, X and Y start on: an
        // algorithm chosen for stricter alignment must not see these pointers.
        let alignment = [w, x, y]
            .iter()
            .map(|&p| 1usize << p.trailing_zeros().min(8))
            .min()
            .unwrap_or(256);
        let prepared = self.prepared(handle, (m, k, n, alignment, mode), pointers)?;
        set_pointers(prepared.desc.0, pointers)
            .map_err(|(call, source)| GemmError::Call { call, source })?;
        let (alpha, beta) = (1f32, 0f32);
        let [a, b, c] = prepared.layouts;
        // SAFETY: the descriptors are alive (owned by `prepared`); W, X, Y and the descriptor's
        // pointers are device memory of this device holding the call's sizes in the mode's
        // types (float8: W's and X's codes, N and M float32 scales, X's written by a kernel
        // queued before on the same stream); the workspace is this stream's and of the size the
        // preference allowed; alpha and beta are float32 host scalars (scale type 32F, default
        // host pointer mode), read before cublasLtMatmul returns.
        unsafe {
            lt::matmul(
                handle.0,
                prepared.desc.0,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                w as *const c_void,
                a.0,
                x as *const c_void,
                b.0,
                y as *const c_void,
                c.0,
                y as *mut c_void,
                c.0,
                &prepared.algo,
                workspace as *mut c_void,
                WORKSPACE_BYTES,
                stream as lt_sys::cudaStream_t,
            )
        }
        .map_err(GemmError::Matmul)
    }

    /// The prepared call of `key` ([`Self::prepare`] with the call's `pointers` on its first
    /// call).
    fn prepared(
        &mut self,
        handle: Handle<lt_sys::cublasLtHandle_t>,
        key: (usize, usize, usize, usize, Mode),
        pointers: &[Pointer],
    ) -> Result<&Prepared, GemmError> {
        let index = match self.prepared.iter().position(|p| p.key == key) {
            Some(index) => index,
            None => {
                let prepared =
                    one_time::timed(Work::GemmChoices, || self.prepare(handle, key, pointers))
                        .map_err(|(call, source)| match key.4 {
                            Mode::Fp8 { .. } => GemmError::Fp8Call { call, source },
                            Mode::BiasGelu => GemmError::Call { call, source },
                        })?;
                self.prepared.push(prepared);
                self.prepared.len() - 1
            }
        };
        Ok(&self.prepared[index])
    }

    /// Queues `MatMulFp8` on `stream` over `pointers` (X, W, w_scale, bias, Y: device addresses
    /// of this device) with `sizes` (checked against the contract): X's rows quantised, then one
    /// float8 matmul.
    pub(super) fn launch_fp8(
        &mut self,
        gelu: bool,
        sizes: &MatMulSizes,
        pointers: &[u64],
        stream: sys::CUstream,
    ) -> Result<(), GemmError> {
        let [x, w, w_scale, bias, y] = pointers[..] else {
            return Err(GemmError::Pointers {
                count: pointers.len(),
                expected: "X, W, w_scale, bias and Y",
            });
        };
        let (m, k, n) = (sizes.rows, sizes.d, sizes.cols);
        if m == 0 {
            return Ok(());
        }
        if k % 16 != 0 {
            return Err(GemmError::Fp8K(k));
        }
        let quantise = self.quantise.expect("made by GemmKernel::fp8");
        let _current = CurrentContext::push(self.context)?;
        // The codes (M·K bytes), then the rows' scales at the next 256 bytes.
        let scales_offset = (m * k).next_multiple_of(256);
        let buffer = quantised(self.ordinal, stream, scales_offset + 4 * m)?;
        let (codes, row_scales) = (buffer, buffer + scales_offset as u64);
        let (mut x_arg, mut codes_arg, mut scales_arg) = (x, codes, row_scales);
        let (mut rows, mut k_arg) = (m as i64, k as i32);
        let mut params: Vec<*mut c_void> = vec![
            (&mut x_arg as *mut u64).cast(),
            (&mut codes_arg as *mut u64).cast(),
            (&mut scales_arg as *mut u64).cast(),
            (&mut rows as *mut i64).cast(),
            (&mut k_arg as *mut i32).cast(),
        ];
        // SAFETY: the quantisation kernel of kernels.cu, loaded into the current context; one
        // value per parameter, of its type; X holds M·K float16 and the buffer M·K codes and M
        // scales (K a multiple of 16: its 16-byte loads stay in the row and aligned, as X is).
        unsafe {
            driver::launch_kernel(
                quantise.0,
                (m as u32, 1, 1),
                (QUANT_THREADS, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .map_err(GemmError::Quantise)?;
        let pointers = [
            (Desc::CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, BIAS),
            (
                Desc::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                w_scale,
                W_SCALES,
            ),
            (
                Desc::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                row_scales,
                X_SCALES,
            ),
        ];
        let mode = Mode::Fp8 { gelu };
        self.matmul((m, k, n), mode, &pointers, [w, codes, y], stream)
            .map_err(|e| GemmError::Sizes {
                fp8: true,
                m,
                k,
                n,
                source: Box::new(e),
            })
    }

    /// The descriptors of a call of M rows, K, N at `alignment` bytes in `mode`, and cuBLASLt's
    /// heuristic choice of algorithm for them (the first, or the one of rank
    /// [`Self::algo_rank`]) with the call's `pointers` set (the heuristic may look at the bias
    /// and scales it is given); on failure, which call failed and why.
    fn prepare(
        &self,
        handle: Handle<lt_sys::cublasLtHandle_t>,
        key: (usize, usize, usize, usize, Mode),
        pointers: &[Pointer],
    ) -> Result<Prepared, (&'static str, CublasError)> {
        let (m, k, n, alignment, mode) = key;
        let ty = data_type(self.ty).expect("checked in new");
        // W and X: the node's type, or E4M3 codes.
        let operands = match mode {
            Mode::BiasGelu => ty,
            Mode::Fp8 { .. } => lt_sys::cudaDataType::CUDA_R_8F_E4M3,
        };
        let scale = lt_sys::cudaDataType::CUDA_R_32F;
        let desc = lt::create_matmul_desc(lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, scale)
            .map_err(|e| ("cublasLtMatmulDescCreate", e))?;
        // From here `prepared` owns what is created, so that an early return destroys it.
        let mut prepared = Prepared {
            key,
            desc: Handle(desc),
            layouts: [Handle(std::ptr::null_mut()); 3],
            algo: lt_sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        use lt_sys::cublasLtEpilogue_t::{CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_BIAS};
        let epilogue = match mode {
            Mode::BiasGelu | Mode::Fp8 { gelu: true } => CUBLASLT_EPILOGUE_GELU_BIAS,
            Mode::Fp8 { gelu: false } => CUBLASLT_EPILOGUE_BIAS,
        };
        #[cfg(test)]
        let epilogue = self.probe.epilogue.unwrap_or(epilogue);
        // SAFETY: each value is of the attribute's type and size (int32 operations and scale
        // modes, the epilogue enum as uint32).
        unsafe {
            if let Mode::Fp8 { .. } = mode {
                for attr in [
                    Desc::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                    Desc::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                ] {
                    lt::set_matmul_desc_attribute(
                        desc,
                        attr,
                        (&SCALE_OUTER_VEC_32F as *const i32).cast(),
                        4,
                    )
                    .map_err(|e| ("cublasLtMatmulDescSetAttribute (scale mode)", e))?;
                }
            }
            lt::set_matmul_desc_attribute(
                desc,
                Desc::CUBLASLT_MATMUL_DESC_TRANSA,
                (&OP_T as *const i32).cast(),
                4,
            )
            .map_err(|e| ("cublasLtMatmulDescSetAttribute (transa)", e))?;
            lt::set_matmul_desc_attribute(
                desc,
                Desc::CUBLASLT_MATMUL_DESC_TRANSB,
                (&OP_N as *const i32).cast(),
                4,
            )
            .map_err(|e| ("cublasLtMatmulDescSetAttribute (transb)", e))?;
            #[cfg(test)]
            if self.probe.fast_accumulation {
                lt::set_matmul_desc_attribute(
                    desc,
                    Desc::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                    (&1i8 as *const i8).cast(),
                    1,
                )
                .map_err(|e| ("cublasLtMatmulDescSetAttribute (fast accumulation)", e))?;
            }
            lt::set_matmul_desc_attribute(
                desc,
                Desc::CUBLASLT_MATMUL_DESC_EPILOGUE,
                (&epilogue as *const lt_sys::cublasLtEpilogue_t).cast(),
                size_of::<lt_sys::cublasLtEpilogue_t>(),
            )
            .map_err(|e| ("cublasLtMatmulDescSetAttribute (epilogue)", e))?;
        }
        set_pointers(desc, pointers)?;
        let (m64, k64, n64) = (m as u64, k as u64, n as u64);
        let shapes = [
            (operands, k64, n64, k as i64),
            (operands, k64, m64, k as i64),
            (ty, n64, m64, n as i64),
        ];
        for (slot, (elements, rows, cols, ld)) in prepared.layouts.iter_mut().zip(shapes) {
            *slot = Handle(
                lt::create_matrix_layout(elements, rows, cols, ld)
                    .map_err(|e| ("cublasLtMatrixLayoutCreate", e))?,
            );
        }
        let preference =
            lt::create_matmul_pref().map_err(|e| ("cublasLtMatmulPreferenceCreate", e))?;
        let chosen = (|| {
            use lt_sys::cublasLtMatmulPreferenceAttributes_t as Pref;
            let bytes = WORKSPACE_BYTES as u64;
            let align = alignment as u32;
            // SAFETY: values of the attributes' types (uint64 bytes, uint32 alignments); the
            // descriptors are alive.
            unsafe {
                lt::set_matmul_pref_attribute(
                    preference,
                    Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    (&bytes as *const u64).cast(),
                    8,
                )
                .map_err(|e| ("cublasLtMatmulPreferenceSetAttribute (workspace)", e))?;
                for attr in [
                    Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                ] {
                    lt::set_matmul_pref_attribute(
                        preference,
                        attr,
                        (&align as *const u32).cast(),
                        4,
                    )
                    .map_err(|e| ("cublasLtMatmulPreferenceSetAttribute (alignment)", e))?;
                }
                let [a, b, c] = prepared.layouts;
                let wanted = self.algo_rank + 1;
                let mut results: Vec<lt_sys::cublasLtMatmulHeuristicResult_t> =
                    vec![std::mem::zeroed(); wanted];
                let mut count = 0;
                lt_sys::cublasLtMatmulAlgoGetHeuristic(
                    handle.0,
                    desc,
                    a.0,
                    b.0,
                    c.0,
                    c.0,
                    preference,
                    wanted as i32,
                    results.as_mut_ptr(),
                    &mut count,
                )
                .result()
                .map_err(|e| ("cublasLtMatmulAlgoGetHeuristic", e))?;
                if count.max(0) as usize <= self.algo_rank {
                    return Err((
                        "cublasLtMatmulAlgoGetHeuristic (no algorithm of that rank for these sizes)",
                        CublasError(lt_sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED),
                    ));
                }
                Ok(results[self.algo_rank])
            }
        })();
        // SAFETY: created above, used by nothing else.
        let _ = unsafe { lt::destroy_matmul_pref(preference) };
        prepared.algo = chosen?.algo;
        Ok(prepared)
    }
}

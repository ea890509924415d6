//! The runner's own ONNX Runtime operators, domain `ai.unstep` (opset 1): each fuses the per-row
//! elementwise work of a DiT block (bias add, RMS or layer norm, modulation, rotary embedding,
//! gated residual add, GELU) or of the VAE decoder (bias, RMS norm and SiLU, with a causal
//! convolution's cache in front) into one pass over the row, or runs a matmul, attention or
//! convolution the runner wants to control. The exporter writes them into `dit_fused.onnx` and
//! `vae_*_fused.onnx`; [`operator_domain`] gives the session the kernels: CUDA kernels (our CUDA C
//! in `kernels.cu`, compiled with NVRTC at session creation, launched on ONNX Runtime's compute
//! stream; cuBLASLt and cuDNN for the matmul, attention and convolution) or CPU kernels (tests,
//! the CPU provider).
//!
//! # The modules
//!
//! - `ops/`: one file per operator, holding its part of the contract (its module doc), its
//!   attributes, shape check and output shapes, its CPU kernel, how it runs on CUDA, and its
//!   tests ([`operator::UnstepOp`]).
//! - `operator.rs`: the trait every operator implements, the element types, and the one adapter
//!   to ONNX Runtime's custom operators (inputs read, outputs allocated, CPU or CUDA dispatch, a
//!   CUDA call checked and its device pointers read).
//! - `rows.rs`: what the row operators share (the checks of D-element inputs, row parameters and
//!   rotary tables, the CPU RMS-norm pass); `row_launch.rs`: their CUDA launch (row layouts,
//!   kernel arguments); `cuda.rs`: CUDA driver, NVRTC and the module of `kernels.cu`.
//! - `gemm.rs` (cuBLASLt), `attention.rs` and `conv.rs` (cuDNN, through `cudnn.rs`): the CUDA
//!   kernels of `MatMulBiasGelu` and `MatMulFp8`, `Attention` and `CausalConv3d`, with the sizes
//!   of a call they run; each operator's file implements [`operator::CudaKernel`] with them.
//! - `test_support.rs`, `tests.rs`, `gpu_tests.rs`: test helpers and the tests that span the
//!   operators; `gpu_tests/gemm.rs`: the GPU tests of the cuBLASLt kernels.
//!
//! The modules depend on each other in one direction, with no cycle: `ops/` on the backends
//! (`row_launch.rs`, `gemm.rs`, `attention.rs`, `conv.rs`) and on `operator.rs` and `rows.rs`;
//! the backends on `cuda.rs` and `cudnn.rs`; `rows.rs` and `row_launch.rs` on `operator.rs`.
//! This module ties them together: the registry's domain, the settings, and the list of
//! `kernels.cu`'s entry points that `cuda.rs` loads.
//!
//! # The contract (shared with the exporter)
//!
//! Element type T is float32 or float16, the same for every input and output of a node, but for
//! the inputs an operator's file gives a fixed type (`MatMulFp8`'s uint8 weight codes and float32
//! scales). D is the
//! size of the last axis of X and N = numel(X) / D its rows. All arithmetic is float32 and each
//! output element is rounded to T once.
//!
//! A *row parameter* P has any shape of F·D elements with F ≥ 1 dividing N (`[D]`, `[1, F, 1, D]`
//! and `[F, D]` are all valid): row r uses `P[(r / (N / F)) · D + c]`.
//!
//! Each operator's file states its inputs, attributes, arithmetic and output shapes: every output
//! has X's shape unless the operator's file says otherwise. A shape that breaks the contract is an
//! error naming the operator, the input and the shapes. The row operators' CUDA kernels keep a row
//! in registers: they also need D even and at most 2048 (wan-1.3b's is 1536), and every tensor
//! aligned to a pair of elements (ONNX Runtime's allocations are); a call outside that is an
//! error, not a slow path. They work a row with a group of up to 32 threads and 16-byte accesses
//! when D ≤ 512 is a multiple of 16 bytes and the tensors are aligned to it (the VAE's
//! channels-last rows, D = 96 to 384), and with one block of 128 threads otherwise (the DiT's D =
//! 1536); see `row_launch.rs`.
//!
//! # Adding an operator
//!
//! Write `ops/<name>.rs`: a unit struct implementing [`operator::UnstepOp`] (its `OpInfo`,
//! attributes, shape check, output shapes where they are not X's, CPU kernel, and CUDA kernel
//! type: [`row_launch::RowKernel`] with a [`row_launch::RowOp`] impl for a row operator, whose
//! entry points go into `kernels.cu`, or a kernel of a backend module with an
//! [`operator::CudaKernel`] impl in the operator's file), with its tests in `ops/<name>/tests.rs`
//! (among them `check_through_onnx_runtime`, which the test of every operator runs). Then add one
//! line, `<name>::<Name>,`, to the registry: the `operators!` list in `ops/mod.rs`, which
//! declares the module and puts the operator into [`ops::REGISTRY`]. The domain, the loading of
//! `kernels.cu`'s entry points and the test of every operator through ONNX Runtime are built from
//! that list. `docs/ARCHITECTURE.md` lists every file the exporter's side touches too.

mod attention;
pub(crate) use attention::wave_shaping_used;
mod attention8;
mod attention_call;
mod conv;
mod cuda;
pub(crate) use cuda::{DeviceMemory, REMEDY};
mod cudnn;
mod gemm;
#[cfg(test)]
mod gpu_tests;
mod operator;
mod ops;
mod row_launch;
mod rows;
#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;

use std::sync::{Mutex, PoisonError};

use ort::operator::OperatorDomain;
use ort::session::Session;
use ort::value::TensorElementType;

use super::{onnx_graph, ort_lib};

pub(crate) const DOMAIN: &str = "ai.unstep";

/// What the CUDA kernels of this process keep between processes, and what they log.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct KernelSettings {
    /// The kernel cache folder (`runner apply`: the process's cache folder; `runner worker`:
    /// `UNSTEP_KERNEL_CACHE`): the decoder convolutions' engine choices (`cudnn_conv/`), the
    /// attention's cuDNN plans (`cudnn_attention/`) and `kernels.cu`'s compiled image
    /// (`nvrtc/`), each keyed by what it depends on, so that a later process with the same
    /// folder decides nothing again. `None`: nothing is kept.
    pub(crate) cache_dir: Option<std::path::PathBuf>,
    /// Print how each convolution engine was chosen (`UNSTEP_CONV_LOG=1`).
    pub(crate) conv_log: bool,
    /// Print each CUDA kernel's creation time at its session's build (with `UNSTEP_ORT_LOG`,
    /// beside ONNX Runtime's own log of the build).
    pub(crate) creation_log: bool,
    /// The arithmetic of `Attention` nodes (`method.attention_precision`): fp16, or the 8-bit
    /// attention (its CUDA kernel, attention8.rs, or its CPU reference).
    pub(crate) attention_precision: crate::vocab::AttentionPrecision,
}

static SETTINGS: Mutex<KernelSettings> = Mutex::new(KernelSettings {
    cache_dir: None,
    conv_log: false,
    creation_log: false,
    attention_precision: crate::vocab::AttentionPrecision::Fp16,
});

/// Sets [`KernelSettings`] for the sessions this process builds from now on.
pub(crate) fn configure(settings: KernelSettings) {
    *SETTINGS.lock().unwrap_or_else(PoisonError::into_inner) = settings;
}

/// Compiles the runner's CUDA kernels for device `ordinal` (or loads the image the kernel cache
/// folder keeps) on a thread of its own, with the 8-bit attention's when `precision` asks for it,
/// so that the work overlaps what the process does before its sessions need them: NVRTC takes
/// 6–7 s of one CPU core, and the text encoder runs meanwhile. Sessions that need the kernels
/// before it is done wait for it, as they would for their own compile; a failure is kept and
/// reported by them. Call after [`configure`].
pub(crate) fn compile_ahead(ordinal: i32, precision: crate::vocab::AttentionPrecision) {
    let spawned = std::thread::Builder::new()
        .name("unstep-nvrtc".into())
        .spawn(move || {
            cuda::load_ahead(&cuda::KERNELS, ordinal);
            if precision == crate::vocab::AttentionPrecision::Int8 {
                cuda::load_ahead(&attention8::ATTENTION8, ordinal);
            }
        });
    // No thread: the sessions compile the kernels themselves, as without this call.
    drop(spawned);
}

/// Writes a file the kernels keep for later processes in the kernel cache folder, whole (a
/// reader sees all of it or none); one that cannot be written is a warning, as it only costs the
/// next process the work again (`what` it does again). A kept file that is missing, unreadable
/// or stale is work done again, never an error.
fn keep(file: &std::path::Path, bytes: &[u8], what: &str) {
    if let Err(e) = crate::atomic_file::write_making_folder(file, bytes) {
        eprintln!(
            "warning: {DOMAIN}: could not keep {}: {e}; the next process {what} again",
            file.display()
        );
    }
}

pub(crate) fn settings() -> KernelSettings {
    SETTINGS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// The base names of the row operators' kernels in `kernels.cu`
/// ([`operator::OpInfo::row_kernel`]).
fn row_kernels() -> impl Iterator<Item = &'static str> {
    ops::REGISTRY.iter().filter_map(|r| r.info.row_kernel)
}

/// Every entry point of `kernels.cu` that a kernel launches, each once: the ones of no operator
/// ([`cuda::OTHER_ENTRY_POINTS`]), then each row operator's for both element types and every row
/// layout. The module of a device loads them all when it is loaded.
fn entry_points() -> Vec<String> {
    let mut names: Vec<String> = cuda::OTHER_ENTRY_POINTS.map(String::from).to_vec();
    for base in row_kernels() {
        for ty in [TensorElementType::Float32, TensorElementType::Float16] {
            for layout in row_launch::Layout::KINDS {
                let name = row_launch::entry_point(base, ty, layout)
                    .expect("every operator has float32 and float16 kernels");
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
    }
    names
}

/// A library of the CUDA kernels that does not load: the first of NVRTC, cuBLASLt and cuDNN that
/// fails, with what to do.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum LibraryError {
    #[error(transparent)]
    Nvrtc(#[from] cuda::CudaError),
    #[error(transparent)]
    CublasLt(#[from] gemm::GemmError),
    #[error(transparent)]
    Cudnn(#[from] cudnn::CudnnError),
}

/// Whether the CUDA kernels could be built and run here: NVRTC (which compiles `kernels.cu`),
/// cuBLASLt (`MatMulBiasGelu`) and cuDNN (`Attention`, `CausalConv3d`) load; no GPU needed. For
/// `runner doctor` and `auto`.
pub(crate) fn cuda_libraries_available() -> Result<(), LibraryError> {
    cuda::check_nvrtc()?;
    gemm::check_cublaslt()?;
    cudnn::check_cudnn()?;
    Ok(())
}

/// The `ai.unstep` operator domain for a session: CUDA kernels when `cuda` is true (inputs and
/// outputs on the device, work on ONNX Runtime's compute stream), CPU kernels otherwise.
///
/// With `cuda`, a CUDA driver or NVRTC library that cannot be loaded is an error here; the kernels
/// are compiled when the session creates them (a compile error fails the session's creation).
pub(crate) fn operator_domain(cuda: bool) -> ort::Result<OperatorDomain> {
    if cuda {
        cuda::check_libraries().map_err(ort::Error::wrap)?;
    }
    register_domain_once()?;
    new_domain(cuda)
}

/// A domain of every operator of [`ops::REGISTRY`], both element types each.
fn new_domain(cuda: bool) -> ort::Result<OperatorDomain> {
    let mut domain = OperatorDomain::new(DOMAIN)?;
    for registration in ops::REGISTRY {
        domain = registration.add(domain, cuda)?;
    }
    Ok(domain)
}

/// ONNX Runtime enters a custom domain into a process-wide table when the first session with it
/// is created, with a check-then-add that is not thread-safe: two sessions created at once, the
/// first of the process with the domain, can fail with "Trying to add a domain to DomainToVersion
/// map, but the domain is already exist". So the first call enters it, under a lock, with a
/// throwaway session of a one-node graph that has no `ai.unstep` node (a few milliseconds, once).
/// ONNX Runtime is loaded by then: a domain cannot be made without it.
fn register_domain_once() -> ort::Result<()> {
    static REGISTERED: Mutex<bool> = Mutex::new(false);
    let mut registered = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    if *registered {
        return Ok(());
    }
    let runtime = ort_lib::runtime(None).map_err(|e| ort::Error::new(e.to_string()))?;
    Session::builder(&runtime.environment)?
        .with_intra_threads(1)?
        .with_operators(new_domain(false)?)?
        .commit_from_memory(&onnx_graph::identity(TensorElementType::Float32))?;
    *registered = true;
    Ok(())
}

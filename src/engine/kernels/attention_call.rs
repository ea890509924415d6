//! What a call of the `Attention` operator's CUDA kernels is: its sizes, and the errors of
//! running one, whichever kernel runs it (cuDNN's fp16 attention, attention.rs, or the 8-bit
//! attention, attention8.rs).

use cudarc::driver::result as driver;
use ort::value::TensorElementType;

use super::DOMAIN;
use super::cuda::{CudaError, REMEDY};
use super::cudnn::{CudnnError, listed};

/// The sizes of an `Attention` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttentionSizes {
    /// The rows of Q, all batch entries.
    pub(crate) rows: usize,
    /// D, the last axis of Q, K and V.
    pub(crate) d: usize,
    /// hd / 2.
    pub(crate) half_hd: usize,
    /// S and L, the rows of one batch entry in Q and in K / V.
    pub(crate) block_rows: usize,
    pub(crate) cache_rows: usize,
}

/// An error of the `Attention` kernel, in the words a user reads.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum AttentionError {
    #[error(
        "{DOMAIN} Attention: element type {0:?} is not supported on CUDA (cuDNN's fused \
         attention runs float16; export the bundle in fp16), {REMEDY}"
    )]
    ElementType(TensorElementType),
    /// A call given other pointers than Q, K, V and O.
    #[error("{0} pointers, expected Q, K, V and O")]
    Pointers(usize),
    #[error("head size {0}: cuDNN's fused attention takes a multiple of 8 up to 256")]
    HeadSize(usize),
    /// None of the engine configurations of cuDNN's heuristics builds a plan: why each did not.
    #[error(
        "cuDNN has no engine for this attention (Q {dims_q:?}, K and V {dims_kv:?}, {tried} \
         engine configurations tried{})",
        listed(reasons.as_slice())
    )]
    NoEngine {
        dims_q: [i64; 4],
        dims_kv: [i64; 4],
        tried: usize,
        reasons: Vec<CudnnError>,
    },
    /// The plan of the rows of the full waves does not build.
    #[error("{0} (the rows of the full waves)")]
    FullWaves(Box<AttentionError>),
    /// The plan of the last rows, split over `parts` runs of the keys, does not build.
    #[error("{source} (the last rows, over {parts} runs of the keys)")]
    LastRows {
        parts: i64,
        source: Box<AttentionError>,
    },
    #[error("cuLaunchKernel (merge): {0}")]
    Merge(driver::DriverError),
    /// The 8-bit attention asked for on a GPU that is not a Hopper.
    #[error(
        "{DOMAIN} Attention: the 8-bit attention (method.attention_precision = \"int8\") runs on \
         Hopper GPUs (compute capability 9.0); this GPU is {major}.{minor}: run with \
         attention_precision = \"fp16\""
    )]
    Int8Device { major: i32, minor: i32 },
    #[error(
        "{DOMAIN} Attention: the 8-bit attention takes a head size of 128; this model's is {0}: \
         run with attention_precision = \"fp16\""
    )]
    Int8HeadSize(usize),
    #[error("{kernel}: {source}")]
    Int8Launch {
        kernel: &'static str,
        source: driver::DriverError,
    },
    #[error("cuTensorMapEncodeTiled (the 8-bit attention's tiles): {0}")]
    TensorMap(driver::DriverError),
    #[error(transparent)]
    Cudnn(#[from] CudnnError),
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

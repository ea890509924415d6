//! The runner's own ONNX Runtime operators, domain `ai.unstep` (opset 1): each fuses the per-row
//! elementwise work of a DiT block (bias add, RMS or layer norm, modulation, rotary embedding,
//! gated residual add, GELU) or of the VAE decoder (bias, RMS norm and SiLU, with a causal
//! convolution's cache in front) into one pass over the row. The exporter writes them into
//! `dit_fused.onnx` and `vae_*_fused.onnx`; [`operator_domain`] gives the session the kernels:
//! CUDA kernels (our CUDA C in `kernels.cu`, compiled with NVRTC at session creation, launched on
//! ONNX Runtime's compute stream) or CPU kernels (tests, the CPU provider).
//!
//! # The contract (shared with the exporter)
//!
//! Element type T is float32 or float16, the same for every input and output of a node. D is the
//! size of the last axis of X and N = numel(X) / D its rows. All arithmetic is float32 and each
//! output element is rounded to T once.
//!
//! A *row parameter* P has any shape of F·D elements with F ≥ 1 dividing N (`[D]`, `[1, F, 1, D]`
//! and `[F, D]` are all valid): row r uses `P[(r / (N / F)) · D + c]`.
//!
//! 1. `BiasRmsNormRope(X, bias, weight, cos, sin) -> Y`, attributes `epsilon` (float) and
//!    `num_heads` (int). bias and weight have D elements; hd = D / num_heads
//!    (D % (2 · num_heads) == 0); cos and sin have Tc · hd/2 elements, Tc ≥ 1, and row r uses
//!    table row t = r % Tc. `v = X + bias`, `u = v / sqrt(mean(v²) + epsilon) · weight`, and pair
//!    i (columns 2i, 2i + 1) turns by column j = i mod hd/2 of the tables:
//!    `Y[2i] = u[2i]·cos[t,j] − u[2i+1]·sin[t,j]`, `Y[2i+1] = u[2i]·sin[t,j] + u[2i+1]·cos[t,j]`.
//! 2. `BiasRmsNorm(X, bias, weight) -> Y`, attributes `epsilon` and `silu` (int, optional, 0 or
//!    1, default 0): `n = (X + bias) / sqrt(mean((X + bias)²) + epsilon) · weight`, and `Y = n`
//!    with `silu = 0`, `Y = n · sigmoid(n)`, computed as `n / (1 + exp(−n))`, with `silu = 1` (RMS
//!    norm and SiLU in one pass, rounded to T once). Another value of `silu` is an error when the
//!    session creates the kernel.
//! 3. `GatedResidualLayerNorm(R, X, bias, gate, scale, shift) -> (S, Y)`, attribute `epsilon`. R
//!    has X's shape, bias D elements, gate, scale and shift are row parameters (each with its own
//!    F). `S = round_T(R + (X + bias) · gate)`; with s = S as stored,
//!    `Y = (s − mean(s)) / sqrt(mean((s − mean(s))²) + epsilon) · scale + shift`.
//!
//! 4. `QkvNormRopeCache(QKV, q_bias, k_bias, q_weight, k_weight, cos, sin, K, V) -> Q`,
//!    attributes `epsilon` and `num_heads`: a self-attention's inputs, with its keys and values
//!    written in place into the cache the attention reads. QKV has shape `[..., T, 3·D]` (rank ≥
//!    2; its column blocks are the bias-free q, k and v projections of a row; X is QKV here, N =
//!    numel(QKV) / 3·D and B = N / T); q_bias, k_bias, q_weight and k_weight have D elements; cos
//!    and sin are as for `BiasRmsNormRope`. K and V have one shape `[..., L, D]`, L ≥ T, B·L·D
//!    elements. With BRNR the arithmetic of `BiasRmsNormRope`:
//!    `Q = BRNR(QKV[..., 0:D]; q_bias, q_weight)`, shape `[..., T, D]`, and **in place, into the
//!    inputs K and V**, for batch b and t < T: `K[b, L−T+t] = BRNR(QKV[b, t, D:2D]; k_bias,
//!    k_weight)`, `V[b, L−T+t] = QKV[b, t, 2D:3D]`; rows before L − T are left as they are. A
//!    graph reads K and V only in nodes that take Q (the attention), so after this node; its
//!    caller owns K and V (bound buffers) and finds the block's keys and values in their last T
//!    rows after the run. No copy of the cache: the concatenation of past and new keys it replaces
//!    copied the whole cache on every pass.
//!
//! 5. `BiasGelu(X, bias) -> Y`: bias has D elements; with v = X + bias,
//!    `Y = 0.5·v·(1 + tanh(sqrt(2/π)·(v + 0.044715·v³)))` (GELU's tanh form, as ONNX Runtime's
//!    FastGelu and PyTorch's `gelu(approximate="tanh")`). Elementwise: any D (the CUDA kernel
//!    needs it even), the DiT's FFN has 8960.
//!
//! 6. `PrefixBiasRmsNorm(X, bias, weight, prefix) -> (Y, tail)`, attributes `epsilon` and `silu`:
//!    Y is the concatenation along axis 1 of `prefix` and `BiasRmsNorm(X, bias, weight)` (the same
//!    arithmetic and attributes), and tail the last P entries of Y along axis 1 (prefix's shape).
//!    X has rank ≥ 2 and axis 0 of size 1; prefix has X's shape but on axis 1 (P ≥ 0 there); Y
//!    has X's shape with P + T on axis 1, so its first rows are prefix's, copied, and the rest the
//!    normed rows of X. The fused VAE's causal convolutions read their last two input frames (a
//!    cache) in front of the new ones: the op writes the frames after the cache instead of a
//!    concatenation copying both, and gives the next call's cache as its own output, so that
//!    nothing keeps Y alive once the convolution has read it.
//!
//! 7. `MatMulBiasGelu(X, W, bias) -> Y`: a linear layer and the GELU after it (the DiT's FFN up
//!    to its second layer). W has shape `[N, K]` (the layer's weight as stored, out × in) with K
//!    = D, bias N elements; Y has X's shape with N on the last axis, and
//!    `Y[r, n] = GELU(Σ_k X[r, k]·W[n, k] + bias[n])` with `BiasGelu`'s GELU, the sum in float32
//!    (in any order) and rounded to T once, after the GELU. The CUDA kernel is one cuBLASLt
//!    matmul with its bias-and-GELU epilogue (`gemm.rs`), where a `MatMul` and a `BiasGelu` wrote
//!    and read the N-wide product once more.
//!
//! 8. `Attention(Q, K, V) -> O`, attribute `num_heads`: a self-attention without mask. Q has
//!    shape `[..., S, D]` (rank ≥ 2, X is Q here), K and V one shape `[..., L, D]` with Q's
//!    leading axes and L ≥ 1; D = num_heads · hd with hd even. Row s of batch b and head h
//!    (columns h·hd to (h + 1)·hd): with scores `z_l = Q[b, s, h]·K[b, l, h] / sqrt(hd)`,
//!    `O[b, s, h] = Σ_l e^(z_l − max z) V[b, l, h] / Σ_l e^(z_l − max z)`. The CPU kernel works in
//!    float32 and rounds once. The CUDA kernel is cuDNN's fused flash attention in float16
//!    (float32 and a head size past 256 or not a multiple of 8 are errors there; within 1.3e-4
//!    of the CPU kernel on an H200), and runs a partial last wave of thread blocks over runs of
//!    the keys that it then merges (`attention.rs`). The exporter
//!    writes it for `dit_fused`'s self-attention, in place of ONNX Runtime's
//!    `MultiHeadAttention`, so that the runner decides how a block's rows meet the GPU's waves.
//!
//! 9. `CausalConv3d(X, W) -> Y`: a causal 3D convolution without bias, channels last. X has shape
//!    `[N, T, H, W, C]` (X's last axis is C here, so D = C), W `[K, kT, kH, kW, C]` with kT ≤ T
//!    and kH, kW odd; Y has shape `[N, T − kT + 1, H, W, K]` and
//!    `Y[n, t, i, j, k] = Σ_{a, b, c, ·} X[n, t + a, i + b − kH/2, j + c − kW/2, ·] · W[k, a, b,
//!    c, ·]` over the taps whose pixel is inside the frame (zero padding in space, none in time),
//!    the sum in float32 (in any order) and rounded to T once. The CUDA kernel is cuDNN's
//!    convolution with the engine picked by timing (`conv.rs`); the exporter writes it for the
//!    fused VAE's bias-free causal convolutions, in place of ONNX `Conv`.
//!
//! Every output has X's shape (O is Q's), but Q's last axis of `QkvNormRopeCache` is D, Y of
//! `PrefixBiasRmsNorm` has P + T on axis 1 and its tail prefix's shape, Y of `MatMulBiasGelu` has
//! N on its last axis, and Y of `CausalConv3d` is as above. A shape that breaks the contract is an
//! error naming the operator, the input and the shapes. The row operators' CUDA kernels keep a row
//! in registers: they also need D even and at most 2048 (wan-1.3b's is 1536), and every tensor
//! aligned to a pair of elements (ONNX Runtime's allocations are); a call outside that is an
//! error, not a slow path. They work a row with a group of up to 32 threads and 16-byte accesses
//! when D ≤ 512 is a multiple of 16 bytes and the tensors are aligned to it (the VAE's
//! channels-last rows, D = 96 to 384), and with one block of 128 threads otherwise (the DiT's D =
//! 1536); see `cuda.rs`.
//!
//! Tests: `tests.rs` checks the CPU kernels against a float64 reference, directly and through
//! ONNX Runtime; its ignored tests compile `kernels.cu` with NVRTC (no GPU needed) and check the
//! CUDA kernels against the CPU kernels on a GPU (`cuda_kernels_match_the_cpu_kernels`,
//! `cuda_attention_matches_the_cpu_kernel`).

mod attention;
mod conv;
mod cpu;
mod cuda;
mod cudnn;
mod gemm;
#[cfg(test)]
mod tests;

use std::ops::RangeInclusive;
use std::sync::{Mutex, PoisonError};

use ort::memory::{AllocationDevice, MemoryType};
use ort::operator::{
    ComputeContext, Kernel, KernelContext, Operator, OperatorDomain, OperatorInput, OperatorOutput,
    ShapeInferenceContext,
};
use ort::session::Session;
use ort::value::{TensorElementType, ValueType};

use super::{onnx_graph, ort_lib};

pub(crate) const DOMAIN: &str = "ai.unstep";

/// Whether the CUDA kernels could be built and run here: NVRTC (which compiles `kernels.cu`),
/// cuBLASLt (`MatMulBiasGelu`) and cuDNN (`Attention`, `CausalConv3d`) load; no GPU needed. For
/// `runner doctor` and `auto`.
pub(crate) fn cuda_libraries_available() -> Result<(), String> {
    cuda::check_nvrtc()?;
    gemm::check_cublaslt()?;
    cudnn::check_cudnn()
}

/// The `ai.unstep` operator domain for a session: CUDA kernels when `cuda` is true (inputs and
/// outputs on the device, work on ONNX Runtime's compute stream), CPU kernels otherwise.
///
/// With `cuda`, a CUDA driver or NVRTC library that cannot be loaded is an error here; the kernels
/// are compiled when the session creates them (a compile error fails the session's creation).
pub(crate) fn operator_domain(cuda: bool) -> ort::Result<OperatorDomain> {
    if cuda {
        cuda::check_libraries().map_err(ort::Error::new)?;
    }
    register_domain_once()?;
    new_domain(cuda)
}

fn new_domain(cuda: bool) -> ort::Result<OperatorDomain> {
    let mut domain = OperatorDomain::new(DOMAIN)?;
    for op in Op::ALL {
        for ty in [TensorElementType::Float32, TensorElementType::Float16] {
            domain = domain.add(FusedOp { op, ty, cuda })?;
        }
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

/// The operators of the domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    BiasRmsNormRope,
    BiasRmsNorm,
    GatedResidualLayerNorm,
    QkvNormRopeCache,
    BiasGelu,
    PrefixBiasRmsNorm,
    MatMulBiasGelu,
    Attention,
    CausalConv3d,
}

impl Op {
    pub(crate) const ALL: [Op; 9] = [
        Op::BiasRmsNormRope,
        Op::BiasRmsNorm,
        Op::GatedResidualLayerNorm,
        Op::QkvNormRopeCache,
        Op::BiasGelu,
        Op::PrefixBiasRmsNorm,
        Op::MatMulBiasGelu,
        Op::Attention,
        Op::CausalConv3d,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::BiasRmsNormRope => "BiasRmsNormRope",
            Op::BiasRmsNorm => "BiasRmsNorm",
            Op::GatedResidualLayerNorm => "GatedResidualLayerNorm",
            Op::QkvNormRopeCache => "QkvNormRopeCache",
            Op::BiasGelu => "BiasGelu",
            Op::PrefixBiasRmsNorm => "PrefixBiasRmsNorm",
            Op::MatMulBiasGelu => "MatMulBiasGelu",
            Op::Attention => "Attention",
            Op::CausalConv3d => "CausalConv3d",
        }
    }

    /// The inputs' names, in order.
    pub(crate) fn inputs(self) -> &'static [&'static str] {
        match self {
            Op::BiasRmsNormRope => &["X", "bias", "weight", "cos", "sin"],
            Op::BiasRmsNorm => &["X", "bias", "weight"],
            Op::GatedResidualLayerNorm => &["R", "X", "bias", "gate", "scale", "shift"],
            Op::QkvNormRopeCache => &[
                "QKV", "q_bias", "k_bias", "q_weight", "k_weight", "cos", "sin", "K", "V",
            ],
            Op::BiasGelu => &["X", "bias"],
            Op::PrefixBiasRmsNorm => &["X", "bias", "weight", "prefix"],
            Op::MatMulBiasGelu => &["X", "W", "bias"],
            Op::Attention => &["Q", "K", "V"],
            Op::CausalConv3d => &["X", "W"],
        }
    }

    /// The outputs' names, in order.
    pub(crate) fn outputs(self) -> &'static [&'static str] {
        match self {
            Op::BiasRmsNormRope
            | Op::BiasRmsNorm
            | Op::BiasGelu
            | Op::MatMulBiasGelu
            | Op::CausalConv3d => &["Y"],
            Op::PrefixBiasRmsNorm => &["Y", "tail"],
            Op::GatedResidualLayerNorm => &["S", "Y"],
            Op::QkvNormRopeCache => &["Q"],
            Op::Attention => &["O"],
        }
    }

    /// The index of X among the inputs.
    pub(crate) fn x_index(self) -> usize {
        match self {
            Op::BiasRmsNormRope
            | Op::BiasRmsNorm
            | Op::QkvNormRopeCache
            | Op::BiasGelu
            | Op::PrefixBiasRmsNorm
            | Op::MatMulBiasGelu
            | Op::Attention
            | Op::CausalConv3d => 0,
            Op::GatedResidualLayerNorm => 1,
        }
    }

    /// The inputs the operator writes in place (K and V of `QkvNormRopeCache`).
    pub(crate) fn in_place_inputs(self) -> &'static [usize] {
        match self {
            Op::QkvNormRopeCache => &[7, 8],
            _ => &[],
        }
    }

    /// Whether the operator works element by element (no row in registers, any D).
    pub(crate) fn elementwise(self) -> bool {
        self == Op::BiasGelu
    }

    /// Whether the operator is a matrix product (cuBLASLt on CUDA, not a kernel of
    /// `kernels.cu`).
    pub(crate) fn is_gemm(self) -> bool {
        self == Op::MatMulBiasGelu
    }

    /// Whether the operator normalises (attribute `epsilon`).
    pub(crate) fn has_epsilon(self) -> bool {
        !(self.elementwise() || self.is_gemm() || matches!(self, Op::Attention | Op::CausalConv3d))
    }

    /// Whether the node has the attribute `num_heads`.
    pub(crate) fn has_heads(self) -> bool {
        self.has_rope() || self == Op::Attention
    }

    /// Whether the operator turns rows by rotary tables (attribute `num_heads`).
    pub(crate) fn has_rope(self) -> bool {
        matches!(self, Op::BiasRmsNormRope | Op::QkvNormRopeCache)
    }

    /// Whether the operator has the attribute `silu` (RMS norm, then optionally SiLU).
    pub(crate) fn has_silu(self) -> bool {
        matches!(self, Op::BiasRmsNorm | Op::PrefixBiasRmsNorm)
    }

    /// Output `idx`'s shape from the inputs' (in the operator's input order): X's, with the last
    /// axis D (QKV's is 3·D) or N (W's axis 0, `MatMulBiasGelu`), or axis 1 the prefix's plus
    /// X's (Y of `PrefixBiasRmsNorm`; its tail has the prefix's shape).
    pub(crate) fn output_shape(self, inputs: &[&[i64]], idx: usize) -> Vec<i64> {
        if self == Op::PrefixBiasRmsNorm && idx == 1 {
            return inputs[3].to_vec();
        }
        let mut shape = inputs[self.x_index()].to_vec();
        match self {
            Op::QkvNormRopeCache => {
                if let Some(last) = shape.last_mut() {
                    *last /= 3;
                }
            }
            Op::PrefixBiasRmsNorm => {
                if let (Some(axis), Some(&p)) = (shape.get_mut(1), inputs[3].get(1)) {
                    *axis += p;
                }
            }
            Op::MatMulBiasGelu => {
                if let (Some(last), Some(&n)) = (shape.last_mut(), inputs[1].first()) {
                    *last = n;
                }
            }
            Op::CausalConv3d => {
                if let ([_, t, ..], [_, kt, ..]) = (&mut shape[..], inputs[1]) {
                    *t -= kt - 1;
                }
                if let (Some(last), Some(&k)) = (shape.last_mut(), inputs[1].first()) {
                    *last = k;
                }
            }
            _ => {}
        }
        shape
    }
}

/// An error of one operator, naming it.
fn op_error(op: Op, message: impl std::fmt::Display) -> ort::Error {
    ort::Error::new(format!("{DOMAIN} {}: {message}", op.name()))
}

/// A node's attributes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Attrs {
    pub(crate) epsilon: f32,
    /// `BiasRmsNormRope` and `QkvNormRopeCache`; 0 for the other operators.
    pub(crate) num_heads: usize,
    /// `BiasRmsNorm` and `PrefixBiasRmsNorm` (attribute `silu` = 1): SiLU after the norm; false
    /// for the other operators.
    pub(crate) silu: bool,
}

impl Attrs {
    fn read(op: Op, kctx: &KernelContext<'_>) -> ort::Result<Self> {
        let node = kctx.node_name().unwrap_or_default();
        let missing = |name: &str, ty: &str| {
            op_error(
                op,
                format!("node '{node}' has no attribute {name} ({ty}); the exporter writes it"),
            )
        };
        // Every operator but BiasGelu and MatMulBiasGelu normalises.
        let epsilon = if !op.has_epsilon() {
            0.0
        } else {
            kctx.get::<f32>("epsilon")
                .ok_or_else(|| missing("epsilon", "float"))?
        };
        let num_heads = if op.has_heads() {
            let heads = kctx
                .get::<i64>("num_heads")
                .ok_or_else(|| missing("num_heads", "int"))?;
            usize::try_from(heads)
                .ok()
                .filter(|&h| h > 0)
                .ok_or_else(|| {
                    op_error(
                        op,
                        format!("node '{node}' has num_heads = {heads}; it must be ≥ 1"),
                    )
                })?
        } else {
            0
        };
        let silu = if op.has_silu() {
            match kctx.get::<i64>("silu") {
                None | Some(0) => false,
                Some(1) => true,
                Some(other) => {
                    return Err(op_error(
                        op,
                        format!("node '{node}' has silu = {other}; it must be 0 or 1"),
                    ));
                }
            }
        } else {
            false
        };
        Ok(Self {
            epsilon,
            num_heads,
            silu,
        })
    }
}

/// The sizes of one call, checked against the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// N, the rows of X.
    pub(crate) rows: usize,
    /// D, the last axis of X.
    pub(crate) d: usize,
    /// `MatMulBiasGelu`: N, the columns of Y (W's rows); D for the other operators.
    pub(crate) cols: usize,
    /// `GatedResidualLayerNorm`: N / F of gate, scale and shift (row r uses block r / that);
    /// 1 for the other operators.
    pub(crate) divs: [usize; 3],
    /// `BiasRmsNormRope` and `QkvNormRopeCache`: hd / 2 and Tc, the columns and rows of the cos
    /// and sin tables; `Attention`: hd / 2 (`table_rows` 1); 1 for the other operators.
    pub(crate) half_hd: usize,
    pub(crate) table_rows: usize,
    /// `QkvNormRopeCache`: T and L, the rows of one batch entry in QKV and in K / V (the op
    /// writes rows L − T .. L of each); `Attention`: S and L, the rows of one batch entry in Q
    /// and in K / V; equal to `rows` for the other operators.
    pub(crate) block_rows: usize,
    pub(crate) cache_rows: usize,
    /// `PrefixBiasRmsNorm`: the rows of the prefix (copied in front of X's normed rows in Y); 0
    /// for the other operators.
    pub(crate) prefix_rows: usize,
    /// `CausalConv3d`: its sizes (zero for the other operators).
    pub(crate) conv: ConvDims,
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
}

impl Plan {
    /// The rows of the (first) output: X's, and the prefix's in front of them.
    pub(crate) fn output_rows(&self) -> usize {
        self.rows + self.prefix_rows
    }
}

fn numel(shape: &[i64]) -> usize {
    shape.iter().map(|&n| n.max(0) as usize).product()
}

/// Checks the inputs' shapes (in the operator's input order) against the contract.
pub(crate) fn plan(op: Op, attrs: &Attrs, shapes: &[&[i64]]) -> Result<Plan, String> {
    let names = op.inputs();
    let fail = |message: String| format!("{DOMAIN} {}: {message}", op.name());
    if shapes.len() != names.len() {
        return Err(fail(format!(
            "{} inputs, expected {} ({})",
            shapes.len(),
            names.len(),
            names.join(", ")
        )));
    }
    let x = shapes[op.x_index()];
    let x_name = names[op.x_index()];
    let last = match x.last() {
        Some(&n) if n > 0 => n as usize,
        _ => {
            return Err(fail(format!(
                "{x_name} has shape {x:?}; it needs a last axis of at least one element"
            )));
        }
    };
    let rows = numel(x) / last;
    // QKV holds three rows of D side by side.
    let d = if op == Op::QkvNormRopeCache {
        if !last.is_multiple_of(3) || x.len() < 2 {
            return Err(fail(format!(
                "QKV has shape {x:?}; it must be [..., T, 3·D] (rank 2 or more, the last axis a \
                 multiple of 3)"
            )));
        }
        last / 3
    } else {
        last
    };
    let exactly_d = |i: usize| {
        let n = numel(shapes[i]);
        if n == d {
            Ok(())
        } else {
            Err(fail(format!(
                "input {} has shape {:?} ({n} elements); it must have D = {d} elements (the last axis of X {x:?})",
                names[i], shapes[i]
            )))
        }
    };
    let row_parameter = |i: usize| {
        let n = numel(shapes[i]);
        if n == 0 || !n.is_multiple_of(d) {
            return Err(fail(format!(
                "row parameter {} has shape {:?} ({n} elements), which is not F·D elements with \
                 F ≥ 1 and D = {d} (the last axis of X {x:?})",
                names[i], shapes[i]
            )));
        }
        let f = n / d;
        if !rows.is_multiple_of(f) {
            return Err(fail(format!(
                "row parameter {} has shape {:?}: F = {f} rows of D = {d}, which does not divide \
                 the N = {rows} rows of X {x:?}",
                names[i], shapes[i]
            )));
        }
        Ok((rows / f).max(1))
    };
    // cos and sin of the rotary operators: Tc·hd/2 elements each.
    let tables = |cos: usize, plan: &mut Plan| {
        let heads = attrs.num_heads;
        if heads == 0 || d % (2 * heads) != 0 {
            return Err(fail(format!(
                "D = {d} (from {x_name} {x:?}) is not a multiple of 2·num_heads = {}",
                2 * heads
            )));
        }
        let half_hd = d / heads / 2;
        let n = numel(shapes[cos]);
        if n == 0 || !n.is_multiple_of(half_hd) {
            return Err(fail(format!(
                "input cos has shape {:?} ({n} elements), which is not Tc·hd/2 elements \
                 with Tc ≥ 1 and hd/2 = {half_hd} (D = {d}, num_heads = {heads})",
                shapes[cos]
            )));
        }
        if numel(shapes[cos + 1]) != n {
            return Err(fail(format!(
                "input sin has shape {:?} and cos {:?}; they must have the same number of elements",
                shapes[cos + 1],
                shapes[cos]
            )));
        }
        plan.half_hd = half_hd;
        plan.table_rows = n / half_hd;
        Ok(())
    };
    let mut plan = Plan {
        rows,
        d,
        cols: d,
        divs: [1; 3],
        half_hd: 1,
        table_rows: 1,
        block_rows: rows,
        cache_rows: rows,
        prefix_rows: 0,
        conv: ConvDims::default(),
    };
    match op {
        Op::BiasRmsNorm => {
            exactly_d(1)?;
            exactly_d(2)?;
        }
        Op::PrefixBiasRmsNorm => {
            exactly_d(1)?;
            exactly_d(2)?;
            let prefix = shapes[3];
            let fits = x.len() >= 2
                && x[0] == 1
                && prefix.len() == x.len()
                && prefix[1] >= 0
                && prefix
                    .iter()
                    .zip(x)
                    .enumerate()
                    .all(|(i, (p, x))| i == 1 || p == x);
            if !fits {
                return Err(fail(format!(
                    "input prefix has shape {prefix:?} and X {x:?}; X must have rank 2 or more \
                     and axis 0 of size 1, and prefix X's shape but on axis 1"
                )));
            }
            plan.prefix_rows = numel(prefix) / d;
        }
        Op::BiasGelu => exactly_d(1)?,
        Op::MatMulBiasGelu => {
            let w = shapes[1];
            let cols = match w {
                [n, k] if *n > 0 && *k as usize == d => *n as usize,
                _ => {
                    return Err(fail(format!(
                        "input W has shape {w:?}; with X {x:?} it must be [N, {d}] with N ≥ 1 \
                         (the linear layer's weight, out × in)"
                    )));
                }
            };
            if numel(shapes[2]) != cols {
                return Err(fail(format!(
                    "input bias has shape {:?}; it must have N = {cols} elements (W {w:?})",
                    shapes[2]
                )));
            }
            plan.cols = cols;
        }
        Op::BiasRmsNormRope => {
            exactly_d(1)?;
            exactly_d(2)?;
            tables(3, &mut plan)?;
        }
        Op::QkvNormRopeCache => {
            for i in 1..=4 {
                exactly_d(i)?;
            }
            tables(5, &mut plan)?;
            let t = x[x.len() - 2].max(0) as usize;
            let (k, v) = (shapes[7], shapes[8]);
            let cache_rows = match k {
                [.., l, last] if *last as usize == d && *l >= 0 && (*l as usize) >= t => {
                    *l as usize
                }
                _ => 0,
            };
            let batch = rows.checked_div(t).unwrap_or(0);
            if t == 0 || cache_rows == 0 || numel(k) != batch * cache_rows * d {
                return Err(fail(format!(
                    "input K has shape {k:?}; with QKV {x:?} it must be [..., L, {d}] with \
                     L ≥ T = {t} and {batch}·L·{d} elements (the block's rows are written into \
                     its last T rows)"
                )));
            }
            if v != k {
                return Err(fail(format!(
                    "input V has shape {v:?} and K {k:?}; they must be equal"
                )));
            }
            plan.block_rows = t;
            plan.cache_rows = cache_rows;
        }
        Op::Attention => {
            let heads = attrs.num_heads;
            if heads == 0 || !d.is_multiple_of(2 * heads) {
                return Err(fail(format!(
                    "D = {d} (from Q {x:?}) is not a multiple of 2·num_heads = {}",
                    2 * heads
                )));
            }
            let (k, v) = (shapes[1], shapes[2]);
            let rank = x.len();
            let fits = rank >= 2
                && k.len() == rank
                && k[..rank - 2] == x[..rank - 2]
                && k[rank - 1] as usize == d
                && k[rank - 2] > 0;
            if !fits {
                return Err(fail(format!(
                    "input K has shape {k:?}; with Q {x:?} it must be [..., L, {d}] with L ≥ 1 \
                     and Q's leading axes (Q must have rank 2 or more)"
                )));
            }
            if v != k {
                return Err(fail(format!(
                    "input V has shape {v:?} and K {k:?}; they must be equal"
                )));
            }
            plan.block_rows = x[rank - 2].max(0) as usize;
            plan.cache_rows = k[rank - 2] as usize;
            plan.half_hd = d / heads / 2;
        }
        Op::CausalConv3d => {
            let w = shapes[1];
            let dims = match (x, w) {
                (&[n, t, h, wd, c], &[k, kt, kh, kw, wc])
                    if [n, t, h, wd, c, k, kt, kh, kw].iter().all(|&v| v > 0)
                        && wc == c
                        && kt <= t
                        && kh % 2 == 1
                        && kw % 2 == 1 =>
                {
                    ConvDims {
                        n: n as usize,
                        t: t as usize,
                        h: h as usize,
                        w: wd as usize,
                        c: c as usize,
                        k: k as usize,
                        kt: kt as usize,
                        kh: kh as usize,
                        kw: kw as usize,
                    }
                }
                _ => {
                    return Err(fail(format!(
                        "input X has shape {x:?} and W {w:?}; X must be [N, T, H, W, C] \
                         (channels last) and W [K, kT, kH, kW, C] with X's C, kT ≤ T and kH, kW \
                         odd, every size at least 1"
                    )));
                }
            };
            plan.rows = dims.n * dims.out_t() * dims.h * dims.w;
            plan.cols = dims.k;
            plan.block_rows = plan.rows;
            plan.cache_rows = plan.rows;
            plan.conv = dims;
        }
        Op::GatedResidualLayerNorm => {
            if shapes[0] != x {
                return Err(fail(format!(
                    "input R has shape {:?} and X {x:?}; they must be equal",
                    shapes[0]
                )));
            }
            exactly_d(2)?;
            plan.divs = [row_parameter(3)?, row_parameter(4)?, row_parameter(5)?];
        }
    }
    Ok(plan)
}

/// One operator of the domain for one element type, on the CPU or on CUDA.
struct FusedOp {
    op: Op,
    ty: TensorElementType,
    cuda: bool,
}

impl Operator for FusedOp {
    type Kernel<'attr> = FusedKernel;

    fn name(&self) -> &str {
        self.op.name()
    }

    fn versions(&self) -> RangeInclusive<u32> {
        1..=1
    }

    fn execution_provider_type(&self) -> Option<&str> {
        self.cuda.then_some("CUDAExecutionProvider")
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        self.op
            .inputs()
            .iter()
            .map(|_| OperatorInput::required(self.ty))
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        self.op
            .outputs()
            .iter()
            .map(|_| OperatorOutput::required(self.ty))
    }

    fn create_kernel<'attr>(&self, kctx: &KernelContext<'attr>) -> ort::Result<FusedKernel> {
        let attrs = Attrs::read(self.op, kctx)?;
        let cuda = if self.cuda {
            // The device of the node's CUDA provider; compute checks that the tensors are there.
            let ordinal = kctx
                .allocator(MemoryType::Default)
                .ok()
                .and_then(|allocator| {
                    let memory = allocator.memory_info();
                    (memory.allocation_device() == AllocationDevice::CUDA)
                        .then(|| memory.device_id())
                })
                .unwrap_or(0);
            let kernel = if self.op.is_gemm() {
                gemm::GemmKernel::new(self.ty, ordinal).map(CudaCompute::Gemm)
            } else if self.op == Op::Attention {
                attention::AttentionKernel::new(self.ty, ordinal).map(CudaCompute::Attention)
            } else if self.op == Op::CausalConv3d {
                conv::ConvKernel::new(self.ty, ordinal).map(CudaCompute::Conv)
            } else {
                cuda::CudaKernel::new(self.op, self.ty, ordinal).map(CudaCompute::Rows)
            };
            Some(kernel.map_err(ort::Error::new)?)
        } else {
            None
        };
        Ok(FusedKernel {
            op: self.op,
            ty: self.ty,
            attrs,
            cuda,
        })
    }

    /// Every output has X's type and shape ([`Op::output_shape`]: Q's last axis is D, Y of
    /// `PrefixBiasRmsNorm` the prefix's axis 1 added). Left to ONNX Runtime when a shape it
    /// takes is not fully known (no rank, or an unnamed unknown axis, or QKV's last axis or the
    /// prefix's axis 1 unknown), which ONNX Runtime would otherwise read as a scalar or an axis
    /// of -1.
    fn infer_shape(&self, ctx: &mut ShapeInferenceContext) -> ort::Result<()> {
        let inputs = ctx.inputs();
        fn known(value: Option<&ValueType>) -> Option<&[i64]> {
            match value {
                Some(ValueType::Tensor {
                    shape,
                    dimension_symbols,
                    ..
                }) => {
                    let full = !shape.is_empty()
                        && shape
                            .iter()
                            .zip(dimension_symbols.iter())
                            .all(|(&n, symbol)| n >= 0 || !symbol.is_empty());
                    full.then_some(&shape[..])
                }
                _ => None,
            }
        }
        let x_index = self.op.x_index();
        let Some(x) = known(inputs.get(x_index)) else {
            return Ok(());
        };
        let mut shapes = vec![x; self.op.inputs().len()];
        match self.op {
            Op::QkvNormRopeCache if x.last().is_none_or(|&n| n <= 0) => return Ok(()),
            Op::MatMulBiasGelu => match known(inputs.get(1)) {
                Some(w) if w.first().is_some_and(|&n| n >= 0) => shapes[1] = w,
                _ => return Ok(()),
            },
            Op::CausalConv3d => match known(inputs.get(1)) {
                Some(w)
                    if x.len() == 5
                        && w.len() == 5
                        && x[1] >= 0
                        && w[..2].iter().all(|&n| n >= 0) =>
                {
                    shapes[1] = w
                }
                _ => return Ok(()),
            },
            Op::PrefixBiasRmsNorm => match known(inputs.get(3)) {
                Some(prefix)
                    if [prefix, x]
                        .iter()
                        .all(|s| s.get(1).is_some_and(|&n| n >= 0)) =>
                {
                    shapes[3] = prefix;
                }
                _ => return Ok(()),
            },
            _ => {}
        }
        for idx in 0..self.op.outputs().len() {
            let mut out = inputs[x_index].clone();
            if let ValueType::Tensor { shape, .. } = &mut out {
                *shape = self.op.output_shape(&shapes, idx).into();
            }
            ctx.set_output(idx, &out)?;
        }
        Ok(())
    }
}

/// A node's CUDA kernel: a kernel of `kernels.cu`, or a cuBLASLt matmul.
enum CudaCompute {
    Rows(cuda::CudaKernel),
    Gemm(gemm::GemmKernel),
    Attention(attention::AttentionKernel),
    Conv(conv::ConvKernel),
}

/// A node's kernel.
struct FusedKernel {
    op: Op,
    ty: TensorElementType,
    attrs: Attrs,
    cuda: Option<CudaCompute>,
}

impl Kernel for FusedKernel {
    fn compute(&mut self, ctx: &ComputeContext) -> ort::Result<()> {
        match &mut self.cuda {
            Some(CudaCompute::Rows(kernel)) => return kernel.compute(&self.attrs, ctx),
            Some(CudaCompute::Gemm(kernel)) => return kernel.compute(&self.attrs, ctx),
            Some(CudaCompute::Attention(kernel)) => return kernel.compute(&self.attrs, ctx),
            Some(CudaCompute::Conv(kernel)) => return kernel.compute(&self.attrs, ctx),
            None => {}
        }
        match self.ty {
            TensorElementType::Float32 => cpu::compute::<f32>(self.op, &self.attrs, ctx),
            TensorElementType::Float16 => cpu::compute::<half::f16>(self.op, &self.attrs, ctx),
            other => Err(op_error(
                self.op,
                format!("element type {other:?} is not supported (float32 and float16 are)"),
            )),
        }
    }
}

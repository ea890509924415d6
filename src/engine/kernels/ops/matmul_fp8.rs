//! `MatMulFp8(X, W, w_scale, bias) -> Y`, attribute `gelu` (0 or 1): a linear layer whose
//! product runs in float8 E4M3 (the fp8 bundles' DiT blocks; docs/bundle.md).
//!
//! - W is uint8 `[N, K]`: the layer's weight (out × in) as E4M3 bit patterns (OCP E4M3: bias 7,
//!   no infinities, 0x7f and 0xff NaN, largest finite 448), one scale per output channel in
//!   `w_scale` (float32 `[N]`): `weight[n, k] ≈ w_scale[n]·W[n, k]`. bias is N elements of T.
//! - Each row r of X (K = D elements) is quantised when the node runs: with a_r = max_k |X[r, k]|
//!   (float32), s_r = a_r / 448 and `q[r, k] = e4m3(X[r, k]·(448 / a_r))` rounded to nearest,
//!   ties to even, saturated to ±448; a row of zeros gives s_r = 0 and q = 0.
//! - `Y[r, n] = act(s_r·w_scale[n]·Σ_k q[r, k]·W[n, k] + bias[n])`, the sum in float32 (in any
//!   order), act `BiasGelu`'s GELU when gelu = 1 and the identity otherwise, rounded to T once.
//!
//! The CUDA kernel ([`GemmKernel`], float16 only, compute capability 9.0 or later) quantises X
//! with `unstep_quantize_e4m3_rows_f16` of `kernels.cu` into a buffer of its stream, then runs one
//! cuBLASLt float8 matmul whose per-row and per-column scales (cuBLASLt's outer-vector scaling)
//! and bias or bias-GELU epilogue give Y. The CPU kernel, for the tests, quantises as the CUDA
//! kernel does (the same float32 operations), so both read the same 8-bit values.

use rayon::prelude::*;

use cudarc::driver::sys::CUstream;

use crate::engine::kernels::gemm::{GemmError, GemmKernel};
use crate::engine::kernels::operator::{
    ContractError, CpuIo, CudaKernel, Element, NodeAttrs, OpInfo, ShapeCheck, UnstepOp,
};
use crate::engine::kernels::ops::matmul_bias_gelu::{
    MatMulSizes, matmul_output_shape, matmul_sizes,
};
use crate::engine::kernels::rows::{MIN_ROWS_PER_TASK, gelu};
use ort::value::TensorElementType;

/// The operator.
pub(crate) struct MatMulFp8;

/// The largest finite E4M3 value: a row's largest magnitude is scaled to it.
pub(crate) const E4M3_MAX: f32 = 448.0;

/// A node's attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fp8Attrs {
    /// GELU after the bias.
    pub(crate) gelu: bool,
}

/// The sizes of a `MatMulFp8` call: those of `MatMulBiasGelu`, the same product.
pub(crate) type Fp8Sizes = MatMulSizes;

impl UnstepOp for MatMulFp8 {
    const INFO: OpInfo = OpInfo {
        name: "MatMulFp8",
        inputs: &["X", "W", "w_scale", "bias"],
        outputs: &["Y"],
        x_index: 0,
        in_place: &[],
        fixed: &[
            (1, TensorElementType::Uint8),
            (2, TensorElementType::Float32),
        ],
        row_kernel: None,
    };
    type Attrs = Fp8Attrs;
    type Sizes = Fp8Sizes;
    type Cuda = GemmKernel;

    fn attrs(node: &NodeAttrs<'_, '_>) -> ort::Result<Fp8Attrs> {
        Ok(Fp8Attrs { gelu: node.gelu()? })
    }

    fn check(_: &Fp8Attrs, shapes: &ShapeCheck<'_>) -> Result<Fp8Sizes, ContractError> {
        matmul_sizes(
            shapes,
            "the linear layer's 8-bit weight",
            &[(2, "its scale per output channel"), (3, "the bias")],
        )
    }

    /// Y has X's shape with W's axis 0 (N) last.
    fn output_shape(shapes: &[&[i64]], _: usize) -> Vec<i64> {
        matmul_output_shape(shapes)
    }

    /// Needs W's shape with axis 0 known.
    fn inference_shapes<'a>(
        x: &'a [i64],
        known: impl Fn(usize) -> Option<&'a [i64]>,
    ) -> Option<Vec<&'a [i64]>> {
        let w = known(1).filter(|w| w.first().is_some_and(|&n| n >= 0))?;
        Some(vec![x, w, x, x])
    }

    fn is_empty(sizes: &Fp8Sizes) -> bool {
        sizes.rows == 0
    }

    fn cpu<T: Element>(attrs: &Fp8Attrs, sizes: &Fp8Sizes, io: CpuIo<'_, T>) {
        let [x, _, _, bias] = io.inputs[..] else {
            unreachable!("four inputs")
        };
        let [w, w_scale] = io.fixed[..] else {
            unreachable!("two inputs of a fixed type")
        };
        let [y] = io.outputs.try_into().expect("one output");
        matmul_fp8(attrs, sizes, x, w.u8(), w_scale.f32(), bias, y);
    }
}

/// `v` as an E4M3 bit pattern: rounded to nearest, ties to even, saturated to ±448 (infinities
/// too); NaN gives 0x7f. What the PTX `cvt.rn.satfinite.e4m3x2.f32` gives.
pub(crate) fn e4m3(v: f32) -> u8 {
    if v.is_nan() {
        return 0x7f;
    }
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = v.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // Below the smallest normal (2⁻⁶) the step is 2⁻⁹: the code is the multiple of it, and 8
    // is the smallest normal's code (exponent field 1, mantissa 0).
    if a < 1.0 / 64.0 {
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    let bits = a.to_bits();
    let exponent = ((bits >> 23) & 0xff) as i32 - 127;
    let mantissa = bits & 0x7f_ffff;
    // Keep 3 of float32's 23 mantissa bits, rounding the 20 dropped ones to nearest, ties to even.
    let (mut kept, dropped, half) = (mantissa >> 20, mantissa & 0xf_ffff, 1 << 19);
    if dropped > half || (dropped == half && kept & 1 == 1) {
        kept += 1;
    }
    // A carry out of the mantissa is the next exponent's code: codes are ordered like values.
    let code = (((exponent + 7) as u32) << 3) + kept;
    sign | code.min(0x7e) as u8
}

/// The value of an E4M3 bit pattern.
pub(crate) fn e4m3_value(code: u8) -> f32 {
    let magnitude = match (code >> 3) & 0xf {
        _ if code & 0x7f == 0x7f => f32::NAN,
        0 => f32::from(code & 7) / 512.0,
        e => (1.0 + f32::from(code & 7) / 8.0) * 2f32.powi(i32::from(e) - 7),
    };
    if code & 0x80 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// One row's quantisation: its scale s = a / 448 and the values of its E4M3 codes (float32).
pub(crate) fn quantise_row(row: &[f32], codes: &mut [f32]) -> f32 {
    let a = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    if a == 0.0 {
        codes.fill(0.0);
        return 0.0;
    }
    let inv = E4M3_MAX / a;
    for (c, &v) in codes.iter_mut().zip(row) {
        *c = e4m3_value(e4m3(v * inv));
    }
    a / E4M3_MAX
}

/// The CPU kernel over `sizes.rows` rows of K = `sizes.d` and N = `sizes.cols` (module doc): the
/// rows quantised as the CUDA kernel quantises them, the product of the 8-bit values in float32
/// (ndarray's matrix multiply), scaled, biased, and rounded to T once.
pub(crate) fn matmul_fp8<T: Element>(
    attrs: &Fp8Attrs,
    sizes: &Fp8Sizes,
    x: &[T],
    w: &[u8],
    w_scale: &[f32],
    bias: &[T],
    y: &mut [T],
) {
    let (m, k, n) = (sizes.rows, sizes.d, sizes.cols);
    let x = T::widen(&x[..m * k]);
    let mut q = vec![0f32; m * k];
    let scales: Vec<f32> = q
        .par_chunks_mut(k)
        .zip(x.par_chunks(k))
        .map(|(codes, row)| quantise_row(row, codes))
        .collect();
    let w: Vec<f32> = w[..n * k].iter().map(|&c| e4m3_value(c)).collect();
    let q = ndarray::ArrayView2::from_shape((m, k), &q[..]).expect("M·K elements");
    let w = ndarray::ArrayView2::from_shape((n, k), &w[..]).expect("N·K elements");
    let product = q.dot(&w.t());
    let product = product.as_slice().expect("a new array is contiguous");
    y.par_chunks_mut(n)
        .zip(product.par_chunks(n))
        .zip(scales.par_iter())
        .with_min_len(MIN_ROWS_PER_TASK)
        .for_each(|((y_row, p_row), &s)| {
            for c in 0..n {
                let v = s * w_scale[c] * p_row[c] + bias[c].to_f32();
                y_row[c] = T::from_f32(if attrs.gelu { gelu(v) } else { v });
            }
        });
}

impl CudaKernel<MatMulFp8> for GemmKernel {
    type Error = GemmError;

    fn new(ty: TensorElementType, ordinal: i32) -> Result<Self, GemmError> {
        GemmKernel::fp8(ty, ordinal)
    }

    fn launch(
        &mut self,
        attrs: &Fp8Attrs,
        sizes: &Fp8Sizes,
        pointers: &[u64],
        stream: CUstream,
    ) -> Result<(), GemmError> {
        self.launch_fp8(attrs.gelu, sizes, pointers, stream)
    }
}

#[cfg(test)]
pub(crate) mod tests;

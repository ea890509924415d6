//! `MatMulBiasGelu(X, W, bias) -> Y`: a linear layer and the GELU after it (the DiT's FFN up to
//! its second layer).
//!
//! W has shape `[N, K]` (the layer's weight as stored, out × in) with K = D, bias N elements; Y
//! has X's shape with N on the last axis, and `Y[r, n] = GELU(Σ_k X[r, k]·W[n, k] + bias[n])`
//! with `BiasGelu`'s GELU, the sum in float32 (in any order) and rounded to T once, after the
//! GELU. The CUDA kernel is one cuBLASLt matmul with its bias-and-GELU epilogue
//! ([`GemmKernel`]), where a `MatMul` and a `BiasGelu` wrote and read the N-wide product once
//! more.

use rayon::prelude::*;

use cudarc::driver::sys::CUstream;
use ort::value::TensorElementType;

pub(crate) use crate::engine::kernels::gemm::MatMulSizes;
use crate::engine::kernels::gemm::{GemmError, GemmKernel};
use crate::engine::kernels::operator::{
    ContractError, CpuIo, CudaKernel, Element, NodeAttrs, OpInfo, ShapeCheck, UnstepOp, numel,
};
use crate::engine::kernels::rows::{MIN_ROWS_PER_TASK, gelu};

/// The operator.
pub(crate) struct MatMulBiasGelu;

/// The sizes of a matmul whose W (input 1, `weight` says what it holds) is `[N, K]` with K = D,
/// and whose inputs `per_channel` (index, what it holds) have N elements each.
pub(crate) fn matmul_sizes(
    shapes: &ShapeCheck<'_>,
    weight: &str,
    per_channel: &[(usize, &str)],
) -> Result<MatMulSizes, ContractError> {
    let (d, x, w) = (shapes.last, shapes.x, shapes.shape(1));
    let cols = match w {
        [n, k] if *n > 0 && *k as usize == d => *n as usize,
        _ => {
            return Err(shapes.fail(format!(
                "input W has shape {w:?}; with X {x:?} it must be [N, {d}] with N ≥ 1 ({weight}, \
                 out × in)"
            )));
        }
    };
    for &(i, what) in per_channel {
        let shape = shapes.shape(i);
        if numel(shape) != cols {
            return Err(shapes.fail(format!(
                "input {} has shape {shape:?}; it must have N = {cols} elements ({what}; W {w:?})",
                shapes.name(i)
            )));
        }
    }
    Ok(MatMulSizes {
        rows: shapes.rows,
        d,
        cols,
    })
}

/// The shape of a matmul's Y: X's (`shapes[0]`) with W's axis 0 (`shapes[1]`, N) last.
pub(crate) fn matmul_output_shape(shapes: &[&[i64]]) -> Vec<i64> {
    let mut shape = shapes[0].to_vec();
    if let (Some(last), Some(&n)) = (shape.last_mut(), shapes[1].first()) {
        *last = n;
    }
    shape
}

impl UnstepOp for MatMulBiasGelu {
    const INFO: OpInfo = OpInfo {
        name: "MatMulBiasGelu",
        inputs: &["X", "W", "bias"],
        outputs: &["Y"],
        x_index: 0,
        in_place: &[],
        fixed: &[],
        row_kernel: None,
    };
    type Attrs = ();
    type Sizes = MatMulSizes;
    type Cuda = GemmKernel;

    fn attrs(_: &NodeAttrs<'_, '_>) -> ort::Result<()> {
        Ok(())
    }

    fn check(_: &(), shapes: &ShapeCheck<'_>) -> Result<MatMulSizes, ContractError> {
        matmul_sizes(shapes, "the linear layer's weight", &[(2, "the bias")])
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
        Some(vec![x, w, x])
    }

    fn is_empty(sizes: &MatMulSizes) -> bool {
        sizes.rows == 0
    }

    fn cpu<T: Element>(_: &(), sizes: &MatMulSizes, io: CpuIo<'_, T>) {
        let [x, w, bias] = io.inputs[..] else {
            unreachable!("three inputs")
        };
        let [y] = io.outputs.try_into().expect("one output");
        matmul_bias_gelu(sizes, x, w, bias, y);
    }
}

/// The CPU kernel: `y[r, n] = GELU(Σ_k x[r, k]·w[n, k] + bias[n])` for `sizes.rows` rows of K =
/// `sizes.d` and N = `sizes.cols`; the product in float32 (ndarray's matrix multiply, on the
/// inputs themselves when they are float32), each element rounded to T once, after the GELU.
pub(crate) fn matmul_bias_gelu<T: Element>(
    sizes: &MatMulSizes,
    x: &[T],
    w: &[T],
    bias: &[T],
    y: &mut [T],
) {
    let (m, k, n) = (sizes.rows, sizes.d, sizes.cols);
    let (x, w) = (T::widen(&x[..m * k]), T::widen(&w[..n * k]));
    let x = ndarray::ArrayView2::from_shape((m, k), &x[..]).expect("M·K elements");
    let w = ndarray::ArrayView2::from_shape((n, k), &w[..]).expect("N·K elements");
    let product = x.dot(&w.t());
    let product = product.as_slice().expect("a new array is contiguous");
    y.par_chunks_mut(n)
        .zip(product.par_chunks(n))
        .with_min_len(MIN_ROWS_PER_TASK)
        .for_each(|(y_row, p_row)| {
            for c in 0..n {
                y_row[c] = T::from_f32(gelu(p_row[c] + bias[c].to_f32()));
            }
        });
}

impl CudaKernel<MatMulBiasGelu> for GemmKernel {
    type Error = GemmError;

    fn new(ty: TensorElementType, ordinal: i32) -> Result<Self, GemmError> {
        GemmKernel::bias_gelu(ty, ordinal)
    }

    fn launch(
        &mut self,
        _: &(),
        sizes: &MatMulSizes,
        pointers: &[u64],
        stream: CUstream,
    ) -> Result<(), GemmError> {
        self.launch_matmul(sizes, pointers, stream)
    }
}

#[cfg(test)]
pub(crate) mod tests;

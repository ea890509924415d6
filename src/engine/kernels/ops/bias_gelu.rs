//! `BiasGelu(X, bias) -> Y`: the bias add and GELU of a linear layer.
//!
//! bias has D elements; with v = X + bias, `Y = 0.5·v·(1 + tanh(sqrt(2/π)·(v + 0.044715·v³)))`
//! (GELU's tanh form, as ONNX Runtime's FastGelu and PyTorch's `gelu(approximate="tanh")`).
//! Elementwise: any D (the CUDA kernel needs it even), the DiT's FFN has 8960. Y has X's shape.

use rayon::prelude::*;

use crate::engine::kernels::operator::{
    ContractError, CpuIo, Element, NodeAttrs, OpInfo, ShapeCheck, UnstepOp,
};
use crate::engine::kernels::row_launch::{RowArgs, RowKernel, RowOp};
use crate::engine::kernels::rows::{MIN_ROWS_PER_TASK, RowSizes, gelu};

/// The operator.
pub(crate) struct BiasGelu;

impl UnstepOp for BiasGelu {
    const INFO: OpInfo = OpInfo {
        name: "BiasGelu",
        inputs: &["X", "bias"],
        outputs: &["Y"],
        x_index: 0,
        in_place: &[],
        fixed: &[],
        row_kernel: Some("bias_gelu"),
    };
    type Attrs = ();
    type Sizes = RowSizes;
    type Cuda = RowKernel<Self>;

    fn attrs(_: &NodeAttrs<'_, '_>) -> ort::Result<()> {
        Ok(())
    }

    fn check(_: &(), shapes: &ShapeCheck<'_>) -> Result<RowSizes, ContractError> {
        shapes.exactly_d(1, shapes.last)?;
        Ok(RowSizes {
            rows: shapes.rows,
            d: shapes.last,
        })
    }

    fn is_empty(sizes: &RowSizes) -> bool {
        sizes.rows == 0
    }

    fn cpu<T: Element>(_: &(), sizes: &RowSizes, io: CpuIo<'_, T>) {
        let [x, bias] = io.inputs[..] else {
            unreachable!("two inputs")
        };
        let [y] = io.outputs.try_into().expect("one output");
        bias_gelu(sizes, x, bias, y);
    }
}

impl RowOp for BiasGelu {
    const ELEMENTWISE: bool = true;

    fn args(_: &(), sizes: &RowSizes) -> RowArgs {
        RowArgs {
            rows: sizes.rows,
            d: sizes.d,
            epsilon: 0.0,
            launch_rows: sizes.rows,
            extra: Vec::new(),
        }
    }
}

/// The CPU kernel over `sizes.rows` rows of `sizes.d`.
pub(crate) fn bias_gelu<T: Element>(sizes: &RowSizes, x: &[T], bias: &[T], y: &mut [T]) {
    let d = sizes.d;
    y.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .with_min_len(MIN_ROWS_PER_TASK)
        .for_each(|(y_row, x_row)| {
            for c in 0..d {
                y_row[c] = T::from_f32(gelu(x_row[c].to_f32() + bias[c].to_f32()));
            }
        });
}

#[cfg(test)]
pub(crate) mod tests;

//! `BiasRmsNormRope(X, bias, weight, cos, sin) -> Y`, attributes `epsilon` (float) and
//! `num_heads` (int): the DiT's query and key norm with the rotary embedding after it.
//!
//! bias and weight have D elements; hd = D / num_heads (D % (2 · num_heads) == 0); cos and sin
//! have Tc · hd/2 elements, Tc ≥ 1, and row r uses table row t = r % Tc. `v = X + bias`,
//! `u = v / sqrt(mean(v²) + epsilon) · weight`, and pair i (columns 2i, 2i + 1) turns by column
//! j = i mod hd/2 of the tables:
//! `Y[2i] = u[2i]·cos[t,j] − u[2i+1]·sin[t,j]`, `Y[2i+1] = u[2i]·sin[t,j] + u[2i+1]·cos[t,j]`.
//! Y has X's shape.

use crate::engine::kernels::operator::{
    ContractError, CpuIo, Element, NodeAttrs, OpInfo, ShapeCheck, UnstepOp,
};
use crate::engine::kernels::row_launch::{Arg, RowArgs, RowKernel, RowOp};
use crate::engine::kernels::rows::{Epilogue, Rows, Tables, norm_rows};

/// The operator.
pub(crate) struct BiasRmsNormRope;

/// The attributes of the rotary operators (`BiasRmsNormRope`, `QkvNormRopeCache`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RopeAttrs {
    pub(crate) epsilon: f32,
    pub(crate) num_heads: usize,
}

impl RopeAttrs {
    pub(crate) fn read(node: &NodeAttrs<'_, '_>) -> ort::Result<Self> {
        Ok(Self {
            epsilon: node.epsilon()?,
            num_heads: node.num_heads()?,
        })
    }
}

/// The sizes of a `BiasRmsNormRope` call: N rows of D and the rotary tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RopeSizes {
    pub(crate) rows: usize,
    pub(crate) d: usize,
    pub(crate) tables: Tables,
}

impl UnstepOp for BiasRmsNormRope {
    const INFO: OpInfo = OpInfo {
        name: "BiasRmsNormRope",
        inputs: &["X", "bias", "weight", "cos", "sin"],
        outputs: &["Y"],
        x_index: 0,
        in_place: &[],
        fixed: &[],
        row_kernel: Some("bias_rms_norm_rope"),
    };
    type Attrs = RopeAttrs;
    type Sizes = RopeSizes;
    type Cuda = RowKernel<Self>;

    fn attrs(node: &NodeAttrs<'_, '_>) -> ort::Result<RopeAttrs> {
        RopeAttrs::read(node)
    }

    fn check(attrs: &RopeAttrs, shapes: &ShapeCheck<'_>) -> Result<RopeSizes, ContractError> {
        let d = shapes.last;
        shapes.exactly_d(1, d)?;
        shapes.exactly_d(2, d)?;
        Ok(RopeSizes {
            rows: shapes.rows,
            d,
            tables: shapes.tables(3, d, attrs.num_heads)?,
        })
    }

    fn is_empty(sizes: &RopeSizes) -> bool {
        sizes.rows == 0
    }

    fn cpu<T: Element>(attrs: &RopeAttrs, sizes: &RopeSizes, io: CpuIo<'_, T>) {
        let [x, bias, weight, cos, sin] = io.inputs[..] else {
            unreachable!("five inputs")
        };
        let [y] = io.outputs.try_into().expect("one output");
        bias_rms_norm_rope(sizes, attrs.epsilon, x, bias, weight, (cos, sin), y);
    }
}

impl RowOp for BiasRmsNormRope {
    fn args(attrs: &RopeAttrs, sizes: &RopeSizes) -> RowArgs {
        RowArgs {
            rows: sizes.rows,
            d: sizes.d,
            epsilon: attrs.epsilon,
            launch_rows: sizes.rows,
            extra: vec![
                Arg::Int(sizes.tables.half_hd as i32),
                Arg::Long(sizes.tables.rows as i64),
            ],
        }
    }
}

/// The CPU kernel over `sizes.rows` rows.
pub(crate) fn bias_rms_norm_rope<T: Element>(
    sizes: &RopeSizes,
    epsilon: f32,
    x: &[T],
    bias: &[T],
    weight: &[T],
    (cos, sin): (&[T], &[T]),
    y: &mut [T],
) {
    let rope = Epilogue::Rope(cos, sin, sizes.tables);
    let rows = Rows::packed(sizes.d);
    norm_rows(sizes.d, epsilon, x, rows, bias, weight, rope, y);
}

#[cfg(test)]
pub(crate) mod tests;

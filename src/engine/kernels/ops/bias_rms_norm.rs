//! `BiasRmsNorm(X, bias, weight) -> Y`, attributes `epsilon` and `silu` (int, optional, 0 or 1,
//! default 0): the VAE decoder's RMS norm, with its SiLU.
//!
//! `n = (X + bias) / sqrt(mean((X + bias)²) + epsilon) · weight`, and `Y = n` with `silu = 0`,
//! `Y = n · sigmoid(n)`, computed as `n / (1 + exp(−n))`, with `silu = 1` (RMS norm and SiLU in
//! one pass, rounded to T once). Another value of `silu` is an error when the session creates
//! the kernel. bias and weight have D elements; Y has X's shape.

use crate::engine::kernels::operator::{
    ContractError, CpuIo, Element, NodeAttrs, OpInfo, ShapeCheck, UnstepOp,
};
use crate::engine::kernels::row_launch::{Arg, RowArgs, RowKernel, RowOp};
use crate::engine::kernels::rows::{Epilogue, RowSizes, Rows, norm_rows};

/// The operator.
pub(crate) struct BiasRmsNorm;

/// The attributes of the RMS norms with an optional SiLU (`BiasRmsNorm`, `PrefixBiasRmsNorm`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NormAttrs {
    pub(crate) epsilon: f32,
    /// Attribute `silu` = 1: SiLU after the norm.
    pub(crate) silu: bool,
}

impl NormAttrs {
    pub(crate) fn read(node: &NodeAttrs<'_, '_>) -> ort::Result<Self> {
        Ok(Self {
            epsilon: node.epsilon()?,
            silu: node.silu()?,
        })
    }

    /// What the norm does with a normed row before it stores it.
    pub(crate) fn epilogue<T>(&self) -> Epilogue<'static, T> {
        if self.silu {
            Epilogue::Silu
        } else {
            Epilogue::Plain
        }
    }
}

impl UnstepOp for BiasRmsNorm {
    const INFO: OpInfo = OpInfo {
        name: "BiasRmsNorm",
        inputs: &["X", "bias", "weight"],
        outputs: &["Y"],
        x_index: 0,
        in_place: &[],
        fixed: &[],
        row_kernel: Some("bias_rms_norm"),
    };
    type Attrs = NormAttrs;
    type Sizes = RowSizes;
    type Cuda = RowKernel<Self>;

    fn attrs(node: &NodeAttrs<'_, '_>) -> ort::Result<NormAttrs> {
        NormAttrs::read(node)
    }

    fn check(_: &NormAttrs, shapes: &ShapeCheck<'_>) -> Result<RowSizes, ContractError> {
        let d = shapes.last;
        shapes.exactly_d(1, d)?;
        shapes.exactly_d(2, d)?;
        Ok(RowSizes {
            rows: shapes.rows,
            d,
        })
    }

    fn is_empty(sizes: &RowSizes) -> bool {
        sizes.rows == 0
    }

    fn cpu<T: Element>(attrs: &NormAttrs, sizes: &RowSizes, io: CpuIo<'_, T>) {
        let [x, bias, weight] = io.inputs[..] else {
            unreachable!("three inputs")
        };
        let [y] = io.outputs.try_into().expect("one output");
        bias_rms_norm(sizes, attrs.epsilon, x, bias, weight, attrs.epilogue(), y);
    }
}

impl RowOp for BiasRmsNorm {
    fn args(attrs: &NormAttrs, sizes: &RowSizes) -> RowArgs {
        RowArgs {
            rows: sizes.rows,
            d: sizes.d,
            epsilon: attrs.epsilon,
            launch_rows: sizes.rows,
            extra: vec![Arg::Int(i32::from(attrs.silu))],
        }
    }
}

/// The CPU kernel over `sizes.rows` rows (epilogue `Plain` or `Silu`).
pub(crate) fn bias_rms_norm<T: Element>(
    sizes: &RowSizes,
    epsilon: f32,
    x: &[T],
    bias: &[T],
    weight: &[T],
    epilogue: Epilogue<'_, T>,
    y: &mut [T],
) {
    let rows = Rows::packed(sizes.d);
    norm_rows(sizes.d, epsilon, x, rows, bias, weight, epilogue, y);
}

#[cfg(test)]
pub(crate) mod tests;

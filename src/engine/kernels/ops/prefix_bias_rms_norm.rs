//! `PrefixBiasRmsNorm(X, bias, weight, prefix) -> (Y, tail)`, attributes `epsilon` and `silu`:
//! the fused VAE's norm in front of a causal convolution, with the convolution's frame cache.
//!
//! Y is the concatenation along axis 1 of `prefix` and `BiasRmsNorm(X, bias, weight)` (the same
//! arithmetic and attributes), and tail the last P entries of Y along axis 1 (prefix's shape). X
//! has rank ≥ 2 and axis 0 of size 1; prefix has X's shape but on axis 1 (P ≥ 0 there); Y has
//! X's shape with P + T on axis 1, so its first rows are prefix's, copied, and the rest the
//! normed rows of X. The fused VAE's causal convolutions read their last two input frames (a
//! cache) in front of the new ones: the op writes the frames after the cache instead of a
//! concatenation copying both, and gives the next call's cache as its own output, so that nothing
//! keeps Y alive once the convolution has read it.

use super::bias_rms_norm::{NormAttrs, bias_rms_norm};
use crate::engine::kernels::operator::{
    ContractError, CpuIo, Element, NodeAttrs, OpInfo, ShapeCheck, UnstepOp, numel,
};
use crate::engine::kernels::row_launch::{Arg, RowArgs, RowKernel, RowOp};
use crate::engine::kernels::rows::RowSizes;

/// The operator.
pub(crate) struct PrefixBiasRmsNorm;

/// The sizes of a `PrefixBiasRmsNorm` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PrefixSizes {
    /// N rows of D in X.
    pub(crate) x: RowSizes,
    /// The rows of the prefix (copied in front of X's normed rows in Y).
    pub(crate) prefix_rows: usize,
}

impl PrefixSizes {
    /// The rows of Y: the prefix's, then X's.
    pub(crate) fn output_rows(&self) -> usize {
        self.x.rows + self.prefix_rows
    }
}

impl UnstepOp for PrefixBiasRmsNorm {
    const INFO: OpInfo = OpInfo {
        name: "PrefixBiasRmsNorm",
        inputs: &["X", "bias", "weight", "prefix"],
        outputs: &["Y", "tail"],
        x_index: 0,
        in_place: &[],
        fixed: &[],
        row_kernel: Some("prefix_bias_rms_norm"),
    };
    type Attrs = NormAttrs;
    type Sizes = PrefixSizes;
    type Cuda = RowKernel<Self>;

    fn attrs(node: &NodeAttrs<'_, '_>) -> ort::Result<NormAttrs> {
        NormAttrs::read(node)
    }

    fn check(_: &NormAttrs, shapes: &ShapeCheck<'_>) -> Result<PrefixSizes, ContractError> {
        let (d, x) = (shapes.last, shapes.x);
        shapes.exactly_d(1, d)?;
        shapes.exactly_d(2, d)?;
        let prefix = shapes.shape(3);
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
            return Err(shapes.fail(format!(
                "input prefix has shape {prefix:?} and X {x:?}; X must have rank 2 or more \
                 and axis 0 of size 1, and prefix X's shape but on axis 1"
            )));
        }
        Ok(PrefixSizes {
            x: RowSizes {
                rows: shapes.rows,
                d,
            },
            prefix_rows: numel(prefix) / d,
        })
    }

    /// Y has axis 1 the prefix's plus X's; its tail has the prefix's shape.
    fn output_shape(shapes: &[&[i64]], idx: usize) -> Vec<i64> {
        if idx == 1 {
            return shapes[3].to_vec();
        }
        let mut shape = shapes[0].to_vec();
        if let (Some(axis), Some(&p)) = (shape.get_mut(1), shapes[3].get(1)) {
            *axis += p;
        }
        shape
    }

    /// Needs prefix's shape, and axis 1 known in it and in X.
    fn inference_shapes<'a>(
        x: &'a [i64],
        known: impl Fn(usize) -> Option<&'a [i64]>,
    ) -> Option<Vec<&'a [i64]>> {
        let prefix = known(3)?;
        let axis_known = [prefix, x]
            .iter()
            .all(|s| s.get(1).is_some_and(|&n| n >= 0));
        axis_known.then(|| vec![x, x, x, prefix])
    }

    fn is_empty(sizes: &PrefixSizes) -> bool {
        sizes.output_rows() == 0
    }

    fn cpu<T: Element>(attrs: &NormAttrs, sizes: &PrefixSizes, io: CpuIo<'_, T>) {
        let [x, bias, weight, prefix] = io.inputs[..] else {
            unreachable!("four inputs")
        };
        let [y, tail] = io.outputs.try_into().expect("two outputs");
        prefix_bias_rms_norm(sizes, attrs, [x, bias, weight, prefix], y, tail);
    }
}

impl RowOp for PrefixBiasRmsNorm {
    fn args(attrs: &NormAttrs, sizes: &PrefixSizes) -> RowArgs {
        RowArgs {
            rows: sizes.x.rows,
            d: sizes.x.d,
            epsilon: attrs.epsilon,
            // The threads cover Y's rows: the prefix's, then the normalised ones.
            launch_rows: sizes.output_rows(),
            extra: vec![
                Arg::Long(sizes.prefix_rows as i64),
                Arg::Int(i32::from(attrs.silu)),
            ],
        }
    }
}

/// The CPU kernel: the prefix's rows first, the normed rows after them, and the last
/// prefix-sized rows again as the tail.
pub(crate) fn prefix_bias_rms_norm<T: Element>(
    sizes: &PrefixSizes,
    attrs: &NormAttrs,
    [x, bias, weight, prefix]: [&[T]; 4],
    y: &mut [T],
    tail: &mut [T],
) {
    let prefix_len = sizes.prefix_rows * sizes.x.d;
    let (head, rest) = y.split_at_mut(prefix_len);
    head.copy_from_slice(prefix);
    let epilogue = attrs.epilogue();
    bias_rms_norm(&sizes.x, attrs.epsilon, x, bias, weight, epilogue, rest);
    tail.copy_from_slice(&y[y.len() - prefix_len..]);
}

#[cfg(test)]
pub(crate) mod tests;

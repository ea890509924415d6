//! `GatedResidualLayerNorm(R, X, bias, gate, scale, shift) -> (S, Y)`, attribute `epsilon`: a
//! DiT block's gated residual add and the modulated layer norm after it.
//!
//! R has X's shape, bias D elements, gate, scale and shift are row parameters (each with its own
//! F). `S = round_T(R + (X + bias) · gate)`; with s = S as stored,
//! `Y = (s − mean(s)) / sqrt(mean((s − mean(s))²) + epsilon) · scale + shift`. S and Y have X's
//! shape.

use rayon::prelude::*;

use crate::engine::kernels::operator::{
    ContractError, CpuIo, Element, NodeAttrs, OpInfo, ShapeCheck, UnstepOp,
};
use crate::engine::kernels::row_launch::{Arg, RowArgs, RowKernel, RowOp};
use crate::engine::kernels::rows::MIN_ROWS_PER_TASK;

/// The operator.
pub(crate) struct GatedResidualLayerNorm;

/// The attribute of `GatedResidualLayerNorm`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LayerNormAttrs {
    pub(crate) epsilon: f32,
}

/// The sizes of a `GatedResidualLayerNorm` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GrlnSizes {
    pub(crate) rows: usize,
    pub(crate) d: usize,
    /// N / F of gate, scale and shift: row r uses block r / that.
    pub(crate) divs: [usize; 3],
}

impl UnstepOp for GatedResidualLayerNorm {
    const INFO: OpInfo = OpInfo {
        name: "GatedResidualLayerNorm",
        inputs: &["R", "X", "bias", "gate", "scale", "shift"],
        outputs: &["S", "Y"],
        x_index: 1,
        in_place: &[],
        fixed: &[],
        row_kernel: Some("gated_residual_layer_norm"),
    };
    type Attrs = LayerNormAttrs;
    type Sizes = GrlnSizes;
    type Cuda = RowKernel<Self>;

    fn attrs(node: &NodeAttrs<'_, '_>) -> ort::Result<LayerNormAttrs> {
        Ok(LayerNormAttrs {
            epsilon: node.epsilon()?,
        })
    }

    fn check(_: &LayerNormAttrs, shapes: &ShapeCheck<'_>) -> Result<GrlnSizes, ContractError> {
        let (d, rows, x) = (shapes.last, shapes.rows, shapes.x);
        if shapes.shape(0) != x {
            return Err(shapes.fail(format!(
                "input R has shape {:?} and X {x:?}; they must be equal",
                shapes.shape(0)
            )));
        }
        shapes.exactly_d(2, d)?;
        let divs = [
            shapes.row_parameter(3, d, rows)?,
            shapes.row_parameter(4, d, rows)?,
            shapes.row_parameter(5, d, rows)?,
        ];
        Ok(GrlnSizes { rows, d, divs })
    }

    fn is_empty(sizes: &GrlnSizes) -> bool {
        sizes.rows == 0
    }

    fn cpu<T: Element>(attrs: &LayerNormAttrs, sizes: &GrlnSizes, io: CpuIo<'_, T>) {
        let [r, x, bias, gate, scale, shift] = io.inputs[..] else {
            unreachable!("six inputs")
        };
        let [s, y] = io.outputs.try_into().expect("two outputs");
        gated_residual_layer_norm(
            sizes,
            attrs.epsilon,
            [r, x, bias],
            [gate, scale, shift],
            s,
            y,
        );
    }
}

impl RowOp for GatedResidualLayerNorm {
    fn args(attrs: &LayerNormAttrs, sizes: &GrlnSizes) -> RowArgs {
        RowArgs {
            rows: sizes.rows,
            d: sizes.d,
            epsilon: attrs.epsilon,
            launch_rows: sizes.rows,
            extra: sizes
                .divs
                .iter()
                .map(|&div| Arg::Long(div as i64))
                .collect(),
        }
    }
}

/// The CPU kernel over `sizes.rows` rows: `s` and `y` are its two outputs.
pub(crate) fn gated_residual_layer_norm<T: Element>(
    sizes: &GrlnSizes,
    epsilon: f32,
    [r, x, bias]: [&[T]; 3],
    [gate, scale, shift]: [&[T]; 3],
    s: &mut [T],
    y: &mut [T],
) {
    let d = sizes.d;
    let [gate_div, scale_div, shift_div] = sizes.divs;
    s.par_chunks_mut(d)
        .zip(y.par_chunks_mut(d))
        .with_min_len(MIN_ROWS_PER_TASK)
        .enumerate()
        .for_each_init(
            || vec![0f32; d],
            |v, (row, (s_row, y_row))| {
                let at = row * d;
                let g = &gate[(row / gate_div) * d..][..d];
                let sc = &scale[(row / scale_div) * d..][..d];
                let sh = &shift[(row / shift_div) * d..][..d];
                let mut sum = 0f32;
                for c in 0..d {
                    let value = r[at + c].to_f32()
                        + (x[at + c].to_f32() + bias[c].to_f32()) * g[c].to_f32();
                    s_row[c] = T::from_f32(value);
                    // The normalisation reads S as it is stored.
                    v[c] = s_row[c].to_f32();
                    sum += v[c];
                }
                let mean = sum / d as f32;
                let mut squares = 0f32;
                for &value in v.iter() {
                    squares += (value - mean) * (value - mean);
                }
                let inv = 1.0 / (squares / d as f32 + epsilon).sqrt();
                for c in 0..d {
                    y_row[c] = T::from_f32((v[c] - mean) * inv * sc[c].to_f32() + sh[c].to_f32());
                }
            },
        );
}

#[cfg(test)]
pub(crate) mod tests;

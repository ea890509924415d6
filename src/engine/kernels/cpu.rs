//! The CPU kernels of the `ai.unstep` operators: one pass per row, rows in parallel (rayon), float32
//! arithmetic, each output element rounded to its type once.

use ort::operator::ComputeContext;
use ort::value::PrimitiveTensorElementType;
use rayon::prelude::*;

use super::{Attrs, Op, Plan, op_error, plan};

/// An element type of the operators: float32 or float16.
pub(crate) trait Element:
    PrimitiveTensorElementType + Copy + PartialEq + std::fmt::Debug + Send + Sync + 'static
{
    fn to_f32(self) -> f32;
    /// Rounds to nearest, ties to even (as `cvt.rn.f16.f32` on the GPU).
    fn from_f32(v: f32) -> Self;
}

impl Element for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Element for half::f16 {
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
}

/// Rows per rayon task at the least: a row is a few microseconds of work at most.
const MIN_ROWS_PER_TASK: usize = 16;

/// What [`bias_rms_norm`] does with the normed row n before it stores it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Epilogue<'a, T> {
    /// `BiasRmsNorm`: n.
    Plain,
    /// `BiasRmsNorm` with `silu = 1`: n · sigmoid(n).
    Silu,
    /// `BiasRmsNormRope`: n turned by the rotary tables `(cos, sin)`.
    Rope(&'a [T], &'a [T]),
}

/// SiLU, as the contract writes it: `n · sigmoid(n) = n / (1 + exp(−n))` (−0 for n below about
/// −88, where exp(−n) overflows to infinity).
pub(crate) fn silu(n: f32) -> f32 {
    n / (1.0 + (-n).exp())
}

/// `BiasRmsNorm` (epilogue `Plain` or `Silu`) or `BiasRmsNormRope` (`Rope`) over `plan.rows`
/// rows.
pub(crate) fn bias_rms_norm<T: Element>(
    plan: &Plan,
    epsilon: f32,
    x: &[T],
    bias: &[T],
    weight: &[T],
    epilogue: Epilogue<'_, T>,
    y: &mut [T],
) {
    let d = plan.d;
    let half_hd = plan.half_hd;
    y.par_chunks_mut(d)
        .with_min_len(MIN_ROWS_PER_TASK)
        .enumerate()
        .for_each_init(
            || vec![0f32; d],
            |v, (r, y_row)| {
                let x_row = &x[r * d..(r + 1) * d];
                let mut squares = 0f32;
                for c in 0..d {
                    v[c] = x_row[c].to_f32() + bias[c].to_f32();
                    squares += v[c] * v[c];
                }
                let inv = 1.0 / (squares / d as f32 + epsilon).sqrt();
                for c in 0..d {
                    v[c] = v[c] * inv * weight[c].to_f32();
                }
                match epilogue {
                    Epilogue::Plain => {
                        for c in 0..d {
                            y_row[c] = T::from_f32(v[c]);
                        }
                    }
                    Epilogue::Silu => {
                        for c in 0..d {
                            y_row[c] = T::from_f32(silu(v[c]));
                        }
                    }
                    Epilogue::Rope(cos, sin) => {
                        let table = (r % plan.table_rows) * half_hd;
                        for i in 0..d / 2 {
                            let j = table + i % half_hd;
                            let (c, s) = (cos[j].to_f32(), sin[j].to_f32());
                            let (u0, u1) = (v[2 * i], v[2 * i + 1]);
                            y_row[2 * i] = T::from_f32(u0 * c - u1 * s);
                            y_row[2 * i + 1] = T::from_f32(u0 * s + u1 * c);
                        }
                    }
                }
            },
        );
}

/// `GatedResidualLayerNorm` over `plan.rows` rows: `s` and `y` are its two outputs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gated_residual_layer_norm<T: Element>(
    plan: &Plan,
    epsilon: f32,
    r: &[T],
    x: &[T],
    bias: &[T],
    gate: &[T],
    scale: &[T],
    shift: &[T],
    s: &mut [T],
    y: &mut [T],
) {
    let d = plan.d;
    let [gate_div, scale_div, shift_div] = plan.divs;
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

/// One call of `op` on the CPU provider: reads the inputs, checks them against the contract,
/// allocates the outputs with X's shape and runs the kernel.
pub(super) fn compute<T: Element>(op: Op, attrs: &Attrs, ctx: &ComputeContext) -> ort::Result<()> {
    let names = op.inputs();
    let mut values = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let value = ctx
            .input(i)?
            .ok_or_else(|| op_error(op, format!("input {name} is missing")))?;
        values.push(value);
    }
    let mut inputs: Vec<(&[i64], &[T])> = Vec::with_capacity(names.len());
    for (value, name) in values.iter().zip(names) {
        let (shape, data) = value
            .try_extract_tensor::<T>()
            .map_err(|e| op_error(op, format!("input {name}: {e}")))?;
        inputs.push((shape, data));
    }
    let shapes: Vec<&[i64]> = inputs.iter().map(|(shape, _)| *shape).collect();
    let plan = plan(op, attrs, &shapes).map_err(ort::Error::new)?;
    let x_shape = shapes[op.x_index()].to_vec();
    let data: Vec<&[T]> = inputs.iter().map(|(_, data)| *data).collect();
    let output = |idx: usize| {
        ctx.output(idx, x_shape.clone())?
            .ok_or_else(|| op_error(op, format!("ONNX Runtime gave no output {idx}")))
    };
    match op {
        Op::BiasRmsNormRope | Op::BiasRmsNorm => {
            let mut y = output(0)?;
            let (_, y) = y.try_extract_tensor_mut::<T>()?;
            let epilogue = match op {
                Op::BiasRmsNormRope => Epilogue::Rope(data[3], data[4]),
                _ if attrs.silu => Epilogue::Silu,
                _ => Epilogue::Plain,
            };
            bias_rms_norm(&plan, attrs.epsilon, data[0], data[1], data[2], epilogue, y);
        }
        Op::GatedResidualLayerNorm => {
            let mut s = output(0)?;
            let mut y = output(1)?;
            let (_, s) = s.try_extract_tensor_mut::<T>()?;
            let (_, y) = y.try_extract_tensor_mut::<T>()?;
            gated_residual_layer_norm(
                &plan,
                attrs.epsilon,
                data[0],
                data[1],
                data[2],
                data[3],
                data[4],
                data[5],
                s,
                y,
            );
        }
    }
    Ok(())
}

//! What the row operators share: the element types, the checks of the contract's common inputs
//! (D-element vectors, row parameters, rotary tables), the sizes of a plain row call, and the CPU
//! pass that RMS-normalises rows with an epilogue (`BiasRmsNorm`, `BiasRmsNormRope`,
//! `PrefixBiasRmsNorm`, `QkvNormRopeCache`), with the activations it applies.
//!
//! The CPU kernels work one pass per row, rows in parallel (rayon), float32 arithmetic, each
//! output element rounded to its type once.

use rayon::prelude::*;

use super::operator::{ContractError, Element, ShapeCheck, numel};

/// Rows per rayon task at the least: a row is a few microseconds of work at most.
pub(crate) const MIN_ROWS_PER_TASK: usize = 16;

/// The sizes of a call over N rows of D (`BiasRmsNorm`, `BiasGelu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowSizes {
    /// N, the rows of X.
    pub(crate) rows: usize,
    /// D, the last axis of X.
    pub(crate) d: usize,
}

/// The rotary tables' sizes: hd / 2 and Tc, the columns and rows of cos and sin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tables {
    pub(crate) half_hd: usize,
    pub(crate) rows: usize,
}

impl ShapeCheck<'_> {
    /// Checks that input `i` has exactly D elements.
    pub(crate) fn exactly_d(&self, i: usize, d: usize) -> Result<(), ContractError> {
        let n = numel(self.shape(i));
        if n == d {
            return Ok(());
        }
        Err(self.fail(format!(
            "input {} has shape {:?} ({n} elements); it must have D = {d} elements (the last axis of X {:?})",
            self.name(i),
            self.shape(i),
            self.x
        )))
    }

    /// Checks row parameter `i` (F·D elements with F dividing the N = `rows` rows) and returns
    /// N / F: row r uses block r / that.
    pub(crate) fn row_parameter(
        &self,
        i: usize,
        d: usize,
        rows: usize,
    ) -> Result<usize, ContractError> {
        let (name, shape, x) = (self.name(i), self.shape(i), self.x);
        let n = numel(shape);
        if n == 0 || !n.is_multiple_of(d) {
            return Err(self.fail(format!(
                "row parameter {name} has shape {shape:?} ({n} elements), which is not F·D \
                 elements with F ≥ 1 and D = {d} (the last axis of X {x:?})"
            )));
        }
        let f = n / d;
        if !rows.is_multiple_of(f) {
            return Err(self.fail(format!(
                "row parameter {name} has shape {shape:?}: F = {f} rows of D = {d}, which does \
                 not divide the N = {rows} rows of X {x:?}"
            )));
        }
        Ok((rows / f).max(1))
    }

    /// Checks that D splits into `heads` heads of an even size and returns hd / 2.
    pub(crate) fn half_head(&self, d: usize, heads: usize) -> Result<usize, ContractError> {
        if heads == 0 || !d.is_multiple_of(2 * heads) {
            return Err(self.fail(format!(
                "D = {d} (from {} {:?}) is not a multiple of 2·num_heads = {}",
                self.name(self.info.x_index),
                self.x,
                2 * heads
            )));
        }
        Ok(d / heads / 2)
    }

    /// Checks the rotary tables cos (input `cos`) and sin (the input after it): Tc·hd/2
    /// elements each.
    pub(crate) fn tables(
        &self,
        cos: usize,
        d: usize,
        heads: usize,
    ) -> Result<Tables, ContractError> {
        let half_hd = self.half_head(d, heads)?;
        let n = numel(self.shape(cos));
        if n == 0 || !n.is_multiple_of(half_hd) {
            return Err(self.fail(format!(
                "input cos has shape {:?} ({n} elements), which is not Tc·hd/2 elements \
                 with Tc ≥ 1 and hd/2 = {half_hd} (D = {d}, num_heads = {heads})",
                self.shape(cos)
            )));
        }
        if numel(self.shape(cos + 1)) != n {
            return Err(self.fail(format!(
                "input sin has shape {:?} and cos {:?}; they must have the same number of elements",
                self.shape(cos + 1),
                self.shape(cos)
            )));
        }
        Ok(Tables {
            half_hd,
            rows: n / half_hd,
        })
    }
}

/// What [`norm_rows`] does with the normed row n before it stores it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Epilogue<'a, T> {
    /// `BiasRmsNorm`: n.
    Plain,
    /// `BiasRmsNorm` with `silu = 1`: n · sigmoid(n).
    Silu,
    /// `BiasRmsNormRope`: n turned by the rotary tables `(cos, sin)` of these sizes.
    Rope(&'a [T], &'a [T], Tables),
}

/// SiLU, as the contract writes it: `n · sigmoid(n) = n / (1 + exp(−n))` (−0 for n below about
/// −88, where exp(−n) overflows to infinity).
pub(crate) fn silu(n: f32) -> f32 {
    n / (1.0 + (-n).exp())
}

/// GELU's tanh form, as the contract writes it, in float32.
pub(crate) fn gelu(v: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * v * (1.0 + (SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)).tanh())
}

/// Where the rows of a [`norm_rows`] call are in its input: row i (of the call) is
/// `x[(first + i) · stride + offset ..][..D]`, and `first + i` is its row number for the rotary
/// tables.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rows {
    pub(crate) stride: usize,
    pub(crate) offset: usize,
    pub(crate) first: usize,
}

impl Rows {
    /// Rows of D, one after the other from row 0.
    pub(crate) fn packed(d: usize) -> Self {
        Self {
            stride: d,
            offset: 0,
            first: 0,
        }
    }
}

/// The RMS norm of `x + bias` times `weight` with its epilogue over the rows `rows` of `x` (rows
/// of D), one row of `y` each.
#[allow(clippy::too_many_arguments)]
pub(crate) fn norm_rows<T: Element>(
    d: usize,
    epsilon: f32,
    x: &[T],
    rows: Rows,
    bias: &[T],
    weight: &[T],
    epilogue: Epilogue<'_, T>,
    y: &mut [T],
) {
    y.par_chunks_mut(d)
        .with_min_len(MIN_ROWS_PER_TASK)
        .enumerate()
        .for_each_init(
            || vec![0f32; d],
            |v, (i, y_row)| {
                let r = rows.first + i;
                let x_row = &x[r * rows.stride + rows.offset..][..d];
                let mut squares = 0f32;
                for c in 0..d {
                    v[c] = x_row[c].to_f32() + bias[c].to_f32();
                    squares += v[c] * v[c];
                }
                let inv = 1.0 / (squares / d as f32 + epsilon).sqrt();
                for c in 0..d {
                    v[c] = v[c] * inv * weight[c].to_f32();
                }
                store(r, v, epilogue, y_row);
            },
        );
}

/// Stores normed row `r` (`v`) into `y_row` through the epilogue.
fn store<T: Element>(r: usize, v: &[f32], epilogue: Epilogue<'_, T>, y_row: &mut [T]) {
    match epilogue {
        Epilogue::Plain => {
            for (y, &v) in y_row.iter_mut().zip(v) {
                *y = T::from_f32(v);
            }
        }
        Epilogue::Silu => {
            for (y, &v) in y_row.iter_mut().zip(v) {
                *y = T::from_f32(silu(v));
            }
        }
        Epilogue::Rope(cos, sin, tables) => {
            let half_hd = tables.half_hd;
            let table = (r % tables.rows) * half_hd;
            for i in 0..v.len() / 2 {
                let j = table + i % half_hd;
                let (c, s) = (cos[j].to_f32(), sin[j].to_f32());
                let (u0, u1) = (v[2 * i], v[2 * i + 1]);
                y_row[2 * i] = T::from_f32(u0 * c - u1 * s);
                y_row[2 * i + 1] = T::from_f32(u0 * s + u1 * c);
            }
        }
    }
}

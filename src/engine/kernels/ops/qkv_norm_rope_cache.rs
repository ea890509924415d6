//! `QkvNormRopeCache(QKV, q_bias, k_bias, q_weight, k_weight, cos, sin, K, V) -> Q`, attributes
//! `epsilon` and `num_heads`: a self-attention's inputs, with its keys and values written in place
//! into the cache the attention reads.
//!
//! QKV has shape `[..., T, 3·D]` (rank ≥ 2; its column blocks are the bias-free q, k and v
//! projections of a row; X is QKV here, N = numel(QKV) / 3·D and B = N / T); q_bias, k_bias,
//! q_weight and k_weight have D elements; cos and sin are as for `BiasRmsNormRope`. K and V have
//! one shape `[..., L, D]`, L ≥ T, B·L·D elements. With BRNR the arithmetic of
//! `BiasRmsNormRope`: `Q = BRNR(QKV[..., 0:D]; q_bias, q_weight)`, shape `[..., T, D]`, and **in
//! place, into the inputs K and V**, for batch b and t < T: `K[b, L−T+t] = BRNR(QKV[b, t, D:2D];
//! k_bias, k_weight)`, `V[b, L−T+t] = QKV[b, t, 2D:3D]`; rows before L − T are left as they are.
//! A graph reads K and V only in nodes that take Q (the attention), so after this node; its
//! caller owns K and V (bound buffers) and finds the block's keys and values in their last T rows
//! after the run. No copy of the cache: the concatenation of past and new keys it replaces copied
//! the whole cache on every pass.

use rayon::prelude::*;

use super::bias_rms_norm_rope::RopeAttrs;
use crate::engine::kernels::operator::{
    ContractError, CpuIo, Element, NodeAttrs, OpInfo, ShapeCheck, UnstepOp, numel,
};
use crate::engine::kernels::row_launch::{Arg, RowArgs, RowKernel, RowOp};
use crate::engine::kernels::rows::{Epilogue, MIN_ROWS_PER_TASK, Rows, Tables, norm_rows};

/// The operator.
pub(crate) struct QkvNormRopeCache;

/// The sizes of a `QkvNormRopeCache` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QkvSizes {
    /// N, the rows of QKV.
    pub(crate) rows: usize,
    /// D, a third of QKV's last axis.
    pub(crate) d: usize,
    pub(crate) tables: Tables,
    /// T and L, the rows of one batch entry in QKV and in K / V (the op writes rows L − T .. L of
    /// each).
    pub(crate) block_rows: usize,
    pub(crate) cache_rows: usize,
}

impl UnstepOp for QkvNormRopeCache {
    const INFO: OpInfo = OpInfo {
        name: "QkvNormRopeCache",
        inputs: &[
            "QKV", "q_bias", "k_bias", "q_weight", "k_weight", "cos", "sin", "K", "V",
        ],
        outputs: &["Q"],
        x_index: 0,
        in_place: &[7, 8],
        fixed: &[],
        row_kernel: Some("qkv_norm_rope_cache"),
    };
    type Attrs = RopeAttrs;
    type Sizes = QkvSizes;
    type Cuda = RowKernel<Self>;

    fn attrs(node: &NodeAttrs<'_, '_>) -> ort::Result<RopeAttrs> {
        RopeAttrs::read(node)
    }

    fn check(attrs: &RopeAttrs, shapes: &ShapeCheck<'_>) -> Result<QkvSizes, ContractError> {
        let (x, last, rows) = (shapes.x, shapes.last, shapes.rows);
        // QKV holds three rows of D side by side.
        if !last.is_multiple_of(3) || x.len() < 2 {
            return Err(shapes.fail(format!(
                "QKV has shape {x:?}; it must be [..., T, 3·D] (rank 2 or more, the last axis a \
                 multiple of 3)"
            )));
        }
        let d = last / 3;
        for i in 1..=4 {
            shapes.exactly_d(i, d)?;
        }
        let tables = shapes.tables(5, d, attrs.num_heads)?;
        let t = x[x.len() - 2].max(0) as usize;
        let (k, v) = (shapes.shape(7), shapes.shape(8));
        let cache_rows = match k {
            [.., l, last] if *last as usize == d && *l >= 0 && (*l as usize) >= t => *l as usize,
            _ => 0,
        };
        let batch = rows.checked_div(t).unwrap_or(0);
        if t == 0 || cache_rows == 0 || numel(k) != batch * cache_rows * d {
            return Err(shapes.fail(format!(
                "input K has shape {k:?}; with QKV {x:?} it must be [..., L, {d}] with \
                 L ≥ T = {t} and {batch}·L·{d} elements (the block's rows are written into \
                 its last T rows)"
            )));
        }
        if v != k {
            return Err(shapes.fail(format!(
                "input V has shape {v:?} and K {k:?}; they must be equal"
            )));
        }
        Ok(QkvSizes {
            rows,
            d,
            tables,
            block_rows: t,
            cache_rows,
        })
    }

    /// Q has QKV's shape with D on the last axis.
    fn output_shape(shapes: &[&[i64]], _: usize) -> Vec<i64> {
        let mut shape = shapes[0].to_vec();
        if let Some(last) = shape.last_mut() {
            *last /= 3;
        }
        shape
    }

    /// Needs QKV's last axis known.
    fn inference_shapes<'a>(
        x: &'a [i64],
        _: impl Fn(usize) -> Option<&'a [i64]>,
    ) -> Option<Vec<&'a [i64]>> {
        x.last()
            .is_some_and(|&n| n > 0)
            .then(|| vec![x; Self::INFO.inputs.len()])
    }

    fn is_empty(sizes: &QkvSizes) -> bool {
        sizes.rows == 0
    }

    fn cpu<T: Element>(attrs: &RopeAttrs, sizes: &QkvSizes, io: CpuIo<'_, T>) {
        let [qkv, q_bias, k_bias, q_weight, k_weight, cos, sin, _, _] = io.inputs[..] else {
            unreachable!("nine inputs")
        };
        let [k, v] = io.written.try_into().expect("K and V are written in place");
        let [q] = io.outputs.try_into().expect("one output");
        qkv_norm_rope_cache(
            sizes,
            attrs.epsilon,
            qkv,
            [q_bias, k_bias, q_weight, k_weight],
            (cos, sin),
            q,
            k,
            v,
        );
    }
}

impl RowOp for QkvNormRopeCache {
    /// Q, K and V are three launches' worth of rows in one.
    const GRID_Y: u32 = 3;

    fn args(attrs: &RopeAttrs, sizes: &QkvSizes) -> RowArgs {
        RowArgs {
            rows: sizes.rows,
            d: sizes.d,
            epsilon: attrs.epsilon,
            launch_rows: sizes.rows,
            extra: vec![
                Arg::Int(sizes.tables.half_hd as i32),
                Arg::Long(sizes.tables.rows as i64),
                Arg::Long(sizes.block_rows as i64),
                Arg::Long(sizes.cache_rows as i64),
            ],
        }
    }
}

/// The CPU kernel over `sizes.rows` rows of `qkv`: Q into `q`, the keys and values into the last
/// `sizes.block_rows` rows of each batch entry of `k` and `v` (`sizes.cache_rows` rows each).
#[allow(clippy::too_many_arguments)]
pub(crate) fn qkv_norm_rope_cache<T: Element>(
    sizes: &QkvSizes,
    epsilon: f32,
    qkv: &[T],
    [q_bias, k_bias, q_weight, k_weight]: [&[T]; 4],
    (cos, sin): (&[T], &[T]),
    q: &mut [T],
    k: &mut [T],
    v: &mut [T],
) {
    let d = sizes.d;
    let (t, l) = (sizes.block_rows, sizes.cache_rows);
    let rope = Epilogue::Rope(cos, sin, sizes.tables);
    let rows = |offset, first| Rows {
        stride: 3 * d,
        offset,
        first,
    };
    norm_rows(d, epsilon, qkv, rows(0, 0), q_bias, q_weight, rope, q);
    let block = (l - t) * d..l * d;
    for (b, (k, v)) in k.chunks_mut(l * d).zip(v.chunks_mut(l * d)).enumerate() {
        let (k, v) = (&mut k[block.clone()], &mut v[block.clone()]);
        norm_rows(d, epsilon, qkv, rows(d, b * t), k_bias, k_weight, rope, k);
        v.par_chunks_mut(d)
            .with_min_len(MIN_ROWS_PER_TASK)
            .enumerate()
            .for_each(|(i, v_row)| {
                v_row.copy_from_slice(&qkv[(b * t + i) * 3 * d + 2 * d..][..d]);
            });
    }
}

#[cfg(test)]
pub(crate) mod tests;

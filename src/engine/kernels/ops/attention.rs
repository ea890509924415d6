//! `Attention(Q, K, V) -> O`, attribute `num_heads`: a self-attention without mask.
//!
//! Q has shape `[..., S, D]` (rank ≥ 2, X is Q here), K and V one shape `[..., L, D]` with Q's
//! leading axes and L ≥ 1; D = num_heads · hd with hd even. Row s of batch b and head h (columns
//! h·hd to (h + 1)·hd): with scores `z_l = Q[b, s, h]·K[b, l, h] / sqrt(hd)`,
//! `O[b, s, h] = Σ_l e^(z_l − max z) V[b, l, h] / Σ_l e^(z_l − max z)`; O has Q's shape. The CPU
//! kernel works in float32 and rounds once. The CUDA kernel is cuDNN's fused flash attention in
//! float16 (float32 and a head size past 256 or not a multiple of 8 are errors there), and runs a
//! partial last wave of thread blocks over runs of the keys that it then merges
//! ([`AttentionKernel`]). The exporter writes it for `dit_fused`'s self-attention, in place of
//! ONNX Runtime's `MultiHeadAttention`, so that the runner decides how a block's rows meet the
//! GPU's waves.

use rayon::prelude::*;

use cudarc::driver::sys::CUstream;
use ort::value::TensorElementType;

pub(crate) use crate::engine::kernels::attention::AttentionSizes;
use crate::engine::kernels::attention::{AttentionError, AttentionKernel};
use crate::engine::kernels::operator::{
    ContractError, CpuIo, CudaKernel, Element, NodeAttrs, OpInfo, ShapeCheck, UnstepOp,
};
use crate::engine::kernels::rows::MIN_ROWS_PER_TASK;

/// The operator.
pub(crate) struct Attention;

/// The attribute of `Attention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeadsAttrs {
    pub(crate) num_heads: usize,
}

impl UnstepOp for Attention {
    const INFO: OpInfo = OpInfo {
        name: "Attention",
        inputs: &["Q", "K", "V"],
        outputs: &["O"],
        x_index: 0,
        in_place: &[],
        fixed: &[],
        row_kernel: None,
    };
    type Attrs = HeadsAttrs;
    type Sizes = AttentionSizes;
    type Cuda = AttentionKernel;

    fn attrs(node: &NodeAttrs<'_, '_>) -> ort::Result<HeadsAttrs> {
        Ok(HeadsAttrs {
            num_heads: node.num_heads()?,
        })
    }

    fn check(attrs: &HeadsAttrs, shapes: &ShapeCheck<'_>) -> Result<AttentionSizes, ContractError> {
        let (d, x) = (shapes.last, shapes.x);
        let half_hd = shapes.half_head(d, attrs.num_heads)?;
        let (k, v) = (shapes.shape(1), shapes.shape(2));
        let rank = x.len();
        let fits = rank >= 2
            && k.len() == rank
            && k[..rank - 2] == x[..rank - 2]
            && k[rank - 1] as usize == d
            && k[rank - 2] > 0;
        if !fits {
            return Err(shapes.fail(format!(
                "input K has shape {k:?}; with Q {x:?} it must be [..., L, {d}] with L ≥ 1 \
                 and Q's leading axes (Q must have rank 2 or more)"
            )));
        }
        if v != k {
            return Err(shapes.fail(format!(
                "input V has shape {v:?} and K {k:?}; they must be equal"
            )));
        }
        Ok(AttentionSizes {
            rows: shapes.rows,
            d,
            half_hd,
            block_rows: x[rank - 2].max(0) as usize,
            cache_rows: k[rank - 2] as usize,
        })
    }

    fn is_empty(sizes: &AttentionSizes) -> bool {
        sizes.rows == 0
    }

    fn cpu<T: Element>(_: &HeadsAttrs, sizes: &AttentionSizes, io: CpuIo<'_, T>) {
        let [q, k, v] = io.inputs[..] else {
            unreachable!("three inputs")
        };
        let [o] = io.outputs.try_into().expect("one output");
        attention(sizes, q, k, v, o);
    }
}

/// The CPU kernel: for each row of Q (batch b = r / S) and head h, the scores
/// `Q_h · K_h[l] / sqrt(hd)` over the L keys of batch b, their softmax (the largest score
/// subtracted before exp) and the weighted sum of `V_h[l]`, in float32, each element rounded once.
pub(crate) fn attention<T: Element>(
    sizes: &AttentionSizes,
    q: &[T],
    k: &[T],
    v: &[T],
    o: &mut [T],
) {
    let (d, s, l) = (sizes.d, sizes.block_rows, sizes.cache_rows);
    let hd = 2 * sizes.half_hd;
    let scale = 1.0 / (hd as f32).sqrt();
    o.par_chunks_mut(d)
        .with_min_len(MIN_ROWS_PER_TASK)
        .enumerate()
        .for_each_init(
            || (vec![0f32; l], vec![0f32; hd]),
            |(scores, acc), (r, o_row)| {
                let q_row = &q[r * d..][..d];
                let keys = &k[(r / s) * l * d..][..l * d];
                let values = &v[(r / s) * l * d..][..l * d];
                for h in 0..d / hd {
                    let qh = &q_row[h * hd..][..hd];
                    let mut max = f32::NEG_INFINITY;
                    for (j, score) in scores.iter_mut().enumerate() {
                        let kh = &keys[j * d + h * hd..][..hd];
                        let dot: f32 = qh
                            .iter()
                            .zip(kh)
                            .map(|(a, b)| a.to_f32() * b.to_f32())
                            .sum();
                        *score = dot * scale;
                        max = max.max(*score);
                    }
                    let mut total = 0f32;
                    acc.fill(0.0);
                    for (j, score) in scores.iter().enumerate() {
                        let p = (score - max).exp();
                        total += p;
                        let vh = &values[j * d + h * hd..][..hd];
                        for (a, x) in acc.iter_mut().zip(vh) {
                            *a += p * x.to_f32();
                        }
                    }
                    for (out, a) in o_row[h * hd..][..hd].iter_mut().zip(acc.iter()) {
                        *out = T::from_f32(a / total);
                    }
                }
            },
        );
}

impl CudaKernel<Attention> for AttentionKernel {
    type Error = AttentionError;

    fn new(ty: TensorElementType, ordinal: i32) -> Result<Self, AttentionError> {
        AttentionKernel::new(ty, ordinal)
    }

    fn launch(
        &mut self,
        _: &HeadsAttrs,
        sizes: &AttentionSizes,
        pointers: &[u64],
        stream: CUstream,
    ) -> Result<(), AttentionError> {
        self.launch_attention(sizes, pointers, stream)
    }
}

#[cfg(test)]
pub(crate) mod tests;

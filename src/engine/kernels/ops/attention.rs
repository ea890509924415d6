//! `Attention(Q, K, V) -> O`, attribute `num_heads`: a self-attention without mask.
//!
//! Q has shape `[..., S, D]` (rank ≥ 2, X is Q here), K and V one shape `[..., L, D]` with Q's
//! leading axes and L ≥ 1; D = num_heads · hd with hd even. Row s of batch b and head h (columns
//! h·hd to (h + 1)·hd): with scores `z_l = Q[b, s, h]·K[b, l, h] / sqrt(hd)`,
//! `O[b, s, h] = Σ_l e^(z_l − max z) V[b, l, h] / Σ_l e^(z_l − max z)`; O has Q's shape. The CPU
//! kernel works in float32 and rounds once.
//!
//! **The 8-bit mode** (`method.attention_precision = "int8"`, the process's
//! [`KernelSettings`](super::super::KernelSettings)): per batch entry, K less its mean over every
//! 8th key (`μ`: subtracting one vector from every key leaves each row's softmax as it is) is
//! quantised to int8 with one scale per 64 keys of a head, Q to int8 with one scale per 16 rows of
//! a head (a scale is max |x| / 127, a code `round_ties_even(x · 127 / max)`), and V to float8
//! E4M3 with one scale per channel (max |V| / 448, codes rounded to nearest even, saturated).
//! Over tiles of 128 keys, in order: scores `s = Σ q_i k_i` in exact integers, times
//! `scale_q · scale_k · log2(e) / sqrt(hd)`; the running row maximum m; weights
//! `p = 2^(score − m) · 448` rounded to E4M3, the earlier sum and accumulators scaled by
//! `2^(m_old − m)`; `acc += p̃ · Ṽ` and `l += p` (before rounding) in float32;
//! `O = acc · scale_v / l`. [`attention_int8`] computes exactly this; the CUDA kernel
//! (`attention8.cu`) the same up to its `exp2` approximation and the order of its sums.
//!
//! The CUDA kernel is cuDNN's fused flash attention in
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
use crate::engine::kernels::ops::matmul_fp8::{e4m3, e4m3_value};
use crate::engine::kernels::rows::MIN_ROWS_PER_TASK;
use crate::vocab::AttentionPrecision;

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
        match crate::engine::kernels::settings().attention_precision {
            AttentionPrecision::Fp16 => attention(sizes, q, k, v, o),
            AttentionPrecision::Int8 => attention_int8(sizes, q, k, v, o),
        }
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

/// Rows of Q per scale, keys per scale, keys per tile, and the stride of the keys K's mean is
/// taken over, in the 8-bit mode (attention8.cu's).
const Q_GROUP: usize = 16;
const K_GROUP: usize = 64;
const KEY_TILE: usize = 128;
const KMEAN_STRIDE: usize = 8;
/// The largest int8 code, and the largest E4M3 value (P's scale and V's).
const I8_MAX: f32 = 127.0;
const E4M3_MAX: f32 = 448.0;

/// `x` in int8 codes with one scale for all of it: `(codes, max |x| / 127)`.
fn quantise_i8(x: &[f32]) -> (Vec<i8>, f32) {
    let a = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let inv = if a > 0.0 { I8_MAX / a } else { 0.0 };
    let codes = x
        .iter()
        .map(|v| (v * inv).round_ties_even().clamp(-I8_MAX, I8_MAX) as i8)
        .collect();
    (codes, a / I8_MAX)
}

/// One batch entry's K, V (L rows of D) quantised as the 8-bit mode does: per head, K's codes
/// `[h][l][hd]` and their scales `[h][l / 64]`; V's E4M3 codes `[l][D]` and scales `[D]`.
struct KeysValues8 {
    k: Vec<i8>,
    k_scales: Vec<f32>,
    v: Vec<u8>,
    v_scales: Vec<f32>,
}

fn quantise_keys_values<T: Element>(k: &[T], v: &[T], l: usize, d: usize, hd: usize) -> KeysValues8 {
    let sampled = l.div_ceil(KMEAN_STRIDE);
    let mut mean = vec![0f32; d];
    for row in k.chunks(d).step_by(KMEAN_STRIDE) {
        for (m, x) in mean.iter_mut().zip(row) {
            *m += x.to_f32();
        }
    }
    mean.iter_mut().for_each(|m| *m /= sampled as f32);
    let groups = l.div_ceil(K_GROUP);
    let (mut kq, mut k_scales) = (vec![0i8; d / hd * l * hd], Vec::new());
    for h in 0..d / hd {
        for g in 0..groups {
            let rows = g * K_GROUP..((g + 1) * K_GROUP).min(l);
            let x: Vec<f32> = rows
                .clone()
                .flat_map(|r| (0..hd).map(move |c| (r, c)))
                .map(|(r, c)| k[r * d + h * hd + c].to_f32() - mean[h * hd + c])
                .collect();
            let (codes, scale) = quantise_i8(&x);
            let start = (h * l + rows.start) * hd;
            kq[start..start + codes.len()].copy_from_slice(&codes);
            k_scales.push(scale);
        }
    }
    let mut v_max = vec![0f32; d];
    for row in v.chunks(d) {
        for (m, x) in v_max.iter_mut().zip(row) {
            *m = m.max(x.to_f32().abs());
        }
    }
    let v_scales: Vec<f32> = v_max.iter().map(|m| m / E4M3_MAX).collect();
    let inv: Vec<f32> = v_scales
        .iter()
        .map(|&s| if s > 0.0 { 1.0 / s } else { 0.0 })
        .collect();
    let vq = v
        .iter()
        .enumerate()
        .map(|(i, x)| e4m3(x.to_f32() * inv[i % d]))
        .collect();
    KeysValues8 {
        k: kq,
        k_scales,
        v: vq,
        v_scales,
    }
}

/// The CPU kernel of the 8-bit mode (the module's doc says what it computes), for any even head
/// size; Q's 16-row groups and K's 64-key groups start at each batch entry's first row.
pub(crate) fn attention_int8<T: Element>(
    sizes: &AttentionSizes,
    q: &[T],
    k: &[T],
    v: &[T],
    o: &mut [T],
) {
    let (d, s, l) = (sizes.d, sizes.block_rows, sizes.cache_rows);
    let hd = 2 * sizes.half_hd;
    let heads = d / hd;
    let qk_log2 = std::f32::consts::LOG2_E / (hd as f32).sqrt();
    let log2_p = E4M3_MAX.log2();
    let batches = sizes.rows / s;
    let kv: Vec<KeysValues8> = (0..batches)
        .into_par_iter()
        .map(|b| {
            let range = b * l * d..(b + 1) * l * d;
            quantise_keys_values(&k[range.clone()], &v[range], l, d, hd)
        })
        .collect();
    // Q's codes and scales, per batch entry, head and group of 16 rows: [row][D] and
    // [b][h][row / 16].
    let q_groups = s.div_ceil(Q_GROUP);
    let mut qq = vec![0i8; q.len()];
    let mut q_scales = vec![0f32; batches * heads * q_groups];
    for b in 0..batches {
        for h in 0..heads {
            for g in 0..q_groups {
                let rows = b * s + g * Q_GROUP..b * s + ((g + 1) * Q_GROUP).min(s);
                let x: Vec<f32> = rows
                    .clone()
                    .flat_map(|r| (0..hd).map(move |c| q[r * d + h * hd + c].to_f32()))
                    .collect();
                let (codes, scale) = quantise_i8(&x);
                for (i, r) in rows.enumerate() {
                    qq[r * d + h * hd..][..hd].copy_from_slice(&codes[i * hd..][..hd]);
                }
                q_scales[(b * heads + h) * q_groups + g] = scale;
            }
        }
    }
    o.par_chunks_mut(d)
        .with_min_len(MIN_ROWS_PER_TASK)
        .enumerate()
        .for_each_init(
            || (vec![0f32; hd], Vec::with_capacity(KEY_TILE)),
            |(acc, scores), (r, o_row)| {
                let (b, row) = (r / s, r % s);
                let kv = &kv[b];
                for h in 0..heads {
                    let qh = &qq[r * d + h * hd..][..hd];
                    let qs = q_scales[(b * heads + h) * q_groups + row / Q_GROUP] * qk_log2;
                    let keys = &kv.k[h * l * hd..][..l * hd];
                    let k_scales = &kv.k_scales[h * l.div_ceil(K_GROUP)..];
                    let (mut m, mut total) = (f32::NEG_INFINITY, 0f32);
                    acc.fill(0.0);
                    for tile in (0..l).step_by(KEY_TILE) {
                        let end = (tile + KEY_TILE).min(l);
                        scores.clear();
                        scores.extend((tile..end).map(|j| {
                                let dot: i32 = qh
                                    .iter()
                                    .zip(&keys[j * hd..][..hd])
                                    .map(|(&a, &b)| a as i32 * b as i32)
                                    .sum();
                            dot as f32 * (k_scales[j / K_GROUP] * qs)
                        }));
                        let m_new = scores.iter().fold(m, |a, &x| a.max(x));
                        let alpha = (m - m_new).exp2();
                        m = m_new;
                        total *= alpha;
                        acc.iter_mut().for_each(|a| *a *= alpha);
                        for (j, &score) in (tile..end).zip(scores.iter()) {
                            let p = (score - m + log2_p).exp2();
                            total += p;
                            let p = e4m3_value(e4m3(p));
                            let vrow = &kv.v[j * d + h * hd..][..hd];
                            for (a, &code) in acc.iter_mut().zip(vrow) {
                                *a += p * e4m3_value(code);
                            }
                        }
                    }
                    let inv = 1.0 / total;
                    for (c, (out, a)) in o_row[h * hd..][..hd].iter_mut().zip(acc.iter()).enumerate() {
                        *out = T::from_f32(a * kv.v_scales[h * hd + c] * inv);
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

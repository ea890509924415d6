//! `Attention` against the float64 reference; its contract's errors; the split of its CUDA
//! kernel's last wave; what its CUDA kernel refuses.

use half::f16;
use ort::value::TensorElementType;

use super::*;
use crate::engine::kernels::attention::{
    MAX_PARTS, Split, WaveShaping, describe_shapings, split,
};
use crate::engine::kernels::test_support::*;
use crate::engine::onnx_graph::Attr;

pub(crate) struct AttentionCase<T> {
    pub(crate) q_shape: Vec<i64>,
    pub(crate) kv_shape: Vec<i64>,
    pub(crate) heads: usize,
    pub(crate) q: Vec<T>,
    pub(crate) k: Vec<T>,
    pub(crate) v: Vec<T>,
}

impl<T: Element> AttentionCase<T> {
    /// Q `[B, S, D]` in [-3, 3] (scores of a few units: a peaked softmax), K and V `[B, L, D]` in
    /// [-1, 1].
    pub(crate) fn new(rng: &mut Rng, [b, s, l, d]: [usize; 4], heads: usize) -> Self {
        let (b, s, l, d) = (b as i64, s as i64, l as i64, d as i64);
        let kv = shape_numel(&[b, l, d]);
        Self {
            q_shape: vec![b, s, d],
            kv_shape: vec![b, l, d],
            heads,
            q: rng.vec(shape_numel(&[b, s, d]), -3.0, 3.0),
            k: rng.vec(kv, -1.0, 1.0),
            v: rng.vec(kv, -1.0, 1.0),
        }
    }

    /// Per row and head, `softmax(Q_h·K_hᵀ / sqrt(hd)) V_h` in float64.
    pub(crate) fn reference(&self) -> Vec<f64> {
        let (s, l, d) = (
            self.q_shape[1] as usize,
            self.kv_shape[1] as usize,
            *self.q_shape.last().unwrap() as usize,
        );
        let hd = d / self.heads;
        let (q, k, v) = (wide(&self.q), wide(&self.k), wide(&self.v));
        let mut o = vec![0f64; q.len()];
        for (r, o_row) in o.chunks_mut(d).enumerate() {
            let base = r / s * l * d;
            for h in 0..self.heads {
                let scores: Vec<f64> = (0..l)
                    .map(|j| {
                        (0..hd)
                            .map(|c| q[r * d + h * hd + c] * k[base + j * d + h * hd + c])
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for c in 0..hd {
                    o_row[h * hd + c] = (0..l)
                        .map(|j| weights[j] * v[base + j * d + h * hd + c])
                        .sum::<f64>()
                        / total;
                }
            }
        }
        o
    }

    pub(crate) fn cpu(&self) -> Vec<T> {
        let plan = self.plan();
        let mut o = vec![T::from_f32(0.0); self.q.len()];
        attention(&plan, &self.q, &self.k, &self.v, &mut o);
        o
    }
}

impl<T: Element> OpCase<T> for AttentionCase<T> {
    type Op = Attention;

    fn attrs(&self) -> HeadsAttrs {
        HeadsAttrs {
            num_heads: self.heads,
        }
    }

    fn shapes(&self) -> Vec<Vec<i64>> {
        vec![
            self.q_shape.clone(),
            self.kv_shape.clone(),
            self.kv_shape.clone(),
        ]
    }

    fn inputs(&self) -> Vec<&[T]> {
        vec![&self.q, &self.k, &self.v]
    }

    fn written(&self) -> usize {
        self.q.len()
    }
}

/// ([B, S, L, D], num_heads): a batch of 2 with more keys than rows, one row and one key, fewer
/// keys than rows, the tiny model's self-attention (3 frames of 28 tokens after 2 blocks, 2 heads
/// of 32), one head of 128.
pub(crate) const ATTENTION_CASES: [([usize; 4], usize); 5] = [
    ([2, 5, 7, 8], 2),
    ([1, 1, 1, 4], 1),
    ([1, 9, 3, 12], 3),
    ([1, 84, 252, 64], 2),
    ([1, 6, 40, 128], 1),
];

pub(crate) fn check_attention_cpu<T: Tolerance>() {
    let mut rng = Rng(12);
    for (sizes, heads) in ATTENTION_CASES {
        let case = AttentionCase::<T>::new(&mut rng, sizes, heads);
        let what = format!(
            "{} Attention {sizes:?} heads {heads}",
            std::any::type_name::<T>()
        );
        let plan = case.plan();
        assert_eq!(
            (
                plan.rows,
                plan.block_rows,
                plan.cache_rows,
                2 * plan.half_hd
            ),
            (sizes[0] * sizes[1], sizes[1], sizes[2], sizes[3] / heads),
            "{what}"
        );
        assert_close(&case.cpu(), &case.reference(), &what);
    }
}

#[test]
fn attention_matches_the_reference() {
    check_attention_cpu::<f32>();
    check_attention_cpu::<f16>();
}

/// The split of a call's rows (attention.rs) on an H200 (132 SMs, two thread blocks of 64 rows
/// each per SM: 264 per wave).
#[test]
fn the_attention_splits_only_a_partial_last_wave() {
    let sm90 = WaveShaping::of(9, 0, 132);
    let h200 = |rows, keys, max_parts| split(1, rows, keys, 12, sm90, max_parts);
    let whole = |rows| Split {
        main_rows: rows,
        parts: 1,
    };
    // wan-1.3b: 4,680 rows × 12 heads = 888 blocks, 3.36 waves: 4,224 rows (792 blocks, three
    // waves), then 456 rows (96 blocks) over eight runs of the keys (768 blocks, three waves of
    // an eighth: 0.375 of a wave), or over two (192 blocks, one wave of a half).
    for keys in [4680, 9360, 18720] {
        for (max_parts, parts) in [(MAX_PARTS, 8), (4, 2), (2, 2)] {
            assert_eq!(
                h200(4680, keys, max_parts),
                Split {
                    main_rows: 4224,
                    parts
                },
                "{keys} keys, at most {max_parts} runs"
            );
        }
    }
    // Whole waves (22 tiles × 12 heads = one wave), less than a wave, another GPU, a batch.
    assert_eq!(h200(22 * 64, 4680, MAX_PARTS), whole(22 * 64));
    assert_eq!(h200(1000, 4680, MAX_PARTS), whole(1000));
    assert_eq!(
        split(1, 4680, 18720, 12, WaveShaping::of(10, 0, 132), MAX_PARTS),
        whole(4680)
    );
    assert_eq!(split(2, 4680, 18720, 12, sm90, MAX_PARTS), whole(4680));
    // A last wave of one tile per head: the most runs that divide the keys; none when no run of
    // keys would be a tile long.
    let rows = 22 * 64 + 10;
    let tail = |parts| Split {
        main_rows: 22 * 64,
        parts,
    };
    assert_eq!(h200(rows, 4680, MAX_PARTS), tail(8));
    assert_eq!(h200(rows, 4683, MAX_PARTS), tail(7));
    assert_eq!(h200(rows, 4681, MAX_PARTS), whole(rows));
    assert_eq!(h200(rows, 100, MAX_PARTS), whole(rows));
    // A tail of 168 blocks (64 % of a wave): three runs take two waves of a third (0.67); six
    // do as well, and the fewer runs win.
    assert_eq!(h200(22 * 64 + 14 * 64, 4680, MAX_PARTS), tail(3));
    // A tail of 240 blocks (91 %): no number of runs takes less than a whole wave.
    assert_eq!(
        h200(22 * 64 + 20 * 64, 4680, MAX_PARTS),
        whole(22 * 64 + 20 * 64)
    );
}

/// The wave shaping by compute capability and SM count: sm_90 splits over waves of its own SM
/// count (an H100 PCIe's 114 SMs give waves of 228 blocks, not an H200's 264); Blackwell
/// (sm_100, sm_103, sm_120), Ampere and a device reporting no SMs run every call whole; and the
/// records name what was used.
#[test]
fn the_wave_shaping_is_chosen_by_architecture_and_sm_count() {
    let whole = |rows| Split {
        main_rows: rows,
        parts: 1,
    };
    // wan-1.3b's 888 blocks on 114 SMs: three waves of 228 (684 blocks, 57 tiles per head:
    // 3,648 rows), then 1,032 rows (204 blocks, 89 % of a wave): p runs of the keys take
    // ⌈204 p / 228⌉ = p waves of 1/p, a whole wave for every p, so one call. 4,224 rows (the
    // H200's three waves, 792 blocks) are three waves there and 108 blocks (47 %): over two runs,
    // 216 blocks in one wave of a half.
    let h100_pcie = WaveShaping::of(9, 0, 114);
    assert_eq!(h100_pcie, WaveShaping::Sm90 { sms: 114 });
    assert_eq!(
        split(1, 4680, 18720, 12, h100_pcie, MAX_PARTS),
        whole(4680)
    );
    assert_eq!(
        split(1, 4224, 18720, 12, h100_pcie, MAX_PARTS),
        Split {
            main_rows: 3648,
            parts: 2
        }
    );
    assert_eq!(
        split(1, 4680, 18720, 12, WaveShaping::of(9, 0, 132), MAX_PARTS),
        Split {
            main_rows: 4224,
            parts: 8
        }
    );
    for (major, minor, sms) in [(10, 0, 148), (10, 3, 148), (12, 0, 84), (8, 0, 108)] {
        let shaping = WaveShaping::of(major, minor, sms);
        assert_eq!(
            shaping,
            WaveShaping::Neutral {
                major,
                minor,
                sms: sms as usize
            }
        );
        for rows in [4680, 4224, 22 * 64 + 10] {
            assert_eq!(
                split(1, rows, 18720, 12, shaping, MAX_PARTS),
                whole(rows),
                "sm_{major}{minor}, {rows} rows"
            );
        }
    }
    for sms in [0, -1] {
        let shaping = WaveShaping::of(9, 0, sms);
        assert_eq!(shaping, WaveShaping::Sm90 { sms: 0 });
        assert_eq!(split(1, 4680, 18720, 12, shaping, MAX_PARTS), whole(4680));
    }

    assert_eq!(describe_shapings(&[]), None);
    assert_eq!(
        describe_shapings(&[WaveShaping::of(9, 0, 132)]).as_deref(),
        Some(
            "last wave split over the keys (tuned for sm_90: 64-row tiles, 2 blocks per SM, \
             132 SMs)"
        )
    );
    assert_eq!(
        describe_shapings(&[WaveShaping::of(10, 0, 148), WaveShaping::of(9, 0, 114)]).as_deref(),
        Some(
            "one call per attention (sm_100, 148 SMs: the wave shaping is tuned for sm_90 \
             alone); last wave split over the keys (tuned for sm_90: 64-row tiles, 2 blocks per \
             SM, 114 SMs)"
        )
    );
}

/// Attention's CUDA kernel refuses float32 before loading anything (cuDNN's flash attention has
/// no float32 kernel), and without cuDNN or the CUDA driver (CI) says what is missing and what to
/// do; with them it is a kernel.
#[test]
fn the_attention_kernel_says_what_it_cannot_do() {
    let e = AttentionKernel::new(TensorElementType::Float32, 0)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("ai.unstep Attention: element type Float32 is not supported on CUDA")
            && e.contains("fp16")
            && e.contains("`--dit-kernels onnxruntime`"),
        "{e}"
    );
    if let Err(e) = crate::engine::kernels::cudnn::check_cudnn() {
        let e = e.to_string();
        assert!(
            e.contains("could not load cuDNN (libcudnn.so.9)")
                && e.contains("9.13.1")
                && e.contains("`--dit-kernels onnxruntime`"),
            "{e}"
        );
    }
    if let Err(e) = AttentionKernel::new(TensorElementType::Float16, 0) {
        let e = e.to_string();
        assert!(
            e.contains("could not load") && e.contains("`--dit-kernels onnxruntime`"),
            "{e}"
        );
    }
}

#[test]
fn contract_violations_name_the_operator_the_input_and_the_shapes() {
    let heads = |num_heads| HeadsAttrs { num_heads };
    // Attention: heads that do not split D in even halves, K with other leading axes or width
    // than Q, V unlike K.
    let e = plan_error::<Attention>(heads(3), &[&[1, 4, 8], &[1, 6, 8], &[1, 6, 8]]);
    assert!(
        e.contains("ai.unstep Attention") && e.contains("D = 8 (from Q [1, 4, 8])"),
        "{e}"
    );
    for k in [&[2, 6, 8][..], &[1, 6, 16], &[6, 8], &[1, 0, 8]] {
        let e = plan_error::<Attention>(heads(2), &[&[1, 4, 8], k, k]);
        assert!(
            e.contains(&format!("input K has shape {k:?}; with Q [1, 4, 8]")),
            "{e}"
        );
    }
    let e = plan_error::<Attention>(heads(2), &[&[1, 4, 8], &[1, 6, 8], &[1, 5, 8]]);
    assert!(
        e.contains("input V has shape [1, 5, 8] and K [1, 6, 8]"),
        "{e}"
    );
}

/// `Attention` through ONNX Runtime (CPU provider), on a case drawn from `rng`: the output
/// shapes ONNX Runtime infers and the float64 reference (one part of
/// `every_operator_runs_through_onnx_runtime`).
pub(crate) fn check_through_onnx_runtime<T: Tolerance>(rng: &mut Rng) {
    let t = std::any::type_name::<T>();
    // Attention: O has Q's shape.
    let case = AttentionCase::<T>::new(rng, [2, 5, 7, 8], 2);
    let mut s = session::<T>(&Attention::INFO, &[Attr::Int("num_heads", 2)]).unwrap();
    let out = run(&mut s, &Attention::INFO, &case.shapes(), &case.inputs()).unwrap();
    assert_eq!(out[0].0, case.q_shape);
    assert_close(&out[0].1, &case.reference(), &format!("{t} Attention O"));
}

impl<T: Element> AttentionCase<T> {
    /// The 8-bit mode's CPU kernel on this case.
    pub(crate) fn cpu_int8(&self) -> Vec<T> {
        let plan = self.plan();
        let mut o = vec![T::from_f32(0.0); self.q.len()];
        attention_int8(&plan, &self.q, &self.k, &self.v, &mut o);
        o
    }
}

/// ‖a − b‖ / ‖b‖.
fn relative_l2(a: &[f64], b: &[f64]) -> f64 {
    let diff: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let norm: f64 = b.iter().map(|y| y * y).sum();
    (diff / norm).sqrt()
}

/// The 8-bit mode computes the attention to within its quantisation (int8 scores, E4M3 weights
/// and values: a few percent of the output's norm on random data, where the output is an
/// average of uncorrelated values), and does quantise (its result is not the float one), on
/// shapes whose rows and keys are no whole number of its 16-row, 64-key and 128-key groups.
#[test]
fn the_8bit_mode_matches_the_reference_within_its_quantisation() {
    let mut rng = Rng(48);
    for (shape, heads) in [
        ([1, 37, 300, 256], 2),
        ([2, 16, 128, 128], 1),
        ([1, 5, 1, 64], 2),
        ([1, 130, 1000, 128], 1),
    ] {
        let case = AttentionCase::<f32>::new(&mut rng, shape, heads);
        let want = case.reference();
        let error = relative_l2(&wide(&case.cpu_int8()), &want);
        assert!(error < 0.05, "{shape:?}: relative error {error}");
        let exact = relative_l2(&wide(&case.cpu()), &want);
        assert!(
            error > 10.0 * exact,
            "{shape:?}: 8-bit {error} against float {exact}: nothing was quantised"
        );
    }
}

/// The keys less their mean: one vector added to every key (a channel bias, as trained
/// projections have) leaves the 8-bit mode's result within its rounding, where int8 codes of the
/// keys as they are would spend their range on the bias.
#[test]
fn the_8bit_mode_is_indifferent_to_a_bias_common_to_the_keys() {
    let mut rng = Rng(49);
    let case = AttentionCase::<f32>::new(&mut rng, [1, 48, 512, 128], 1);
    let mut biased = AttentionCase::<f32>::new(&mut Rng(49), [1, 48, 512, 128], 1);
    let bias: Vec<f32> = rng.vec(128, -40.0, 40.0);
    for (i, k) in biased.k.iter_mut().enumerate() {
        *k += bias[i % 128];
    }
    // The float attention of the biased keys is the same function of Q.
    let exact = relative_l2(&biased.reference(), &case.reference());
    assert!(exact < 1e-5, "{exact}");
    let plain = wide(&case.cpu_int8());
    let shifted = wide(&biased.cpu_int8());
    let change = relative_l2(&shifted, &plain);
    let error = relative_l2(&plain, &case.reference());
    assert!(
        change < error,
        "a bias of the keys moved the result by {change}, more than its quantisation error {error}"
    );
}

/// Scores that put all of a row's weight on one key give that key's value, to E4M3's precision
/// (one weight of 448 rounds exactly; V's code is within 2⁻⁴ of it).
#[test]
fn the_8bit_mode_follows_a_peaked_softmax() {
    let (l, d) = (200, 128);
    let mut rng = Rng(50);
    let mut case = AttentionCase::<f32>::new(&mut rng, [1, 1, l, d], 1);
    let hot = 137;
    case.q = case.k[hot * d..(hot + 1) * d].iter().map(|x| x * 400.0).collect();
    let out = case.cpu_int8();
    for (c, (got, want)) in out.iter().zip(&case.v[hot * d..(hot + 1) * d]).enumerate() {
        assert!((got - want).abs() <= 1.0 / 16.0 + 1e-3, "channel {c}");
    }
}

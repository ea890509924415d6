//! `CausalConv3d` against the float64 reference; its contract's errors; the engine choice of its
//! CUDA kernel (kept choices, timing order).

use half::f16;

use super::*;
use crate::engine::kernels::conv::*;
use crate::engine::kernels::test_support::*;

/// One CausalConv3d case: X `[N, T, H, W, C]` in [-1, 1], W `[K, kT, kH, kW, C]` in
/// [-0.5, 0.5].
pub(crate) struct ConvCase<T> {
    pub(crate) x_shape: Vec<i64>,
    pub(crate) w_shape: Vec<i64>,
    pub(crate) x: Vec<T>,
    pub(crate) w: Vec<T>,
}

impl<T: Element> ConvCase<T> {
    pub(crate) fn new(rng: &mut Rng, x_shape: [usize; 5], [k, kt, kh, kw]: [usize; 4]) -> Self {
        let w_shape = [k, kt, kh, kw, x_shape[4]];
        Self {
            x: rng.vec(x_shape.iter().product(), -1.0, 1.0),
            w: rng.vec(w_shape.iter().product(), -0.5, 0.5),
            x_shape: x_shape.iter().map(|&v| v as i64).collect(),
            w_shape: w_shape.iter().map(|&v| v as i64).collect(),
        }
    }

    /// `[N, T − kT + 1, H, W, K]`.
    pub(crate) fn y_shape(&self) -> Vec<i64> {
        let (x, w) = (&self.x_shape, &self.w_shape);
        vec![x[0], x[1] - w[1] + 1, x[2], x[3], w[0]]
    }

    /// The contract's sum in float64: taps outside the frame in space read zeros, time is not
    /// padded.
    pub(crate) fn reference(&self) -> Vec<f64> {
        let [n, t, h, w, c] = [0, 1, 2, 3, 4].map(|i| self.x_shape[i]);
        let [k, kt, kh, kw] = [0, 1, 2, 3].map(|i| self.w_shape[i]);
        let (x, wt) = (wide(&self.x), wide(&self.w));
        let mut y = Vec::new();
        for b in 0..n {
            for ot in 0..t - kt + 1 {
                for i in 0..h {
                    for j in 0..w {
                        for o in 0..k {
                            let mut sum = 0f64;
                            for a in 0..kt {
                                for di in 0..kh {
                                    for dj in 0..kw {
                                        let (ii, jj) = (i + di - kh / 2, j + dj - kw / 2);
                                        if ii < 0 || ii >= h || jj < 0 || jj >= w {
                                            continue;
                                        }
                                        for ch in 0..c {
                                            let xi =
                                                (((b * t + ot + a) * h + ii) * w + jj) * c + ch;
                                            let wi = (((o * kt + a) * kh + di) * kw + dj) * c + ch;
                                            sum += x[xi as usize] * wt[wi as usize];
                                        }
                                    }
                                }
                            }
                            y.push(sum);
                        }
                    }
                }
            }
        }
        y
    }

    pub(crate) fn cpu(&self) -> Vec<T> {
        let plan = self.plan();
        let mut y = vec![T::from_f32(f32::NAN); plan.rows() * plan.k];
        causal_conv3d(&plan, &self.x, &self.w, &mut y);
        y
    }
}

impl<T: Element> OpCase<T> for ConvCase<T> {
    type Op = CausalConv3d;

    fn attrs(&self) {}

    fn shapes(&self) -> Vec<Vec<i64>> {
        vec![self.x_shape.clone(), self.w_shape.clone()]
    }

    fn inputs(&self) -> Vec<&[T]> {
        vec![&self.x, &self.w]
    }

    fn written(&self) -> usize {
        shape_numel(&self.y_shape())
    }
}

/// (X `[N, T, H, W, C]`, `[K, kT, kH, kW]`): a 3x3x3 convolution with the cache's two frames in
/// front, a 1x1x1 shortcut over a batch of 2, the first frame's single tap, a time convolution,
/// a kernel wider than the frame (most taps padded), the tiny model's full-resolution stage.
pub(crate) const CONV_CASES: [([usize; 5], [usize; 4]); 6] = [
    ([1, 4, 5, 6, 8], [8, 3, 3, 3]),
    ([2, 3, 4, 3, 5], [7, 1, 1, 1]),
    ([1, 1, 3, 7, 4], [6, 1, 3, 3]),
    ([1, 3, 2, 5, 3], [4, 3, 1, 1]),
    ([1, 2, 1, 2, 2], [3, 1, 3, 5]),
    ([1, 6, 16, 28, 8], [8, 3, 3, 3]),
];

pub(crate) fn check_conv_cpu<T: Tolerance>() {
    let mut rng = Rng(15);
    for (x_shape, kernel) in CONV_CASES {
        let case = ConvCase::<T>::new(&mut rng, x_shape, kernel);
        let what = format!(
            "{} CausalConv3d X {x_shape:?} kernel {kernel:?}",
            std::any::type_name::<T>()
        );
        let plan = case.plan();
        let out_t = x_shape[1] - kernel[1] + 1;
        assert_eq!(
            (plan.rows(), plan.c, plan.k, plan.out_t()),
            (
                x_shape[0] * out_t * x_shape[2] * x_shape[3],
                x_shape[4],
                kernel[0],
                out_t
            ),
            "{what}"
        );
        assert_close(&case.cpu(), &case.reference(), &what);
    }
}

#[test]
fn causal_conv3d_matches_the_reference() {
    check_conv_cpu::<f32>();
    check_conv_cpu::<f16>();
}

#[test]
fn causal_conv3d_refuses_shapes_outside_the_contract() {
    for (x, w) in [
        // W's C is not X's.
        (&[1, 4, 5, 6, 8][..], &[8, 3, 3, 3, 4][..]),
        // An even kernel in space.
        (&[1, 4, 5, 6, 8], &[8, 3, 2, 3, 8]),
        // More taps in time than frames.
        (&[1, 2, 5, 6, 8], &[8, 3, 3, 3, 8]),
        // Rank 4.
        (&[4, 5, 6, 8], &[8, 3, 3, 8]),
    ] {
        let e = plan_error::<CausalConv3d>((), &[x, w]);
        assert!(e.contains("ai.unstep CausalConv3d"), "{e}");
        assert!(
            e.contains(&format!("input X has shape {x:?} and W {w:?}")),
            "{e}"
        );
        assert!(e.contains("[N, T, H, W, C] (channels last)"), "{e}");
    }
}

/// A kept engine choice (conv.rs) reads back as written, anything else as none; its file is named
/// by the GPU kind, the type and every size, so no two shapes share one.
#[test]
fn causal_conv3d_choices_round_trip_and_name_their_shape() {
    assert_eq!(parse_choice(&format_choice(7, 62)), Some((7, 62)));
    for bad in [
        "",
        "plan 7",
        "plan x engine 62",
        "engine 62 plan 7",
        "plan 7 engine 62 more",
        "plan -1 engine 62",
    ] {
        assert_eq!(parse_choice(bad), None, "{bad:?}");
    }
    let dims = ConvDims {
        n: 1,
        t: 6,
        h: 480,
        w: 832,
        c: 96,
        k: 96,
        kt: 3,
        kh: 3,
        kw: 3,
    };
    let dir = std::path::Path::new("cache/cudnn_conv");
    let kind = "sm90-132sms-cudnn91900";
    let file = choice_file(dir, kind, &dims, true);
    assert_eq!(
        file,
        dir.join("sm90-132sms-cudnn91900-f16-x1x6x480x832x96-w96x3x3x3.txt")
    );
    assert_ne!(file, choice_file(dir, kind, &dims, false));
    assert_ne!(
        file,
        choice_file(dir, "sm80-108sms-cudnn91900", &dims, true)
    );
    let wider = ConvDims { k: 128, ..dims };
    assert_ne!(file, choice_file(dir, kind, &wider, true));
}

/// A kept choice is taken only where the heuristics still offer the same engine at its place; a
/// missing or garbled file is no choice; keeping one makes its directory and leaves no temporary.
#[test]
fn causal_conv3d_takes_a_kept_choice_only_for_the_same_engine() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cudnn_conv").join("choice.txt");
    assert_eq!(kept_choice(&file, &[62, 62, 58]), None);
    keep_choice(&file, 1, 62).unwrap();
    assert_eq!(kept_choice(&file, &[62, 62, 58]), Some(1));
    assert_eq!(kept_choice(&file, &[62, 58, 62]), None);
    assert_eq!(kept_choice(&file, &[62]), None);
    let names: Vec<_> = std::fs::read_dir(file.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["choice.txt"]);
    std::fs::write(&file, "plan one engine 62\n").unwrap();
    assert_eq!(kept_choice(&file, &[62, 62]), None);
}

/// The engine search (conv.rs) times every plan once cold, times again only those within the
/// cut of the best so far, and picks the least time; a plan that fails is never picked.
#[test]
fn causal_conv3d_times_again_only_plans_near_the_best_and_picks_the_fastest() {
    // (cold, mean) per plan, in ms; None: the plan fails.
    let plans = [
        Some((10.0, 5.0)),
        Some((30.0, 29.0)), // cold beyond 4 × 5: cut
        Some((6.0, 3.0)),
        None,
        Some((12.0, 11.0)), // within 4 × 3 = 12: timed again
        Some((12.5, 2.0)),  // beyond: cut, although its mean would have been the best
    ];
    let mut calls = Vec::new();
    let times = time_in_order(plans.len(), |i, runs| {
        calls.push((i, runs));
        plans[i].map(|(cold, mean)| if runs == 1 { cold } else { mean })
    });
    assert_eq!(
        times,
        [
            Some(5.0),
            Some(30.0),
            Some(3.0),
            None,
            Some(11.0),
            Some(12.5)
        ]
    );
    let reps = |i: usize| calls.iter().filter(|&&(p, r)| p == i && r > 1).count();
    assert_eq!((0..6).map(reps).collect::<Vec<_>>(), [1, 0, 1, 0, 1, 0]);
    assert_eq!(fastest(&times), Some(2));
    assert_eq!(fastest(&[None, Some(2.0), Some(2.0)]), Some(1));
    assert_eq!(fastest(&[None, None]), None);
}

/// `CausalConv3d` through ONNX Runtime (CPU provider), on a case drawn from `rng`: the output
/// shapes ONNX Runtime infers and the float64 reference (one part of
/// `every_operator_runs_through_onnx_runtime`).
pub(crate) fn check_through_onnx_runtime<T: Tolerance>(rng: &mut Rng) {
    let t = std::any::type_name::<T>();
    // CausalConv3d: Y has T − kT + 1 frames and K channels.
    let (x_shape, kernel) = CONV_CASES[0];
    let case = ConvCase::<T>::new(rng, x_shape, kernel);
    let mut s = session::<T>(&CausalConv3d::INFO, &[]).unwrap();
    let out = run(&mut s, &CausalConv3d::INFO, &case.shapes(), &case.inputs()).unwrap();
    assert_eq!(out[0].0, case.y_shape());
    assert_close(&out[0].1, &case.reference(), &format!("{t} CausalConv3d Y"));
}

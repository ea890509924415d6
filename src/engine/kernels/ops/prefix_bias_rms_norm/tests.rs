//! `PrefixBiasRmsNorm` against the float64 reference; its contract's errors.

use half::f16;

use super::*;
use crate::engine::kernels::ops::bias_rms_norm::tests::RmsCase;
use crate::engine::kernels::test_support::*;
use crate::engine::onnx_graph::Attr;

/// `PrefixBiasRmsNorm`: an `RmsCase` for X and a prefix of X's shape with `p` on axis 1.
pub(crate) struct PrefixCase<T> {
    pub(crate) rms: RmsCase<T>,
    pub(crate) prefix_shape: Vec<i64>,
    pub(crate) prefix: Vec<T>,
}

impl<T: Element> PrefixCase<T> {
    pub(crate) fn new(rng: &mut Rng, x_shape: &[i64], p: i64, silu: bool) -> Self {
        let mut prefix_shape = x_shape.to_vec();
        prefix_shape[1] = p;
        Self {
            rms: RmsCase::new(rng, x_shape, silu),
            prefix: rng.vec(shape_numel(&prefix_shape), -3.0, 3.0),
            prefix_shape,
        }
    }

    /// Y's shape: X's with P + T on axis 1.
    pub(crate) fn y_shape(&self) -> Vec<i64> {
        let mut shape = self.rms.x_shape.clone();
        shape[1] += self.prefix_shape[1];
        shape
    }

    /// The CPU kernel's output, through the operator's compute path's pieces: the prefix, then
    /// `bias_rms_norm` of X.
    pub(crate) fn cpu(&self) -> Vec<T> {
        [self.prefix.clone(), self.rms.cpu()].concat()
    }

    /// Checks tail: Y's last prefix-sized rows, exactly.
    #[track_caller]
    pub(crate) fn assert_tail(&self, y: &[T], tail: &[T], what: &str) {
        assert!(
            tail == &y[y.len() - self.prefix.len()..],
            "{what}: tail is not Y's last {} elements",
            self.prefix.len()
        );
    }

    /// Checks Y: the prefix exactly, then X's rows against the float64 reference.
    #[track_caller]
    pub(crate) fn assert_matches(&self, y: &[T], what: &str)
    where
        T: Tolerance,
    {
        assert_eq!(
            y.len(),
            self.prefix.len() + self.rms.x.len(),
            "{what}: Y's size"
        );
        let (prefix, rest) = y.split_at(self.prefix.len());
        assert!(
            prefix == &self.prefix[..],
            "{what}: the prefix rows are not a copy of prefix"
        );
        assert_close(rest, &self.rms.reference(), &format!("{what}: X's rows"));
    }
}

impl<T: Element> OpCase<T> for PrefixCase<T> {
    type Op = PrefixBiasRmsNorm;

    fn attrs(&self) -> NormAttrs {
        self.rms.attrs()
    }

    fn shapes(&self) -> Vec<Vec<i64>> {
        let mut shapes = self.rms.shapes();
        shapes.push(self.prefix_shape.clone());
        shapes
    }

    fn inputs(&self) -> Vec<&[T]> {
        let mut inputs = self.rms.inputs();
        inputs.push(&self.prefix);
        inputs
    }

    fn written(&self) -> usize {
        // Y, and the tail copied from it (read and written).
        self.prefix.len() + self.rms.x.len() + 2 * self.prefix.len()
    }
}

/// (X, P): prefixes of 0, 1 and 2 entries on axis 1, rank 2 to 5 (the VAE's channels-last
/// frames `[1, T, h, w, C]` with a two-frame cache).
pub(crate) const PREFIX_CASES: [(&[i64], i64); 5] = [
    (&[1, 7, 64], 2),
    (&[1, 3, 5, 16], 0),
    (&[1, 4, 3, 5, 96], 2),
    (&[1, 1, 2, 3, 32], 2),
    (&[1, 5], 1),
];

pub(crate) fn check_prefix_cpu<T: Tolerance>() {
    let mut rng = Rng(12);
    let t = std::any::type_name::<T>();
    for silu in [false, true] {
        for (x_shape, p) in PREFIX_CASES {
            let case = PrefixCase::<T>::new(&mut rng, x_shape, p, silu);
            let plan = case.plan();
            assert_eq!(
                (plan.x.rows, plan.prefix_rows, plan.output_rows()),
                (
                    case.rms.x.len() / plan.x.d,
                    case.prefix.len() / plan.x.d,
                    (case.prefix.len() + case.rms.x.len()) / plan.x.d
                )
            );
            let shapes = case.shapes();
            let shapes: Vec<&[i64]> = shapes.iter().map(Vec::as_slice).collect();
            let output_shape = PrefixBiasRmsNorm::output_shape;
            assert_eq!(output_shape(&shapes, 0), case.y_shape());
            assert_eq!(output_shape(&shapes, 1), case.prefix_shape);
            case.assert_matches(
                &case.cpu(),
                &format!("{t} PrefixBiasRmsNorm {x_shape:?} P = {p} silu = {silu}"),
            );
        }
    }
}

#[test]
fn prefix_bias_rms_norm_copies_the_prefix_and_norms_the_rows_after_it() {
    check_prefix_cpu::<f32>();
    check_prefix_cpu::<f16>();
}

#[test]
fn contract_violations_name_the_operator_the_input_and_the_shapes() {
    let plain = NormAttrs {
        epsilon: 1e-6,
        silu: false,
    };
    // A prefix of another shape than X's off axis 1, and an X with a batch axis.
    for (x, prefix) in [
        (&[1, 4, 3, 8][..], &[1, 2, 5, 8][..]),
        (&[1, 4, 8], &[1, 2, 3, 8]),
        (&[2, 4, 8], &[2, 2, 8]),
        (&[8][..], &[8][..]),
    ] {
        let e = plan_error::<PrefixBiasRmsNorm>(plain, &[x, &[8], &[8], prefix]);
        assert!(
            e.contains(&format!(
                "ai.unstep PrefixBiasRmsNorm: input prefix has shape {prefix:?} and X {x:?}"
            )) && e.contains("axis 0 of size 1"),
            "{e}"
        );
    }
}

/// `PrefixBiasRmsNorm` through ONNX Runtime (CPU provider), on a case drawn from `rng`: the output
/// shapes ONNX Runtime infers and the float64 reference (one part of
/// `every_operator_runs_through_onnx_runtime`).
pub(crate) fn check_through_onnx_runtime<T: Tolerance>(rng: &mut Rng) {
    let t = std::any::type_name::<T>();
    // PrefixBiasRmsNorm: Y's axis 1 is the prefix's plus X's.
    for (x_shape, p) in [(&[1, 4, 3, 5, 96][..], 2), (&[1, 7, 64], 0)] {
        let case = PrefixCase::<T>::new(rng, x_shape, p, true);
        let attrs = [Attr::Float("epsilon", case.rms.eps), Attr::Int("silu", 1)];
        let mut s = session::<T>(&PrefixBiasRmsNorm::INFO, &attrs).unwrap();
        let out = run(
            &mut s,
            &PrefixBiasRmsNorm::INFO,
            &case.shapes(),
            &case.inputs(),
        )
        .unwrap();
        assert_eq!(
            (&out[0].0, &out[1].0),
            (&case.y_shape(), &case.prefix_shape)
        );
        case.assert_tail(
            &out[0].1,
            &out[1].1,
            &format!("{t} PrefixBiasRmsNorm {x_shape:?}"),
        );
        case.assert_matches(
            &out[0].1,
            &format!("{t} PrefixBiasRmsNorm {x_shape:?} P = {p}"),
        );
    }
}

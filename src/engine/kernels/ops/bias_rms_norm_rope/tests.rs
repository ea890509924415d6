//! `BiasRmsNormRope` against the float64 reference; its contract's errors.

use half::f16;

use super::*;
use crate::engine::kernels::test_support::*;
use crate::engine::onnx_graph::Attr;

pub(crate) struct RopeCase<T> {
    pub(crate) x_shape: Vec<i64>,
    pub(crate) table_shape: Vec<i64>,
    pub(crate) heads: usize,
    pub(crate) eps: f32,
    pub(crate) x: Vec<T>,
    pub(crate) bias: Vec<T>,
    pub(crate) weight: Vec<T>,
    pub(crate) cos: Vec<T>,
    pub(crate) sin: Vec<T>,
}

impl<T: Element> RopeCase<T> {
    pub(crate) fn new(rng: &mut Rng, x_shape: &[i64], heads: usize, tc: usize) -> Self {
        let d = *x_shape.last().unwrap() as usize;
        let half = d / heads / 2;
        let (cos, sin) = rope_tables::<T>(tc, half);
        Self {
            x_shape: x_shape.to_vec(),
            table_shape: vec![1, tc as i64, 1, half as i64],
            heads,
            eps: 1e-6,
            x: rng.vec(shape_numel(x_shape), -2.0, 2.0),
            bias: rng.vec(d, -0.5, 0.5),
            weight: rng.vec(d, 0.5, 1.5),
            cos,
            sin,
        }
    }

    /// Y from the CPU kernel.
    pub(crate) fn cpu(&self) -> Vec<T> {
        let mut y = vec![T::from_f32(0.0); self.x.len()];
        let i = self.inputs();
        bias_rms_norm_rope(&self.plan(), self.eps, i[0], i[1], i[2], (i[3], i[4]), &mut y);
        y
    }

    pub(crate) fn reference(&self) -> Vec<f64> {
        let d = *self.x_shape.last().unwrap() as usize;
        let u = reference_rms_norm(
            &wide(&self.x),
            &wide(&self.bias),
            &wide(&self.weight),
            d,
            self.eps as f64,
        );
        reference_rope(&u, &wide(&self.cos), &wide(&self.sin), d, self.heads)
    }
}

impl<T: Element> OpCase<T> for RopeCase<T> {
    type Op = BiasRmsNormRope;

    fn attrs(&self) -> RopeAttrs {
        RopeAttrs {
            epsilon: self.eps,
            num_heads: self.heads,
        }
    }

    fn shapes(&self) -> Vec<Vec<i64>> {
        let d = *self.x_shape.last().unwrap();
        vec![
            self.x_shape.clone(),
            vec![d],
            vec![d],
            self.table_shape.clone(),
            self.table_shape.clone(),
        ]
    }

    fn inputs(&self) -> Vec<&[T]> {
        vec![&self.x, &self.bias, &self.weight, &self.cos, &self.sin]
    }

    fn written(&self) -> usize {
        self.x.len()
    }
}

/// (X shape, num_heads, Tc): Tc = the rows, Tc dividing the rows (a batch of 2), Tc = 1.
pub(crate) const ROPE_CASES: [(&[i64], usize, usize); 4] = [
    (&[1, 6, 64], 4, 6),
    (&[2, 5, 64], 2, 5),
    (&[3, 32], 1, 1),
    (&[1, 4, 1, 48], 3, 4),
];

pub(crate) fn check_rope_cpu<T: Tolerance>() {
    let mut rng = Rng(1);
    // The test shapes, and wan-1.3b's (N = 4680 tokens, D = 1536, 12 heads).
    for (x_shape, heads, tc) in ROPE_CASES
        .into_iter()
        .chain([(&[1, 4680, 1536][..], 12, 4680)])
    {
        let case = RopeCase::<T>::new(&mut rng, x_shape, heads, tc);
        assert_eq!(case.plan().tables.rows, tc);
        assert_close(&case.cpu(), &case.reference(), &format!("Y of {x_shape:?}"));
    }
}

#[test]
fn bias_rms_norm_rope_matches_the_reference() {
    check_rope_cpu::<f32>();
    check_rope_cpu::<f16>();
}

#[test]
fn a_missing_attribute_fails_the_session() {
    let Err(e) = session::<f32>(&BiasRmsNormRope::INFO, &[Attr::Float("epsilon", 1e-6)]) else {
        panic!("a BiasRmsNormRope node without num_heads was accepted");
    };
    let e = e.to_string();
    assert!(
        e.contains("ai.unstep BiasRmsNormRope") && e.contains("num_heads"),
        "{e}"
    );
}

#[test]
fn contract_violations_name_the_operator_the_input_and_the_shapes() {
    // Rope: D not a multiple of 2·num_heads, and tables of the wrong size.
    let rope = RopeAttrs {
        epsilon: 1e-6,
        num_heads: 3,
    };
    let e = plan_error::<BiasRmsNormRope>(rope, &[&[2, 16], &[16], &[16], &[2, 2], &[2, 2]]);
    assert!(
        e.contains("BiasRmsNormRope: D = 16") && e.contains("2·num_heads = 6"),
        "{e}"
    );
    let rope = RopeAttrs {
        epsilon: 1e-6,
        num_heads: 2,
    };
    let e = plan_error::<BiasRmsNormRope>(rope, &[&[2, 16], &[16], &[16], &[2, 3], &[2, 3]]);
    assert!(
        e.contains("input cos has shape [2, 3] (6 elements)") && e.contains("hd/2 = 4"),
        "{e}"
    );
    let e = plan_error::<BiasRmsNormRope>(rope, &[&[2, 16], &[16], &[16], &[2, 4], &[1, 4]]);
    assert!(
        e.contains("input sin has shape [1, 4] and cos [2, 4]"),
        "{e}"
    );
}

/// `BiasRmsNormRope` through ONNX Runtime (CPU provider), on a case drawn from `rng`: the output
/// shapes ONNX Runtime infers and the float64 reference (one part of
/// `every_operator_runs_through_onnx_runtime`).
pub(crate) fn check_through_onnx_runtime<T: Tolerance>(rng: &mut Rng) {
    let t = std::any::type_name::<T>();
    let (x_shape, heads, tc) = ROPE_CASES[1];
    let case = RopeCase::<T>::new(rng, x_shape, heads, tc);
    let attrs = [
        Attr::Float("epsilon", case.eps),
        Attr::Int("num_heads", heads as i64),
    ];
    let mut s = session::<T>(&BiasRmsNormRope::INFO, &attrs).unwrap();
    let out = run(
        &mut s,
        &BiasRmsNormRope::INFO,
        &case.shapes(),
        &case.inputs(),
    )
    .unwrap();
    assert_eq!(out[0].0, x_shape);
    assert_close(
        &out[0].1,
        &case.reference(),
        &format!("{t} BiasRmsNormRope Y"),
    );
}

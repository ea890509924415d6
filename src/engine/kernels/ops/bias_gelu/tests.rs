//! `BiasGelu` against the float64 reference.

use half::f16;

use super::*;
use crate::engine::kernels::test_support::*;

/// One BiasGelu case: X, bias and the reference.
pub(crate) struct GeluCase<T> {
    pub(crate) x_shape: Vec<i64>,
    pub(crate) x: Vec<T>,
    pub(crate) bias: Vec<T>,
}

impl<T: Element> GeluCase<T> {
    /// X over [-6, 6] (both tails of tanh), bias in [-1, 1].
    pub(crate) fn new(rng: &mut Rng, x_shape: &[i64]) -> Self {
        let d = *x_shape.last().unwrap() as usize;
        Self {
            x_shape: x_shape.to_vec(),
            x: rng.vec(shape_numel(x_shape), -6.0, 6.0),
            bias: rng.vec(d, -1.0, 1.0),
        }
    }

    /// `reference_gelu(X + bias)` in float64.
    pub(crate) fn reference(&self) -> Vec<f64> {
        let d = self.bias.len();
        let bias = wide(&self.bias);
        wide(&self.x)
            .iter()
            .enumerate()
            .map(|(i, &x)| reference_gelu(x + bias[i % d]))
            .collect()
    }

    pub(crate) fn cpu(&self) -> Vec<T> {
        let plan = self.plan();
        let mut y = vec![T::from_f32(0.0); self.x.len()];
        bias_gelu(&plan, &self.x, &self.bias, &mut y);
        y
    }
}

impl<T: Element> OpCase<T> for GeluCase<T> {
    type Op = BiasGelu;

    fn attrs(&self) {}

    fn shapes(&self) -> Vec<Vec<i64>> {
        vec![self.x_shape.clone(), vec![*self.x_shape.last().unwrap()]]
    }

    fn inputs(&self) -> Vec<&[T]> {
        vec![&self.x, &self.bias]
    }

    fn written(&self) -> usize {
        self.x.len()
    }
}

pub(crate) const GELU_SHAPES: [&[i64]; 4] = [&[2, 3, 16], &[5, 7], &[1, 4, 8960], &[3, 1, 100]];

pub(crate) fn check_gelu_cpu<T: Tolerance>() {
    let mut rng = Rng(9);
    for shape in GELU_SHAPES {
        let case = GeluCase::<T>::new(&mut rng, shape);
        let what = format!("{} BiasGelu {shape:?}", std::any::type_name::<T>());
        assert_close(&case.cpu(), &case.reference(), &what);
    }
}

#[test]
fn bias_gelu_matches_the_reference() {
    check_gelu_cpu::<f32>();
    check_gelu_cpu::<f16>();
}

/// `BiasGelu` through ONNX Runtime (CPU provider), on a case drawn from `rng`: the output
/// shapes ONNX Runtime infers and the float64 reference (one part of
/// `every_operator_runs_through_onnx_runtime`).
pub(crate) fn check_through_onnx_runtime<T: Tolerance>(rng: &mut Rng) {
    let t = std::any::type_name::<T>();
    // BiasGelu has no attributes.
    let case = GeluCase::<T>::new(rng, GELU_SHAPES[0]);
    let mut s = session::<T>(&BiasGelu::INFO, &[]).unwrap();
    let out = run(&mut s, &BiasGelu::INFO, &case.shapes(), &case.inputs()).unwrap();
    assert_eq!(out[0].0, GELU_SHAPES[0]);
    assert_close(&out[0].1, &case.reference(), &format!("{t} BiasGelu Y"));
}

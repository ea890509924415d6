//! `MatMulBiasGelu` against the float64 reference; its contract's errors; what its CUDA kernel
//! refuses.

use half::f16;
use ort::value::TensorElementType;

use super::*;
use crate::engine::kernels::operator::CudaKernel;
use crate::engine::kernels::test_support::*;

/// One MatMulBiasGelu case: X [..., K], W [N, K], bias [N] and the reference.
pub(crate) struct MatMulGeluCase<T> {
    pub(crate) x_shape: Vec<i64>,
    pub(crate) n: usize,
    pub(crate) x: Vec<T>,
    pub(crate) w: Vec<T>,
    pub(crate) bias: Vec<T>,
}

impl<T: Element> MatMulGeluCase<T> {
    /// X in [-2, 2], W in ±sqrt(3/K) (products of a few units: both tails of the GELU), bias in
    /// [-1, 1].
    pub(crate) fn new(rng: &mut Rng, x_shape: &[i64], n: usize) -> Self {
        let k = *x_shape.last().unwrap() as usize;
        let w_max = (3.0 / k as f32).sqrt();
        Self {
            x_shape: x_shape.to_vec(),
            n,
            x: rng.vec(shape_numel(x_shape), -2.0, 2.0),
            w: rng.vec(n * k, -w_max, w_max),
            bias: rng.vec(n, -1.0, 1.0),
        }
    }

    pub(crate) fn k(&self) -> usize {
        *self.x_shape.last().unwrap() as usize
    }

    /// `GELU(Σ_k X[r, k]·W[n, k] + bias[n])` in float64.
    pub(crate) fn reference(&self) -> Vec<f64> {
        let (k, n) = (self.k(), self.n);
        let (x, w, bias) = (wide(&self.x), wide(&self.w), wide(&self.bias));
        let mut y = Vec::with_capacity(x.len() / k * n);
        for x_row in x.chunks(k) {
            for (c, w_row) in w.chunks(k).enumerate() {
                let v = x_row.iter().zip(w_row).map(|(a, b)| a * b).sum::<f64>() + bias[c];
                y.push(reference_gelu(v));
            }
        }
        y
    }

    pub(crate) fn y_shape(&self) -> Vec<i64> {
        let mut shape = self.x_shape.clone();
        *shape.last_mut().unwrap() = self.n as i64;
        shape
    }

    pub(crate) fn cpu(&self) -> Vec<T> {
        let plan = self.plan();
        let mut y = vec![T::from_f32(0.0); plan.rows * self.n];
        matmul_bias_gelu(&plan, &self.x, &self.w, &self.bias, &mut y);
        y
    }
}

impl<T: Element> OpCase<T> for MatMulGeluCase<T> {
    type Op = MatMulBiasGelu;

    fn attrs(&self) {}

    fn shapes(&self) -> Vec<Vec<i64>> {
        vec![
            self.x_shape.clone(),
            vec![self.n as i64, self.k() as i64],
            vec![self.n as i64],
        ]
    }

    fn inputs(&self) -> Vec<&[T]> {
        vec![&self.x, &self.w, &self.bias]
    }

    fn written(&self) -> usize {
        self.x.len() / self.k() * self.n
    }
}

/// (X shape, N): a batch axis, one row, K and N not multiples of anything, the tiny model's FFN
/// (3 frames of 28 tokens, 64 → 128), and a long sum (K = 1536, wan-1.3b's).
pub(crate) const MATMUL_GELU_CASES: [(&[i64], usize); 5] = [
    (&[2, 3, 16], 24),
    (&[1, 7], 5),
    (&[5, 13], 9),
    (&[1, 84, 64], 128),
    (&[3, 1536], 40),
];

pub(crate) fn check_matmul_gelu_cpu<T: Tolerance>() {
    let mut rng = Rng(10);
    for (shape, n) in MATMUL_GELU_CASES {
        let case = MatMulGeluCase::<T>::new(&mut rng, shape, n);
        let what = format!(
            "{} MatMulBiasGelu {shape:?} N = {n}",
            std::any::type_name::<T>()
        );
        let plan = case.plan();
        assert_eq!((plan.d, plan.cols), (case.k(), n), "{what}");
        assert_close(&case.cpu(), &case.reference(), &what);
    }
}

#[test]
fn matmul_bias_gelu_matches_the_reference() {
    check_matmul_gelu_cpu::<f32>();
    check_matmul_gelu_cpu::<f16>();
}

/// MatMulBiasGelu's CUDA kernel refuses another element type before loading anything, and
/// without cuBLASLt or the CUDA driver (this machine, CI) says what is missing and what to do;
/// with both it is a kernel.
#[test]
fn the_matmul_kernel_says_what_it_cannot_do() {
    let e = <GemmKernel as CudaKernel<MatMulBiasGelu>>::new(TensorElementType::Int8, 0)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("ai.unstep MatMulBiasGelu: element type Int8 is not supported"),
        "{e}"
    );
    if let Err(e) = <GemmKernel as CudaKernel<MatMulBiasGelu>>::new(TensorElementType::Float16, 0) {
        let e = e.to_string();
        assert!(
            e.contains("could not load") && e.contains("`--dit-kernels onnxruntime`"),
            "{e}"
        );
    }
}

#[test]
fn contract_violations_name_the_operator_the_input_and_the_shapes() {
    // MatMulBiasGelu: W of another K, or not a matrix; bias not of N elements.
    for w in [&[24, 8][..], &[24, 16, 1], &[0, 16]] {
        let e = plan_error::<MatMulBiasGelu>((), &[&[2, 3, 16], w, &[24]]);
        assert!(
            e.contains(&format!(
                "ai.unstep MatMulBiasGelu: input W has shape {w:?}; with X [2, 3, 16] it must be [N, 16]"
            )),
            "{e}"
        );
    }
    let e = plan_error::<MatMulBiasGelu>((), &[&[2, 3, 16], &[24, 16], &[16]]);
    assert!(
        e.contains("input bias has shape [16]; it must have N = 24 elements"),
        "{e}"
    );
}

/// `MatMulBiasGelu` through ONNX Runtime (CPU provider), on a case drawn from `rng`: the output
/// shapes ONNX Runtime infers and the float64 reference (one part of
/// `every_operator_runs_through_onnx_runtime`).
pub(crate) fn check_through_onnx_runtime<T: Tolerance>(rng: &mut Rng) {
    let t = std::any::type_name::<T>();
    // MatMulBiasGelu: Y has N on its last axis (from W's axis 0).
    let (shape, n) = MATMUL_GELU_CASES[0];
    let case = MatMulGeluCase::<T>::new(rng, shape, n);
    let mut s = session::<T>(&MatMulBiasGelu::INFO, &[]).unwrap();
    let out = run(
        &mut s,
        &MatMulBiasGelu::INFO,
        &case.shapes(),
        &case.inputs(),
    )
    .unwrap();
    assert_eq!(out[0].0, case.y_shape());
    assert_close(
        &out[0].1,
        &case.reference(),
        &format!("{t} MatMulBiasGelu Y"),
    );
}

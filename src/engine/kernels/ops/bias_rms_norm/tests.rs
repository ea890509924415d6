//! `BiasRmsNorm` against the float64 reference, with and without its SiLU; its contract's errors.

use half::f16;

use super::*;
use crate::engine::kernels::operator::check;
use crate::engine::kernels::test_support::*;
use crate::engine::onnx_graph::Attr;

/// One BiasRmsNorm case: inputs, attributes and the reference output.
pub(crate) struct RmsCase<T> {
    pub(crate) x_shape: Vec<i64>,
    pub(crate) eps: f32,
    pub(crate) silu: bool,
    pub(crate) x: Vec<T>,
    pub(crate) bias: Vec<T>,
    pub(crate) weight: Vec<T>,
}

impl<T: Element> RmsCase<T> {
    /// With `silu`, weights of both signs and up to 4, so that n reaches both tails of the
    /// sigmoid.
    pub(crate) fn new(rng: &mut Rng, x_shape: &[i64], silu: bool) -> Self {
        let d = *x_shape.last().unwrap() as usize;
        let (w_lo, w_hi) = if silu { (-4.0, 4.0) } else { (0.5, 1.5) };
        Self {
            x_shape: x_shape.to_vec(),
            eps: 1e-5,
            silu,
            x: rng.vec(shape_numel(x_shape), -3.0, 3.0),
            bias: rng.vec(d, -0.5, 0.5),
            weight: rng.vec(d, w_lo, w_hi),
        }
    }

    pub(crate) fn d(&self) -> usize {
        *self.x_shape.last().unwrap() as usize
    }

    pub(crate) fn epilogue(&self) -> Epilogue<'static, T> {
        if self.silu {
            Epilogue::Silu
        } else {
            Epilogue::Plain
        }
    }

    /// The CPU kernel's output.
    pub(crate) fn cpu(&self) -> Vec<T> {
        let plan = self.plan();
        let mut y = vec![T::from_f32(0.0); self.x.len()];
        bias_rms_norm(
            &plan,
            self.eps,
            &self.x,
            &self.bias,
            &self.weight,
            self.epilogue(),
            &mut y,
        );
        y
    }

    pub(crate) fn reference(&self) -> Vec<f64> {
        let n = reference_rms_norm(
            &wide(&self.x),
            &wide(&self.bias),
            &wide(&self.weight),
            self.d(),
            self.eps as f64,
        );
        if self.silu {
            n.into_iter().map(reference_silu).collect()
        } else {
            n
        }
    }
}

impl<T: Element> OpCase<T> for RmsCase<T> {
    type Op = BiasRmsNorm;

    fn attrs(&self) -> NormAttrs {
        NormAttrs {
            epsilon: self.eps,
            silu: self.silu,
        }
    }

    /// bias as `[D]`, weight as `[1, D]`: both are D elements.
    fn shapes(&self) -> Vec<Vec<i64>> {
        let d = self.d() as i64;
        vec![self.x_shape.clone(), vec![d], vec![1, d]]
    }

    fn inputs(&self) -> Vec<&[T]> {
        vec![&self.x, &self.bias, &self.weight]
    }

    fn written(&self) -> usize {
        self.x.len()
    }
}

/// BiasRmsNorm shapes: odd D, D = 64 and 96 (the VAE's channels-last rows), wan-1.3b's 1536.
pub(crate) const RMS_SHAPES: [&[i64]; 7] = [
    &[7, 64],
    &[3, 4, 32],
    &[5, 15],
    &[1, 1, 1, 8],
    &[2, 3, 5, 64],
    &[1, 4, 30, 52, 96],
    &[1, 4680, 1536],
];

pub(crate) fn check_rms_norm_cpu<T: Tolerance>() {
    let mut rng = Rng(2);
    for silu in [false, true] {
        for x_shape in RMS_SHAPES {
            let case = RmsCase::<T>::new(&mut rng, x_shape, silu);
            assert_close(
                &case.cpu(),
                &case.reference(),
                &format!("Y of {x_shape:?}, silu = {silu}"),
            );
        }
    }
}

#[test]
fn bias_rms_norm_matches_the_reference() {
    check_rms_norm_cpu::<f32>();
    check_rms_norm_cpu::<f16>();
}

/// SiLU's tails in float32: n = 100 gives 100 (exp(−100) vanishes next to 1), n = −100 gives −0
/// (exp(100) overflows to infinity), not NaN; n = ±1 gives the sigmoid's values.
#[test]
fn silu_saturates_at_both_ends() {
    // Rows of [1, −1, 1, −1] have an RMS of 1: n = weight · [1, −1, 1, −1] (epsilon 0).
    let x = [1f32, -1.0, 1.0, -1.0];
    let weight = [1f32, 1.0, 100.0, 100.0];
    let attrs = NormAttrs {
        epsilon: 0.0,
        silu: true,
    };
    let plan = plan_of::<BiasRmsNorm>(&attrs, &[vec![1, 4], vec![4], vec![4]]);
    let mut y = [0f32; 4];
    bias_rms_norm(&plan, 0.0, &x, &[0.0; 4], &weight, Epilogue::Silu, &mut y);
    assert_eq!(y[2], 100.0);
    assert_eq!(y[3], 0.0);
    assert!(y[3].is_sign_negative());
    let sigmoid_1 = 1.0 / (1.0 + (-1f64).exp());
    assert!((y[0] as f64 - sigmoid_1).abs() < 1e-7, "{}", y[0]);
    assert!((y[1] as f64 + (1.0 - sigmoid_1)).abs() < 1e-7, "{}", y[1]);
}

#[test]
fn no_rows_is_no_work() {
    let attrs = NormAttrs {
        epsilon: 1e-6,
        silu: false,
    };
    let plan = check::<BiasRmsNorm>(&attrs, &[&[0, 8], &[8], &[8]]).unwrap();
    assert_eq!((plan.rows, plan.d), (0, 8));
    let mut y: Vec<f32> = Vec::new();
    bias_rms_norm(
        &plan,
        1e-6,
        &[],
        &[0.0; 8],
        &[1.0; 8],
        Epilogue::Plain,
        &mut y,
    );
}

#[test]
fn a_silu_other_than_0_or_1_fails_the_session() {
    let attrs = [Attr::Float("epsilon", 1e-6), Attr::Int("silu", 2)];
    let Err(e) = session::<f16>(&BiasRmsNorm::INFO, &attrs) else {
        panic!("a BiasRmsNorm node with silu = 2 was accepted");
    };
    let e = e.to_string();
    assert!(
        e.contains("ai.unstep BiasRmsNorm") && e.contains("silu = 2; it must be 0 or 1"),
        "{e}"
    );
}

#[test]
fn contract_violations_name_the_operator_the_input_and_the_shapes() {
    let plain = NormAttrs {
        epsilon: 1e-6,
        silu: false,
    };
    // bias of the wrong size.
    let e = plan_error::<BiasRmsNorm>(plain, &[&[3, 8], &[3, 8], &[8]]);
    assert!(
        e.contains("ai.unstep BiasRmsNorm: input bias has shape [3, 8] (24 elements)"),
        "{e}"
    );
    // X without a last axis.
    let e = plan_error::<BiasRmsNorm>(plain, &[&[4, 0], &[0], &[0]]);
    assert!(e.contains("X has shape [4, 0]"), "{e}");
}

/// `BiasRmsNorm` through ONNX Runtime (CPU provider), on a case drawn from `rng`: the output
/// shapes ONNX Runtime infers and the float64 reference (one part of
/// `every_operator_runs_through_onnx_runtime`).
pub(crate) fn check_through_onnx_runtime<T: Tolerance>(rng: &mut Rng) {
    let t = std::any::type_name::<T>();
    // No silu attribute (plain), silu = 0 (plain) and silu = 1 (SiLU after the norm).
    for (x_shape, silu) in [
        (&[2, 3, 48][..], None),
        (&[1, 2, 3, 96], Some(0)),
        (&[1, 2, 3, 5, 96], Some(1)),
    ] {
        let case = RmsCase::<T>::new(rng, x_shape, silu == Some(1));
        let mut attrs = vec![Attr::Float("epsilon", case.eps)];
        attrs.extend(silu.map(|v| Attr::Int("silu", v)));
        let mut s = session::<T>(&BiasRmsNorm::INFO, &attrs).unwrap();
        let out = run(&mut s, &BiasRmsNorm::INFO, &case.shapes(), &case.inputs()).unwrap();
        assert_eq!(out[0].0, x_shape);
        assert_close(
            &out[0].1,
            &case.reference(),
            &format!("{t} BiasRmsNorm Y, silu {silu:?}"),
        );
    }
}

//! `MatMulFp8`: the E4M3 encoding against its definition, the CPU kernel against float64
//! references (of the 8-bit values, exactly; of the unquantised product, within float8's error),
//! its contract's errors, through ONNX Runtime with its uint8 and float32 inputs, and what its
//! CUDA kernel refuses.

use half::f16;
use ort::value::{Tensor, TensorElementType};

use super::*;
use crate::engine::kernels::operator::CudaKernel;
use crate::engine::kernels::test_support::*;
use crate::engine::onnx_graph::Attr;

/// Every finite E4M3 value, from its definition (sign, 4 exponent bits of bias 7, 3 mantissa
/// bits; exponent 0 subnormal), in float64.
fn defined_value(code: u8) -> f64 {
    let (e, m) = (i32::from((code >> 3) & 0xf), f64::from(code & 7));
    let magnitude = if e == 0 {
        m / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - 7)
    };
    if code & 0x80 != 0 { -magnitude } else { magnitude }
}

#[test]
fn e4m3_codes_are_the_formats_values() {
    for code in 0..=255u8 {
        if code & 0x7f == 0x7f {
            assert!(e4m3_value(code).is_nan(), "{code:#04x} is NaN");
            continue;
        }
        let v = defined_value(code);
        assert_eq!(f64::from(e4m3_value(code)), v, "{code:#04x}");
        // Each value encodes to its own code (0x80, -0, is its own too).
        assert_eq!(e4m3(v as f32), code, "{v} encodes back to {code:#04x}");
    }
    assert_eq!(e4m3_value(0x7e), 448.0);
    assert_eq!(e4m3_value(0x01), 2f32.powi(-9));
}

#[test]
fn e4m3_rounds_to_nearest_even_and_saturates() {
    // Between consecutive positive codes: just below and above the midpoint go to the nearer
    // one, the midpoint itself to the even code.
    for code in 0..0x7eu8 {
        let (lo, hi) = (defined_value(code), defined_value(code + 1));
        let mid = (lo + hi) / 2.0;
        let below = (mid - (hi - lo) * 1e-3) as f32;
        let above = (mid + (hi - lo) * 1e-3) as f32;
        assert_eq!(e4m3(below), code, "below the midpoint of {lo} and {hi}");
        assert_eq!(e4m3(above), code + 1, "above the midpoint of {lo} and {hi}");
        let even = if code % 2 == 0 { code } else { code + 1 };
        assert_eq!(e4m3(mid as f32), even, "the midpoint of {lo} and {hi}");
        assert_eq!(e4m3(-mid as f32), 0x80 | even, "minus the midpoint of {lo} and {hi}");
    }
    for v in [448.0f32, 448.5, 464.0, 1e6, f32::INFINITY] {
        assert_eq!(e4m3(v), 0x7e, "{v} saturates");
        assert_eq!(e4m3(-v), 0xfe, "-{v} saturates");
    }
    assert_eq!(e4m3(f32::NAN), 0x7f);
    assert_eq!(e4m3(2f32.powi(-11)), 0, "a quarter of the smallest subnormal");
}

#[test]
fn a_rows_largest_magnitude_becomes_448() {
    let row = [0.5f32, -3.0, 1.25, 0.0, 2.9];
    let mut codes = [0f32; 5];
    let s = quantise_row(&row, &mut codes);
    assert_eq!(s, 3.0 / 448.0);
    assert_eq!(codes[1], -448.0);
    for (c, v) in codes.iter().zip(row) {
        // E4M3 keeps 3 mantissa bits: within 2⁻⁴ relative, once scaled back.
        assert!(
            (c * s - v).abs() <= v.abs() / 16.0,
            "{v} quantised to {c} · {s}"
        );
    }
    let mut zeros = [1f32; 3];
    assert_eq!(quantise_row(&[0.0, -0.0, 0.0], &mut zeros), 0.0);
    assert_eq!(zeros, [0.0; 3]);
}

/// One MatMulFp8 case: X [..., K], the weight quantised per output channel (as the exporter
/// does), bias [N].
pub(crate) struct Fp8Case<T> {
    pub(crate) x_shape: Vec<i64>,
    pub(crate) n: usize,
    pub(crate) gelu: bool,
    pub(crate) x: Vec<T>,
    /// The unquantised weight [N, K].
    pub(crate) weight: Vec<f32>,
    pub(crate) w: Vec<u8>,
    pub(crate) w_scale: Vec<f32>,
    pub(crate) bias: Vec<T>,
}

impl<T: Element> Fp8Case<T> {
    /// X in [-2, 2] (one row of zeros when there are several), the weight in ±sqrt(3/K), bias in
    /// [-1, 1].
    pub(crate) fn new(rng: &mut Rng, x_shape: &[i64], n: usize, gelu: bool) -> Self {
        let k = *x_shape.last().unwrap() as usize;
        let w_max = (3.0 / k as f32).sqrt();
        let mut x: Vec<T> = rng.vec(shape_numel(x_shape), -2.0, 2.0);
        if x.len() > k {
            x[k..2 * k].fill(T::from_f32(0.0));
        }
        let weight: Vec<f32> = rng.vec(n * k, -w_max, w_max);
        let mut w = vec![0u8; n * k];
        let mut w_scale = vec![0f32; n];
        for ((codes, scale), row) in w.chunks_mut(k).zip(&mut w_scale).zip(weight.chunks(k)) {
            let m = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            *scale = if m == 0.0 { 1.0 } else { m / E4M3_MAX };
            for (c, v) in codes.iter_mut().zip(row) {
                *c = e4m3(v / *scale);
            }
        }
        Self {
            x_shape: x_shape.to_vec(),
            n,
            gelu,
            x,
            weight,
            w,
            w_scale,
            bias: rng.vec(n, -1.0, 1.0),
        }
    }

    pub(crate) fn k(&self) -> usize {
        *self.x_shape.last().unwrap() as usize
    }

    fn act(&self, v: f64) -> f64 {
        if self.gelu { reference_gelu(v) } else { v }
    }

    /// The contract in float64 over the 8-bit values: X's rows quantised (float32 operations,
    /// as the contract says), W's codes, the scales.
    pub(crate) fn reference(&self) -> Vec<f64> {
        let (k, n) = (self.k(), self.n);
        let x: Vec<f32> = self.x.iter().map(|v| v.to_f32()).collect();
        let mut y = Vec::with_capacity(x.len() / k * n);
        let mut codes = vec![0f32; k];
        for x_row in x.chunks(k) {
            let s = f64::from(quantise_row(x_row, &mut codes));
            for c in 0..n {
                let w_row = &self.w[c * k..(c + 1) * k];
                let sum: f64 = (codes.iter().zip(w_row))
                    .map(|(&q, &w)| f64::from(q) * f64::from(e4m3_value(w)))
                    .sum();
                let v = s * f64::from(self.w_scale[c]) * sum + self.bias[c].to_f32() as f64;
                y.push(self.act(v));
            }
        }
        y
    }

    /// The layer in float64 without any quantisation.
    pub(crate) fn unquantised(&self) -> Vec<f64> {
        let (k, n) = (self.k(), self.n);
        let x = wide(&self.x);
        let mut y = Vec::with_capacity(x.len() / k * n);
        for x_row in x.chunks(k) {
            for c in 0..n {
                let w_row = &self.weight[c * k..(c + 1) * k];
                let sum: f64 = x_row.iter().zip(w_row).map(|(a, &b)| a * f64::from(b)).sum();
                y.push(self.act(sum + self.bias[c].to_f32() as f64));
            }
        }
        y
    }

    pub(crate) fn y_shape(&self) -> Vec<i64> {
        let mut shape = self.x_shape.clone();
        *shape.last_mut().unwrap() = self.n as i64;
        shape
    }

    pub(crate) fn attrs(&self) -> Fp8Attrs {
        Fp8Attrs { gelu: self.gelu }
    }

    pub(crate) fn shapes(&self) -> Vec<Vec<i64>> {
        let (n, k) = (self.n as i64, self.k() as i64);
        vec![self.x_shape.clone(), vec![n, k], vec![n], vec![n]]
    }

    pub(crate) fn plan(&self) -> Fp8Sizes {
        plan_of::<MatMulFp8>(&self.attrs(), &self.shapes())
    }

    pub(crate) fn cpu(&self) -> Vec<T> {
        let plan = self.plan();
        let mut y = vec![T::from_f32(0.0); plan.rows * self.n];
        matmul_fp8(
            &self.attrs(),
            &plan,
            &self.x,
            &self.w,
            &self.w_scale,
            &self.bias,
            &mut y,
        );
        y
    }
}

/// (X shape, N, gelu): a batch axis, one row, K and N not multiples of anything, the tiny
/// model's FFN (3 frames of 28 tokens, 64 → 128) with and without GELU, and a long sum (K =
/// 1536, wan-1.3b's).
pub(crate) const FP8_CASES: [(&[i64], usize, bool); 6] = [
    (&[2, 3, 16], 24, false),
    (&[1, 7], 5, true),
    (&[5, 13], 9, false),
    (&[1, 84, 64], 128, true),
    (&[1, 84, 64], 64, false),
    (&[3, 1536], 40, false),
];

/// The relative L2 error of `got` against `want`.
fn relative_l2(got: &[f64], want: &[f64]) -> f64 {
    let err: f64 = got.iter().zip(want).map(|(g, w)| (g - w).powi(2)).sum();
    let norm: f64 = want.iter().map(|w| w * w).sum();
    (err / norm).sqrt()
}

fn check_cpu<T: Tolerance>() {
    let mut rng = Rng(12);
    for (shape, n, gelu) in FP8_CASES {
        let case = Fp8Case::<T>::new(&mut rng, shape, n, gelu);
        let what = format!(
            "{} MatMulFp8 {shape:?} N = {n} gelu = {gelu}",
            std::any::type_name::<T>()
        );
        let plan = case.plan();
        assert_eq!((plan.d, plan.cols), (case.k(), n), "{what}");
        let cpu = case.cpu();
        assert_close(&cpu, &case.reference(), &what);
        // Against the unquantised layer: float8's 3 mantissa bits, on X and on W, leave a few
        // percent (measured: at most 2.6 % over these cases).
        let error = relative_l2(&wide(&cpu), &case.unquantised());
        assert!(error < 0.04, "{what}: {error} relative to the unquantised layer");
    }
}

#[test]
fn matmul_fp8_matches_the_reference() {
    check_cpu::<f32>();
    check_cpu::<f16>();
}

#[test]
fn contract_violations_name_the_operator_the_input_and_the_shapes() {
    let attrs = Fp8Attrs { gelu: false };
    for w in [&[24, 8][..], &[24, 16, 1], &[0, 16]] {
        let e = plan_error::<MatMulFp8>(attrs, &[&[2, 3, 16], w, &[24], &[24]]);
        assert!(
            e.contains(&format!(
                "ai.unstep MatMulFp8: input W has shape {w:?}; with X [2, 3, 16] it must be [N, 16]"
            )),
            "{e}"
        );
    }
    let e = plan_error::<MatMulFp8>(attrs, &[&[2, 3, 16], &[24, 16], &[16], &[24]]);
    assert!(
        e.contains("input w_scale has shape [16]; it must have N = 24 elements"),
        "{e}"
    );
    let e = plan_error::<MatMulFp8>(attrs, &[&[2, 3, 16], &[24, 16], &[24], &[1, 23]]);
    assert!(
        e.contains("input bias has shape [1, 23]; it must have N = 24 elements"),
        "{e}"
    );
}

/// Runs a one-node MatMulFp8 session (CPU provider) on the case.
fn run_session<T: Element>(case: &Fp8Case<T>, gelu: i64) -> ort::Result<(Vec<i64>, Vec<T>)> {
    let mut s = session::<T>(&MatMulFp8::INFO, &[Attr::Int("gelu", gelu)])?;
    let shapes = case.shapes();
    let outputs = s.run(ort::inputs![
        "X" => Tensor::from_array((shapes[0].clone(), case.x.clone()))?,
        "W" => Tensor::from_array((shapes[1].clone(), case.w.clone()))?,
        "w_scale" => Tensor::from_array((shapes[2].clone(), case.w_scale.clone()))?,
        "bias" => Tensor::from_array((shapes[3].clone(), case.bias.clone()))?,
    ])?;
    let (shape, data) = outputs["Y"].try_extract_tensor::<T>()?;
    Ok((shape.to_vec(), data.to_vec()))
}

/// `MatMulFp8` through ONNX Runtime (CPU provider), on a case drawn from `rng`: W as uint8 and
/// w_scale as float32 beside float32 or float16 X, the output shape ONNX Runtime infers and the
/// float64 reference (one part of `every_operator_runs_through_onnx_runtime`).
pub(crate) fn check_through_onnx_runtime<T: Tolerance>(rng: &mut Rng) {
    let t = std::any::type_name::<T>();
    let (shape, n, _) = FP8_CASES[3];
    for gelu in [false, true] {
        let case = Fp8Case::<T>::new(rng, shape, n, gelu);
        let (y_shape, y) = run_session(&case, i64::from(gelu)).unwrap();
        assert_eq!(y_shape, case.y_shape());
        assert_close(&y, &case.reference(), &format!("{t} MatMulFp8 gelu {gelu} Y"));
    }
}

#[test]
fn a_gelu_attribute_other_than_0_or_1_is_refused() {
    let case = Fp8Case::<f32>::new(&mut Rng(3), &[2, 16], 8, false);
    let e = run_session(&case, 2).unwrap_err().to_string();
    assert!(
        e.contains("ai.unstep MatMulFp8: node") && e.contains("has gelu = 2; it must be 0 or 1"),
        "{e}"
    );
}

/// MatMulFp8's CUDA kernel refuses float32 before loading anything (fp8 bundles are float16),
/// and without cuBLASLt or the CUDA driver (this machine, CI) says what is missing and what to
/// do.
#[test]
fn the_fp8_kernel_says_what_it_cannot_do() {
    let e = <GemmKernel as CudaKernel<MatMulFp8>>::new(TensorElementType::Float32, 0)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("ai.unstep MatMulFp8: element type Float32 is not supported on CUDA"),
        "{e}"
    );
    if let Err(e) = <GemmKernel as CudaKernel<MatMulFp8>>::new(TensorElementType::Float16, 0) {
        let e = e.to_string();
        assert!(e.contains("could not load") || e.contains("compute capability"), "{e}");
    }
}

//! What the operators' tests share: a fixed-seed generator, float64 references written from the
//! contract, tolerances, the test case trait, and sessions of one node through ONNX Runtime (CPU
//! provider).

use half::f16;
use ort::session::Session;
use ort::value::{Tensor, TensorElementType};

use super::operator::Element;
use super::operator::{OpInfo, UnstepOp, check};
use super::{DOMAIN, operator_domain};
use crate::engine::onnx_graph::{self, Attr};
use crate::engine::ort_lib;

/// splitmix64: a fixed-seed generator, so every run checks the same numbers.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `n` values uniform in [lo, hi), rounded to `T`.
    pub(crate) fn vec<T: Element>(&mut self, n: usize, lo: f32, hi: f32) -> Vec<T> {
        (0..n)
            .map(|_| {
                let unit = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
                T::from_f32(lo + (hi - lo) * unit)
            })
            .collect()
    }
}

pub(crate) fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f32() as f64).collect()
}

/// Tolerances of a type: |got − want| ≤ atol + rtol·|want|. float16 outputs are rounded once
/// (half an ulp, 2⁻¹¹ relative) from float32 work, which may land on the other side of a rounding
/// boundary than float64 (one ulp).
pub(crate) trait Tolerance: Element {
    const ATOL: f64;
    const RTOL: f64;
}

impl Tolerance for f32 {
    const ATOL: f64 = 2e-5;
    const RTOL: f64 = 2e-5;
}

impl Tolerance for f16 {
    const ATOL: f64 = 3e-3;
    const RTOL: f64 = 2e-3;
}

#[track_caller]
pub(crate) fn assert_close<T: Tolerance>(got: &[T], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0f64);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f32() as f64;
        let excess = (g - w).abs() - (T::ATOL + T::RTOL * w.abs());
        assert!(g.is_finite(), "{what}[{i}] = {g}");
        if excess > worst.1 {
            worst = (i, excess);
        }
    }
    let (i, excess) = worst;
    assert!(
        excess <= 0.0,
        "{what}[{i}]: got {}, want {} (outside the tolerance by {excess:e})",
        got[i].to_f32(),
        want[i]
    );
}

/// Row r's block of a row parameter of `numel` elements: the contract's `r / (N / F)`.
pub(crate) fn block(r: usize, rows: usize, numel: usize, d: usize) -> usize {
    let f = numel / d;
    r / (rows / f)
}

/// RMS norm of `(x + bias)` times weight, per row, in float64.
pub(crate) fn reference_rms_norm(
    x: &[f64],
    bias: &[f64],
    weight: &[f64],
    d: usize,
    eps: f64,
) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(d) {
        let v: Vec<f64> = row.iter().zip(bias).map(|(a, b)| a + b).collect();
        let ms = v.iter().map(|a| a * a).sum::<f64>() / d as f64;
        let norm = (ms + eps).sqrt();
        y.extend(v.iter().zip(weight).map(|(a, w)| a / norm * w));
    }
    y
}

/// SiLU in float64: `n · sigmoid(n)`.
pub(crate) fn reference_silu(n: f64) -> f64 {
    n / (1.0 + (-n).exp())
}

/// GELU's tanh form, `0.5·v·(1 + tanh(sqrt(2/π)·(v + 0.044715·v³)))`.
pub(crate) fn reference_gelu(v: f64) -> f64 {
    let z = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v);
    0.5 * v * (1.0 + z.tanh())
}

/// The rotary embedding of `u` per head: head h's column pair (h·hd + 2q, h·hd + 2q + 1) turns by
/// angle column q of table row r % Tc.
pub(crate) fn reference_rope(
    u: &[f64],
    cos: &[f64],
    sin: &[f64],
    d: usize,
    heads: usize,
) -> Vec<f64> {
    let hd = d / heads;
    let half = hd / 2;
    let tc = cos.len() / half;
    let mut y = u.to_vec();
    for (r, row) in y.chunks_mut(d).enumerate() {
        let t = r % tc;
        for h in 0..heads {
            for q in 0..half {
                let (c, s) = (cos[t * half + q], sin[t * half + q]);
                let (a, b) = (row[h * hd + 2 * q], row[h * hd + 2 * q + 1]);
                row[h * hd + 2 * q] = a * c - b * s;
                row[h * hd + 2 * q + 1] = a * s + b * c;
            }
        }
    }
    y
}

pub(crate) fn store_as<T: Element>(v: f64) -> f64 {
    T::from_f32(v as f32).to_f32() as f64
}

/// The rotary tables of `tc` positions and `half` frequencies, as the model builds them.
pub(crate) fn rope_tables<T: Element>(tc: usize, half: usize) -> (Vec<T>, Vec<T>) {
    let mut cos = Vec::new();
    let mut sin = Vec::new();
    for t in 0..tc {
        for j in 0..half {
            let angle = (t as f64 + 0.5) * 10000f64.powf(-(j as f64) / half as f64);
            cos.push(T::from_f32(angle.cos() as f32));
            sin.push(T::from_f32(angle.sin() as f32));
        }
    }
    (cos, sin)
}

pub(crate) fn shape_numel(shape: &[i64]) -> usize {
    shape.iter().product::<i64>() as usize
}

/// A test case of one operator: its attributes, the shapes of its inputs (in the operator's
/// order) and their data, and how many elements the operator writes (the GPU test's bandwidth).
pub(crate) trait OpCase<T: Element> {
    type Op: UnstepOp;
    fn attrs(&self) -> <Self::Op as UnstepOp>::Attrs;
    fn shapes(&self) -> Vec<Vec<i64>>;
    fn inputs(&self) -> Vec<&[T]>;
    fn written(&self) -> usize;

    /// The case's sizes, checked against the contract.
    fn plan(&self) -> <Self::Op as UnstepOp>::Sizes {
        plan_of::<Self::Op>(&self.attrs(), &self.shapes())
    }
}

/// The sizes of a call of `O` with these shapes, which must meet the contract.
pub(crate) fn plan_of<O: UnstepOp>(attrs: &O::Attrs, shapes: &[Vec<i64>]) -> O::Sizes {
    let shapes: Vec<&[i64]> = shapes.iter().map(Vec::as_slice).collect();
    check::<O>(attrs, &shapes).unwrap()
}

/// The error of a call of `O` with these shapes, which must break the contract.
pub(crate) fn plan_error<O: UnstepOp>(attrs: O::Attrs, shapes: &[&[i64]]) -> String {
    check::<O>(&attrs, shapes).unwrap_err().to_string()
}

pub(crate) fn onnx_type<T: Element>() -> TensorElementType {
    T::into_tensor_element_type()
}

/// A session of one node of `op` with the CPU kernels registered.
pub(crate) fn session<T: Element>(op: &OpInfo, attrs: &[Attr]) -> ort::Result<Session> {
    let runtime = ort_lib::runtime(None).expect(
        "ONNX Runtime: run through scripts/test (or set UNSTEP_ORT_CACHE_DIR / ORT_DYLIB_PATH)",
    );
    let ty = onnx_type::<T>();
    let inputs: Vec<(&str, TensorElementType)> = (op.inputs.iter().enumerate())
        .map(|(i, name)| (*name, op.input_type(i, ty)))
        .collect();
    let model = onnx_graph::custom_node(DOMAIN, op.name, ty, &inputs, op.outputs, attrs);
    Session::builder(&runtime.environment)?
        .with_intra_threads(1)?
        .with_operators(operator_domain(false)?)?
        .commit_from_memory(&model)
}

/// Runs `session` on `inputs` (in the operator's input order) and returns its outputs.
pub(crate) fn run<T: Element>(
    session: &mut Session,
    op: &OpInfo,
    shapes: &[Vec<i64>],
    inputs: &[&[T]],
) -> ort::Result<Vec<(Vec<i64>, Vec<T>)>> {
    let values: Vec<(&str, Tensor<T>)> = op
        .inputs
        .iter()
        .zip(shapes.iter().zip(inputs))
        .map(|(name, (shape, data))| {
            Ok((*name, Tensor::from_array((shape.clone(), data.to_vec()))?))
        })
        .collect::<ort::Result<_>>()?;
    let outputs = session.run(values)?;
    op.outputs
        .iter()
        .map(|name| {
            let (shape, data) = outputs[*name].try_extract_tensor::<T>()?;
            Ok((shape.to_vec(), data.to_vec()))
        })
        .collect()
}

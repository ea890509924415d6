//! The kernels against a naive float64 reference written from the contract, directly and through
//! ONNX Runtime (CPU provider); the contract's errors; the CUDA source through NVRTC (ignored:
//! needs `libnvrtc.so.13` on LD_LIBRARY_PATH, not a GPU).

use half::f16;
use ort::session::Session;
use ort::value::{Tensor, TensorElementType};

use super::cpu::{self, Element, Epilogue};
use super::*;
use crate::engine::onnx_graph::{self, Attr};
use crate::engine::ort_lib;

/// splitmix64: a fixed-seed generator, so every run checks the same numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `n` values uniform in [lo, hi), rounded to `T`.
    fn vec<T: Element>(&mut self, n: usize, lo: f32, hi: f32) -> Vec<T> {
        (0..n)
            .map(|_| {
                let unit = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
                T::from_f32(lo + (hi - lo) * unit)
            })
            .collect()
    }
}

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f32() as f64).collect()
}

/// Tolerances of a type: |got − want| ≤ atol + rtol·|want|. float16 outputs are rounded once
/// (half an ulp, 2⁻¹¹ relative) from float32 work, which may land on the other side of a rounding
/// boundary than float64 (one ulp).
trait Tolerance: Element {
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
fn assert_close<T: Tolerance>(got: &[T], want: &[f64], what: &str) {
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
fn block(r: usize, rows: usize, numel: usize, d: usize) -> usize {
    let f = numel / d;
    r / (rows / f)
}

/// RMS norm of `(x + bias)` times weight, per row, in float64.
fn reference_rms_norm(x: &[f64], bias: &[f64], weight: &[f64], d: usize, eps: f64) -> Vec<f64> {
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
fn reference_silu(n: f64) -> f64 {
    n / (1.0 + (-n).exp())
}

/// GELU's tanh form, `0.5·v·(1 + tanh(sqrt(2/π)·(v + 0.044715·v³)))`.
fn reference_gelu(v: f64) -> f64 {
    let z = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v);
    0.5 * v * (1.0 + z.tanh())
}

/// The rotary embedding of `u` per head: head h's column pair (h·hd + 2q, h·hd + 2q + 1) turns by
/// angle column q of table row r % Tc.
fn reference_rope(u: &[f64], cos: &[f64], sin: &[f64], d: usize, heads: usize) -> Vec<f64> {
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

/// `(S, Y)` of GatedResidualLayerNorm in float64, S rounded by `store` (to the element type)
/// before the norm reads it.
#[allow(clippy::too_many_arguments)]
fn reference_grln(
    r: &[f64],
    x: &[f64],
    bias: &[f64],
    gate: &[f64],
    scale: &[f64],
    shift: &[f64],
    d: usize,
    eps: f64,
    store: impl Fn(f64) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let rows = x.len() / d;
    let (mut s_all, mut y_all) = (Vec::new(), Vec::new());
    for row in 0..rows {
        let g = block(row, rows, gate.len(), d) * d;
        let sc = block(row, rows, scale.len(), d) * d;
        let sh = block(row, rows, shift.len(), d) * d;
        let s: Vec<f64> = (0..d)
            .map(|c| store(r[row * d + c] + (x[row * d + c] + bias[c]) * gate[g + c]))
            .collect();
        let mean = s.iter().sum::<f64>() / d as f64;
        let var = s.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
        let norm = (var + eps).sqrt();
        for c in 0..d {
            y_all.push((s[c] - mean) / norm * scale[sc + c] + shift[sh + c]);
        }
        s_all.extend(s);
    }
    (s_all, y_all)
}

fn store_as<T: Element>(v: f64) -> f64 {
    T::from_f32(v as f32).to_f32() as f64
}

/// The rotary tables of `tc` positions and `half` frequencies, as the model builds them.
fn rope_tables<T: Element>(tc: usize, half: usize) -> (Vec<T>, Vec<T>) {
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

fn shape_numel(shape: &[i64]) -> usize {
    shape.iter().product::<i64>() as usize
}

/// One BiasRmsNormRope case: inputs, the plan and the reference output.
/// A test case of one operator: its attributes, the shapes of its inputs (in the operator's
/// order) and their data, and how many elements the operator writes (the GPU test's bandwidth).
trait OpCase<T: Element> {
    const OP: Op;
    fn attrs(&self) -> Attrs;
    fn shapes(&self) -> Vec<Vec<i64>>;
    fn inputs(&self) -> Vec<&[T]>;
    fn written(&self) -> usize;

    /// The case's sizes, checked against the contract.
    fn plan(&self) -> Plan {
        plan_of(Self::OP, &self.attrs(), &self.shapes())
    }
}

struct RopeCase<T> {
    x_shape: Vec<i64>,
    table_shape: Vec<i64>,
    heads: usize,
    eps: f32,
    x: Vec<T>,
    bias: Vec<T>,
    weight: Vec<T>,
    cos: Vec<T>,
    sin: Vec<T>,
}

impl<T: Element> RopeCase<T> {
    fn new(rng: &mut Rng, x_shape: &[i64], heads: usize, tc: usize) -> Self {
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

    fn reference(&self) -> Vec<f64> {
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
    const OP: Op = Op::BiasRmsNormRope;

    fn attrs(&self) -> Attrs {
        Attrs {
            epsilon: self.eps,
            num_heads: self.heads,
            silu: false,
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

/// One BiasRmsNorm case: inputs, attributes and the reference output.
struct RmsCase<T> {
    x_shape: Vec<i64>,
    eps: f32,
    silu: bool,
    x: Vec<T>,
    bias: Vec<T>,
    weight: Vec<T>,
}

impl<T: Element> RmsCase<T> {
    /// With `silu`, weights of both signs and up to 4, so that n reaches both tails of the
    /// sigmoid.
    fn new(rng: &mut Rng, x_shape: &[i64], silu: bool) -> Self {
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

    fn d(&self) -> usize {
        *self.x_shape.last().unwrap() as usize
    }

    fn epilogue(&self) -> Epilogue<'static, T> {
        if self.silu {
            Epilogue::Silu
        } else {
            Epilogue::Plain
        }
    }

    /// The CPU kernel's output.
    fn cpu(&self) -> Vec<T> {
        let plan = self.plan();
        let mut y = vec![T::from_f32(0.0); self.x.len()];
        cpu::bias_rms_norm(
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

    fn reference(&self) -> Vec<f64> {
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
    const OP: Op = Op::BiasRmsNorm;

    fn attrs(&self) -> Attrs {
        Attrs {
            epsilon: self.eps,
            num_heads: 0,
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

/// `PrefixBiasRmsNorm`: an `RmsCase` for X and a prefix of X's shape with `p` on axis 1.
struct PrefixCase<T> {
    rms: RmsCase<T>,
    prefix_shape: Vec<i64>,
    prefix: Vec<T>,
}

impl<T: Element> PrefixCase<T> {
    fn new(rng: &mut Rng, x_shape: &[i64], p: i64, silu: bool) -> Self {
        let mut prefix_shape = x_shape.to_vec();
        prefix_shape[1] = p;
        Self {
            rms: RmsCase::new(rng, x_shape, silu),
            prefix: rng.vec(shape_numel(&prefix_shape), -3.0, 3.0),
            prefix_shape,
        }
    }

    /// Y's shape: X's with P + T on axis 1.
    fn y_shape(&self) -> Vec<i64> {
        let mut shape = self.rms.x_shape.clone();
        shape[1] += self.prefix_shape[1];
        shape
    }

    /// The CPU kernel's output, through the operator's compute path's pieces: the prefix, then
    /// `bias_rms_norm` of X.
    fn cpu(&self) -> Vec<T> {
        [self.prefix.clone(), self.rms.cpu()].concat()
    }

    /// Checks tail: Y's last prefix-sized rows, exactly.
    #[track_caller]
    fn assert_tail(&self, y: &[T], tail: &[T], what: &str) {
        assert!(
            tail == &y[y.len() - self.prefix.len()..],
            "{what}: tail is not Y's last {} elements",
            self.prefix.len()
        );
    }

    /// Checks Y: the prefix exactly, then X's rows against the float64 reference.
    #[track_caller]
    fn assert_matches(&self, y: &[T], what: &str)
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
    const OP: Op = Op::PrefixBiasRmsNorm;

    fn attrs(&self) -> Attrs {
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
const PREFIX_CASES: [(&[i64], i64); 5] = [
    (&[1, 7, 64], 2),
    (&[1, 3, 5, 16], 0),
    (&[1, 4, 3, 5, 96], 2),
    (&[1, 1, 2, 3, 32], 2),
    (&[1, 5], 1),
];

fn check_prefix_cpu<T: Tolerance>() {
    let mut rng = Rng(12);
    let t = std::any::type_name::<T>();
    for silu in [false, true] {
        for (x_shape, p) in PREFIX_CASES {
            let case = PrefixCase::<T>::new(&mut rng, x_shape, p, silu);
            let plan = case.plan();
            assert_eq!(
                (plan.rows, plan.prefix_rows, plan.output_rows()),
                (
                    case.rms.x.len() / plan.d,
                    case.prefix.len() / plan.d,
                    (case.prefix.len() + case.rms.x.len()) / plan.d
                )
            );
            let shapes = case.shapes();
            let shapes: Vec<&[i64]> = shapes.iter().map(Vec::as_slice).collect();
            let op = Op::PrefixBiasRmsNorm;
            assert_eq!(op.output_shape(&shapes, 0), case.y_shape());
            assert_eq!(op.output_shape(&shapes, 1), case.prefix_shape);
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

struct GrlnCase<T> {
    x_shape: Vec<i64>,
    param_shapes: [Vec<i64>; 3],
    eps: f32,
    r: Vec<T>,
    x: Vec<T>,
    bias: Vec<T>,
    gate: Vec<T>,
    scale: Vec<T>,
    shift: Vec<T>,
}

impl<T: Element> GrlnCase<T> {
    fn new(rng: &mut Rng, x_shape: &[i64], param_shapes: [&[i64]; 3]) -> Self {
        let d = *x_shape.last().unwrap() as usize;
        let n = shape_numel(x_shape);
        Self {
            x_shape: x_shape.to_vec(),
            param_shapes: param_shapes.map(|s| s.to_vec()),
            eps: 1e-6,
            r: rng.vec(n, -2.0, 2.0),
            x: rng.vec(n, -2.0, 2.0),
            bias: rng.vec(d, -0.5, 0.5),
            gate: rng.vec(shape_numel(param_shapes[0]), -1.0, 1.0),
            scale: rng.vec(shape_numel(param_shapes[1]), 0.5, 1.5),
            shift: rng.vec(shape_numel(param_shapes[2]), -0.5, 0.5),
        }
    }

    fn reference(&self) -> (Vec<f64>, Vec<f64>) {
        reference_grln(
            &wide(&self.r),
            &wide(&self.x),
            &wide(&self.bias),
            &wide(&self.gate),
            &wide(&self.scale),
            &wide(&self.shift),
            *self.x_shape.last().unwrap() as usize,
            self.eps as f64,
            store_as::<T>,
        )
    }
}

impl<T: Element> OpCase<T> for GrlnCase<T> {
    const OP: Op = Op::GatedResidualLayerNorm;

    fn attrs(&self) -> Attrs {
        Attrs {
            epsilon: self.eps,
            num_heads: 0,
            silu: false,
        }
    }

    fn shapes(&self) -> Vec<Vec<i64>> {
        let d = *self.x_shape.last().unwrap();
        let [g, sc, sh] = self.param_shapes.clone();
        vec![
            self.x_shape.clone(),
            self.x_shape.clone(),
            vec![d],
            g,
            sc,
            sh,
        ]
    }

    fn inputs(&self) -> Vec<&[T]> {
        vec![
            &self.r,
            &self.x,
            &self.bias,
            &self.gate,
            &self.scale,
            &self.shift,
        ]
    }

    fn written(&self) -> usize {
        // S and Y.
        2 * self.x.len()
    }
}

/// One QkvNormRopeCache case: QKV `[B, T, 3·D]`, caches `[B, L, D]` whose first L − T rows of
/// each batch entry hold earlier keys and values (random; the op must leave them), and the
/// reference.
struct QkvCase<T> {
    b: usize,
    t: usize,
    l: usize,
    d: usize,
    heads: usize,
    eps: f32,
    table_shape: Vec<i64>,
    qkv: Vec<T>,
    /// q_bias, k_bias, q_weight, k_weight.
    params: [Vec<T>; 4],
    cos: Vec<T>,
    sin: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
}

impl<T: Element> QkvCase<T> {
    fn new(rng: &mut Rng, [b, t, l, d]: [usize; 4], heads: usize, tc: usize) -> Self {
        let half = d / heads / 2;
        let (cos, sin) = rope_tables::<T>(tc, half);
        Self {
            b,
            t,
            l,
            d,
            heads,
            eps: 1e-6,
            table_shape: vec![1, tc as i64, 1, half as i64],
            qkv: rng.vec(b * t * 3 * d, -2.0, 2.0),
            params: [
                rng.vec(d, -0.5, 0.5),
                rng.vec(d, -0.5, 0.5),
                rng.vec(d, 0.5, 1.5),
                rng.vec(d, 0.5, 1.5),
            ],
            cos,
            sin,
            k: rng.vec(b * l * d, -1.0, 1.0),
            v: rng.vec(b * l * d, -1.0, 1.0),
        }
    }

    /// Column block `j` (0 q, 1 k, 2 v) of every row of QKV.
    fn column_block(&self, j: usize) -> Vec<f64> {
        let d = self.d;
        wide(&self.qkv)
            .chunks(3 * d)
            .flat_map(|row| row[j * d..(j + 1) * d].to_vec())
            .collect()
    }

    /// `(Q, K, V)` in float64: Q, and the whole caches after the op.
    fn reference(&self) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let (d, eps) = (self.d, self.eps as f64);
        let [q_bias, k_bias, q_weight, k_weight] = self.params.each_ref().map(|p| wide(p));
        let (cos, sin) = (wide(&self.cos), wide(&self.sin));
        let turn = |j: usize, bias: &[f64], weight: &[f64]| {
            let u = reference_rms_norm(&self.column_block(j), bias, weight, d, eps);
            reference_rope(&u, &cos, &sin, d, self.heads)
        };
        let q = turn(0, &q_bias, &q_weight);
        let new_k = turn(1, &k_bias, &k_weight);
        let new_v = self.column_block(2);
        let place = |cache: &[T], new: &[f64]| {
            let mut out = wide(cache);
            for b in 0..self.b {
                let at = (b * self.l + self.l - self.t) * d;
                out[at..at + self.t * d].copy_from_slice(&new[b * self.t * d..][..self.t * d]);
            }
            out
        };
        (q, place(&self.k, &new_k), place(&self.v, &new_v))
    }

    /// The CPU kernel's Q, K and V.
    fn cpu(&self) -> (Vec<T>, Vec<T>, Vec<T>) {
        let plan = self.plan();
        let mut q = vec![T::from_f32(0.0); self.b * self.t * self.d];
        let (mut k, mut v) = (self.k.clone(), self.v.clone());
        let [qb, kb, qw, kw] = self.params.each_ref().map(Vec::as_slice);
        cpu::qkv_norm_rope_cache(
            &plan,
            self.eps,
            &self.qkv,
            [qb, kb, qw, kw],
            (&self.cos, &self.sin),
            &mut q,
            &mut k,
            &mut v,
        );
        (q, k, v)
    }

    /// Asserts `(Q, K, V)` against the reference; the rows before the block's are unchanged.
    #[track_caller]
    fn assert_matches(&self, (q, k, v): (&[T], &[T], &[T]), what: &str)
    where
        T: Tolerance,
    {
        let (want_q, want_k, want_v) = self.reference();
        assert_close(q, &want_q, &format!("{what} Q"));
        assert_close(k, &want_k, &format!("{what} K"));
        // V is copied: exact.
        assert_eq!(wide(v), want_v, "{what} V");
        let past = (self.l - self.t) * self.d;
        for b in 0..self.b {
            let rows = b * self.l * self.d..b * self.l * self.d + past;
            assert!(
                k[rows.clone()] == self.k[rows.clone()],
                "{what}: K's earlier rows changed"
            );
            assert!(
                v[rows.clone()] == self.v[rows],
                "{what}: V's earlier rows changed"
            );
        }
    }
}

impl<T: Element> OpCase<T> for QkvCase<T> {
    const OP: Op = Op::QkvNormRopeCache;

    fn attrs(&self) -> Attrs {
        Attrs {
            epsilon: self.eps,
            num_heads: self.heads,
            silu: false,
        }
    }

    fn shapes(&self) -> Vec<Vec<i64>> {
        let (b, t, l, d) = (self.b as i64, self.t as i64, self.l as i64, self.d as i64);
        let mut shapes = vec![vec![b, t, 3 * d], vec![d], vec![d], vec![d], vec![d]];
        shapes.extend([self.table_shape.clone(), self.table_shape.clone()]);
        shapes.extend([vec![b, l, d], vec![b, l, d]]);
        shapes
    }

    fn inputs(&self) -> Vec<&[T]> {
        let mut inputs: Vec<&[T]> = vec![&self.qkv];
        inputs.extend(self.params.iter().map(Vec::as_slice));
        inputs.extend([&self.cos[..], &self.sin, &self.k, &self.v]);
        inputs
    }

    fn written(&self) -> usize {
        // Q and the block's rows of K and V.
        self.qkv.len()
    }
}

/// (B, T, L, D), num_heads, Tc: one entry with a past; two entries, one with no past (L = T); the
/// VAE-sized D = 96 with four heads; tables shorter than T (rows repeat them).
const QKV_CASES: [([usize; 4], usize, usize); 4] = [
    ([1, 6, 10, 16], 2, 6),
    ([2, 3, 3, 8], 1, 3),
    ([2, 5, 12, 96], 4, 5),
    ([1, 8, 11, 16], 2, 2),
];

fn check_qkv_cpu<T: Tolerance>() {
    let mut rng = Rng(7);
    for (sizes, heads, tc) in QKV_CASES {
        let case = QkvCase::<T>::new(&mut rng, sizes, heads, tc);
        let (q, k, v) = case.cpu();
        let what = format!("{} QkvNormRopeCache {sizes:?}", std::any::type_name::<T>());
        case.assert_matches((&q, &k, &v), &what);
    }
}

#[test]
fn qkv_norm_rope_cache_matches_the_reference_and_keeps_the_earlier_rows() {
    check_qkv_cpu::<f32>();
    check_qkv_cpu::<f16>();
}

/// The attributes of the operators that have none (BiasGelu, MatMulBiasGelu).
const NO_ATTRS: Attrs = Attrs {
    epsilon: 0.0,
    num_heads: 0,
    silu: false,
};

/// One BiasGelu case: X, bias and the reference.
struct GeluCase<T> {
    x_shape: Vec<i64>,
    x: Vec<T>,
    bias: Vec<T>,
}

impl<T: Element> GeluCase<T> {
    /// X over [-6, 6] (both tails of tanh), bias in [-1, 1].
    fn new(rng: &mut Rng, x_shape: &[i64]) -> Self {
        let d = *x_shape.last().unwrap() as usize;
        Self {
            x_shape: x_shape.to_vec(),
            x: rng.vec(shape_numel(x_shape), -6.0, 6.0),
            bias: rng.vec(d, -1.0, 1.0),
        }
    }

    /// `reference_gelu(X + bias)` in float64.
    fn reference(&self) -> Vec<f64> {
        let d = self.bias.len();
        let bias = wide(&self.bias);
        wide(&self.x)
            .iter()
            .enumerate()
            .map(|(i, &x)| reference_gelu(x + bias[i % d]))
            .collect()
    }

    fn cpu(&self) -> Vec<T> {
        let plan = self.plan();
        let mut y = vec![T::from_f32(0.0); self.x.len()];
        cpu::bias_gelu(&plan, &self.x, &self.bias, &mut y);
        y
    }
}

impl<T: Element> OpCase<T> for GeluCase<T> {
    const OP: Op = Op::BiasGelu;

    fn attrs(&self) -> Attrs {
        NO_ATTRS
    }

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

const GELU_SHAPES: [&[i64]; 4] = [&[2, 3, 16], &[5, 7], &[1, 4, 8960], &[3, 1, 100]];

fn check_gelu_cpu<T: Tolerance>() {
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

/// One MatMulBiasGelu case: X [..., K], W [N, K], bias [N] and the reference.
struct MatMulGeluCase<T> {
    x_shape: Vec<i64>,
    n: usize,
    x: Vec<T>,
    w: Vec<T>,
    bias: Vec<T>,
}

impl<T: Element> MatMulGeluCase<T> {
    /// X in [-2, 2], W in ±sqrt(3/K) (products of a few units: both tails of the GELU), bias in
    /// [-1, 1].
    fn new(rng: &mut Rng, x_shape: &[i64], n: usize) -> Self {
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

    fn k(&self) -> usize {
        *self.x_shape.last().unwrap() as usize
    }

    /// `GELU(Σ_k X[r, k]·W[n, k] + bias[n])` in float64.
    fn reference(&self) -> Vec<f64> {
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

    fn y_shape(&self) -> Vec<i64> {
        let mut shape = self.x_shape.clone();
        *shape.last_mut().unwrap() = self.n as i64;
        shape
    }

    fn cpu(&self) -> Vec<T> {
        let plan = self.plan();
        let mut y = vec![T::from_f32(0.0); plan.rows * self.n];
        cpu::matmul_bias_gelu(&plan, &self.x, &self.w, &self.bias, &mut y);
        y
    }
}

impl<T: Element> OpCase<T> for MatMulGeluCase<T> {
    const OP: Op = Op::MatMulBiasGelu;

    fn attrs(&self) -> Attrs {
        NO_ATTRS
    }

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
const MATMUL_GELU_CASES: [(&[i64], usize); 5] = [
    (&[2, 3, 16], 24),
    (&[1, 7], 5),
    (&[5, 13], 9),
    (&[1, 84, 64], 128),
    (&[3, 1536], 40),
];

fn check_matmul_gelu_cpu<T: Tolerance>() {
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

struct AttentionCase<T> {
    q_shape: Vec<i64>,
    kv_shape: Vec<i64>,
    heads: usize,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
}

impl<T: Element> AttentionCase<T> {
    /// Q `[B, S, D]` in [-3, 3] (scores of a few units: a peaked softmax), K and V `[B, L, D]` in
    /// [-1, 1].
    fn new(rng: &mut Rng, [b, s, l, d]: [usize; 4], heads: usize) -> Self {
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
    fn reference(&self) -> Vec<f64> {
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

    fn cpu(&self) -> Vec<T> {
        let plan = self.plan();
        let mut o = vec![T::from_f32(0.0); self.q.len()];
        cpu::attention(&plan, &self.q, &self.k, &self.v, &mut o);
        o
    }
}

impl<T: Element> OpCase<T> for AttentionCase<T> {
    const OP: Op = Op::Attention;

    fn attrs(&self) -> Attrs {
        Attrs {
            num_heads: self.heads,
            ..NO_ATTRS
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
const ATTENTION_CASES: [([usize; 4], usize); 5] = [
    ([2, 5, 7, 8], 2),
    ([1, 1, 1, 4], 1),
    ([1, 9, 3, 12], 3),
    ([1, 84, 252, 64], 2),
    ([1, 6, 40, 128], 1),
];

fn check_attention_cpu<T: Tolerance>() {
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

/// One CausalConv3d case: X `[N, T, H, W, C]` in [-1, 1], W `[K, kT, kH, kW, C]` in
/// [-0.5, 0.5].
struct ConvCase<T> {
    x_shape: Vec<i64>,
    w_shape: Vec<i64>,
    x: Vec<T>,
    w: Vec<T>,
}

impl<T: Element> ConvCase<T> {
    fn new(rng: &mut Rng, x_shape: [usize; 5], [k, kt, kh, kw]: [usize; 4]) -> Self {
        let w_shape = [k, kt, kh, kw, x_shape[4]];
        Self {
            x: rng.vec(x_shape.iter().product(), -1.0, 1.0),
            w: rng.vec(w_shape.iter().product(), -0.5, 0.5),
            x_shape: x_shape.iter().map(|&v| v as i64).collect(),
            w_shape: w_shape.iter().map(|&v| v as i64).collect(),
        }
    }

    /// `[N, T − kT + 1, H, W, K]`.
    fn y_shape(&self) -> Vec<i64> {
        let (x, w) = (&self.x_shape, &self.w_shape);
        vec![x[0], x[1] - w[1] + 1, x[2], x[3], w[0]]
    }

    /// The contract's sum in float64: taps outside the frame in space read zeros, time is not
    /// padded.
    fn reference(&self) -> Vec<f64> {
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

    fn cpu(&self) -> Vec<T> {
        let plan = self.plan();
        let mut y = vec![T::from_f32(f32::NAN); plan.rows * plan.cols];
        cpu::causal_conv3d(&plan, &self.x, &self.w, &mut y);
        y
    }
}

impl<T: Element> OpCase<T> for ConvCase<T> {
    const OP: Op = Op::CausalConv3d;

    fn attrs(&self) -> Attrs {
        NO_ATTRS
    }

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
const CONV_CASES: [([usize; 5], [usize; 4]); 6] = [
    ([1, 4, 5, 6, 8], [8, 3, 3, 3]),
    ([2, 3, 4, 3, 5], [7, 1, 1, 1]),
    ([1, 1, 3, 7, 4], [6, 1, 3, 3]),
    ([1, 3, 2, 5, 3], [4, 3, 1, 1]),
    ([1, 2, 1, 2, 2], [3, 1, 3, 5]),
    ([1, 6, 16, 28, 8], [8, 3, 3, 3]),
];

fn check_conv_cpu<T: Tolerance>() {
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
            (plan.rows, plan.d, plan.cols, plan.conv.out_t()),
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
    let op = Op::CausalConv3d;
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
        let e = plan_error(op, NO_ATTRS, &[x, w]);
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
    assert_eq!(
        conv::parse_choice(&conv::format_choice(7, 62)),
        Some((7, 62))
    );
    for bad in [
        "",
        "plan 7",
        "plan x engine 62",
        "engine 62 plan 7",
        "plan 7 engine 62 more",
        "plan -1 engine 62",
    ] {
        assert_eq!(conv::parse_choice(bad), None, "{bad:?}");
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
    let file = conv::choice_file(dir, kind, &dims, true);
    assert_eq!(
        file,
        dir.join("sm90-132sms-cudnn91900-f16-x1x6x480x832x96-w96x3x3x3.txt")
    );
    assert_ne!(file, conv::choice_file(dir, kind, &dims, false));
    assert_ne!(
        file,
        conv::choice_file(dir, "sm80-108sms-cudnn91900", &dims, true)
    );
    let wider = ConvDims { k: 128, ..dims };
    assert_ne!(file, conv::choice_file(dir, kind, &wider, true));
}

/// A kept choice is taken only where the heuristics still offer the same engine at its place; a
/// missing or garbled file is no choice; keeping one makes its directory and leaves no temporary.
#[test]
fn causal_conv3d_takes_a_kept_choice_only_for_the_same_engine() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cudnn_conv").join("choice.txt");
    assert_eq!(conv::kept_choice(&file, &[62, 62, 58]), None);
    conv::keep_choice(&file, 1, 62).unwrap();
    assert_eq!(conv::kept_choice(&file, &[62, 62, 58]), Some(1));
    assert_eq!(conv::kept_choice(&file, &[62, 58, 62]), None);
    assert_eq!(conv::kept_choice(&file, &[62]), None);
    let names: Vec<_> = std::fs::read_dir(file.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["choice.txt"]);
    std::fs::write(&file, "plan one engine 62\n").unwrap();
    assert_eq!(conv::kept_choice(&file, &[62, 62]), None);
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
    let times = conv::time_in_order(plans.len(), |i, runs| {
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
    assert_eq!(conv::fastest(&times), Some(2));
    assert_eq!(conv::fastest(&[None, Some(2.0), Some(2.0)]), Some(1));
    assert_eq!(conv::fastest(&[None, None]), None);
}

/// The split of a call's rows (attention.rs) on an H200 (132 SMs, two thread blocks of 64 rows
/// each per SM: 264 per wave).
#[test]
fn the_attention_splits_only_a_partial_last_wave() {
    use attention::{MAX_PARTS, Split, split};
    let h200 = |rows, keys, max_parts| split(1, rows, keys, 12, 132, true, max_parts);
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
        split(1, 4680, 18720, 12, 132, false, MAX_PARTS),
        whole(4680)
    );
    assert_eq!(split(2, 4680, 18720, 12, 132, true, MAX_PARTS), whole(4680));
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

fn plan_of(op: Op, attrs: &Attrs, shapes: &[Vec<i64>]) -> Plan {
    let shapes: Vec<&[i64]> = shapes.iter().map(Vec::as_slice).collect();
    plan(op, attrs, &shapes).unwrap()
}

/// (X shape, num_heads, Tc): Tc = the rows, Tc dividing the rows (a batch of 2), Tc = 1.
const ROPE_CASES: [(&[i64], usize, usize); 4] = [
    (&[1, 6, 64], 4, 6),
    (&[2, 5, 64], 2, 5),
    (&[3, 32], 1, 1),
    (&[1, 4, 1, 48], 3, 4),
];

/// (X shape, gate, scale, shift shapes): F = 1 and F = 3 in every position and layout.
const GRLN_CASES: [(&[i64], [&[i64]; 3]); 4] = [
    (&[1, 12, 64], [&[64], &[1, 3, 1, 64], &[3, 64]]),
    (&[1, 12, 64], [&[3, 64], &[64], &[1, 1, 64]]),
    (&[2, 3, 32], [&[6, 32], &[2, 1, 32], &[1, 3, 1, 32]]),
    (&[5, 16], [&[16], &[16], &[16]]),
];

fn check_rope_cpu<T: Tolerance>() {
    let mut rng = Rng(1);
    // The test shapes, and wan-1.3b's (N = 4680 tokens, D = 1536, 12 heads).
    for (x_shape, heads, tc) in ROPE_CASES
        .into_iter()
        .chain([(&[1, 4680, 1536][..], 12, 4680)])
    {
        let case = RopeCase::<T>::new(&mut rng, x_shape, heads, tc);
        let plan = case.plan();
        assert_eq!(plan.table_rows, tc);
        let mut y = vec![T::from_f32(0.0); case.x.len()];
        let i = case.inputs();
        cpu::bias_rms_norm(
            &plan,
            case.eps,
            i[0],
            i[1],
            i[2],
            Epilogue::Rope(i[3], i[4]),
            &mut y,
        );
        assert_close(&y, &case.reference(), &format!("Y of {x_shape:?}"));
    }
}

/// BiasRmsNorm shapes: odd D, D = 64 and 96 (the VAE's channels-last rows), wan-1.3b's 1536.
const RMS_SHAPES: [&[i64]; 7] = [
    &[7, 64],
    &[3, 4, 32],
    &[5, 15],
    &[1, 1, 1, 8],
    &[2, 3, 5, 64],
    &[1, 4, 30, 52, 96],
    &[1, 4680, 1536],
];

fn check_rms_norm_cpu<T: Tolerance>() {
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

fn check_grln_cpu<T: Tolerance>() {
    let mut rng = Rng(3);
    let frame: &[i64] = &[1, 3, 1, 1536];
    for (x_shape, params) in GRLN_CASES
        .into_iter()
        .chain([(&[1, 4680, 1536][..], [frame, frame, &[1536][..]])])
    {
        let case = GrlnCase::<T>::new(&mut rng, x_shape, params);
        let plan = case.plan();
        let mut s = vec![T::from_f32(0.0); case.x.len()];
        let mut y = vec![T::from_f32(0.0); case.x.len()];
        let i = case.inputs();
        cpu::gated_residual_layer_norm(
            &plan, case.eps, i[0], i[1], i[2], i[3], i[4], i[5], &mut s, &mut y,
        );
        let (want_s, want_y) = case.reference();
        assert_close(&s, &want_s, &format!("S of {x_shape:?} {params:?}"));
        assert_close(&y, &want_y, &format!("Y of {x_shape:?} {params:?}"));
    }
}

#[test]
fn bias_rms_norm_rope_matches_the_reference() {
    check_rope_cpu::<f32>();
    check_rope_cpu::<f16>();
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
    let attrs = Attrs {
        epsilon: 0.0,
        num_heads: 0,
        silu: true,
    };
    let plan = plan_of(Op::BiasRmsNorm, &attrs, &[vec![1, 4], vec![4], vec![4]]);
    let mut y = [0f32; 4];
    cpu::bias_rms_norm(&plan, 0.0, &x, &[0.0; 4], &weight, Epilogue::Silu, &mut y);
    assert_eq!(y[2], 100.0);
    assert_eq!(y[3], 0.0);
    assert!(y[3].is_sign_negative());
    let sigmoid_1 = 1.0 / (1.0 + (-1f64).exp());
    assert!((y[0] as f64 - sigmoid_1).abs() < 1e-7, "{}", y[0]);
    assert!((y[1] as f64 + (1.0 - sigmoid_1)).abs() < 1e-7, "{}", y[1]);
}

#[test]
fn gated_residual_layer_norm_matches_the_reference() {
    check_grln_cpu::<f32>();
    check_grln_cpu::<f16>();
}

/// The float16 S output is the float32 value rounded once, and the norm reads S as stored:
/// R + X = [1000.2, −1000, 0, 0] is stored as [1000, −1000, 0, 0] (float16 steps by 0.5 there), so
/// the mean is 0 and Y[2] = Y[3] = 0 exactly; normalising the unrounded sum would give a mean of
/// 0.05 and Y[2] ≈ −7e-5, which float16 represents.
#[test]
fn gated_residual_layer_norm_normalises_s_as_stored() {
    let h = |v: [f32; 4]| v.map(f16::from_f32).to_vec();
    let r = h([1000.0, -1000.0, 0.0, 0.0]);
    let x = h([0.2, 0.0, 0.0, 0.0]);
    let (ones, zeros) = (h([1.0; 4]), h([0.0; 4]));
    let shapes = [vec![1, 4], vec![1, 4], vec![4], vec![4], vec![4], vec![4]];
    let attrs = Attrs {
        epsilon: 0.0,
        num_heads: 0,
        silu: false,
    };
    let plan = plan_of(Op::GatedResidualLayerNorm, &attrs, &shapes);
    let (mut s, mut y) = (zeros.clone(), zeros.clone());
    cpu::gated_residual_layer_norm(
        &plan, 0.0, &r, &x, &zeros, &ones, &ones, &zeros, &mut s, &mut y,
    );
    assert_eq!(s, h([1000.0, -1000.0, 0.0, 0.0]));
    assert_eq!(
        y,
        h([
            std::f32::consts::SQRT_2,
            -std::f32::consts::SQRT_2,
            0.0,
            0.0
        ])
    );
}

#[test]
fn row_parameters_map_rows_to_blocks_in_order() {
    // N = 6 rows, F = 3: rows 0-1 use block 0, 2-3 block 1, 4-5 block 2 (not r % F).
    let attrs = Attrs {
        epsilon: 0.0,
        num_heads: 0,
        silu: false,
    };
    let d = 2;
    let shapes = [
        vec![6, 2],
        vec![6, 2],
        vec![2],
        vec![3, 2],
        vec![2],
        vec![2],
    ];
    let plan = plan_of(Op::GatedResidualLayerNorm, &attrs, &shapes);
    assert_eq!(plan.divs, [2, 6, 6]);
    let r = vec![0f32; 12];
    let x: Vec<f32> = (0..6).flat_map(|_| [1.0, -1.0]).collect();
    let gate: Vec<f32> = vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0];
    let (ones, zeros) = (vec![1f32; d], vec![0f32; d]);
    let (mut s, mut y) = (vec![0f32; 12], vec![0f32; 12]);
    cpu::gated_residual_layer_norm(
        &plan, 0.0, &r, &x, &zeros, &gate, &ones, &zeros, &mut s, &mut y,
    );
    assert_eq!(s, [1., -1., 1., -1., 2., -2., 2., -2., 3., -3., 3., -3.]);
}

fn plan_error(op: Op, attrs: Attrs, shapes: &[&[i64]]) -> String {
    plan(op, &attrs, shapes).unwrap_err()
}

#[test]
fn contract_violations_name_the_operator_the_input_and_the_shapes() {
    let plain = Attrs {
        epsilon: 1e-6,
        num_heads: 0,
        silu: false,
    };
    // A row parameter whose numel is not a multiple of D.
    let e = plan_error(
        Op::GatedResidualLayerNorm,
        plain,
        &[&[1, 6, 8], &[1, 6, 8], &[8], &[8], &[1, 2, 7], &[8]],
    );
    assert!(e.contains("ai.unstep GatedResidualLayerNorm"), "{e}");
    assert!(
        e.contains("row parameter scale has shape [1, 2, 7] (14 elements)"),
        "{e}"
    );
    assert!(e.contains("D = 8") && e.contains("[1, 6, 8]"), "{e}");
    // F that does not divide N.
    let e = plan_error(
        Op::GatedResidualLayerNorm,
        plain,
        &[&[1, 6, 8], &[1, 6, 8], &[8], &[4, 8], &[8], &[8]],
    );
    assert!(e.contains("row parameter gate has shape [4, 8]"), "{e}");
    assert!(e.contains("F = 4") && e.contains("N = 6 rows"), "{e}");
    // R's shape.
    let e = plan_error(
        Op::GatedResidualLayerNorm,
        plain,
        &[&[6, 8], &[1, 6, 8], &[8], &[8], &[8], &[8]],
    );
    assert!(
        e.contains("input R has shape [6, 8] and X [1, 6, 8]"),
        "{e}"
    );
    // Attention: heads that do not split D in even halves, K with other leading axes or width
    // than Q, V unlike K.
    let heads = |num_heads| Attrs { num_heads, ..plain };
    let e = plan_error(
        Op::Attention,
        heads(3),
        &[&[1, 4, 8], &[1, 6, 8], &[1, 6, 8]],
    );
    assert!(
        e.contains("ai.unstep Attention") && e.contains("D = 8 (from Q [1, 4, 8])"),
        "{e}"
    );
    for k in [&[2, 6, 8][..], &[1, 6, 16], &[6, 8], &[1, 0, 8]] {
        let e = plan_error(Op::Attention, heads(2), &[&[1, 4, 8], k, k]);
        assert!(
            e.contains(&format!("input K has shape {k:?}; with Q [1, 4, 8]")),
            "{e}"
        );
    }
    let e = plan_error(
        Op::Attention,
        heads(2),
        &[&[1, 4, 8], &[1, 6, 8], &[1, 5, 8]],
    );
    assert!(
        e.contains("input V has shape [1, 5, 8] and K [1, 6, 8]"),
        "{e}"
    );
    // A prefix of another shape than X's off axis 1, and an X with a batch axis.
    for (x, prefix) in [
        (&[1, 4, 3, 8][..], &[1, 2, 5, 8][..]),
        (&[1, 4, 8], &[1, 2, 3, 8]),
        (&[2, 4, 8], &[2, 2, 8]),
        (&[8][..], &[8][..]),
    ] {
        let e = plan_error(Op::PrefixBiasRmsNorm, plain, &[x, &[8], &[8], prefix]);
        assert!(
            e.contains(&format!(
                "ai.unstep PrefixBiasRmsNorm: input prefix has shape {prefix:?} and X {x:?}"
            )) && e.contains("axis 0 of size 1"),
            "{e}"
        );
    }
    // bias of the wrong size.
    let e = plan_error(Op::BiasRmsNorm, plain, &[&[3, 8], &[3, 8], &[8]]);
    assert!(
        e.contains("ai.unstep BiasRmsNorm: input bias has shape [3, 8] (24 elements)"),
        "{e}"
    );
    // Rope: D not a multiple of 2·num_heads, and tables of the wrong size.
    let rope = Attrs {
        epsilon: 1e-6,
        num_heads: 3,
        silu: false,
    };
    let e = plan_error(
        Op::BiasRmsNormRope,
        rope,
        &[&[2, 16], &[16], &[16], &[2, 2], &[2, 2]],
    );
    assert!(
        e.contains("BiasRmsNormRope: D = 16") && e.contains("2·num_heads = 6"),
        "{e}"
    );
    let rope = Attrs {
        epsilon: 1e-6,
        num_heads: 2,
        silu: false,
    };
    let e = plan_error(
        Op::BiasRmsNormRope,
        rope,
        &[&[2, 16], &[16], &[16], &[2, 3], &[2, 3]],
    );
    assert!(
        e.contains("input cos has shape [2, 3] (6 elements)") && e.contains("hd/2 = 4"),
        "{e}"
    );
    let e = plan_error(
        Op::BiasRmsNormRope,
        rope,
        &[&[2, 16], &[16], &[16], &[2, 4], &[1, 4]],
    );
    assert!(
        e.contains("input sin has shape [1, 4] and cos [2, 4]"),
        "{e}"
    );
    // QkvNormRopeCache: QKV's last axis not 3·D, a cache shorter than the block or of another
    // batch, V unlike K.
    let qkv = |qkv: &'static [i64], k: &'static [i64], v: &'static [i64]| -> Vec<&'static [i64]> {
        vec![
            qkv,
            &[8],
            &[8],
            &[8],
            &[8],
            &[1, 4, 1, 2],
            &[1, 4, 1, 2],
            k,
            v,
        ]
    };
    let cases: [([&'static [i64]; 3], &[&str]); 4] = [
        (
            [&[1, 4, 25], &[1, 6, 8], &[1, 6, 8]],
            &["QkvNormRopeCache: QKV has shape [1, 4, 25]", "3·D"],
        ),
        (
            [&[1, 4, 24], &[1, 3, 8], &[1, 3, 8]],
            &["input K has shape [1, 3, 8]", "L ≥ T = 4"],
        ),
        (
            [&[2, 4, 24], &[1, 6, 8], &[1, 6, 8]],
            &["input K has shape [1, 6, 8]", "2·L·8"],
        ),
        (
            [&[1, 4, 24], &[1, 6, 8], &[1, 5, 8]],
            &["input V has shape [1, 5, 8] and K [1, 6, 8]"],
        ),
    ];
    for ([x, k, v], wanted) in cases {
        let e = plan_error(Op::QkvNormRopeCache, rope, &qkv(x, k, v));
        assert!(wanted.iter().all(|w| e.contains(w)), "{e}");
    }
    let ok = plan(
        Op::QkvNormRopeCache,
        &rope,
        &qkv(&[2, 4, 24], &[2, 6, 8], &[2, 6, 8]),
    )
    .unwrap();
    assert_eq!(
        (
            ok.rows,
            ok.d,
            ok.block_rows,
            ok.cache_rows,
            ok.half_hd,
            ok.table_rows
        ),
        (8, 8, 4, 6, 2, 4)
    );
    // MatMulBiasGelu: W of another K, or not a matrix; bias not of N elements.
    let none = NO_ATTRS;
    for w in [&[24, 8][..], &[24, 16, 1], &[0, 16]] {
        let e = plan_error(Op::MatMulBiasGelu, none, &[&[2, 3, 16], w, &[24]]);
        assert!(
            e.contains(&format!(
                "ai.unstep MatMulBiasGelu: input W has shape {w:?}; with X [2, 3, 16] it must be [N, 16]"
            )),
            "{e}"
        );
    }
    let e = plan_error(Op::MatMulBiasGelu, none, &[&[2, 3, 16], &[24, 16], &[16]]);
    assert!(
        e.contains("input bias has shape [16]; it must have N = 24 elements"),
        "{e}"
    );
    // X without a last axis.
    let e = plan_error(Op::BiasRmsNorm, plain, &[&[4, 0], &[0], &[0]]);
    assert!(e.contains("X has shape [4, 0]"), "{e}");
    // Valid shapes: every layout of a row parameter.
    let ok = plan(
        Op::GatedResidualLayerNorm,
        &plain,
        &[&[1, 6, 8], &[1, 6, 8], &[8], &[1, 3, 1, 8], &[6, 8], &[8]],
    )
    .unwrap();
    assert_eq!((ok.rows, ok.d, ok.divs), (6, 8, [2, 1, 6]));
}

#[test]
fn no_rows_is_no_work() {
    let attrs = Attrs {
        epsilon: 1e-6,
        num_heads: 0,
        silu: false,
    };
    let plan = plan(Op::BiasRmsNorm, &attrs, &[&[0, 8], &[8], &[8]]).unwrap();
    assert_eq!((plan.rows, plan.d), (0, 8));
    let mut y: Vec<f32> = Vec::new();
    cpu::bias_rms_norm(
        &plan,
        1e-6,
        &[],
        &[0.0; 8],
        &[1.0; 8],
        Epilogue::Plain,
        &mut y,
    );
}

// --- Through ONNX Runtime (CPU provider) -------------------------------------------------------

fn onnx_type<T: Element>() -> TensorElementType {
    T::into_tensor_element_type()
}

/// A session of one node of `op` with the CPU kernels registered.
fn session<T: Element>(op: Op, attrs: &[Attr]) -> ort::Result<Session> {
    let runtime = ort_lib::runtime(None).expect(
        "ONNX Runtime: run through scripts/test (or set UNSTEP_ORT_CACHE_DIR / ORT_DYLIB_PATH)",
    );
    let model = onnx_graph::custom_node(
        DOMAIN,
        op.name(),
        onnx_type::<T>(),
        op.inputs(),
        op.outputs(),
        attrs,
    );
    Session::builder(&runtime.environment)?
        .with_intra_threads(1)?
        .with_operators(operator_domain(false)?)?
        .commit_from_memory(&model)
}

/// Runs `session` on `inputs` (in the operator's input order) and returns its outputs.
fn run<T: Element>(
    session: &mut Session,
    op: Op,
    shapes: &[Vec<i64>],
    inputs: &[&[T]],
) -> ort::Result<Vec<(Vec<i64>, Vec<T>)>> {
    let values: Vec<(&str, Tensor<T>)> = op
        .inputs()
        .iter()
        .zip(shapes.iter().zip(inputs))
        .map(|(name, (shape, data))| {
            Ok((*name, Tensor::from_array((shape.clone(), data.to_vec()))?))
        })
        .collect::<ort::Result<_>>()?;
    let outputs = session.run(values)?;
    op.outputs()
        .iter()
        .map(|name| {
            let (shape, data) = outputs[*name].try_extract_tensor::<T>()?;
            Ok((shape.to_vec(), data.to_vec()))
        })
        .collect()
}

fn check_through_onnx_runtime<T: Tolerance>() {
    let mut rng = Rng(4);
    let t = std::any::type_name::<T>();

    let (x_shape, heads, tc) = ROPE_CASES[1];
    let case = RopeCase::<T>::new(&mut rng, x_shape, heads, tc);
    let attrs = [
        Attr::Float("epsilon", case.eps),
        Attr::Int("num_heads", heads as i64),
    ];
    let mut s = session::<T>(Op::BiasRmsNormRope, &attrs).unwrap();
    let out = run(&mut s, Op::BiasRmsNormRope, &case.shapes(), &case.inputs()).unwrap();
    assert_eq!(out[0].0, x_shape);
    assert_close(
        &out[0].1,
        &case.reference(),
        &format!("{t} BiasRmsNormRope Y"),
    );

    // No silu attribute (plain), silu = 0 (plain) and silu = 1 (SiLU after the norm).
    for (x_shape, silu) in [
        (&[2, 3, 48][..], None),
        (&[1, 2, 3, 96], Some(0)),
        (&[1, 2, 3, 5, 96], Some(1)),
    ] {
        let case = RmsCase::<T>::new(&mut rng, x_shape, silu == Some(1));
        let mut attrs = vec![Attr::Float("epsilon", case.eps)];
        attrs.extend(silu.map(|v| Attr::Int("silu", v)));
        let mut s = session::<T>(Op::BiasRmsNorm, &attrs).unwrap();
        let out = run(&mut s, Op::BiasRmsNorm, &case.shapes(), &case.inputs()).unwrap();
        assert_eq!(out[0].0, x_shape);
        assert_close(
            &out[0].1,
            &case.reference(),
            &format!("{t} BiasRmsNorm Y, silu {silu:?}"),
        );
    }

    // BiasGelu has no attributes.
    let case = GeluCase::<T>::new(&mut rng, GELU_SHAPES[0]);
    let mut s = session::<T>(Op::BiasGelu, &[]).unwrap();
    let out = run(&mut s, Op::BiasGelu, &case.shapes(), &case.inputs()).unwrap();
    assert_eq!(out[0].0, GELU_SHAPES[0]);
    assert_close(&out[0].1, &case.reference(), &format!("{t} BiasGelu Y"));

    // MatMulBiasGelu: Y has N on its last axis (from W's axis 0).
    let (shape, n) = MATMUL_GELU_CASES[0];
    let case = MatMulGeluCase::<T>::new(&mut rng, shape, n);
    let mut s = session::<T>(Op::MatMulBiasGelu, &[]).unwrap();
    let out = run(&mut s, Op::MatMulBiasGelu, &case.shapes(), &case.inputs()).unwrap();
    assert_eq!(out[0].0, case.y_shape());
    assert_close(
        &out[0].1,
        &case.reference(),
        &format!("{t} MatMulBiasGelu Y"),
    );

    // PrefixBiasRmsNorm: Y's axis 1 is the prefix's plus X's.
    for (x_shape, p) in [(&[1, 4, 3, 5, 96][..], 2), (&[1, 7, 64], 0)] {
        let case = PrefixCase::<T>::new(&mut rng, x_shape, p, true);
        let attrs = [Attr::Float("epsilon", case.rms.eps), Attr::Int("silu", 1)];
        let mut s = session::<T>(Op::PrefixBiasRmsNorm, &attrs).unwrap();
        let out = run(
            &mut s,
            Op::PrefixBiasRmsNorm,
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

    // Attention: O has Q's shape.
    let case = AttentionCase::<T>::new(&mut rng, [2, 5, 7, 8], 2);
    let mut s = session::<T>(Op::Attention, &[Attr::Int("num_heads", 2)]).unwrap();
    let out = run(&mut s, Op::Attention, &case.shapes(), &case.inputs()).unwrap();
    assert_eq!(out[0].0, case.q_shape);
    assert_close(&out[0].1, &case.reference(), &format!("{t} Attention O"));

    // CausalConv3d: Y has T − kT + 1 frames and K channels.
    let (x_shape, kernel) = CONV_CASES[0];
    let case = ConvCase::<T>::new(&mut rng, x_shape, kernel);
    let mut s = session::<T>(Op::CausalConv3d, &[]).unwrap();
    let out = run(&mut s, Op::CausalConv3d, &case.shapes(), &case.inputs()).unwrap();
    assert_eq!(out[0].0, case.y_shape());
    assert_close(&out[0].1, &case.reference(), &format!("{t} CausalConv3d Y"));

    let (x_shape, params) = GRLN_CASES[0];
    let case = GrlnCase::<T>::new(&mut rng, x_shape, params);
    let mut s = session::<T>(
        Op::GatedResidualLayerNorm,
        &[Attr::Float("epsilon", case.eps)],
    )
    .unwrap();
    let out = run(
        &mut s,
        Op::GatedResidualLayerNorm,
        &case.shapes(),
        &case.inputs(),
    )
    .unwrap();
    let (want_s, want_y) = case.reference();
    assert_eq!((&out[0].0[..], &out[1].0[..]), (x_shape, x_shape));
    assert_close(&out[0].1, &want_s, &format!("{t} GatedResidualLayerNorm S"));
    assert_close(&out[1].1, &want_y, &format!("{t} GatedResidualLayerNorm Y"));
}

/// Through ONNX Runtime, K and V are written where the caller's buffers are: the session reads
/// them in place (bound host memory on the CPU provider), as the DiT's attention after the node
/// does.
fn check_qkv_through_onnx_runtime<T: Tolerance>() {
    use ort::value::{TensorRef, TensorRefMut};
    let mut rng = Rng(8);
    let t = std::any::type_name::<T>();
    let case = QkvCase::<T>::new(&mut rng, QKV_CASES[2].0, QKV_CASES[2].1, QKV_CASES[2].2);
    let attrs = [
        Attr::Float("epsilon", case.eps),
        Attr::Int("num_heads", case.heads as i64),
    ];
    let mut session = session::<T>(Op::QkvNormRopeCache, &attrs).unwrap();
    let shapes = case.shapes();
    let inputs = case.inputs();
    let (mut k, mut v) = (case.k.clone(), case.v.clone());
    let mut values: Vec<(&str, ort::session::SessionInputValue<'_>)> = Vec::new();
    for (i, name) in Op::QkvNormRopeCache.inputs().iter().enumerate().take(7) {
        let view = TensorRef::from_array_view((shapes[i].clone(), inputs[i])).unwrap();
        values.push((*name, view.into()));
    }
    values.push((
        "K",
        TensorRefMut::from_array_view_mut((shapes[7].clone(), &mut k[..]))
            .unwrap()
            .into(),
    ));
    values.push((
        "V",
        TensorRefMut::from_array_view_mut((shapes[8].clone(), &mut v[..]))
            .unwrap()
            .into(),
    ));
    let outputs = session.run(values).unwrap();
    let (q_shape, q) = outputs["Q"].try_extract_tensor::<T>().unwrap();
    assert_eq!(
        &q_shape[..],
        &[case.b as i64, case.t as i64, case.d as i64],
        "{t} Q's shape"
    );
    let q = q.to_vec();
    drop(outputs);
    case.assert_matches(
        (&q, &k, &v),
        &format!("{t} QkvNormRopeCache through ONNX Runtime"),
    );
}

#[test]
fn qkv_norm_rope_cache_writes_the_callers_cache_through_onnx_runtime() {
    check_qkv_through_onnx_runtime::<f32>();
    check_qkv_through_onnx_runtime::<f16>();
}

#[test]
fn every_operator_runs_through_onnx_runtime() {
    check_through_onnx_runtime::<f32>();
    check_through_onnx_runtime::<f16>();
}

#[test]
fn a_bad_row_parameter_fails_the_run_naming_the_operator_and_the_input() {
    let mut rng = Rng(5);
    let case = GrlnCase::<f32>::new(&mut rng, &[1, 6, 16], [&[16], &[16], &[16]]);
    let mut shapes = case.shapes();
    let mut inputs = case.inputs();
    // shift of F = 4 blocks of D, which do not divide the 6 rows.
    let bad: Vec<f32> = rng.vec(4 * 16, -1.0, 1.0);
    shapes[5] = vec![4, 16];
    inputs[5] = &bad;
    let mut s =
        session::<f32>(Op::GatedResidualLayerNorm, &[Attr::Float("epsilon", 1e-6)]).unwrap();
    let e = run(&mut s, Op::GatedResidualLayerNorm, &shapes, &inputs)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ai.unstep GatedResidualLayerNorm"), "{e}");
    assert!(e.contains("row parameter shift has shape [4, 16]"), "{e}");
    // And a numel that is not a multiple of D.
    let odd: Vec<f32> = rng.vec(24, -1.0, 1.0);
    shapes[5] = vec![24];
    inputs[5] = &odd;
    let e = run(&mut s, Op::GatedResidualLayerNorm, &shapes, &inputs)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("row parameter shift has shape [24] (24 elements)"),
        "{e}"
    );
}

#[test]
fn a_missing_attribute_fails_the_session() {
    let Err(e) = session::<f32>(Op::BiasRmsNormRope, &[Attr::Float("epsilon", 1e-6)]) else {
        panic!("a BiasRmsNormRope node without num_heads was accepted");
    };
    let e = e.to_string();
    assert!(
        e.contains("ai.unstep BiasRmsNormRope") && e.contains("num_heads"),
        "{e}"
    );
}

#[test]
fn a_silu_other_than_0_or_1_fails_the_session() {
    let attrs = [Attr::Float("epsilon", 1e-6), Attr::Int("silu", 2)];
    let Err(e) = session::<f16>(Op::BiasRmsNorm, &attrs) else {
        panic!("a BiasRmsNorm node with silu = 2 was accepted");
    };
    let e = e.to_string();
    assert!(
        e.contains("ai.unstep BiasRmsNorm") && e.contains("silu = 2; it must be 0 or 1"),
        "{e}"
    );
}

/// Without the CUDA driver or NVRTC (this machine, CI), asking for the CUDA kernels is an error
/// that says what is missing and what to do, not a panic; with both it is a domain.
#[test]
fn the_cuda_domain_without_cuda_says_what_is_missing() {
    if let Err(e) = operator_domain(true) {
        let e = e.to_string();
        assert!(e.starts_with("unstep CUDA kernels: "), "{e}");
        assert!(
            e.contains("could not load") && e.contains("`--dit-kernels onnxruntime`"),
            "{e}"
        );
    }
}

/// MatMulBiasGelu's CUDA kernel refuses another element type before loading anything, and
/// without cuBLASLt or the CUDA driver (this machine, CI) says what is missing and what to do;
/// with both it is a kernel.
#[test]
fn the_matmul_kernel_says_what_it_cannot_do() {
    let e = gemm::GemmKernel::new(TensorElementType::Int8, 0)
        .err()
        .unwrap();
    assert!(
        e.contains("ai.unstep MatMulBiasGelu: element type Int8 is not supported"),
        "{e}"
    );
    if let Err(e) = gemm::GemmKernel::new(TensorElementType::Float16, 0) {
        assert!(
            e.contains("could not load") && e.contains("`--dit-kernels onnxruntime`"),
            "{e}"
        );
    }
}

/// Attention's CUDA kernel refuses float32 before loading anything (cuDNN's flash attention has
/// no float32 kernel), and without cuDNN or the CUDA driver (CI) says what is missing and what to
/// do; with them it is a kernel.
#[test]
fn the_attention_kernel_says_what_it_cannot_do() {
    let e = attention::AttentionKernel::new(TensorElementType::Float32, 0)
        .err()
        .unwrap();
    assert!(
        e.contains("ai.unstep Attention: element type Float32 is not supported on CUDA")
            && e.contains("fp16")
            && e.contains("`--dit-kernels onnxruntime`"),
        "{e}"
    );
    if let Err(e) = cudnn::check_cudnn() {
        assert!(
            e.contains("could not load cuDNN (libcudnn.so.9)")
                && e.contains("9.13.1")
                && e.contains("`--dit-kernels onnxruntime`"),
            "{e}"
        );
    }
    if let Err(e) = attention::AttentionKernel::new(TensorElementType::Float16, 0) {
        assert!(
            e.contains("could not load") && e.contains("`--dit-kernels onnxruntime`"),
            "{e}"
        );
    }
}

// --- The CUDA source ---------------------------------------------------------------------------

/// The host's launch sizes are the source's: `#define NAME value` of kernels.cu.
#[test]
fn the_launch_constants_are_the_sources() {
    let define = |name: &str| -> usize {
        let prefix = format!("#define {name} ");
        let line = cuda::SOURCE
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("kernels.cu has no #define {name}"));
        line[prefix.len()..].trim().parse().unwrap()
    };
    assert_eq!(define("WARP"), 32);
    assert_eq!(define("THREADS"), cuda::THREADS as usize);
    assert_eq!(define("GROUP_THREADS"), cuda::GROUP_THREADS as usize);
    assert_eq!(define("ROW_FLOATS"), cuda::ROW_FLOATS);
    assert_eq!(define("GROUP_UNITS"), cuda::GROUP_UNITS);
    assert_eq!((cuda::MAX_D, cuda::GROUP_MAX_D), (2048, 512));
    assert_eq!(define("MERGE_MAX_PARTS"), attention::MAX_PARTS);
    assert_eq!(define("MERGE_THREADS"), attention::MERGE_THREADS as usize);
}

/// The CUDA kernels load element pairs and the row operators keep a row in registers: an odd D
/// (a misaligned pair load on the device), or for a row operator one past `MAX_D`, is refused
/// before any launch.
#[test]
fn rows_the_cuda_kernels_cannot_take_are_refused_before_a_launch() {
    for d in [2, 96, 1536, cuda::MAX_D] {
        assert!(cuda::check_d(Op::BiasRmsNorm, d).is_ok(), "D = {d}");
    }
    for d in [1, 15, 1535, cuda::MAX_D + 2] {
        let error = cuda::check_d(Op::BiasRmsNorm, d).unwrap_err();
        assert!(
            error.contains(&format!("D = {d}")) && error.contains("even"),
            "{error}"
        );
    }
    // The elementwise BiasGelu keeps no row in registers: any even D (the FFN's 8960).
    assert!(cuda::check_d(Op::BiasGelu, 8960).is_ok());
    assert!(
        cuda::check_d(Op::BiasGelu, 7)
            .unwrap_err()
            .contains("even D")
    );
}

/// A group of threads per row, 16 bytes per access, up to D = 512 (the VAE's 96 to 384, the tiny
/// model's 16 to 64) where D is a multiple of 16 bytes and the tensors are aligned to it, with
/// the fewest lanes (a power of two) that take at most four accesses each; otherwise one block per row, of
/// 4-element accesses where D is a multiple of 4 and the tensors are aligned to 4 elements
/// (wan-1.3b's 1536), of pairs otherwise; the entry points' names.
#[test]
fn rows_take_the_widest_layout_their_size_and_alignment_allow() {
    use cuda::Layout;
    let group = |lanes| Layout::Group { lanes };
    // float16: 8 elements per access; float32: 4.
    for (d, elem, lanes) in [
        (8, 2, 1),
        (16, 2, 1),
        (64, 2, 2),
        (96, 2, 4),
        (192, 2, 8),
        (384, 2, 16),
        (512, 2, 16),
        (4, 4, 1),
        (16, 4, 1),
        (64, 4, 4),
        (96, 4, 8),
        (512, 4, 32),
    ] {
        assert_eq!(
            Layout::choose(d, elem, 16),
            group(lanes),
            "D = {d}, {elem} bytes"
        );
        assert_eq!(
            Layout::choose(d, elem, 256),
            group(lanes),
            "D = {d}, 256-aligned"
        );
        // Aligned to a pair only.
        assert_eq!(
            Layout::choose(d, elem, 2 * elem),
            Layout::Block,
            "D = {d}, pairs"
        );
    }
    use Layout::{Block, BlockQuad};
    for (d, elem, alignment, want) in [
        (1536, 2, 16, BlockQuad),
        (1536, 2, 8, BlockQuad),
        (1536, 4, 16, BlockQuad),
        (2048, 4, 16, BlockQuad),
        (100, 2, 16, BlockQuad),
        (520, 2, 8, BlockQuad),
        (2, 2, 16, Block),
        (2, 4, 16, Block),
        (514, 4, 16, Block),
        (1536, 2, 4, Block),
        (1000, 4, 8, Block),
        (1538, 2, 16, Block),
    ] {
        assert_eq!(
            Layout::choose(d, elem, alignment),
            want,
            "D = {d}, {elem} bytes, aligned to {alignment}"
        );
    }
    let name = |op, ty, layout| cuda::entry_point(op, ty, layout).unwrap();
    assert_eq!(
        name(Op::BiasRmsNorm, TensorElementType::Float16, group(16)),
        "unstep_bias_rms_norm_f16_g"
    );
    assert_eq!(
        name(
            Op::QkvNormRopeCache,
            TensorElementType::Float16,
            Layout::BlockQuad
        ),
        "unstep_qkv_norm_rope_cache_f16_q"
    );
    assert_eq!(
        name(
            Op::GatedResidualLayerNorm,
            TensorElementType::Float32,
            Layout::Block
        ),
        "unstep_gated_residual_layer_norm_f32"
    );
    assert!(cuda::entry_point(Op::BiasRmsNorm, TensorElementType::Int8, group(1)).is_none());
}

/// An elementwise launch (BiasGelu) takes the unit of the widest layout D and the alignment
/// allow, and blocks of that layout's entry points' size: 256 threads would exceed the block
/// layouts' `__launch_bounds__(128)` (the launch fails with CUDA_ERROR_INVALID_VALUE).
#[test]
fn elementwise_launches_match_their_entry_points() {
    use cuda::Layout;
    assert_eq!(
        Layout::choose_elementwise(8960, 2, 256),
        Layout::Group { lanes: 32 }
    );
    assert_eq!(Layout::choose_elementwise(100, 2, 256), Layout::BlockQuad);
    assert_eq!(Layout::choose_elementwise(6, 4, 256), Layout::Block);
    assert_eq!(Layout::choose_elementwise(8960, 2, 8), Layout::BlockQuad);
    let n = 4680 * 8960;
    assert_eq!(
        Layout::Group { lanes: 32 }.elementwise_dims(n, 2),
        (16384, cuda::GROUP_THREADS)
    );
    assert_eq!(
        Layout::BlockQuad.elementwise_dims(400, 2),
        (1, cuda::THREADS)
    );
    assert_eq!(Layout::Block.elementwise_dims(42, 4), (1, cuda::THREADS));
    assert_eq!(
        Layout::Block.elementwise_dims(2 * 128 * 3, 4),
        (3, cuda::THREADS)
    );
}

/// kernels.cu compiles with NVRTC, to PTX for compute_90 and to an sm_90 cubin (what sessions
/// load), with every entry point (both layouts) and without local memory (the rows stay in
/// registers). Needs
/// CUDA 13's NVRTC, not a GPU:
/// `LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib cargo test --release --lib nvrtc -- --ignored`.
#[test]
#[ignore = "needs libnvrtc.so.13 on LD_LIBRARY_PATH"]
fn nvrtc_compiles_the_kernels() {
    cuda::check_nvrtc().unwrap();
    let ptx = String::from_utf8(cuda::compile("compute_90").unwrap()).unwrap();
    let mut names: Vec<String> = cuda::OTHER_ENTRY_POINTS.map(String::from).to_vec();
    for op in Op::ALL
        .into_iter()
        .filter(|op| !(op.is_gemm() || *op == Op::Attention))
    {
        for ty in [TensorElementType::Float32, TensorElementType::Float16] {
            for layout in cuda::Layout::KINDS {
                names.push(cuda::entry_point(op, ty, layout).unwrap());
            }
        }
    }
    for name in names {
        assert!(
            ptx.contains(&format!(".entry {name}(")),
            "no entry point {name} in the PTX"
        );
    }
    assert!(
        !ptx.contains(".local"),
        "the kernels use local memory (a row spilled out of registers)"
    );
    let cubin = cuda::compile("sm_90").unwrap();
    assert_eq!(
        &cubin[..4],
        b"\x7fELF",
        "an sm_90 compile gives a cubin (ELF)"
    );
}

// --- The CUDA kernels on a GPU -----------------------------------------------------------------

mod gpu {
    use cudarc::driver::{result as driver, sys};

    use super::*;

    /// Device memory of a test, freed on drop.
    struct DeviceBuf(u64);

    impl Drop for DeviceBuf {
        fn drop(&mut self) {
            // SAFETY: allocated by `upload`, freed once.
            unsafe { driver::free_sync(self.0) }.unwrap();
        }
    }

    fn upload<T: Element>(data: &[T]) -> DeviceBuf {
        let bytes = std::mem::size_of_val(data).max(4);
        // SAFETY: a plain allocation and a copy of `data` into it, in the current context.
        unsafe {
            let buf = DeviceBuf(driver::malloc_sync(bytes).unwrap());
            driver::memcpy_htod_sync(buf.0, data).unwrap();
            buf
        }
    }

    fn download<T: Element>(buf: &DeviceBuf, n: usize) -> Vec<T> {
        let mut out = vec![T::from_f32(0.0); n];
        // SAFETY: `buf` holds at least `n` elements; the stream was synchronised.
        unsafe { driver::memcpy_dtoh_sync(&mut out, buf.0) }.unwrap();
        out
    }

    /// Runs the case's operator with the CUDA kernel on `stream` and returns its outputs, then the
    /// inputs it writes in place, and the mean time of one launch over `repeats` launches (after
    /// one untimed launch), in microseconds.
    fn run_cuda<T: Element, C: OpCase<T>>(
        case: &C,
        stream: sys::CUstream,
        repeats: usize,
    ) -> (Vec<Vec<T>>, f64) {
        let (op, attrs, inputs) = (C::OP, &case.attrs(), case.inputs());
        let plan = case.plan();
        let kernel = cuda::CudaKernel::new(op, T::into_tensor_element_type(), 0).unwrap();
        let n = plan.output_rows() * plan.d;
        let sentinel = vec![T::from_f32(f32::NAN); n];
        let bufs: Vec<DeviceBuf> = inputs
            .iter()
            .map(|data| upload(data))
            .chain(op.outputs().iter().map(|_| upload(&sentinel)))
            .collect();
        let pointers: Vec<u64> = bufs.iter().map(|b| b.0).collect();
        // The uploads are synchronous copies from pageable memory, which may return before the
        // copy reaches the device, and the test's stream does not wait for the legacy stream
        // (it is non-blocking): without this, a kernel could read a buffer still being written.
        driver::ctx::synchronize().unwrap();
        kernel.launch(&plan, attrs, &pointers, stream).unwrap();
        let micros = mean_micros(stream, repeats, || {
            kernel.launch(&plan, attrs, &pointers, stream).unwrap();
        });
        // SAFETY: the test's stream.
        unsafe { driver::stream::synchronize(stream) }.unwrap();
        let outputs = bufs[inputs.len()..]
            .iter()
            .map(|b| download::<T>(b, n))
            .chain(
                op.in_place_inputs()
                    .iter()
                    .map(|&i| download::<T>(&bufs[i], inputs[i].len())),
            )
            .collect();
        (outputs, micros)
    }

    /// A non-blocking stream in device 0's primary context, which stays current on this thread
    /// for the test (the kernels' module lives in it too, and the allocations need it), after
    /// checking that the CUDA libraries load.
    fn test_stream() -> sys::CUstream {
        cuda::check_libraries().unwrap();
        let device = driver::device::get(0).unwrap();
        // SAFETY: the primary context is retained for the rest of the process and made current
        // before the stream is created in it.
        unsafe {
            let context = driver::primary_ctx::retain(device).unwrap();
            driver::ctx::set_current(context).unwrap();
            driver::stream::create(driver::stream::StreamKind::NonBlocking).unwrap()
        }
    }

    /// The mean time of one of `repeats` calls of `launch` (each queueing work on `stream`), in
    /// microseconds, from events on the stream; 0 for no repeats.
    fn mean_micros(stream: sys::CUstream, repeats: usize, mut launch: impl FnMut()) -> f64 {
        if repeats == 0 {
            return 0.0;
        }
        use sys::CUevent_flags::CU_EVENT_DEFAULT;
        let (start, end) = (
            driver::event::create(CU_EVENT_DEFAULT).unwrap(),
            driver::event::create(CU_EVENT_DEFAULT).unwrap(),
        );
        // SAFETY: events and stream of the current context.
        unsafe {
            driver::event::record(start, stream).unwrap();
            for _ in 0..repeats {
                launch();
            }
            driver::event::record(end, stream).unwrap();
            driver::event::synchronize(end).unwrap();
            let micros = driver::event::elapsed(start, end).unwrap() as f64 * 1e3 / repeats as f64;
            driver::event::destroy(start).unwrap();
            driver::event::destroy(end).unwrap();
            micros
        }
    }

    /// Runs a MatMulBiasGelu case with the cuBLASLt kernel ([`gemm::GemmKernel::launch`]) on
    /// `stream` and returns Y; with `repeats`, also prints the mean time of one call and its
    /// rate.
    fn run_gemm<T: Element>(
        case: &MatMulGeluCase<T>,
        stream: sys::CUstream,
        repeats: usize,
        what: &str,
    ) -> Vec<T> {
        let plan = case.plan();
        let mut kernel = gemm::GemmKernel::new(T::into_tensor_element_type(), 0).unwrap();
        let n = plan.rows * plan.cols;
        let bufs: Vec<DeviceBuf> = case
            .inputs()
            .iter()
            .map(|data| upload(data))
            .chain([upload(&vec![T::from_f32(f32::NAN); n])])
            .collect();
        let pointers: Vec<u64> = bufs.iter().map(|b| b.0).collect();
        // As in `run_cuda`: the uploads may still be on their way.
        driver::ctx::synchronize().unwrap();
        kernel.launch(&plan, &pointers, stream).unwrap();
        let micros = mean_micros(stream, repeats, || {
            kernel.launch(&plan, &pointers, stream).unwrap();
        });
        if repeats > 0 {
            let flops = 2.0 * (plan.rows * plan.d * plan.cols) as f64;
            eprintln!(
                "{what}: {micros:.1} µs per call, {:.0} TFLOP/s",
                flops / micros / 1e6
            );
        }
        // SAFETY: the test's stream.
        unsafe { driver::stream::synchronize(stream) }.unwrap();
        download::<T>(&bufs[3], n)
    }

    /// cuBLASLt's heuristic candidates for wan-1.3b's `MatMulBiasGelu` (4,680 tokens, 1536 →
    /// 8960, float16), each timed and described, and its output against the first choice's (a
    /// different algorithm may sum in another order: within a few units in the last place). The
    /// product takes the first; this says whether another is faster on the device.
    /// `LD_LIBRARY_PATH=<cu13 lib> cargo test --release --lib cuda_gemm_algorithms -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore = "needs a CUDA GPU, its driver, cuBLASLt and NVRTC on LD_LIBRARY_PATH"]
    fn cuda_gemm_algorithms() {
        let stream = test_stream();
        let mut rng = Rng(11);
        let case = MatMulGeluCase::<f16>::new(&mut rng, &[1, 4680, 1536], 8960);
        let plan = case.plan();
        let n = plan.rows * plan.cols;
        let bufs: Vec<DeviceBuf> = case
            .inputs()
            .iter()
            .map(|data| upload(data))
            .chain([upload(&vec![f16::NAN; n])])
            .collect();
        let pointers: Vec<u64> = bufs.iter().map(|b| b.0).collect();
        driver::ctx::synchronize().unwrap();
        // Rank 0's output and time: the product's choice, the reference of the others.
        let mut first: Option<(Vec<f16>, f64)> = None;
        for rank in 0..16 {
            let mut kernel = gemm::GemmKernel::new(TensorElementType::Float16, 0).unwrap();
            kernel.algo_rank = rank;
            if let Err(e) = kernel.launch(&plan, &pointers, stream) {
                eprintln!("rank {rank}: {e}");
                break;
            }
            let micros = mean_micros(stream, 30, || {
                kernel.launch(&plan, &pointers, stream).unwrap();
            });
            // SAFETY: the test's stream.
            unsafe { driver::stream::synchronize(stream) }.unwrap();
            let y = download::<f16>(&bufs[3], n);
            let (most, reference) = first.as_ref().map_or((0.0, micros), |(want, micros)| {
                let most = y
                    .iter()
                    .zip(want)
                    .map(|(g, w)| (g.to_f32() - w.to_f32()).abs())
                    .fold(0.0f32, f32::max);
                (most, *micros)
            });
            eprintln!(
                "rank {rank}: {micros:.1} µs ({:.3} of rank 0's time), {:.0} TFLOP/s, largest \
                 difference from rank 0 {most:.3e}; {}",
                micros / reference,
                2.0 * (plan.rows * plan.d * plan.cols) as f64 / micros / 1e6,
                kernel.algorithms().join("; ")
            );
            assert!(y.iter().all(|v| v.is_finite()), "rank {rank}: Y has NaN");
            first.get_or_insert((y, micros));
        }
        assert!(first.is_some(), "cuBLASLt gave no algorithm");
    }

    /// Runs an Attention case with cuDNN ([`attention::AttentionKernel::launch`]: split over at
    /// most `max_parts` runs of the keys, or one call for 0) on `stream`; returns O and, with
    /// `repeats`, the mean time of one call in µs.
    fn run_attention(
        case: &AttentionCase<f16>,
        stream: sys::CUstream,
        max_parts: usize,
        repeats: usize,
    ) -> (Vec<f16>, f64) {
        let plan = case.plan();
        let mut kernel = attention::AttentionKernel::new(TensorElementType::Float16, 0).unwrap();
        kernel.split_enabled = max_parts > 1;
        kernel.max_parts = max_parts.max(2);
        let bufs: Vec<DeviceBuf> = case
            .inputs()
            .iter()
            .map(|data| upload(data))
            .chain([upload(&vec![f16::NAN; case.q.len()])])
            .collect();
        let pointers: Vec<u64> = bufs.iter().map(|b| b.0).collect();
        driver::ctx::synchronize().unwrap();
        kernel.launch(&plan, &pointers, stream).unwrap();
        let micros = mean_micros(stream, repeats, || {
            kernel.launch(&plan, &pointers, stream).unwrap();
        });
        // SAFETY: the test's stream.
        unsafe { driver::stream::synchronize(stream) }.unwrap();
        (download::<f16>(&bufs[3], case.q.len()), micros)
    }

    /// cuDNN's attention against the CPU kernel (float16 in and out, not the CPU kernel's float32
    /// arithmetic throughout: within 4e-3 of the outputs' unit scale; measured on an H200 within
    /// 1.3e-4), split and whole; at a block's rows and the video's key counts, the time of one
    /// call, of two runs of the keys and of the kernel's choice.
    #[test]
    #[ignore = "needs a CUDA GPU, its driver, cuDNN and NVRTC on LD_LIBRARY_PATH"]
    fn cuda_attention_matches_the_cpu_kernel() {
        let stream = test_stream();
        let mut rng = Rng(13);
        let close = |got: &[f16], want: &[f16], what: &str| {
            let worst = got
                .iter()
                .zip(want)
                .map(|(g, w)| (g.to_f32() - w.to_f32()).abs())
                .fold(0f32, f32::max);
            eprintln!("{what}: largest difference {worst:.2e}");
            assert!(worst <= 4e-3, "{what}: largest difference {worst}");
        };
        // Small shapes (one call), then a block of wan-1.3b's rows (split on an H200).
        for (sizes, heads) in [
            ([1, 84, 252, 64], 2),
            ([2, 100, 300, 256], 2),
            ([1, 4680, 4680, 1536], 12),
        ] {
            let case = AttentionCase::<f16>::new(&mut rng, sizes, heads);
            let cpu = case.cpu();
            let what = format!("Attention {sizes:?} heads {heads}");
            let (whole, _) = run_attention(&case, stream, 0, 0);
            close(&whole, &cpu, &format!("{what}, one call"));
            for max_parts in [2, attention::MAX_PARTS] {
                let (split, _) = run_attention(&case, stream, max_parts, 0);
                close(
                    &split,
                    &cpu,
                    &format!("{what}, split over up to {max_parts} runs"),
                );
            }
        }
        // A block's rows at the key counts of a video's calls: one call against the split over
        // up to 2 runs of the keys and up to MAX_PARTS (the kernel's choice).
        for keys in [4680, 9360, 18720] {
            let case = AttentionCase::<f16>::new(&mut rng, [1, 4680, keys, 1536], 12);
            let (whole, one) = run_attention(&case, stream, 0, 50);
            let (halves, two) = run_attention(&case, stream, 2, 50);
            let (split, most) = run_attention(&case, stream, attention::MAX_PARTS, 50);
            let what = format!("Attention [1, 4680, {keys}, 1536] heads 12");
            close(&halves, &whole, &format!("{what}, 2 runs against one call"));
            close(&split, &whole, &format!("{what}, split against one call"));
            eprintln!(
                "{what}: one call {one:.1} µs, 2 runs {two:.1} µs ({:.3}), up to {} runs {most:.1} µs ({:.3})",
                two / one,
                attention::MAX_PARTS,
                most / one
            );
        }
    }

    /// Runs a CausalConv3d case with the CUDA kernel (cuDNN, the engine picked by timing on the
    /// first launch) and returns Y and the mean time of one of `repeats` launches after it.
    fn run_conv<T: Element>(
        case: &ConvCase<T>,
        stream: sys::CUstream,
        repeats: usize,
    ) -> (Vec<T>, f64) {
        let plan = case.plan();
        let mut kernel = conv::ConvKernel::new(T::into_tensor_element_type(), 0).unwrap();
        let n = case.written();
        let bufs: Vec<DeviceBuf> = case
            .inputs()
            .iter()
            .map(|data| upload(data))
            .chain([upload(&vec![T::from_f32(f32::NAN); n])])
            .collect();
        let pointers: Vec<u64> = bufs.iter().map(|b| b.0).collect();
        driver::ctx::synchronize().unwrap();
        kernel.launch(&plan, &pointers, stream).unwrap();
        let micros = mean_micros(stream, repeats, || {
            kernel.launch(&plan, &pointers, stream).unwrap();
        });
        // SAFETY: the test's stream.
        unsafe { driver::stream::synchronize(stream) }.unwrap();
        (download::<T>(&bufs[2], n), micros)
    }

    /// cuDNN's convolution against the CPU kernel: float16 within 2e-3 of max(1, |y|) (cuDNN
    /// sums in float32 in its own order and rounds once), float32 within 1e-4 (no engine that
    /// converts its inputs down is kept); twice the same result; and the time of the decoder's
    /// full-resolution convolution (wan-1.3b: 96 channels at 480x832, 4 frames after the cache's
    /// 2), with cuDNN's choice printed (`UNSTEP_CONV_LOG=1`).
    #[test]
    #[ignore = "needs a CUDA GPU, its driver, cuDNN and NVRTC on LD_LIBRARY_PATH"]
    fn cuda_causal_conv3d_matches_the_cpu_kernel() {
        fn check<T: Element>(rng: &mut Rng, stream: sys::CUstream, tolerance: f32) {
            let cases = CONV_CASES
                .iter()
                .copied()
                .chain([([1, 6, 48, 80, 96], [96, 3, 3, 3])]);
            for (x_shape, kernel) in cases {
                let case = ConvCase::<T>::new(rng, x_shape, kernel);
                let what = format!(
                    "{} CausalConv3d X {x_shape:?} kernel {kernel:?}",
                    std::any::type_name::<T>()
                );
                let (gpu, _) = run_conv(&case, stream, 0);
                let (again, _) = run_conv(&case, stream, 0);
                let cpu = case.cpu();
                let worst = gpu
                    .iter()
                    .zip(&cpu)
                    .map(|(g, c)| (g.to_f32() - c.to_f32()).abs() / c.to_f32().abs().max(1.0))
                    .fold(0f32, f32::max);
                eprintln!("{what}: largest difference {worst:.2e}");
                assert!(worst <= tolerance, "{what}: largest difference {worst}");
                assert!(gpu == again, "{what}: two runs differ");
            }
        }
        let stream = test_stream();
        let mut rng = Rng(16);
        check::<f16>(&mut rng, stream, 2e-3);
        check::<f32>(&mut rng, stream, 1e-4);
        let case = ConvCase::<f16>::new(&mut rng, [1, 6, 480, 832, 96], [96, 3, 3, 3]);
        let (_, micros) = run_conv(&case, stream, 20);
        let flop = 2.0 * 4.0 * 480.0 * 832.0 * 96.0 * 96.0 * 27.0;
        eprintln!(
            "CausalConv3d X [1, 6, 480, 832, 96] kernel [96, 3, 3, 3], float16: {micros:.1} µs, \
             {:.0} TFLOP/s",
            flop / micros / 1e6
        );
    }

    /// GPU against CPU kernel: float32 within 1e-5 (only the row sums' order differs: the CUDA
    /// source is compiled without contraction), float16 within one unit in the last place.
    #[track_caller]
    fn assert_matches_cpu<T: Element>(gpu: &[T], cpu: &[T], what: &str) {
        let ulp = if T::into_tensor_element_type() == TensorElementType::Float16 {
            1.0 / 1024.0
        } else {
            1e-5
        };
        for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
            let (g, c) = (g.to_f32() as f64, c.to_f32() as f64);
            assert!(
                (g - c).abs() <= 1e-6 + ulp * g.abs().max(c.abs()),
                "{what}[{i}]: GPU {g}, CPU {c}"
            );
        }
    }

    /// The mean time in µs of one of 20 device-to-device copies of `bytes` bytes on `stream`: the
    /// reference the row kernels' times are read against (a copy reads and writes its bytes, so
    /// a kernel that moves 2 · `bytes` at the copy's rate takes the copy's time).
    fn copy_micros(stream: sys::CUstream, bytes: usize) -> f64 {
        // SAFETY: two allocations of `bytes` in the current context, copied between on `stream`
        // and freed after the stream is synchronised (in `mean_micros`, then below).
        let (src, dst) = unsafe {
            (
                DeviceBuf(driver::malloc_sync(bytes).unwrap()),
                DeviceBuf(driver::malloc_sync(bytes).unwrap()),
            )
        };
        let micros = mean_micros(stream, 20, || {
            // SAFETY: both buffers hold `bytes` bytes and outlive the copies.
            unsafe { driver::memcpy_dtod_async(dst.0, src.0, bytes, stream) }.unwrap();
        });
        // SAFETY: the test's stream.
        unsafe { driver::stream::synchronize(stream) }.unwrap();
        micros
    }

    /// Runs the case's operator with the CUDA kernel ([`run_cuda`]); when X has more than a
    /// million elements, also times it and prints the time per launch, the bandwidth over the
    /// bytes the operator moves (its inputs but those it writes in place, read once, and the
    /// elements it writes, [`OpCase::written`]) and that as a share of a device-to-device copy of
    /// the same bytes timed right after ([`copy_micros`]).
    fn run_case<T: Element, C: OpCase<T>>(
        case: &C,
        stream: sys::CUstream,
        what: &str,
    ) -> Vec<Vec<T>> {
        let (op, inputs) = (C::OP, case.inputs());
        let big = inputs[op.x_index()].len() > 1_000_000;
        let (outputs, micros) = run_cuda(case, stream, if big { 50 } else { 0 });
        if big {
            let read: usize = (0..inputs.len())
                .filter(|i| !op.in_place_inputs().contains(i))
                .map(|i| inputs[i].len())
                .sum();
            let bytes = (read + case.written()) * std::mem::size_of::<T>();
            let copy = copy_micros(stream, bytes / 2);
            eprintln!(
                "{what}: {micros:.2} µs per launch, {:.0} GB/s over {:.1} MB, {:.2} of a copy's \
                 rate ({copy:.2} µs)",
                bytes as f64 / micros / 1e3,
                bytes as f64 / 1e6,
                copy / micros
            );
        }
        outputs
    }

    fn check<T: Tolerance>(stream: sys::CUstream) {
        let t = std::any::type_name::<T>();
        let mut rng = Rng(6);
        let rope_cases: Vec<(&[i64], usize, usize)> = ROPE_CASES
            .into_iter()
            .chain([
                (&[1, 4680, 1536][..], 12, 4680),
                (&[7, 2048], 16, 7),
                (&[1, 5, 1000], 5, 5),
                (&[2, 3, 96], 12, 1),
                // Group layout: rows not a multiple of a block's rows, the largest D, one lane
                // per row; D = 100, a group for float32 and blocks for float16; the smallest D
                // of the block layout.
                (&[3, 1001, 96], 4, 1001),
                (&[37, 512], 4, 37),
                (&[9, 8], 1, 9),
                (&[5, 100], 5, 5),
                (&[11, 514], 1, 11),
                // A half head (6) no multiple of a float16 unit's pairs (4): the tables read
                // pair by pair.
                (&[3, 7, 48], 4, 7),
            ])
            .collect();
        for (x_shape, heads, tc) in rope_cases {
            let case = RopeCase::<T>::new(&mut rng, x_shape, heads, tc);
            let what = format!("{t} BiasRmsNormRope {x_shape:?}");
            let gpu = run_case(&case, stream, &what);
            let plan = case.plan();
            let mut cpu_y = vec![T::from_f32(0.0); case.x.len()];
            let i = case.inputs();
            cpu::bias_rms_norm(
                &plan,
                case.eps,
                i[0],
                i[1],
                i[2],
                Epilogue::Rope(i[3], i[4]),
                &mut cpu_y,
            );
            assert_matches_cpu(&gpu[0], &cpu_y, &what);
            assert_close(&gpu[0], &case.reference(), &what);
        }

        // Plain and SiLU: the test shapes; wan-1.3b's rows; the block layouts' D (4-element
        // accesses: 1000, not a multiple of 4 · 128; 2048, the largest; 100 for float16, which
        // the group layout cannot take; pairs: 514, the smallest, and 2); the group layout's, with row counts that are not a
        // multiple of a block's rows (D = 96 and 384, the VAE's channels; 16 and 64, the tiny
        // model's; 512, the largest; 8, one lane per row for float16). And the VAE decoder's
        // largest: 4 frames of 480 × 832 rows of 96 channels.
        let block_shapes = [&[3, 1000][..], &[5, 2048], &[11, 514], &[9, 2], &[7, 100]];
        let group_shapes = [
            &[3, 1001, 96][..],
            &[13, 384],
            &[5, 7, 16],
            &[37, 512],
            &[9, 8],
        ];
        // RMS_SHAPES has an odd D for the CPU kernels, which the CUDA kernels refuse.
        let shapes: Vec<&[i64]> = RMS_SHAPES
            .into_iter()
            .filter(|shape| cuda::check_d(Op::BiasRmsNorm, *shape.last().unwrap() as usize).is_ok())
            .chain(block_shapes)
            .chain(group_shapes)
            .collect();
        let rms_cases = [false, true]
            .into_iter()
            .flat_map(|silu| shapes.iter().map(move |&shape| (shape, silu)))
            .chain([(&[4, 480, 832, 96][..], true)]);
        for (x_shape, silu) in rms_cases {
            let case = RmsCase::<T>::new(&mut rng, x_shape, silu);
            let what = format!("{t} BiasRmsNorm {x_shape:?} silu = {silu}");
            let gpu = run_case(&case, stream, &what);
            assert_matches_cpu(&gpu[0], &case.cpu(), &what);
            assert_close(&gpu[0], &case.reference(), &what);
        }

        // PrefixBiasRmsNorm: the CPU cases (P = 0 among them), and the VAE decoder's largest
        // causal convolution input, a two-frame cache in front of 4 frames of 480 × 832 × 96.
        let prefix_cases = PREFIX_CASES
            .into_iter()
            .filter(|(x, _)| cuda::check_d(Op::BiasRmsNorm, *x.last().unwrap() as usize).is_ok())
            .chain([
                (&[1, 4, 480, 832, 96][..], 2),
                (&[1, 4, 240, 416, 192], 2),
                (&[1, 2, 120, 208, 384], 2),
            ]);
        for (x_shape, p) in prefix_cases {
            let case = PrefixCase::<T>::new(&mut rng, x_shape, p, true);
            let what = format!("{t} PrefixBiasRmsNorm {x_shape:?} P = {p}");
            let gpu = run_case(&case, stream, &what);
            assert_matches_cpu(&gpu[0], &case.cpu(), &what);
            case.assert_matches(&gpu[0], &what);
            case.assert_tail(&gpu[0], &gpu[1][..case.prefix.len()], &what);
        }

        let frame: &[i64] = &[1, 3, 1, 1536];
        let grln_cases: Vec<(&[i64], [&[i64]; 3])> = GRLN_CASES
            .into_iter()
            .chain([
                (&[1, 4680, 1536][..], [frame, frame, frame]),
                (&[1, 4680, 1536], [&[1536][..], frame, &[3, 1536]]),
                (&[7, 2048], [&[7, 2048][..], &[2048], &[1, 2048]]),
                (&[5, 1000], [&[1000][..], &[5, 1000], &[1000]]),
                // Group layout, rows not a multiple of a block's rows; D = 100 (a group for
                // float32, blocks for float16); the block layout's smallest D.
                (&[3, 1001, 96], [&[96][..], &[3, 1, 96], &[7, 96]]),
                (&[3, 333, 384], [&[3, 1, 384][..], &[384], &[9, 384]]),
                (&[37, 512], [&[37, 512][..], &[512], &[512]]),
                (&[7, 100], [&[100][..], &[7, 100], &[100]]),
                (&[11, 514], [&[514][..], &[11, 514], &[514]]),
            ])
            .collect();
        for (x_shape, params) in grln_cases {
            let case = GrlnCase::<T>::new(&mut rng, x_shape, params);
            let what = format!("{t} GatedResidualLayerNorm {x_shape:?} {params:?}");
            let gpu = run_case(&case, stream, &what);
            let plan = case.plan();
            let mut cpu_s = vec![T::from_f32(0.0); case.x.len()];
            let mut cpu_y = vec![T::from_f32(0.0); case.x.len()];
            let i = case.inputs();
            cpu::gated_residual_layer_norm(
                &plan, case.eps, i[0], i[1], i[2], i[3], i[4], i[5], &mut cpu_s, &mut cpu_y,
            );
            // S is elementwise: the same float32 operations in the same order on both.
            assert!(gpu[0] == cpu_s, "{what}: S differs between GPU and CPU");
            assert_matches_cpu(&gpu[1], &cpu_y, &format!("{what} Y"));
            let (want_s, want_y) = case.reference();
            assert_close(&gpu[0], &want_s, &format!("{what} S"));
            assert_close(&gpu[1], &want_y, &format!("{what} Y"));
        }

        // BiasGelu: the test shapes, wan-1.3b's FFN (4680 rows of 8960), 4-element and pair
        // accesses (D = 100 for float16, D = 6).
        // GELU_SHAPES has an odd D for the CPU kernel, which the CUDA kernel refuses.
        let gelu_shapes = GELU_SHAPES
            .into_iter()
            .filter(|shape| cuda::check_d(Op::BiasGelu, *shape.last().unwrap() as usize).is_ok())
            .chain([&[1, 4680, 8960][..], &[7, 6], &[33, 100]]);
        for shape in gelu_shapes {
            let case = GeluCase::<T>::new(&mut rng, shape);
            let what = format!("{t} BiasGelu {shape:?}");
            let gpu = run_case(&case, stream, &what);
            assert_matches_cpu(&gpu[0], &case.cpu(), &what);
            assert_close(&gpu[0], &case.reference(), &what);
        }

        // MatMulBiasGelu: the test cases, and wan-1.3b's FFN (4680 tokens, 1536 → 8960, timed).
        // Against the CPU: the sums run in another order and cuBLASLt's epilogue has its own
        // tanh, so within a few units in the last place rather than one.
        let gemm_cases = MATMUL_GELU_CASES
            .into_iter()
            .map(|case| (case, 0))
            .chain([((&[1, 4680, 1536][..], 8960), 20)]);
        for ((shape, n), repeats) in gemm_cases {
            let case = MatMulGeluCase::<T>::new(&mut rng, shape, n);
            let what = format!("{t} MatMulBiasGelu {shape:?} N = {n}");
            let gpu = run_gemm(&case, stream, repeats, &what);
            let cpu = case.cpu();
            let ulps = if T::into_tensor_element_type() == TensorElementType::Float16 {
                4.0 / 1024.0
            } else {
                1e-4
            };
            for (i, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
                let (g, c) = (g.to_f32() as f64, c.to_f32() as f64);
                assert!(
                    (g - c).abs() <= 1e-3 + ulps * g.abs().max(c.abs()),
                    "{what}[{i}]: GPU {g}, CPU {c}"
                );
            }
            if repeats == 0 {
                assert_close(&gpu, &case.reference(), &what);
            }
        }

        // QkvNormRopeCache: the test cases, and wan-1.3b's last block (T = 4680 of L = 32760
        // rows of 1536, 12 heads), whose cache writes land 27,000 rows in.
        let qkv_cases = QKV_CASES
            .into_iter()
            .chain([([1, 4680, 32760, 1536], 12, 4680), ([3, 7, 9, 64], 2, 7)]);
        for (sizes, heads, tc) in qkv_cases {
            let case = QkvCase::<T>::new(&mut rng, sizes, heads, tc);
            let what = format!("{t} QkvNormRopeCache {sizes:?}");
            let gpu = run_case(&case, stream, &what);
            let (cpu_q, cpu_k, cpu_v) = case.cpu();
            assert_matches_cpu(&gpu[0], &cpu_q, &format!("{what} Q"));
            assert_matches_cpu(&gpu[1], &cpu_k, &format!("{what} K"));
            assert!(gpu[2] == cpu_v, "{what}: V differs between GPU and CPU");
            case.assert_matches((&gpu[0], &gpu[1], &gpu[2]), &what);
        }
    }

    /// The CUDA kernels, compiled with NVRTC and launched as a session launches them
    /// ([`cuda::CudaKernel::launch`]) on a non-blocking stream, against the CPU kernels and the
    /// float64 reference, at the test shapes and at wan-1.3b's (N = 4680, D = 1536, 12 heads);
    /// the block layouts at D = 2048 (the largest), D = 1000 (4-element accesses not a multiple
    /// of 4 · 128) and D = 514 (pairs, the smallest); the group layout at D = 8 to 512 with row counts that are not a
    /// multiple of a block's rows; BiasRmsNorm with and without SiLU, up to the VAE decoder's
    /// 4 · 480 · 832 rows of 96. Prints the time per launch of the large shapes. Needs a CUDA GPU and
    /// NVRTC: `LD_LIBRARY_PATH=<nvrtc lib> cargo test --release --lib cuda_kernels -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore = "needs a CUDA GPU, its driver, and NVRTC on LD_LIBRARY_PATH"]
    fn cuda_kernels_match_the_cpu_kernels() {
        let stream = test_stream();
        check::<f32>(stream);
        check::<f16>(stream);
    }

    /// The time per launch of the row kernels at wan-1.3b's float16 shapes, without the CPU
    /// references of [`cuda_kernels_match_the_cpu_kernels`] (which take about a minute): for
    /// trying a kernel change on the GPU in seconds; each time is also read against a copy of the
    /// same bytes timed in the same run. Checks nothing but that each launch runs.
    /// `LD_LIBRARY_PATH=<nvrtc lib> cargo test --release --lib cuda_kernel_times -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore = "needs a CUDA GPU, its driver, and NVRTC on LD_LIBRARY_PATH"]
    fn cuda_kernel_times() {
        let stream = test_stream();
        let mut rng = Rng(7);
        let frame: &[i64] = &[1, 3, 1, 1536];
        let grln = GrlnCase::<f16>::new(&mut rng, &[1, 4680, 1536], [frame, frame, frame]);
        run_case(&grln, stream, "GatedResidualLayerNorm [1, 4680, 1536]");
        let qkv = QkvCase::<f16>::new(&mut rng, [1, 4680, 32760, 1536], 12, 4680);
        run_case(&qkv, stream, "QkvNormRopeCache [1, 4680, 32760, 1536]");
        let rope = RopeCase::<f16>::new(&mut rng, &[1, 4680, 1536], 12, 4680);
        run_case(&rope, stream, "BiasRmsNormRope [1, 4680, 1536]");
        let gelu = GeluCase::<f16>::new(&mut rng, &[1, 4680, 8960]);
        run_case(&gelu, stream, "BiasGelu [1, 4680, 8960]");
        for x_shape in [
            &[1, 4, 480, 832, 96][..],
            &[1, 4, 240, 416, 192],
            &[1, 2, 120, 208, 384],
        ] {
            let prefix = PrefixCase::<f16>::new(&mut rng, x_shape, 2, true);
            run_case(
                &prefix,
                stream,
                &format!("PrefixBiasRmsNorm {x_shape:?} P = 2"),
            );
        }
        let rms = RmsCase::<f16>::new(&mut rng, &[4, 480, 832, 96], true);
        run_case(&rms, stream, "BiasRmsNorm [4, 480, 832, 96] silu");
    }
}

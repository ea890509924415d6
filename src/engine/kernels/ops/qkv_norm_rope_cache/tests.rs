//! `QkvNormRopeCache` against the float64 reference, directly and through ONNX Runtime with the
//! caller's cache; its contract's errors.

use half::f16;

use super::*;
use crate::engine::kernels::operator::check;
use crate::engine::kernels::test_support::*;
use crate::engine::onnx_graph::Attr;

/// One QkvNormRopeCache case: QKV `[B, T, 3·D]`, caches `[B, L, D]` whose first L − T rows of
/// each batch entry hold earlier keys and values (random; the op must leave them), and the
/// reference.
pub(crate) struct QkvCase<T> {
    pub(crate) b: usize,
    pub(crate) t: usize,
    pub(crate) l: usize,
    pub(crate) d: usize,
    pub(crate) heads: usize,
    pub(crate) eps: f32,
    pub(crate) table_shape: Vec<i64>,
    pub(crate) qkv: Vec<T>,
    /// q_bias, k_bias, q_weight, k_weight.
    pub(crate) params: [Vec<T>; 4],
    pub(crate) cos: Vec<T>,
    pub(crate) sin: Vec<T>,
    pub(crate) k: Vec<T>,
    pub(crate) v: Vec<T>,
}

impl<T: Element> QkvCase<T> {
    pub(crate) fn new(rng: &mut Rng, [b, t, l, d]: [usize; 4], heads: usize, tc: usize) -> Self {
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
    pub(crate) fn column_block(&self, j: usize) -> Vec<f64> {
        let d = self.d;
        wide(&self.qkv)
            .chunks(3 * d)
            .flat_map(|row| row[j * d..(j + 1) * d].to_vec())
            .collect()
    }

    /// `(Q, K, V)` in float64: Q, and the whole caches after the op.
    pub(crate) fn reference(&self) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
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
    pub(crate) fn cpu(&self) -> (Vec<T>, Vec<T>, Vec<T>) {
        let plan = self.plan();
        let mut q = vec![T::from_f32(0.0); self.b * self.t * self.d];
        let (mut k, mut v) = (self.k.clone(), self.v.clone());
        let [qb, kb, qw, kw] = self.params.each_ref().map(Vec::as_slice);
        qkv_norm_rope_cache(
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
    pub(crate) fn assert_matches(&self, (q, k, v): (&[T], &[T], &[T]), what: &str)
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
    type Op = QkvNormRopeCache;

    fn attrs(&self) -> RopeAttrs {
        RopeAttrs {
            epsilon: self.eps,
            num_heads: self.heads,
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
pub(crate) const QKV_CASES: [([usize; 4], usize, usize); 4] = [
    ([1, 6, 10, 16], 2, 6),
    ([2, 3, 3, 8], 1, 3),
    ([2, 5, 12, 96], 4, 5),
    ([1, 8, 11, 16], 2, 2),
];

pub(crate) fn check_qkv_cpu<T: Tolerance>() {
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

/// Through ONNX Runtime, on a case drawn from `rng`, K and V are written where the caller's
/// buffers are: the session reads them in place (bound host memory on the CPU provider), as the
/// DiT's attention after the node does (one part of `every_operator_runs_through_onnx_runtime`).
pub(crate) fn check_through_onnx_runtime<T: Tolerance>(rng: &mut Rng) {
    use ort::value::{TensorRef, TensorRefMut};
    let t = std::any::type_name::<T>();
    let case = QkvCase::<T>::new(rng, QKV_CASES[2].0, QKV_CASES[2].1, QKV_CASES[2].2);
    let attrs = [
        Attr::Float("epsilon", case.eps),
        Attr::Int("num_heads", case.heads as i64),
    ];
    let mut session = session::<T>(&QkvNormRopeCache::INFO, &attrs).unwrap();
    let shapes = case.shapes();
    let inputs = case.inputs();
    let (mut k, mut v) = (case.k.clone(), case.v.clone());
    let mut values: Vec<(&str, ort::session::SessionInputValue<'_>)> = Vec::new();
    for (i, name) in QkvNormRopeCache::INFO.inputs.iter().enumerate().take(7) {
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
    check_through_onnx_runtime::<f32>(&mut Rng(8));
    check_through_onnx_runtime::<f16>(&mut Rng(8));
}

#[test]
fn contract_violations_name_the_operator_the_input_and_the_shapes() {
    let rope = RopeAttrs {
        epsilon: 1e-6,
        num_heads: 2,
    };
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
        let e = plan_error::<QkvNormRopeCache>(rope, &qkv(x, k, v));
        assert!(wanted.iter().all(|w| e.contains(w)), "{e}");
    }
    let ok = check::<QkvNormRopeCache>(&rope, &qkv(&[2, 4, 24], &[2, 6, 8], &[2, 6, 8])).unwrap();
    assert_eq!(
        (
            ok.rows,
            ok.d,
            ok.block_rows,
            ok.cache_rows,
            ok.tables.half_hd,
            ok.tables.rows
        ),
        (8, 8, 4, 6, 2, 4)
    );
}

//! `GatedResidualLayerNorm` against the float64 reference, its rounding of S and its row
//! parameters; its contract's errors, directly and through ONNX Runtime.

use half::f16;

use super::*;
use crate::engine::kernels::operator::check;
use crate::engine::kernels::test_support::*;
use crate::engine::onnx_graph::Attr;

/// `(S, Y)` of GatedResidualLayerNorm in float64, S rounded by `store` (to the element type)
/// before the norm reads it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reference_grln(
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

pub(crate) struct GrlnCase<T> {
    pub(crate) x_shape: Vec<i64>,
    pub(crate) param_shapes: [Vec<i64>; 3],
    pub(crate) eps: f32,
    pub(crate) r: Vec<T>,
    pub(crate) x: Vec<T>,
    pub(crate) bias: Vec<T>,
    pub(crate) gate: Vec<T>,
    pub(crate) scale: Vec<T>,
    pub(crate) shift: Vec<T>,
}

impl<T: Element> GrlnCase<T> {
    pub(crate) fn new(rng: &mut Rng, x_shape: &[i64], param_shapes: [&[i64]; 3]) -> Self {
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

    /// `(S, Y)` from the CPU kernel.
    pub(crate) fn cpu(&self) -> (Vec<T>, Vec<T>) {
        let mut s = vec![T::from_f32(0.0); self.x.len()];
        let mut y = vec![T::from_f32(0.0); self.x.len()];
        let i = self.inputs();
        gated_residual_layer_norm(
            &self.plan(),
            self.eps,
            [i[0], i[1], i[2]],
            [i[3], i[4], i[5]],
            &mut s,
            &mut y,
        );
        (s, y)
    }

    pub(crate) fn reference(&self) -> (Vec<f64>, Vec<f64>) {
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
    type Op = GatedResidualLayerNorm;

    fn attrs(&self) -> LayerNormAttrs {
        LayerNormAttrs { epsilon: self.eps }
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

/// (X shape, gate, scale, shift shapes): F = 1 and F = 3 in every position and layout.
pub(crate) const GRLN_CASES: [(&[i64], [&[i64]; 3]); 4] = [
    (&[1, 12, 64], [&[64], &[1, 3, 1, 64], &[3, 64]]),
    (&[1, 12, 64], [&[3, 64], &[64], &[1, 1, 64]]),
    (&[2, 3, 32], [&[6, 32], &[2, 1, 32], &[1, 3, 1, 32]]),
    (&[5, 16], [&[16], &[16], &[16]]),
];

pub(crate) fn check_grln_cpu<T: Tolerance>() {
    let mut rng = Rng(3);
    let frame: &[i64] = &[1, 3, 1, 1536];
    for (x_shape, params) in GRLN_CASES
        .into_iter()
        .chain([(&[1, 4680, 1536][..], [frame, frame, &[1536][..]])])
    {
        let case = GrlnCase::<T>::new(&mut rng, x_shape, params);
        let (s, y) = case.cpu();
        let (want_s, want_y) = case.reference();
        assert_close(&s, &want_s, &format!("S of {x_shape:?} {params:?}"));
        assert_close(&y, &want_y, &format!("Y of {x_shape:?} {params:?}"));
    }
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
    let attrs = LayerNormAttrs { epsilon: 0.0 };
    let plan = plan_of::<GatedResidualLayerNorm>(&attrs, &shapes);
    let (mut s, mut y) = (zeros.clone(), zeros.clone());
    gated_residual_layer_norm(
        &plan,
        0.0,
        [&r, &x, &zeros],
        [&ones, &ones, &zeros],
        &mut s,
        &mut y,
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
    let attrs = LayerNormAttrs { epsilon: 0.0 };
    let d = 2;
    let shapes = [
        vec![6, 2],
        vec![6, 2],
        vec![2],
        vec![3, 2],
        vec![2],
        vec![2],
    ];
    let plan = plan_of::<GatedResidualLayerNorm>(&attrs, &shapes);
    assert_eq!(plan.divs, [2, 6, 6]);
    let r = vec![0f32; 12];
    let x: Vec<f32> = (0..6).flat_map(|_| [1.0, -1.0]).collect();
    let gate: Vec<f32> = vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0];
    let (ones, zeros) = (vec![1f32; d], vec![0f32; d]);
    let (mut s, mut y) = (vec![0f32; 12], vec![0f32; 12]);
    gated_residual_layer_norm(
        &plan,
        0.0,
        [&r, &x, &zeros],
        [&gate, &ones, &zeros],
        &mut s,
        &mut y,
    );
    assert_eq!(s, [1., -1., 1., -1., 2., -2., 2., -2., 3., -3., 3., -3.]);
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
    let mut s = session::<f32>(
        &GatedResidualLayerNorm::INFO,
        &[Attr::Float("epsilon", 1e-6)],
    )
    .unwrap();
    let e = run(&mut s, &GatedResidualLayerNorm::INFO, &shapes, &inputs)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ai.unstep GatedResidualLayerNorm"), "{e}");
    assert!(e.contains("row parameter shift has shape [4, 16]"), "{e}");
    // And a numel that is not a multiple of D.
    let odd: Vec<f32> = rng.vec(24, -1.0, 1.0);
    shapes[5] = vec![24];
    inputs[5] = &odd;
    let e = run(&mut s, &GatedResidualLayerNorm::INFO, &shapes, &inputs)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("row parameter shift has shape [24] (24 elements)"),
        "{e}"
    );
}

#[test]
fn contract_violations_name_the_operator_the_input_and_the_shapes() {
    let plain = LayerNormAttrs { epsilon: 1e-6 };
    // A row parameter whose numel is not a multiple of D.
    let e = plan_error::<GatedResidualLayerNorm>(
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
    let e = plan_error::<GatedResidualLayerNorm>(
        plain,
        &[&[1, 6, 8], &[1, 6, 8], &[8], &[4, 8], &[8], &[8]],
    );
    assert!(e.contains("row parameter gate has shape [4, 8]"), "{e}");
    assert!(e.contains("F = 4") && e.contains("N = 6 rows"), "{e}");
    // R's shape.
    let e =
        plan_error::<GatedResidualLayerNorm>(plain, &[&[6, 8], &[1, 6, 8], &[8], &[8], &[8], &[8]]);
    assert!(
        e.contains("input R has shape [6, 8] and X [1, 6, 8]"),
        "{e}"
    );
    // Valid shapes: every layout of a row parameter.
    let ok = check::<GatedResidualLayerNorm>(
        &plain,
        &[&[1, 6, 8], &[1, 6, 8], &[8], &[1, 3, 1, 8], &[6, 8], &[8]],
    )
    .unwrap();
    assert_eq!((ok.rows, ok.d, ok.divs), (6, 8, [2, 1, 6]));
}

/// `GatedResidualLayerNorm` through ONNX Runtime (CPU provider), on a case drawn from `rng`: the
/// output shapes ONNX Runtime infers and the float64 reference (one part of
/// `every_operator_runs_through_onnx_runtime`).
pub(crate) fn check_through_onnx_runtime<T: Tolerance>(rng: &mut Rng) {
    let t = std::any::type_name::<T>();
    let (x_shape, params) = GRLN_CASES[0];
    let case = GrlnCase::<T>::new(rng, x_shape, params);
    let mut s = session::<T>(
        &GatedResidualLayerNorm::INFO,
        &[Attr::Float("epsilon", case.eps)],
    )
    .unwrap();
    let out = run(
        &mut s,
        &GatedResidualLayerNorm::INFO,
        &case.shapes(),
        &case.inputs(),
    )
    .unwrap();
    let (want_s, want_y) = case.reference();
    assert_eq!((&out[0].0[..], &out[1].0[..]), (x_shape, x_shape));
    assert_close(&out[0].1, &want_s, &format!("{t} GatedResidualLayerNorm S"));
    assert_close(&out[1].1, &want_y, &format!("{t} GatedResidualLayerNorm Y"));
}

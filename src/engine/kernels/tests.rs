//! The tests that span the operators: every operator through ONNX Runtime (CPU provider), the
//! CUDA domain without CUDA, and the CUDA source through NVRTC (ignored: needs `libnvrtc.so.13` on
//! LD_LIBRARY_PATH, not a GPU).

use half::f16;
use ort::value::TensorElementType;

use super::ops::attention::tests::*;
use super::ops::bias_gelu::tests::*;
use super::ops::bias_rms_norm::tests::*;
use super::ops::bias_rms_norm_rope::tests::*;
use super::ops::causal_conv3d::tests::*;
use super::ops::gated_residual_layer_norm::tests::*;
use super::ops::matmul_bias_gelu::tests::*;
use super::ops::prefix_bias_rms_norm::tests::*;
use super::ops::*;
use super::test_support::*;
use super::*;
use crate::engine::onnx_graph::Attr;

fn check_through_onnx_runtime<T: Tolerance>() {
    let mut rng = Rng(4);
    let t = std::any::type_name::<T>();

    let (x_shape, heads, tc) = ROPE_CASES[1];
    let case = RopeCase::<T>::new(&mut rng, x_shape, heads, tc);
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

    // No silu attribute (plain), silu = 0 (plain) and silu = 1 (SiLU after the norm).
    for (x_shape, silu) in [
        (&[2, 3, 48][..], None),
        (&[1, 2, 3, 96], Some(0)),
        (&[1, 2, 3, 5, 96], Some(1)),
    ] {
        let case = RmsCase::<T>::new(&mut rng, x_shape, silu == Some(1));
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

    // BiasGelu has no attributes.
    let case = GeluCase::<T>::new(&mut rng, GELU_SHAPES[0]);
    let mut s = session::<T>(&BiasGelu::INFO, &[]).unwrap();
    let out = run(&mut s, &BiasGelu::INFO, &case.shapes(), &case.inputs()).unwrap();
    assert_eq!(out[0].0, GELU_SHAPES[0]);
    assert_close(&out[0].1, &case.reference(), &format!("{t} BiasGelu Y"));

    // MatMulBiasGelu: Y has N on its last axis (from W's axis 0).
    let (shape, n) = MATMUL_GELU_CASES[0];
    let case = MatMulGeluCase::<T>::new(&mut rng, shape, n);
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

    // PrefixBiasRmsNorm: Y's axis 1 is the prefix's plus X's.
    for (x_shape, p) in [(&[1, 4, 3, 5, 96][..], 2), (&[1, 7, 64], 0)] {
        let case = PrefixCase::<T>::new(&mut rng, x_shape, p, true);
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

    // Attention: O has Q's shape.
    let case = AttentionCase::<T>::new(&mut rng, [2, 5, 7, 8], 2);
    let mut s = session::<T>(&Attention::INFO, &[Attr::Int("num_heads", 2)]).unwrap();
    let out = run(&mut s, &Attention::INFO, &case.shapes(), &case.inputs()).unwrap();
    assert_eq!(out[0].0, case.q_shape);
    assert_close(&out[0].1, &case.reference(), &format!("{t} Attention O"));

    // CausalConv3d: Y has T − kT + 1 frames and K channels.
    let (x_shape, kernel) = CONV_CASES[0];
    let case = ConvCase::<T>::new(&mut rng, x_shape, kernel);
    let mut s = session::<T>(&CausalConv3d::INFO, &[]).unwrap();
    let out = run(&mut s, &CausalConv3d::INFO, &case.shapes(), &case.inputs()).unwrap();
    assert_eq!(out[0].0, case.y_shape());
    assert_close(&out[0].1, &case.reference(), &format!("{t} CausalConv3d Y"));

    let (x_shape, params) = GRLN_CASES[0];
    let case = GrlnCase::<T>::new(&mut rng, x_shape, params);
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

#[test]
fn every_operator_runs_through_onnx_runtime() {
    check_through_onnx_runtime::<f32>();
    check_through_onnx_runtime::<f16>();
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
    assert_eq!(define("THREADS"), row_launch::THREADS as usize);
    assert_eq!(define("GROUP_THREADS"), row_launch::GROUP_THREADS as usize);
    assert_eq!(define("ROW_FLOATS"), row_launch::ROW_FLOATS);
    assert_eq!(define("GROUP_UNITS"), row_launch::GROUP_UNITS);
    assert_eq!((row_launch::MAX_D, row_launch::GROUP_MAX_D), (2048, 512));
    assert_eq!(define("MERGE_MAX_PARTS"), super::attention::MAX_PARTS);
    assert_eq!(
        define("MERGE_THREADS"),
        super::attention::MERGE_THREADS as usize
    );
}

/// kernels.cu compiles with NVRTC, to PTX for compute_90 and to an sm_90 cubin (what sessions
/// load), with every entry point (every layout of every row operator) and without local memory (the rows stay in
/// registers). Needs
/// CUDA 13's NVRTC, not a GPU:
/// `LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib cargo test --release --lib nvrtc -- --ignored`.
#[test]
#[ignore = "needs libnvrtc.so.13 on LD_LIBRARY_PATH"]
fn nvrtc_compiles_the_kernels() {
    cuda::check_nvrtc().unwrap();
    let ptx = String::from_utf8(cuda::compile("compute_90").unwrap()).unwrap();
    let mut names: Vec<String> = cuda::OTHER_ENTRY_POINTS.map(String::from).to_vec();
    for base in row_kernels() {
        for ty in [TensorElementType::Float32, TensorElementType::Float16] {
            for layout in row_launch::Layout::KINDS {
                names.push(row_launch::entry_point(base, ty, layout).unwrap());
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

//! The tests that span the operators: every operator through ONNX Runtime (CPU provider), the
//! CUDA domain without CUDA, and the CUDA source through NVRTC (ignored: needs `libnvrtc.so.13` on
//! LD_LIBRARY_PATH, not a GPU).

use half::f16;
use ort::value::TensorElementType;

use super::test_support::*;
use super::*;

/// Each operator's check through ONNX Runtime, in turn, on cases drawn from one generator.
fn check_through_onnx_runtime<T: Tolerance>() {
    let mut rng = Rng(4);
    ops::bias_rms_norm_rope::tests::check_through_onnx_runtime::<T>(&mut rng);
    ops::bias_rms_norm::tests::check_through_onnx_runtime::<T>(&mut rng);
    ops::bias_gelu::tests::check_through_onnx_runtime::<T>(&mut rng);
    ops::matmul_bias_gelu::tests::check_through_onnx_runtime::<T>(&mut rng);
    ops::matmul_fp8::tests::check_through_onnx_runtime::<T>(&mut rng);
    ops::prefix_bias_rms_norm::tests::check_through_onnx_runtime::<T>(&mut rng);
    ops::attention::tests::check_through_onnx_runtime::<T>(&mut rng);
    ops::causal_conv3d::tests::check_through_onnx_runtime::<T>(&mut rng);
    ops::gated_residual_layer_norm::tests::check_through_onnx_runtime::<T>(&mut rng);
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
/// load), with every entry point (every layout of every row operator of the registry) and without
/// local memory (the rows stay in registers). Needs CUDA 13's NVRTC, not a GPU: `scripts/test`
/// runs it with the test packages' NVRTC on the library path (by hand:
/// `LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib cargo test --lib nvrtc -- --ignored`).
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

//! The tests that span the operators: every operator through ONNX Runtime (CPU provider), the
//! CUDA domain without CUDA, and the CUDA source through NVRTC (ignored: needs `libnvrtc.so.13` on
//! LD_LIBRARY_PATH, not a GPU).

use half::f16;

use super::test_support::*;
use super::*;

/// Every operator of the registry through ONNX Runtime, in turn, on cases drawn from one
/// generator ([`ops::check_through_onnx_runtime`]).
#[test]
fn every_operator_runs_through_onnx_runtime() {
    let mut rng = Rng(4);
    ops::check_through_onnx_runtime::<f32>(&mut rng);
    ops::check_through_onnx_runtime::<f16>(&mut rng);
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

/// The CUDA errors' messages: what failed, and what to do instead.
#[test]
fn cuda_errors_say_what_failed_and_what_to_do() {
    use cuda::CudaError;
    let no_nvrtc = CudaError::NoNvrtc {
        reason: "not found".to_string(),
    };
    assert_eq!(
        no_nvrtc.to_string(),
        format!(
            "unstep CUDA kernels: could not load NVRTC (libnvrtc.so.13): not found; put CUDA 13's \
             NVRTC on LD_LIBRARY_PATH (`pip install nvidia-cuda-nvrtc==13.*` puts it in \
             site-packages/nvidia/cu13/lib), {REMEDY}"
        )
    );
    let missing = CudaError::NoEntryPoint("unstep_x_f16".to_string());
    assert_eq!(
        CudaError::WithRemedy(Box::new(missing.clone())).to_string(),
        format!("unstep CUDA kernels: kernels.cu has no entry point unstep_x_f16; {REMEDY}")
    );
    assert_eq!(
        CudaError::Kernels(Box::new(missing)).to_string(),
        "unstep CUDA kernels: unstep CUDA kernels: kernels.cu has no entry point unstep_x_f16"
    );
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
    for name in entry_points() {
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

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

/// The backends' errors say what failed, where, and why, with the operator and "(CUDA)" in front
/// of a failed call's (no CUDA error here: the driver's names need the driver).
#[test]
fn backend_errors_say_what_failed_and_where() {
    use cudarc::cublaslt::result::CublasError;
    use cudarc::cublaslt::sys::cublasStatus_t;
    use cudnn::CudnnError;
    let unsupported = CublasError(cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED);
    let call = |what: &str| CudnnError::Call {
        what: what.to_string(),
        name: "CUDNN_STATUS_NOT_SUPPORTED".to_string(),
        status: 3000,
    };
    assert_eq!(
        CudnnError::NotLoaded {
            reason: "not found".to_string()
        }
        .to_string(),
        format!(
            "ai.unstep Attention and CausalConv3d: could not load cuDNN (libcudnn.so.9): not \
             found; put cuDNN 9.13.1 or later on LD_LIBRARY_PATH (`pip install \
             nvidia-cudnn-cu13` puts it in site-packages/nvidia/cudnn/lib), {REMEDY}"
        )
    );
    assert_eq!(
        CudnnError::TooOld { version: 90100 }.to_string(),
        format!(
            "ai.unstep Attention and CausalConv3d: cuDNN 90100 has no SDPA operation (9.13.1 and \
             later have it); put cuDNN 9.13.1 or later on LD_LIBRARY_PATH (`pip install \
             nvidia-cudnn-cu13` puts it in site-packages/nvidia/cudnn/lib), {REMEDY}"
        )
    );
    assert_eq!(
        CudnnError::Misaligned {
            name: "Q",
            address: 0x1008
        }
        .to_string(),
        "Q at 0x1008 is not aligned to 16 bytes, as cuDNN needs"
    );
    let no_engine = attention::AttentionError::NoEngine {
        dims_q: [1, 12, 4224, 128],
        dims_kv: [1, 12, 4680, 128],
        tried: 2,
        reasons: vec![call("cudnnBackendFinalize (execution plan)"), call("x")],
    };
    assert_eq!(
        attention::AttentionError::LastRows {
            parts: 4,
            source: Box::new(no_engine),
        }
        .to_string(),
        "cuDNN has no engine for this attention (Q [1, 12, 4224, 128], K and V [1, 12, 4680, \
         128], 2 engine configurations tried: cudnnBackendFinalize (execution plan): \
         CUDNN_STATUS_NOT_SUPPORTED (3000); x: CUDNN_STATUS_NOT_SUPPORTED (3000)) (the last rows, \
         over 4 runs of the keys)"
    );
    let conv = conv::ConvError::NoEngine {
        shape: "X [1, 3, 8, 8, 16], W [16, 3, 3, 3, 16], float16".to_string(),
        reasons: vec![
            conv::ConvError::Engine {
                engine: 7,
                source: call("cudnnBackendFinalize (execution plan)"),
            },
            conv::ConvError::EngineWorkspace {
                engine: 9,
                mib: 512,
            },
        ],
    };
    assert_eq!(
        conv.to_string(),
        "cuDNN has no engine for this convolution (X [1, 3, 8, 8, 16], W [16, 3, 3, 3, 16], \
         float16): engine 7: cudnnBackendFinalize (execution plan): CUDNN_STATUS_NOT_SUPPORTED \
         (3000); engine 9 needs 512 MiB of workspace"
    );
    let fp8 = gemm::GemmError::Sizes {
        fp8: true,
        m: 4680,
        k: 1536,
        n: 8960,
        source: Box::new(gemm::GemmError::Fp8Call {
            call: "cublasLtMatmulAlgoGetHeuristic",
            source: unsupported,
        }),
    };
    assert_eq!(
        fp8.to_string(),
        format!(
            "cublasLtMatmul (float8, 4680 × 1536 × 8960): cublasLtMatmulAlgoGetHeuristic: \
             {unsupported} (float8 matrix multiplies with per-channel scales need cuBLAS 12.9 or \
             later on compute capability 9.0 or later, and K a multiple of 16)"
        )
    );
    let pointers = gemm::GemmError::Pointers {
        count: 3,
        expected: "X, W, bias and Y",
    };
    assert_eq!(
        pointers.to_string(),
        "3 pointers, expected X, W, bias and Y"
    );
    let launch = operator::CudaCallError {
        op: "BiasRmsNorm",
        source: row_launch::RowError::RowD(2050),
    };
    assert_eq!(
        launch.to_string(),
        "ai.unstep BiasRmsNorm: (CUDA) D = 2050: the CUDA kernels need an even D of at most 2048"
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

/// kernels.cu compiles with NVRTC, to PTX for compute_90 and to cubins (what sessions load) for
/// Hopper (sm_90) and Blackwell (sm_100, sm_103, sm_120), with every entry point (every layout of every row operator of the registry) and without
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
    // Hopper, and Blackwell's data-centre (GB200: sm_100, GB300: sm_103) and desktop (sm_120)
    // GPUs: the row kernels use no instruction of one architecture alone.
    for arch in ["sm_90", "sm_100", "sm_103", "sm_120"] {
        let cubin = cuda::compile(arch).unwrap();
        assert_eq!(
            &cubin[..4],
            b"\x7fELF",
            "an {arch} compile gives a cubin (ELF)"
        );
    }
}

/// `attention8.cu` compiles with NVRTC for `sm_90a` (Hopper's wgmma and bulk tensor copies) to a
/// cubin with every entry point the host side launches, none of them spilling to local memory
/// (`LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib cargo test --lib nvrtc -- --ignored`).
#[test]
#[ignore = "needs libnvrtc.so.13 on LD_LIBRARY_PATH"]
fn nvrtc_compiles_the_8bit_attention() {
    cuda::check_nvrtc().unwrap();
    let ptx =
        String::from_utf8(cuda::compile_source(&attention8::ATTENTION8, "compute_90a").unwrap())
            .unwrap();
    for name in super::attention8::ENTRY_POINTS {
        assert!(
            ptx.contains(&format!(".entry {name}(")),
            "no entry point {name} in the PTX"
        );
    }
    assert!(
        ptx.contains("wgmma.mma_async"),
        "the attention runs on wgmma"
    );
    assert!(!ptx.contains(".local"), "a kernel uses local memory");
    let cubin = cuda::compile_source(&attention8::ATTENTION8, "sm_90a").unwrap();
    assert_eq!(
        &cubin[..4],
        b"\x7fELF",
        "an sm_90a compile gives a cubin (ELF)"
    );
}

/// The compiled image kept in the kernel cache folder is named by everything it depends on: a
/// later process finds it under the same name, and another architecture, NVRTC version or
/// source never reads it.
#[test]
fn the_kept_image_is_named_by_its_source_architecture_and_nvrtc() {
    let dir = std::path::Path::new("cache");
    let file = cuda::image_file(dir, &cuda::KERNELS, "sm_90", "13.0");
    assert!(file.starts_with(dir.join("nvrtc")), "{}", file.display());
    assert_eq!(file, cuda::image_file(dir, &cuda::KERNELS, "sm_90", "13.0"));
    for other in [
        cuda::image_file(dir, &cuda::KERNELS, "sm_100", "13.0"),
        cuda::image_file(dir, &cuda::KERNELS, "sm_90", "13.1"),
        cuda::image_file(dir, &attention8::ATTENTION8, "sm_90", "13.0"),
    ] {
        assert_ne!(file, other);
    }
}

use super::*;

thread_local! {
    /// Tests only: the CPU provider takes [`DitAttention::OnnxRuntimeInFused`] too (whose
    /// session is built on the thread that builds the generator), so that the rewritten
    /// fused DiT can be compared with the runner's on a machine without a GPU. Users' CPU
    /// runs keep the runner's attention kernel.
    pub(crate) static REWRITE_ON_CPU: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The switches a run's record keeps, named by their variables, in a fixed order; none
/// when none is on (an empty optimizer list is a switch: it turns every optimizer on).
#[test]
fn diagnostics_in_effect_name_their_variables() {
    assert!(Diagnostics::default().in_effect().is_empty());
    let on = Diagnostics {
        ort_profile_dir: Some("profiles".into()),
        ort_log_level: Some("info".into()),
        disabled_optimizers: Some(String::new()),
        conv_log: true,
    };
    assert_eq!(
        on.in_effect(),
        [
            "UNSTEP_ORT_PROFILE=profiles",
            "UNSTEP_ORT_LOG=info",
            "UNSTEP_ORT_DISABLE_OPTIMIZERS=",
            "UNSTEP_CONV_LOG=1"
        ]
    );
}

/// The tiny bundle (which has every fused graph) as an fp8 bundle.
fn fp8_bundle() -> Bundle {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/tiny");
    let mut bundle = Bundle::peek(&dir).unwrap();
    bundle.manifest.precision = Precision::Fp8;
    bundle
}

fn cuda(attention: AttentionBackend) -> Provider {
    Provider::Cuda(CudaOptions {
        attention,
        ..CudaOptions::default()
    })
}

/// The fp8 refusal's reason, or a panic naming what came instead.
fn fp8_refusal(result: Result<FusedKernels, SessionError>) -> String {
    match result {
        Err(e @ SessionError::Fp8NeedsRunnerKernels { .. }) => e.to_string(),
        other => panic!("expected the fp8 refusal, got {other:?}"),
    }
}

/// An fp8 bundle's tensors are fp16's, so attention resolves and checks as for fp16.
#[test]
fn fp8_attention_resolves_as_fp16() {
    for kernel in <AttentionBackend as strum::VariantArray>::VARIANTS {
        assert_eq!(
            kernel.resolve(Precision::Fp8),
            kernel.resolve(Precision::Fp16),
            "{kernel}"
        );
        let provider = cuda(*kernel);
        assert_eq!(
            kernel.check(&provider, Precision::Fp8).is_ok(),
            kernel.check(&provider, Precision::Fp16).is_ok(),
            "{kernel}"
        );
    }
    assert_eq!(
        AttentionBackend::Auto.resolve(Precision::Fp8),
        AttentionBackend::CudnnFlash
    );
}

/// The DiT of an fp8 bundle has only the runner's kernels: ONNX Runtime's asked for by name is
/// refused on every provider, with what to do.
#[test]
fn fp8_refuses_onnxruntime_kernels_for_the_dit() {
    let bundle = fp8_bundle();
    for provider in [
        Provider::Cpu,
        cuda(AttentionBackend::Auto),
        Provider::TensorRt(TensorRtOptions::default()),
    ] {
        let message =
            fp8_refusal(FusedKernels::Onnxruntime.resolve(FusedPart::Dit, &provider, &bundle));
        assert!(
            message.contains("8-bit matrix multiplies only with the runner's kernels")
                && message.contains("runtime.dit_kernels = \"onnxruntime\"")
                && message.contains("`--dit-kernels auto`"),
            "{message}"
        );
    }
    // The decoder of an fp8 bundle is fp16's: ONNX Runtime's kernels run it.
    assert_eq!(
        FusedKernels::Onnxruntime
            .resolve(FusedPart::Vae, &cuda(AttentionBackend::Auto), &bundle)
            .unwrap(),
        FusedKernels::Onnxruntime
    );
}

/// `auto` and `unstep` need the CUDA provider; `auto`
/// never falls back to ONNX Runtime's kernels for an fp8 bundle's DiT.
#[test]
fn fp8_dit_kernels_need_cuda_and_the_fused_attention() {
    let bundle = fp8_bundle();
    assert!(bundle.manifest.fused_dit_has_runner_attention());
    for kernels in [FusedKernels::Auto, FusedKernels::Unstep] {
        for (provider, name) in [
            (Provider::Cpu, "cpu"),
            (Provider::TensorRt(TensorRtOptions::default()), "tensorrt"),
        ] {
            let message = fp8_refusal(kernels.resolve(FusedPart::Dit, &provider, &bundle));
            assert!(
                message.contains(&format!("provider is {name}"))
                    && message.contains("runtime.provider = \"cuda\""),
                "{kernels}: {message}"
            );
        }
    }
    // Another attention backend keeps the fused DiT, with ONNX Runtime's attention in it.
    let flash = cuda(AttentionBackend::Flash);
    assert_eq!(
        FusedKernels::Unstep
            .resolve(FusedPart::Dit, &flash, &bundle)
            .unwrap(),
        FusedKernels::Unstep
    );
    let auto = cuda(AttentionBackend::Auto);
    assert_eq!(
        FusedKernels::Unstep
            .resolve(FusedPart::Dit, &auto, &bundle)
            .unwrap(),
        FusedKernels::Unstep
    );
    // Where NVRTC, cuBLASLt and cuDNN do not load, `auto` is refused instead of falling back.
    match FusedKernels::Auto.resolve(FusedPart::Dit, &auto, &bundle) {
        Ok(kernels) => assert_eq!(kernels, FusedKernels::Unstep),
        Err(e) => {
            let message = fp8_refusal(Err(e));
            assert!(
                message.contains("`runner doctor`")
                    && !message.contains("--dit-kernels onnxruntime"),
                "{message}"
            );
        }
    }
}

/// Without `dit_fused` (a bundle the consistency check would refuse, peeked), the refusal
/// says so.
#[test]
fn fp8_without_a_fused_dit_is_refused() {
    let mut bundle = fp8_bundle();
    bundle.manifest.graphs.dit_fused = None;
    let message = fp8_refusal(FusedKernels::Unstep.resolve(
        FusedPart::Dit,
        &cuda(AttentionBackend::Auto),
        &bundle,
    ));
    assert!(message.contains("no `dit_fused` graph"), "{message}");
}

/// A failure to build the runner's operators names the fp8 requirement for an fp8 DiT, without
/// the CUDA kernels' suggestion of ONNX Runtime's kernels, and suggests those for the others.
#[test]
fn unavailable_kernels_of_an_fp8_dit_do_not_suggest_onnxruntime() {
    let provider = cuda(AttentionBackend::Auto);
    let reason = format!(
        "could not load NVRTC; put it on LD_LIBRARY_PATH, {}",
        crate::engine::kernels::REMEDY
    );
    let fp8 = FusedPart::Dit.unavailable(&provider, Precision::Fp8, reason.clone());
    assert!(
        matches!(fp8, SessionError::Fp8NeedsRunnerKernels { .. })
            && fp8.to_string().ends_with("put it on LD_LIBRARY_PATH")
            && !fp8.to_string().contains("onnxruntime\""),
        "{fp8}"
    );
    for (part, precision) in [
        (FusedPart::Dit, Precision::Fp16),
        (FusedPart::Vae, Precision::Fp8),
    ] {
        let other = part.unavailable(&provider, precision, reason.clone());
        assert!(
            other.to_string().contains("= \"onnxruntime\""),
            "{part:?} {precision}: {other}"
        );
    }
}

/// On CUDA an fp16 or fp8 bundle's fused DiT runs with every attention backend: `auto` and
/// `cudnn_flash` are the runner's cuDNN call, the others ONNX Runtime's `MultiHeadAttention`
/// in its place, and the records say which. An fp32 bundle keeps the standard graph for those
/// (`auto` falls back, `unstep` is refused); the CPU keeps the runner's CPU kernel; a fused
/// DiT of an exporter before 0.10.0 has ONNX Runtime's attention as exported.
#[test]
fn the_fused_dit_runs_every_attention_backend_on_cuda() {
    use AttentionBackend::{Auto, CudnnFlash, Fa2};
    for precision in [Precision::Fp16, Precision::Fp8] {
        let mut bundle = fp8_bundle();
        bundle.manifest.precision = precision;
        for &kernel in <AttentionBackend as strum::VariantArray>::VARIANTS {
            let provider = cuda(kernel);
            let kernels = FusedKernels::Unstep
                .resolve(FusedPart::Dit, &provider, &bundle)
                .unwrap();
            assert_eq!(kernels, FusedKernels::Unstep, "{precision} {kernel}");
            let attention = DitAttention::of(kernels, &provider, &bundle.manifest);
            let described = attention.describe(&provider, precision).unwrap();
            if matches!(kernel, Auto | CudnnFlash) {
                assert_eq!(attention, DitAttention::Runner, "{precision} {kernel}");
                assert!(described.contains("runner's own cuDNN call"), "{described}");
            } else {
                assert_eq!(attention, DitAttention::OnnxRuntimeInFused, "{kernel}");
                assert!(
                    described.contains(kernel.onnxruntime_kernel())
                        && described.contains("in the fused DiT"),
                    "{described}"
                );
            }
        }
        let described = DitAttention::OnnxRuntimeInFused
            .describe(&cuda(Fa2), precision)
            .unwrap();
        assert!(
            described.contains("ONNX Runtime's FlashAttention-2 in the fused DiT"),
            "{described}"
        );
    }

    let mut fp32 = fp8_bundle();
    fp32.manifest.precision = Precision::Fp32;
    for kernel in [AttentionBackend::Efficient, AttentionBackend::Math, Auto] {
        let provider = cuda(kernel);
        let message = FusedKernels::Unstep
            .resolve(FusedPart::Dit, &provider, &fp32)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("this one is fp32") && message.contains("--dit-kernels"),
            "{kernel}: {message}"
        );
        assert_eq!(
            FusedKernels::Auto
                .resolve(FusedPart::Dit, &provider, &fp32)
                .unwrap(),
            FusedKernels::Onnxruntime
        );
    }

    let mut fp16 = fp8_bundle();
    fp16.manifest.precision = Precision::Fp16;
    let m = &fp16.manifest;
    assert_eq!(
        DitAttention::of(FusedKernels::Unstep, &Provider::Cpu, m),
        DitAttention::Runner
    );
    assert_eq!(
        DitAttention::Runner.describe(&Provider::Cpu, m.precision),
        None
    );
    assert_eq!(
        DitAttention::of(FusedKernels::Onnxruntime, &cuda(Fa2), m),
        DitAttention::OnnxRuntime
    );
    let mut older = fp16.clone();
    older.manifest.exporter_version = "0.9.0".into();
    assert_eq!(
        DitAttention::of(FusedKernels::Unstep, &cuda(Fa2), &older.manifest),
        DitAttention::OnnxRuntime
    );
    assert_eq!(
        DitAttention::OnnxRuntime.describe(&cuda(Fa2), m.precision),
        None
    );
}

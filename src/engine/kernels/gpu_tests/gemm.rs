//! The GPU tests of the cuBLASLt kernels: `MatMulBiasGelu` and `MatMulFp8` against their CPU
//! kernels, their rates against each other, and the configurations and algorithms cuBLASLt
//! offers for them.

use super::*;

/// Runs a MatMulBiasGelu case with the cuBLASLt kernel ([`GemmKernel::launch_matmul`]) on
/// `stream` and returns Y and the mean time of one call (µs); with `repeats`, also prints that
/// time and its rate.
pub(super) fn run_gemm<T: Element>(
    case: &MatMulGeluCase<T>,
    stream: sys::CUstream,
    repeats: usize,
    what: &str,
) -> (Vec<T>, f64) {
    let plan = case.plan();
    let mut kernel =
        <GemmKernel as CudaKernel<MatMulBiasGelu>>::new(T::into_tensor_element_type(), 0).unwrap();
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
    kernel.launch_matmul(&plan, &pointers, stream).unwrap();
    let micros = mean_micros(stream, repeats, || {
        kernel.launch_matmul(&plan, &pointers, stream).unwrap();
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
    (download::<T>(&bufs[3], n), micros)
}

/// Runs a MatMulFp8 case with its CUDA kernel (quantisation, then cuBLASLt's float8 matmul) in
/// `probe`'s configuration on `stream` and returns Y and the mean time of one call over
/// `repeats` calls (µs), or the kernel's error.
fn run_fp8(
    case: &Fp8Case<f16>,
    stream: sys::CUstream,
    repeats: usize,
    probe: Probe,
) -> Result<(Vec<f16>, f64), GemmError> {
    let plan = case.plan();
    let mut kernel =
        <GemmKernel as CudaKernel<MatMulFp8>>::new(TensorElementType::Float16, 0).unwrap();
    kernel.probe = probe;
    let n = plan.rows * plan.cols;
    let w: &[u8] = &case.w;
    // SAFETY: as in `upload`, for the weight's bytes.
    let w = unsafe {
        let buf = DeviceBuf(driver::malloc_sync(w.len().max(4)).unwrap());
        driver::memcpy_htod_sync(buf.0, w).unwrap();
        buf
    };
    let bufs = [
        upload(&case.x),
        w,
        upload(&case.w_scale),
        upload(&case.bias),
        upload(&vec![f16::NAN; n]),
    ];
    let pointers: Vec<u64> = bufs.iter().map(|b| b.0).collect();
    let attrs = case.attrs();
    // As in `run_cuda`: the uploads may still be on their way.
    driver::ctx::synchronize().unwrap();
    kernel.launch_fp8(attrs.gelu, &plan, &pointers, stream)?;
    let micros = mean_micros(stream, repeats, || {
        kernel
            .launch_fp8(attrs.gelu, &plan, &pointers, stream)
            .unwrap();
    });
    // SAFETY: the test's stream.
    unsafe { driver::stream::synchronize(stream) }.unwrap();
    Ok((download::<f16>(&bufs[4], n), micros))
}

/// Which float8 configurations cuBLASLt takes on this GPU and how fast they are: epilogues
/// (none, bias, bias-GELU) and fast accumulation, over small and wan-1.3b sizes, each printed
/// with its error or its time and largest difference from the CPU kernel (which adds the bias
/// and, for gelu, GELU: the epilogue-less rows differ by them). The product's configuration
/// (bias or bias-GELU epilogue, no fast accumulation) must run at wan-1.3b's sizes.
/// `cargo test --release --lib cuda_fp8_configurations -- --ignored --nocapture`.
#[test]
#[ignore = "needs a CUDA GPU of compute capability 9.0 or later, its driver, NVRTC and cuBLASLt"]
fn cuda_fp8_configurations() {
    use cudarc::cublaslt::sys::cublasLtEpilogue_t::*;
    let stream = test_stream();
    let mut rng = Rng(22);
    let shapes: [(&[i64], usize, bool); 5] = [
        (&[2, 3, 16], 24, false),
        (&[1, 64, 64], 64, true),
        (&[1, 4680, 1536], 1536, false),
        (&[1, 4680, 1536], 8960, true),
        (&[1, 4680, 8960], 1536, false),
    ];
    let mut product_failures = Vec::new();
    for (shape, n, gelu) in shapes {
        let case = Fp8Case::<f16>::new(&mut rng, shape, n, gelu);
        let cpu = case.cpu();
        let wan = case.plan().rows > 1000;
        for epilogue in [
            None,
            Some(CUBLASLT_EPILOGUE_DEFAULT),
            Some(CUBLASLT_EPILOGUE_BIAS),
        ] {
            for fast_accumulation in [false, true] {
                let probe = Probe {
                    epilogue,
                    fast_accumulation,
                };
                let what = format!("{shape:?} N = {n} gelu = {gelu} {probe:?}");
                match run_fp8(&case, stream, if wan { 20 } else { 0 }, probe) {
                    Ok((gpu, micros)) => {
                        let worst = gpu
                            .iter()
                            .zip(&cpu)
                            .map(|(g, c)| (g.to_f32() - c.to_f32()).abs())
                            .fold(0f32, f32::max);
                        eprintln!("{what}: ran, {micros:.1} µs, largest difference {worst}");
                    }
                    Err(e) => {
                        eprintln!("{what}: {e}");
                        if wan && epilogue.is_none() && !fast_accumulation {
                            product_failures.push(what);
                        }
                    }
                }
            }
        }
    }
    assert!(
        product_failures.is_empty(),
        "the product's configuration failed: {product_failures:?}"
    );
}

/// MatMulFp8 on a GPU (compute capability 9.0 or later) against its CPU kernel, which quantises
/// X the same way: the test cases whose K is a multiple of 16 and wan-1.3b's block matmuls (4,680
/// tokens: QKV 1536 → 4608, output projection 1536 → 1536, the FFN's 1536 → 8960 with GELU and
/// 8960 → 1536), each of the latter timed against the float16 `MatMulBiasGelu` of the same sizes
/// in the same run (the float16 rate's reference; its GELU epilogue costs a few percent).
/// `cargo test --release --lib cuda_matmul_fp8 -- --ignored --nocapture`.
#[test]
#[ignore = "needs a CUDA GPU of compute capability 9.0 or later, its driver, NVRTC and cuBLASLt"]
fn cuda_matmul_fp8_matches_the_cpu_kernel() {
    let stream = test_stream();
    let mut rng = Rng(21);
    let wan: [(&[i64], usize, bool); 4] = [
        (&[1, 4680, 1536], 4608, false),
        (&[1, 4680, 1536], 1536, false),
        (&[1, 4680, 1536], 8960, true),
        (&[1, 4680, 8960], 1536, false),
    ];
    let cases = FP8_CASES
        .into_iter()
        .filter(|(shape, _, _)| shape.last().unwrap() % 16 == 0)
        .map(|case| (case, 0))
        .chain(wan.into_iter().map(|case| (case, 20)));
    for ((shape, n, gelu), repeats) in cases {
        let case = Fp8Case::<f16>::new(&mut rng, shape, n, gelu);
        let what = format!("MatMulFp8 {shape:?} N = {n} gelu = {gelu}");
        let (gpu, micros) = run_fp8(&case, stream, repeats, Probe::default()).unwrap();
        let cpu = case.cpu();
        // The same 8-bit values on both; the sums run in another order and cuBLASLt's epilogue
        // has its own tanh: within a few float16 units in the last place.
        for (i, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
            let (g, c) = (g.to_f32() as f64, c.to_f32() as f64);
            assert!(
                (g - c).abs() <= 2e-3 + 4.0 / 1024.0 * g.abs().max(c.abs()),
                "{what}[{i}]: GPU {g}, CPU {c}"
            );
        }
        if repeats > 0 {
            let reference = MatMulGeluCase::<f16>::new(&mut rng, shape, n);
            let (_, fp16_micros) = run_gemm(&reference, stream, repeats, "  float16 reference");
            let flops = 2.0 * (case.plan().rows * case.k() * n) as f64;
            eprintln!(
                "{what}: {micros:.1} µs per call (quantisation included), {:.0} TFLOP/s; \
                 {:.2}x the float16 reference's time",
                flops / micros / 1e6,
                micros / fp16_micros
            );
        }
    }
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
        let mut kernel =
            <GemmKernel as CudaKernel<MatMulBiasGelu>>::new(TensorElementType::Float16, 0).unwrap();
        kernel.algo_rank = rank;
        if let Err(e) = kernel.launch_matmul(&plan, &pointers, stream) {
            eprintln!("rank {rank}: {e}");
            break;
        }
        let micros = mean_micros(stream, 30, || {
            kernel.launch_matmul(&plan, &pointers, stream).unwrap();
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

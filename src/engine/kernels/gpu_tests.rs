//! The CUDA kernels on a GPU against the CPU kernels (ignored: need a CUDA GPU, its driver, NVRTC,
//! cuBLASLt and cuDNN on LD_LIBRARY_PATH), and their times.

use cudarc::driver::{result as driver, sys};
use half::f16;
use ort::value::TensorElementType;

use super::attention::{self, AttentionKernel};
use super::attention8::Attention8;
use super::conv::ConvKernel;
use super::cuda;
use super::gemm::{GemmError, GemmKernel, Probe};
use super::operator::Element;
use super::operator::{CudaKernel, UnstepOp};
use super::ops::attention::tests::*;
use super::ops::bias_gelu::tests::*;
use super::ops::bias_rms_norm::tests::*;
use super::ops::bias_rms_norm_rope::tests::*;
use super::ops::causal_conv3d::tests::*;
use super::ops::gated_residual_layer_norm::tests::*;
use super::ops::matmul_bias_gelu::tests::*;
use super::ops::matmul_fp8::tests::*;
use super::ops::prefix_bias_rms_norm::tests::*;
use super::ops::qkv_norm_rope_cache::tests::*;
use super::ops::*;
use super::row_launch::{RowKernel, RowOp, check_d};
use super::test_support::*;

mod gemm;
use gemm::run_gemm;

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
) -> (Vec<Vec<T>>, f64)
where
    C::Op: RowOp,
{
    let (op, attrs, inputs) = (&C::Op::INFO, &case.attrs(), case.inputs());
    let plan = case.plan();
    let mut kernel = RowKernel::<C::Op>::new(T::into_tensor_element_type(), 0).unwrap();
    let args = C::Op::args(attrs, &plan);
    let n = args.launch_rows * args.d;
    let sentinel = vec![T::from_f32(f32::NAN); n];
    let bufs: Vec<DeviceBuf> = inputs
        .iter()
        .map(|data| upload(data))
        .chain(op.outputs.iter().map(|_| upload(&sentinel)))
        .collect();
    let pointers: Vec<u64> = bufs.iter().map(|b| b.0).collect();
    // The uploads are synchronous copies from pageable memory, which may return before the
    // copy reaches the device, and the test's stream does not wait for the legacy stream
    // (it is non-blocking): without this, a kernel could read a buffer still being written.
    driver::ctx::synchronize().unwrap();
    kernel.launch(attrs, &plan, &pointers, stream).unwrap();
    let micros = mean_micros(stream, repeats, || {
        kernel.launch(attrs, &plan, &pointers, stream).unwrap();
    });
    // SAFETY: the test's stream.
    unsafe { driver::stream::synchronize(stream) }.unwrap();
    let outputs = bufs[inputs.len()..]
        .iter()
        .map(|b| download::<T>(b, n))
        .chain(
            op.in_place
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

/// Runs an Attention case with cuDNN ([`AttentionKernel::launch_attention`]: split over at
/// most `max_parts` runs of the keys, or one call for 0) on `stream`; returns O and, with
/// `repeats`, the mean time of one call in µs.
fn run_attention(
    case: &AttentionCase<f16>,
    stream: sys::CUstream,
    max_parts: usize,
    repeats: usize,
) -> (Vec<f16>, f64) {
    let plan = case.plan();
    let mut kernel =
        <AttentionKernel as CudaKernel<Attention>>::new(TensorElementType::Float16, 0).unwrap();
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
    kernel.launch_attention(&plan, &pointers, stream).unwrap();
    let micros = mean_micros(stream, repeats, || {
        kernel.launch_attention(&plan, &pointers, stream).unwrap();
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
    let mut kernel =
        <ConvKernel as CudaKernel<CausalConv3d>>::new(T::into_tensor_element_type(), 0).unwrap();
    let n = case.written();
    let bufs: Vec<DeviceBuf> = case
        .inputs()
        .iter()
        .map(|data| upload(data))
        .chain([upload(&vec![T::from_f32(f32::NAN); n])])
        .collect();
    let pointers: Vec<u64> = bufs.iter().map(|b| b.0).collect();
    driver::ctx::synchronize().unwrap();
    kernel.launch_conv(&plan, &pointers, stream).unwrap();
    let micros = mean_micros(stream, repeats, || {
        kernel.launch_conv(&plan, &pointers, stream).unwrap();
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
fn run_case<T: Element, C: OpCase<T>>(case: &C, stream: sys::CUstream, what: &str) -> Vec<Vec<T>>
where
    C::Op: RowOp,
{
    let (op, inputs) = (&C::Op::INFO, case.inputs());
    let big = inputs[op.x_index].len() > 1_000_000;
    let (outputs, micros) = run_cuda(case, stream, if big { 50 } else { 0 });
    if big {
        let read: usize = (0..inputs.len())
            .filter(|i| !op.in_place.contains(i))
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
    check_rope::<T>(t, &mut rng, stream);
    check_rms::<T>(t, &mut rng, stream);
    check_prefix::<T>(t, &mut rng, stream);
    check_grln::<T>(t, &mut rng, stream);
    check_gelu::<T>(t, &mut rng, stream);
    check_gemm::<T>(t, &mut rng, stream);
    check_qkv::<T>(t, &mut rng, stream);
}

/// BiasRmsNormRope: the test cases, wan-1.3b's, and each row layout.
fn check_rope<T: Tolerance>(t: &str, rng: &mut Rng, stream: sys::CUstream) {
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
        let case = RopeCase::<T>::new(rng, x_shape, heads, tc);
        let what = format!("{t} BiasRmsNormRope {x_shape:?}");
        let gpu = run_case(&case, stream, &what);
        assert_matches_cpu(&gpu[0], &case.cpu(), &what);
        assert_close(&gpu[0], &case.reference(), &what);
    }
}

/// BiasRmsNorm, plain and with SiLU.
fn check_rms<T: Tolerance>(t: &str, rng: &mut Rng, stream: sys::CUstream) {
    // Plain and SiLU: the test shapes; wan-1.3b's rows; the block layouts' D (4-element accesses:
    // 1000, not a multiple of 4 · 128; 2048, the largest; 100 for float16, which the group layout
    // cannot take; pairs: 514, the smallest, and 2); the group layout's, with row counts that are
    // not a multiple of a block's rows (D = 96 and 384, the VAE's channels; 16 and 64, the tiny
    // model's; 512, the largest; 8, one lane per row for float16). And the VAE decoder's largest: 4
    // frames of 480 × 832 rows of 96 channels.
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
        .filter(|shape| {
            check_d(
                <BiasRmsNorm as RowOp>::ELEMENTWISE,
                *shape.last().unwrap() as usize,
            )
            .is_ok()
        })
        .chain(block_shapes)
        .chain(group_shapes)
        .collect();
    let rms_cases = [false, true]
        .into_iter()
        .flat_map(|silu| shapes.iter().map(move |&shape| (shape, silu)))
        .chain([(&[4, 480, 832, 96][..], true)]);
    for (x_shape, silu) in rms_cases {
        let case = RmsCase::<T>::new(rng, x_shape, silu);
        let what = format!("{t} BiasRmsNorm {x_shape:?} silu = {silu}");
        let gpu = run_case(&case, stream, &what);
        assert_matches_cpu(&gpu[0], &case.cpu(), &what);
        assert_close(&gpu[0], &case.reference(), &what);
    }
}

/// PrefixBiasRmsNorm.
fn check_prefix<T: Tolerance>(t: &str, rng: &mut Rng, stream: sys::CUstream) {
    // PrefixBiasRmsNorm: the CPU cases (P = 0 among them), and the VAE decoder's largest
    // causal convolution input, a two-frame cache in front of 4 frames of 480 × 832 × 96.
    let prefix_cases = PREFIX_CASES
        .into_iter()
        .filter(|(x, _)| {
            check_d(
                <BiasRmsNorm as RowOp>::ELEMENTWISE,
                *x.last().unwrap() as usize,
            )
            .is_ok()
        })
        .chain([
            (&[1, 4, 480, 832, 96][..], 2),
            (&[1, 4, 240, 416, 192], 2),
            (&[1, 2, 120, 208, 384], 2),
        ]);
    for (x_shape, p) in prefix_cases {
        let case = PrefixCase::<T>::new(rng, x_shape, p, true);
        let what = format!("{t} PrefixBiasRmsNorm {x_shape:?} P = {p}");
        let gpu = run_case(&case, stream, &what);
        assert_matches_cpu(&gpu[0], &case.cpu(), &what);
        case.assert_matches(&gpu[0], &what);
        case.assert_tail(&gpu[0], &gpu[1][..case.prefix.len()], &what);
    }
}

/// GatedResidualLayerNorm: S and Y.
fn check_grln<T: Tolerance>(t: &str, rng: &mut Rng, stream: sys::CUstream) {
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
        let case = GrlnCase::<T>::new(rng, x_shape, params);
        let what = format!("{t} GatedResidualLayerNorm {x_shape:?} {params:?}");
        let gpu = run_case(&case, stream, &what);
        let (cpu_s, cpu_y) = case.cpu();
        // S is elementwise: the same float32 operations in the same order on both.
        assert!(gpu[0] == cpu_s, "{what}: S differs between GPU and CPU");
        assert_matches_cpu(&gpu[1], &cpu_y, &format!("{what} Y"));
        let (want_s, want_y) = case.reference();
        assert_close(&gpu[0], &want_s, &format!("{what} S"));
        assert_close(&gpu[1], &want_y, &format!("{what} Y"));
    }
}

/// BiasGelu.
fn check_gelu<T: Tolerance>(t: &str, rng: &mut Rng, stream: sys::CUstream) {
    // BiasGelu: the test shapes, wan-1.3b's FFN (4680 rows of 8960), 4-element and pair
    // accesses (D = 100 for float16, D = 6).
    // GELU_SHAPES has an odd D for the CPU kernel, which the CUDA kernel refuses.
    let gelu_shapes = GELU_SHAPES
        .into_iter()
        .filter(|shape| {
            check_d(
                <BiasGelu as RowOp>::ELEMENTWISE,
                *shape.last().unwrap() as usize,
            )
            .is_ok()
        })
        .chain([&[1, 4680, 8960][..], &[7, 6], &[33, 100]]);
    for shape in gelu_shapes {
        let case = GeluCase::<T>::new(rng, shape);
        let what = format!("{t} BiasGelu {shape:?}");
        let gpu = run_case(&case, stream, &what);
        assert_matches_cpu(&gpu[0], &case.cpu(), &what);
        assert_close(&gpu[0], &case.reference(), &what);
    }
}

/// MatMulBiasGelu with cuBLASLt.
fn check_gemm<T: Tolerance>(t: &str, rng: &mut Rng, stream: sys::CUstream) {
    // MatMulBiasGelu: the test cases, and wan-1.3b's FFN (4680 tokens, 1536 → 8960, timed).
    // Against the CPU: the sums run in another order and cuBLASLt's epilogue has its own
    // tanh, so within a few units in the last place rather than one.
    let gemm_cases = MATMUL_GELU_CASES
        .into_iter()
        .map(|case| (case, 0))
        .chain([((&[1, 4680, 1536][..], 8960), 20)]);
    for ((shape, n), repeats) in gemm_cases {
        let case = MatMulGeluCase::<T>::new(rng, shape, n);
        let what = format!("{t} MatMulBiasGelu {shape:?} N = {n}");
        let (gpu, _) = run_gemm(&case, stream, repeats, &what);
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
}

/// QkvNormRopeCache: Q, and K and V written in place.
fn check_qkv<T: Tolerance>(t: &str, rng: &mut Rng, stream: sys::CUstream) {
    // QkvNormRopeCache: the test cases, and wan-1.3b's last block (T = 4680 of L = 32760
    // rows of 1536, 12 heads), whose cache writes land 27,000 rows in.
    let qkv_cases = QKV_CASES
        .into_iter()
        .chain([([1, 4680, 32760, 1536], 12, 4680), ([3, 7, 9, 64], 2, 7)]);
    for (sizes, heads, tc) in qkv_cases {
        let case = QkvCase::<T>::new(rng, sizes, heads, tc);
        let what = format!("{t} QkvNormRopeCache {sizes:?}");
        let gpu = run_case(&case, stream, &what);
        let (cpu_q, cpu_k, cpu_v) = case.cpu();
        assert_matches_cpu(&gpu[0], &cpu_q, &format!("{what} Q"));
        assert_matches_cpu(&gpu[1], &cpu_k, &format!("{what} K"));
        assert!(gpu[2] == cpu_v, "{what}: V differs between GPU and CPU");
        case.assert_matches((&gpu[0], &gpu[1], &gpu[2]), &what);
    }
}

/// The CUDA kernels, compiled with NVRTC and launched as a session launches them ([`RowKernel`]) on
/// a non-blocking stream, against the CPU kernels and the float64 reference, at the test shapes and
/// at wan-1.3b's (N = 4680, D = 1536, 12 heads); the block layouts at D = 2048 (the largest), D =
/// 1000 (4-element accesses not a multiple of 4 · 128) and D = 514 (pairs, the smallest); the group
/// layout at D = 8 to 512 with row counts that are not a multiple of a block's rows; BiasRmsNorm
/// with and without SiLU, up to the VAE decoder's 4 · 480 · 832 rows of 96. Prints the time per
/// launch of the large shapes. Needs a CUDA GPU and NVRTC: `LD_LIBRARY_PATH=<nvrtc lib> cargo test
/// --release --lib cuda_kernels -- --ignored --nocapture`.
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

/// Runs an Attention case in the 8-bit mode (`Attention8`) on `stream`; returns O and, with
/// `repeats`, the mean time of one call (quantisation included) in µs.
fn run_attention8(
    case: &AttentionCase<f16>,
    stream: sys::CUstream,
    repeats: usize,
) -> (Vec<f16>, f64) {
    let plan = case.plan();
    let kernel = Attention8::new(0).unwrap();
    let bufs: Vec<DeviceBuf> = case
        .inputs()
        .iter()
        .map(|data| upload(data))
        .chain([upload(&vec![f16::NAN; case.q.len()])])
        .collect();
    let pointers = [bufs[0].0, bufs[1].0, bufs[2].0, bufs[3].0];
    driver::ctx::synchronize().unwrap();
    kernel.launch(&plan, pointers, stream).unwrap();
    let micros = mean_micros(stream, repeats, || {
        kernel.launch(&plan, pointers, stream).unwrap();
    });
    // SAFETY: the test's stream.
    unsafe { driver::stream::synchronize(stream) }.unwrap();
    (download::<f16>(&bufs[3], case.q.len()), micros)
}

/// ‖a − b‖ / ‖b‖ of two float16 outputs, and whether any element is not finite.
fn relative_l2_f16(a: &[f16], b: &[f16]) -> (f64, bool) {
    let (mut diff, mut norm, mut bad) = (0f64, 0f64, false);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (x.to_f64(), y.to_f64());
        bad |= !x.is_finite();
        diff += (x - y) * (x - y);
        norm += y * y;
    }
    ((diff / norm).sqrt(), bad)
}

/// The 8-bit attention on the GPU against its CPU kernel (the same quantisation: within 1e-2,
/// the `exp2` approximation and the order of sums moving a weight's E4M3 rounding now and then)
/// and against cuDNN's float16 attention (within its quantisation, 5e-2 on random data), on
/// shapes with partial tiles and batches, then at a block's rows and a video's key counts with
/// the time of one call against cuDNN's.
#[test]
#[ignore = "needs a Hopper GPU, its driver, cuDNN and NVRTC on LD_LIBRARY_PATH"]
fn cuda_attention_8bit_matches_the_cpu_kernel() {
    let stream = test_stream();
    let mut rng = Rng(48);
    for (sizes, heads) in [
        ([1, 200, 300, 256], 2),
        ([2, 130, 257, 256], 2),
        ([1, 4680, 4680, 1536], 12),
    ] {
        let case = AttentionCase::<f16>::new(&mut rng, sizes, heads);
        let what = format!("Attention, 8-bit, {sizes:?} heads {heads}");
        let (gpu, _) = run_attention8(&case, stream, 0);
        let (against_cpu, bad) = relative_l2_f16(&gpu, &case.cpu_int8());
        let (fp16, _) = run_attention(&case, stream, 0, 0);
        let (against_fp16, _) = relative_l2_f16(&gpu, &fp16);
        eprintln!(
            "{what}: against its CPU kernel {against_cpu:.2e}, against fp16 {against_fp16:.2e}"
        );
        assert!(!bad, "{what}: an output was not written or not finite");
        assert!(
            against_cpu < 1e-2,
            "{what}: {against_cpu} against the CPU kernel"
        );
        assert!(against_fp16 < 5e-2, "{what}: {against_fp16} against fp16");
    }
    for keys in [4680, 18720, 32760] {
        let case = AttentionCase::<f16>::new(&mut rng, [1, 4680, keys, 1536], 12);
        let (_, fp16) = run_attention(&case, stream, attention::MAX_PARTS, 30);
        let (_, int8) = run_attention8(&case, stream, 30);
        eprintln!(
            "Attention [1, 4680, {keys}, 1536] heads 12: fp16 (cuDNN) {fp16:.1} µs, 8-bit {int8:.1} µs ({:.3})",
            int8 / fp16
        );
    }
}

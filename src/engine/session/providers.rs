//! The execution providers a session registers (CUDA, TensorRT with CUDA beside it; the CPU is
//! ONNX Runtime's default), their options from the run's settings, and the graph optimizers left
//! out on each.

use ort::ep::{self, ArenaExtendStrategy, ExecutionProvider};

use super::{ArenaExtend, AttentionBackend, ConvAlgoSearch, CudaOptions, Provider};

/// ONNX Runtime graph optimizers left out on this provider, by name, separated by commas
/// (`optimization.disable_specified_optimizers`);
/// [`Diagnostics::disabled_optimizers`](crate::engine::Diagnostics::disabled_optimizers) replaces
/// the list, to measure what a fusion is worth.
///
/// On GPUs `MatMulAddFusion` is left out: it turns each biased projection into a `Gemm` whose
/// bias the CUDA provider first broadcasts into the output with a slow kernel (`BroadcastBias`)
/// before a `beta = 1` GEMM; a `MatMul` and a broadcast `Add` measured faster
/// (benches/README.md).
pub(super) fn disabled_optimizers(provider: &Provider) -> &'static str {
    match provider {
        Provider::Cpu => "",
        Provider::Cuda(_) | Provider::TensorRt(_) => "MatMulAddFusion",
    }
}

/// The execution providers to register, each erroring on failure. The CPU provider is ONNX
/// Runtime's own default and needs no registration.
pub(super) fn execution_providers(provider: &Provider) -> Vec<ep::ExecutionProviderDispatch> {
    match provider {
        Provider::Cpu => Vec::new(),
        Provider::Cuda(cuda) => vec![cuda_provider(cuda).build().error_on_failure()],
        Provider::TensorRt(trt) => {
            let mut tensorrt = ep::TensorRT::default()
                .with_device_id(trt.device_id)
                .with_fp16(trt.fp16);
            if let Some(dir) = &trt.engine_cache_dir {
                tensorrt = tensorrt
                    .with_engine_cache(true)
                    .with_engine_cache_path(dir.display());
            }
            if let Some(dir) = &trt.timing_cache_dir {
                tensorrt = tensorrt
                    .with_timing_cache(true)
                    .with_timing_cache_path(dir.display());
            }
            let cuda = CudaOptions {
                device_id: trt.device_id,
                ..CudaOptions::default()
            };
            vec![
                tensorrt.build().error_on_failure(),
                cuda_provider(&cuda).build().error_on_failure(),
            ]
        }
    }
}

fn cuda_provider(options: &CudaOptions) -> ep::CUDA {
    let search = match options.conv_algo_search {
        ConvAlgoSearch::Exhaustive => ep::cuda::ConvAlgorithmSearch::Exhaustive,
        ConvAlgoSearch::Heuristic => ep::cuda::ConvAlgorithmSearch::Heuristic,
        ConvAlgoSearch::Default => ep::cuda::ConvAlgorithmSearch::Default,
    };
    let arena = match options.arena_extend {
        ArenaExtend::NextPowerOfTwo => ArenaExtendStrategy::NextPowerOfTwo,
        ArenaExtend::SameAsRequested => ArenaExtendStrategy::SameAsRequested,
    };
    let mut cuda = ep::CUDA::default()
        .with_device_id(options.device_id)
        .with_conv_algorithm_search(search)
        .with_arena_extend_strategy(arena)
        .with_cuda_graph(options.cuda_graphs)
        .with_prefer_nhwc(options.prefer_nhwc)
        .with_conv_max_workspace(options.conv_max_workspace);
    use ep::cuda::AttentionBackend as B;
    let kernel = match options.attention {
        AttentionBackend::Auto => None,
        AttentionBackend::Flash | AttentionBackend::Fa2 => Some(B::FLASH_ATTENTION),
        AttentionBackend::Efficient => Some(B::EFFICIENT_ATTENTION),
        AttentionBackend::CudnnFlash => Some(B::CUDNN_FLASH_ATTENTION),
        AttentionBackend::Math => Some(B::MATH),
    };
    if let Some(kernel) = kernel {
        cuda = cuda.with_attention_backend(kernel);
    }
    if let Some(limit) = options.memory_limit {
        cuda = cuda.with_memory_limit(limit);
    }
    cuda
}

/// Why ONNX Runtime cannot say whether it has a provider compiled in: its own error.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ProviderQueryError(#[from] ort::Error);

/// Whether this ONNX Runtime build has each provider compiled in (not whether it will register:
/// that also needs the CUDA libraries and a GPU).
pub fn available_providers() -> Vec<(&'static str, Result<bool, ProviderQueryError>)> {
    vec![
        ("cpu", ep::CPU::is_available().map_err(ProviderQueryError)),
        ("cuda", ep::CUDA::is_available().map_err(ProviderQueryError)),
        (
            "tensorrt",
            ep::TensorRT::is_available().map_err(ProviderQueryError),
        ),
    ]
}

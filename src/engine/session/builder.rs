//! Building a session: the provider's options, the optimisation level, the kept optimised model,
//! profiling and logging, operator domains, and the fused DiT loaded as exported or with its
//! self-attention rewritten.

#[allow(unused_imports)]
use super::*;

/// A session of one of the bundle's graphs. The decoder's graphs (`decoder`) are built without
/// ONNX Runtime's memory pattern on GPU providers (the CPU keeps its default) and, on CUDA, with
/// NHWC convolutions.
pub(super) fn build_session(
    runtime: &OrtRuntime,
    bundle: &Bundle,
    graph: &str,
    options: &RuntimeOptions,
    decoder: bool,
) -> Result<Session, SessionError> {
    build_graph_session(runtime, bundle, graph, options, decoder, None)
}

/// [`build_session`], with an operator domain registered (the runner's, for `dit_fused`).
pub(super) fn build_graph_session(
    runtime: &OrtRuntime,
    bundle: &Bundle,
    graph: &str,
    options: &RuntimeOptions,
    decoder: bool,
    operators: Option<ort::operator::OperatorDomain>,
) -> Result<Session, SessionError> {
    let builder = graph_session_builder(runtime, graph, options, decoder, operators)?;
    load_model(builder, graph, &bundle.graph_path(graph))
}

/// The session builder of one of the bundle's graphs, as [`build_graph_session`] builds it.
pub(super) fn graph_session_builder(
    runtime: &OrtRuntime,
    graph: &str,
    options: &RuntimeOptions,
    decoder: bool,
    operators: Option<ort::operator::OperatorDomain>,
) -> Result<ort::session::builder::SessionBuilder, SessionError> {
    let load = |e: ort::Error| SessionError::Load {
        graph: graph.to_string(),
        source: e.into(),
    };
    let mut builder = if decoder {
        session_builder(runtime, graph, &decoder_options(options))?
    } else {
        session_builder(runtime, graph, options)?
    };
    if decoder && !matches!(options.provider, Provider::Cpu) {
        builder = builder
            .with_memory_pattern(false)
            .map_err(|e| load(e.into()))?;
    }
    if let Some(domain) = operators {
        builder = builder.with_operators(domain).map_err(|e| load(e.into()))?;
    }
    Ok(builder)
}

/// The DiT's session from `builder`: the graph's file as it is, or, for
/// [`DitAttention::OnnxRuntimeInFused`], the rewritten model from memory, with its external data
/// found in the file's folder.
pub(super) fn load_dit(
    builder: ort::session::builder::SessionBuilder,
    bundle: &Bundle,
    names: &GraphNames,
    provider: &Provider,
) -> Result<Session, SessionError> {
    let path = bundle.graph_path(names.dit);
    if names.dit_attention != DitAttention::OnnxRuntimeInFused {
        return load_model(builder, names.dit, &path);
    }
    let backend = match provider {
        Provider::Cuda(c) => c.attention.name(),
        _ => AttentionBackend::Math.name(),
    };
    load_attention_rewritten(builder, names.dit, &path, backend)
}

/// The session of the model at `path` with its self-attention as ONNX Runtime's
/// `MultiHeadAttention` ([`super::graph_rewrite`]), loaded from memory with the folder of its
/// external data (the model file's). The rewrite reads the model file whole: a full-size DiT's
/// holds its graph alone (a few megabytes), its weights being external data.
pub(super) fn load_attention_rewritten(
    builder: ort::session::builder::SessionBuilder,
    graph: &str,
    path: &Path,
    backend: &'static str,
) -> Result<Session, SessionError> {
    let load = |source: LoadCause| SessionError::Load {
        graph: graph.to_string(),
        source,
    };
    let bytes = std::fs::read(path).map_err(|source| {
        load(LoadCause::File {
            what: "read",
            path: path.to_path_buf(),
            source,
        })
    })?;
    let rewritten = crate::engine::graph_rewrite::attention_to_multi_head_attention(&bytes)
        .map_err(|source| SessionError::AttentionRewrite {
            graph: graph.to_string(),
            backend,
            source,
        })?;
    drop(bytes);
    let folder = path
        .parent()
        .map(|dir| {
            if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            }
        })
        .and_then(Path::to_str)
        .ok_or_else(|| load(LoadCause::NotUtf8(path.to_path_buf())))?;
    builder
        .with_config_entry(EXTERNAL_INITIALIZERS_FOLDER, folder)
        .map_err(|e| load(e.into()))?
        .commit_from_memory(&rewritten)
        .map_err(|e| load(e.into()))
}

pub(super) fn load_model(
    mut builder: ort::session::builder::SessionBuilder,
    graph: &str,
    path: &Path,
) -> Result<Session, SessionError> {
    builder
        .commit_from_file(path)
        .map_err(|e| SessionError::Load {
            graph: graph.to_string(),
            source: e.into(),
        })
}

/// ONNX Runtime's session option for where a model loaded from memory finds its external data
/// (`kOrtSessionOptionsModelExternalInitializersFileFolderPath`): each file's location is taken
/// relative to that folder, as it is relative to the model file's own folder when the model is
/// loaded from its file.
const EXTERNAL_INITIALIZERS_FOLDER: &str = "session.model_external_initializers_file_folder_path";

/// The decoder's sessions prefer NHWC convolutions on CUDA: cuDNN's fp16 convolutions run
/// channels-last, and the exported norms are channels-last permutations that ONNX Runtime's
/// transpose optimizer cancels against the ones it wraps around each NHWC convolution, where
/// NCHW convolutions convert every input and output inside cuDNN. Measured on wan-1.3b (one
/// H200, same run): VAE 1.456 s against 1.588 s per video, `vae_step` at most 2.33 GiB in use
/// against 5.64 GiB, peak device memory 20.0 GiB against 23.9 GiB.
pub(super) fn decoder_options(options: &RuntimeOptions) -> RuntimeOptions {
    let mut options = options.clone();
    if let Provider::Cuda(cuda) = &mut options.provider {
        cuda.prefer_nhwc = true;
    }
    options
}

/// A session for one of the runner's own small graphs ([`super::onnx_graph`]), on the same
/// provider as the bundle's graphs.
pub(crate) fn build_small_session(
    name: &str,
    model: &[u8],
    options: &RuntimeOptions,
) -> Result<Session, SessionError> {
    let runtime = ort_lib::runtime(options.ort_library.as_deref())?;
    let options = RuntimeOptions {
        optimized_model_dir: None,
        ..options.without_cuda_graphs()
    };
    session_builder(runtime, name, &options)?
        .commit_from_memory(model)
        .map_err(|e| SessionError::Load {
            graph: name.to_string(),
            source: e.into(),
        })
}

pub(super) fn session_builder(
    runtime: &OrtRuntime,
    graph: &str,
    options: &RuntimeOptions,
) -> Result<ort::session::builder::SessionBuilder, SessionError> {
    let load = |source: LoadCause| SessionError::Load {
        graph: graph.to_string(),
        source,
    };
    let create = |dir: &Path| {
        std::fs::create_dir_all(dir).map_err(|source| {
            load(LoadCause::File {
                what: "create",
                path: dir.to_path_buf(),
                source,
            })
        })
    };
    let mut builder = Session::builder(&runtime.environment)
        .and_then(|b| {
            b.with_optimization_level(GraphOptimizationLevel::All)
                .map_err(Into::into)
        })
        .map_err(|e| load(e.into()))?;
    if let Some(threads) = options.intra_op_threads {
        builder = builder
            .with_intra_threads(threads)
            .map_err(|e| load(e.into()))?;
    }
    if let Some(dir) = &options.optimized_model_dir {
        create(dir)?;
        // Written once per folder: writing a large graph's model again at every start would cost
        // each process the time of writing its weights.
        let file = dir.join(format!("{}.optimized.onnx", graph_stem(graph)));
        if !file.exists() {
            builder = builder
                .with_optimized_model_path(file)
                .map_err(|e| load(e.into()))?;
        }
    }
    if let Some(dir) = &options.diagnostics.ort_profile_dir {
        create(dir)?;
        builder = builder
            .with_profiling(dir.join(graph_stem(graph)))
            .map_err(|e| load(e.into()))?;
    }
    if let Some(level) = &options.diagnostics.ort_log_level {
        let level = crate::engine::options::ort_log_level(level).map_err(|e| load(e.into()))?;
        builder = builder
            .with_log_level(level)
            .map_err(|e| load(e.into()))?
            .with_log_id(graph_stem(graph))
            .map_err(|e| load(e.into()))?;
    }
    let disabled = options
        .diagnostics
        .disabled_optimizers
        .clone()
        .unwrap_or_else(|| disabled_optimizers(&options.provider).to_string());
    if !disabled.is_empty() {
        builder = builder
            .with_config_entry("optimization.disable_specified_optimizers", disabled)
            .map_err(|e| load(e.into()))?;
    }
    let providers = execution_providers(&options.provider);
    if !providers.is_empty() {
        builder =
            builder
                .with_execution_providers(providers)
                .map_err(|e| SessionError::Provider {
                    provider: options.provider.name(),
                    graph: graph.to_string(),
                    source: e.into(),
                })?;
    }
    Ok(builder)
}

pub(super) fn graph_stem(graph: &str) -> String {
    Path::new(graph)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| graph.to_string())
}

//! The prompt's text context: encoded by the bundle's text encoder on the host (per prompt, or
//! for every prompt before the DiT's sessions are built), uploaded into the loop's context buffer
//! outside the timed region, and turned into the DiT's cross-attention keys and values by
//! `dit_context` where the DiT takes those.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ort::session::Session;
use ort::value::{TensorElementType, TensorRef};

use super::buffers::{Bound, View};
use super::state::DeviceLoop;
use super::{GenerateError, PhaseTimes, run_error};
use crate::engine::bundle::Bundle;
use crate::engine::session::{GraphSessions, RuntimeOptions};
use crate::engine::text::PromptTokenizer;
use crate::vocab::{ContextSource, TextContexts};

/// A context encoded ahead: the context, the time it took to encode (or read), and which of the
/// two.
#[derive(Debug)]
pub(super) struct AheadContext {
    pub(super) context: HostContext,
    pub(super) took: Duration,
    pub(super) source: ContextSource,
}

/// Contexts encoded ahead, by prompt text.
pub(super) type Ahead = HashMap<String, AheadContext>;

/// Encodes every distinct prompt text of `prompts` with the bundle's text encoder alone, which is
/// dropped before this returns. With [`RuntimeOptions::context_cache_dir`], a context an earlier
/// process kept there ([`context_file`]) is read instead, each one encoded here is kept there,
/// and when every prompt's context is kept the text encoder is not loaded at all.
///
/// The texts of `for_later` are prompts this process does not generate: with a context folder,
/// each one not kept there yet is encoded and kept for the processes after this one that share
/// the folder (a generation's shards after their warmup), and not held here. Without a folder
/// they are left alone.
pub(super) fn encode_ahead<'a>(
    bundle: &Bundle,
    runtime: &RuntimeOptions,
    prompts: impl IntoIterator<Item = &'a str>,
    for_later: impl IntoIterator<Item = &'a str>,
) -> Result<(Ahead, TextContexts), GenerateError> {
    let dir = runtime.context_cache_dir.as_deref();
    let file = |text: &str| dir.map(|d| context_file(d, bundle, runtime.provider.name(), text));
    let values = bundle.manifest.architecture.text_len * bundle.manifest.architecture.text_dim;
    let mut contexts = HashMap::new();
    let mut counts = TextContexts::default();
    let mut missing = Vec::new();
    for text in prompts {
        if contexts.contains_key(text) || missing.contains(&text) {
            continue;
        }
        let started = Instant::now();
        match file(text).and_then(|f| read_context(&f, values)) {
            Some(context) => {
                let took = started.elapsed();
                let source = ContextSource::Read;
                contexts.insert(
                    text.to_string(),
                    AheadContext {
                        context,
                        took,
                        source,
                    },
                );
                counts.read += 1;
            }
            None => missing.push(text),
        }
    }
    let mut later = Vec::new();
    if dir.is_some() {
        for text in for_later {
            let known = contexts.contains_key(text) || missing.contains(&text);
            if known || later.contains(&text) {
                continue;
            }
            if !file(text).is_some_and(|f| kept_whole(&f, values)) {
                later.push(text);
            }
        }
    }
    if missing.is_empty() && later.is_empty() {
        return Ok((contexts, counts));
    }
    let tokenizer = bundle.tokenizer()?;
    let mut encoder = GraphSessions::build_text_encoder(bundle, runtime)?;
    for text in missing {
        let started = Instant::now();
        let context = encode_to_host(&mut encoder, &tokenizer, text)?;
        let took = started.elapsed();
        if let Some(f) = file(text) {
            keep_context(&f, &context);
        }
        let source = ContextSource::Encoded;
        contexts.insert(
            text.to_string(),
            AheadContext {
                context,
                took,
                source,
            },
        );
        counts.encoded += 1;
    }
    for text in later {
        let context = encode_to_host(&mut encoder, &tokenizer, text)?;
        if let Some(f) = file(text) {
            keep_context(&f, &context);
        }
        counts.encoded += 1;
        counts.for_later += 1;
    }
    drop(encoder);
    Ok((contexts, counts))
}

/// The file that keeps a prompt's context under `dir`: named by a hash of the bundle's files
/// (their sha256s, so another export or another text encoder never reads it), the provider that
/// encoded it and the prompt's text.
pub(crate) fn context_file(dir: &Path, bundle: &Bundle, provider: &str, text: &str) -> PathBuf {
    let mut key = String::new();
    for (path, sha) in &bundle.manifest.files {
        key.push_str(&format!("{path}={sha}\n"));
    }
    key.push_str(&format!("provider={provider}\ntext={text}"));
    let hash = crate::engine::bundle::sha256_hex(key.as_bytes());
    dir.join(format!("{}.ctx", &hash[..32]))
}

/// The element type tag of a kept context's first byte.
const TAG_F32: u8 = 0;
const TAG_F16: u8 = 1;
const TAG_BF16: u8 = 2;

/// Writes a context (its type's tag, then its values little-endian), whole; a failure is a
/// warning: the next process encodes the prompt again.
fn keep_context(file: &Path, context: &HostContext) {
    let mut bytes = Vec::new();
    match context {
        HostContext::F32(v) => {
            bytes.push(TAG_F32);
            v.iter().for_each(|x| bytes.extend(x.to_le_bytes()));
        }
        HostContext::F16(v) => {
            bytes.push(TAG_F16);
            v.iter().for_each(|x| bytes.extend(x.to_le_bytes()));
        }
        HostContext::Bf16(v) => {
            bytes.push(TAG_BF16);
            v.iter().for_each(|x| bytes.extend(x.to_le_bytes()));
        }
    }
    if let Err(e) = crate::atomic_file::write_making_folder(file, &bytes) {
        eprintln!(
            "warning: could not keep the prompt's text context in {}: {e}; the next process \
             encodes it again",
            file.display()
        );
    }
}

/// A kept context of `values` values; `None` when there is none, or it is damaged (wrong size or
/// tag).
fn read_context(file: &Path, values: usize) -> Option<HostContext> {
    let bytes = std::fs::read(file).ok()?;
    let (&tag, data) = bytes.split_first()?;
    let width = match tag {
        TAG_F32 => 4,
        TAG_F16 | TAG_BF16 => 2,
        _ => return None,
    };
    if data.len() != values * width {
        return None;
    }
    Some(match tag {
        TAG_F32 => HostContext::F32(
            data.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        TAG_F16 => HostContext::F16(
            data.chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
        _ => HostContext::Bf16(
            data.chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
    })
}

/// Whether `file` holds a kept context of `values` values by its size (one tag byte, then two or
/// four bytes a value); its contents are checked when a process reads it.
fn kept_whole(file: &Path, values: usize) -> bool {
    std::fs::metadata(file).is_ok_and(|m| {
        m.is_file()
            && [2, 4]
                .iter()
                .any(|width| m.len() == 1 + (values * width) as u64)
    })
}

/// Tokenizes `prompt` with the bundle's tokenizer and runs a text encoder session on it; ONNX
/// Runtime hands the context back in host memory.
pub(super) fn encode_to_host(
    encoder: &mut Session,
    tokenizer: &PromptTokenizer,
    prompt: &str,
) -> Result<HostContext, GenerateError> {
    const GRAPH: &str = "text_encoder";
    let e = run_error(GRAPH);
    let tokens = tokenizer.encode(prompt)?;
    let shape = [1i64, tokenizer.text_len() as i64];
    let outputs = encoder
        .run(ort::inputs![
            "input_ids" => TensorRef::from_array_view((shape, tokens.ids.as_slice())).map_err(e)?,
            "attention_mask" => TensorRef::from_array_view((shape, tokens.mask.as_slice())).map_err(e)?,
        ])
        .map_err(e)?;
    let value = &outputs["context"];
    let context = match value.dtype().tensor_type() {
        Some(TensorElementType::Float16) => HostContext::F16(
            value
                .try_extract_tensor::<half::f16>()
                .map_err(e)?
                .1
                .to_vec(),
        ),
        Some(TensorElementType::Bfloat16) => HostContext::Bf16(
            value
                .try_extract_tensor::<half::bf16>()
                .map_err(e)?
                .1
                .to_vec(),
        ),
        _ => HostContext::F32(value.try_extract_tensor::<f32>().map_err(e)?.1.to_vec()),
    };
    Ok(context)
}

/// A prompt's text context on the host, in the bundle's float type.
#[derive(Debug, Clone)]
pub(super) enum HostContext {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    Bf16(Vec<half::bf16>),
}

/// The error for a prompt that needs the text encoder when the generator was built without it.
pub(super) fn text_encoder_released() -> GenerateError {
    GenerateError::Run {
        graph: "text_encoder",
        message: "this generator encoded its prompts before loading the DiT and has no text \
                  encoder, and this prompt was not among them"
            .into(),
    }
}

impl DeviceLoop {
    /// Runs `dit_context` on the prompt's context into the loop's buffers of the cross-attention
    /// keys and values (the first DiT work of the timed region, once per prompt).
    pub(super) fn context_keys_values(
        &self,
        session: &mut Session,
        times: &mut PhaseTimes,
    ) -> Result<(), GenerateError> {
        let e = run_error("dit_context");
        let mut binding = session.create_binding().map(Bound::new).map_err(e)?;
        binding.input("context", self.context_view()?).map_err(e)?;
        for (name, view) in self.context_kv_views()? {
            binding.output(name, view).map_err(e)?;
        }
        let start = Instant::now();
        session.run_binding(&binding.binding).map_err(e)?;
        times.session_run += start.elapsed();
        Ok(())
    }

    /// The prompt's text context `[1, text_len, text_dim]`.
    pub(super) fn context_view(&self) -> Result<View, GenerateError> {
        let d = self.d;
        self.view(&self.context, 0, &[1, d.text_len as i64, d.text_dim as i64])
    }

    /// The context's keys and values `[1, text_len, D]` by name: `dit_context`'s outputs and the
    /// DiT's inputs (none when the DiT takes the context itself).
    pub(super) fn context_kv_views(&self) -> Result<Vec<(&str, View)>, GenerateError> {
        let shape = [1, self.d.text_len as i64, self.d.dim as i64];
        let mut views = Vec::with_capacity(2 * self.context_kv.len());
        for (names, bufs) in self.context_names.iter().zip(&self.context_kv) {
            for (name, buf) in names.iter().zip(bufs) {
                views.push((name.as_str(), self.view(buf, 0, &shape)?));
            }
        }
        Ok(views)
    }

    /// Copies a prompt's context into the loop's context buffer.
    pub(super) fn upload_context(&mut self, context: &HostContext) -> Result<(), GenerateError> {
        let (identity, mem) = (&mut self.graphs.identity_model, &self.mem);
        let e = run_error("context upload");
        match context {
            HostContext::F32(v) => self.context.upload(identity, mem, v),
            HostContext::F16(v) => self.context.upload(identity, mem, v),
            HostContext::Bf16(v) => self.context.upload(identity, mem, v),
        }
        .map_err(e)
    }
}

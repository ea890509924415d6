//! The prompt's text context: encoded by the bundle's text encoder on the host (per prompt, or
//! for every prompt before the DiT's sessions are built), uploaded into the loop's context buffer
//! outside the timed region, and turned into the DiT's cross-attention keys and values by
//! `dit_context` where the DiT takes those.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ort::session::Session;
use ort::value::{TensorElementType, TensorRef};

use super::buffers::{Bound, View};
use super::state::DeviceLoop;
use super::{GenerateError, PhaseTimes, run_error};
use crate::engine::bundle::Bundle;
use crate::engine::session::{GraphSessions, RuntimeOptions};
use crate::engine::text::PromptTokenizer;

/// Contexts encoded ahead, by prompt text, with the time each encoding took.
pub(super) type Ahead = HashMap<String, (HostContext, Duration)>;

/// Encodes every distinct prompt text of `prompts` with the bundle's text encoder alone, which is
/// dropped before this returns.
pub(super) fn encode_ahead<'a>(
    bundle: &Bundle,
    runtime: &RuntimeOptions,
    prompts: impl IntoIterator<Item = &'a str>,
) -> Result<Ahead, GenerateError> {
    let tokenizer = bundle.tokenizer()?;
    let mut encoder = GraphSessions::build_text_encoder(bundle, runtime)?;
    let mut contexts = HashMap::new();
    for text in prompts {
        if contexts.contains_key(text) {
            continue;
        }
        let started = Instant::now();
        let context = encode_to_host(&mut encoder, &tokenizer, text)?;
        contexts.insert(text.to_string(), (context, started.elapsed()));
    }
    drop(encoder);
    Ok(contexts)
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

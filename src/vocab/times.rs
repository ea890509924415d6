//! The start-up and one-time work a process measures: the engine times them, the records keep
//! them, and reports read them.

use serde::{Deserialize, Serialize};

/// Where a generator's construction went, in seconds: the sessions' part of a process's start
/// (`timings.jsonl`'s `process_start`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct StartupTimes {
    /// Opening the bundle and checking its files against `bundle.toml`'s sha256: the whole read
    /// of every file, unless the caller passed hashes it checked already (`runner apply`'s
    /// workers, whose staging the orchestrator audits); 0 in records of earlier runners.
    #[serde(default)]
    pub bundle_check_s: f64,
    /// The text encoder's session and the encoding of the process's prompts (or the reading of
    /// their kept contexts); 0 when prompts are encoded as they are generated.
    pub text_encoder_s: f64,
    /// The DiT's sessions (with `dit_context`'s).
    pub dit_sessions_s: f64,
    /// The decoder's sessions and, on CUDA, its first run on zeros, on a second thread beside
    /// the DiT's.
    pub decoder_sessions_s: f64,
    /// Of `decoder_sessions_s`, the decoder's first run on zeros (0 on the CPU, and in records of
    /// earlier runners).
    #[serde(default)]
    pub decoder_first_run_s: f64,
    /// The generation loop's buffers and small graphs.
    pub buffers_s: f64,
}

/// Seconds of each kind of one-time work (see the module doc for what overlaps what).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct OneTimeWork {
    /// NVRTC compiling the runner's CUDA kernels, or reading the image a process kept.
    #[serde(default)]
    pub kernel_compile_s: f64,
    /// cuDNN's attention plans: built, or read back from the cache folder.
    #[serde(default)]
    pub attention_plans_s: f64,
    /// The decoder convolutions' engine choices.
    #[serde(default)]
    pub conv_choices_s: f64,
    /// cuBLASLt's algorithm choices of the fused matmuls.
    #[serde(default)]
    pub gemm_choices_s: f64,
    /// The DiT passes that captured a CUDA graph, from their start (not their wait).
    #[serde(default)]
    pub graph_capture_s: f64,
    /// The capturing passes' wait for the decoder's run in progress (absent in records of
    /// earlier runners, whose `graph_capture_s` holds it).
    #[serde(default)]
    pub capture_wait_s: f64,
}

impl OneTimeWork {
    /// How many kinds of one-time work there are.
    pub const KINDS: usize = 6;

    /// Each kind by its name in reports, in a fixed order.
    pub fn named(&self) -> [(&'static str, f64); Self::KINDS] {
        [
            ("kernel compile", self.kernel_compile_s),
            ("attention plans", self.attention_plans_s),
            ("conv choices", self.conv_choices_s),
            ("gemm choices", self.gemm_choices_s),
            ("graph capture", self.graph_capture_s),
            ("capture wait", self.capture_wait_s),
        ]
    }

    /// Whether any work was done (CPU processes do none of these kinds).
    pub fn is_empty(&self) -> bool {
        self.named().iter().all(|(_, s)| *s == 0.0)
    }
}

/// Where a process took a prompt's text context from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextSource {
    /// This process ran the text encoder on the prompt.
    Encoded,
    /// This process read the context an earlier process with the same cache folder kept, and
    /// did not run the text encoder on it.
    Read,
}

impl ContextSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ContextSource::Encoded => "encoded",
            ContextSource::Read => "read",
        }
    }
}

/// How a process that encoded its prompts before its DiT's sessions came by their text contexts,
/// by count of distinct prompt texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TextContexts {
    /// Contexts this process ran the text encoder for: its own prompts' and those it kept for
    /// the processes after it.
    pub encoded: u32,
    /// Its own prompts' contexts read from those an earlier process kept.
    pub read: u32,
    /// Of `encoded`, the contexts of prompts this process does not generate, kept for the
    /// processes after it with the same cache folder (a generation's shards, after their warmup).
    pub for_later: u32,
}

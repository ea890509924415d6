//! What one worker process is asked to do: a [`JobSpec`], written as JSON by `runner apply` and
//! read by `runner worker --spec`, or built from `runner worker`'s flags. It holds typed
//! configuration only ([`RunConfig`](super::config::RunConfig)'s parts), never the manifest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::{ExportSettings, MethodSettings, RuntimeOptions};
use crate::manifest::VideoNaming;
use crate::results::records::ProcessRole;

/// One prompt to generate: its global index and text.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PromptSpec {
    pub index: u32,
    pub text: String,
    /// Its video's file name, when the orchestrator decided it (a names file's standard prompt
    /// and sample); otherwise the worker names it from `video_naming`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub video: Option<String>,
}

/// Which process of which run a job is, as its timing records name it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobLabel {
    pub run: String,
    pub process: usize,
    pub role: ProcessRole,
    pub shard: Option<usize>,
    /// Slot label (`gpu0`, `cpu1`).
    pub slot: String,
}

/// Everything a worker process needs; it reads nothing else.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSpec {
    pub label: JobLabel,
    /// The bundle (staged, for a run's processes).
    pub bundle: PathBuf,
    /// sha256 of the bundle's files by their name in `bundle.toml`, from the staging audit: the
    /// worker checks them against `bundle.toml` without reading the files again. Empty: hashed
    /// when opened.
    #[serde(default)]
    pub bundle_sha256: BTreeMap<String, String>,
    /// Size, modification and status-change times and audited sha256 of each staged bundle file
    /// when the audit hashed it: a file whose times moved is hashed again, and one that no longer
    /// has its audited hash (a hard-linked file rewritten through its source) is refused rather
    /// than trusted on its recorded hash. Empty: nothing to compare.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub bundle_stamps: BTreeMap<String, super::staging::FileStamp>,
    /// Where a `.zip` bundle is unpacked.
    pub unpack_dir: PathBuf,
    pub prompts: Vec<PromptSpec>,
    /// The texts of prompts this process does not generate whose contexts it encodes and keeps
    /// in its context folder ([`RuntimeOptions::context_cache_dir`]) for the processes after it
    /// with the same cache folder: a warmup's, for the shards that follow it, so that they read
    /// their contexts rather than load the text encoder.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub contexts_for_later: Vec<String>,
    /// This process's session options (its cache folders included).
    pub engine: RuntimeOptions,
    pub method: MethodSettings,
    pub export: ExportSettings,
    pub exclude_final_output_layout: bool,
    pub video_naming: VideoNaming,
    /// Where this process appends its timing records.
    pub timings: Option<PathBuf>,
    /// The run directory; `video` paths in records are relative to it.
    pub run_dir: PathBuf,
    /// Where videos go, when they are written.
    pub videos: Option<PathBuf>,
    /// Where each prompt's final latents go (`latents_<index>.f32`), when they are kept.
    #[serde(default)]
    pub latents: Option<PathBuf>,
    /// Where each prompt's uint8 frames go (`frames_<index>.u8`), when they are kept.
    #[serde(default)]
    pub frames: Option<PathBuf>,
    pub config_hash: String,
    /// Write the run's events on standard output (a run's workers do; `runner worker`'s flag
    /// form does not).
    #[serde(default)]
    pub events: bool,
    /// What `runner worker`'s flags add for benchmarks and tests; a run's jobs leave it default.
    #[serde(default)]
    pub bench: BenchOptions,
}

/// The worker flags that benchmarks and tests use beyond a run's job.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BenchOptions {
    /// Generate the first prompt this many times unrecorded before the measured round.
    pub warmup: usize,
    /// Unrecorded rounds over every prompt before the measured one.
    pub warm_rounds: usize,
    /// Stop after the DiT (no decode, no frames).
    pub latents_only: bool,
    /// Print seconds per video over the measured round.
    pub summary: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot read job spec {}: {reason}", .path.display())]
pub struct JobReadError {
    pub path: PathBuf,
    pub reason: String,
}

impl JobSpec {
    pub fn read(path: &Path) -> Result<JobSpec, JobReadError> {
        let err = |reason: String| JobReadError {
            path: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| err(e.to_string()))
    }
}

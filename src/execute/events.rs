//! The one event stream of a run. Workers write the events they witness as JSON lines on their
//! standard output; the orchestrator adds the processes' starts and ends, and its main thread
//! hands every event to its consumers in order: the progress display, the run's record
//! (`run.json`'s provider, kernels and versions come from the first `Ready`) and the list of
//! failures the run ends with.

use serde::{Deserialize, Serialize};

/// What a worker reported when its sessions were ready.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerFacts {
    pub provider: String,
    pub ort_version: String,
    /// The attention kernel `auto` (or the request) resolved to.
    pub attention_backend: String,
    /// The DiT's elementwise kernels: `unstep` (the runner's fused ones) or `onnxruntime`.
    pub dit_kernels: String,
    /// The VAE decoder's: `unstep` or `onnxruntime`.
    pub vae_kernels: String,
    /// The opened bundle's preset and exporter version (its `bundle.toml`).
    pub bundle_preset: String,
    pub bundle_exporter_version: String,
    /// Versions of the CUDA runtime and cuDNN libraries the process loaded, if any.
    #[serde(default)]
    pub cuda_version: Option<String>,
    #[serde(default)]
    pub cudnn_version: Option<String>,
}

/// One event of a run, about one process of its plan.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEvent {
    /// The process's index in the plan.
    pub process: usize,
    pub kind: RunEventKind,
}

/// What happened. `Ready` and `PromptDone` are the workers' own (the JSON lines they write);
/// `Started` and `Finished` are the orchestrator's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RunEventKind {
    /// The worker process was started with this process id.
    Started { pid: u32 },
    /// Sessions are built; generation starts.
    Ready(Box<WorkerFacts>),
    /// One prompt is done (and its video written, when asked).
    #[serde(rename = "prompt")]
    PromptDone { prompt: u32, timed_total_s: f64 },
    /// The process ended: `failure` says how when it did not succeed (with its log's tail).
    Finished { failure: Option<String> },
}

impl RunEventKind {
    /// The JSON line a worker writes for this event.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("events serialise")
    }

    /// A worker's line, or `None` for anything else it printed.
    pub fn from_line(line: &str) -> Option<RunEventKind> {
        serde_json::from_str(line).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worker's lines keep their names (`prompt`, `ready`): the orchestrator of one build reads
    /// the workers of the staged copy of the same build, but logs are read by people too.
    #[test]
    fn worker_events_round_trip_as_json_lines() {
        let done = RunEventKind::PromptDone {
            prompt: 7,
            timed_total_s: 1.5,
        };
        let line = done.to_line();
        assert_eq!(line, r#"{"event":"prompt","prompt":7,"timed_total_s":1.5}"#);
        assert_eq!(RunEventKind::from_line(&line), Some(done));
        let ready = RunEventKind::Ready(Box::new(WorkerFacts {
            provider: "cpu".into(),
            ort_version: "1.31.1".into(),
            attention_backend: "math (cpu)".into(),
            dit_kernels: "onnxruntime".into(),
            vae_kernels: "onnxruntime".into(),
            bundle_preset: "tiny".into(),
            bundle_exporter_version: "0.13.0".into(),
            cuda_version: None,
            cudnn_version: None,
        }));
        assert_eq!(RunEventKind::from_line(&ready.to_line()), Some(ready));
        assert_eq!(RunEventKind::from_line("worker: onnx runtime 1.31.1"), None);
    }
}

//! The worker side of a run: one process turns a [`JobSpec`] into generated prompts with one set
//! of sessions. `runner worker --spec` runs a job `runner apply` wrote; `runner worker`'s flags
//! build a job and run it through the same code, so both write the same timing records.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use super::events::{RunEventKind, WorkerFacts};
use super::job::{JobSpec, PromptSpec};
use crate::engine::{
    self, AttentionBackend, AttentionPrecision, Bundle, GenerateError, GenerateOptions, Generated,
    Generator, Precision, Provider, Schedule, SessionError,
};
use crate::exit;
use crate::results::arrays::ArrayKind;
use crate::results::files::append_jsonl;
use crate::results::names::video_name;
use crate::results::records::{ProcessStart, TimingRecord};
use crate::results::video_file::VideoFile;

/// Videos are written at 16 frames per second, as the model's training data.
pub const FPS: u32 = 16;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A request the user must change (flags that do not fit together, a bad bundle).
    #[error("{0}")]
    Usage(String),
    #[error("failed to generate: {0}")]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Job(#[from] super::job::JobReadError),
    #[error(transparent)]
    Ort(#[from] engine::OrtLoadError),
    #[error("cannot record timings: {0}")]
    Record(#[from] crate::results::files::RecordError),
    #[error("cannot write {}: {reason}", .path.display())]
    Write { path: PathBuf, reason: String },
    #[error(
        "bundle file(s) {} changed after staging (the staged bundle shares its files with the \
         source bundle by hard link, and the source was rewritten in place, whatever its \
         modification time says); apply again to stage it anew, and do not export into or \
         sync a bundle a run is using",
        .0.join(", ")
    )]
    BundleChanged(Vec<String>),
}

impl exit::Failure for WorkerError {
    /// A bundle that fails its checks, bad method settings or flags are the user's input to fix;
    /// ONNX Runtime, graph or file failures are failures of the run.
    fn exit_code(&self) -> i32 {
        match self {
            WorkerError::Usage(_)
            | WorkerError::Generate(GenerateError::Bundle(_))
            | WorkerError::Generate(GenerateError::Session(SessionError::Bundle(_)))
            | WorkerError::Generate(GenerateError::Schedule(_)) => exit::USAGE,
            // `runner apply` writes the jobs: one that cannot be read is not the user's doing.
            WorkerError::Job(_) => exit::INTERNAL,
            _ => exit::FAILURE,
        }
    }
}

/// The version suffix of a shared library this process has mapped (`libcudnn.so.9.10.2` →
/// `9.10.2`), read from `/proc/self/maps`: the libraries actually loaded, whatever their path.
fn loaded_version(maps: &str, stem: &str) -> Option<String> {
    let path = engine::mapped_library(maps, stem)?;
    engine::file_name(path)
        .strip_prefix(stem)
        .map(str::to_string)
}

/// The attention kernel a generator's provider was configured with, as results record it; with a
/// fused DiT whose self-attention is the runner's own call of cuDNN, or ONNX Runtime's
/// `MultiHeadAttention` in its place, also that; and the 8-bit attention when it ran.
pub fn attention_name(
    provider: &Provider,
    generator: &Generator,
    attention_precision: AttentionPrecision,
) -> String {
    let precision = generator.bundle().manifest.precision;
    let name = provider_attention_name(provider, precision);
    let name = match generator.dit_attention().describe(provider, precision) {
        Some(self_attention) => format!("{name}, {self_attention}"),
        None => name,
    };
    match attention_precision.reduced() {
        Some(note) => format!("{name}; 8-bit ({note})"),
        None => name,
    }
}

/// The attention kernel a provider was configured with.
fn provider_attention_name(provider: &Provider, precision: Precision) -> String {
    match provider {
        Provider::Cpu => "math (cpu)".into(),
        Provider::Cuda(c) => match (c.attention, c.attention.resolve(precision)) {
            (AttentionBackend::Auto, AttentionBackend::Auto) => {
                "auto (onnxruntime's default order)".into()
            }
            (AttentionBackend::Auto, kernel) => format!("{kernel} (auto)"),
            (asked, _) => asked.to_string(),
        },
        Provider::TensorRt(_) => "tensorrt's own".into(),
    }
}

/// What the process reports once its sessions are ready.
fn facts(job: &JobSpec, generator: &Generator, ort_version: &str) -> WorkerFacts {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let bundle = &generator.bundle().manifest;
    WorkerFacts {
        provider: job.engine.provider.name().into(),
        ort_version: ort_version.into(),
        attention_backend: attention_name(
            &job.engine.provider,
            generator,
            job.engine.attention_precision,
        ),
        dit_kernels: generator.dit_kernels().name().into(),
        vae_kernels: generator.vae_kernels().name().into(),
        bundle_preset: bundle.preset.clone(),
        bundle_exporter_version: bundle.exporter_version.clone(),
        cuda_version: loaded_version(&maps, "libcudart.so."),
        cudnn_version: loaded_version(&maps, "libcudnn.so."),
    }
}

fn emit(job: &JobSpec, event: &RunEventKind) {
    use std::io::Write;
    if !job.events {
        return;
    }
    let mut out = std::io::stdout().lock();
    // A closed pipe means the orchestrator is gone; the records on disk still say what was done.
    let _ = writeln!(out, "{}", event.to_line()).and_then(|_| out.flush());
}

/// Builds the sessions: the bundle opened and checked against the job's export settings, every
/// prompt's context encoded first with the text encoder alone on the device, then the DiT and
/// the decoder (docs/generation.md).
///
/// The staged bundle's files are checked against their stamps before they are read and again
/// once the sessions hold them: the audit's hashes, which the record names, are trusted only
/// for files that no write touched in between.
fn build(job: &JobSpec) -> Result<Generator, WorkerError> {
    // Schedule errors are reported before the (slow) session build.
    Schedule::new(&job.method).map_err(GenerateError::from)?;
    let mut stamps = job.bundle_stamps.clone();
    unchanged_since_staged(job, &mut stamps)?;
    let bundle = Bundle::open_with_known_hashes(&job.bundle, &job.unpack_dir, &job.bundle_sha256)
        .map_err(GenerateError::from)?;
    bundle
        .check_export(&job.export)
        .map_err(GenerateError::from)?;
    let prompts = job.prompts.iter().map(|p| p.text.as_str());
    let later = job.contexts_for_later.iter().map(String::as_str);
    let generator = Generator::with_prompts_and_later(bundle, &job.engine, prompts, later)?;
    unchanged_since_staged(job, &mut stamps)?;
    Ok(generator)
}

/// Refuses the staged bundle when a file differs from its stamp (see
/// [`super::staging::changed_since_staged`]).
fn unchanged_since_staged(
    job: &JobSpec,
    stamps: &mut BTreeMap<String, super::staging::FileStamp>,
) -> Result<(), WorkerError> {
    let changed = super::staging::changed_since_staged(&job.bundle, stamps);
    if changed.is_empty() {
        Ok(())
    } else {
        Err(WorkerError::BundleChanged(changed))
    }
}

/// When this process started, as near as it can tell, on the monotonic clock and the wall
/// clock: [`mark_process_start`] sets it first thing in `main`.
static PROCESS_STARTED: OnceLock<(Instant, SystemTime)> = OnceLock::new();

fn process_started() -> (Instant, SystemTime) {
    *PROCESS_STARTED.get_or_init(|| (Instant::now(), SystemTime::now()))
}

/// Notes the process's start, for the time its sessions took to get ready
/// ([`ProcessStart::ready_s`]).
pub fn mark_process_start() {
    process_started();
}

/// Runs a job: builds the sessions, generates every prompt in order, and for each measured
/// prompt writes its video and outputs when asked, then appends its timing record.
pub fn run(job: &JobSpec) -> Result<(), WorkerError> {
    let (started, started_at) = process_started();
    let ort = engine::ort_lib::runtime(job.engine.ort_library.as_deref())?;
    let mut generator = build(job)?;
    let mut process_start = Some(ProcessStart {
        started_at: Some(crate::results::time::rfc3339(started_at)),
        ready_s: started.elapsed().as_secs_f64(),
        parts: generator.startup(),
        one_time: engine::one_time::take(),
        text_contexts: generator.text_contexts(),
    });
    let facts = facts(job, &generator, &ort.version);
    crate::say!(
        "worker: onnx runtime {} from {} ({}), provider {}, attention {}, DiT kernels {}, VAE kernels {}{}",
        ort.version,
        ort.location.path.display(),
        ort.location.source,
        facts.provider,
        facts.attention_backend,
        facts.dit_kernels,
        facts.vae_kernels,
        if job.engine.cuda_graphs() {
            ", DiT as CUDA graphs"
        } else {
            ""
        }
    );
    emit(job, &RunEventKind::Ready(Box::new(facts)));
    let options = GenerateOptions {
        method: job.method.clone(),
        exclude_final_output_layout: job.exclude_final_output_layout,
        latents_only: job.bench.latents_only,
    };
    if let Some(first) = job.prompts.first() {
        for _ in 0..job.bench.warmup {
            generator.generate(first.index, &first.text, &options)?;
        }
    }
    for _ in 0..job.bench.warm_rounds {
        for prompt in &job.prompts {
            generator.generate(prompt.index, &prompt.text, &options)?;
        }
    }
    let mut measured = Vec::new();
    // A worker that writes videos keeps each generated prompt (its video encoded on the CPU, its
    // outputs and timing record written) on a second thread while the device generates the next
    // one: encoding a video takes about as long as generating it, outside the timed region, and
    // done in turn it doubled a generation's wall time. Prompts are kept in order, one at a
    // time; at most one waits beside the one being kept, so a slow disk holds the generation
    // back rather than piling frames up in memory. A failure to keep one stops the generation
    // after the prompt in progress; a failed generation still keeps every prompt finished before
    // it. A worker that writes no video (a probe) keeps each prompt in turn, between timed
    // regions: it has little to write, and a measured region stays free of its writes.
    let beside = job.videos.is_some();
    std::thread::scope(|scope| -> Result<(), WorkerError> {
        let (send, received) =
            std::sync::mpsc::sync_channel::<(&PromptSpec, Generated, Option<ProcessStart>)>(1);
        let keeper = beside.then(|| {
            scope.spawn(move || -> Result<(), WorkerError> {
                for (prompt, generated, process_start) in received {
                    keep_and_tell(job, prompt, &generated, process_start)?;
                }
                Ok(())
            })
        });
        for prompt in &job.prompts {
            let generated = generator.generate(prompt.index, &prompt.text, &options)?;
            if job.bench.summary {
                measured.push((generated.times, generated.peak_device_memory));
            }
            if !beside {
                keep_and_tell(job, prompt, &generated, process_start.take())?;
            // A closed channel: the keeper stopped on an error, which its join gives below.
            } else if send
                .send((prompt, generated, process_start.take()))
                .is_err()
            {
                break;
            }
        }
        drop(send);
        keeper.map_or(Ok(()), |keeper| {
            keeper
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    })?;
    if job.bench.summary {
        print_summary(&measured);
    }
    Ok(())
}

fn write_error(path: &Path, e: impl std::fmt::Display) -> WorkerError {
    WorkerError::Write {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Keeps a generated prompt ([`keep`]) and tells the orchestrator it is done.
fn keep_and_tell(
    job: &JobSpec,
    prompt: &PromptSpec,
    generated: &Generated,
    process_start: Option<ProcessStart>,
) -> Result<(), WorkerError> {
    let record = keep(job, prompt, generated, process_start)?;
    emit(
        job,
        &RunEventKind::PromptDone {
            prompt: prompt.index,
            timed_total_s: record.timed_total_s,
        },
    );
    Ok(())
}

/// Writes what a generated prompt leaves (its video, saved latents and frames) and then its
/// timing record: a prompt counts as done only once its video exists.
fn keep(
    job: &JobSpec,
    prompt: &PromptSpec,
    generated: &Generated,
    process_start: Option<ProcessStart>,
) -> Result<TimingRecord, WorkerError> {
    let (video, video_file) = match &job.videos {
        Some(dir) if !generated.frames.is_empty() => {
            let name = prompt
                .video
                .clone()
                .unwrap_or_else(|| video_name(job.video_naming, prompt.index, &prompt.text));
            let path = dir.join(name);
            let [n, h, w, _] = generated.frame_shape;
            crate::video::write_mp4(&path, &generated.frames, n, h, w, FPS)
                .map_err(|e| write_error(&path, e))?;
            let written = VideoFile::of(&path).map_err(|e| write_error(&path, e))?;
            let video = path
                .strip_prefix(&job.run_dir)
                .unwrap_or(&path)
                .display()
                .to_string();
            (Some(video), Some(written))
        }
        _ => (None, None),
    };
    let kept_bytes = save_outputs(job, generated)?;
    let t = &generated.times;
    let record = TimingRecord {
        process: job.label.process,
        role: job.label.role,
        shard: job.label.shard,
        slot: job.label.slot.clone(),
        prompt: prompt.index,
        text_encoding_s: t.text_encoding.as_secs_f64(),
        text_context: Some(generated.text_context),
        dit_s: t.dit.as_secs_f64(),
        vae_s: t.vae.as_secs_f64(),
        layout_s: t.layout.as_secs_f64(),
        timed_total_s: t.timed_total.as_secs_f64(),
        session_run_s: job.bench.summary.then_some(t.session_run.as_secs_f64()),
        peak_device_memory_bytes: generated.peak_device_memory,
        timed_region_ends: generated.timed_region_end,
        config_hash: job.config_hash.clone(),
        prompt_sha256: Some(crate::results::prompt_hash(&prompt.text)),
        video,
        video_file,
        kept_bytes,
        process_start,
        one_time: Some(generated.one_time).filter(|w| !w.is_empty()),
    };
    if let Some(path) = &job.timings {
        append_jsonl(path, &record)?;
    }
    Ok(record)
}

/// The kept latents and frames (`outputs.save_latents`, `outputs.save_frames`, or `--save-latents`
/// and `--save-frames`): raw little-endian arrays, each written whole or not at all, so that a
/// crash leaves no partial array for `runner compare` to read. Gives the size of each written,
/// by kind, for the prompt's timing record.
fn save_outputs(
    job: &JobSpec,
    generated: &Generated,
) -> Result<std::collections::BTreeMap<String, u64>, WorkerError> {
    let mut sizes = std::collections::BTreeMap::new();
    let write = |path: PathBuf, bytes: &[u8]| {
        crate::atomic_file::write_making_folder(&path, bytes).map_err(|e| write_error(&path, e))
    };
    let index = generated.prompt_index;
    if let Some(dir) = &job.latents {
        let bytes: Vec<u8> = generated
            .latents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        write(dir.join(ArrayKind::Latents.file_name(index)), &bytes)?;
        sizes.insert(ArrayKind::Latents.dir().to_string(), bytes.len() as u64);
    }
    if let Some(dir) = job.frames.as_ref().filter(|_| !generated.frames.is_empty()) {
        write(
            dir.join(ArrayKind::Frames.file_name(index)),
            &generated.frames,
        )?;
        sizes.insert(
            ArrayKind::Frames.dir().to_string(),
            generated.frames.len() as u64,
        );
    }
    Ok(sizes)
}

/// `--bench`'s line: means over the measured round.
fn print_summary(measured: &[(engine::PhaseTimes, Option<u64>)]) {
    if measured.is_empty() {
        return;
    }
    let n = measured.len() as f64;
    let mean = |f: fn(&engine::PhaseTimes) -> Duration| {
        measured
            .iter()
            .map(|(t, _)| f(t).as_secs_f64())
            .sum::<f64>()
            / n
    };
    let total = mean(|t| t.timed_total);
    let run = mean(|t| t.session_run);
    let peak = measured.iter().filter_map(|(_, p)| *p).max();
    println!(
        "bench: {} videos, {:.4} s per video (timed region; dit {:.4} s, vae {:.4} s, layout {:.4} s), session.run {:.4} s, outside session.run {:.2}%, peak device memory {}",
        measured.len(),
        total,
        mean(|t| t.dit),
        mean(|t| t.vae),
        mean(|t| t.layout),
        run,
        100.0 * (total - run).max(0.0) / total,
        peak.map_or("n/a".to_string(), |b| format!(
            "{:.2} GiB",
            b as f64 / (1u64 << 30) as f64
        )),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loaded_library_versions_come_from_the_mapped_file_names() {
        let maps = "7f0-7f1 r-xp 0 08:01 1 /usr/lib/libcudnn.so.9\n\
                    7f1-7f2 r-xp 0 08:01 2 /opt/nvidia/cudnn/lib/libcudnn.so.9.10.2\n\
                    7f2-7f3 r-xp 0 08:01 3 /usr/local/cuda/lib/libcudart.so.13.0.48\n";
        assert_eq!(
            loaded_version(maps, "libcudnn.so.").as_deref(),
            Some("9.10.2")
        );
        assert_eq!(
            loaded_version(maps, "libcudart.so.").as_deref(),
            Some("13.0.48")
        );
        assert_eq!(loaded_version(maps, "libnvinfer.so."), None);
    }

    #[test]
    fn bundle_errors_are_usage_errors() {
        use exit::Failure;
        let error = WorkerError::Generate(GenerateError::Bundle(engine::BundleError::Format {
            found: 9,
        }));
        assert_eq!(error.exit_code(), exit::USAGE);
        assert_eq!(WorkerError::Usage("x".into()).exit_code(), exit::USAGE);
    }
}

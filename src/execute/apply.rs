//! `runner apply`: the execute pass. Checks what only a real run needs (the bundle, the prompt
//! file, existing state), takes the work-root lock, stages the snapshot, runs each slot's
//! processes in order (slots in parallel) as worker processes of the staged binary, and records
//! timings, the summary and provenance. Re-applying a run resumes it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::lock::{Lock, LockError};
use super::progress::{Progress, SlotWork};
use super::spec::{ProcessSpec, PromptSpec, WorkerEvent};
use super::staging::{self, StageRequest, StagingError};
use crate::engine;
use crate::manifest::diagnostic::display_path;
use crate::manifest::{CacheMode, Kind, Provider, Resolved};
use crate::plan::{Plan, Process, Role};
use crate::results::files::{
    RUN_JSON, SUMMARY_JSON, TIMINGS_JSONL, read_json, read_timings, write_atomic, write_json_atomic,
};
use crate::results::records::{
    BundleRecord, CacheLabel, ProcessRole, RunRecord, RunStatus, Summary, TimingRecord,
    TokenizerRecord, WeightsRecord,
};

/// How `apply` behaves beyond the manifest.
#[derive(Debug, Clone, Default)]
pub struct ApplyOptions {
    /// Reuse an existing staging folder whose audit matches.
    pub reuse_workdir: bool,
    /// No progress output (tests, scripts).
    pub quiet: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The user must change something; nothing was written.
    #[error("{message}")]
    Refused {
        message: String,
        hint: Option<String>,
    },
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Staging(#[from] StagingError),
    #[error("cannot write results: {0}")]
    Results(#[from] crate::results::files::RecordError),
    #[error("{0}")]
    Io(String),
}

impl ApplyError {
    fn refused(message: impl Into<String>, hint: impl Into<String>) -> Self {
        ApplyError::Refused {
            message: message.into(),
            hint: Some(hint.into()),
        }
    }

    /// Errors of input (bad state, a held lock) rather than of the machine.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            ApplyError::Refused { .. }
                | ApplyError::Lock(LockError::Held { .. })
                | ApplyError::Staging(
                    StagingError::Exists(_)
                        | StagingError::AuditMismatch { .. }
                        | StagingError::Symlink(_)
                )
        )
    }

    pub fn hint(&self) -> Option<&str> {
        match self {
            ApplyError::Refused { hint, .. } => hint.as_deref(),
            _ => None,
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: RunStatus,
    pub run_dir: PathBuf,
    pub failures: Vec<String>,
}

/// Set by the SIGINT/SIGTERM handler; checked between processes and while waiting.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// Where a probe's `--save-videos` debug videos go (deleted after each probe process).
pub fn debug_video_dir(run: &str, env_tmp: Option<&str>) -> PathBuf {
    let tmp = env_tmp.filter(|t| !t.is_empty()).unwrap_or("/tmp");
    Path::new(tmp)
        .join("unstep_wrapper_generation_outputs")
        .join(run)
        .join("indexed_videos")
}

/// Checks that need the real world (files present, no conflicting state) — before any write.
fn preflight(r: &Resolved) -> Result<(), ApplyError> {
    let p = &r.paths;
    if r.prompts.is_none() {
        return Err(ApplyError::refused(
            format!(
                "prompt file {} does not exist",
                display_path(&p.prompts_file)
            ),
            "put one prompt per line there (see assets/prompts/README.md), or set prompts.file",
        ));
    }
    if !p.bundle.exists() {
        return Err(ApplyError::refused(
            format!("asset bundle {} does not exist", display_path(&p.bundle)),
            "export it on a GPU machine with `PYTHONPATH=assets/export python -m unstep_export export --preset wan-1.3b --device cuda --out assets/wan-1.3b` (see assets/export/README.md), or set assets.bundle",
        ));
    }
    let m = &r.manifest;
    use crate::manifest::AttentionBackend;
    if m.runtime.provider == Provider::Cpu
        && !matches!(
            m.method.attention_backend,
            AttentionBackend::Auto | AttentionBackend::Math
        )
    {
        return Err(ApplyError::refused(
            format!(
                "attention backend `{}` is not available on the CPU provider",
                crate::plan::render::word(&m.method.attention_backend)
            ),
            "use `auto` or `math` on the CPU, or runtime.provider = \"cuda\"",
        ));
    }
    fused_kernels_preflight(r)?;
    tokenizer_preflight(r)?;
    probe_state_preflight(r)
}

/// The bundle's prompt tokenizer must read and check (a umt5 tokenizer.json of the right model,
/// its sha256, ids within the text encoder's vocabulary) before anything runs. A bundle that is
/// not a readable directory is left to the worker.
fn tokenizer_preflight(r: &Resolved) -> Result<(), ApplyError> {
    let Ok(bundle) = engine::Bundle::peek(&r.paths.bundle) else {
        return Ok(());
    };
    bundle
        .tokenizer()
        .map(drop)
        .map_err(|e| ApplyError::Refused {
            message: format!("asset bundle {}: {e}", display_path(&r.paths.bundle)),
            hint: None,
        })
}

/// The staged bundle's tokenizer over every prompt of the plan, and the sources of its weights.
fn bundle_facts(
    bundle_dir: &Path,
    plan: &Plan,
    prompts: &[String],
) -> Result<(TokenizerRecord, WeightsRecord), engine::BundleError> {
    let bundle = engine::Bundle::peek(bundle_dir)?;
    let tokenizer = bundle.tokenizer()?;
    let indices: BTreeSet<u32> = plan
        .processes
        .iter()
        .flat_map(|p| p.prompts.iter().copied())
        .collect();
    let mut truncated = Vec::new();
    let mut mojibake = Vec::new();
    for &index in &indices {
        let Some(text) = prompts.get(index as usize) else {
            continue;
        };
        let tokens = tokenizer.encode(text)?;
        if tokens.truncated {
            truncated.push(index);
        }
        if tokens.mojibake {
            mojibake.push(index);
        }
    }
    let tokenizer = TokenizerRecord {
        kind: tokenizer.kind().to_string(),
        text_len: tokenizer.text_len(),
        prompts: indices.len(),
        truncated: truncated.len(),
        truncated_prompts: truncated,
        mojibake_prompts: mojibake,
    };
    let m = &bundle.manifest;
    let weights = m.weights.clone().unwrap_or_default();
    let [dit, vae, text_encoder] = weights.sources().map(|(_, s)| s.as_str().to_string());
    let weights = WeightsRecord {
        source: weights.summary().as_str().to_string(),
        dit,
        vae,
        text_encoder,
        tokenizer: weights.tokenizer.map(|t| t.source.as_str().to_string()),
    };
    Ok((tokenizer, weights))
}

/// Warnings about the prompts a umt5 tokenizer cut or may read differently from the reference.
/// The bytes tokenizer of bundles before exporter 0.13.0 cuts most prompts by design and is not
/// warned about.
fn tokenizer_warnings(t: &TokenizerRecord, r: &Resolved) -> Vec<String> {
    if t.kind != "umt5" {
        return Vec::new();
    }
    let command = format!(
        "`runner prompts {} {}`",
        display_path(&r.paths.bundle),
        display_path(&r.paths.prompts_file)
    );
    let mut warnings = Vec::new();
    if t.truncated > 0 {
        warnings.push(format!(
            "{} of {} prompts have more than text_len {} tokens and are cut there (prompts {}); {command} shows their tokens",
            t.truncated,
            t.prompts,
            t.text_len,
            short_list(&t.truncated_prompts)
        ));
    }
    if !t.mojibake_prompts.is_empty() {
        warnings.push(format!(
            "prompts {} look like mojibake (UTF-8 read as Latin-1 or Windows-1252), which the reference pipeline's ftfy repairs before tokenizing and the runner does not: their tokens may differ; {command} lists them",
            short_list(&t.mojibake_prompts)
        ));
    }
    warnings
}

/// Prompt indices for a message: the first ten, then `…`.
fn short_list(indices: &[u32]) -> String {
    let shown: Vec<String> = indices.iter().take(10).map(u32::to_string).collect();
    let more = if indices.len() > 10 { ", …" } else { "" };
    format!("{}{more}", shown.join(", "))
}

/// A probe measures with fresh compiler caches: runtime state left by an earlier apply of the
/// same run is refused unless the manifest asks to reuse it.
fn probe_state_preflight(r: &Resolved) -> Result<(), ApplyError> {
    let m = &r.manifest;
    if m.kind == Kind::Probe {
        let state = &r.paths.run_state_root;
        let has_state = fs::read_dir(state)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        if has_state && !m.cache.reuse_runtime_state {
            return Err(ApplyError::refused(
                format!("runtime state already exists at {}", display_path(state)),
                "use a new run name for fresh results, or set cache.reuse_runtime_state = true (UNSTEP_REUSE_RUNTIME_STATE=1) to reuse it",
            ));
        }
    }
    Ok(())
}

/// The runner's fused kernels asked for by name (`runtime.dit_kernels` / `runtime.vae_kernels` =
/// "unstep") that the provider or the bundle cannot run (TensorRT, a bundle without the fused
/// graphs or in bf16, a fused DiT whose self-attention is cuDNN's with an fp32 bundle or another
/// attention backend): refused here, with the setting's location, instead of when the first
/// worker builds its sessions. A bundle that is not a readable directory is left to the worker.
fn fused_kernels_preflight(r: &Resolved) -> Result<(), ApplyError> {
    let Ok(bundle) = engine::Bundle::peek(&r.paths.bundle) else {
        return Ok(());
    };
    let runtime = super::spec::runtime_options(&r.manifest, Path::new(""), None);
    let parts = [
        (
            engine::FusedPart::Dit,
            runtime.dit_kernels,
            "runtime.dit_kernels",
        ),
        (
            engine::FusedPart::Vae,
            runtime.vae_kernels,
            "runtime.vae_kernels",
        ),
    ];
    for (part, kernels, key) in parts {
        // `auto` falls back instead of failing (and would load the CUDA libraries here).
        if kernels != engine::FusedKernels::Unstep {
            continue;
        }
        if let Err(e) = kernels.resolve(part, &runtime.provider, &bundle) {
            let origin = r
                .settings
                .get(key)
                .map(|s| s.origin.to_string())
                .unwrap_or_else(|| key.to_string());
            return Err(ApplyError::refused(
                format!("{origin}: {e}"),
                "change the setting there, or export the bundle the setting needs",
            ));
        }
    }
    Ok(())
}

/// What a previous apply of the same run left.
#[derive(Default)]
struct Completed {
    /// The prompts already complete.
    done: BTreeSet<u32>,
    /// Its run record (a generation's, which this apply resumes; a probe is measured afresh).
    previous: Option<RunRecord>,
    /// Videos of prompts whose text has changed since they were made, to be removed before the
    /// prompts are made again.
    stale_videos: Vec<PathBuf>,
}

fn completed(r: &Resolved, run_dir: &Path, config_hash: &str) -> Result<Completed, ApplyError> {
    let run_json = run_dir.join(RUN_JSON);
    if !run_json.exists() {
        return Ok(Completed::default());
    }
    let previous: RunRecord = read_json(&run_json)?;
    if r.manifest.kind == Kind::Probe {
        return Ok(Completed::default());
    }
    if previous.config_hash != config_hash {
        return Err(ApplyError::refused(
            format!(
                "{} holds run `{}` made with a different configuration",
                display_path(run_dir),
                previous.run
            ),
            "give this configuration its own run name (`name = \"…\"` or --set name=…)",
        ));
    }
    // A prompt is done when a record of its latest output has this configuration, the prompt's
    // current text and its video; the latest record decides (a prompt made again after its text
    // changed has a newer record).
    let prompts = r.prompts.as_deref().unwrap_or_default();
    let mut latest: BTreeMap<u32, TimingRecord> = BTreeMap::new();
    for rec in all_timings(run_dir) {
        if rec.role == ProcessRole::Shard {
            latest.insert(rec.prompt, rec);
        }
    }
    let mut done = BTreeSet::new();
    let mut changed = Vec::new();
    let mut stale_videos = Vec::new();
    for (prompt, rec) in &latest {
        let video_ok = match &rec.video {
            Some(v) => run_dir.join(v).is_file(),
            None => !r.manifest.outputs.save_videos,
        };
        let text = prompts
            .get(*prompt as usize)
            .map(|t| crate::results::prompt_hash(t));
        let same_text = rec.prompt_sha256.is_some() && rec.prompt_sha256 == text;
        if rec.prompt_sha256.is_some() && !same_text {
            changed.push(*prompt);
            stale_videos.extend(rec.video.as_ref().map(|v| run_dir.join(v)));
        }
        if rec.config_hash == config_hash && video_ok && same_text {
            done.insert(*prompt);
        }
    }
    if !changed.is_empty() {
        eprintln!(
            "warning: the text of prompt(s) {} in {} differs from the text their videos in {} were made from; they are generated again",
            short_list(&changed),
            display_path(&r.paths.prompts_file),
            display_path(run_dir),
        );
    }
    Ok(Completed {
        done,
        previous: Some(previous),
        stale_videos,
    })
}

/// What an `apply` of a plan finds under its results folder, as `runner plan` tells it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PreviousRun {
    /// Nothing there yet.
    New,
    /// A generation of the same configuration: apply resumes it, skipping the `done` prompts
    /// of the `selected`.
    Resumes { done: usize, selected: usize },
    /// A probe's record (its runtime state reused, as the manifest asks): apply measures the
    /// probe afresh.
    Remeasures,
    /// Apply would refuse the run, with this message and hint.
    Refused {
        message: String,
        hint: Option<String>,
    },
}

/// What an `apply` of `plan` would find under its results folder.
pub fn previous_run(r: &Resolved, plan: &Plan) -> PreviousRun {
    let selected: BTreeSet<u32> = plan
        .shards
        .iter()
        .flat_map(|sh| sh.prompts.iter().copied())
        .collect();
    let refused = |e: ApplyError| PreviousRun::Refused {
        message: e.to_string(),
        hint: e.hint().map(str::to_string),
    };
    if let Err(e) = probe_state_preflight(r) {
        return refused(e);
    }
    match completed(r, &plan.run_dir, &crate::results::config_hash(r)) {
        Err(e) => refused(e),
        Ok(Completed {
            done,
            previous: Some(_),
            ..
        }) => PreviousRun::Resumes {
            done: done.intersection(&selected).count(),
            selected: selected.len(),
        },
        // `completed` gives no record to resume for a probe's (measured afresh) or for none.
        Ok(_) if plan.run_dir.join(RUN_JSON).exists() => PreviousRun::Remeasures,
        Ok(_) => PreviousRun::New,
    }
}

/// Every timing record of a run, from the per-process files, in process order.
fn all_timings(run_dir: &Path) -> Vec<TimingRecord> {
    let dir = run_dir.join("timings");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .flat_map(|f| read_timings(f).unwrap_or_default())
        .collect()
}

/// Runs a plan.
pub fn apply(r: &Resolved, plan: &Plan, opts: &ApplyOptions) -> Result<Outcome, ApplyError> {
    preflight(r)?;
    let m = &r.manifest;
    let run_dir = plan.run_dir.clone();
    let config_hash = crate::results::config_hash(r);
    let Completed {
        done,
        previous,
        stale_videos,
    } = completed(r, &run_dir, &config_hash)?;

    // Nothing has been written so far; from here on the run holds its locks.
    let _work_lock = Lock::acquire(&plan.work_root, &plan.run)?;
    let _shared_lock = if m.cache.mode == CacheMode::Shared {
        Some(Lock::acquire(&r.paths.shared_state_dir, &plan.run)?)
    } else {
        None
    };
    install_signal_handlers();
    INTERRUPTED.store(false, Ordering::SeqCst);
    // A video made from a prompt's earlier text would otherwise stay beside the new one.
    for video in &stale_videos {
        if let Err(e) = fs::remove_file(video)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(ApplyError::Io(format!(
                "cannot remove the stale video {}: {e}",
                display_path(video)
            )));
        }
    }

    let runner = std::env::current_exe()
        .map_err(|e| ApplyError::Io(format!("cannot find the runner binary: {e}")))?;
    let resolved_toml = toml::to_string(&m).unwrap_or_default();
    let stage = staging::stage(&StageRequest {
        dir: plan.work_root.join(&plan.run),
        bundle: r.paths.bundle.clone(),
        prompts_file: r.paths.prompts_file.clone(),
        manifests: r.files.iter().map(|f| f.path.clone()).collect(),
        resolved_manifest: resolved_toml,
        runner,
        reuse: opts.reuse_workdir,
    })?;

    if m.cache.clear_global {
        clear_global_caches();
    }
    let mkdir = |d: &Path| {
        fs::create_dir_all(d)
            .map_err(|e| ApplyError::Io(format!("cannot create {}: {e}", d.display())))
    };
    for d in ["logs", "timings", "specs"] {
        mkdir(&run_dir.join(d))?;
    }
    if m.kind == Kind::Probe && m.cache.reuse_runtime_state {
        // A re-measured probe starts its timings afresh; its compiler state is what is reused.
        let _ = fs::remove_dir_all(run_dir.join("timings"));
        mkdir(&run_dir.join("timings"))?;
    }
    let videos = match (m.kind, m.outputs.save_videos) {
        (Kind::Generation, true) => {
            let d = run_dir.join("videos");
            mkdir(&d)?;
            Some(d)
        }
        (Kind::Probe, true) => {
            let tmp = std::env::var("TMPDIR").ok();
            Some(debug_video_dir(&plan.run, tmp.as_deref()))
        }
        _ => None,
    };

    let mut record = RunRecord::new(r, plan, SystemTime::now());
    if let Some(previous) = &previous {
        record.resume(previous);
    }
    record.git = crate::results::records::GitState::detect(
        r.files
            .first()
            .and_then(|f| f.path.parent())
            .unwrap_or(Path::new(".")),
    );
    if m.runtime.provider != Provider::Cpu {
        // The GPU of the first slot; a run over several GPUs of one host has one model.
        if let Ok(gpus) = super::device::gpus()
            && let Some(g) = gpus
                .iter()
                .find(|g| Some(&g.index) == plan.slots.first().map(|s| &s.device))
        {
            record.device.gpu_model = Some(g.name.clone());
            record.device.gpu_memory_bytes = g.memory_bytes;
            record.device.driver_version = Some(g.driver.clone());
        }
    }
    let prompts = r.prompts.as_deref().unwrap_or_default();
    // A bundle whose tokenizer cannot be read here fails in its workers, which say why.
    if let Ok((tokenizer, weights)) = bundle_facts(&stage.bundle, plan, prompts) {
        if !opts.quiet {
            for warning in tokenizer_warnings(&tokenizer, r) {
                eprintln!("warning: {warning}");
            }
        }
        record.tokenizer = Some(tokenizer);
        record.weights = Some(weights);
    }
    write_json_atomic(&run_dir.join(RUN_JSON), &record)?;

    // The audit hashed every staged file; workers take the bundle's hashes from it.
    let bundle_sha256: BTreeMap<String, String> = stage
        .audit
        .files
        .iter()
        .filter_map(|(path, hash)| Some((path.strip_prefix("bundle/")?.to_string(), hash.clone())))
        .collect();
    let specs: Vec<Option<ProcessSpec>> = plan
        .processes
        .iter()
        .map(|p| {
            process_spec(
                r,
                plan,
                p,
                prompts,
                &stage.bundle,
                &bundle_sha256,
                &run_dir,
                &videos,
                &config_hash,
                &done,
            )
        })
        .collect();
    let work: Vec<SlotWork> = plan
        .slots
        .iter()
        .enumerate()
        .map(|(i, slot)| SlotWork {
            label: slot.label.clone(),
            prompts: plan
                .processes
                .iter()
                .zip(&specs)
                .filter(|(p, s)| {
                    p.slot == i && s.as_ref().is_some_and(|s| s.role != ProcessRole::Warmup)
                })
                .map(|(_, s)| s.as_ref().map_or(0, |s| s.prompts.len()))
                .sum(),
        })
        .collect();
    let progress = Progress::new(opts.quiet, &work, done.len());
    let failures = run_slots(
        plan,
        &specs,
        &stage.runner,
        &run_dir,
        m.kind == Kind::Probe,
        &progress,
    );
    progress.finish();

    let interrupted = INTERRUPTED.load(Ordering::SeqCst);
    let records = all_timings(&run_dir);
    let jsonl: String = records
        .iter()
        .map(|rec| serde_json::to_string(rec).expect("records serialise") + "\n")
        .collect();
    write_atomic(&run_dir.join(TIMINGS_JSONL), jsonl.as_bytes())?;
    let summary = Summary::from_records(&records, m.kind, CacheLabel::of(m.cache.mode));
    write_json_atomic(&run_dir.join(SUMMARY_JSON), &summary)?;
    let _ = crate::report::write_latency_svg(&run_dir, &records);

    let status = if interrupted {
        RunStatus::Interrupted
    } else if failures.is_empty() {
        RunStatus::Succeeded
    } else {
        RunStatus::Failed
    };
    if let Some(WorkerEvent::Ready {
        provider,
        ort_version,
        attention_backend,
        dit_kernels,
        vae_kernels,
        bundle_preset,
        bundle_exporter_version,
        cuda_version,
        cudnn_version,
    }) = worker_facts(&run_dir)
    {
        if let (Some(preset), Some(exporter_version)) = (bundle_preset, bundle_exporter_version) {
            record.bundle = Some(BundleRecord {
                path: r.paths.bundle.display().to_string(),
                preset,
                exporter_version,
            });
        }
        record.execution_provider = Some(provider);
        record.versions.onnxruntime = Some(ort_version);
        record.versions.cuda = cuda_version;
        record.versions.cudnn = cudnn_version;
        record.attention_backend.resolved = Some(attention_backend);
        record.dit_kernels = dit_kernels;
        record.vae_kernels = vae_kernels;
    }
    record.finish(
        status,
        (!failures.is_empty()).then(|| failures.join("\n\n")),
    );
    write_json_atomic(&run_dir.join(RUN_JSON), &record)?;

    // Cleanup: success and interruption remove the staging snapshot; a failed run keeps
    // it, with its isolated state, for diagnosis.
    if status != RunStatus::Failed {
        let _ = stage.remove();
    }
    if status == RunStatus::Succeeded
        && m.kind == Kind::Generation
        && let Some(cmd) = &m.evaluation.command
    {
        run_evaluation(cmd, &run_dir, &plan.run)?;
    }
    Ok(Outcome {
        status,
        run_dir,
        failures,
    })
}

#[allow(clippy::too_many_arguments)]
fn process_spec(
    r: &Resolved,
    plan: &Plan,
    p: &Process,
    prompts: &[String],
    bundle: &Path,
    bundle_sha256: &BTreeMap<String, String>,
    run_dir: &Path,
    videos: &Option<PathBuf>,
    config_hash: &str,
    done: &BTreeSet<u32>,
) -> Option<ProcessSpec> {
    let todo: Vec<PromptSpec> = p
        .prompts
        .iter()
        .filter(|i| !matches!(p.role, Role::Shard { .. }) || !done.contains(i))
        .map(|&i| PromptSpec {
            index: i,
            text: prompts.get(i as usize).cloned().unwrap_or_default(),
        })
        .collect();
    let (role, shard) = match p.role {
        Role::Warmup { .. } => (ProcessRole::Warmup, None),
        Role::Measurement => (ProcessRole::Measurement, Some(0)),
        Role::Shard { shard } => (ProcessRole::Shard, Some(shard)),
    };
    // A resumed shard with nothing left is skipped, and so is its slot's warmup when every
    // shard of the slot is complete.
    if role == ProcessRole::Shard && todo.is_empty() {
        return None;
    }
    if role == ProcessRole::Warmup && r.manifest.kind == Kind::Generation {
        let slot_busy = plan.processes.iter().any(|q| {
            q.slot == p.slot
                && matches!(q.role, Role::Shard { .. })
                && q.prompts.iter().any(|i| !done.contains(i))
        });
        if !slot_busy {
            return None;
        }
    }
    if let Some(marker) = &p.skip_if_marker
        && marker.exists()
    {
        return None;
    }
    let mut manifest = r.manifest.clone();
    if manifest.kind == Kind::Probe {
        // A probe's debug videos go to `indexed_videos`, named by prompt index.
        manifest.outputs.video_naming = crate::manifest::VideoNaming::Indexed;
    }
    Some(ProcessSpec {
        run: plan.run.clone(),
        process: p.index,
        role,
        shard,
        slot: plan.slots[p.slot].label.clone(),
        bundle: bundle.to_path_buf(),
        bundle_sha256: bundle_sha256.clone(),
        prompts: todo,
        manifest,
        cache_dir: p.cache_dir.clone(),
        timings: run_dir
            .join("timings")
            .join(format!("{:03}.jsonl", p.index)),
        run_dir: run_dir.to_path_buf(),
        // Warmups never keep videos.
        videos: if role == ProcessRole::Warmup {
            None
        } else {
            videos.clone()
        },
        config_hash: config_hash.to_string(),
        ort_library: r.paths.ort_library.clone(),
    })
}

/// Runs every slot's processes; slots in parallel, processes of a slot one after another.
/// Returns the failures, each with the tail of the worker's log.
fn run_slots(
    plan: &Plan,
    specs: &[Option<ProcessSpec>],
    runner: &Path,
    run_dir: &Path,
    probe: bool,
    progress: &Progress,
) -> Vec<String> {
    let failures = Arc::new(Mutex::new(Vec::new()));
    let children: Arc<Mutex<BTreeMap<usize, u32>>> = Arc::new(Mutex::new(BTreeMap::new()));
    let (tx, rx) = mpsc::channel::<(usize, WorkerEvent)>();
    std::thread::scope(|scope| {
        for slot in 0..plan.slots.len() {
            let tx = tx.clone();
            let failures = Arc::clone(&failures);
            let children = Arc::clone(&children);
            scope.spawn(move || {
                for (p, spec) in plan.processes.iter().zip(specs) {
                    if p.slot != slot {
                        continue;
                    }
                    let Some(spec) = spec else { continue };
                    if INTERRUPTED.load(Ordering::SeqCst) {
                        return;
                    }
                    let result = run_process(plan, p, spec, runner, run_dir, &tx, &children);
                    if probe && let Some(v) = &spec.videos {
                        // Debug videos never outlive their probe process, failed or not.
                        let _ = fs::remove_dir_all(v);
                    }
                    match result {
                        Ok(()) => {
                            if let Some(marker) = &p.skip_if_marker {
                                let _ = fs::write(marker, format!("{}\n", plan.run));
                            }
                        }
                        Err(msg) => {
                            failures.lock().expect("lock").push(msg);
                            // Later processes of this slot depend on its warm state; stop here.
                            return;
                        }
                    }
                }
            });
        }
        drop(tx);
        // The main thread reports progress and forwards an interruption to the workers.
        loop {
            match rx.recv_timeout(std::time::Duration::from_millis(100)) {
                Ok((process, event)) => {
                    let p = &plan.processes[process];
                    let warmup = matches!(p.role, Role::Warmup { .. });
                    progress.event(p.slot, &process_name(plan, p), warmup, &event)
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if INTERRUPTED.load(Ordering::SeqCst) {
                for pid in children.lock().expect("lock").values() {
                    // SAFETY: sending a signal to a child we started.
                    unsafe { libc::kill(*pid as libc::pid_t, libc::SIGTERM) };
                }
            }
        }
    });
    Arc::try_unwrap(failures)
        .map(|m| m.into_inner().expect("lock"))
        .unwrap_or_default()
}

fn run_process(
    plan: &Plan,
    p: &Process,
    spec: &ProcessSpec,
    runner: &Path,
    run_dir: &Path,
    tx: &mpsc::Sender<(usize, WorkerEvent)>,
    children: &Mutex<BTreeMap<usize, u32>>,
) -> Result<(), String> {
    let describe = || process_name(plan, p);
    let spec_path = run_dir.join("specs").join(format!("{:03}.json", p.index));
    let text = serde_json::to_string_pretty(spec).expect("specs serialise");
    write_atomic(&spec_path, text.as_bytes()).map_err(|e| format!("{}: {e}", describe()))?;
    fs::create_dir_all(&spec.cache_dir).map_err(|e| {
        format!(
            "{}: cannot create {}: {e}",
            describe(),
            spec.cache_dir.display()
        )
    })?;
    if let Some(v) = &spec.videos {
        fs::create_dir_all(v)
            .map_err(|e| format!("{}: cannot create {}: {e}", describe(), v.display()))?;
    }
    let log = fs::File::create(&p.log)
        .map_err(|e| format!("{}: cannot create {}: {e}", describe(), p.log.display()))?;
    let mut cmd = Command::new(runner);
    cmd.arg("worker")
        .arg("--spec")
        .arg(&spec_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        // Compiler caches of this process, and nothing global: the CUDA driver's JIT
        // cache and the decoder convolutions' engine choices.
        .env("CUDA_CACHE_PATH", spec.cache_dir.join("cuda_jit"))
        .env(
            crate::engine::kernels::CONV_CACHE_ENV,
            spec.cache_dir.join("cudnn_conv"),
        )
        .env(
            "OMP_NUM_THREADS",
            spec.manifest.runtime.cpu_threads_per_process.0.to_string(),
        );
    if spec.manifest.runtime.provider != Provider::Cpu {
        cmd.env("CUDA_VISIBLE_DEVICES", &plan.slots[p.slot].device);
    }
    let mut child: Child = cmd
        .spawn()
        .map_err(|e| format!("{}: cannot start {}: {e}", describe(), runner.display()))?;
    children.lock().expect("lock").insert(p.index, child.id());
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Ok(event) = serde_json::from_str::<WorkerEvent>(&line) {
                if let WorkerEvent::Ready { .. } = &event {
                    let facts = run_dir.join("logs").join("worker_facts.json");
                    let _ = write_atomic(&facts, line.as_bytes());
                }
                let _ = tx.send((p.index, event));
            }
        }
    }
    let status = child.wait().map_err(|e| format!("{}: {e}", describe()))?;
    children.lock().expect("lock").remove(&p.index);
    if status.success() {
        return Ok(());
    }
    let tail = log_tail(&p.log, 20);
    let how = match status.code() {
        Some(c) => format!("exited with status {c}"),
        None => "was killed by a signal".to_string(),
    };
    Err(format!(
        "{} {how} (log {}):\n{tail}",
        describe(),
        display_path(&p.log)
    ))
}

/// A process as messages name it: `gpu0 warmup 1`, `cpu1 shard 3`.
fn process_name(plan: &Plan, p: &Process) -> String {
    let slot = &plan.slots[p.slot].label;
    match p.role {
        Role::Warmup { repeat } => format!("{slot} warmup {repeat}"),
        Role::Measurement => format!("{slot} measurement"),
        Role::Shard { shard } => format!("{slot} shard {shard}"),
    }
}

/// The last `n` lines of a log, for failure reports.
fn log_tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What a worker reported when its sessions were ready: provider, ONNX Runtime version and the
/// resolved attention backend.
fn worker_facts(run_dir: &Path) -> Option<WorkerEvent> {
    let text = fs::read_to_string(run_dir.join("logs").join("worker_facts.json")).ok()?;
    serde_json::from_str::<WorkerEvent>(&text).ok()
}

/// Purges user-level compiler caches (only on request: other jobs may be using them).
fn clear_global_caches() {
    if let Ok(home) = std::env::var("HOME") {
        let _ = fs::remove_dir_all(Path::new(&home).join(".nv").join("ComputeCache"));
    }
}

fn run_evaluation(cmd: &str, run_dir: &Path, run: &str) -> Result<(), ApplyError> {
    let cmd = cmd
        .replace("{videos}", &run_dir.join("videos").display().to_string())
        .replace("{run}", run);
    let log = run_dir.join("logs").join("evaluation.log");
    let out = fs::File::create(&log).map_err(|e| ApplyError::Io(e.to_string()))?;
    let err = out.try_clone().map_err(|e| ApplyError::Io(e.to_string()))?;
    let status = Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .stdout(out)
        .stderr(err)
        .status()
        .map_err(|e| ApplyError::Io(format!("cannot run the evaluation command: {e}")))?;
    if !status.success() {
        return Err(ApplyError::Io(format!(
            "the evaluation command failed ({status}); see {}",
            display_path(&log)
        )));
    }
    Ok(())
}

//! An apply's preparation, once it holds the run's locks: the staged snapshot, the run's folders
//! marked as its own, the run folder's parts, the record that says it is running, and the jobs of
//! its processes.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::config::RunConfig;
use super::job::JobSpec;
use super::jobs::JobFactory;
use super::outcome::{ApplyError, ApplyOptions};
use super::preflight::{bundle_facts, tokenizer_warnings};
use super::resume::Completed;
use super::shard_apply::write_record;
use super::staging::{self, Stage, StageRequest};
use crate::engine::ProviderKind;
use crate::manifest::diagnostic::display_path;
use crate::manifest::{CacheMode, ExecutorKind, Kind, Resolved};
use crate::plan::Plan;
use crate::results::arrays::ArrayKind;
use crate::results::files::{RUN_JSON, SUMMARY_JSON, TIMINGS_JSONL};
use crate::results::names::VideoNames;
use crate::results::records::{CacheLabel, ProcessSkip, RunRecord};

/// A run that has started: what its workers run from, its record (status running, written), and
/// the job of each process (`None`: nothing left to do there).
pub(super) struct Started {
    pub stage: Stage,
    pub record: RunRecord,
    pub jobs: Vec<Option<JobSpec>>,
    /// The selected prompts an earlier apply completed, which this one skips.
    pub skipped: usize,
}

/// Stages the snapshot (reusing the one an apply of this run that was killed left, when its
/// audit matches), marks the run's folders as its own, purges the global caches it names,
/// prepares the run folder and writes the record that says the run is running.
pub(super) fn start(
    r: &Resolved,
    plan: &Plan,
    config: &RunConfig,
    config_hash: &str,
    found: &Completed,
    opts: &ApplyOptions,
) -> Result<Started, ApplyError> {
    let m = &r.manifest;
    // The staging left by an apply of this run that was killed (its record still says running,
    // or the snapshot is the run's and was not kept after a failure; this apply now holds the
    // work root's lock) is reused when its audit matches.
    let killed = staging::left_by_killed_apply(
        &plan.work_root.join(&plan.run),
        &plan.run,
        &plan.run_dir,
        found.previous.as_ref(),
    );
    let stage = stage(r, plan, opts.reuse_workdir || killed)?;
    // The run starts with its results folder: an interrupt that arrived before (while the
    // snapshot was staged, or earlier) ends the apply here, the snapshot it made removed and the
    // run as it was. A reused snapshot is left for the next apply, as it was found.
    if super::signals::interrupted() {
        if !stage.reused {
            let _ = stage.remove();
        }
        return Err(ApplyError::Interrupted {
            run: plan.run.clone(),
        });
    }
    mark_owned(r, plan, &stage)?;
    clear_global_caches(&r.paths.global_caches);
    // Read before the run adds state of its own.
    let reused_state = m.kind == Kind::Probe
        && m.cache.reuse_runtime_state
        && fs::read_dir(&r.paths.run_state_root).is_ok_and(|mut d| d.next().is_some());
    let videos = prepare_run_dir(r, plan)?;
    let mut record = start_record(
        r,
        plan,
        config,
        found.previous.as_ref(),
        &stage,
        opts,
        reused_state,
    )?;
    let jobs = JobFactory {
        r,
        plan,
        config,
        stage: &stage,
        videos: &videos,
        config_hash,
        done: &found.done,
        names: &VideoNames::of(r),
    }
    .jobs();
    // Warmups that the shared cache's markers skip: the record says so, and the report with it.
    for p in plan.processes.iter().filter(|p| plan.selects(p)) {
        if p.skip_if_marker.as_ref().is_some_and(|m| m.exists())
            && let Some(q) = record.processes.iter_mut().find(|q| q.index == p.index)
        {
            q.skipped = Some(ProcessSkip::WarmupMarker);
        }
    }
    let skipped = plan
        .selected_shards()
        .flat_map(|sh| &sh.prompts)
        .filter(|i| found.done.contains(i))
        .count();
    Ok(Started {
        stage,
        record,
        jobs,
        skipped,
    })
}

/// Stages the audited snapshot the workers run from.
fn stage(r: &Resolved, plan: &Plan, reuse: bool) -> Result<Stage, ApplyError> {
    let runner = std::env::current_exe()
        .map_err(|e| ApplyError::Io(format!("cannot find the runner binary: {e}")))?;
    Ok(staging::stage(&StageRequest {
        dir: plan.work_root.join(&plan.run),
        bundle: r.paths.bundle.clone(),
        prompts_file: r.paths.prompts_file.clone(),
        manifests: r.files.iter().map(|f| f.path.clone()).collect(),
        resolved_manifest: toml::to_string(&r.manifest).unwrap_or_default(),
        runner,
        reuse,
    })?)
}

/// Marks the run's folders outside its results folder as its own (`results::owner`): its staging
/// snapshot and its isolated runtime state elsewhere, which `runner clean` removes only then.
fn mark_owned(r: &Resolved, plan: &Plan, stage: &Stage) -> Result<(), ApplyError> {
    let run_dir = &plan.run_dir;
    fs::create_dir_all(run_dir)
        .map_err(|e| ApplyError::Io(format!("cannot create {}: {e}", display_path(run_dir))))?;
    let mut folders = vec![stage.dir.clone()];
    if r.manifest.cache.mode == CacheMode::Isolated {
        for p in &plan.processes {
            if !p.cache_dir.starts_with(run_dir) && !folders.contains(&p.cache_dir) {
                folders.push(p.cache_dir.clone());
            }
        }
    }
    for folder in folders {
        crate::results::owner::mark(&folder, &plan.run, run_dir)?;
    }
    Ok(())
}

/// Creates the run folder's parts; returns where videos go, when they are written.
fn prepare_run_dir(r: &Resolved, plan: &Plan) -> Result<Option<PathBuf>, ApplyError> {
    let m = &r.manifest;
    let run_dir = &plan.run_dir;
    let mkdir = |d: &Path| {
        fs::create_dir_all(d)
            .map_err(|e| ApplyError::Io(format!("cannot create {}: {e}", d.display())))
    };
    for d in ["logs", "timings", "specs"] {
        mkdir(&run_dir.join(d))?;
    }
    if m.kind == Kind::Probe && m.cache.reuse_runtime_state {
        // A re-measured probe starts its timings afresh; its compiler state is what is reused.
        // The earlier measurement is kept, under `previous/<n>/`, not deleted before the new
        // one exists.
        keep_previous_measurement(run_dir)?;
        mkdir(&run_dir.join("timings"))?;
    }
    Ok(match (m.kind, m.outputs.save_videos) {
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
    })
}

/// Moves a probe's earlier measurement (its timings, summary and record) to `previous/<n>/`.
fn keep_previous_measurement(run_dir: &Path) -> Result<(), ApplyError> {
    let parts = [
        "timings",
        TIMINGS_JSONL,
        SUMMARY_JSON,
        RUN_JSON,
        crate::results::LATENCY_SVG,
        ArrayKind::Latents.dir(),
        ArrayKind::Frames.dir(),
    ];
    // The run folder's empty `timings/` (made just before) is no measurement: a probe's first
    // apply keeps nothing, and leaves no empty `previous/<n>/`.
    let measured = |part: &str| {
        let path = run_dir.join(part);
        match fs::read_dir(&path) {
            Ok(mut entries) => entries.next().is_some(),
            Err(_) => path.exists(),
        }
    };
    if !parts.iter().any(|p| measured(p)) {
        return Ok(());
    }
    let previous = run_dir.join("previous");
    let n = fs::read_dir(&previous).map(|d| d.count()).unwrap_or(0) + 1;
    let dest = previous.join(n.to_string());
    let io = |what: &Path, e: std::io::Error| {
        ApplyError::Io(format!(
            "cannot keep the earlier measurement {}: {e}",
            display_path(what)
        ))
    };
    fs::create_dir_all(&dest).map_err(|e| io(&dest, e))?;
    for part in parts {
        let from = run_dir.join(part);
        if from.exists() {
            fs::rename(&from, dest.join(part)).map_err(|e| io(&from, e))?;
        }
    }
    Ok(())
}

/// The run's record as it starts (status running), written to `run.json`.
fn start_record(
    r: &Resolved,
    plan: &Plan,
    config: &RunConfig,
    previous: Option<&RunRecord>,
    stage: &Stage,
    opts: &ApplyOptions,
    reused_state: bool,
) -> Result<RunRecord, ApplyError> {
    let mut record = RunRecord::new(r, plan, SystemTime::now());
    record.diagnostics = config.engine.diagnostics.in_effect();
    record.staging = Some(crate::results::records::StagingRecord {
        seconds: stage.seconds,
        reused: stage.reused,
        placements: (!stage.reused).then(|| stage.placements.clone()),
    });
    if reused_state {
        // A probe measured on the state an earlier measurement left is not a fresh start.
        record.cache.label = CacheLabel::WarmCache;
    }
    if let Some(previous) = previous {
        record.resume(previous);
        // The job that ran the earlier work, until this apply submits one of its own.
        record.slurm = previous.slurm.clone();
    }
    record.git = crate::results::records::GitState::detect(
        r.files
            .first()
            .and_then(|f| f.path.parent())
            .unwrap_or(Path::new(".")),
    );
    // A Slurm task's GPU is its node's: each task records its own (`slurm.tasks`).
    if r.manifest.runtime.provider != ProviderKind::Cpu
        && r.manifest.executor.kind == ExecutorKind::Local
    {
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
                crate::say!("warning: {warning}");
            }
        }
        record.tokenizer = Some(tokenizer);
        record.weights = Some(weights);
    }
    let started = record.started_at.clone();
    write_record(
        &plan.run_dir,
        &mut record,
        &started,
        plan.selection.is_some(),
    )?;
    Ok(record)
}

/// Where a probe's `--save-videos` debug videos go (deleted after each probe process).
fn debug_video_dir(run: &str, env_tmp: Option<&str>) -> PathBuf {
    let tmp = env_tmp.filter(|t| !t.is_empty()).unwrap_or("/tmp");
    Path::new(tmp)
        .join("unstep_wrapper_generation_outputs")
        .join(run)
        .join("indexed_videos")
}

/// Purges the user-level compiler caches `cache.clear_global` names (none when it is off; other
/// jobs may be using them, so only on request), saying what it removed. A cache it cannot remove
/// is a warning: the run's own processes never read it.
fn clear_global_caches(caches: &[PathBuf]) {
    for dir in caches {
        match fs::remove_dir_all(dir) {
            Ok(()) => crate::say!("purged the global compiler cache {}", display_path(dir)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => crate::say!(
                "warning: cannot purge the global compiler cache {}: {e}",
                display_path(dir)
            ),
        }
    }
}

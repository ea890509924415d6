//! `runner apply`: the execute pass. Checks what only a real run needs (the bundle, the prompt
//! file, existing state), takes the work-root lock, stages the snapshot, runs each slot's
//! processes in order (slots in parallel) as worker processes of the staged binary, and records
//! timings, the summary and provenance. Re-applying a run resumes it.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use super::config::RunConfig;
use super::evaluate::{evaluate_only, evaluated, saves_videos};
use super::events::{RunEvent, RunEventKind, WorkerFacts};
use super::job::JobSpec;
use super::jobs::JobFactory;
use super::lock::Lock;
use super::preflight::{bundle_facts, preflight, tokenizer_warnings};
use super::progress::{Progress, SlotWork};
use super::resume::{Completed, completed};
use super::shard_apply::{
    merge_concurrent, record_guard, shard_lock_dir, timing_file_selected, write_record,
};
use super::signals::{INTERRUPTED, install_signal_handlers};
use super::slots::{Workers, process_name};
use super::slurm::SlurmWork;
use super::staging::{self, Stage, StageRequest};
use crate::engine::ProviderKind;
use crate::manifest::diagnostic::display_path;
use crate::manifest::{CacheMode, ExecutorKind, Kind, Resolved};
use crate::plan::Plan;
use crate::results::Summary;
use crate::results::arrays::ArrayKind;
use crate::results::files::{
    RUN_JSON, SUMMARY_JSON, TIMINGS_JSONL, read_process_timings, repair_timings, write_atomic,
    write_json_atomic,
};
use crate::results::names::VideoNames;
use crate::results::records::{BundleRecord, CacheLabel, ProcessSkip, RunRecord, RunStatus};
use crate::results::video_index;

pub use super::outcome::{ApplyError, ApplyOptions, Outcome};
pub use super::signals::interrupted;

/// Where a probe's `--save-videos` debug videos go (deleted after each probe process).
pub fn debug_video_dir(run: &str, env_tmp: Option<&str>) -> PathBuf {
    let tmp = env_tmp.filter(|t| !t.is_empty()).unwrap_or("/tmp");
    Path::new(tmp)
        .join("unstep_wrapper_generation_outputs")
        .join(run)
        .join("indexed_videos")
}

/// Runs a plan.
pub fn apply(r: &Resolved, plan: &Plan, opts: &ApplyOptions) -> Result<Outcome, ApplyError> {
    let config = RunConfig::resolve(r);
    preflight(r, &config)?;
    let m = &r.manifest;
    let on_slurm = m.executor.kind == ExecutorKind::Slurm;
    if on_slurm {
        super::slurm::preflight(r, plan)?;
    } else if opts.detach {
        return Err(ApplyError::refused(
            "--detach is for the Slurm executor; a local run ends with its apply",
            "leave out --detach, or set executor.kind = \"slurm\"",
        ));
    }
    // `apply --shard`: other applies of the same run may run other shards meanwhile.
    let shard_apply = plan.selection.is_some();
    let run_dir = plan.run_dir.clone();
    let config_hash = crate::results::config_hash(r);
    let Completed {
        done,
        previous,
        stale_videos,
        damaged_timings,
        notes,
    } = completed(r, plan, &config_hash)?;
    super::slurm::check_no_live_job(&run_dir, previous.as_ref(), plan.selection)?;

    // Nothing has been written so far; from here on the run holds its locks: its results
    // folder (whatever the work root, one apply of a run at a time; the applies of one run's
    // shards share it, each holding its shards' own locks), its work root, and its shared
    // state.
    if !shard_apply {
        Lock::check_free(&run_dir)?;
    }
    let _work_lock = Lock::acquire(&plan.work_root, &plan.run)?;
    let _shard_locks = plan
        .selected_shards()
        .filter(|_| shard_apply)
        .map(|sh| Lock::acquire(&shard_lock_dir(&run_dir, sh.index), &plan.run))
        .collect::<Result<Vec<_>, _>>()?;
    let mut run_lock = if shard_apply {
        Lock::acquire_shared(&run_dir, &plan.run)?
    } else {
        Lock::acquire(&run_dir, &plan.run)?
    };
    let _shared_lock = if m.cache.mode == CacheMode::Shared {
        Some(Lock::acquire(&r.paths.shared_state_dir, &plan.run)?)
    } else {
        None
    };
    // Never cleared: an interrupt that arrives between the runs of a sweep, while the next one
    // prepares, ends that run as soon as it starts instead of being forgotten.
    install_signal_handlers();
    // Told once the run is this apply's: what they announce happens now.
    for note in &notes {
        crate::say!("{note}");
    }
    if super::evaluate::saves_videos(r)
        && let Some(w) = VideoNames::of(r).unread_samples(
            plan.selected_shards()
                .flat_map(|sh| sh.prompts.iter().copied()),
        )
    {
        crate::say!("{w}");
    }
    // Another shard's apply may be appending to its own timing files meanwhile, and the other
    // shards' videos are theirs to make again: an apply of some shards mends only its own.
    let damaged_timings: Vec<PathBuf> = damaged_timings
        .into_iter()
        .filter(|f| !shard_apply || timing_file_selected(plan, f))
        .collect();
    let selected: BTreeSet<u32> = plan
        .selected_shards()
        .flat_map(|sh| sh.prompts.iter().copied())
        .collect();
    let stale_videos: Vec<PathBuf> = stale_videos
        .into_iter()
        .filter(|(prompt, _)| !shard_apply || selected.contains(prompt))
        .map(|(_, video)| video)
        .collect();
    mend(&damaged_timings, &stale_videos)?;
    if let Some(previous) = &previous
        && let Some(outcome) = evaluate_only(r, plan, previous, &done, opts)?
    {
        return Ok(outcome);
    }
    // The staging left by an apply of this run that was killed (its record still says running,
    // and this apply now holds the run's lock) is reused when its audit matches.
    let killed = previous
        .as_ref()
        .is_some_and(|p| p.status == RunStatus::Running);
    let stage = stage(r, plan, opts.reuse_workdir || killed)?;
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
        &config,
        previous.as_ref(),
        &stage,
        opts,
        reused_state,
    )?;
    let started = record.started_at.clone();

    let jobs = JobFactory {
        r,
        plan,
        config: &config,
        stage: &stage,
        videos: &videos,
        config_hash: &config_hash,
        done: &done,
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
        .filter(|i| done.contains(i))
        .count();
    let progress = Progress::new(opts.quiet, &slot_work(plan, &jobs), skipped);
    let mut events = Events {
        plan,
        progress: &progress,
        facts: None,
        failures: Vec::new(),
    };
    let mut slurm_job = None;
    if on_slurm {
        let work = SlurmWork {
            plan,
            jobs: &jobs,
            runner: &stage.runner,
            run_dir: &run_dir,
            executor: &m.executor,
            provider: m.runtime.provider,
            cpu_threads: m.runtime.cpu_threads_per_process.0,
            probe: m.kind == Kind::Probe,
        };
        if jobs.iter().any(Option::is_some) {
            // The tasks take the run's lock shared; other applies stay out.
            run_lock.share()?;
            let (job_id, tasks) = match work.submit() {
                Ok(submitted) => submitted,
                Err(e) => {
                    record.finish(RunStatus::Failed, Some(e.to_string()));
                    write_record(&run_dir, &mut record, &started, shard_apply)?;
                    return Err(e);
                }
            };
            record.slurm = Some(work.record(&job_id, &tasks));
            write_record(&run_dir, &mut record, &started, shard_apply)?;
            if opts.detach {
                // The tasks run from the staging: it stays.
                return Ok(Outcome {
                    status: RunStatus::Running,
                    run_dir,
                    failures: Vec::new(),
                    slurm_job: Some(job_id),
                });
            }
            if !opts.quiet {
                crate::say!(
                    "submitted Slurm job {job_id} ({} task(s)); Ctrl-C cancels it",
                    tasks.len()
                );
            }
            let followed = work.follow(&job_id, &tasks, |e| events.event(e));
            if let Some(why) = followed.lost {
                // The job may still run: the record keeps saying so (as after --detach), and
                // the staging stays for its tasks.
                progress.finish();
                return Err(ApplyError::Io(format!(
                    "stopped following Slurm job {job_id}: {why}; its tasks may still be queued \
                     or running, and the run's record says it is running. `runner status {}` \
                     shows where it stands once Slurm answers; apply again once the job has \
                     ended, or cancel it with `scancel {job_id}`",
                    crate::manifest::diagnostic::display_path(&run_dir)
                )));
            }
            events.failures.extend(followed.failures);
            record.slurm = Some(followed.record);
            slurm_job = Some(job_id);
        }
    } else {
        let workers = Workers {
            plan,
            jobs: &jobs,
            runner: &stage.runner,
            run_dir: &run_dir,
            provider: m.runtime.provider,
            cpu_threads: m.runtime.cpu_threads_per_process.0,
            probe: m.kind == Kind::Probe,
            run_lock: run_lock.fd(),
        };
        workers.run(|e| events.event(e));
    }
    progress.finish();
    let Events {
        facts,
        mut failures,
        ..
    } = events;

    if let Some(facts) = facts {
        record_facts(&mut record, facts, r, &stage);
    }
    let status = {
        // Under the record's lock, the shard apply that ends last sees every other's records:
        // it is the one that calls the run succeeded. The statistics cover every process's
        // records, other shard applies' included.
        let _guard = record_guard(&run_dir, shard_apply)?;
        // A generation has succeeded only when every prompt of the whole run is complete, by
        // the one test `runner status` and `runner plan` use too: a prompt of another shard
        // whose video was deleted after its apply keeps the run from succeeding.
        let incomplete = (m.kind == Kind::Generation)
            .then(|| incomplete_prompts(r, plan, &config_hash))
            .flatten();
        let status = if INTERRUPTED.load(Ordering::SeqCst) {
            RunStatus::Interrupted
        } else if !failures.is_empty() {
            RunStatus::Failed
        } else if let Some(missing) = &incomplete {
            if shard_apply {
                RunStatus::Partial
            } else {
                failures.push(format!(
                    "the workers ended and prompt(s) of the run are still not complete: {missing}"
                ));
                RunStatus::Failed
            }
        } else {
            RunStatus::Succeeded
        };
        record.finish(
            status,
            (!failures.is_empty()).then(|| failures.join("\n\n")),
        );
        write_statistics(r, &run_dir, record.cache.label)?;
        if saves_videos(r) {
            video_index::write(
                &run_dir,
                r.prompts.as_deref().unwrap_or_default(),
                &VideoNames::of(r),
            )?;
        }
        merge_concurrent(&run_dir, &mut record, &started, shard_apply);
        write_json_atomic(&run_dir.join(RUN_JSON), &record)?;
        status
    };

    // Cleanup: success and interruption remove the staging snapshot; a failed run keeps
    // it, with its isolated state, for diagnosis.
    if status != RunStatus::Failed {
        let _ = stage.remove();
    }
    // Only a complete generation is evaluated: every selected prompt has its video.
    if status == RunStatus::Succeeded && record.evaluation.is_some() {
        return evaluated(&run_dir, &mut record);
    }
    Ok(Outcome {
        status,
        run_dir,
        failures,
        slurm_job,
    })
}

/// The incomplete prompts of the whole run (every shard, whichever apply makes it), in words;
/// `None` when every one is complete.
fn incomplete_prompts(r: &Resolved, plan: &Plan, config_hash: &str) -> Option<String> {
    let legacy = crate::results::hash::legacy_config_hash(r);
    let expected = super::resume::expected_of(r, config_hash, &legacy);
    let planned = plan.shards.iter().flat_map(|sh| sh.prompts.iter().copied());
    let state = crate::results::completeness::Completeness::of(&plan.run_dir, planned, &expected);
    (!state.missing().is_empty()).then(|| state.missing_text())
}

/// Repairs the damaged timing files and removes the videos to be made again (made from a
/// prompt's earlier text, or cut short), once the run holds its lock.
fn mend(damaged_timings: &[PathBuf], stale_videos: &[PathBuf]) -> Result<(), ApplyError> {
    for file in damaged_timings {
        repair_timings(file)?;
    }
    // A video made from a prompt's earlier text would otherwise stay beside the new one.
    for video in stale_videos {
        if let Err(e) = fs::remove_file(video)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(ApplyError::Io(format!(
                "cannot remove the stale video {}: {e}",
                display_path(video)
            )));
        }
    }
    Ok(())
}

/// The consumers of a run's events: the progress display, what the first worker reported when
/// ready, and every failure.
struct Events<'a> {
    plan: &'a Plan,
    progress: &'a Progress,
    facts: Option<WorkerFacts>,
    failures: Vec<String>,
}

impl Events<'_> {
    fn event(&mut self, event: &RunEvent) {
        let p = &self.plan.processes[event.process];
        self.progress.event(
            p.slot,
            &process_name(self.plan, p),
            p.is_warmup(),
            &event.kind,
        );
        match &event.kind {
            RunEventKind::Ready(f) if self.facts.is_none() => self.facts = Some((**f).clone()),
            RunEventKind::Finished {
                failure: Some(failure),
            } => self.failures.push(failure.clone()),
            _ => {}
        }
    }
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
    if !parts.iter().any(|p| run_dir.join(p).exists()) {
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

/// Every slot's share of the prompts the jobs will measure or generate.
fn slot_work(plan: &Plan, jobs: &[Option<JobSpec>]) -> Vec<SlotWork> {
    plan.slots
        .iter()
        .enumerate()
        .map(|(i, slot)| SlotWork {
            label: slot.label.clone(),
            prompts: plan
                .processes
                .iter()
                .zip(jobs)
                .filter(|(p, _)| p.slot == i && !p.is_warmup())
                .filter_map(|(_, job)| job.as_ref().map(|j| j.prompts.len()))
                .sum(),
        })
        .collect()
}

/// `timings.jsonl`, `summary.json` and `latency.svg` from every process's records.
fn write_statistics(r: &Resolved, run_dir: &Path, label: CacheLabel) -> Result<(), ApplyError> {
    let m = &r.manifest;
    let records = read_process_timings(run_dir).records;
    let jsonl: String = records
        .iter()
        .map(|rec| serde_json::to_string(rec).expect("records serialise") + "\n")
        .collect();
    write_atomic(&run_dir.join(TIMINGS_JSONL), jsonl.as_bytes())?;
    let summary = Summary::from_records(&records, m.kind, label);
    write_json_atomic(&run_dir.join(SUMMARY_JSON), &summary)?;
    let _ = crate::report::write_latency_svg(run_dir, &records);
    Ok(())
}

/// What the first worker reported when its sessions were ready, into the run's record.
fn record_facts(record: &mut RunRecord, facts: WorkerFacts, r: &Resolved, stage: &Stage) {
    record.bundle = Some(BundleRecord {
        path: r.paths.bundle.display().to_string(),
        preset: facts.bundle_preset,
        exporter_version: facts.bundle_exporter_version,
        // The audit hashed the staged bundle.toml, which lists the sha256 of every file.
        bundle_toml_sha256: stage.audit.files.get("bundle/bundle.toml").cloned(),
    });
    record.execution_provider = Some(facts.provider);
    record.versions.onnxruntime = Some(facts.ort_version);
    record.versions.cuda = facts.cuda_version;
    record.versions.cudnn = facts.cudnn_version;
    record.attention_backend.resolved = Some(facts.attention_backend);
    record.dit_kernels = Some(facts.dit_kernels);
    record.vae_kernels = Some(facts.vae_kernels);
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

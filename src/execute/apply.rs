//! `runner apply`: the execute pass, as a driver of named steps. It refuses what can be told
//! before any write, takes the run's locks, mends what an earlier apply left, starts the run
//! ([`super::start`]: staging, the run folder, the record), executes each slot's processes as
//! worker processes of the staged binary (here, or as Slurm tasks), concludes the run's status
//! and statistics, and evaluates a complete generation. Re-applying a run resumes it.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use super::config::RunConfig;
use super::evaluate::{evaluate_only, evaluated, saves_videos, write_video_index};
use super::events::{RunEvent, RunEventKind, WorkerFacts};
use super::job::JobSpec;
use super::lock::Lock;
use super::preflight::preflight;
use super::progress::{Progress, SlotWork};
use super::resume::{Completed, completed};
use super::shard_apply::{
    merge_concurrent, record_guard, shard_lock_dir, timing_file_selected, write_record,
};
use super::signals::{INTERRUPTED, install_signal_handlers};
use super::slots::{Workers, process_name};
use super::slurm::SlurmWork;
use super::staging::Stage;
use super::start::{Started, start};
use crate::manifest::diagnostic::display_path;
use crate::manifest::{ExecutorKind, Kind, Resolved};
use crate::plan::Plan;
use crate::results::Summary;
use crate::results::files::{
    RUN_JSON, SUMMARY_JSON, TIMINGS_JSONL, read_process_timings, repair_timings, write_atomic,
    write_json_atomic,
};
use crate::results::names::VideoNames;
use crate::results::records::{ApplyWall, BundleRecord, CacheLabel, RunRecord, RunStatus};

pub use super::outcome::{ApplyError, ApplyOptions, Outcome};
pub use super::signals::interrupted;

/// Runs a plan.
pub fn apply(r: &Resolved, plan: &Plan, opts: &ApplyOptions) -> Result<Outcome, ApplyError> {
    let began = (Instant::now(), SystemTime::now());
    // Before any step: an interrupt from here on is seen, never the process's end or lost.
    install_signal_handlers();
    let config = RunConfig::resolve(r);
    refuse_before_work(r, plan, &config, opts)?;
    let config_hash = crate::results::config_hash(r);
    let mut found = completed(r, plan, &config_hash)?;
    super::slurm::check_no_live_job(&plan.run_dir, found.previous.as_ref(), plan.selection)?;
    // Nothing has been written so far; from here on the run holds its locks.
    let mut locks = RunLocks::take(r, plan)?;
    // The Slurm jobs of the record this apply continues that no apply followed to their end
    // (`--detach`) have ended (`check_no_live_job`), or run other shards: what each task tells
    // of its end goes into the record, as an apply that follows its job records it.
    if let Some(previous) = &mut found.previous {
        super::slurm::settle_ended_jobs(&plan.run_dir, previous);
    }
    // The flag is never cleared: an interrupt that arrived before this point (between the runs
    // of a sweep, or while this apply checked and took its locks) ends the apply here, before
    // it writes anything of the run; `start` asks again once the staging, which may take
    // minutes, is done, before the run's folders and record.
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err(ApplyError::Interrupted {
            run: plan.run.clone(),
        });
    }
    announce(r, plan, &found.notes);
    mend_own(plan, &found)?;
    if let Some(previous) = &found.previous
        && let Some(outcome) = evaluate_only(r, plan, previous, &found.done, opts)?
    {
        return Ok(outcome);
    }
    let mut run = start(r, plan, &config, &config_hash, &found, opts)?;
    let ended = match execute(r, plan, &mut run, &mut locks.run, opts)? {
        Executed::Ended(ended) => ended,
        Executed::Detached(outcome) => return Ok(outcome),
    };
    let Ended {
        facts,
        mut failures,
        slurm_job,
    } = ended;
    run.record.wall = Some(ApplyWall {
        started_at: crate::results::time::rfc3339(began.1),
        seconds: began.0.elapsed().as_secs_f64(),
    });
    if let Some(facts) = facts {
        record_facts(&mut run.record, facts, r, &run.stage);
    }
    let status = conclude(r, plan, &mut run.record, &mut failures, &config_hash)?;
    // Success and interruption remove the staging snapshot; a failed run keeps it, with its
    // isolated state, for diagnosis.
    if status == RunStatus::Failed {
        let _ = run.stage.keep_for_diagnosis();
    } else {
        let _ = run.stage.remove();
    }
    // Only a complete generation is evaluated: every selected prompt has its video.
    if status == RunStatus::Succeeded && run.record.evaluation.is_some() {
        return evaluated(&plan.run_dir, &mut run.record);
    }
    Ok(Outcome {
        status,
        run_dir: plan.run_dir.clone(),
        failures,
        slurm_job,
    })
}

/// The refusals that need the real world (files present, the executor's own) and no write.
fn refuse_before_work(
    r: &Resolved,
    plan: &Plan,
    config: &RunConfig,
    opts: &ApplyOptions,
) -> Result<(), ApplyError> {
    preflight(r, config)?;
    if r.manifest.executor.kind == ExecutorKind::Slurm {
        super::slurm::preflight(r, plan)?;
    } else if opts.detach {
        return Err(ApplyError::refused(
            "--detach is for the Slurm executor; a local run ends with its apply",
            "leave out --detach, or set executor.kind = \"slurm\"",
        ));
    }
    Ok(())
}

/// The locks an apply holds until it ends: its results folder (whatever the work root, one
/// apply of a run at a time; the applies of one run's shards share it, each holding its shards'
/// own locks), its work root, and its shared state. Released in the reverse order.
struct RunLocks {
    _shared: Option<Lock>,
    run: Lock,
    _shards: Vec<Lock>,
    _work: Lock,
}

impl RunLocks {
    fn take(r: &Resolved, plan: &Plan) -> Result<RunLocks, ApplyError> {
        // `apply --shard`: other applies of the same run may run other shards meanwhile.
        let shard_apply = plan.selection.is_some();
        if !shard_apply {
            Lock::check_free(&plan.run_dir)?;
        }
        let work = Lock::acquire(&plan.work_root, &plan.run)?;
        let shards = plan
            .selected_shards()
            .filter(|_| shard_apply)
            .map(|sh| Lock::acquire(&shard_lock_dir(&plan.run_dir, sh.index), &plan.run))
            .collect::<Result<Vec<_>, _>>()?;
        let run = if shard_apply {
            Lock::acquire_shared(&plan.run_dir, &plan.run)?
        } else {
            Lock::acquire(&plan.run_dir, &plan.run)?
        };
        let shared = if r.manifest.shares_state() {
            Some(Lock::acquire(&r.paths.shared_state_dir, &plan.run)?)
        } else {
            None
        };
        Ok(RunLocks {
            _shared: shared,
            run,
            _shards: shards,
            _work: work,
        })
    }
}

/// What an apply tells once the run is its own: what the earlier apply's notes announce, and
/// the samples VBench never reads.
fn announce(r: &Resolved, plan: &Plan, notes: &[String]) {
    for note in notes {
        crate::say!("{note}");
    }
    if saves_videos(r)
        && let Some(w) = VideoNames::of(r).unread_samples(
            plan.selected_shards()
                .flat_map(|sh| sh.prompts.iter().copied()),
        )
    {
        crate::say!("{w}");
    }
}

/// Mends what earlier applies left in this apply's own shards: another shard's apply may be
/// appending to its own timing files meanwhile, and the other shards' videos are theirs to
/// make again.
fn mend_own(plan: &Plan, found: &Completed) -> Result<(), ApplyError> {
    let shard_apply = plan.selection.is_some();
    let damaged_timings: Vec<PathBuf> = found
        .damaged_timings
        .iter()
        .filter(|f| !shard_apply || timing_file_selected(plan, f))
        .cloned()
        .collect();
    let selected: BTreeSet<u32> = plan
        .selected_shards()
        .flat_map(|sh| sh.prompts.iter().copied())
        .collect();
    let stale_videos: Vec<PathBuf> = found
        .stale_videos
        .iter()
        .filter(|(prompt, _)| !shard_apply || selected.contains(prompt))
        .map(|(_, video)| video.clone())
        .collect();
    mend(&damaged_timings, &stale_videos)
}

/// How the execution of a run ended.
enum Executed {
    /// Every worker (or Slurm task) ended.
    Ended(Ended),
    /// The Slurm job was submitted with `--detach`: its tasks run on.
    Detached(Outcome),
}

/// What the workers left: what the first one reported when ready, every failure, and the
/// Slurm job that ran them.
struct Ended {
    facts: Option<WorkerFacts>,
    failures: Vec<String>,
    slurm_job: Option<String>,
}

/// Runs the jobs: as worker processes here, or as the tasks of a Slurm job it follows.
fn execute(
    r: &Resolved,
    plan: &Plan,
    run: &mut Started,
    run_lock: &mut Lock,
    opts: &ApplyOptions,
) -> Result<Executed, ApplyError> {
    let m = &r.manifest;
    let run_dir = &plan.run_dir;
    let shard_apply = plan.selection.is_some();
    let progress = Progress::new(opts.quiet, &slot_work(plan, &run.jobs), run.skipped);
    let mut events = Events {
        plan,
        progress: &progress,
        facts: None,
        failures: Vec::new(),
    };
    let mut slurm_job = None;
    if m.executor.kind == ExecutorKind::Slurm {
        let work = SlurmWork {
            plan,
            jobs: &run.jobs,
            runner: &run.stage.runner,
            run_dir,
            executor: &m.executor,
            provider: m.runtime.provider,
            cpu_threads: m.runtime.cpu_threads_per_process.0,
            probe: m.kind == Kind::Probe,
        };
        if run.jobs.iter().any(Option::is_some) {
            // The tasks take the run's lock shared; other applies stay out.
            run_lock.share()?;
            let record = &mut run.record;
            let started = record.started_at.clone();
            let (job_id, tasks) = match work.submit() {
                Ok(submitted) => submitted,
                Err(e) => {
                    record.finish(RunStatus::Failed, Some(e.to_string()));
                    write_record(run_dir, record, &started, shard_apply)?;
                    // No task ran from the staging: there is nothing in it to diagnose, and
                    // kept, it would stand in the next apply's way.
                    let _ = run.stage.remove();
                    return Err(e);
                }
            };
            record.slurm = Some(work.record(&job_id, &tasks));
            write_record(run_dir, record, &started, shard_apply)?;
            if opts.detach {
                // The tasks run from the staging: it stays.
                return Ok(Executed::Detached(Outcome {
                    status: RunStatus::Running,
                    run_dir: run_dir.clone(),
                    failures: Vec::new(),
                    slurm_job: Some(job_id),
                }));
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
                    display_path(run_dir)
                )));
            }
            events.failures.extend(followed.failures);
            record.slurm = Some(followed.record);
            slurm_job = Some(job_id);
        }
    } else {
        let workers = Workers {
            plan,
            jobs: &run.jobs,
            runner: &run.stage.runner,
            run_dir,
            provider: m.runtime.provider,
            cpu_threads: m.runtime.cpu_threads_per_process.0,
            probe: m.kind == Kind::Probe,
            run_lock: run_lock.fd(),
        };
        workers.run(|e| events.event(e));
    }
    progress.finish();
    Ok(Executed::Ended(Ended {
        facts: events.facts,
        failures: events.failures,
        slurm_job,
    }))
}

/// The run's status, written with its statistics, video index and record. Under the record's
/// lock, the shard apply that ends last sees every other's records: it is the one that calls
/// the run succeeded. The statistics cover every process's records, other shard applies'
/// included.
fn conclude(
    r: &Resolved,
    plan: &Plan,
    record: &mut RunRecord,
    failures: &mut Vec<String>,
    config_hash: &str,
) -> Result<RunStatus, ApplyError> {
    let run_dir = &plan.run_dir;
    let shard_apply = plan.selection.is_some();
    let _guard = record_guard(run_dir, shard_apply)?;
    // A generation has succeeded only when every prompt of the whole run is complete, by the
    // one test `runner status` and `runner plan` use too: a prompt of another shard whose video
    // was deleted after its apply keeps the run from succeeding.
    let incomplete = (r.manifest.kind == Kind::Generation)
        .then(|| incomplete_prompts(r, plan, config_hash))
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
    write_statistics(r, run_dir, record.cache.label)?;
    write_video_index(r, run_dir)?;
    let started = record.started_at.clone();
    merge_concurrent(run_dir, record, &started, shard_apply);
    write_json_atomic(&run_dir.join(RUN_JSON), record)?;
    Ok(status)
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

//! The Slurm executor (`executor.kind = "slurm"`): a run's work as one job array, one task per
//! worker slot (the task number is the slot's number in the plan). `runner apply` writes each
//! process's job spec, the task list (`slurm/tasks.json`, or `slurm/tasks-shard-<range>.json`
//! for an apply of some shards) and the batch script (`slurm/job.sh`, `slurm/job-shard-<range>.sh`),
//! submits it with `sbatch`, and follows the job: progress from the event files the workers
//! write, task states as `query` asks Slurm for them. Each task runs `runner slurm-task` of the
//! staged runner (`task`), which runs its slot's processes one after another (warmup, then
//! shards) as `runner worker --spec` processes, as local workers run, and reports where it ran
//! in `slurm/task-<job>_<n>.json`.

mod query;
mod task;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use self::query::{Standing, TaskState, cancel, ended_states, live_tasks, standing};
pub use self::task::run_task;
use super::events::{RunEvent, RunEventKind};
use super::job::JobSpec;
use super::outcome::ApplyError;
use super::signals::INTERRUPTED;
use super::slots::{process_name, spec_path};
use crate::engine::ProviderKind;
use crate::manifest::diagnostic::display_path;
use crate::manifest::{Executor, Resolved};
use crate::plan::{Plan, Process, ShardRange};
use crate::results::files::{read_json, write_atomic, write_json_atomic};
use crate::results::records::{RunRecord, RunStatus, SlurmRecord, SlurmTaskRecord};

/// The folder of a run's Slurm files, inside its results folder.
pub const SLURM_DIR: &str = "slurm";

/// How long `apply` follows a job while Slurm answers none of its questions (`squeue`,
/// `scontrol`, `sacct`) and some task has not reported its end, before it gives up following.
const UNANSWERED_LIMIT: Duration = Duration::from_secs(600);

/// What the tasks of a run's job do: written by `runner apply`, read by `runner slurm-task`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskList {
    pub run: String,
    pub run_dir: PathBuf,
    /// Threads of each worker's CPU work (`OMP_NUM_THREADS`).
    pub cpu_threads: u64,
    /// A probe's debug videos are removed after each process.
    pub probe: bool,
    /// Each task's processes, in the order they run.
    pub tasks: BTreeMap<usize, Vec<TaskProcess>>,
}

/// One process of a task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskProcess {
    pub index: usize,
    /// As messages name it: `cpu0 shard 1`.
    pub name: String,
    pub spec: PathBuf,
    pub log: PathBuf,
    /// Where the worker's events (its standard output) go; apply follows them.
    pub events: PathBuf,
    pub cache_dir: PathBuf,
    pub videos: Option<PathBuf>,
    /// Written after the process succeeds (shared caches: later warmups are skipped).
    pub skip_marker: Option<PathBuf>,
}

/// What a task says about itself in `slurm/task-<job>_<n>.json`: where it runs, then how it
/// ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TaskReport {
    pub task: usize,
    pub job_id: Option<String>,
    pub node: Option<String>,
    pub gpus: Option<String>,
    pub started_at: String,
    pub ended_at: Option<String>,
    /// Why it failed; none when it ended well (or has not ended).
    pub failure: Option<String>,
}

/// A run's work as a Slurm job: the plan, each process's job (`None`: nothing to do) and the
/// staged runner the tasks execute.
pub(super) struct SlurmWork<'a> {
    pub plan: &'a Plan,
    pub jobs: &'a [Option<JobSpec>],
    pub runner: &'a Path,
    pub run_dir: &'a Path,
    pub executor: &'a Executor,
    pub provider: ProviderKind,
    pub cpu_threads: u64,
    pub probe: bool,
}

/// How a followed job ended.
pub(super) struct Followed {
    pub failures: Vec<String>,
    pub record: SlurmRecord,
    /// Why apply stopped following a job that may still run (Slurm did not answer for
    /// [`UNANSWERED_LIMIT`]); `None` when every task ended.
    pub lost: Option<String>,
}

/// Refuses a Slurm run that cannot work here, before anything is written: no `sbatch`, or run
/// folders under /tmp (each node has its own) unless `executor.shared_filesystem` says they are
/// shared.
pub(super) fn preflight(r: &Resolved, plan: &Plan) -> Result<(), ApplyError> {
    if !command_exists("sbatch") {
        return Err(ApplyError::refused(
            "executor.kind = \"slurm\", but `sbatch` is not on PATH",
            "run apply on a Slurm login node, or set executor.kind = \"local\"",
        ));
    }
    if r.manifest.executor.shared_filesystem {
        return Ok(());
    }
    let mut dirs = vec![
        ("staging.work_root", plan.work_root.clone()),
        ("outputs.dir", plan.run_dir.clone()),
    ];
    dirs.extend(
        plan.processes
            .iter()
            .map(|p| ("cache folders", p.cache_dir.clone())),
    );
    for (what, dir) in dirs {
        if under_tmp(&dir) {
            return Err(ApplyError::refused(
                format!(
                    "{what} {} is under /tmp, which each node of a cluster has for itself; a Slurm \
                     run's staging, caches and results must be on a filesystem every node shares",
                    display_path(&dir)
                ),
                "put them on a shared filesystem (staging.work_root, outputs.dir, cache.*), or, \
                 when this /tmp is shared by the nodes (a one-node cluster), set \
                 executor.shared_filesystem = true",
            ));
        }
    }
    Ok(())
}

/// Whether `dir` is under /tmp, through symbolic links as far as they exist.
fn under_tmp(dir: &Path) -> bool {
    // The nearest folder that exists, resolved: the rest is created inside it.
    let mut existing = dir.to_path_buf();
    while !existing.exists() {
        match existing.parent() {
            Some(parent) => existing = parent.to_path_buf(),
            None => break,
        }
    }
    let real = fs::canonicalize(&existing).unwrap_or(existing);
    real.starts_with("/tmp") || dir.starts_with("/tmp")
}

fn command_exists(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|d| {
            let f = d.join(name);
            f.is_file()
        })
    })
}

/// Refuses an apply while a Slurm job an earlier apply submitted for the run (the last apply's,
/// or another shard apply's) still has tasks queued or running (a re-apply would run their
/// prompts twice), or may have: Slurm does not answer, some task has not reported its end, and
/// the run's record says it is running (an apply that recorded the run's end saw every task
/// end). A job of other shards than an apply of some shards runs is no obstacle to it: the two
/// make disjoint prompts.
pub(super) fn check_no_live_job(
    run_dir: &Path,
    previous: Option<&RunRecord>,
    selection: Option<ShardRange>,
) -> Result<(), ApplyError> {
    let Some(previous) = previous else {
        return Ok(());
    };
    for job in previous.slurm_jobs() {
        if let (Some(ours), Some(theirs)) = (selection, job.shards)
            && (ours.last < theirs.first || theirs.last < ours.first)
        {
            continue;
        }
        check_job_ended(run_dir, job, previous.status)?;
    }
    Ok(())
}

/// Refuses while `job` has tasks queued or running, or may have (see [`check_no_live_job`]).
fn check_job_ended(run_dir: &Path, job: &SlurmRecord, status: RunStatus) -> Result<(), ApplyError> {
    let hint = format!(
        "`runner status {}` shows where it stands; apply again once it has ended, or cancel it \
         with `scancel {}`",
        display_path(run_dir),
        job.job_id
    );
    match standing(run_dir, job) {
        Standing::Ended => Ok(()),
        Standing::Live(live) => Err(ApplyError::refused(
            format!(
                "the Slurm job {} of {} still has {} task(s) queued or running",
                job.job_id,
                display_path(run_dir),
                live.len()
            ),
            hint,
        )),
        Standing::Unknown(_) if status != RunStatus::Running => Ok(()),
        Standing::Unknown(why) => Err(ApplyError::refused(
            format!(
                "cannot tell whether the Slurm job {} of {} has ended: Slurm did not answer ({why}), \
                 and not every task has reported its end",
                job.job_id,
                display_path(run_dir),
            ),
            hint,
        )),
    }
}

/// The names of an apply's task list and batch script in the run's `slurm/` folder: one pair
/// for a whole-run apply, one per shard range for applies of some shards, which may run side by
/// side.
fn file_names(plan: &Plan) -> (String, String) {
    match plan.selection {
        None => ("tasks.json".into(), "job.sh".into()),
        Some(range) => {
            let label = range.label();
            (
                format!("tasks-shard-{label}.json"),
                format!("job-shard-{label}.sh"),
            )
        }
    }
}

/// `%` as sbatch reads it in a file name pattern (`--output`): a `%` of the path itself.
fn escape_pattern(path: &Path) -> String {
    path.display().to_string().replace('%', "%%")
}

impl SlurmWork<'_> {
    /// The tasks: every slot with work, its processes in plan order.
    fn task_list(&self) -> TaskList {
        let mut tasks: BTreeMap<usize, Vec<TaskProcess>> = BTreeMap::new();
        for (p, job) in self.plan.processes.iter().zip(self.jobs) {
            let Some(job) = job else { continue };
            tasks.entry(p.slot).or_default().push(TaskProcess {
                index: p.index,
                name: process_name(self.plan, p),
                spec: spec_path(self.run_dir, self.plan, p),
                log: p.log.clone(),
                events: events_path(self.run_dir, self.plan, p),
                cache_dir: p.cache_dir.clone(),
                videos: job.videos.clone(),
                skip_marker: p.skip_if_marker.clone(),
            });
        }
        TaskList {
            run: self.plan.run.clone(),
            run_dir: self.run_dir.to_path_buf(),
            cpu_threads: self.cpu_threads,
            probe: self.probe,
            tasks,
        }
    }

    /// The sbatch arguments of the job (the batch script's path last).
    fn sbatch_args(&self, tasks: &TaskList, script: &Path) -> Vec<String> {
        let e = self.executor;
        let array: Vec<String> = tasks.tasks.keys().map(|t| t.to_string()).collect();
        let mut args = vec![
            "--parsable".to_string(),
            format!("--job-name=unstep-{}", self.plan.run),
            format!("--array={}", array.join(",")),
            "--ntasks=1".to_string(),
            format!(
                "--cpus-per-task={}",
                e.cpus_per_task.unwrap_or(self.cpu_threads.max(1) as u32)
            ),
            // sbatch expands `%` patterns in the output's path: the run folder's own are escaped.
            format!(
                "--output={}/slurm-%A_%a.out",
                escape_pattern(&self.run_dir.join("logs"))
            ),
            format!("--chdir={}", self.run_dir.display()),
        ];
        let gpus = e
            .gpus_per_task
            .unwrap_or(u32::from(self.provider != ProviderKind::Cpu));
        if gpus > 0 {
            args.push(format!("--gpus-per-task={gpus}"));
        }
        let mut opt = |flag: &str, value: &Option<String>| {
            if let Some(v) = value {
                args.push(format!("--{flag}={v}"));
            }
        };
        opt("partition", &e.partition);
        opt("account", &e.account);
        opt("time", &e.time);
        opt("mem", &e.mem);
        args.extend(e.extra.iter().cloned());
        args.push(script.display().to_string());
        args
    }

    /// Writes the jobs' specs, the task list and the batch script, and submits the job; returns
    /// its id and the slots it runs.
    pub fn submit(&self) -> Result<(String, Vec<usize>), ApplyError> {
        let dir = self.run_dir.join(SLURM_DIR);
        let io = |what: &Path, e: &dyn std::fmt::Display| {
            ApplyError::Io(format!("cannot write {}: {e}", display_path(what)))
        };
        fs::create_dir_all(&dir).map_err(|e| io(&dir, &e))?;
        for (p, job) in self.plan.processes.iter().zip(self.jobs) {
            let Some(job) = job else { continue };
            let spec = spec_path(self.run_dir, self.plan, p);
            let text = serde_json::to_string_pretty(job).expect("jobs serialise");
            write_atomic(&spec, text.as_bytes()).map_err(|e| io(&spec, &e))?;
            // A resubmitted process starts a fresh event file (apply follows it from its start).
            let events = events_path(self.run_dir, self.plan, p);
            let _ = fs::remove_file(&events);
        }
        let tasks = self.task_list();
        let (list_name, script_name) = file_names(self.plan);
        let list = dir.join(list_name);
        write_json_atomic(&list, &tasks)?;
        let script = dir.join(script_name);
        let args = self.sbatch_args(&tasks, &script);
        let text = script_text(&self.plan.run, self.runner, &list, &args);
        write_atomic(&script, text.as_bytes()).map_err(|e| io(&script, &e))?;
        let out = Command::new("sbatch")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| ApplyError::Io(format!("cannot run sbatch: {e}")))?;
        if !out.status.success() {
            return Err(ApplyError::Io(format!(
                "sbatch refused the job ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        // `--parsable`: `<id>` or `<id>;<cluster>`.
        let id = stdout
            .trim()
            .split(';')
            .next()
            .unwrap_or_default()
            .to_string();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
            return Err(ApplyError::Io(format!(
                "sbatch gave no job id (it printed `{}`)",
                stdout.trim()
            )));
        }
        Ok((id, tasks.tasks.keys().copied().collect()))
    }

    /// The record of a submitted job before any task has run.
    pub fn record(&self, job_id: &str, tasks: &[usize]) -> SlurmRecord {
        SlurmRecord {
            job_id: job_id.to_string(),
            script: format!("{SLURM_DIR}/{}", file_names(self.plan).1),
            shards: self.plan.selection,
            tasks: tasks
                .iter()
                .map(|&t| SlurmTaskRecord {
                    task: t,
                    slot: self.plan.slots[t].label.clone(),
                    node: None,
                    gpus: None,
                    state: None,
                })
                .collect(),
        }
    }

    /// Follows job `job_id` until every task has ended, giving each worker event to
    /// `on_event`; an interruption cancels the job (`scancel`) and waits for its tasks to end.
    pub fn follow(
        &self,
        job_id: &str,
        tasks: &[usize],
        mut on_event: impl FnMut(&RunEvent),
    ) -> Followed {
        let list = self.task_list();
        let mut offsets: BTreeMap<usize, u64> = BTreeMap::new();
        // Hands on the events the tasks' processes wrote since the last call.
        let mut drain = || {
            for procs in list.tasks.values() {
                for p in procs {
                    let offset = offsets.entry(p.index).or_insert(0);
                    for kind in read_new_events(&p.events, offset) {
                        on_event(&RunEvent {
                            process: p.index,
                            kind,
                        });
                    }
                }
            }
        };
        let mut cancelled: Option<Instant> = None;
        let mut last_query = Instant::now() - Duration::from_secs(60);
        let mut live = BTreeMap::new();
        // Since when Slurm has answered none of the questions, and what it said last.
        let mut unanswered: Option<(Instant, query::SlurmQueryError)> = None;
        let mut lost = None;
        loop {
            drain();
            if INTERRUPTED.load(Ordering::SeqCst) && cancelled.is_none() {
                cancel(job_id);
                cancelled = Some(Instant::now());
            }
            if last_query.elapsed() >= Duration::from_secs(1) {
                last_query = Instant::now();
                match query::query_live(job_id) {
                    Ok(now) => {
                        unanswered = None;
                        live = now;
                        if live.is_empty() {
                            break;
                        }
                    }
                    // Slurm not answering is not the job ending; the tasks' reports tell when
                    // every one has ended.
                    Err(why) => {
                        if query::all_reported_ended(self.run_dir, job_id, tasks) {
                            live.clear();
                            break;
                        }
                        let since = unanswered.map_or_else(Instant::now, |(at, _)| at);
                        if since.elapsed() > UNANSWERED_LIMIT {
                            lost = Some(format!(
                                "Slurm has not answered for {} s ({why})",
                                since.elapsed().as_secs()
                            ));
                            break;
                        }
                        unanswered = Some((since, why));
                    }
                }
            }
            // After a cancellation, a task that never leaves the queue is not waited for
            // forever.
            if cancelled.is_some_and(|at| at.elapsed() > Duration::from_secs(120)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        // The last events, written before the tasks ended.
        drain();
        let ended = ended_states(job_id);
        let mut record = self.record(job_id, tasks);
        let mut failures = Vec::new();
        for t in &mut record.tasks {
            let report = read_task_report(self.run_dir, job_id, t.task);
            fill_task(
                t,
                report.as_ref(),
                live.get(&t.task).or_else(|| ended.get(&t.task)),
            );
            let state = t.state.clone();
            let log = slurm_log(self.run_dir, job_id, t.task);
            let see = if log.exists() {
                format!("see {}", display_path(&log))
            } else {
                format!(
                    "it left no Slurm output ({} does not exist): `scontrol show job {job_id}` \
                     or the cluster's logs may say why",
                    display_path(&log)
                )
            };
            match &report {
                Some(r) if r.ended_at.is_some() => {
                    if let Some(f) = &r.failure {
                        failures.push(format!("slurm task {job_id}_{} ({}): {f}", t.task, t.slot));
                    }
                }
                _ if lost.is_some() => {}
                _ => failures.push(format!(
                    "slurm task {job_id}_{} ({}) ended without finishing its work (state {}); {see}",
                    t.task,
                    t.slot,
                    state.as_deref().unwrap_or("unknown: Slurm no longer knows the job"),
                )),
            }
        }
        Followed {
            failures,
            record,
            lost,
        }
    }
}

/// Task `t` of a job's record from what tells where it ran and how it ended: its state as Slurm
/// tells it (`now`; none when Slurm no longer knows the job: the record makes none up), the node
/// the task reported, else Slurm's, and the GPUs it reported.
fn fill_task(t: &mut SlurmTaskRecord, report: Option<&TaskReport>, now: Option<&TaskState>) {
    t.state = now.map(|s| s.state.clone());
    t.node = report
        .and_then(|r| r.node.clone())
        .or_else(|| now.and_then(|s| s.node.clone()));
    t.gpus = report.and_then(|r| r.gpus.clone());
}

/// Fills in the Slurm jobs of `record` (a run's record as an earlier apply left it) that no apply
/// followed to their end: an apply records its job as it submits it, before any task has run,
/// and with `--detach` (or when it stopped following because Slurm did not answer) nothing
/// records the tasks' ends after that. Each task whose state is missing and that has ended, by
/// Slurm's word or, where Slurm no longer knows the job, by its own report, gets its state (when
/// Slurm tells it), node and GPUs as [`SlurmWork::follow`] records them; a task still queued or
/// running, or whose end nothing tells, is left as it is. Slurm is asked only about jobs with
/// such tasks.
pub(super) fn settle_ended_jobs(run_dir: &Path, record: &mut RunRecord) {
    for job in record.slurm.iter_mut().chain(&mut record.slurm_shard_jobs) {
        if job.tasks.iter().all(|t| t.state.is_some()) {
            continue;
        }
        let slurm = ended_states(&job.job_id);
        for t in job.tasks.iter_mut().filter(|t| t.state.is_none()) {
            let report = read_task_report(run_dir, &job.job_id, t.task);
            let now = slurm.get(&t.task);
            let ended = match now {
                Some(s) => !query::is_live(&s.state),
                None => report.as_ref().is_some_and(|r| r.ended_at.is_some()),
            };
            if ended {
                fill_task(t, report.as_ref(), now);
            }
        }
    }
}

/// The text of the batch script: the options it was submitted with, as a comment (they are
/// given on sbatch's command line, one argument each), and the task's one command.
fn script_text(run: &str, runner: &Path, list: &Path, args: &[String]) -> String {
    let options: Vec<String> = args[..args.len() - 1]
        .iter()
        .filter(|a| *a != "--parsable")
        .map(|a| shell_quote(a))
        .collect();
    format!(
        "#!/bin/sh\n\
         # The Slurm job of run `{run}`, written by `runner apply`: one array task per worker slot\n\
         # (the task number is the slot's); each runs its slot's processes with the staged runner.\n\
         # Submitted as: sbatch {options} <this script>\n\
         exec {runner} slurm-task --tasks {list} --task \"$SLURM_ARRAY_TASK_ID\"\n",
        options = options.join(" "),
        runner = shell_quote(&runner.display().to_string()),
        list = shell_quote(&list.display().to_string()),
    )
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=./:%,@+".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Where a Slurm task writes process `p`'s events: `logs/<index>.events`, named as its spec is.
fn events_path(run_dir: &Path, plan: &Plan, p: &Process) -> PathBuf {
    let suffix = plan.file_suffix(p).unwrap_or_default();
    run_dir
        .join("logs")
        .join(format!("{:03}{suffix}.events", p.index))
}

/// Where task `task` of job `job_id` reports itself.
fn task_report_path(run_dir: &Path, job_id: &str, task: usize) -> PathBuf {
    run_dir
        .join(SLURM_DIR)
        .join(format!("task-{job_id}_{task}.json"))
}

/// The report of task `task` of job `job_id`, if it wrote one.
pub fn read_task_report(run_dir: &Path, job_id: &str, task: usize) -> Option<TaskReport> {
    read_json(&task_report_path(run_dir, job_id, task)).ok()
}

/// The Slurm output of task `task` of job `job_id` (sbatch's `--output`).
fn slurm_log(run_dir: &Path, job_id: &str, task: usize) -> PathBuf {
    run_dir
        .join("logs")
        .join(format!("slurm-{job_id}_{task}.out"))
}

/// The complete event lines added to `path` since `offset` (which moves past them).
fn read_new_events(path: &Path, offset: &mut u64) -> Vec<RunEventKind> {
    let Ok(mut file) = fs::File::open(path) else {
        return Vec::new();
    };
    if file.seek(SeekFrom::Start(*offset)).is_err() {
        return Vec::new();
    }
    let mut events = Vec::new();
    let mut reader = BufReader::new(file);
    let mut line = String::new();
    while let Ok(n) = reader.read_line(&mut line) {
        // A line without its newline is still being written: read it whole next time.
        if n == 0 || !line.ends_with('\n') {
            break;
        }
        *offset += n as u64;
        if let Some(kind @ (RunEventKind::Ready(_) | RunEventKind::PromptDone { .. })) =
            RunEventKind::from_line(line.trim_end())
        {
            events.push(kind);
        }
        line.clear();
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_leaves_plain_words_and_quotes_the_rest() {
        assert_eq!(shell_quote("--time=01:00:00"), "--time=01:00:00");
        assert_eq!(shell_quote("/a b/it's"), "'/a b/it'\\''s'");
    }

    #[test]
    fn a_percent_of_the_output_path_is_escaped_for_sbatch() {
        assert_eq!(escape_pattern(Path::new("/r/100%/x%j")), "/r/100%%/x%%j");
        assert_eq!(escape_pattern(Path::new("/r/plain")), "/r/plain");
    }
}

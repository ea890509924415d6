//! The Slurm executor (`executor.kind = "slurm"`): a run's work as one job array, one task per
//! worker slot (the task number is the slot's number in the plan). `runner apply` writes each
//! process's job spec, the task list (`slurm/tasks.json`) and the batch script
//! (`slurm/job.sh`), submits it with `sbatch`, and follows the job: progress from the event
//! files the workers write, task states from `squeue` while tasks live and from `scontrol` (or
//! `sacct`, where accounting is on) once they end. Each task runs `runner slurm-task` of the
//! staged runner, which runs its slot's processes one after another (warmup, then shards) as
//! `runner worker --spec` processes, as local workers run, and reports where it ran in
//! `slurm/task-<n>.json`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::apply::{ApplyError, INTERRUPTED};
use super::events::{RunEvent, RunEventKind};
use super::job::JobSpec;
use super::lock::Lock;
use super::slots::{log_tail, process_name};
use crate::engine::ProviderKind;
use crate::manifest::diagnostic::display_path;
use crate::manifest::{Executor, Resolved};
use crate::plan::Plan;
use crate::results::files::{read_json, write_atomic, write_json_atomic};
use crate::results::records::{SlurmRecord, SlurmTaskRecord};

/// The folder of a run's Slurm files, inside its results folder.
pub const SLURM_DIR: &str = "slurm";
const TASKS_JSON: &str = "tasks.json";
const SCRIPT: &str = "job.sh";

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

/// What a task says about itself in `slurm/task-<n>.json`: where it runs, then how it ended.
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

/// Refuses an apply while the Slurm job an earlier apply submitted for the run still has tasks
/// queued or running (a re-apply would run their prompts twice).
pub(super) fn check_no_live_job(
    run_dir: &Path,
    previous: Option<&SlurmRecord>,
) -> Result<(), ApplyError> {
    let Some(job) = previous else { return Ok(()) };
    if !command_exists("squeue") {
        return Ok(());
    }
    let live = live_tasks(&job.job_id);
    if live.is_empty() {
        return Ok(());
    }
    Err(ApplyError::refused(
        format!(
            "the Slurm job {} of {} still has {} task(s) queued or running",
            job.job_id,
            display_path(run_dir),
            live.len()
        ),
        format!(
            "`runner status {}` shows where it stands; apply again once it has ended, or cancel it with `scancel {}`",
            display_path(run_dir),
            job.job_id
        ),
    ))
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
                spec: spec_path(self.run_dir, p.index),
                log: p.log.clone(),
                events: events_path(self.run_dir, p.index),
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
            format!(
                "--output={}",
                self.run_dir.join("logs").join("slurm-%A_%a.out").display()
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
            let spec = spec_path(self.run_dir, p.index);
            let text = serde_json::to_string_pretty(job).expect("jobs serialise");
            write_atomic(&spec, text.as_bytes()).map_err(|e| io(&spec, &e))?;
            // A resubmitted process starts a fresh event file (apply follows it from its start).
            let events = events_path(self.run_dir, p.index);
            let _ = fs::remove_file(&events);
        }
        let tasks = self.task_list();
        for t in tasks.tasks.keys() {
            let _ = fs::remove_file(task_report_path(self.run_dir, *t));
        }
        let list = dir.join(TASKS_JSON);
        write_json_atomic(&list, &tasks)?;
        let script = dir.join(SCRIPT);
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
            script: format!("{SLURM_DIR}/{SCRIPT}"),
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
        loop {
            drain();
            if INTERRUPTED.load(Ordering::SeqCst) && cancelled.is_none() {
                cancel(job_id);
                cancelled = Some(Instant::now());
            }
            if last_query.elapsed() >= Duration::from_secs(1) {
                last_query = Instant::now();
                // Slurm not answering is not the job ending: asked again next time.
                if let Some(now) = query_live(job_id) {
                    live = now;
                    if live.is_empty() {
                        break;
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
            let report: Option<TaskReport> =
                read_json(&task_report_path(self.run_dir, t.task)).ok();
            let state = live
                .get(&t.task)
                .map(|s: &TaskState| s.state.clone())
                .or_else(|| ended.get(&t.task).map(|s| s.state.clone()));
            t.state = state.clone();
            t.node = report
                .as_ref()
                .and_then(|r| r.node.clone())
                .or_else(|| ended.get(&t.task).and_then(|s| s.node.clone()));
            t.gpus = report.as_ref().and_then(|r| r.gpus.clone());
            let log = self
                .run_dir
                .join("logs")
                .join(format!("slurm-{job_id}_{}.out", t.task));
            match &report {
                Some(r) if r.ended_at.is_some() => {
                    if let Some(f) = &r.failure {
                        failures.push(format!("slurm task {job_id}_{} ({}): {f}", t.task, t.slot));
                    }
                }
                _ => failures.push(format!(
                    "slurm task {job_id}_{} ({}) ended without finishing its work (state {}); see {}",
                    t.task,
                    t.slot,
                    state.as_deref().unwrap_or("unknown: Slurm no longer knows the job"),
                    display_path(&log)
                )),
            }
        }
        Followed { failures, record }
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

pub(super) fn spec_path(run_dir: &Path, process: usize) -> PathBuf {
    run_dir.join("specs").join(format!("{process:03}.json"))
}

fn events_path(run_dir: &Path, process: usize) -> PathBuf {
    run_dir.join("logs").join(format!("{process:03}.events"))
}

fn task_report_path(run_dir: &Path, task: usize) -> PathBuf {
    run_dir.join(SLURM_DIR).join(format!("task-{task}.json"))
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

/// A task's state as Slurm tells it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskState {
    pub state: String,
    pub node: Option<String>,
}

/// The job's tasks that are queued or running (`squeue`, one line per array task); empty once
/// every task has ended or Slurm no longer knows the job, or when Slurm cannot be asked.
pub fn live_tasks(job_id: &str) -> BTreeMap<usize, TaskState> {
    query_live(job_id).unwrap_or_default()
}

/// [`live_tasks`], or `None` when `squeue` could not answer (the controller unreachable): a job
/// it does not know any more has ended.
fn query_live(job_id: &str) -> Option<BTreeMap<usize, TaskState>> {
    let out = Command::new("squeue")
        .args(["-h", "-r", "-j", job_id, "-o", "%K|%T|%N"])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return stderr.contains("Invalid job id").then(BTreeMap::new);
    }
    let mut tasks = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut f = line.split('|');
        let (Some(ids), Some(state), node) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        for id in task_ids(ids) {
            tasks.insert(
                id,
                TaskState {
                    state: state.trim().to_string(),
                    node: node
                        .map(str::trim)
                        .filter(|n| !n.is_empty())
                        .map(String::from),
                },
            );
        }
    }
    Some(tasks)
}

/// The states of the job's tasks that have ended: from `scontrol` while the controller still
/// holds the job, else from `sacct` where accounting is on; empty when neither knows it.
pub fn ended_states(job_id: &str) -> BTreeMap<usize, TaskState> {
    let mut tasks = BTreeMap::new();
    if let Ok(out) = Command::new("scontrol")
        .args(["show", "job", "-o", job_id])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        && out.status.success()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{name}=")))
                    .map(String::from)
            };
            let (Some(ids), Some(state)) = (field("ArrayTaskId"), field("JobState")) else {
                continue;
            };
            let node = field("NodeList").filter(|n| n != "(null)");
            for id in task_ids(&ids) {
                tasks.insert(
                    id,
                    TaskState {
                        state: state.clone(),
                        node: node.clone(),
                    },
                );
            }
        }
        if !tasks.is_empty() {
            return tasks;
        }
    }
    if let Ok(out) = Command::new("sacct")
        .args(["-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,NodeList"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        && out.status.success()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let f: Vec<&str> = line.split('|').collect();
            let [id, state, node] = f[..] else { continue };
            let Some((_, ids)) = id.split_once('_') else {
                continue;
            };
            // `CANCELLED by 0`: the state is the first word.
            let state = state.split_whitespace().next().unwrap_or(state).to_string();
            for t in task_ids(ids) {
                tasks.insert(
                    t,
                    TaskState {
                        state: state.clone(),
                        node: Some(node.to_string())
                            .filter(|n| !n.is_empty() && n != "None assigned"),
                    },
                );
            }
        }
    }
    tasks
}

/// The array task numbers of `3`, `0-3`, `[0,2-4%2]` (a throttle after `%`).
fn task_ids(text: &str) -> BTreeSet<usize> {
    let text = text.trim().trim_start_matches('[').trim_end_matches(']');
    let text = text.split('%').next().unwrap_or_default();
    let mut ids = BTreeSet::new();
    for part in text.split(',') {
        let (part, step) = match part.split_once(':') {
            Some((p, s)) => (p, s.parse::<usize>().unwrap_or(1).max(1)),
            None => (part, 1),
        };
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    ids.extend((a..=b).step_by(step));
                }
            }
            None => {
                if let Ok(a) = part.parse() {
                    ids.insert(a);
                }
            }
        }
    }
    ids
}

/// Cancels the job (every task); Slurm stops the tasks' processes.
pub fn cancel(job_id: &str) {
    let _ = Command::new("scancel")
        .arg(job_id)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// `runner slurm-task`: runs task `task` of the list at `path` on this node, holding the run
/// folder's lock shared; returns the exit status (0: every process succeeded).
pub fn run_task(path: &Path, task: usize) -> i32 {
    let list: TaskList = match read_json(path) {
        Ok(l) => l,
        Err(e) => {
            crate::say!("error: cannot read the task list {}: {e}", path.display());
            return crate::exit::INTERNAL;
        }
    };
    let Some(procs) = list.tasks.get(&task) else {
        crate::say!("error: {} has no task {task}", path.display());
        return crate::exit::INTERNAL;
    };
    let report_path = task_report_path(&list.run_dir, task);
    let mut report = TaskReport {
        task,
        job_id: std::env::var("SLURM_ARRAY_JOB_ID").ok(),
        node: crate::results::records::hostname(),
        gpus: std::env::var("CUDA_VISIBLE_DEVICES")
            .ok()
            .filter(|g| !g.is_empty()),
        started_at: crate::results::time::now(),
        ended_at: None,
        failure: None,
    };
    let _ = write_json_atomic(&report_path, &report);
    let finish = |mut report: TaskReport, failure: Option<String>| {
        report.ended_at = Some(crate::results::time::now());
        report.failure = failure.clone();
        let _ = write_json_atomic(&report_path, &report);
        match failure {
            Some(f) => {
                crate::say!("error: {f}");
                crate::exit::FAILURE
            }
            None => crate::exit::OK,
        }
    };
    // Held while the task runs: no other apply of the run starts meanwhile.
    let _lock = match Lock::acquire_shared(&list.run_dir, &list.run) {
        Ok(l) => l,
        Err(e) => return finish(report, Some(e.to_string())),
    };
    for p in procs {
        if p.skip_marker.as_ref().is_some_and(|m| m.exists()) {
            continue;
        }
        let result = run_process(&list, p);
        if list.probe
            && let Some(v) = &p.videos
        {
            let _ = fs::remove_dir_all(v);
        }
        if let Err(f) = result {
            report.failure = Some(f.clone());
            return finish(report, Some(f));
        }
        if let Some(marker) = &p.skip_marker {
            let _ = fs::write(marker, format!("{}\n", list.run));
        }
    }
    finish(report, None)
}

/// Runs one process of a task as local workers run: `runner worker --spec`, its events to its
/// event file and its standard error to its log.
fn run_process(list: &TaskList, p: &TaskProcess) -> Result<(), String> {
    let create = |d: &Path| {
        fs::create_dir_all(d).map_err(|e| format!("{}: cannot create {}: {e}", p.name, d.display()))
    };
    create(&p.cache_dir)?;
    if let Some(v) = &p.videos {
        create(v)?;
    }
    let open = |f: &Path| {
        fs::File::create(f).map_err(|e| format!("{}: cannot create {}: {e}", p.name, f.display()))
    };
    let log = open(&p.log)?;
    let events = open(&p.events)?;
    let runner = std::env::current_exe().map_err(|e| format!("{}: {e}", p.name))?;
    let status = Command::new(runner)
        .arg("worker")
        .arg("--spec")
        .arg(&p.spec)
        .stdin(Stdio::null())
        .stdout(events)
        .stderr(log)
        .env("CUDA_CACHE_PATH", p.cache_dir.join("cuda_jit"))
        .env("OMP_NUM_THREADS", list.cpu_threads.to_string())
        .status()
        .map_err(|e| format!("{}: cannot start the worker: {e}", p.name))?;
    if status.success() {
        return Ok(());
    }
    let how = match status.code() {
        Some(c) => format!("exited with status {c}"),
        None => "was killed by a signal".to_string(),
    };
    Err(format!(
        "{} {how} (log {}):\n{}",
        p.name,
        display_path(&p.log),
        log_tail(&p.log, 20)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_task_ids_read_as_squeue_and_scontrol_write_them() {
        let ids = |t: &str| task_ids(t).into_iter().collect::<Vec<_>>();
        assert_eq!(ids("3"), vec![3]);
        assert_eq!(ids("0-2"), vec![0, 1, 2]);
        assert_eq!(ids("[0,2-3%1]"), vec![0, 2, 3]);
        assert_eq!(ids("1-5:2"), vec![1, 3, 5]);
        assert_eq!(ids("N/A"), Vec::<usize>::new());
    }

    #[test]
    fn shell_quoting_leaves_plain_words_and_quotes_the_rest() {
        assert_eq!(shell_quote("--time=01:00:00"), "--time=01:00:00");
        assert_eq!(shell_quote("/a b/it's"), "'/a b/it'\\''s'");
    }
}

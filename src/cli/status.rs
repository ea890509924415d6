//! `runner status RUN`: where a run stands (its record, its lock, its prompts, and its Slurm
//! job as Slurm tells it); and the hidden `runner slurm-task` that a run's Slurm tasks execute.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use super::out;
use crate::execute::lock::Lock;
use crate::execute::slurm::{self, TaskState};
use crate::exit;
use crate::manifest::Kind;
use crate::results::RUN_JSON;
use crate::results::completeness::record_counts;
use crate::results::files::{read_json, read_process_timings};
use crate::results::records::{ProcessRole, RunRecord, RunStatus, SlurmRecord, SlurmTaskRecord};

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// A run name under the results folder, or a path to a run directory.
    pub run: String,
    /// The results folder run names are looked up in.
    #[arg(long, value_name = "DIR", default_value = "results")]
    pub results: PathBuf,
    /// Print the status as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SlurmTaskArgs {
    /// The task list `runner apply` wrote (`slurm/tasks.json` of the run).
    #[arg(long, value_name = "FILE")]
    pub tasks: PathBuf,
    /// The array task number (`$SLURM_ARRAY_TASK_ID`).
    #[arg(long)]
    pub task: usize,
}

/// Where a run stands.
#[derive(Debug, Serialize)]
struct Status {
    run: String,
    dir: PathBuf,
    /// `running`, `succeeded`, `failed`, `interrupted`, `partial`, `queued`, `ended` (a
    /// Slurm job that has ended and whose results no apply has collected yet), or `incomplete`
    /// (a generation whose record says it succeeded and some of whose prompts are not complete
    /// now).
    state: String,
    detail: String,
    prompts_done: usize,
    prompts: usize,
    /// The Slurm job of the run's last apply.
    #[serde(skip_serializing_if = "Option::is_none")]
    slurm: Option<SlurmStatus>,
    /// The run's other Slurm jobs: those of its other shard applies (`apply --shard`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    slurm_shard_jobs: Vec<SlurmStatus>,
}

#[derive(Debug, Serialize)]
struct SlurmStatus {
    job_id: String,
    /// The shards the job runs (`3`, `2-5`); none: the whole run's.
    #[serde(skip_serializing_if = "Option::is_none")]
    shards: Option<String>,
    tasks: Vec<TaskStatus>,
}

#[derive(Debug, Serialize)]
struct TaskStatus {
    task: usize,
    slot: String,
    state: Option<String>,
    node: Option<String>,
    gpus: Option<String>,
}

pub fn run(args: &StatusArgs) -> i32 {
    let dir = match crate::report::locate(&args.run, &args.results) {
        Ok(d) => d,
        Err(e) => return exit::report(&e),
    };
    let record: RunRecord = match read_json(&dir.join(RUN_JSON)) {
        Ok(r) => r,
        Err(e) => {
            crate::say!(
                "error: {} has no readable run record: {e}",
                dir.join(RUN_JSON).display()
            );
            return exit::USAGE;
        }
    };
    let status = status_of(&dir, &record);
    if args.json {
        let mut text = serde_json::to_string_pretty(&status).expect("statuses serialise");
        text.push('\n');
        return out(&text);
    }
    out(&render(&status))
}

fn status_of(dir: &Path, record: &RunRecord) -> Status {
    // A prompt is done when it is complete (`results::completeness`), as `runner plan` and
    // `runner apply` tell it: a deleted or damaged video is not done, whatever its record says.
    let (done, prompts) = match record.kind {
        Kind::Generation => record_counts(dir, record),
        Kind::Probe => {
            let prompts = record
                .processes
                .iter()
                .filter(|p| p.role == ProcessRole::Measurement)
                .map(|p| p.prompts)
                .sum();
            let done: BTreeSet<u32> = read_process_timings(dir)
                .records
                .iter()
                .filter(|r| {
                    r.role == ProcessRole::Measurement && r.config_hash == record.config_hash
                })
                .map(|r| r.prompt)
                .collect();
            (done.len(), prompts)
        }
    };
    let held = Lock::is_held(dir);
    // Every job of the run, as Slurm tells where its tasks stand now (a job an apply did not
    // follow to its end: `--detach`, or another shard apply's) or as its apply recorded it.
    let mut jobs: Vec<SlurmStatus> = Vec::new();
    let mut asked: Vec<&str> = Vec::new();
    let (mut live, mut running) = (0, 0);
    for job in record.slurm_jobs() {
        let (status, now) = job_status(dir, job);
        if let Some(now) = now {
            asked.push(&job.job_id);
            live += now.len();
            running += now.values().filter(|s| s.state == "RUNNING").count();
        }
        jobs.push(status);
    }
    let named = match asked[..] {
        [one] => format!("Slurm job {one}"),
        _ => format!("Slurm jobs {}", asked.join(", ")),
    };
    let (state, detail) = match record.status {
        RunStatus::Running if live > 0 && running == 0 => (
            "queued".to_string(),
            format!("{named}: {live} task(s) queued"),
        ),
        RunStatus::Running if live > 0 => (
            "running".to_string(),
            format!(
                "{named}: {running} task(s) running, {} queued",
                live - running
            ),
        ),
        // A job Slurm says has ended is the run's answer, whatever of it still ends.
        RunStatus::Running if !asked.is_empty() => (
            "ended".to_string(),
            format!(
                "its {named} {} ended; apply the manifest again to write the summary (and \
                 resubmit what is unfinished)",
                if asked.len() == 1 { "has" } else { "have" }
            ),
        ),
        RunStatus::Running if held => ("running".into(), "its apply holds the run".into()),
        RunStatus::Running => (
            "interrupted".into(),
            "the apply that ran it was killed; apply the manifest again to continue".into(),
        ),
        s => {
            let detail = match s {
                RunStatus::Succeeded | RunStatus::EvaluationFailed if done < prompts => {
                    return Status {
                        run: record.run.clone(),
                        dir: dir.to_path_buf(),
                        state: "incomplete".into(),
                        detail: format!(
                            "its record says {}, and {} of its {prompts} prompts are not complete \
                             now (a video or kept array deleted or damaged, or a prompt's text \
                             changed); apply its manifest again to make them",
                            s.as_str(),
                            prompts - done
                        ),
                        prompts_done: done,
                        prompts,
                        slurm: (!jobs.is_empty()).then(|| jobs.remove(0)),
                        slurm_shard_jobs: jobs,
                    };
                }
                RunStatus::Partial if held => "other shards' applies are running".into(),
                RunStatus::Partial => "some shards are done; apply the others (--shard)".into(),
                _ => record
                    .ended_at
                    .clone()
                    .map_or_else(String::new, |t| format!("ended {t}")),
            };
            (s.as_str().to_string(), detail)
        }
    };
    Status {
        run: record.run.clone(),
        dir: dir.to_path_buf(),
        state,
        detail,
        prompts_done: done,
        prompts,
        slurm: (!jobs.is_empty()).then(|| jobs.remove(0)),
        slurm_shard_jobs: jobs,
    }
}

/// Where `job`'s tasks stand: a job whose apply recorded every task's end as that record says;
/// any other as Slurm tells it now (`squeue`, then `scontrol` or `sacct` for the tasks that
/// have left the queue), with the node and GPUs each task reported, and its queued or running
/// tasks (`None`: the record was enough).
fn job_status(dir: &Path, job: &SlurmRecord) -> (SlurmStatus, Option<BTreeMap<usize, TaskState>>) {
    let recorded = |t: &SlurmTaskRecord| TaskStatus {
        task: t.task,
        slot: t.slot.clone(),
        state: t.state.clone(),
        node: t.node.clone(),
        gpus: t.gpus.clone(),
    };
    let shards = job.shards.map(|s| s.label());
    if job.tasks.iter().all(|t| t.state.is_some()) {
        let tasks = job.tasks.iter().map(recorded).collect();
        return (
            SlurmStatus {
                job_id: job.job_id.clone(),
                shards,
                tasks,
            },
            None,
        );
    }
    let live = slurm::live_tasks(&job.job_id);
    let ended = if job.tasks.iter().any(|t| !live.contains_key(&t.task)) {
        slurm::ended_states(&job.job_id)
    } else {
        BTreeMap::new()
    };
    let tasks = job
        .tasks
        .iter()
        .map(|t| {
            let now: Option<&TaskState> = live.get(&t.task).or(ended.get(&t.task));
            let report = slurm::read_task_report(dir, &job.job_id, t.task);
            let mut status = recorded(t);
            if let Some(now) = now {
                status.state = Some(now.state.clone());
            }
            status.node = report
                .as_ref()
                .and_then(|r| r.node.clone())
                .or_else(|| now.and_then(|s| s.node.clone()))
                .or(status.node);
            status.gpus = report.and_then(|r| r.gpus).or(status.gpus);
            status
        })
        .collect();
    (
        SlurmStatus {
            job_id: job.job_id.clone(),
            shards,
            tasks,
        },
        Some(live),
    )
}

fn render(s: &Status) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "run      {} ({})", s.run, s.dir.display());
    let _ = writeln!(
        t,
        "status   {}{}",
        s.state,
        if s.detail.is_empty() {
            String::new()
        } else {
            format!(": {}", s.detail)
        }
    );
    let _ = writeln!(t, "prompts  {} of {} done", s.prompts_done, s.prompts);
    for job in s.slurm.iter().chain(&s.slurm_shard_jobs) {
        let shards = job
            .shards
            .as_ref()
            .map_or(String::new(), |s| format!(" (shard {s})"));
        let _ = writeln!(t, "slurm    job {}{shards}", job.job_id);
        for task in &job.tasks {
            let _ = writeln!(
                t,
                "  task {:<3} {:<6} {:<11} node {:<12} gpus {}",
                task.task,
                task.slot,
                task.state.as_deref().unwrap_or("-"),
                task.node.as_deref().unwrap_or("-"),
                task.gpus.as_deref().unwrap_or("-"),
            );
        }
    }
    t
}

//! `runner status RUN`: where a run stands (its record, its lock, its prompts, and its Slurm
//! job as Slurm tells it); and the hidden `runner slurm-task` that a run's Slurm tasks execute.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;

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
use crate::results::records::{ProcessRole, RunRecord, RunStatus};

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
    #[serde(skip_serializing_if = "Option::is_none")]
    slurm: Option<SlurmStatus>,
}

#[derive(Debug, Serialize)]
struct SlurmStatus {
    job_id: String,
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

fn status_of(dir: &std::path::Path, record: &RunRecord) -> Status {
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
    let mut slurm_status = None;
    let (state, detail) = match (&record.slurm, record.status) {
        (Some(job), RunStatus::Running) => {
            let live = slurm::live_tasks(&job.job_id);
            let ended = if live.len() < job.tasks.len() {
                slurm::ended_states(&job.job_id)
            } else {
                Default::default()
            };
            let tasks: Vec<TaskStatus> = job
                .tasks
                .iter()
                .map(|t| {
                    let s: Option<&TaskState> = live.get(&t.task).or(ended.get(&t.task));
                    let report = slurm::read_task_report(dir, &job.job_id, t.task);
                    TaskStatus {
                        task: t.task,
                        slot: t.slot.clone(),
                        state: s.map(|s| s.state.clone()),
                        node: report
                            .as_ref()
                            .and_then(|r| r.node.clone())
                            .or_else(|| s.and_then(|s| s.node.clone())),
                        gpus: report.and_then(|r| r.gpus),
                    }
                })
                .collect();
            let running = live.values().filter(|s| s.state == "RUNNING").count();
            let result = if live.is_empty() {
                (
                    "ended".to_string(),
                    format!(
                        "its Slurm job {} has ended; apply the manifest again to write the summary (and resubmit what is unfinished)",
                        job.job_id
                    ),
                )
            } else if running == 0 {
                (
                    "queued".to_string(),
                    format!("Slurm job {}: {} task(s) queued", job.job_id, live.len()),
                )
            } else {
                (
                    "running".to_string(),
                    format!(
                        "Slurm job {}: {running} task(s) running, {} queued",
                        job.job_id,
                        live.len() - running
                    ),
                )
            };
            slurm_status = Some(SlurmStatus {
                job_id: job.job_id.clone(),
                tasks,
            });
            result
        }
        (_, RunStatus::Running) if held => ("running".into(), "its apply holds the run".into()),
        (_, RunStatus::Running) => (
            "interrupted".into(),
            "the apply that ran it was killed; apply the manifest again to continue".into(),
        ),
        (job, s) => {
            if let Some(job) = job {
                slurm_status = Some(SlurmStatus {
                    job_id: job.job_id.clone(),
                    tasks: job
                        .tasks
                        .iter()
                        .map(|t| TaskStatus {
                            task: t.task,
                            slot: t.slot.clone(),
                            state: t.state.clone(),
                            node: t.node.clone(),
                            gpus: t.gpus.clone(),
                        })
                        .collect(),
                });
            }
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
                        slurm: slurm_status,
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
        slurm: slurm_status,
    }
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
    if let Some(job) = &s.slurm {
        let _ = writeln!(t, "slurm    job {}", job.job_id);
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

//! Asking Slurm where a job's array tasks stand: `squeue` for the tasks queued or running,
//! `scontrol` while the controller still holds the job, `sacct` where accounting is on. Each
//! command is given a bounded time; when none answers, the tasks' own reports on disk
//! (`slurm/task-<job>_<n>.json`) tell which have ended.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use serde::Serialize;

use super::{TaskReport, read_task_report};
use crate::results::records::SlurmRecord;

/// How long one `squeue`, `scontrol` or `sacct` may take before it counts as not answering.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why one Slurm command gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum SlurmCommandError {
    /// It could not start, or did not end within [`QUERY_TIMEOUT`].
    #[error(transparent)]
    Run(#[from] crate::bounded_command::CommandError),
    /// It failed and wrote nothing on its standard error.
    #[error("{program} failed ({status})")]
    Failed {
        program: &'static str,
        status: ExitStatus,
    },
    /// It failed: what it wrote on its standard error, trimmed.
    #[error("{0}")]
    Said(String),
}

impl SlurmCommandError {
    /// Whether the command said that it does not know the job.
    fn unknown_job(&self) -> bool {
        matches!(self, SlurmCommandError::Said(said) if said.contains("Invalid job id"))
    }
}

/// Why none of `squeue`, `scontrol` and `sacct` told where a job's tasks stand: what each said.
#[derive(Debug, thiserror::Error)]
#[error(
    "squeue: {squeue}; scontrol: {}; sacct: {sacct}",
    scontrol.as_ref().map_or_else(|| "no such job".to_string(), ToString::to_string)
)]
pub struct SlurmQueryError {
    squeue: SlurmCommandError,
    /// `None`: `scontrol` no longer holds the job.
    scontrol: Option<SlurmCommandError>,
    sacct: SlurmCommandError,
}

/// A task's state as Slurm tells it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskState {
    pub state: String,
    pub node: Option<String>,
}

/// The states of a task that has not ended: queued, starting, running or ending.
pub(super) fn is_live(state: &str) -> bool {
    matches!(
        state,
        "PENDING"
            | "CONFIGURING"
            | "RUNNING"
            | "COMPLETING"
            | "SUSPENDED"
            | "REQUEUED"
            | "REQUEUE_HOLD"
            | "REQUEUE_FED"
            | "RESIZING"
            | "SIGNALING"
            | "STAGE_OUT"
            | "STOPPED"
    )
}

/// The job's tasks that are queued or running; empty once every task has ended or Slurm no
/// longer knows the job, or when Slurm cannot be asked.
pub fn live_tasks(job_id: &str) -> BTreeMap<usize, TaskState> {
    query_live(job_id).unwrap_or_default()
}

/// The job's tasks that are queued or running: from `squeue`, else from the tasks in a live
/// state that `scontrol` or `sacct` show; `Err` (what each said) when none of them answered.
/// A job Slurm does not know any more has ended.
pub fn query_live(job_id: &str) -> Result<BTreeMap<usize, TaskState>, SlurmQueryError> {
    let squeue = match squeue(job_id) {
        Ok(live) => return Ok(live),
        Err(e) => e,
    };
    let live = |all: BTreeMap<usize, TaskState>| -> BTreeMap<usize, TaskState> {
        all.into_iter().filter(|(_, s)| is_live(&s.state)).collect()
    };
    // scontrol no longer holds the job: sacct may still know it.
    let scontrol = match scontrol(job_id) {
        Ok(Some(all)) => return Ok(live(all)),
        Ok(None) => None,
        Err(e) => Some(e),
    };
    match sacct(job_id) {
        Ok(Some(all)) => Ok(live(all)),
        Ok(None) => Ok(BTreeMap::new()),
        Err(sacct) => Err(SlurmQueryError {
            squeue,
            scontrol,
            sacct,
        }),
    }
}

/// A query of every task of a job: `Ok(None)` when the command does not know the job.
type Query = fn(&str) -> Result<Option<BTreeMap<usize, TaskState>>, SlurmCommandError>;

/// The states of the job's tasks as `scontrol` (while the controller still holds the job) or
/// `sacct` (where accounting is on) tell them, ended tasks included; empty when neither knows.
pub fn ended_states(job_id: &str) -> BTreeMap<usize, TaskState> {
    for query in [scontrol as Query, sacct] {
        if let Ok(Some(tasks)) = query(job_id)
            && !tasks.is_empty()
        {
            return tasks;
        }
    }
    BTreeMap::new()
}

/// Where a recorded job stands, for what must not act on a run while its tasks may still run.
pub enum Standing {
    /// Every task has ended (or Slurm no longer knows the job).
    Ended,
    /// These tasks are queued or running.
    Live(BTreeMap<usize, TaskState>),
    /// Slurm did not answer, and some task has not reported its end: what each command said.
    Unknown(String),
}

/// Where `job` stands: as Slurm tells it, else from the tasks' reports in `run_dir`.
pub fn standing(run_dir: &Path, job: &SlurmRecord) -> Standing {
    match query_live(&job.job_id) {
        Ok(live) if live.is_empty() => Standing::Ended,
        Ok(live) => Standing::Live(live),
        Err(why) => {
            let tasks: Vec<usize> = job.tasks.iter().map(|t| t.task).collect();
            if all_reported_ended(run_dir, &job.job_id, &tasks) {
                Standing::Ended
            } else {
                Standing::Unknown(why.to_string())
            }
        }
    }
}

/// Whether every one of `tasks` of job `job_id` has written its report's end.
pub(super) fn all_reported_ended(run_dir: &Path, job_id: &str, tasks: &[usize]) -> bool {
    tasks.iter().all(|&t| {
        read_task_report(run_dir, job_id, t).is_some_and(|r: TaskReport| r.ended_at.is_some())
    })
}

/// Runs a Slurm command, giving it [`QUERY_TIMEOUT`]: its standard output when it succeeded,
/// else what went wrong (its standard error, or that it could not start or did not answer).
fn run(program: &'static str, args: &[&str]) -> Result<String, SlurmCommandError> {
    let answer = crate::bounded_command::run(program, args, QUERY_TIMEOUT)?;
    if answer.status.success() {
        Ok(answer.stdout)
    } else {
        let said = answer.stderr.trim();
        Err(if said.is_empty() {
            SlurmCommandError::Failed {
                program,
                status: answer.status,
            }
        } else {
            SlurmCommandError::Said(said.to_string())
        })
    }
}

/// `squeue`'s tasks of the job (one line per array task); an unknown job has none.
fn squeue(job_id: &str) -> Result<BTreeMap<usize, TaskState>, SlurmCommandError> {
    let text = match run("squeue", &["-h", "-r", "-j", job_id, "-o", "%K|%T|%N"]) {
        Ok(text) => text,
        Err(e) if e.unknown_job() => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    let mut tasks = BTreeMap::new();
    for line in text.lines() {
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
    Ok(tasks)
}

/// `scontrol`'s tasks of the job, queued, running and ended; `None` once the controller no
/// longer holds it.
fn scontrol(job_id: &str) -> Result<Option<BTreeMap<usize, TaskState>>, SlurmCommandError> {
    let text = match run("scontrol", &["show", "job", "-o", job_id]) {
        Ok(text) => text,
        Err(e) if e.unknown_job() => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut tasks = BTreeMap::new();
    for line in text.lines() {
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
    Ok(Some(tasks))
}

/// `sacct`'s tasks of the job (where accounting is on); `None` when it has none.
fn sacct(job_id: &str) -> Result<Option<BTreeMap<usize, TaskState>>, SlurmCommandError> {
    let text = run(
        "sacct",
        &["-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,NodeList"],
    )?;
    let mut tasks = BTreeMap::new();
    for line in text.lines() {
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
                    node: Some(node.to_string()).filter(|n| !n.is_empty() && n != "None assigned"),
                },
            );
        }
    }
    Ok((!tasks.is_empty()).then_some(tasks))
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
    let _ = run("scancel", &[job_id]);
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
    fn queued_and_running_states_are_live_and_ended_ones_are_not() {
        for s in ["PENDING", "RUNNING", "COMPLETING", "REQUEUED"] {
            assert!(is_live(s), "{s}");
        }
        for s in [
            "COMPLETED",
            "FAILED",
            "CANCELLED",
            "TIMEOUT",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
        ] {
            assert!(!is_live(s), "{s}");
        }
    }
}

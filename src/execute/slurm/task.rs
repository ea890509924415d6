//! `runner slurm-task`: what one array task of a run's job executes on its node. It runs its
//! slot's processes in order as local workers run, each bound to it (a worker dies with the
//! task, SIGKILL included), and reports where it ran and how it ended in
//! `slurm/task-<job>_<n>.json`.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use super::super::lock::Lock;
use super::super::slots::{ProcessError, bind_to_parent, log_tail};
use super::{TaskList, TaskProcess, TaskReport, task_report_path};
use crate::results::files::{read_json, write_json_atomic};

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
    // The job's id names the task's report: tasks of the same number in two jobs of the run
    // (two `--shard` applies) each have their own.
    let Some(job_id) = std::env::var("SLURM_ARRAY_JOB_ID")
        .ok()
        .filter(|j| !j.is_empty())
    else {
        crate::say!(
            "error: runner slurm-task runs as a task of a Slurm job array ($SLURM_ARRAY_JOB_ID is not set)"
        );
        return crate::exit::INTERNAL;
    };
    let report_path = task_report_path(&list.run_dir, &job_id, task);
    let mut report = TaskReport {
        task,
        job_id: Some(job_id.clone()),
        node: crate::os::hostname(),
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
    let lock = match Lock::acquire_shared(&list.run_dir, &list.run) {
        Ok(l) => l,
        Err(e) => return finish(report, Some(e.to_string())),
    };
    for p in procs {
        if p.skip_marker.as_ref().is_some_and(|m| m.exists()) {
            continue;
        }
        let result = run_process(&list, p, &lock);
        if list.probe
            && let Some(v) = &p.videos
        {
            let _ = fs::remove_dir_all(v);
        }
        if let Err(f) = result {
            let f = f.to_string();
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
/// event file and its standard error to its log, bound to this task as a local worker is to its
/// apply: it dies with the task, and holds the run's lock (shared) while it lives.
fn run_process(list: &TaskList, p: &TaskProcess, lock: &Lock) -> Result<(), ProcessError> {
    let cannot_create = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ProcessError::Create {
            name: p.name.clone(),
            path,
            source,
        }
    };
    fs::create_dir_all(&p.cache_dir).map_err(cannot_create(&p.cache_dir))?;
    if let Some(v) = &p.videos {
        fs::create_dir_all(v).map_err(cannot_create(v))?;
    }
    let log = fs::File::create(&p.log).map_err(cannot_create(&p.log))?;
    let events = fs::File::create(&p.events).map_err(cannot_create(&p.events))?;
    let runner = std::env::current_exe().map_err(|source| ProcessError::Io {
        name: p.name.clone(),
        source,
    })?;
    let mut cmd = Command::new(runner);
    bind_to_parent(&mut cmd, lock.fd());
    let status = cmd
        .arg("worker")
        .arg("--spec")
        .arg(&p.spec)
        .stdin(Stdio::null())
        .stdout(events)
        .stderr(log)
        .env("CUDA_CACHE_PATH", p.cache_dir.join("cuda_jit"))
        .env("OMP_NUM_THREADS", list.cpu_threads.to_string())
        .status()
        .map_err(|source| ProcessError::StartWorker {
            name: p.name.clone(),
            source,
        })?;
    if status.success() {
        return Ok(());
    }
    Err(ProcessError::Failed {
        name: p.name.clone(),
        code: status.code(),
        log: p.log.clone(),
        tail: log_tail(&p.log, 20),
    })
}

//! A run's Slurm jobs as its record keeps them and `runner status` tells them: the job of every
//! `apply --shard` that submitted one, each task's state and node as Slurm tells it while no
//! apply follows the job. Against the real local Slurm, as the rest of `slurm`.

use serde_json::Value;

use super::{apply_args, run_dir, runner, slurm_up, squeue, wait_for};
use crate::apply::read_json;
use crate::support::Test;

/// The Slurm states a task of a job that has not failed may be in.
const STATES: [&str; 5] = [
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "COMPLETED",
];

/// `apply --shard N` of `experiments/smoke.toml` (prompts `indices`) with its own work root,
/// on `executor`, with `more` flags.
fn shard_apply(t: &Test, executor: &str, indices: &str, n: &str, more: &[&str]) -> Vec<String> {
    let mut flags = vec!["--shard", n];
    flags.extend(more);
    apply_args(t, executor, indices, &flags)
        .into_iter()
        .map(|a| {
            if a.starts_with("staging.work_root=") {
                format!(
                    "staging.work_root={}/work-{executor}-{n}",
                    t.path().display()
                )
            } else {
                a
            }
        })
        .collect()
}

/// Runs `args` with the runner and returns its standard output, failing on another exit status
/// than 0.
fn ok(t: &Test, args: &[String]) -> String {
    let out = runner(t, args).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn status_json(t: &Test) -> Value {
    let text = ok(t, &["status".into(), "smoke".into(), "--json".into()]);
    serde_json::from_str(&text).unwrap()
}

/// A task as `runner status --json` shows it: its number, state and node.
type Shown = (u64, Value, Value);

/// The tasks of each job `runner status --json` shows, by job id.
fn shown_tasks(status: &Value) -> Vec<(String, Vec<Shown>)> {
    let mut jobs: Vec<&Value> = status["slurm"]
        .as_object()
        .map(|_| &status["slurm"])
        .into_iter()
        .collect();
    jobs.extend(status["slurm_shard_jobs"].as_array().into_iter().flatten());
    jobs.iter()
        .map(|j| {
            let tasks = j["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    (
                        t["task"].as_u64().unwrap(),
                        t["state"].clone(),
                        t["node"].clone(),
                    )
                })
                .collect();
            (j["job_id"].as_str().unwrap().to_string(), tasks)
        })
        .collect()
}

/// Two `apply --shard --detach` of one run each submit a job: run.json keeps both, each with
/// its shards, and `runner status` asks Slurm for both, while they run and once they ended; an
/// apply after them collects the run and keeps both jobs on record.
#[test]
fn every_detached_shard_apply_s_job_is_kept_and_status_asks_slurm_for_each() {
    if !slurm_up() {
        return;
    }
    let t = Test::new();
    let dir = run_dir(&t);
    let first = ok(&t, &shard_apply(&t, "slurm", "0-3", "0", &["--detach"]))
        .trim()
        .to_string();
    let second = ok(&t, &shard_apply(&t, "slurm", "0-3", "1", &["--detach"]))
        .trim()
        .to_string();
    assert_ne!(first, second);
    let run = read_json(&dir.join("run.json"));
    assert_eq!(run["slurm"]["job_id"], second.as_str(), "{run}");
    let kept: Vec<(String, Value)> = run["slurm_shard_jobs"]
        .as_array()
        .unwrap_or_else(|| panic!("no slurm_shard_jobs: {run}"))
        .iter()
        .map(|j| {
            (
                j["job_id"].as_str().unwrap().to_string(),
                j["shards"].clone(),
            )
        })
        .collect();
    assert_eq!(
        kept,
        vec![
            (first.clone(), serde_json::json!({"first": 0, "last": 0})),
            (second.clone(), serde_json::json!({"first": 1, "last": 1})),
        ]
    );

    // While they live, status shows both jobs, each task's state as Slurm has it.
    let status = status_json(&t);
    let shown = shown_tasks(&status);
    let ids: Vec<&str> = shown.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, vec![second.as_str(), first.as_str()], "{status}");
    for (id, tasks) in &shown {
        let expected = if *id == first { 0 } else { 1 };
        assert_eq!(tasks.len(), 1, "{status}");
        assert_eq!(tasks[0].0, expected, "{status}");
        let state = tasks[0]
            .1
            .as_str()
            .unwrap_or_else(|| panic!("no state: {status}"));
        assert!(STATES.contains(&state), "{status}");
    }
    let text = ok(&t, &["status".into(), "smoke".into()]);
    assert!(
        text.contains(&format!("slurm    job {first} (shard 0)")),
        "{text}"
    );
    assert!(
        text.contains(&format!("slurm    job {second} (shard 1)")),
        "{text}"
    );

    for job in [&first, &second] {
        wait_for("the jobs to end", || squeue(job).is_empty().then_some(()));
    }
    // Ended, each task COMPLETED on this host's node, as scontrol still tells.
    let status = status_json(&t);
    assert_eq!(status["state"], "ended", "{status}");
    for (_, tasks) in shown_tasks(&status) {
        assert_eq!(tasks[0].1, "COMPLETED", "{status}");
        assert!(
            tasks[0].2.as_str().is_some_and(|n| !n.is_empty()),
            "{status}"
        );
    }
    // An apply of the whole run collects it: nothing resubmitted, both jobs kept.
    ok(&t, &apply_args(&t, "slurm", "0-3", &[]));
    let run = read_json(&dir.join("run.json"));
    assert_eq!(run["status"], "succeeded", "{run}");
    let kept: Vec<&str> = run["slurm_shard_jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(kept, vec![first.as_str(), second.as_str()], "{run}");
}

/// A detached shard apply's job, and then another shard applied on the local executor: the
/// record's status is no longer `running` (the local apply ended), and the job was never
/// followed, so its tasks' states and nodes are not on record. `runner status` asks Slurm.
#[test]
fn status_asks_slurm_for_a_detached_job_whatever_the_run_s_status() {
    if !slurm_up() {
        return;
    }
    let t = Test::new();
    let job = ok(&t, &shard_apply(&t, "slurm", "0-5", "0", &["--detach"]))
        .trim()
        .to_string();
    ok(&t, &shard_apply(&t, "local", "0-5", "1", &[]));
    let run = read_json(&run_dir(&t).join("run.json"));
    assert_eq!(run["slurm"]["job_id"], job.as_str(), "{run}");
    assert_eq!(run["slurm"]["tasks"][0]["state"], Value::Null, "{run}");
    let status = status_json(&t);
    assert_ne!(status["state"], "running", "{status}");
    let shown = shown_tasks(&status);
    assert_eq!(shown.len(), 1, "{status}");
    let (id, tasks) = &shown[0];
    assert_eq!(id, &job);
    let state = tasks[0]
        .1
        .as_str()
        .unwrap_or_else(|| panic!("no state: {status}"));
    assert!(STATES.contains(&state), "{status}");
    wait_for("the job to end", || squeue(&job).is_empty().then_some(()));
    let status = status_json(&t);
    let (_, tasks) = &shown_tasks(&status)[0];
    assert_eq!(tasks[0].1, "COMPLETED", "{status}");
    assert!(
        tasks[0].2.as_str().is_some_and(|n| !n.is_empty()),
        "{status}"
    );
}

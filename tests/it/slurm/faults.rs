//! The Slurm executor when things go wrong around it: Slurm's commands failing (while apply
//! follows its job, and while it collects a detached one), a run cleaned while its detached job
//! waits, a `%` in the results path, two `--shard` applies side by side,
//! and an array task's process killed. Against the real local Slurm, as the rest of `slurm`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{apply_args, job_id, run_dir, runner, slurm_up, spawn, squeue, wait_for};
use crate::apply::{read_json, shard_prompts};
use crate::support::{Test, repo};

/// A `PATH` in which each of `failing` is a command that fails as a Slurm command does when it
/// cannot reach its controller; the rest of `PATH` as it is.
fn path_with_failing(t: &Test, failing: &[&str]) -> String {
    let bin = t.path().join("failing-bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in failing {
        let script = bin.join(name);
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"{name}: error: Unable to contact slurm controller (connect failure)\" >&2\nexit 1\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Waits for `child` at most `secs` seconds; one still running then is killed and fails the
/// test with `what`.
fn wait_bounded(mut child: Child, secs: u64, what: &str) -> Output {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: still running after {secs} s\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    child.wait_with_output().unwrap()
}

/// Cancels a test's Slurm job when the test ends, however it ends.
struct CancelOnDrop(String);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("scancel").arg(&self.0).status();
    }
}

/// Run `held` (`held.toml` in the test's folder): `experiments/smoke.toml` on the Slurm
/// executor, its job submitted held (`--hold`), so that its tasks stay queued until the test
/// says.
fn held_smoke(t: &Test) -> Vec<String> {
    std::fs::write(
        t.path().join("held.toml"),
        format!(
            "extends = \"{}\"\n[executor]\nkind = \"slurm\"\nshared_filesystem = true\nextra = [\"--hold\"]\n",
            repo().join("experiments/smoke.toml").display()
        ),
    )
    .unwrap();
    let root = t.path().display().to_string();
    [
        "apply",
        "--quiet",
        "--detach",
        "held.toml",
        "--set",
        &format!("outputs.dir={root}/results"),
        "--set",
        &format!("staging.work_root={root}/work"),
        "--set",
        "prompts.indices=0-7",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Submits `held_smoke`'s job; its id.
fn submit_held(t: &Test) -> String {
    let out = runner(t, &held_smoke(t)).output().unwrap();
    crate::support::assert_exit_0(&out);
    let job = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(job_id(&held_dir(t)).as_deref(), Some(job.as_str()));
    job
}

fn held_dir(t: &Test) -> PathBuf {
    t.path().join("results/held")
}

fn staging(dir: &Path) -> PathBuf {
    let run = read_json(&dir.join("run.json"));
    PathBuf::from(run["places"]["staging"].as_str().unwrap())
}

#[test]
fn apply_follows_its_job_to_the_end_when_squeue_fails_and_when_no_slurm_command_answers() {
    if !slurm_up() {
        return;
    }
    for failing in [&["squeue"][..], &["squeue", "scontrol", "sacct"]] {
        let t = Test::new();
        let dir = run_dir(&t);
        let child = runner(&t, &apply_args(&t, "slurm", "0-1", &[]))
            .env("PATH", path_with_failing(&t, failing))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_bounded(child, 300, &format!("apply with {failing:?} failing"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{failing:?}: {stderr}");
        let run = read_json(&dir.join("run.json"));
        assert_eq!(run["status"], "succeeded", "{failing:?}: {run}");
        let job = run["slurm"]["job_id"].as_str().unwrap();
        for task in run["slurm"]["tasks"].as_array().unwrap() {
            let n = task["task"].as_u64().unwrap();
            let report = read_json(&dir.join(format!("slurm/task-{job}_{n}.json")));
            assert!(report["ended_at"].is_string(), "{report}");
            assert!(report["failure"].is_null(), "{report}");
            if failing.len() == 1 {
                // scontrol told the end.
                assert_eq!(task["state"], "COMPLETED", "{run}");
            } else {
                // Nothing told the state: the record does not make one up.
                assert!(task["state"].is_null(), "{run}");
            }
        }
        assert_eq!(shard_prompts(&dir), vec![0, 1]);
    }
}

/// The apply that collects a detached job's run while no Slurm command answers still records
/// where each task ran, from the tasks' own reports, and makes up no state Slurm did not tell.
#[test]
fn a_detached_job_collected_while_slurm_does_not_answer_gets_its_nodes_from_the_task_reports() {
    if !slurm_up() {
        return;
    }
    let t = Test::new();
    let dir = run_dir(&t);
    let out = runner(&t, &apply_args(&t, "slurm", "0-1", &["--detach"]))
        .output()
        .unwrap();
    crate::support::assert_exit_0(&out);
    let job = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let _cancel = CancelOnDrop(job.clone());
    wait_for("the job to end", || squeue(&job).is_empty().then_some(()));
    let child = runner(&t, &apply_args(&t, "slurm", "0-1", &[]))
        .env(
            "PATH",
            path_with_failing(&t, &["squeue", "scontrol", "sacct"]),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(child, 300, "the apply that collects the run");
    crate::support::assert_exit_0(&out);
    let run = read_json(&dir.join("run.json"));
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["slurm"]["job_id"], job.as_str(), "no second job: {run}");
    let host = run["host"].as_str().unwrap();
    let tasks = run["slurm"]["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{run}");
    for task in tasks {
        assert_eq!(
            task["node"].as_str(),
            Some(host.split('.').next().unwrap()),
            "{run}"
        );
        // Nothing told the state: the record does not make one up.
        assert!(task["state"].is_null(), "{run}");
    }
}

#[test]
fn clean_refuses_a_run_whose_detached_job_is_queued_and_cleans_it_once_the_job_is_gone() {
    if !slurm_up() {
        return;
    }
    let t = Test::new();
    let dir = held_dir(&t);
    let job = submit_held(&t);
    let _cancel = CancelOnDrop(job.clone());
    let staged = staging(&dir);
    assert!(staged.is_dir(), "{}", staged.display());
    for more in [&[][..], &["--all"], &["--state"]] {
        let mut args = vec!["clean".to_string(), "held".to_string()];
        args.extend(more.iter().map(|s| s.to_string()));
        let out = runner(&t, &args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{more:?}: {stderr}");
        for want in [
            format!("Slurm job {job} still has task(s) {job}_0 (PENDING), {job}_1 (PENDING)"),
            "nothing was removed".to_string(),
            format!("scancel {job}"),
        ] {
            assert!(stderr.contains(&want), "{want}\n{stderr}");
        }
        assert!(staged.is_dir(), "{more:?}: the staging is kept");
        assert!(
            dir.join("run.json").is_file(),
            "{more:?}: the results are kept"
        );
        assert!(dir.join("slurm/tasks.json").is_file());
    }
    // Once the job is gone, the run is cleaned.
    let cancelled = Command::new("scancel").arg(&job).status().unwrap();
    assert!(cancelled.success());
    wait_for("the job to leave the queue", || {
        squeue(&job).is_empty().then_some(())
    });
    let out = runner(&t, &["clean".into(), "held".into()])
        .output()
        .unwrap();
    crate::support::assert_exit_0(&out);
    assert!(!staged.exists());
}

#[test]
fn a_percent_in_the_results_path_is_the_path_sbatch_writes_the_tasks_output_to() {
    if !slurm_up() {
        return;
    }
    let t = Test::new();
    let results = t.path().join("res%j%x");
    let args: Vec<String> = apply_args(&t, "slurm", "0-1", &[])
        .into_iter()
        .map(|a| {
            if a.starts_with("outputs.dir=") {
                format!("outputs.dir={}", results.display())
            } else {
                a
            }
        })
        .collect();
    let out = wait_bounded(spawn(&t, &args), 300, "apply");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let dir = results.join("smoke");
    let run = read_json(&dir.join("run.json"));
    assert_eq!(run["status"], "succeeded", "{run}");
    let job = run["slurm"]["job_id"].as_str().unwrap();
    for task in 0..2 {
        let log = dir.join(format!("logs/slurm-{job}_{task}.out"));
        assert!(log.is_file(), "{} is missing", log.display());
    }
    // Nothing went to a path with the patterns expanded.
    let folders: Vec<String> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("res"))
        .collect();
    assert_eq!(folders, vec!["res%j%x".to_string()]);
    assert_eq!(shard_prompts(&dir), vec![0, 1]);
}

#[test]
fn two_shard_applies_on_slurm_side_by_side_each_run_their_own_tasks() {
    if !slurm_up() {
        return;
    }
    let t = Test::new();
    let dir = run_dir(&t);
    let shard = |n: &str, root: &str| {
        let args: Vec<String> = apply_args(&t, "slurm", "0-3", &["--shard", n])
            .into_iter()
            .map(|a| {
                if a.starts_with("staging.work_root=") {
                    format!("staging.work_root={}/{root}", t.path().display())
                } else {
                    a
                }
            })
            .collect();
        spawn(&t, &args)
    };
    let first = shard("0", "work-a");
    let second = shard("1", "work-b");
    for (n, child) in [first, second].into_iter().enumerate() {
        let out = wait_bounded(child, 400, &format!("shard {n}'s apply"));
        assert_eq!(
            out.status.code(),
            Some(0),
            "shard {n}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Each apply's task list is its own, and every prompt was made once.
    for n in 0..2 {
        let list = read_json(&dir.join(format!("slurm/tasks-shard-{n}.json")));
        let tasks: Vec<&String> = list["tasks"].as_object().unwrap().keys().collect();
        assert_eq!(tasks, vec![&n.to_string()], "{list}");
    }
    assert_eq!(shard_prompts(&dir), vec![0, 1, 2, 3]);
    let run = read_json(&dir.join("run.json"));
    assert_eq!(run["status"], "succeeded", "{run}");
}

/// The processes whose command line has every one of `words` (as separate arguments, or
/// inside one), with their parent's pid.
fn processes_with(words: &[&str]) -> Vec<(i32, i32)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !words.iter().all(|w| cmdline.contains(w)) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: after the last `)`.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .collect();
        if fields[0] != "Z" {
            found.push((pid, fields[1].parse().unwrap()));
        }
    }
    found
}

#[test]
fn a_sigkilled_array_task_takes_its_worker_with_it_and_the_run_does_not_succeed() {
    if !slurm_up() {
        return;
    }
    let t = Test::new();
    let dir = held_dir(&t);
    // The job waits, held; the test runs its task 0 as Slurm would run it.
    let job = submit_held(&t);
    let _cancel = CancelOnDrop(job.clone());
    let list = dir.join("slurm/tasks.json");
    let mut task = runner(
        &t,
        &[
            "slurm-task".into(),
            "--tasks".into(),
            list.display().to_string(),
            "--task".into(),
            "0".into(),
        ],
    )
    .env("SLURM_ARRAY_JOB_ID", &job)
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let specs = dir.join("specs").display().to_string();
    let worker = wait_for("the task's worker", || {
        processes_with(&["worker", "--spec", &specs])
            .into_iter()
            .find(|(_, parent)| *parent == task.id() as i32)
            .map(|(pid, _)| pid)
    });
    // SAFETY: killing the task process this test started, as the kernel's OOM killer would.
    unsafe { libc::kill(task.id() as i32, libc::SIGKILL) };
    task.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while processes_with(&["worker", "--spec", &specs])
        .iter()
        .any(|(pid, _)| *pid == worker)
    {
        if Instant::now() > deadline {
            // SAFETY: the stray worker of this test's run.
            unsafe { libc::kill(worker, libc::SIGKILL) };
            panic!("the worker {worker} outlived its task by 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The task's report does not claim an end, and the run is not recorded as succeeded.
    let report = read_json(&dir.join(format!("slurm/task-{job}_0.json")));
    assert!(report["ended_at"].is_null(), "{report}");
    let run = read_json(&dir.join("run.json"));
    assert_eq!(run["status"], "running", "{run}");
    let cancelled = Command::new("scancel").arg(&job).status().unwrap();
    assert!(cancelled.success());
    wait_for("the job to leave the queue", || {
        squeue(&job).is_empty().then_some(())
    });
    let status = runner(&t, &["status".into(), "held".into(), "--json".into()])
        .output()
        .unwrap();
    let value: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(value["state"], "ended", "{value}");
}

/// sbatch refusing the job leaves nothing a task could have used: the staging is removed, so
/// the next apply, with sbatch working again, runs without `--reuse-workdir`.
#[test]
fn a_job_sbatch_refuses_leaves_no_staging_to_block_the_next_apply() {
    if !slurm_up() {
        return;
    }
    let t = Test::new();
    let dir = run_dir(&t);
    let out = runner(&t, &apply_args(&t, "slurm", "0", &[]))
        .env("PATH", path_with_failing(&t, &["sbatch"]))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("sbatch"), "{stderr}");
    let run = read_json(&dir.join("run.json"));
    assert_eq!(run["status"], "failed", "{run}");
    assert!(!staging(&dir).exists(), "the refused job's staging is kept");
    let again = runner(&t, &apply_args(&t, "slurm", "0", &[]))
        .output()
        .unwrap();
    crate::support::assert_exit_0(&again);
    assert_eq!(read_json(&dir.join("run.json"))["status"], "succeeded");
}

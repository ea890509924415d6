//! Beyond one process tree: `experiments/smoke.toml` under the Slurm executor on a real Slurm
//! cluster (`scripts/slurm-local` starts a one-node one as root), and `apply --shard` in
//! separate processes. The Slurm tests fail when no Slurm node answers, unless
//! `UNSTEP_SKIP_SLURM_TESTS=1` says to skip them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::apply::{generation, read_json, records, shard_prompts, videos};
use crate::support::{Test, repo};

mod faults;
mod jobs;

/// Whether Slurm is here to test against: `true` when a node is up; `false` (skip) only when
/// `UNSTEP_SKIP_SLURM_TESTS=1`; otherwise the test fails saying how to start it.
pub(super) fn slurm_up() -> bool {
    let state = Command::new("sinfo")
        .args(["-h", "-o", "%T"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    // A node that answers: idle, or busy with jobs (`mixed`, `allocated`, `planned`,
    // `completing`); not down, drained, unknown or not responding (`*`).
    let up = |s: &str| {
        !s.is_empty()
            && !s.ends_with('*')
            && ![
                "down", "drain", "fail", "unk", "inval", "future", "boot", "not_resp",
            ]
            .iter()
            .any(|bad| s.starts_with(bad))
    };
    if state.lines().any(|s| up(s.trim())) {
        return true;
    }
    if std::env::var("UNSTEP_SKIP_SLURM_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("skipped: no Slurm node is up and UNSTEP_SKIP_SLURM_TESTS=1");
        return false;
    }
    panic!(
        "no Slurm node is up (sinfo says {:?}): start one with `scripts/slurm-local` (as root), \
         or set UNSTEP_SKIP_SLURM_TESTS=1 to skip the Slurm tests",
        state.trim()
    );
}

/// `experiments/smoke.toml` with its results and staging inside the test, on `executor`,
/// restricted to `indices`.
pub(super) fn smoke_args(t: &Test, executor: &str, indices: &str) -> Vec<String> {
    let root = t.path();
    let mut args = vec![
        repo().join("experiments/smoke.toml").display().to_string(),
        "--set".into(),
        format!("outputs.dir={}/results", root.display()),
        "--set".into(),
        format!("staging.work_root={}/work", root.display()),
        "--set".into(),
        format!("prompts.indices={indices}"),
        "--set".into(),
        format!("executor.kind={executor}"),
    ];
    if executor == "slurm" {
        // The test's folders are under /tmp, which a one-node cluster shares with itself.
        args.extend(["--set".into(), "executor.shared_filesystem=true".into()]);
    }
    args
}

pub(super) fn runner(t: &Test, args: &[String]) -> Command {
    let mut cmd = t.command(env!("CARGO_BIN_EXE_runner"));
    cmd.args(args);
    cmd
}

pub(super) fn spawn(t: &Test, args: &[String]) -> Child {
    runner(t, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

pub(super) fn apply_args(t: &Test, executor: &str, indices: &str, more: &[&str]) -> Vec<String> {
    let mut args = vec!["apply".to_string(), "--quiet".to_string()];
    args.extend(more.iter().map(|s| s.to_string()));
    args.extend(smoke_args(t, executor, indices));
    args
}

/// Waits (polling) until `f` gives something, failing after a few minutes with `what`.
pub(super) fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The Slurm job id run.json records, once apply has submitted it.
pub(super) fn job_id(run_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(run_dir.join("run.json")).ok()?;
    let run: serde_json::Value = serde_json::from_str(&text).ok()?;
    run["slurm"]["job_id"].as_str().map(String::from)
}

/// `squeue`'s lines for the job's array tasks still queued or running: `<task>|<state>`.
pub(super) fn squeue(job: &str) -> Vec<String> {
    let out = Command::new("squeue")
        .args(["-h", "-r", "-j", job, "-o", "%K|%T"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect()
}

/// `scontrol`'s state of each array task of an ended job, by task number.
pub(super) fn scontrol_states(job: &str) -> Vec<(String, String)> {
    let out = Command::new("scontrol")
        .args(["show", "job", "-o", job])
        .output()
        .unwrap();
    let mut states: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let field = |n: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{n}=")))
                    .map(String::from)
            };
            Some((field("ArrayTaskId")?, field("JobState")?))
        })
        .collect();
    states.sort();
    states
}

pub(super) fn run_dir(t: &Test) -> PathBuf {
    t.path().join("results/smoke")
}

#[test]
fn smoke_under_slurm_runs_one_array_task_per_slot_with_the_videos_of_a_local_run() {
    if !slurm_up() {
        return;
    }
    let t = Test::new();
    let dir = run_dir(&t);
    let child = spawn(&t, &apply_args(&t, "slurm", "all", &[]));
    // While the job runs, Slurm shows its array tasks.
    let job = wait_for("the job's id in run.json", || job_id(&dir));
    let seen = wait_for("squeue to show the job's tasks", || {
        let lines = squeue(&job);
        (!lines.is_empty()).then_some(lines)
    });
    assert!(
        seen.iter()
            .all(|l| l.starts_with("0|") || l.starts_with("1|")),
        "{seen:?}"
    );
    let out = child.wait_with_output().unwrap();
    crate::support::assert_exit_0(&out);
    // The same statistics table as a local apply, with the job in its provenance.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("succeeded"), "{stdout}");
    assert!(stdout.contains(&format!("job {job}: cpu0 on ")), "{stdout}");

    let run = read_json(&dir.join("run.json"));
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["execution_provider"], "cpu");
    let tasks = run["slurm"]["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{run}");
    let host = run["host"].as_str().unwrap();
    for (i, task) in tasks.iter().enumerate() {
        assert_eq!(task["task"], i);
        assert_eq!(task["slot"], format!("cpu{i}"));
        assert_eq!(task["state"], "COMPLETED");
        // The node is this host (a one-node cluster).
        assert_eq!(
            task["node"].as_str().unwrap(),
            host.split('.').next().unwrap()
        );
    }
    let states = scontrol_states(&job);
    assert_eq!(
        states,
        vec![
            ("0".to_string(), "COMPLETED".to_string()),
            ("1".to_string(), "COMPLETED".to_string())
        ]
    );
    assert!(dir.join("slurm/job.sh").is_file());
    assert_eq!(shard_prompts(&dir), (0..12).collect::<Vec<u64>>());
    // `runner status` tells the same.
    let status = runner(&t, &["status".into(), "smoke".into()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("status   succeeded"), "{text}");
    assert!(text.contains("prompts  12 of 12 done"), "{text}");
    assert!(text.contains(&format!("slurm    job {job}")), "{text}");

    // The videos are byte for byte those of a local run.
    let local = Test::new();
    let out = runner(&local, &apply_args(&local, "local", "all", &[]))
        .output()
        .unwrap();
    crate::support::assert_exit_0(&out);
    let slurm_videos = videos(&dir);
    assert_eq!(slurm_videos.len(), 12);
    assert_eq!(slurm_videos, videos(&run_dir(&local)));
}

#[test]
fn a_cancelled_task_fails_the_run_and_re_applying_resubmits_only_the_missing_prompts() {
    if !slurm_up() {
        return;
    }
    let t = Test::new();
    let dir = run_dir(&t);
    let child = spawn(&t, &apply_args(&t, "slurm", "0-7", &[]));
    let job = wait_for("the job's id in run.json", || job_id(&dir));
    // Task 1 (slot cpu1) runs shard 1 as process 3: cancel that task alone once it has made a
    // prompt.
    wait_for("shard 1's first prompt", || {
        let n =
            std::fs::read_to_string(dir.join("timings/003.jsonl")).map_or(0, |t| t.lines().count());
        (n >= 1).then_some(())
    });
    let cancelled = Command::new("scancel")
        .arg(format!("{job}_1"))
        .status()
        .unwrap();
    assert!(cancelled.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("slurm task {job}_1 (cpu1)")),
        "{stderr}"
    );
    let run = read_json(&dir.join("run.json"));
    assert_eq!(run["status"], "failed");
    assert_eq!(run["slurm"]["tasks"][1]["state"], "CANCELLED");
    assert_eq!(run["slurm"]["tasks"][0]["state"], "COMPLETED");
    let before = shard_prompts(&dir);
    for p in 0..4 {
        assert!(
            before.contains(&p),
            "task 0 finished prompt {p}: {before:?}"
        );
    }
    assert!(before.len() >= 5 && before.len() < 8, "{before:?}");

    // A re-apply submits a new job of the one unfinished task, which makes only the missing
    // prompts.
    let again = runner(&t, &apply_args(&t, "slurm", "0-7", &["--reuse-workdir"]))
        .output()
        .unwrap();
    crate::support::assert_exit_0(&again);
    let resumed = read_json(&dir.join("run.json"));
    assert_eq!(resumed["status"], "succeeded");
    let second = resumed["slurm"]["job_id"].as_str().unwrap();
    assert_ne!(second, job);
    let tasks = resumed["slurm"]["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{resumed}");
    assert_eq!(tasks[0]["task"], 1);
    // Every prompt has exactly one record: nothing made twice.
    assert_eq!(shard_prompts(&dir), (0..8).collect::<Vec<u64>>());
    assert_eq!(videos(&dir).len(), 8);
}

#[test]
fn ctrl_c_cancels_the_job() {
    if !slurm_up() {
        return;
    }
    let t = Test::new();
    let dir = run_dir(&t);
    let child = spawn(&t, &apply_args(&t, "slurm", "0-7", &[]));
    let job = wait_for("the job's id in run.json", || job_id(&dir));
    wait_for("a task running", || {
        squeue(&job)
            .iter()
            .any(|l| l.ends_with("|RUNNING"))
            .then_some(())
    });
    // SAFETY: interrupting the runner this test started, as Ctrl-C would.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(squeue(&job).is_empty(), "the job's tasks are gone");
    let states = scontrol_states(&job);
    assert!(!states.is_empty());
    assert!(
        states
            .iter()
            .all(|(_, s)| s == "CANCELLED" || s == "COMPLETED"),
        "{states:?}"
    );
    assert!(states.iter().any(|(_, s)| s == "CANCELLED"), "{states:?}");
    assert_eq!(read_json(&dir.join("run.json"))["status"], "interrupted");
    assert!(shard_prompts(&dir).len() < 8);
}

#[test]
fn a_detached_apply_returns_the_job_id_and_a_later_apply_collects_the_run() {
    if !slurm_up() {
        return;
    }
    let t = Test::new();
    let dir = run_dir(&t);
    let out = runner(&t, &apply_args(&t, "slurm", "0-1", &["--detach"]))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let job = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(job_id(&dir).as_deref(), Some(job.as_str()));
    // While the job lives, a second apply is refused, and `status` asks Slurm.
    let status = runner(&t, &["status".into(), "smoke".into(), "--json".into()])
        .output()
        .unwrap();
    let value: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(value["slurm"]["job_id"], job.as_str());
    let state = value["state"].as_str().unwrap();
    assert!(["queued", "running", "ended"].contains(&state), "{value}");
    if state != "ended" {
        let again = runner(&t, &apply_args(&t, "slurm", "0-1", &[]))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&again.stderr);
        assert_eq!(again.status.code(), Some(2), "{text}");
        assert!(text.contains(&format!("the Slurm job {job} of ")), "{text}");
    }
    wait_for("the job to end", || squeue(&job).is_empty().then_some(()));
    let status = runner(&t, &["status".into(), "smoke".into()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("status   ended:"), "{text}");
    assert!(text.contains("prompts  2 of 2 done"), "{text}");
    // Applying again resubmits nothing and writes the summary.
    let again = runner(&t, &apply_args(&t, "slurm", "0-1", &[]))
        .output()
        .unwrap();
    crate::support::assert_exit_0(&again);
    let run = read_json(&dir.join("run.json"));
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["slurm"]["job_id"], job.as_str(), "no second job");
    assert_eq!(
        records(&dir).len(),
        4,
        "two warmups and two prompts, once each"
    );
    // The apply that collected the run recorded where each task of the detached job ran and
    // how it ended, as an apply that follows its job does.
    let tasks = run["slurm"]["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{run}");
    let host = run["host"].as_str().unwrap();
    for (i, task) in tasks.iter().enumerate() {
        assert_eq!(task["task"], i, "{run}");
        assert_eq!(task["state"], "COMPLETED", "{run}");
        assert_eq!(
            task["node"].as_str(),
            Some(host.split('.').next().unwrap()),
            "{run}"
        );
    }
}

#[test]
fn a_slurm_work_root_under_tmp_is_refused_unless_said_to_be_shared() {
    let t = Test::new();
    let mut args = vec!["apply".to_string(), "--quiet".to_string()];
    args.extend(
        smoke_args(&t, "slurm", "0-1")
            .into_iter()
            .filter(|a| a != "executor.shared_filesystem=true"),
    );
    // The dangling `--set` left by the filter is dropped too.
    if args.last().is_some_and(|a| a == "--set") {
        args.pop();
    }
    let out = runner(&t, &args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !t.path().starts_with("/tmp") {
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is under /tmp") && stderr.contains("executor.shared_filesystem = true"),
        "{stderr}"
    );
    assert!(!t.path().join("results").exists(), "nothing written");
    assert!(!t.path().join("work").exists(), "nothing written");
}

#[test]
fn two_shard_applies_in_separate_processes_make_the_videos_of_one_full_run() {
    let t = Test::new();
    generation(&t, "gen", "0-5");
    let dir = t.path().join("results/gen");
    let shard = |n: &str, root: &str| {
        let args: Vec<String> = [
            "apply",
            "--quiet",
            "gen.toml",
            "--shard",
            n,
            "--set",
            &format!("staging.work_root={}/{root}", t.path().display()),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        spawn(&t, &args)
    };
    // Two applies of one run, each on its own work root, as two machines would run them.
    let first = shard("0", "work-a");
    let second = shard("1", "work-b");
    // While they run, a whole-run apply and an apply of an overlapping range are refused.
    wait_for("both shard applies to hold their shards", || {
        // Each holds its shard's lock, then adds its line to the run's shared lock.
        let holders =
            std::fs::read_to_string(dir.join(".unstep.lock")).map_or(0, |t| t.lines().count());
        (holders >= 2).then_some(())
    });
    for extra in [vec![], vec!["--shard", "0-1"]] {
        let mut args: Vec<String> = ["apply", "--quiet", "gen.toml", "--set"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.push(format!("staging.work_root={}/work-c", t.path().display()));
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = runner(&t, &args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains("is in use by run `gen`"), "{stderr}");
    }
    for child in [first, second] {
        let out = child.wait_with_output().unwrap();
        crate::support::assert_exit_0(&out);
    }
    // The run is whole: each prompt made once, the record says succeeded with both starts.
    assert_eq!(shard_prompts(&dir), vec![0, 1, 2, 3, 4, 5]);
    let run = read_json(&dir.join("run.json"));
    assert_eq!(run["status"], "succeeded", "{run}");
    let status = runner(&t, &["status".into(), "gen".into()])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("prompts  6 of 6 done"),
        "{}",
        String::from_utf8_lossy(&status.stdout)
    );

    let whole = Test::new();
    generation(&whole, "gen", "0-5");
    let out = runner(
        &whole,
        &["apply".into(), "--quiet".into(), "gen.toml".into()],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(videos(&dir), videos(&whole.path().join("results/gen")));
}

#[test]
fn one_shard_alone_leaves_the_run_partial_and_a_bad_range_is_refused() {
    let t = Test::new();
    generation(&t, "gen", "0-5");
    let dir = t.path().join("results/gen");
    let apply = |more: &[&str]| {
        let mut args: Vec<String> = ["apply", "--quiet", "gen.toml"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(more.iter().map(|s| s.to_string()));
        runner(&t, &args).output().unwrap()
    };
    let bad = apply(&["--shard", "2"]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--shard 2: the plan has 2 shard(s), numbered 0 to 1"),
        "{stderr}"
    );
    assert!(!t.path().join("results").exists(), "nothing written");

    // `plan --shard` shows the one shard and its slot's warmup.
    let plan = runner(
        &t,
        &[
            "plan".into(),
            "gen.toml".into(),
            "--shard".into(),
            "1".into(),
        ],
    )
    .output()
    .unwrap();
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(text.contains("shards (1 of 2, contiguous)"), "{text}");
    assert!(text.contains("processes (2;"), "{text}");

    let out = apply(&["--shard", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(shard_prompts(&dir), vec![3, 4, 5]);
    assert_eq!(read_json(&dir.join("run.json"))["status"], "partial");
    // Only shard 1's slot ran: its warmup and the shard.
    let roles: Vec<String> = records(&dir)
        .iter()
        .map(|r| {
            format!(
                "{}:{}",
                r["role"].as_str().unwrap(),
                r["slot"].as_str().unwrap()
            )
        })
        .collect();
    assert!(roles.iter().all(|r| r.ends_with(":cpu1")), "{roles:?}");
}

#[test]
fn slurm_options_sbatch_cannot_take_are_refused_at_their_setting() {
    let t = Test::new().file(
        "bad.toml",
        &format!(
            "extends = \"{}\"\n[executor]\nkind = \"slurm\"\ncpus_per_task = 0\nextra = [\"qos=high\", \"--array=0-3\"]\n",
            repo().join("experiments/smoke.toml").display()
        ),
    );
    let out = t.cmd().args(["plan", "bad.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    for want in [
        "bad.toml:4:17",
        "executor.cpus_per_task is 0",
        "bad.toml:5:9",
        "executor.extra item `qos=high` is not an sbatch option",
        "executor.extra item `--array=0-3`: runner apply sets --array itself",
    ] {
        assert!(out.stderr.contains(want), "{want}\n{}", out.render());
    }
}

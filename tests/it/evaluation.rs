//! How the evaluation command is run and stopped: in a process group of its own, stopped whole
//! at an interrupt (killed when it ignores SIGTERM, at once at a second interrupt), under
//! `evaluation.timeout_seconds`, and once per run when the applies of its shards end together.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use crate::apply::{read_json, spawn_apply, spawn_apply_with};
use crate::support::{Test, processes_with};
use crate::vbench::{BUND, QUOTES, evaluation, extended, mode, status, strs, vbench_generation};

/// A generation of the two standard prompts scored by the stand-in evaluation, plus `extra` in
/// its `[evaluation]` table; its results folder.
fn scored_generation(t: &Test, name: &str, extra: &str) -> std::path::PathBuf {
    let standard = [BUND, QUOTES];
    let ext = extended(&standard);
    vbench_generation(t, name, &strs(&ext), &standard, &(evaluation(t) + extra));
    t.path().join("results").join(name)
}

/// Waits until the run's evaluation log holds `needle`.
fn wait_for_log(run_dir: &Path, needle: &str) {
    let log = run_dir.join("logs/evaluation.log");
    let deadline = Instant::now() + Duration::from_secs(240);
    while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains(needle)) {
        assert!(
            Instant::now() < deadline,
            "the evaluation never printed {needle:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The apply's exit code once it ends, within `limit` (killed and failed otherwise), and how long
/// it took.
fn ends_within(apply: &mut Child, limit: Duration) -> (Option<i32>, Duration) {
    let started = Instant::now();
    loop {
        if let Some(status) = apply.try_wait().unwrap() {
            return (status.code(), started.elapsed());
        }
        if started.elapsed() > limit {
            let _ = apply.kill();
            let _ = apply.wait();
            for pid in processes_with("stand-in-grandchild") {
                // SAFETY: a process this test's evaluation started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            panic!("the apply did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn interrupt(apply: &Child) {
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(apply.id() as libc::pid_t, libc::SIGTERM) };
}

/// Asserts that nothing the evaluation started is left, allowing a moment for killed processes
/// to go.
fn nothing_left(t: &Test) {
    let script = t.path().join("stand_in.py").display().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = [
            processes_with("stand-in-grandchild"),
            processes_with(&script),
        ]
        .concat();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "still running: {left:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An evaluation command that ignores SIGTERM and has started a process of its own: one
/// interrupt ends the apply after the grace period with both gone; a second interrupt ends it at
/// once. Either way the run reads interrupted.
#[test]
fn an_interrupted_evaluation_is_stopped_with_all_it_started_even_when_deaf() {
    let t = Test::new();
    let run_dir = scored_generation(&t, "deaf", "");
    mode(&t, "family");
    let mut apply = spawn_apply(&t, "deaf.toml");
    wait_for_log(&run_dir, "family started");
    interrupt(&apply);
    let (code, _) = ends_within(&mut apply, Duration::from_secs(90));
    assert_eq!(code, Some(130));
    assert_eq!(
        status(&run_dir),
        ("interrupted".into(), "interrupted".into())
    );
    nothing_left(&t);

    // Applied again, only the evaluation runs; two interrupts stop it without the grace period.
    std::fs::remove_file(run_dir.join("logs/evaluation.log")).unwrap();
    let mut apply = spawn_apply(&t, "deaf.toml");
    wait_for_log(&run_dir, "family started");
    interrupt(&apply);
    std::thread::sleep(Duration::from_millis(300));
    interrupt(&apply);
    let (code, took) = ends_within(&mut apply, Duration::from_secs(90));
    assert_eq!(code, Some(130));
    assert!(
        took < Duration::from_secs(10),
        "{took:?}: the second interrupt was not heeded"
    );
    assert_eq!(
        status(&run_dir),
        ("interrupted".into(), "interrupted".into())
    );
    nothing_left(&t);
}

/// `evaluation.timeout_seconds`: a command past it is stopped and the run ends
/// `evaluation_failed` saying so, its videos kept.
#[test]
fn an_evaluation_past_its_timeout_is_stopped_and_the_run_says_why() {
    let t = Test::new();
    let run_dir = scored_generation(&t, "late", "timeout_seconds = 3\n");
    mode(&t, "sleep");
    let started = Instant::now();
    let out = t.cmd().args(["apply", "--quiet", "late.toml"]).run();
    assert_eq!(out.code, 1, "{}", out.render());
    assert!(
        out.stderr.contains("evaluation.timeout_seconds (3 s)"),
        "{}",
        out.render()
    );
    assert!(started.elapsed() < Duration::from_secs(300));
    assert_eq!(
        status(&run_dir),
        ("evaluation_failed".into(), "failed".into())
    );
    let run = read_json(&run_dir.join("run.json"));
    assert!(
        run["failure"].as_str().unwrap().contains("timeout_seconds"),
        "{run}"
    );
    assert_eq!(run["evaluation"]["timeout_seconds"], 3);
    assert_eq!(
        std::fs::read_dir(run_dir.join("videos")).unwrap().count(),
        extended(&[BUND, QUOTES]).len()
    );
    nothing_left(&t);
}

/// Two applies of the two shards that both find every video made: one runs the evaluation,
/// the other says where it runs, and the run is scored once.
#[test]
fn the_applies_of_two_shards_ending_together_evaluate_once() {
    let t = Test::new();
    let run_dir = scored_generation(&t, "pair", "");
    // The second shard's applies stage in a work root of their own, as on another node.
    let work2 = format!(
        "--set=staging.work_root={}",
        t.path().join("work2").display()
    );
    let apply = |shards: &str| {
        t.cmd()
            .args(["apply", "--quiet", "pair.toml", "--shard", shards, &work2])
            .run()
    };
    let out = apply("1");
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(!run_dir.join("logs/evaluation.log").exists());

    mode(&t, "slow 8");
    let mut first = spawn_apply_with(&t, &["pair.toml", "--shard", "0"]);
    wait_for_log(&run_dir, "stand-in evaluation: slow");
    let out = apply("1");
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(
        out.stderr
            .contains("the evaluation runs in another apply of this run"),
        "{}",
        out.render()
    );
    let (code, _) = ends_within(&mut first, Duration::from_secs(240));
    assert_eq!(code, Some(0));
    assert_eq!(status(&run_dir), ("succeeded".into(), "succeeded".into()));
    let ran = std::fs::read_to_string(t.path().join("ran.txt")).unwrap();
    assert_eq!(ran.lines().count(), 1, "evaluations run: {ran}");
}

/// A standard prompt repeated more than VBench's five samples: `runner plan` and `runner apply`
/// warn that the later videos are made but never read by VBench's standard mode.
#[test]
fn samples_vbench_never_reads_are_warned_about_in_plan_and_apply() {
    let t = Test::new();
    let standard = [BUND; 6];
    let ext = extended(&standard);
    vbench_generation(&t, "many", &strs(&ext), &standard, "");
    let plan = t.cmd().args(["plan", "many.toml"]).run();
    assert_eq!(plan.code, 0, "{}", plan.render());
    let warning = "warning: prompts 5 repeat a standard prompt more than 5 times";
    assert!(plan.stdout.contains(warning), "{}", plan.render());
    let out = t
        .cmd()
        .args(["apply", "many.toml", "--set", "prompts.indices=4-5"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(out.stderr.contains(warning), "{}", out.render());
    let out = t
        .cmd()
        .args(["plan", "many.toml", "--set", "prompts.indices=0-4"])
        .run();
    assert!(!out.stdout.contains("warning: prompts"), "{}", out.render());
}

/// `evaluation.timeout_seconds` is bounded (1 to a year): a limit the clock cannot hold is refused
/// by `plan` and `apply` at the value (exit 2, nothing written) instead of panicking once the
/// evaluation starts; a record edited to such a limit is run without a deadline, not a panic.
#[test]
fn an_evaluation_timeout_past_the_clock_is_refused_at_its_value() {
    let t = Test::new();
    let run_dir = scored_generation(&t, "huge", "timeout_seconds = 9223372036854775807\n");
    let located = regex::Regex::new(r"huge\.toml:\d+:\d+").unwrap();
    for command in ["plan", "apply"] {
        let before = crate::support::tree(t.path());
        let out = t.cmd().args([command, "huge.toml"]).run();
        assert_eq!(out.code, 2, "{command}: {}", out.render());
        assert!(
            located.is_match(&out.stderr)
                && out.stderr.contains("9223372036854775807")
                && out.stderr.contains("31536000"),
            "{command}: {}",
            out.render()
        );
        assert_eq!(
            crate::support::tree(t.path()),
            before,
            "{command}: nothing written"
        );
    }

    let path = t.path().join("huge.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace(
            "timeout_seconds = 9223372036854775807",
            "timeout_seconds = 600",
        ),
    )
    .unwrap();
    mode(&t, "scores 1.0");
    let out = t.cmd().args(["apply", "--quiet", "huge.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let mut run = read_json(&run_dir.join("run.json"));
    run["evaluation"]["timeout_seconds"] = serde_json::json!(u64::MAX);
    std::fs::write(run_dir.join("run.json"), run.to_string()).unwrap();
    let out = t.cmd().args(["evaluate", "huge"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert_eq!(status(&run_dir), ("succeeded".into(), "succeeded".into()));
}

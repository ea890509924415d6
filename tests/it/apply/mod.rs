//! `runner apply` end to end on the embedded tiny bundle and the CPU: real worker processes,
//! real locks, real files.

use std::path::{Path, PathBuf};

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{Test, processes_with, repo};

mod attention8;
mod contexts;
mod refusals;

/// A manifest over the tiny bundle with its results, work root and caches inside the test.
pub(crate) fn manifest(t: &Test, kind: &str, extra: &str) -> String {
    let root = t.path();
    format!(
        "kind = \"{kind}\"\n\
         [prompts]\nfile = \"{prompts}\"\n\
         [runtime]\nprovider = \"cpu\"\ncpu_threads_per_process = 1\n\
         [method]\nheight = 64\nwidth = 112\nprecision = \"fp32\"\n\
         [outputs]\ndir = \"{root}/results\"\n\
         [staging]\nwork_root = \"{root}/work\"\n\
         [assets]\nbundle = \"{bundle}\"\n\
         {extra}",
        prompts = repo().join("assets/prompts/tiny.txt").display(),
        bundle = repo().join("assets/tiny").display(),
        root = root.display(),
    )
}

pub(crate) fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

pub(crate) fn records(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("timings.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub(crate) fn shard_prompts(run_dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = records(run_dir)
        .iter()
        .filter(|r| r["role"] == "shard")
        .map(|r| r["prompt"].as_u64().unwrap())
        .collect();
    v.sort();
    v
}

pub(crate) fn videos(run_dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(run_dir.join("videos"))
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

pub(crate) const TWO_SLOTS: &str = "[shards]\ncount = 2\n";

/// A generation of `indices` in two shards over two CPU slots, written to `<name>.toml`.
pub(crate) fn generation(t: &Test, name: &str, indices: &str) -> PathBuf {
    let text = manifest(t, "generation", TWO_SLOTS)
        .replace(
            "[prompts]\n",
            &format!("[prompts]\nindices = \"{indices}\"\n"),
        )
        .replace("[runtime]\n", "[runtime]\ncpu_slots = 2\n");
    let path = t.path().join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_two_slot_generation_makes_every_prompt_once_with_videos_and_records() {
    let t = Test::new();
    generation(&t, "gen", "0-3");
    let out = t.cmd().args(["apply", "--quiet", "gen.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let run_dir = t.path().join("results/gen");
    assert_eq!(shard_prompts(&run_dir), vec![0, 1, 2, 3]);
    assert_eq!(videos(&run_dir).len(), 4);
    let run = read_json(&run_dir.join("run.json"));
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["cache"]["label"], "fresh");
    assert_eq!(run["execution_provider"], "cpu");
    // The snapshot was made (not reused), and how long that took is on record and in the report.
    assert_eq!(run["staging"]["reused"], false, "{run}");
    assert!(run["staging"]["seconds"].as_f64().unwrap() > 0.0, "{run}");
    assert!(
        out.stdout.contains("s before the first worker (")
            && out.stdout.contains("written; every file hashed)"),
        "{}",
        out.stdout
    );
    // The bundle the workers opened, as its bundle.toml says.
    let bundle_toml = std::fs::read_to_string(repo().join("assets/tiny/bundle.toml")).unwrap();
    let exporter = bundle_toml
        .lines()
        .find_map(|l| l.strip_prefix("exporter_version = "))
        .unwrap()
        .trim_matches('"');
    assert_eq!(run["bundle"]["preset"], "tiny", "{run}");
    assert_eq!(run["bundle"]["exporter_version"], exporter, "{run}");
    assert!(
        run["bundle"]["path"].as_str().unwrap().ends_with("tiny"),
        "{run}"
    );
    // Its tokenizer over the run's four prompts, and its seeded random weights.
    let kind = bundle_toml
        .lines()
        .skip_while(|l| *l != "[tokenizer]")
        .find_map(|l| l.strip_prefix("kind = "))
        .unwrap()
        .trim_matches('"');
    let tokenizer = &run["tokenizer"];
    assert_eq!(tokenizer["kind"], kind, "{run}");
    assert_eq!(tokenizer["prompts"], 4, "{run}");
    assert_eq!(
        tokenizer["truncated"].as_u64().unwrap() as usize,
        tokenizer["truncated_prompts"].as_array().unwrap().len(),
        "{run}"
    );
    if kind == "bytes" {
        // Prompts 1 to 3 are longer than the 32 bytes of text_len.
        assert_eq!(tokenizer["truncated_prompts"], serde_json::json!([1, 2, 3]));
    }
    assert_eq!(run["weights"]["source"], "random", "{run}");
    for part in ["dit", "vae", "text_encoder"] {
        assert_eq!(run["weights"][part], "random", "{run}");
    }
    assert!(
        run["attention_backend"]["resolved"]
            .as_str()
            .unwrap()
            .contains("cpu"),
        "{run}"
    );
    let summary = read_json(&run_dir.join("summary.json"));
    for stat in [
        "raw_mean",
        "warm_mean_excluding_first",
        "min_after_first",
        "steady_tail_mean",
    ] {
        assert!(
            summary["timed_total"][stat].as_f64().unwrap() > 0.0,
            "{stat}"
        );
    }
    // Both slots worked, each with its own isolated cache.
    let slots: std::collections::BTreeSet<String> = records(&run_dir)
        .iter()
        .map(|r| r["slot"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(slots.len(), 2, "{slots:?}");
    assert!(run_dir.join("runtime_state/cpu0").is_dir());
    assert!(run_dir.join("runtime_state/cpu1").is_dir());
    // Each process's first record carries its start (ready after its sessions, which took part
    // of that time), the others none; the CPU does no one-time work of the GPU kinds.
    let mut seen = std::collections::BTreeSet::new();
    for r in records(&run_dir) {
        let start = &r["process_start"];
        assert!(r.get("one_time").is_none(), "{r}");
        if !seen.insert(r["process"].as_u64().unwrap()) {
            assert!(start.is_null(), "only a process's first prompt has it: {r}");
            continue;
        }
        let ready = start["ready_s"].as_f64().unwrap();
        let sessions = start["dit_sessions_s"].as_f64().unwrap()
            + start["decoder_sessions_s"].as_f64().unwrap()
            + start["text_encoder_s"].as_f64().unwrap();
        // The bundle check comes before the sessions, apart from them.
        let bundle_check = start["bundle_check_s"].as_f64().unwrap();
        assert!(
            sessions > 0.0 && bundle_check > 0.0 && ready >= sessions + bundle_check,
            "{r}"
        );
    }
    assert!(
        seen.len() >= 4,
        "two warmups and two shards at least: {seen:?}"
    );
    assert!(
        out.stdout.contains("first prompt of each process")
            && out.stdout.contains("(warmup, cpu0): ready in "),
        "{}",
        out.stdout
    );
    // Success removes the staging snapshot and releases the lock.
    assert!(!t.path().join("work/gen").exists());
    assert!(
        out.stdout.contains("warm_mean_excluding_first"),
        "{}",
        out.stdout
    );
    // The report names the warmup's default prompts rather than "default".
    assert!(
        out.stdout
            .contains("before measurement, on the first prompt of each slot's first shard"),
        "{}",
        out.stdout
    );
}

/// A probe of prompt 0 with one warmup repeat, written to `one.toml`.
fn one_prompt_probe(t: &Test) {
    std::fs::write(
        t.path().join("one.toml"),
        manifest(t, "probe", "[warmup]\nrepeats = 1\n")
            .replace("[prompts]\n", "[prompts]\nindices = \"0\"\n"),
    )
    .unwrap();
}

/// A probe whose first apply already asks to reuse the runtime state measures afresh and keeps
/// no earlier measurement: there is none, so no empty `previous/1/` is made.
#[test]
fn a_probes_first_apply_with_reuse_runtime_state_keeps_no_empty_previous() {
    let t = Test::new();
    one_prompt_probe(&t);
    let out = t
        .cmd()
        .env("UNSTEP_REUSE_RUNTIME_STATE", "1")
        .args(["apply", "--quiet", "one.toml"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let run_dir = t.path().join("results/one");
    assert!(run_dir.join("summary.json").is_file());
    assert!(
        !run_dir.join("previous").exists(),
        "an empty previous/ was made"
    );
}

#[test]
fn a_one_prompt_probe_has_na_where_statistics_have_no_inputs() {
    let t = Test::new();
    one_prompt_probe(&t);
    let out = t.cmd().args(["apply", "--quiet", "one.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let run_dir = t.path().join("results/one");
    let s = read_json(&run_dir.join("summary.json"));
    let total = &s["timed_total"];
    assert!(total["warm_mean_excluding_first"].is_null());
    assert!(total["min_after_first"].is_null());
    let measured: Vec<f64> = records(&run_dir)
        .iter()
        .filter(|r| r["role"] == "measurement")
        .map(|r| r["timed_total_s"].as_f64().unwrap())
        .collect();
    assert_eq!(measured.len(), 1);
    assert_eq!(total["raw_mean"].as_f64(), Some(measured[0]));
    assert_eq!(total["steady_tail_mean"].as_f64(), Some(measured[0]));
    assert!(out.stdout.contains("n/a"), "{}", out.stdout);
    // The warmup ran in its own process before the measurement.
    let roles: Vec<String> = records(&run_dir)
        .iter()
        .map(|r| r["role"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(roles, vec!["warmup", "measurement"]);

    // Its compiler state now exists: applying again is refused with the fix named.
    let again = t.cmd().args(["apply", "--quiet", "one.toml"]).run();
    assert_eq!(again.code, 2, "{}", again.render());
    assert!(
        again.stderr.contains("runtime state already exists"),
        "{}",
        again.stderr
    );
    assert!(
        again.stderr.contains("reuse_runtime_state"),
        "{}",
        again.stderr
    );
    // `plan` says the same before any apply, and what reusing the state would do.
    let plan = t.cmd().args(["plan", "one.toml"]).run();
    assert!(
        plan.stdout
            .contains("(apply will refuse: runtime state already exists at "),
        "{}",
        plan.render()
    );
    let plan = t
        .cmd()
        .env("UNSTEP_REUSE_RUNTIME_STATE", "1")
        .args(["plan", "one.toml"])
        .run();
    assert!(
        plan.stdout
            .contains("(exists: apply measures the probe afresh)"),
        "{}",
        plan.render()
    );
    let reuse = t
        .cmd()
        .env("UNSTEP_REUSE_RUNTIME_STATE", "1")
        .args(["apply", "--quiet", "one.toml"])
        .run();
    assert_eq!(reuse.code, 0, "{}", reuse.render());
    // The earlier measurement is kept beside the new one, and the new one, made on the state
    // the first left, is labelled warm-cache, not fresh.
    let kept = std::fs::read_to_string(run_dir.join("previous/1/timings.jsonl")).unwrap();
    assert_eq!(kept.lines().count(), 2, "{kept}");
    assert_eq!(
        read_json(&run_dir.join("previous/1/summary.json"))["cache_label"],
        "fresh"
    );
    assert_eq!(
        read_json(&run_dir.join("summary.json"))["cache_label"],
        "warm-cache"
    );
    assert_eq!(
        read_json(&run_dir.join("run.json"))["cache"]["label"],
        "warm-cache"
    );
}

/// Starts `runner apply --quiet MANIFEST` in the test's folder without waiting for it.
pub(crate) fn spawn_apply(t: &Test, manifest: &str) -> std::process::Child {
    spawn_apply_with(t, &[manifest])
}

/// `runner apply --quiet ARGS` started in the background, its stderr piped.
pub(crate) fn spawn_apply_with(t: &Test, args: &[&str]) -> std::process::Child {
    t.command(env!("CARGO_BIN_EXE_runner"))
        .args(["apply", "--quiet"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The pid of the worker process running spec `NNN.json` of a run, if it is alive.
pub(crate) fn worker_pid(spec: &Path) -> Option<i32> {
    processes_with(&format!(" worker --spec {}", spec.display()))
        .first()
        .copied()
}

#[test]
fn a_killed_worker_fails_the_run_and_re_applying_resumes_to_identical_videos() {
    let t = Test::new();
    let path = generation(&t, "crash", "0-5");
    // An evaluation follows the complete generation only: not the failed apply, the resumed one.
    // The tiny bundle's random weights are scored on purpose.
    let mut text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("[assets]\n", "[assets]\nallow_random_weights = true\n");
    text.push_str(&format!(
        "[evaluation]\ncommand = [\"{}\", \"-c\", \"import json, sys; \
         json.dump({{'color': 0.5}}, open(sys.argv[1], 'w'))\", \"{{scores_file}}\"]\n\
         dimensions = [\"color\"]\n",
        crate::support::python().display()
    ));
    std::fs::write(&path, text).unwrap();
    let run_dir = t.path().join("results/crash");
    let child = spawn_apply(&t, "crash.toml");
    // Shard 1 runs on slot cpu1 as process 3 (after that slot's warmup, process 2). Kill it
    // once it has finished one prompt.
    let timings = run_dir.join("timings/003.jsonl");
    let spec = run_dir.join("specs/003.json");
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        assert!(Instant::now() < deadline, "shard 1 never finished a prompt");
        let done = std::fs::read_to_string(&timings)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if done >= 1
            && let Some(pid) = worker_pid(&spec)
        {
            // SAFETY: killing a process this test started (through the runner).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("shard 1"), "{stderr}");
    let run = read_json(&run_dir.join("run.json"));
    assert_eq!(run["status"], "failed");
    assert!(run["failure"].as_str().unwrap().contains("shard 1"));
    assert_eq!(run["evaluation"]["status"], "not_run", "{run}");
    assert!(!run_dir.join("logs/evaluation.log").exists());
    let refused = t.cmd().args(["evaluate", "crash"]).run();
    assert_eq!(refused.code, 2, "{}", refused.render());
    assert!(
        refused
            .stderr
            .contains("has status failed: its videos are not complete"),
        "{}",
        refused.render()
    );
    // Shard 0 (slot cpu0) was not disturbed.
    let before: Vec<u64> = shard_prompts(&run_dir);
    for p in 0..3 {
        assert!(
            before.contains(&p),
            "shard 0 finished prompt {p}: {before:?}"
        );
    }
    assert!(before.len() >= 4 && before.len() < 6, "{before:?}");

    // `plan` tells what a re-apply would do: resume with the missing prompts; a changed
    // configuration under the same name would be refused.
    let plan = t.cmd().args(["plan", "crash.toml"]).run();
    assert_eq!(plan.code, 0, "{}", plan.render());
    let want = format!(
        "exists: {} of 6 prompts done; apply resumes with the other {})",
        before.len(),
        6 - before.len()
    );
    assert!(plan.stdout.contains(&want), "{want}\n{}", plan.render());
    let changed = t
        .cmd()
        .args(["plan", "crash.toml", "--set", "method.height=128"])
        .run();
    assert!(
        changed.stdout.contains("(apply will refuse: ")
            && changed.stdout.contains("different configuration"),
        "{}",
        changed.render()
    );

    // Re-applying resumes: the kept staging is reused (its audit matches), only the missing
    // prompts are generated. This apply runs with a diagnostic switch on (one that changes
    // nothing on the CPU), which the run's record then names.
    assert!(run.get("diagnostics").is_none(), "{run}");
    // The failure printed the command that resumes it, and that is what runs.
    let resume: Vec<&str> = stderr
        .lines()
        .find_map(|l| l.strip_prefix("  runner "))
        .unwrap_or_else(|| panic!("no command to resume: {stderr}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        resume,
        ["apply", "--quiet", "crash.toml", "--reuse-workdir"]
    );
    let again = t.cmd().args(resume).env("UNSTEP_CONV_LOG", "1").run();
    assert_eq!(again.code, 0, "{}", again.render());
    let after = shard_prompts(&run_dir);
    assert_eq!(
        after,
        vec![0, 1, 2, 3, 4, 5],
        "every prompt once: nothing regenerated"
    );
    // The record is the same run's: its first start is kept, the resumption is listed, and
    // `runner report` says so.
    let resumed = read_json(&run_dir.join("run.json"));
    assert_eq!(resumed["status"], "succeeded");
    assert_eq!(resumed["evaluation"]["scores"]["color"], 0.5, "{resumed}");
    assert_eq!(resumed["started_at"], run["started_at"]);
    let resumptions = resumed["resumed_at"].as_array().unwrap();
    assert_eq!(resumptions.len(), 1, "{resumed}");
    assert!(resumptions[0].as_str().unwrap() >= run["started_at"].as_str().unwrap());
    assert_eq!(
        resumed["diagnostics"],
        serde_json::json!(["UNSTEP_CONV_LOG=1"]),
        "{resumed}"
    );
    assert_eq!(resumed["staging"]["reused"], true, "{resumed}");
    let report = t.cmd().args(["report", "crash"]).run();
    assert!(
        report.stdout.contains("(resumed at ")
            && report
                .stdout
                .contains("  diagnostics   UNSTEP_CONV_LOG=1 (times measured with diagnostics on)")
            && report
                .stdout
                .contains("s before the first worker (the kept snapshot hashed again and reused)"),
        "{}",
        report.render()
    );
    let plan = t.cmd().args(["plan", "crash.toml"]).run();
    assert!(
        plan.stdout
            .contains("(exists: all 6 prompts done; apply resumes and generates nothing)"),
        "{}",
        plan.render()
    );

    // The videos equal those of an uninterrupted run of the same prompts.
    let clean = Test::new();
    generation(&clean, "crash", "0-5");
    let out = clean.cmd().args(["apply", "--quiet", "crash.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert_eq!(
        videos(&run_dir),
        videos(&clean.path().join("results/crash"))
    );
}

#[test]
fn a_second_probe_on_a_held_work_root_is_refused_at_once_and_separate_roots_both_finish() {
    let t = Test::new();
    let probe = |name: &str, work: &str| {
        let text = manifest(&t, "probe", "[warmup]\nrepeats = 0\n")
            .replace("[prompts]\n", "[prompts]\nindices = \"0-3\"\n")
            .replace(
                &format!("{}/work", t.path().display()),
                &format!("{}/{work}", t.path().display()),
            );
        std::fs::write(t.path().join(format!("{name}.toml")), text).unwrap();
    };
    probe("first", "work");
    probe("second", "work");
    probe("third", "work3");
    let spawn = |name: &str| spawn_apply(&t, &format!("{name}.toml"));
    let mut first = spawn("first");
    let lock = t.path().join("work/.unstep.lock");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&lock)
        .unwrap_or_default()
        .contains("run=first")
    {
        assert!(
            Instant::now() < deadline,
            "the first probe never took the lock"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let second = t.cmd().args(["apply", "--quiet", "second.toml"]).run();
    // "At once": the refusal came while the first probe still held the lock, not after it.
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first probe was still running"
    );
    assert_eq!(second.code, 2, "{}", second.render());
    assert!(
        second.stderr.contains("in use by run `first`"),
        "{}",
        second.stderr
    );
    assert!(
        !t.path().join("results/second").exists(),
        "the refused run wrote nothing"
    );
    let third = spawn("third");
    let first = first.wait_with_output().unwrap();
    let third = third.wait_with_output().unwrap();
    crate::support::assert_exit_0(&first);
    crate::support::assert_exit_0(&third);
    let first_run = read_json(&t.path().join("results/first/run.json"));
    assert_eq!(first_run["status"], "succeeded");
}

#[test]
fn shared_caches_skip_warmups_with_markers_and_are_labelled_warm_cache() {
    let t = Test::new();
    let shared = format!(
        "[cache]\nmode = \"shared\"\nshared_state_dir = \"{}/shared\"\n",
        t.path().display()
    );
    for name in ["warm1", "warm2"] {
        let text = manifest(&t, "generation", &format!("{TWO_SLOTS}{shared}"))
            .replace("[prompts]\n", "[prompts]\nindices = \"0-1\"\n")
            .replace("[runtime]\n", "[runtime]\ncpu_slots = 2\n");
        std::fs::write(t.path().join(format!("{name}.toml")), text).unwrap();
    }
    let first = t.cmd().args(["apply", "--quiet", "warm1.toml"]).run();
    assert_eq!(first.code, 0, "{}", first.render());
    let warmups = |run: &str| {
        records(&t.path().join("results").join(run))
            .iter()
            .filter(|r| r["role"] == "warmup")
            .count()
    };
    assert_eq!(warmups("warm1"), 2, "one warmup per shard, markers written");
    assert!(t.path().join("shared/shard0/warmup.done").is_file());
    let second = t.cmd().args(["apply", "--quiet", "warm2.toml"]).run();
    assert_eq!(second.code, 0, "{}", second.render());
    assert_eq!(warmups("warm2"), 0, "existing markers skip the warmups");
    for run in ["warm1", "warm2"] {
        let summary = read_json(&t.path().join("results").join(run).join("summary.json"));
        assert_eq!(summary["cache_label"], "warm-cache", "{run}");
    }
}

#[test]
fn an_interrupted_run_stops_its_workers_and_resumes_on_the_next_apply() {
    let t = Test::new();
    generation(&t, "stop", "0-5");
    let run_dir = t.path().join("results/stop");
    let child = spawn_apply(&t, "stop.toml");
    let deadline = Instant::now() + Duration::from_secs(240);
    while std::fs::read_to_string(run_dir.join("timings/001.jsonl"))
        .map_or(0, |t| t.lines().count())
        == 0
    {
        assert!(Instant::now() < deadline, "shard 0 never finished a prompt");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: interrupting the runner this test started, as Ctrl-C would.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert_eq!(
        read_json(&run_dir.join("run.json"))["status"],
        "interrupted"
    );
    let partial = shard_prompts(&run_dir);
    assert!(!partial.is_empty() && partial.len() < 6, "{partial:?}");
    assert!(
        worker_pid(&run_dir.join("specs/001.json")).is_none(),
        "workers stopped"
    );
    assert!(
        !t.path().join("work/stop").exists(),
        "staging removed, lock released"
    );

    let again = t.cmd().args(["apply", "--quiet", "stop.toml"]).run();
    assert_eq!(again.code, 0, "{}", again.render());
    assert_eq!(shard_prompts(&run_dir), vec![0, 1, 2, 3, 4, 5]);
}

#[test]
fn probe_debug_videos_are_written_to_the_temporary_folder_and_deleted_after_each_process() {
    let t = Test::new();
    let text = manifest(&t, "probe", "[warmup]\nrepeats = 1\n")
        .replace("[prompts]\n", "[prompts]\nindices = \"0-1\"\n");
    std::fs::write(t.path().join("dbg.toml"), text).unwrap();
    let tmp = t.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out = t
        .cmd()
        .env("TMPDIR", tmp.to_str().unwrap())
        .env("UNSTEP_EXTRA_ARGS", "--save-videos")
        .args(["apply", "--quiet", "dbg.toml"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let debug = tmp.join("unstep_wrapper_generation_outputs/dbg/indexed_videos");
    let measured: Vec<serde_json::Value> = records(&t.path().join("results/dbg"))
        .into_iter()
        .filter(|r| r["role"] == "measurement")
        .collect();
    assert_eq!(measured.len(), 2);
    for r in &measured {
        let video = r["video"].as_str().expect("a debug video was written");
        assert!(Path::new(video).starts_with(&debug), "{video}");
        assert!(video.ends_with(".mp4"));
    }
    assert!(
        !debug.exists(),
        "debug videos are deleted after the probe process"
    );
    assert!(
        !t.path().join("results/dbg/videos").exists(),
        "a probe keeps no videos"
    );
}

/// A resume checks each prompt's text: a prompt edited since its video was made is made again
/// (its old video removed, with a warning naming it), the others are skipped.
#[test]
fn a_prompt_whose_text_changed_is_generated_again_on_resume() {
    let tiny = std::fs::read_to_string(repo().join("assets/prompts/tiny.txt")).unwrap();
    let t = Test::new().file("p.txt", &tiny);
    let path = generation(&t, "edit", "0-1");
    let prompts = t.path().join("p.txt");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        &repo().join("assets/prompts/tiny.txt").display().to_string(),
        &prompts.display().to_string(),
    );
    std::fs::write(&path, text).unwrap();
    let run_dir = t.path().join("results/edit");
    let first = t.cmd().args(["apply", "--quiet", "edit.toml"]).run();
    assert_eq!(first.code, 0, "{}", first.render());
    assert_eq!(shard_prompts(&run_dir), [0, 1]);
    let before: Vec<String> = videos(&run_dir).into_iter().map(|(n, _)| n).collect();
    assert_eq!(before.len(), 2, "{before:?}");

    let mut lines: Vec<&str> = tiny.lines().collect();
    lines[1] = "a red kite over a grey sea";
    std::fs::write(&prompts, lines.join("\n") + "\n").unwrap();
    let second = t.cmd().args(["apply", "--quiet", "edit.toml"]).run();
    assert_eq!(second.code, 0, "{}", second.render());
    assert!(
        second.stderr.contains("prompt(s) 1 in") && second.stderr.contains("generated again"),
        "{}",
        second.render()
    );
    // Prompt 1 made twice, prompt 0 once; the old video of prompt 1 is gone.
    assert_eq!(shard_prompts(&run_dir), [0, 1, 1]);
    let after: Vec<String> = videos(&run_dir).into_iter().map(|(n, _)| n).collect();
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(after.contains(&before[0]) || after.contains(&before[1]));
    assert!(
        after.iter().any(|n| n.starts_with("a red kite")),
        "{after:?}"
    );

    // With the text unchanged, nothing is made again.
    let third = t.cmd().args(["apply", "--quiet", "edit.toml"]).run();
    assert_eq!(third.code, 0, "{}", third.render());
    assert!(
        !third.stderr.contains("generated again"),
        "{}",
        third.render()
    );
    assert_eq!(shard_prompts(&run_dir), [0, 1, 1]);
}

/// A small tmpfs mounted for one test, unmounted when dropped. Mounting needs root (CI runs as
/// root); elsewhere `None`, and the test says it was skipped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A bundle on the work root's file system is staged by link, not copied: the run's record says
/// so, and the work root's file system did not grow by the bundle's size during the run (the
/// staged bundle shares the source's files).
#[test]
fn a_bundle_on_the_work_roots_file_system_is_staged_without_a_second_copy() {
    use std::os::unix::fs::MetadataExt;
    let t = Test::new();
    let bundle = t.path().join("bundle");
    crate::support::copy_tiny_bundle(&bundle);
    let text = manifest(&t, "probe", "[warmup]\nrepeats = 0\n")
        .replace("[prompts]\n", "[prompts]\nindices = \"0\"\n")
        .replace(
            &format!("bundle = \"{}\"", repo().join("assets/tiny").display()),
            &format!("bundle = \"{}\"", bundle.display()),
        );
    std::fs::write(t.path().join("linked.toml"), text).unwrap();
    let files = crate::support::tree(&bundle).len();
    let out = t.cmd().args(["apply", "--quiet", "linked.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let run = read_json(&t.path().join("results/linked/run.json"));
    let placements = &run["staging"]["placements"];
    let linked =
        placements["hard_linked"].as_u64().unwrap() + placements["reflinked"].as_u64().unwrap();
    // Every bundle file, and the runner where it shares the file system.
    let runner_same_fs = std::fs::metadata(env!("CARGO_BIN_EXE_runner"))
        .unwrap()
        .dev()
        == std::fs::metadata(t.path()).unwrap().dev();
    assert_eq!(
        linked,
        files as u64 + u64::from(runner_same_fs),
        "{placements}"
    );
    assert!(
        placements["copied_bytes"].as_u64().unwrap() < 64 * 1024,
        "only the prompts and manifests are written: {placements}"
    );
    let report = t.cmd().args(["report", "linked"]).run();
    assert!(
        report.stdout.contains("file(s) hard-linked") || report.stdout.contains("reflinked"),
        "{}",
        report.stdout
    );
    // The source bundle's files were linked: their link count went up while staged, and is
    // back to one now that the successful probe removed its staging.
    let dit = std::fs::metadata(bundle.join("dit.onnx")).unwrap();
    assert_eq!(dit.nlink(), 1);
}

/// Rewrites `path` in place (the same inode, the same size) with `bytes`, then sets its
/// modification time back, as `rsync --inplace -t` or `touch -r` leave a file.
fn rewrite_keeping_mtime(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let before = std::fs::metadata(path).unwrap();
    assert_eq!(before.len(), bytes.len() as u64);
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
    f.set_modified(before.modified().unwrap()).unwrap();
}

/// The bundle's tokenizer rewritten in place through the source while a run uses its hard-linked
/// snapshot, its size kept and its modification time set back: the shard that starts after it
/// refuses the file, and the run fails naming it instead of recording the audited tokenizer for
/// videos made with another.
#[test]
fn a_bundle_file_rewritten_during_a_run_with_its_mtime_set_back_fails_the_run() {
    use std::os::unix::fs::MetadataExt;
    let t = Test::new();
    let bundle = t.path().join("bundle");
    crate::support::copy_tiny_bundle(&bundle);
    // Two shards of three prompts one after the other on one slot.
    let text = manifest(&t, "generation", TWO_SLOTS)
        .replace("[prompts]\n", "[prompts]\nindices = \"0-5\"\n")
        .replace("[runtime]\n", "[runtime]\ncpu_slots = 1\n")
        .replace(
            &format!("bundle = \"{}\"", repo().join("assets/tiny").display()),
            &format!("bundle = \"{}\"", bundle.display()),
        );
    std::fs::write(t.path().join("rewritten.toml"), text).unwrap();
    let run_dir = t.path().join("results/rewritten");
    let child = spawn_apply(&t, "rewritten.toml");
    // Once the first shard has made a prompt, the second has not started.
    let deadline = Instant::now() + Duration::from_secs(240);
    while !std::fs::read_to_string(run_dir.join("timings.jsonl"))
        .unwrap_or_default()
        .contains("\"role\":\"shard\"")
        && !std::fs::read_dir(run_dir.join("timings"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                std::fs::read_to_string(e.path())
                    .unwrap_or_default()
                    .contains("\"role\":\"shard\"")
            })
    {
        assert!(Instant::now() < deadline, "no shard finished a prompt");
        std::thread::sleep(Duration::from_millis(20));
    }
    let tokenizer = bundle.join("tokenizer.json");
    let linked = std::fs::metadata(&tokenizer).unwrap().nlink() > 1;
    let original = std::fs::read_to_string(&tokenizer).unwrap();
    let other = original.replacen("\"▁the\"", "\"▁thE\"", 1);
    assert_ne!(other, original);
    rewrite_keeping_mtime(&tokenizer, other.as_bytes());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let run = read_json(&run_dir.join("run.json"));
    if !linked {
        eprintln!("note: the file system reflinks; the snapshot does not share the source's file");
        assert_eq!(run["status"], "succeeded", "{stderr}");
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("bundle file(s) tokenizer.json changed after staging"),
        "{stderr}"
    );
    assert_eq!(run["status"], "failed", "{run}");
    assert!(
        run["failure"]
            .as_str()
            .unwrap()
            .contains("tokenizer.json changed after staging"),
        "{run}"
    );
}

/// A generation of fewer prompts than shards runs: the empty shards have no process, the plan
/// says they are skipped, and the prompt gets the video it gets in any other layout.
#[test]
fn a_generation_of_fewer_prompts_than_shards_skips_the_empty_ones() {
    let t = Test::new();
    generation(&t, "few", "3");
    let plan = t.cmd().args(["plan", "few.toml"]).run();
    assert_eq!(plan.code, 0, "{}", plan.render());
    assert!(
        plan.stdout
            .contains("1 prompt(s) over 2 shards leave shard(s) 1 without prompts"),
        "{}",
        plan.stdout
    );
    let out = t.cmd().args(["apply", "--quiet", "few.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let run_dir = t.path().join("results/few");
    assert_eq!(shard_prompts(&run_dir), vec![3]);
    assert_eq!(videos(&run_dir).len(), 1);
    assert_eq!(read_json(&run_dir.join("run.json"))["status"], "succeeded");
}

/// A generation's worker keeps each prompt (its video encoded, its record written) on a thread
/// beside the next prompt's generation: a video that cannot be written fails the run with its
/// path, the prompts before it stay recorded with their videos, none after it is recorded, and
/// applying again makes the rest.
#[test]
fn a_video_that_cannot_be_written_stops_the_shard_after_the_prompts_before_it() {
    use unstep::results::names::video_name;
    let t = Test::new();
    let text = manifest(&t, "generation", "[shards]\ncount = 1\n")
        .replace("[prompts]\n", "[prompts]\nindices = \"0-3\"\n");
    std::fs::write(t.path().join("gen.toml"), text).unwrap();
    let prompts = std::fs::read_to_string(repo().join("assets/prompts/tiny.txt")).unwrap();
    let second = prompts.lines().nth(1).unwrap();
    let name = video_name(unstep::manifest::VideoNaming::Vbench, 1, second);
    let blocked = t.path().join("results/gen/videos").join(&name);
    std::fs::create_dir_all(blocked.join("occupied")).unwrap();
    let out = t.cmd().args(["apply", "--quiet", "gen.toml"]).run();
    assert_ne!(out.code, 0, "{}", out.render());
    assert!(out.stderr.contains(&name), "{}", out.render());
    let run_dir = t.path().join("results/gen");
    assert_eq!(
        shard_prompts(&run_dir),
        vec![0],
        "only the prompt before the failure"
    );
    assert_eq!(
        videos_named(&run_dir).len(),
        1,
        "{:?}",
        videos_named(&run_dir)
    );
    std::fs::remove_dir_all(&blocked).unwrap();
    let again = t
        .cmd()
        .args(["apply", "--quiet", "--reuse-workdir", "gen.toml"])
        .run();
    assert_eq!(again.code, 0, "{}", again.render());
    assert_eq!(shard_prompts(&run_dir), vec![0, 1, 2, 3]);
    assert_eq!(videos_named(&run_dir).len(), 4);
}

/// The names of the files in a run's `videos/`.
fn videos_named(run_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(run_dir.join("videos"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `apply --json` prints the run's record as `run.json` holds it once the apply is done.
#[test]
fn apply_json_prints_the_runs_record() {
    let t = Test::new();
    one_prompt_probe(&t);
    let out = t
        .cmd()
        .args(["apply", "--quiet", "--json", "one.toml"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let printed: serde_json::Value = serde_json::from_str(&out.stdout).expect("one JSON value");
    assert_eq!(printed["status"], "succeeded", "{}", out.stdout);
    assert_eq!(printed, read_json(&t.path().join("results/one/run.json")));
}

//! Clauses of the benchmark guide, each against real `runner` processes on the tiny bundle.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::apply::{read_json, spawn_apply, worker_pid};
use crate::support::{Test, repo, tree};

/// A one-prompt manifest of `kind` over the tiny bundle, with its results and work root inside
/// the test.
fn manifest(t: &Test, kind: &str, extra: &str) -> String {
    crate::apply::manifest(t, kind, extra).replace("[prompts]\n", "[prompts]\nindices = \"0\"\n")
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// `cache.clear_global` (`UNSTEP_CLEAR_GLOBAL_RUNTIME_CACHES=1`) removes CUDA's JIT caches, at
/// `~/.nv/ComputeCache` and where `CUDA_CACHE_PATH` points, and nothing beside them; off (the
/// default, or `=0`) it removes nothing; `runner plan` names the folders and says to opt in only
/// when no other jobs use them; a `CUDA_CACHE_PATH` that would take more than a cache with it is
/// refused before anything is written.
#[test]
fn clearing_global_caches_removes_cudas_jit_caches_and_nothing_beside_them() {
    let t = Test::new();
    let root = t.path();
    let home = root.join("home");
    let jit = root.join("jit");
    let purged = [
        "home/.nv/ComputeCache/index",
        "home/.nv/ComputeCache/8f/kernel.bin",
        "jit/index",
        "jit/2a/kernel.bin",
    ];
    let kept = [
        "home/.nv/nvidia-application-profile-globals-rc",
        "home/.nv/ComputeCache.old/kernel.bin",
        "home/.cache/nvidia/GLCache/shader.bin",
        "home/.cache/nvidia/ComputeCache/kernel.bin",
        "home/.cache/torch/kernels/k.bin",
        "home/.triton/cache/k.bin",
        "jit-other/index",
    ];
    for f in purged.iter().chain(&kept) {
        write(&root.join(f), "cache entry");
    }
    write(
        &root.join("p.toml"),
        &manifest(&t, "probe", "[warmup]\nrepeats = 0\n"),
    );
    let home_s = home.display().to_string();
    let xdg = home.join(".cache").display().to_string();
    let jit_s = jit.display().to_string();
    let with_env = |clear: &str, args: &[&str]| {
        t.cmd()
            .args(args.iter().copied())
            .env("HOME", &home_s)
            .env("XDG_CACHE_HOME", &xdg)
            .env("CUDA_CACHE_PATH", &jit_s)
            .env("UNSTEP_CLEAR_GLOBAL_RUNTIME_CACHES", clear)
            .run()
    };
    // Which of the files put there are still there (ONNX Runtime may add files of its own
    // under the home folder, which are no concern here).
    let all_files = || {
        let mut files: Vec<String> = purged
            .iter()
            .chain(&kept)
            .filter(|f| root.join(f).exists())
            .map(|f| f.to_string())
            .collect();
        files.sort();
        files
    };
    let mut everything: Vec<String> = purged.iter().chain(&kept).map(|f| f.to_string()).collect();
    everything.sort();
    assert_eq!(all_files(), everything);

    // The plan names what would go, and when to opt in.
    let plan = with_env("1", &["plan", "p.toml"]);
    assert_eq!(plan.code, 0, "{}", plan.render());
    let note = plan
        .stdout
        .lines()
        .find(|l| l.starts_with("global caches"))
        .unwrap_or_else(|| panic!("no note on global caches:\n{}", plan.stdout));
    // Paths below the current folder (the test's) are shown relative to it.
    assert!(
        note.contains("CUDA's JIT caches home/.nv/ComputeCache and jit;")
            && note.contains("opt in only when no other jobs use those caches"),
        "{note}"
    );
    assert!(
        plan.stdout.contains("global caches purged first"),
        "{}",
        plan.stdout
    );
    let off = with_env("0", &["plan", "p.toml"]);
    assert!(!off.stdout.contains("global caches"), "{}", off.stdout);

    // Off: nothing global is touched.
    let out = with_env("0", &["apply", "--quiet", "p.toml"]);
    assert_eq!(out.code, 0, "{}", out.render());
    assert_eq!(all_files(), everything);

    // A CUDA_CACHE_PATH that is $HOME itself would take the home folder with it: refused at the
    // setting, before anything is written or removed.
    write(
        &root.join("q.toml"),
        &manifest(&t, "probe", "[warmup]\nrepeats = 0\n"),
    );
    let refused = t
        .cmd()
        .args(["apply", "--quiet", "q.toml"])
        .env("HOME", &home_s)
        .env("CUDA_CACHE_PATH", &home_s)
        .env("UNSTEP_CLEAR_GLOBAL_RUNTIME_CACHES", "1")
        .run();
    assert_eq!(refused.code, 2, "{}", refused.render());
    assert!(
        refused
            .stderr
            .contains("cache.clear_global would remove home, a broad root")
            && refused
                .stderr
                .contains("env UNSTEP_CLEAR_GLOBAL_RUNTIME_CACHES")
            && refused
                .stderr
                .contains("hint: point CUDA_CACHE_PATH at a folder"),
        "{}",
        refused.render()
    );
    assert!(!root.join("results/q").exists() && !root.join("work/q").exists());
    assert_eq!(all_files(), everything);

    // On: exactly the two JIT caches go.
    let out = with_env(
        "1",
        &["apply", "--quiet", "--set", "name=cleared", "p.toml"],
    );
    assert_eq!(out.code, 0, "{}", out.render());
    for dir in ["home/.nv/ComputeCache", "jit"] {
        assert!(
            out.stderr
                .contains(&format!("purged the global compiler cache {dir}\n")),
            "{}",
            out.render()
        );
        assert!(!root.join(dir).exists(), "{dir} removed");
    }
    let mut left: Vec<String> = kept.iter().map(|f| f.to_string()).collect();
    left.sort();
    assert_eq!(all_files(), left);
    let run = read_json(&root.join("results/cleared/run.json"));
    assert_eq!(run["cache"]["clear_global"], true, "{run}");
}

/// A folder that overlaps the checkout the command runs in names the checkout's path (not an
/// empty name, which is what the current folder is relative to itself).
#[test]
fn an_overlap_with_the_checkout_one_stands_in_names_its_path() {
    let t = Test::new().file("project/.git/HEAD", "ref: refs/heads/main\n");
    let project = t.path().join("project");
    let text = manifest(&t, "probe", "").replace(
        &format!("work_root = \"{}/work\"", t.path().display()),
        "work_root = \"../tmp/unstep_smoke_stage\"",
    );
    write(&project.join("experiments/smoke.toml"), &text);
    let t = t.cwd(&project);
    for command in ["plan", "apply"] {
        let out = t.cmd().args([command, "experiments/smoke.toml"]).run();
        assert_eq!(out.code, 2, "{}", out.render());
        let line = out
            .stderr
            .lines()
            .find(|l| l.contains("overlaps the source checkout"))
            .unwrap_or_else(|| panic!("{}", out.render()));
        let named = line
            .split("overlaps the source checkout ")
            .nth(1)
            .unwrap_or_default();
        assert!(
            [project.clone(), project.canonicalize().unwrap()]
                .iter()
                .any(|p| named == p.display().to_string()),
            "{command}: the checkout is named by its path: {line}"
        );
    }
    assert!(!project.join("tmp").exists() && !t.path().join("results").exists());
}

/// The commands a failed probe prints work as said: measuring it again with its kept compiler
/// state (labelled warm-cache), or with fresh caches under a new name; the plain re-apply they
/// replace is refused.
#[test]
fn a_failed_probe_prints_the_commands_that_work_next() {
    let t = Test::new();
    let text = manifest(&t, "probe", "[warmup]\nrepeats = 1\n")
        .replace("indices = \"0\"\n", "indices = \"0-3\"\n");
    write(&t.path().join("probe.toml"), &text);
    let run_dir = t.path().join("results/probe");
    // Kill the measurement (process 1) once it has started.
    let child = spawn_apply(&t, "probe.toml");
    let spec = run_dir.join("specs/001.json");
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        assert!(Instant::now() < deadline, "the measurement never started");
        if let Some(pid) = worker_pid(&spec) {
            // SAFETY: killing a process this test started (through the runner).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(read_json(&run_dir.join("run.json"))["status"], "failed");
    assert!(
        !stderr.contains("resumes"),
        "a probe is not resumed: {stderr}"
    );
    // Each printed command line, as the argument lists of its `runner` commands.
    let lines: Vec<Vec<Vec<String>>> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("  runner "))
        .map(|line| {
            line.split(" && runner ")
                .map(|c| c.split_whitespace().map(str::to_string).collect())
                .collect()
        })
        .collect();
    let words = |c: &str| c.split(' ').map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        lines,
        [
            vec![words("apply --quiet --set name=probe-2 probe.toml")],
            vec![
                words("clean results/probe"),
                words("apply --quiet probe.toml --set cache.reuse_runtime_state=true"),
            ],
        ],
        "{stderr}"
    );

    // What they replace is refused: the kept state, and then the kept staging.
    let again = t.cmd().args(["apply", "--quiet", "probe.toml"]).run();
    assert_eq!(again.code, 2, "{}", again.render());
    let again = t
        .cmd()
        .args(["apply", "--quiet", "probe.toml", "--reuse-workdir"])
        .args(["--set", "cache.reuse_runtime_state=true"])
        .run();
    assert_eq!(again.code, 2, "{}", again.render());

    let fresh = t.cmd().args(&lines[0][0]).run();
    assert_eq!(fresh.code, 0, "{}", fresh.render());
    let fresh_run = read_json(&t.path().join("results/probe-2/run.json"));
    assert_eq!(fresh_run["status"], "succeeded");
    assert_eq!(fresh_run["cache"]["label"], "fresh", "{fresh_run}");
    for command in &lines[1] {
        let out = t.cmd().args(command).run();
        assert_eq!(out.code, 0, "{}", out.render());
    }
    let warm_run = read_json(&run_dir.join("run.json"));
    assert_eq!(warm_run["status"], "succeeded");
    assert_eq!(warm_run["cache"]["label"], "warm-cache", "{warm_run}");
    assert!(run_dir.join("previous/1/run.json").is_file());
}

/// A bundle folder that is a symbolic link is refused before anything is written: no results
/// folder, no work root.
#[test]
fn a_symlinked_bundle_folder_is_refused_before_anything_is_written() {
    let t = Test::new();
    std::os::unix::fs::symlink(repo().join("assets/tiny"), t.path().join("linked")).unwrap();
    let text = manifest(&t, "probe", "").replace(
        &format!("bundle = \"{}\"", repo().join("assets/tiny").display()),
        &format!("bundle = \"{}/linked\"", t.path().display()),
    );
    write(&t.path().join("m.toml"), &text);
    let out = t.cmd().args(["apply", "--quiet", "m.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr
            .contains("is a symbolic link; point to the real directory"),
        "{}",
        out.render()
    );
    assert!(!t.path().join("results").exists(), "{:?}", tree(t.path()));
    assert!(!t.path().join("work").exists(), "{:?}", tree(t.path()));
}

/// A shared-cache run whose warmup its marker skipped reports that, not a warmup process.
#[test]
fn a_run_whose_warmup_the_shared_marker_skipped_reports_it_skipped() {
    let t = Test::new();
    let shared = format!(
        "[shards]\ncount = 1\n[cache]\nmode = \"shared\"\nshared_state_dir = \"{}/shared\"\n",
        t.path().display()
    );
    for name in ["warm1", "warm2"] {
        write(
            &t.path().join(format!("{name}.toml")),
            &manifest(&t, "generation", &shared),
        );
    }
    let warmup_line = |run: &str| {
        let out = t
            .cmd()
            .args(["apply", "--quiet", &format!("{run}.toml")])
            .run();
        assert_eq!(out.code, 0, "{}", out.render());
        let report = t.cmd().args(["report", run]).run();
        assert_eq!(report.code, 0, "{}", report.render());
        report
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with("warmup "))
            .unwrap_or_else(|| panic!("{}", report.stdout))
            .trim()
            .to_string()
    };
    assert_eq!(
        warmup_line("warm1"),
        "warmup        1 process before measurement, on the first prompt of each slot's first shard"
    );
    assert_eq!(
        warmup_line("warm2"),
        "warmup        skipped: the shared cache's warmup marker was present"
    );
    let run = read_json(&t.path().join("results/warm2/run.json"));
    let warmups: Vec<&serde_json::Value> = run["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "warmup")
        .collect();
    assert_eq!(warmups.len(), 1, "{run}");
    assert_eq!(warmups[0]["skipped"], "warmup_marker", "{run}");
}

/// The command a failed probe prints for a measurement with fresh caches carries every layer of
/// the failed apply, `UNSTEP_EXTRA_ARGS` included (its settings are recorded under names that
/// add the flag): run as printed, it resolves the same settings but the name.
#[test]
fn a_failed_probe_hint_keeps_the_extra_args_variable() {
    let t = Test::new();
    let text = manifest(&t, "probe", "[warmup]\nrepeats = 1\n")
        .replace("indices = \"0\"\n", "indices = \"0-3\"\n");
    write(&t.path().join("probe.toml"), &text);
    let run_dir = t.path().join("results/probe");
    let child = t
        .command(env!("CARGO_BIN_EXE_runner"))
        .args(["apply", "--quiet", "probe.toml"])
        .env("UNSTEP_EXTRA_ARGS", "--clean-sigma-override 0.03")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let spec = run_dir.join("specs/001.json");
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        assert!(Instant::now() < deadline, "the measurement never started");
        if let Some(pid) = worker_pid(&spec) {
            // SAFETY: killing a process this test started (through the runner).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let fresh = stderr
        .lines()
        .find(|l| l.contains("--set name=probe-2"))
        .unwrap_or_else(|| panic!("{stderr}"))
        .trim();
    assert!(
        fresh.starts_with("UNSTEP_EXTRA_ARGS='--clean-sigma-override 0.03' runner apply"),
        "{fresh}"
    );
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_runner"))
        .parent()
        .unwrap()
        .display()
        .to_string();
    let rerun = t
        .command("sh")
        .args(["-c", fresh])
        .env("PATH", format!("{bin}:{}", std::env::var("PATH").unwrap()))
        .output()
        .unwrap();
    assert_eq!(
        rerun.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    let values = |run: &serde_json::Value| -> Vec<(String, serde_json::Value)> {
        run["settings"]
            .as_object()
            .unwrap()
            .iter()
            // The name, and the default that carries it (the state's folder), differ.
            .filter(|(k, _)| !["name", "cache.run_state_root"].contains(&k.as_str()))
            .map(|(k, s)| (k.clone(), s["value"].clone()))
            .collect()
    };
    let failed = read_json(&run_dir.join("run.json"));
    let again = read_json(&t.path().join("results/probe-2/run.json"));
    assert_eq!(failed["settings"]["method.clean_sigma"]["value"], 0.03);
    assert_eq!(values(&again), values(&failed));
}

//! Sweeps: one manifest with a `[sweep]` table planned and applied as several real runs on the
//! tiny bundle and the CPU, and the sweeps that are refused.

use std::time::{Duration, Instant};

use unstep::execute::lock::Lock;

use crate::apply::{generation, read_json, videos};
use crate::support::{Test, tree};

const SIGMAS: &str = "[sweep]\n\"method.clean_sigma\" = [0.005, 0.01]\n";

/// The runner started in the test folder with `args`, its output piped.
fn spawn_runner(t: &Test, args: &[&str]) -> std::process::Child {
    t.command(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Appends `text` to the manifest at `path`.
fn append(path: &std::path::Path, text: &str) {
    let mut manifest = std::fs::read_to_string(path).unwrap();
    manifest.push_str(text);
    std::fs::write(path, manifest).unwrap();
}

#[test]
fn a_sweep_over_clean_sigma_is_two_runs_with_different_videos_compared_in_one_table() {
    let t = Test::new();
    let path = generation(&t, "sig", "0-1");
    // The runs keep their latents: the sweep's table ends with the second's error against the
    // first's.
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("[outputs]\n", "[outputs]\nsave_latents = true\n"),
    )
    .unwrap();
    append(&path, SIGMAS);
    let (a, b) = ("sig-clean_sigma=0.005", "sig-clean_sigma=0.01");

    // The plan shows both runs, then each run's own plan.
    let plan = t.cmd().args(["plan", "sig.toml"]).run();
    assert_eq!(plan.code, 0, "{}", plan.render());
    assert!(
        plan.stdout.starts_with("sweep `sig` of sig.toml: 2 runs"),
        "{}",
        plan.render()
    );
    for run in [a, b] {
        assert!(
            plan.stdout
                .contains(&format!("plan for run `{run}` (generation)")),
            "{}",
            plan.render()
        );
    }
    let json = t.cmd().args(["plan", "sig.toml", "--json"]).run();
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(json["sweep"]["base"], "sig");
    assert_eq!(
        json["sweep"]["keys"],
        serde_json::json!(["method.clean_sigma"])
    );
    let runs: Vec<&str> = json["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run"].as_str().unwrap())
        .collect();
    assert_eq!(runs, [a, b]);
    assert!(!t.path().join("results").exists(), "plan writes nothing");

    // apply runs both, one after the other, and ends with a table over both.
    let out = t.cmd().args(["apply", "--quiet", "sig.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(
        out.stdout.starts_with("sweep `sig`: 2 runs"),
        "{}",
        out.render()
    );
    for run in [a, b] {
        let row = out
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{run} ")))
            .unwrap_or_else(|| panic!("no row for {run}\n{}", out.render()));
        assert!(row.contains("succeeded") && row.contains("2/2"), "{row}");
    }
    assert!(
        out.stdout.contains(&format!(
            "\nquality of `{b}` against `{a}` on the same noise (their kept arrays)\n  \
             latents  2 prompts    relative L2 error  mean "
        )),
        "{}",
        out.render()
    );
    let (dir_a, dir_b) = (
        t.path().join("results").join(a),
        t.path().join("results").join(b),
    );
    for (dir, sigma, point) in [(&dir_a, 0.005, 1), (&dir_b, 0.01, 2)] {
        let run = read_json(&dir.join("run.json"));
        assert_eq!(run["status"], "succeeded", "{run}");
        assert_eq!(run["settings"]["method.clean_sigma"]["value"], sigma);
        // The value's layer is the sweep, its origin the value in the [sweep] list.
        let setting = &run["settings"]["method.clean_sigma"];
        assert_eq!(setting["layer"], "sweep", "{run}");
        let col = if point == 1 { 25 } else { 32 };
        assert_eq!(setting["origin"], format!("sig.toml:23:{col}"), "{run}");
        assert_eq!(run["sweep"]["base"], "sig");
        assert_eq!(run["sweep"]["point"], point);
        assert_eq!(run["sweep"]["points"], 2);
        assert_eq!(run["sweep"]["values"]["method.clean_sigma"], sigma);
    }
    // The same prompts and noise, another clean sigma: the same files, other frames.
    let (va, vb) = (videos(&dir_a), videos(&dir_b));
    assert_eq!(va.len(), 2);
    let names = |v: &[(String, Vec<u8>)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&va), names(&vb));
    for ((name, x), (_, y)) in va.iter().zip(&vb) {
        assert_ne!(x, y, "{name} is the same for both clean sigmas");
    }

    // compare shows both runs in one table.
    let cmp = t.cmd().args(["compare", a, b]).run();
    assert_eq!(cmp.code, 0, "{}", cmp.render());
    assert!(
        cmp.stdout
            .starts_with(&format!("compare `{a}` (a) with `{b}` (b)")),
        "{}",
        cmp.render()
    );
    assert_eq!(
        cmp.stdout.matches("timed total").count(),
        4,
        "{}",
        cmp.stdout
    );
    let cmp = t.cmd().args(["compare", a, b, "--json"]).run();
    let cmp: serde_json::Value = serde_json::from_str(&cmp.stdout).unwrap();
    assert_eq!((cmp["a"].as_str(), cmp["b"].as_str()), (Some(a), Some(b)));
    let warm = cmp["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["series"] == "timed total" && r["statistic"] == "raw_mean")
        .unwrap();
    assert!(warm["a"].as_f64().unwrap() > 0.0 && warm["b"].as_f64().unwrap() > 0.0);

    // diff names the swept setting, and only it, with its layer.
    let diff = t.cmd().args(["diff", a, b]).run();
    assert_eq!(diff.code, 0, "{}", diff.render());
    assert!(
        diff.stdout.contains("differ in 1 setting:")
            && diff.stdout.contains("method.clean_sigma")
            && diff.stdout.contains("sweep (sig.toml:23:25)"),
        "{}",
        diff.render()
    );

    // Applying the sweep again resumes both runs, which generate nothing.
    let again = t.cmd().args(["apply", "--quiet", "sig.toml"]).run();
    assert_eq!(again.code, 0, "{}", again.render());
    assert_eq!(videos(&dir_a), va);
    assert_eq!(videos(&dir_b), vb);
}

#[test]
fn a_sweep_over_an_export_setting_is_refused_with_the_reason_and_nothing_written() {
    let t = Test::new();
    let path = generation(&t, "tall", "0-1");
    append(&path, "[sweep]\n\"method.height\" = [64, 128]\n");
    for command in ["plan", "apply"] {
        let out = t.cmd().args([command, "tall.toml"]).run();
        assert_eq!(out.code, 2, "{}", out.render());
        assert!(
            out.stderr.contains(
                "`method.height` cannot be swept: it is fixed when the asset bundle is \
                 exported, so each value would need another bundle"
            ),
            "{}",
            out.render()
        );
        assert!(out.stderr.contains("tall.toml:22:1"), "{}", out.render());
        assert!(
            out.stderr.contains("export a bundle per value"),
            "{}",
            out.render()
        );
    }
    assert_eq!(tree(t.path()), ["tall.toml"], "nothing written");
}

#[test]
fn swept_values_are_validated_as_set_values_at_their_place_in_the_list() {
    let t = Test::new();
    let path = generation(&t, "bad", "0-1");
    append(
        &path,
        "[sweep]\n\"method.clean_sigma\" = [0.01, \"high\"]\n",
    );
    let out = t.cmd().args(["plan", "bad.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    // The second value, at its line and column.
    assert!(out.stderr.contains("bad.toml:22:31"), "{}", out.render());
    assert_eq!(out.stderr.matches("error").count(), 1, "{}", out.render());

    // A swept setting also given on the command line is ambiguous.
    std::fs::write(
        &path,
        std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"high\"", "0.02"),
    )
    .unwrap();
    let twice = t
        .cmd()
        .args(["plan", "bad.toml", "--set", "method.clean_sigma=0.02"])
        .run();
    assert_eq!(twice.code, 2, "{}", twice.render());
    assert_eq!(
        twice.stderr.matches("error:").count(),
        1,
        "{}",
        twice.render()
    );
    assert!(
        twice
            .stderr
            .contains("is swept by the [sweep] table of bad.toml and also set by the command line"),
        "{}",
        twice.render()
    );

    // Two points with one name, and zip lists of unequal lengths.
    std::fs::write(
        &path,
        std::fs::read_to_string(&path)
            .unwrap()
            .replace("0.02]", "0.010]"),
    )
    .unwrap();
    let same = t.cmd().args(["plan", "bad.toml"]).run();
    assert_eq!(same.code, 2, "{}", same.render());
    assert!(same.stderr.contains("same run name"), "{}", same.render());
    let path = generation(&t, "zip", "0-1");
    append(
        &path,
        "[sweep]\nmode = \"zip\"\n\"method.clean_sigma\" = [0.01, 0.02]\n\"noise.seed\" = [1]\n",
    );
    let zip = t.cmd().args(["plan", "zip.toml"]).run();
    assert_eq!(zip.code, 2, "{}", zip.render());
    assert!(zip.stderr.contains("equal length"), "{}", zip.render());
    let apply = t.cmd().args(["apply", "--quiet", "zip.toml"]).run();
    assert_eq!(apply.code, 2, "{}", apply.render());
    assert!(!t.path().join("results").exists(), "nothing written");
}

#[test]
fn an_interrupted_sweep_ends_the_run_in_progress_and_starts_no_other() {
    let t = Test::new();
    let path = generation(&t, "stop", "0-3");
    append(&path, SIGMAS);
    let first = t.path().join("results/stop-clean_sigma=0.005");
    let child = spawn_runner(&t, &["apply", "--quiet", "stop.toml"]);
    // Once the first run has started (its record is written and its apply holds it), Ctrl-C.
    let deadline = Instant::now() + Duration::from_secs(240);
    while !(first.join("run.json").exists() && Lock::is_held(&first)) {
        assert!(Instant::now() < deadline, "the first run never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: interrupting the runner this test started, as Ctrl-C would.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(130), "{stdout}{stderr}");
    assert_eq!(read_json(&first.join("run.json"))["status"], "interrupted");
    let second = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("stop-clean_sigma=0.01 "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(second.contains("not started"), "{second}");
    assert!(!t.path().join("results/stop-clean_sigma=0.01").exists());
    assert!(stderr.contains("apply the same manifest again"), "{stderr}");
}

/// A refusal `apply` would make before writing anything, for any point of a sweep (here the
/// second run's staging left behind), stops the sweep before its first run, and `runner plan`
/// shows it at the point.
#[test]
fn a_refusal_of_a_later_point_comes_before_the_first_run_and_plan_shows_it() {
    let t = Test::new();
    let path = generation(&t, "pre", "0-1");
    append(&path, SIGMAS);
    let (a, b) = ("pre-clean_sigma=0.005", "pre-clean_sigma=0.01");
    let json = t.cmd().args(["plan", "pre.toml", "--json"]).run();
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let second = &json["runs"][1];
    assert_eq!(second["run"], b, "{json}");
    let left = std::path::Path::new(second["work_root"].as_str().unwrap()).join(b);
    std::fs::create_dir_all(&left).unwrap();

    let plan = t.cmd().args(["plan", "pre.toml"]).run();
    assert_eq!(plan.code, 0, "{}", plan.render());
    let listed: Vec<&str> = plan.stdout.lines().take(4).collect();
    assert!(
        listed[2].contains(b) && listed[3].contains("refused: work directory"),
        "{}",
        plan.render()
    );

    let out = t.cmd().args(["apply", "--quiet", "pre.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr
            .contains(&format!("run `{b}`: work directory {}", left.display())),
        "{}",
        out.render()
    );
    assert!(
        out.stderr.contains("nothing was written"),
        "{}",
        out.render()
    );
    assert!(!t.path().join("results").join(a).exists());
    // With --reuse-workdir the leftover is checked by its audit instead: not a refusal up front.
    assert!(left.exists());
}

/// Ctrl-C between the runs of a sweep starts no further run: sent as soon as the first run's
/// record says it succeeded (just after that run ended), and as the sweep announces the second
/// run (while that one prepares: its checks, locks and staging, seconds of work here). Either
/// way the second run is not started, its results folder and staging do not exist, and the
/// sweep ends interrupted, saying that applying it again resumes it.
#[test]
fn an_interrupt_between_the_runs_of_a_sweep_starts_no_further_run() {
    use std::io::BufRead;
    for after_first_record in [true, false] {
        let t = Test::new();
        let path = generation(&t, "next", "0-1");
        append(&path, SIGMAS);
        let first = t.path().join("results/next-clean_sigma=0.005");
        let second = t.path().join("results/next-clean_sigma=0.01");
        let mut child = spawn_runner(&t, &["apply", "next.toml"]);
        // The runner's stderr, line by line, read on a thread of its own so that it never waits
        // on a full pipe.
        let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let (lines, from_runner) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let mut seen = String::new();
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            assert!(Instant::now() < deadline, "timed out: {seen}");
            if after_first_record {
                let status = std::fs::read_to_string(first.join("run.json"))
                    .ok()
                    .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
                    .map(|run| run["status"].clone());
                if status.is_some_and(|s| s == "succeeded") {
                    break;
                }
                while let Ok(line) = from_runner.try_recv() {
                    seen.push_str(&line);
                    seen.push('\n');
                }
                std::thread::sleep(Duration::from_millis(2));
            } else {
                let line = from_runner
                    .recv_timeout(Duration::from_secs(240))
                    .unwrap_or_else(|_| panic!("no second run announced: {seen}"));
                seen.push_str(&line);
                seen.push('\n');
                if line.starts_with("sweep: run 2 of 2") {
                    break;
                }
            }
        }
        // SAFETY: interrupting the runner this test started, as Ctrl-C would.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let out = child.wait_with_output().unwrap();
        reader.join().unwrap();
        seen.extend(from_runner.try_iter().map(|line| line + "\n"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let what = format!("after_first_record={after_first_record}\n{stdout}{seen}");
        assert_eq!(out.status.code(), Some(130), "{what}");
        assert_eq!(
            read_json(&first.join("run.json"))["status"],
            "succeeded",
            "{what}"
        );
        assert!(!second.exists(), "the second run was started: {what}");
        assert!(
            !t.path().join("work/next-clean_sigma=0.01").exists(),
            "its staging is left: {what}"
        );
        let listed = stdout
            .lines()
            .find(|l| l.trim_start().starts_with("next-clean_sigma=0.01 "))
            .unwrap_or_else(|| panic!("{what}"));
        assert!(listed.contains("not started"), "{what}");
        assert!(
            seen.contains("interrupted; apply the same manifest again to resume the sweep"),
            "{what}"
        );
    }
}

#[test]
fn sweep_flags_are_a_sweep_table_given_on_the_command_line() {
    let t = Test::new();
    generation(&t, "sig", "0");
    let sweep = "method.clean_sigma=0.005,0.01";
    let (a, b) = ("sig-clean_sigma=0.005", "sig-clean_sigma=0.01");
    let names = |stdout: &str| -> Vec<String> {
        let json: serde_json::Value = serde_json::from_str(stdout).unwrap();
        json["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run"].as_str().unwrap().to_string())
            .collect()
    };
    let plan = t
        .cmd()
        .args(["plan", "sig.toml", "--json", "--sweep", sweep])
        .run();
    assert_eq!(plan.code, 0, "{}", plan.render());
    assert_eq!(names(&plan.stdout), [a, b]);
    // Two flags: every combination, the first flag's key first in the names.
    let two = t
        .cmd()
        .args(["plan", "sig.toml", "--json", "--sweep", sweep])
        .args(["--sweep", "noise.seed=1,2"])
        .run();
    assert_eq!(two.code, 0, "{}", two.render());
    assert_eq!(
        names(&two.stdout),
        [
            "sig-clean_sigma=0.005-seed=1",
            "sig-clean_sigma=0.005-seed=2",
            "sig-clean_sigma=0.01-seed=1",
            "sig-clean_sigma=0.01-seed=2"
        ]
    );

    // Bad flags are usage errors naming the flag, and nothing is written.
    for (args, want) in [
        (
            vec!["--sweep", "method.clean_sigma=0.01,high"],
            "invalid value for `method.clean_sigma`: `high` is not a number",
        ),
        (
            vec!["--sweep", "method.clean_sigma=0,0.01"],
            "method.clean_sigma",
        ),
        (vec!["--sweep", "method.height=64,128"], "cannot be swept"),
        (
            vec!["--sweep", sweep, "--set", "method.clean_sigma=0.02"],
            "is swept by `--sweep method.clean_sigma=0.005,0.01` and also set by the command line",
        ),
    ] {
        for command in ["plan", "apply"] {
            let out = t
                .cmd()
                .args([command, "sig.toml"])
                .args(args.iter().copied())
                .run();
            assert_eq!(out.code, 2, "{args:?}: {}", out.render());
            assert!(out.stderr.contains(want), "{args:?}: {}", out.render());
            assert!(
                out.stderr.contains("--sweep "),
                "{args:?}: {}",
                out.render()
            );
        }
    }
    assert_eq!(tree(t.path()), ["sig.toml"], "nothing written");

    // A manifest with a [sweep] table takes no --sweep.
    let path = generation(&t, "table", "0");
    append(&path, SIGMAS);
    let both = t
        .cmd()
        .args(["plan", "table.toml", "--sweep", "noise.seed=1,2"])
        .run();
    assert_eq!(both.code, 2, "{}", both.render());
    assert!(
        both.stderr.contains("the manifest has a [sweep] table"),
        "{}",
        both.render()
    );

    // apply runs each point, recording the flag as the value's origin.
    let out = t
        .cmd()
        .args(["apply", "--quiet", "sig.toml", "--sweep", sweep, "--json"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    // --json: the runs' records, in place of the table.
    let records: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let recorded: Vec<(&str, &str)> = records
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["run"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    assert_eq!(recorded, [(a, "succeeded"), (b, "succeeded")]);
    for (run, value) in [(a, 0.005), (b, 0.01)] {
        let record = read_json(&t.path().join("results").join(run).join("run.json"));
        let setting = &record["settings"]["method.clean_sigma"];
        assert_eq!(setting["value"], value, "{run}");
        assert_eq!(setting["layer"], "sweep", "{run}");
        assert_eq!(setting["origin"], format!("flag --sweep {sweep}"), "{run}");
    }
}

/// A process holds one ONNX Runtime, so each point of a sweep over `runtime.ort_library` has its
/// library checked as its workers will load it: a point whose library cannot load is refused
/// before the first run, and nothing is written.
#[test]
fn a_sweep_over_the_runtime_library_checks_each_point_before_the_first_run() {
    let t = Test::new();
    let path = generation(&t, "lib", "0-1");
    let dir = std::path::PathBuf::from(std::env::var("UNSTEP_ORT_CACHE_DIR").unwrap());
    let real = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .flat_map(|v| std::fs::read_dir(v.path()).unwrap().flatten())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libonnxruntime.so"))
        })
        .expect("the pinned ONNX Runtime");
    let bogus = t.path().join("other/libonnxruntime.so.1.31.1");
    std::fs::create_dir_all(bogus.parent().unwrap()).unwrap();
    std::fs::write(&bogus, b"not a library").unwrap();
    append(
        &path,
        &format!(
            "[sweep]\n\"runtime.ort_library\" = [\"{}\", \"{}\"]\n",
            real.display(),
            bogus.display()
        ),
    );
    // ONNX Runtime keeps a file of its own under $HOME/.cache/Microsoft once loaded: not the
    // runner's writing.
    let written = || -> Vec<String> {
        tree(t.path())
            .into_iter()
            .filter(|f| !f.starts_with(".cache/Microsoft/"))
            .collect()
    };
    let before = written();
    let out = t.cmd().args(["apply", "--quiet", "lib.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr
            .contains("the sweep was not started; nothing was written")
            && out.stderr.contains("other/libonnxruntime.so.1.31.1"),
        "{}",
        out.render()
    );
    assert_eq!(written(), before, "nothing written");
}

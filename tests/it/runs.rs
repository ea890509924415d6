//! Managing runs: `runner runs`, `runner diff`, `runner clean` and `runner compare` of several
//! runs, on real runs of the tiny bundle on the CPU, with real locks.

use std::time::{Duration, Instant};

use unstep::execute::lock::Lock;

use crate::apply::{generation, read_json, spawn_apply};
use crate::support::{Test, repo};

/// A one-prompt probe without warmups, its results and work root inside the test.
fn probe(t: &Test) {
    let root = t.path().display().to_string();
    let text = format!(
        "kind = \"probe\"\n\
         [prompts]\nfile = \"{prompts}\"\nindices = \"0\"\n\
         [warmup]\nrepeats = 0\n\
         [runtime]\nprovider = \"cpu\"\ncpu_threads_per_process = 1\n\
         [method]\nheight = 64\nwidth = 112\nprecision = \"fp32\"\n\
         [outputs]\ndir = \"{root}/results\"\n\
         [staging]\nwork_root = \"{root}/work\"\n\
         [assets]\nbundle = \"{bundle}\"\n",
        prompts = repo().join("assets/prompts/tiny.txt").display(),
        bundle = repo().join("assets/tiny").display(),
    );
    std::fs::write(t.path().join("p.toml"), text).unwrap();
}

/// The line of `runner runs`' table for `run`.
fn row<'a>(stdout: &'a str, run: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{run} ")))
        .unwrap_or_else(|| panic!("no row for {run}:\n{stdout}"))
}

#[test]
fn runs_lists_each_run_diff_shows_settings_with_their_layers_and_compare_takes_three() {
    let t = Test::new();
    probe(&t);
    let empty = t.cmd().args(["runs"]).run();
    assert_eq!(empty.code, 2, "{}", empty.render());
    assert!(empty.stderr.contains("--results DIR"), "{}", empty.render());

    for (name, extra) in [
        ("a", vec![]),
        ("b", vec!["--set", "noise.seed=1"]),
        ("c", vec!["--set", "noise.seed=2"]),
    ] {
        let out = t
            .cmd()
            .args([
                "apply",
                "--quiet",
                "p.toml",
                "--set",
                &format!("name={name}"),
            ])
            .args(extra)
            .run();
        assert_eq!(out.code, 0, "{}", out.render());
    }

    let runs = t.cmd().args(["runs"]).run();
    assert_eq!(runs.code, 0, "{}", runs.render());
    for name in ["a", "b", "c"] {
        let line = row(&runs.stdout, name);
        for want in ["probe", "succeeded", "1/1"] {
            assert!(line.contains(want), "{want}: {line}");
        }
        // One measured prompt: no prompt after the first, so no warm mean.
        assert!(line.contains("n/a"), "{line}");
    }
    let json = t.cmd().args(["runs", "--json"]).run();
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let names: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b", "c"], "oldest first");
    let a = &json[0];
    assert_eq!(a["kind"], "probe");
    assert_eq!(a["status"], "succeeded");
    assert_eq!(a["prompts_done"], 1);
    assert_eq!(a["prompts_planned"], 1);
    assert!(a["started_at"].as_str().unwrap().ends_with('Z'), "{a}");

    // A record that says running while no apply holds the run is an interrupted run.
    let record = t.path().join("results/c/run.json");
    let mut run = read_json(&record);
    run["status"] = "running".into();
    std::fs::write(&record, run.to_string()).unwrap();
    let runs = t.cmd().args(["runs"]).run();
    assert!(
        row(&runs.stdout, "c").contains("interrupted"),
        "{}",
        runs.stdout
    );

    // diff: the seed, at its default in a and from the command line in b; the defaults that
    // carry the run name are left out.
    let diff = t.cmd().args(["diff", "a", "b"]).run();
    assert_eq!(diff.code, 0, "{}", diff.render());
    let want = "`a` (a) and `b` (b) differ in 1 setting: value, then the layer that set it\n  \
                noise.seed\n    a  0  default\n    b  1  command line (flag --set noise.seed=1)\n";
    assert!(diff.stdout.starts_with(want), "{}", diff.render());
    assert!(
        diff.stdout.contains("left out: cache.run_state_root"),
        "{}",
        diff.stdout
    );
    let json = t.cmd().args(["diff", "a", "b", "--json"]).run();
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(json["same_config_hash"], false);
    let d = &json["differences"][0];
    assert_eq!(d["key"], "noise.seed");
    assert_eq!(
        (d["a"]["layer"].as_str(), d["b"]["layer"].as_str()),
        (Some("default"), Some("command line"))
    );
    let same = t.cmd().args(["diff", "a", "a"]).run();
    assert!(
        same.stdout.contains("the same value of every setting"),
        "{}",
        same.render()
    );
    let missing = t.cmd().args(["diff", "a", "nope"]).run();
    assert_eq!(missing.code, 2, "{}", missing.render());

    // compare of three runs: one table, a column each, ratios to the first.
    let cmp = t.cmd().args(["compare", "a", "b", "c"]).run();
    assert_eq!(cmp.code, 0, "{}", cmp.render());
    assert!(cmp.stdout.starts_with("compare 3 runs"), "{}", cmp.stdout);
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        assert!(
            cmp.stdout.contains(&format!("   {}  {name}\n", i + 1)),
            "{}",
            cmp.stdout
        );
    }
    assert!(
        cmp.stderr.contains("run `c` did not succeed"),
        "{}",
        cmp.render()
    );
    let json = t.cmd().args(["compare", "a", "b", "c", "--json"]).run();
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(json["runs"], serde_json::json!(["a", "b", "c"]));
    let raw = &json["rows"][0];
    assert_eq!(raw["statistic"], "raw_mean");
    assert_eq!(raw["values"].as_array().unwrap().len(), 3);
    assert_eq!(raw["ratios"][0], 1.0);
    let one = t.cmd().args(["compare", "a"]).run();
    assert_eq!(one.code, 2, "{}", one.render());
}

#[test]
fn clean_refuses_a_run_in_progress_and_removes_staging_state_or_the_whole_run() {
    let t = Test::new();
    generation(&t, "gen", "0-3");
    let run_dir = t.path().join("results/gen");
    let staging = t.path().join("work/gen");
    let mut child = spawn_apply(&t, "gen.toml");
    // Wait for the apply to hold the run.
    let deadline = Instant::now() + Duration::from_secs(240);
    while !(run_dir.join("run.json").exists() && Lock::is_held(&run_dir)) {
        assert!(Instant::now() < deadline, "the apply never started its run");
        std::thread::sleep(Duration::from_millis(20));
    }
    for flags in [vec![], vec!["--state"], vec!["--all"]] {
        let out = t.cmd().args(["clean", "gen"]).args(flags).run();
        assert_eq!(out.code, 2, "{}", out.render());
        assert!(
            out.stderr.contains("run `gen` is in progress (pid ")
                && out.stderr.contains("nothing was removed"),
            "{}",
            out.render()
        );
    }
    assert!(staging.is_dir() && run_dir.join("run.json").is_file());
    let runs = t.cmd().args(["runs"]).run();
    assert!(
        row(&runs.stdout, "gen").contains("running"),
        "{}",
        runs.stdout
    );

    // Kill the apply: its workers end, the lock goes with the last of them, and the run is
    // left as a killed apply leaves it, staging and all.
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(240);
    while Lock::is_held(&run_dir) {
        assert!(Instant::now() < deadline, "the workers never ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    let runs = t.cmd().args(["runs"]).run();
    assert!(
        row(&runs.stdout, "gen").contains("interrupted"),
        "{}",
        runs.stdout
    );

    // The lock held by any process (here this test, through the lock module) refuses clean.
    let lock = Lock::acquire(&run_dir, "gen").unwrap();
    let out = t.cmd().args(["clean", "gen", "--all"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(staging.is_dir() && run_dir.is_dir());
    drop(lock);

    let state = run_dir.join("runtime_state");
    assert!(state.is_dir());
    let out = t.cmd().args(["clean", "gen"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(out.stdout.contains("removed staging"), "{}", out.render());
    assert!(!staging.exists() && state.is_dir() && run_dir.join("run.json").is_file());

    let out = t.cmd().args(["clean", "gen", "--state"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(out.stdout.contains("no staging at"), "{}", out.render());
    assert!(
        out.stdout.contains("removed runtime state"),
        "{}",
        out.render()
    );
    assert!(!state.exists() && run_dir.join("run.json").is_file());

    let out = t.cmd().args(["clean", "gen", "--all", "--json"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(!run_dir.exists(), "{}", out.render());
    // --json: each folder with what was done to it; only the results folder was left.
    let cleaned: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(cleaned["run"], "gen");
    let folders: Vec<(&str, &str)> = cleaned["folders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["what"].as_str().unwrap(), f["action"].as_str().unwrap()))
        .collect();
    assert_eq!(folders[0], ("staging", "absent"), "{folders:?}");
    assert_eq!(folders.last(), Some(&("results", "removed")), "{folders:?}");
    assert_eq!(
        folders.iter().filter(|f| f.1 == "removed").count(),
        1,
        "{folders:?}"
    );
    let runs = t.cmd().args(["runs"]).run();
    assert_eq!(runs.code, 0, "{}", runs.render());
    assert!(
        runs.stdout.starts_with("no runs under results"),
        "{}",
        runs.render()
    );
    let gone = t.cmd().args(["clean", "gen"]).run();
    assert_eq!(gone.code, 2, "{}", gone.render());
    assert!(gone.stderr.contains("no run `gen`"), "{}", gone.render());
}

/// `cp -a` of a run folder under another name: its record names the original's staging and
/// runtime state by absolute path. Cleaning the copy removes nothing of the original's, also
/// while the original is being applied; the copy is listed once, under its folder's name,
/// marked. A run folder reached through a symbolic link is not "removed" by removing the link,
/// a same-named copy in another results folder does not own the original's folders, and an
/// empty name is refused as such.
#[test]
fn clean_removes_only_what_the_run_folder_itself_owns() {
    let t = Test::new();
    generation(&t, "gen", "0-3");
    let run_dir = t.path().join("results/gen");
    let staging = t.path().join("work/gen");
    let state = run_dir.join("runtime_state");
    let first = t.cmd().args(["apply", "--quiet", "gen.toml"]).run();
    assert_eq!(first.code, 0, "{}", first.render());
    assert!(state.is_dir());
    let copy = |from: &std::path::Path, to: &std::path::Path| {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        let out = std::process::Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(to)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    copy(&run_dir, &t.path().join("results/gen-backup"));

    // The original is applied again (two lost videos to make) while the copy is cleaned.
    for (name, _) in crate::apply::videos(&run_dir).into_iter().take(2) {
        std::fs::remove_file(run_dir.join("videos").join(name)).unwrap();
    }
    let child = spawn_apply(&t, "gen.toml");
    let deadline = Instant::now() + Duration::from_secs(240);
    while !(staging.is_dir() && Lock::is_held(&run_dir)) {
        assert!(Instant::now() < deadline, "the apply never staged its run");
        std::thread::sleep(Duration::from_millis(20));
    }
    for flags in [vec!["--state"], vec!["--all"], vec![]] {
        let out = t
            .cmd()
            .args(["clean", "gen-backup"])
            .args(flags.clone())
            .run();
        assert_eq!(out.code, 2, "{flags:?}: {}", out.render());
        assert!(
            out.stderr
                .contains("holds the record of run `gen`, not of a run `gen-backup`")
                && out.stderr.contains("nothing was removed")
                && out.stderr.contains("runner clean gen"),
            "{}",
            out.render()
        );
        assert!(staging.is_dir() && state.is_dir(), "{flags:?}");
        assert!(t.path().join("results/gen-backup/run.json").is_file());
    }
    let out = child.wait_with_output().unwrap();
    crate::support::assert_exit_0(&out);
    assert_eq!(read_json(&run_dir.join("run.json"))["status"], "succeeded");
    assert_eq!(crate::apply::videos(&run_dir).len(), 4);

    // `runs`: each folder once, under its own name; the copy marked with the run it names.
    let runs = t.cmd().args(["runs"]).run();
    assert_eq!(runs.code, 0, "{}", runs.render());
    assert_eq!(
        runs.stdout
            .lines()
            .filter(|l| l.trim_start().starts_with("gen "))
            .count(),
        1,
        "{}",
        runs.stdout
    );
    assert!(
        row(&runs.stdout, "gen-backup*").contains("generation"),
        "{}",
        runs.stdout
    );
    assert!(
        runs.stdout
            .contains("note: `gen-backup`*: its record is of run `gen`"),
        "{}",
        runs.stdout
    );
    let json = t.cmd().args(["runs", "--json"]).run();
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let names: Vec<(&str, Option<&str>)> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["run"].as_str().unwrap(), r["copy_of"].as_str()))
        .collect();
    assert_eq!(names, [("gen", None), ("gen-backup", Some("gen"))]);

    // The same name in another results folder: the recorded state is not inside it.
    copy(&run_dir, &t.path().join("other/gen"));
    let out = t
        .cmd()
        .args(["clean", "gen", "--results", "other", "--state"])
        .run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("does not own") && out.stderr.contains("carries no owner mark"),
        "{}",
        out.render()
    );
    assert!(state.is_dir());

    // A run folder behind a symbolic link: `--all` is refused, naming where the run is.
    std::fs::create_dir_all(t.path().join("linked")).unwrap();
    std::os::unix::fs::symlink(&run_dir, t.path().join("linked/gen")).unwrap();
    let out = t
        .cmd()
        .args(["clean", "gen", "--results", "linked", "--all"])
        .run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("is a symbolic link to") && out.stderr.contains("nothing was removed"),
        "{}",
        out.render()
    );
    assert!(run_dir.join("run.json").is_file() && state.is_dir());

    let out = t.cmd().args(["clean", ""]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("the run name is empty"),
        "{}",
        out.render()
    );

    // The run itself is cleaned as before, its state and all.
    let out = t.cmd().args(["clean", "gen", "--all"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(!run_dir.exists());
    assert!(t.path().join("results/gen-backup/run.json").is_file());
}

/// The names of `runner runs --json`'s runs, in order.
fn listed(json: &str) -> Vec<String> {
    let json: serde_json::Value = serde_json::from_str(json).unwrap();
    json.as_array()
        .unwrap()
        .iter()
        .map(|r| r["run"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn runs_shows_chosen_columns_sorts_and_filters_and_refuses_an_unknown_column() {
    let t = Test::new();
    probe(&t);
    for (name, seed) in [("s1", "0"), ("s2", "2"), ("x", "1")] {
        let out = t
            .cmd()
            .args([
                "apply",
                "--quiet",
                "p.toml",
                "--set",
                &format!("name={name}"),
            ])
            .args(["--set", &format!("noise.seed={seed}"), "--json"])
            .run();
        assert_eq!(out.code, 0, "{}", out.render());
        // --json: the run's record, as run.json has it, in place of the report.
        let record: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(record["status"], "succeeded");
        let path = t.path().join("results").join(name).join("run.json");
        assert_eq!(record, read_json(&path));
    }
    // Default columns: the setting that differs, the weights' source (the tiny bundle's are
    // random), the warm mean; no scores yet.
    let runs = t.cmd().args(["runs"]).run();
    assert_eq!(runs.code, 0, "{}", runs.render());
    let header = runs.stdout.lines().next().unwrap();
    let words: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        words,
        [
            "run",
            "kind",
            "status",
            "prompts",
            "noise.seed",
            "weights",
            "warm_mean"
        ],
        "{}",
        runs.stdout
    );
    let s2 = row(&runs.stdout, "s2");
    assert_eq!(
        s2.split_whitespace().collect::<Vec<_>>(),
        ["s2", "probe", "succeeded", "1/1", "2", "random", "n/a"]
    );

    // Scores in one run's record: the VBench total joins the defaults.
    let record = t.path().join("results/s2/run.json");
    let mut run = read_json(&record);
    run["evaluation"] = serde_json::json!({
        "command": ["vbench"], "dimensions": ["subject_consistency", "motion_smoothness"],
        "scores_file": "scores.json", "names_file": null, "status": "succeeded",
        "started_at": null, "ended_at": null, "failure": null,
        "scores": {"subject_consistency": 0.9, "motion_smoothness": 0.7},
    });
    std::fs::write(&record, run.to_string()).unwrap();
    let runs = t.cmd().args(["runs"]).run();
    assert!(
        runs.stdout
            .lines()
            .next()
            .unwrap()
            .ends_with("vbench.total"),
        "{}",
        runs.stdout
    );
    assert!(
        row(&runs.stdout, "s2").ends_with("0.8000"),
        "{}",
        runs.stdout
    );
    assert!(row(&runs.stdout, "s1").ends_with("n/a"), "{}", runs.stdout);

    // Chosen columns, sorted descending, as JSON.
    let json = t
        .cmd()
        .args(["runs", "--json", "--sort=-noise.seed"])
        .args(["--columns", "noise.seed,vbench.subject_consistency"])
        .run();
    assert_eq!(json.code, 0, "{}", json.render());
    assert_eq!(listed(&json.stdout), ["s2", "x", "s1"]);
    let value: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value[0]["status"], "succeeded");
    assert_eq!(
        value[0]["columns"],
        serde_json::json!({"noise.seed": 2, "vbench.subject_consistency": 0.9})
    );
    assert_eq!(
        value[1]["columns"]["vbench.subject_consistency"],
        serde_json::Value::Null
    );
    let up = t
        .cmd()
        .args(["runs", "--json", "--sort", "noise.seed"])
        .run();
    assert_eq!(listed(&up.stdout), ["s1", "x", "s2"]);
    // A score sorts runs without one last, ascending or descending.
    for sort in ["vbench.total", "-vbench.total"] {
        let out = t.cmd().args(["runs", "--json", "--sort", sort]).run();
        assert_eq!(listed(&out.stdout)[0], "s2", "{sort}");
    }

    // Filters: a glob, a part of the name, a kind.
    let glob = t.cmd().args(["runs", "--json", "--name", "s?"]).run();
    assert_eq!(listed(&glob.stdout), ["s1", "s2"]);
    let part = t.cmd().args(["runs", "--json", "--name", "2"]).run();
    assert_eq!(listed(&part.stdout), ["s2"]);
    let probes = t.cmd().args(["runs", "--json", "--kind", "probe"]).run();
    assert_eq!(listed(&probes.stdout).len(), 3);
    let none = t.cmd().args(["runs", "--kind", "generation"]).run();
    assert_eq!(none.code, 0, "{}", none.render());
    assert!(
        none.stdout.contains("match --name/--kind"),
        "{}",
        none.stdout
    );
    // A column only filtered-out runs have is still a column.
    let x = t
        .cmd()
        .args([
            "runs",
            "--name",
            "x",
            "--columns",
            "vbench.motion_smoothness",
        ])
        .run();
    assert_eq!(x.code, 0, "{}", x.render());
    assert!(row(&x.stdout, "x").ends_with("n/a"), "{}", x.stdout);

    // Unknown columns are usage errors naming the columns there are.
    for args in [
        vec!["runs", "--columns", "noise.seed,bogus"],
        vec!["runs", "--sort", "-bogus"],
        vec!["runs", "--columns", "vbench.aesthetic_quality"],
    ] {
        let out = t.cmd().args(args.iter().copied()).run();
        assert_eq!(out.code, 2, "{args:?}: {}", out.render());
        assert!(out.stdout.is_empty(), "{}", out.render());
        assert!(out.stderr.contains("unknown column"), "{}", out.render());
        for want in [
            "warm_mean",
            "vbench.total",
            "vbench.motion_smoothness",
            "noise.seed",
        ] {
            assert!(out.stderr.contains(want), "{want}: {}", out.render());
        }
    }
}

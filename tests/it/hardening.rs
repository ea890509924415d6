//! A run's records never claim what did not happen, whatever a user or the machine does to it:
//! two applies of one run, a killed orchestrator, damaged records and videos. Real processes,
//! real locks, real files, on the tiny bundle and the CPU.

use std::time::{Duration, Instant};

use crate::apply::{generation, read_json, shard_prompts, spawn_apply, videos};
use crate::support::{Test, processes_with, repo};

/// Waits until `path` holds at least `lines` lines.
fn wait_for_lines(path: &std::path::Path, lines: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(240);
    while std::fs::read_to_string(path).map_or(0, |t| t.lines().count()) < lines {
        assert!(Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The same run applied with another work root while the first apply runs: refused at once,
/// naming the holder, with nothing written (not even the second work root); the first finishes.
#[test]
fn a_second_apply_of_a_running_run_with_another_work_root_is_refused() {
    let t = Test::new();
    generation(&t, "twice", "0-5");
    let run_dir = t.path().join("results/twice");
    let first = spawn_apply(&t, "twice.toml");
    wait_for_lines(&run_dir.join(".unstep.lock"), 1, "the first apply's lock");
    let other_root = t.path().join("work-other");
    let set = format!("staging.work_root={}", other_root.display());
    let second = t
        .cmd()
        .args(["apply", "--quiet", "twice.toml", "--set", &set])
        .run();
    assert_eq!(second.code, 2, "{}", second.render());
    assert!(
        second.stderr.contains("in use by run `twice`"),
        "{}",
        second.render()
    );
    assert!(!other_root.exists(), "the refused apply wrote nothing");
    let first = first.wait_with_output().unwrap();
    crate::support::assert_exit_0(&first);
    assert_eq!(shard_prompts(&run_dir), vec![0, 1, 2, 3, 4, 5]);
}

/// `runner apply` killed with SIGKILL: its workers die with it (none is left running to write
/// beside the next apply), `runner report` says the run was interrupted, and the next apply
/// finishes it with the videos of an uninterrupted run.
#[test]
fn a_killed_orchestrator_takes_its_workers_with_it_and_the_run_reads_interrupted() {
    let t = Test::new();
    generation(&t, "killed", "0-5");
    let run_dir = t.path().join("results/killed");
    let mut child = spawn_apply(&t, "killed.toml");
    wait_for_lines(
        &run_dir.join("timings/001.jsonl"),
        1,
        "shard 0's first prompt",
    );
    let specs = run_dir.join("specs").display().to_string();
    assert!(!processes_with(&specs).is_empty(), "workers are running");
    child.kill().unwrap();
    child.wait().unwrap();
    // A dying process gives up its command line before its files: wait for both.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_with(&specs).is_empty() || unstep::execute::lock::Lock::is_held(&run_dir) {
        assert!(
            Instant::now() < deadline,
            "workers outlived their orchestrator, or kept its lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(read_json(&run_dir.join("run.json"))["status"], "running");
    let report = t.cmd().args(["report", "killed", "--json"]).run();
    assert_eq!(report.code, 0, "{}", report.render());
    let report: serde_json::Value = serde_json::from_str(&report.stdout).unwrap();
    assert_eq!(report["provenance"]["status"], "interrupted", "{report}");

    let again = t.cmd().args(["apply", "--quiet", "killed.toml"]).run();
    assert_eq!(again.code, 0, "{}", again.render());
    assert!(again.stderr.contains("was killed"), "{}", again.render());
    assert_eq!(shard_prompts(&run_dir), vec![0, 1, 2, 3, 4, 5]);
    let clean = Test::new();
    generation(&clean, "killed", "0-5");
    let out = clean.cmd().args(["apply", "--quiet", "killed.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert_eq!(
        videos(&run_dir),
        videos(&clean.path().join("results/killed"))
    );
}

/// An `apply --shard` killed with SIGKILL leaves its staging as a killed whole-run apply does:
/// after another shard's apply (on another work root) has ended the record as partial, the
/// next apply of the killed shard reuses that staging, its audit checked, instead of refusing
/// it as a failed run's.
#[test]
fn a_killed_shard_applys_staging_is_reused_after_another_shard_ended_the_record() {
    let t = Test::new();
    generation(&t, "sk", "0-5");
    let run_dir = t.path().join("results/sk");
    let mut child = crate::apply::spawn_apply_with(&t, &["sk.toml", "--shard", "0"]);
    wait_for_lines(
        &run_dir.join("timings/001.jsonl"),
        1,
        "shard 0's first prompt",
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while unstep::execute::lock::Lock::is_held(&run_dir) {
        assert!(
            Instant::now() < deadline,
            "the killed apply's lock is still held"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let work2 = format!(
        "--set=staging.work_root={}",
        t.path().join("work2").display()
    );
    let others = t
        .cmd()
        .args(["apply", "--quiet", "sk.toml", "--shard", "1", &work2])
        .run();
    assert_eq!(others.code, 0, "{}", others.render());
    assert_eq!(read_json(&run_dir.join("run.json"))["status"], "partial");

    let again = t
        .cmd()
        .args(["apply", "--quiet", "sk.toml", "--shard", "0"])
        .run();
    assert_eq!(again.code, 0, "{}", again.render());
    let run = read_json(&run_dir.join("run.json"));
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["staging"]["reused"], true, "{run}");
    assert_eq!(shard_prompts(&run_dir), vec![0, 1, 2, 3, 4, 5]);
}

/// A garbage line in the middle of a process's timings costs that prompt only: a re-apply warns,
/// makes it again, repairs the file (keeping the damaged one), and every other prompt stays; a
/// video cut short or emptied is made again. The videos end byte-identical to the first run's.
#[test]
fn damaged_records_and_videos_are_named_repaired_and_made_again() {
    let t = Test::new();
    generation(&t, "damaged", "0-5");
    let run_dir = t.path().join("results/damaged");
    let out = t.cmd().args(["apply", "--quiet", "damaged.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let original = videos(&run_dir);

    // Shard 0 is process 1: its second line becomes garbage.
    let timings = run_dir.join("timings/001.jsonl");
    let text = std::fs::read_to_string(&timings).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    let lost: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    lines[1] = "{\"process\": 1, garbage";
    std::fs::write(&timings, lines.join("\n") + "\n").unwrap();
    // Shard 1's last video is cut short, another one emptied.
    let cut = &original[5].0;
    let emptied = &original[4].0;
    let bytes = &original[5].1;
    std::fs::write(run_dir.join("videos").join(cut), &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(run_dir.join("videos").join(emptied), b"").unwrap();

    let again = t.cmd().args(["apply", "damaged.toml"]).run();
    assert_eq!(again.code, 0, "{}", again.render());
    assert!(
        again.stderr.contains("001.jsonl:2") && again.stderr.contains("not a timing record"),
        "{}",
        again.render()
    );
    assert!(again.stderr.contains("is damaged"), "{}", again.render());
    assert!(
        again
            .stderr
            .contains("resuming: 3 prompts already complete, 3 to go"),
        "{}",
        again.render()
    );
    assert!(timings.with_extension("jsonl.damaged").exists());
    let repaired = std::fs::read_to_string(&timings).unwrap();
    assert!(
        repaired
            .lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok())
    );
    assert!(
        repaired.contains(&format!("\"prompt\":{}", lost["prompt"])),
        "the lost prompt is recorded again"
    );
    // The prompts made again have two records each; the latest counts.
    let mut made = shard_prompts(&run_dir);
    made.dedup();
    assert_eq!(made, vec![0, 1, 2, 3, 4, 5]);
    let summary = read_json(&run_dir.join("summary.json"));
    assert_eq!(summary["count"], 6, "{summary}");
    assert_eq!(videos(&run_dir), original);
}

/// `generation` of `indices` over the prompt file `prompts` (written into the test folder).
fn generation_over(t: &Test, name: &str, indices: &str, prompts: &[u8]) -> std::path::PathBuf {
    let path = generation(t, name, indices);
    let file = t.path().join(format!("{name}.txt"));
    std::fs::write(&file, prompts).unwrap();
    let tiny = crate::support::repo().join("assets/prompts/tiny.txt");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(&tiny.display().to_string(), &file.display().to_string());
    std::fs::write(&path, text).unwrap();
    path
}

/// Two prompts that would be one video file (the same text, or texts the naming folds together)
/// are refused before anything is written, naming both.
#[test]
fn prompts_that_would_share_a_video_are_refused_before_anything_is_written() {
    let t = Test::new();
    generation_over(
        &t,
        "shared",
        "0-3",
        b"a red kite over a beach\na cat/dog at night\na cat_dog at night\na red kite over a beach\n",
    );
    let out = t.cmd().args(["apply", "--quiet", "shared.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr
            .contains("prompts 1, 2 would all be `a cat_dog at night-0.mp4`")
            && out.stderr.contains("prompts 0, 3"),
        "{}",
        out.render()
    );
    assert!(!t.path().join("results").exists(), "nothing written");
    assert!(!t.path().join("work").exists(), "nothing staged");
}

/// A prompt file's line is a prompt's index: a blank line is an error naming it (dropping it
/// would move every later prompt's noise); a file that is not UTF-8 says so; CRLF and a BOM read.
#[test]
fn prompt_files_are_read_line_by_line_and_refused_with_the_line() {
    let t = Test::new();
    generation_over(&t, "blank", "0-1", b"first prompt\n\nsecond prompt\n");
    let out = t.cmd().args(["plan", "blank.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(out.stderr.contains("line 2 is blank"), "{}", out.render());

    generation_over(&t, "latin", "0-1", b"first prompt\ncaf\xe9 au lait\n");
    let out = t.cmd().args(["plan", "latin.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("is not UTF-8 text (line 2"),
        "{}",
        out.render()
    );

    generation_over(
        &t,
        "crlf",
        "0-1",
        b"\xef\xbb\xbffirst prompt\r\nsecond prompt\r\n",
    );
    let out = t.cmd().args(["plan", "crlf.toml", "--json"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
}

/// `extends` naming a device, a named pipe or a huge file fails at once with a clear error.
#[test]
fn extends_reads_only_small_regular_files() {
    let t = Test::new();
    let path = generation(&t, "base", "0-1");
    let big = t.path().join("big.toml");
    std::fs::write(&big, vec![b'#'; 2 << 20]).unwrap();
    let fifo = t.path().join("fifo.toml");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let base = std::fs::read_to_string(&path).unwrap();
    for (target, says) in [
        ("/dev/zero", "is not a regular file (a device)"),
        ("fifo.toml", "is not a regular file (a named pipe)"),
        (
            "big.toml",
            "more than the 1048576 bytes a manifest may have",
        ),
    ] {
        std::fs::write(
            t.path().join("child.toml"),
            format!("extends = \"{target}\"\nname = \"child\"\n{base}"),
        )
        .unwrap();
        let started = Instant::now();
        let out = t.cmd().args(["plan", "child.toml"]).run();
        assert_eq!(out.code, 2, "{}", out.render());
        assert!(out.stderr.contains(says), "{target}: {}", out.render());
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{target} failed fast"
        );
    }
}

/// A manifest of ninety thousand unknown keys (as many as its 1 MiB allows) is refused with
/// each counted and the first shown, in one pass over the file; a million do not fit the limit.
#[test]
fn a_flood_of_unknown_keys_is_counted_not_printed() {
    let t = Test::new();
    let mut text = String::from("kind = \"generation\"\n");
    for i in 0..90_000 {
        text.push_str(&format!("k{i} = 1\n"));
    }
    std::fs::write(t.path().join("flood.toml"), &text).unwrap();
    let out = t.cmd().args(["plan", "flood.toml"]).run();
    assert_eq!(
        out.code,
        2,
        "{}",
        out.render().chars().take(2000).collect::<String>()
    );
    assert!(
        out.stderr.contains("unknown key `k0`"),
        "the first is shown"
    );
    assert!(out.stderr.contains("flood.toml:2:1"), "at its line");
    assert!(
        out.stderr.contains("and 89950 more not shown")
            && out
                .stderr
                .contains("90000 errors; nothing was run or written"),
        "{}",
        &out.stderr[out.stderr.len().saturating_sub(500)..]
    );
    assert!(out.stderr.lines().count() < 1000, "the output is bounded");

    for i in 90_000..1_000_000 {
        text.push_str(&format!("k{i} = 1\n"));
    }
    std::fs::write(t.path().join("flood.toml"), &text).unwrap();
    let out = t.cmd().args(["plan", "flood.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr
            .contains("more than the 1048576 bytes a manifest may have"),
        "{}",
        out.render()
    );
}

/// Settings of the reference scripts that change nothing here are accepted and warned about
/// when set, never silently taken as done.
#[test]
fn settings_that_do_nothing_say_so() {
    let t = Test::new();
    generation(&t, "inert", "0-1");
    let out = t
        .cmd()
        .args(["plan", "inert.toml", "--set", "runtime.compile_threads=4"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(
        out.stdout.contains(
            "`runtime.compile_threads` (set by flag --set runtime.compile_threads=4) has no effect"
        ),
        "{}",
        out.render()
    );
    let quiet = t.cmd().args(["plan", "inert.toml"]).run();
    assert!(
        !quiet.stdout.contains("has no effect"),
        "{}",
        quiet.render()
    );
}

/// What can be known before work starts is refused before anything is written (no results
/// folder, no staging), with exit 2: a bundle whose files or graphs are outside it, unlisted or
/// missing, export settings the bundle was not made with, a bundle folder without
/// `bundle.toml`, a results path that is a file, a GPU provider ONNX Runtime lacks.
#[test]
fn refusals_that_can_be_known_come_before_anything_is_written() {
    let t = Test::new();
    generation(&t, "early", "0-1");
    let empty_bundle = t.path().join("empty-bundle");
    std::fs::create_dir(&empty_bundle).unwrap();
    let file = t.path().join("afile");
    std::fs::write(&file, "x").unwrap();
    // Bundles whose bundle.toml names files outside the bundle, or graphs it does not list or
    // hold: each a copy of the tiny bundle with one edit.
    let edited = |name: &str, from: &str, to: &str| {
        let dir = t.path().join(name);
        crate::support::copy_tiny_bundle(&dir);
        let toml = std::fs::read_to_string(dir.join("bundle.toml")).unwrap();
        assert!(toml.contains(from), "{name}");
        std::fs::write(dir.join("bundle.toml"), toml.replacen(from, to, 1)).unwrap();
        format!("assets.bundle={}", dir.display())
    };
    let outside = edited("b-outside", "\"dit.onnx\" =", "\"../dit.onnx\" =");
    let absolute = edited("b-absolute", "\"dit.onnx\" =", "\"/etc/passwd\" =");
    let unlisted = edited("b-unlisted", "dit = \"dit.onnx\"", "dit = \"other.onnx\"");
    let missing = edited(
        "b-missing",
        "\"dit.onnx\" =",
        "\"gone.onnx\" = \"00\"\n\"dit.onnx\" =",
    );
    let cases = [
        (outside, "`../dit.onnx` is not a plain relative path"),
        (absolute, "`/etc/passwd` is not a plain relative path"),
        (unlisted, "other.onnx"),
        (missing, "gone.onnx listed in [files] is missing"),
        ("method.height=128".to_string(), "export setting height"),
        (
            format!("assets.bundle={}", empty_bundle.display()),
            "bundle.toml",
        ),
        (
            format!("outputs.dir={}", file.display()),
            "is a file, not a folder",
        ),
        (
            "runtime.provider=cuda".to_string(),
            "execution provider is not in ONNX Runtime",
        ),
    ];
    for (set, says) in cases {
        let out = t
            .cmd()
            .args(["apply", "--quiet", "early.toml", "--set", &set])
            .run();
        assert_eq!(out.code, 2, "{set}: {}", out.render());
        assert!(out.stderr.contains(says), "{set}: {}", out.render());
        assert!(!t.path().join("results").exists(), "{set}: nothing written");
        assert!(!t.path().join("work").exists(), "{set}: nothing staged");
    }
}

/// A read-only file system mounted where the results or the staging would go: refused before
/// anything is written, naming the folder. Needs a tmpfs mount (root); elsewhere the test says
/// so and checks nothing.
#[test]
fn a_read_only_file_system_is_refused_before_anything_is_written() {
    let t = Test::new();
    generation(&t, "ro", "0-1");
    let ro = t.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
        .arg(&ro)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("note: cannot mount a read-only tmpfs here (not root?); nothing checked");
        return;
    }
    struct Unmount<'a>(&'a std::path::Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&ro);
    for (set, says) in [
        (
            format!("outputs.dir={}/results", ro.display()),
            "cannot write results under",
        ),
        (
            format!("staging.work_root={}/work", ro.display()),
            "cannot write the staging under",
        ),
    ] {
        let out = t
            .cmd()
            .args(["apply", "--quiet", "ro.toml", "--set", &set])
            .run();
        assert_eq!(out.code, 2, "{set}: {}", out.render());
        assert!(
            out.stderr.contains(says) && out.stderr.contains("Read-only file system"),
            "{set}: {}",
            out.render()
        );
        assert!(!t.path().join("results").exists(), "{set}: nothing written");
        assert!(!t.path().join("work").exists(), "{set}: nothing staged");
    }
}

/// A manifest reached through a symbolic link to its folder resolves its relative paths (here
/// `extends = "../base.toml"`) where the file system says, from the link's target.
#[test]
fn a_manifest_behind_a_symlink_resolves_dot_dot_as_the_file_system_does() {
    let t = Test::new();
    let base = std::fs::read_to_string(generation(&t, "gen", "0-1")).unwrap();
    let real = t.path().join("real");
    std::fs::create_dir_all(real.join("sub")).unwrap();
    std::fs::write(real.join("base.toml"), base).unwrap();
    std::fs::write(
        real.join("sub/child.toml"),
        "extends = \"../base.toml\"\nname = \"child\"\nkind = \"generation\"\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(real.join("sub"), t.path().join("link")).unwrap();
    let out = t.cmd().args(["plan", "link/child.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(out.stdout.contains("base.toml"), "{}", out.render());
}

/// A project checkout (a folder with `.git`) whose manifest leaves `outputs.dir` at its default.
fn project_checkout(staging: &str) -> Test {
    let text = format!(
        "kind = \"generation\"\n\
         [prompts]\nfile = \"{prompts}\"\nindices = \"0\"\n\
         [shards]\ncount = 1\n\
         [runtime]\nprovider = \"cpu\"\ncpu_threads_per_process = 1\n\
         [method]\nheight = 64\nwidth = 112\nprecision = \"fp32\"\n\
         [staging]\nwork_root = \"{staging}\"\n\
         [assets]\nbundle = \"{bundle}\"\n",
        prompts = crate::support::repo()
            .join("assets/prompts/tiny.txt")
            .display(),
        bundle = crate::support::repo().join("assets/tiny").display(),
    );
    let t = Test::new()
        .file("project/.git/HEAD", "ref: refs/heads/main\n")
        .file("project/experiments/away.toml", &text)
        .file("elsewhere/.keep", "");
    let elsewhere = t.path().join("elsewhere");
    t.cwd(&elsewhere)
}

/// The default `results` belongs to the project, not to the folder a run is started from: an
/// apply from another folder writes into the checkout's `results/<RUN>/` and nothing where it
/// stands.
#[test]
fn a_run_started_from_another_folder_writes_where_its_project_keeps_results() {
    let staging = "${TMPDIR:-/tmp}/unstep_away_stage";
    let t = project_checkout(staging);
    let manifest = t.path().join("project/experiments/away.toml");
    let out = t
        .cmd()
        .env("TMPDIR", &t.path().display().to_string())
        .args(["apply", "--quiet", &manifest.display().to_string()])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let run = crate::apply::read_json(&t.path().join("project/results/away/run.json"));
    assert_eq!(run["status"], "succeeded");
    assert_eq!(
        crate::support::tree(&t.path().join("elsewhere")),
        vec![".keep".to_string()],
        "nothing is written where the run was started"
    );
}

/// A work root inside the checkout that holds the manifest is refused, even when the bundle and
/// the prompts live in another checkout (or none).
#[test]
fn staging_inside_the_manifests_checkout_is_refused() {
    let t = project_checkout("../stage");
    let manifest = t.path().join("project/experiments/away.toml");
    let out = t
        .cmd()
        .args(["apply", "--quiet", &manifest.display().to_string()])
        .run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("overlaps the source checkout")
            && out.stderr.contains("project")
            && out.stderr.contains("away.toml:"),
        "{}",
        out.render()
    );
    assert!(!t.path().join("project/stage").exists());
    assert!(!t.path().join("project/results").exists());
}

/// A generation of prompts 0-3 in two shards (0-1 and 2-3) read from a copy of the tiny prompt
/// file, with an evaluation that counts its runs in `evaluations.txt` and scores one dimension;
/// returns the prompt file.
fn counted_generation(t: &Test, name: &str) -> std::path::PathBuf {
    let tiny = std::fs::read_to_string(repo().join("assets/prompts/tiny.txt")).unwrap();
    let prompts = t.path().join("p.txt");
    std::fs::write(&prompts, tiny).unwrap();
    let path = generation(t, name, "0-3");
    // The script writes `{"color": 0.5}` (braces as octal escapes: they mark placeholders).
    let evaluation = format!(
        "[evaluation]\ncommand = [\"sh\", \"-c\", \"echo run >> \\\"$1\\\"; printf \
         '\\\\173\\\"color\\\": 0.5\\\\175' > \\\"$2/out.json\\\"\", \"sh\", \"{}\", \
         \"{{eval_dir}}\"]\ndimensions = [\"color\"]\nscores_file = \"out.json\"\n",
        t.path().join("evaluations.txt").display()
    );
    // The tiny bundle's random weights are scored on purpose.
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(
            &repo().join("assets/prompts/tiny.txt").display().to_string(),
            &prompts.display().to_string(),
        )
        .replace("[assets]\n", "[assets]\nallow_random_weights = true\n")
        + &evaluation;
    std::fs::write(&path, text).unwrap();
    prompts
}

fn evaluations(t: &Test) -> usize {
    std::fs::read_to_string(t.path().join("evaluations.txt")).map_or(0, |s| s.lines().count())
}

/// Whether a prompt is complete is one test that `apply --shard`, `status`, `runs`, `plan` and
/// `evaluate` share: after shard 1 loses a video and a prompt's text changes, an apply of shard
/// 0 leaves the run partial, runs no evaluation and touches none of shard 1's files, and every
/// command counts the same prompts done.
#[test]
fn a_shard_apply_never_calls_a_run_with_a_lost_video_complete() {
    let t = Test::new();
    let prompts = counted_generation(&t, "gen");
    let run_dir = t.path().join("results/gen");
    let first = t.cmd().args(["apply", "--quiet", "gen.toml"]).run();
    assert_eq!(first.code, 0, "{}", first.render());
    assert_eq!(read_json(&run_dir.join("run.json"))["status"], "succeeded");
    assert_eq!(evaluations(&t), 1);

    // Shard 1 (prompts 2 and 3): prompt 3's video is deleted, prompt 2's text edited.
    let made = videos(&run_dir);
    let tiny = std::fs::read_to_string(&prompts).unwrap();
    let mut lines: Vec<&str> = tiny.lines().collect();
    let (old2, old3) = (lines[2].to_string(), lines[3].to_string());
    let video_of = |text: &str| {
        made.iter()
            .map(|(n, _)| n.clone())
            .find(|n| n.starts_with(text))
            .unwrap_or_else(|| panic!("no video of {text}"))
    };
    let (video2, video3) = (video_of(&old2), video_of(&old3));
    std::fs::remove_file(run_dir.join("videos").join(&video3)).unwrap();
    lines[2] = "a red kite over a grey sea";
    std::fs::write(&prompts, lines.join("\n") + "\n").unwrap();

    let shard0 = t
        .cmd()
        .args(["apply", "--quiet", "gen.toml", "--shard", "0"])
        .run();
    assert_eq!(shard0.code, 0, "{}", shard0.render());
    let run = read_json(&run_dir.join("run.json"));
    assert_eq!(run["status"], "partial", "{}", run["failure"]);
    assert_eq!(evaluations(&t), 1, "no evaluation of an incomplete set");
    // Shard 1's stale video is shard 1's apply's to replace.
    assert!(run_dir.join("videos").join(&video2).is_file());

    let status = t.cmd().args(["status", "gen", "--json"]).run();
    let status: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(
        (status["prompts_done"].as_u64(), status["prompts"].as_u64()),
        (Some(2), Some(4))
    );
    let runs = t.cmd().args(["runs", "--json"]).run();
    let runs: serde_json::Value = serde_json::from_str(&runs.stdout).unwrap();
    assert_eq!(runs[0]["prompts_done"], 2, "{runs}");
    let plan = t.cmd().args(["plan", "gen.toml", "--json"]).run();
    let plan: serde_json::Value = serde_json::from_str(&plan.stdout).unwrap();
    assert_eq!(
        plan["results_state"]["done"], 2,
        "{}",
        plan["results_state"]
    );

    // `runner evaluate` refuses the incomplete set with the count, and scores it when forced.
    // The record says partial: make it say succeeded, as the apply above used to.
    let mut record = run.clone();
    record["status"] = "succeeded".into();
    std::fs::write(run_dir.join("run.json"), record.to_string()).unwrap();
    let status = t.cmd().args(["status", "gen"]).run();
    assert!(
        status.stdout.contains("status   incomplete") && status.stdout.contains("2 of 4 done"),
        "{}",
        status.render()
    );
    let refused = t.cmd().args(["evaluate", "gen"]).run();
    assert_eq!(refused.code, 2, "{}", refused.render());
    assert!(
        refused
            .stderr
            .contains("has 2 of its 4 prompts not complete")
            && refused.stderr.contains("--force"),
        "{}",
        refused.render()
    );
    assert_eq!(evaluations(&t), 1);
    let forced = t.cmd().args(["evaluate", "gen", "--force"]).run();
    assert_eq!(forced.code, 0, "{}", forced.render());
    assert_eq!(evaluations(&t), 2);

    // Shard 1's apply makes its two prompts again; the run is complete and evaluated.
    let shard1 = t
        .cmd()
        .args(["apply", "--quiet", "gen.toml", "--shard", "1"])
        .run();
    assert_eq!(shard1.code, 0, "{}", shard1.render());
    assert_eq!(read_json(&run_dir.join("run.json"))["status"], "succeeded");
    assert!(!run_dir.join("videos").join(&video2).exists());
    assert_eq!(shard_prompts(&run_dir), [0, 1, 2, 2, 3, 3]);
    let status = t.cmd().args(["status", "gen"]).run();
    assert!(status.stdout.contains("4 of 4 done"), "{}", status.render());
}

/// Runs `runner ARGS` in `t`, failing when it takes longer than `limit`.
fn within(t: &Test, args: &[&str], limit: Duration) -> (Option<i32>, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .current_dir(t.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            return (out.status.code(), text);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`runner {}` still runs after {limit:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A run.json that is a FIFO (or another non-file) fails every reader at once, saying what it
/// is; `runner runs` lists that run as unreadable and goes on with the others.
#[test]
fn records_that_are_not_regular_files_fail_their_readers_at_once() {
    let t = Test::new();
    let run_dir = t.path().join("results/pipe");
    std::fs::create_dir_all(&run_dir).unwrap();
    let fifo = std::ffi::CString::new(run_dir.join("run.json").display().to_string()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let limit = Duration::from_secs(20);
    for args in [
        vec!["report", "pipe"],
        vec!["status", "pipe"],
        vec!["compare", "pipe", "pipe"],
        vec!["diff", "pipe", "pipe"],
        vec!["evaluate", "pipe"],
        vec!["clean", "pipe"],
    ] {
        let (code, text) = within(&t, &args, limit);
        assert!(matches!(code, Some(2 | 3)), "{args:?}: {code:?} {text}");
        assert!(
            text.contains("it is a named pipe, not a regular file"),
            "{args:?}: {text}"
        );
    }
    let (code, text) = within(&t, &["runs"], limit);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("pipe ") && l.contains("unreadable")),
        "{text}"
    );
}

/// `runner apply … 2>&1 | head -1`: the reader of its output goes away after the first line;
/// the apply finishes the run and its records all the same, and exits as the run did.
#[test]
fn an_apply_whose_output_pipe_closes_finishes_its_run() {
    let t = Test::new();
    generation(&t, "gen", "0-3");
    let run_dir = t.path().join("results/gen");
    let out = t
        .command("bash")
        .args([
            "-c",
            "\"$0\" apply gen.toml 2>&1 | head -1; echo \"apply exited ${PIPESTATUS[0]}\"",
            env!("CARGO_BIN_EXE_runner"),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("apply exited 0"), "{stdout}");
    let run = read_json(&run_dir.join("run.json"));
    assert_eq!(run["status"], "succeeded", "{run}");
    assert!(run_dir.join("summary.json").is_file() && run_dir.join("videos.json").is_file());
    assert_eq!(videos(&run_dir).len(), 4);
    assert!(
        !t.path().join("work/gen").exists(),
        "the staging is removed"
    );
}

/// Videos that are not the ones their workers wrote, though whole MP4s of the same names: two
/// swapped, one zero-filled in place (its size kept) and one overwritten with a copy of another.
/// `runner status` counts them as not done, and a re-apply makes them again; the videos end
/// byte-identical to the first run's.
#[test]
fn swapped_zero_filled_and_copied_videos_are_not_complete() {
    let t = Test::new();
    generation(&t, "swapped", "0-5");
    let run_dir = t.path().join("results/swapped");
    let out = t.cmd().args(["apply", "--quiet", "swapped.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let original = videos(&run_dir);
    let dir = run_dir.join("videos");
    let at = |i: usize| dir.join(&original[i].0);
    std::fs::rename(at(0), dir.join("swap.tmp")).unwrap();
    std::fs::rename(at(1), at(0)).unwrap();
    std::fs::rename(dir.join("swap.tmp"), at(1)).unwrap();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).open(at(2)).unwrap();
        f.write_all(&vec![0u8; original[2].1.len()]).unwrap();
    }
    std::fs::copy(at(5), at(4)).unwrap();
    assert_ne!(original[4].1, original[5].1);

    let status = t.cmd().args(["status", "swapped", "--json"]).run();
    assert_eq!(status.code, 0, "{}", status.render());
    let s: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(
        (s["prompts_done"].as_u64(), s["prompts"].as_u64()),
        (Some(2), Some(6)),
        "{s}"
    );

    let again = t.cmd().args(["apply", "swapped.toml"]).run();
    assert_eq!(again.code, 0, "{}", again.render());
    assert!(
        again
            .stderr
            .contains("resuming: 2 prompts already complete, 4 to go"),
        "{}",
        again.render()
    );
    assert!(
        again.stderr.contains("is not the one its worker wrote (")
            && again.stderr.contains("is damaged ("),
        "{}",
        again.render()
    );
    assert_eq!(videos(&run_dir), original);
}

/// A run's folders may lie below a checkout, but never in its own folders (`.git/`, `src/`, the
/// project's `.cache/` of ONNX Runtime and Python environments), nor in a user's Python
/// install (`~/.pyenv` and the like): each is refused at the setting, with nothing written.
#[test]
fn outputs_in_a_checkouts_own_folders_or_a_users_python_are_refused() {
    let t = project_checkout("${TMPDIR:-/tmp}/unstep_overlap_stage");
    let project = t.path().join("project");
    let manifest = project.join("experiments/away.toml");
    let base = std::fs::read_to_string(&manifest).unwrap();
    let home = t.path().to_path_buf();
    let cases = [
        (project.join("src/runs"), "overlaps the source checkout"),
        (project.join(".git/runs"), "overlaps the source checkout"),
        (project.join(".cache/runs"), "overlaps the source checkout"),
        (
            home.join(".pyenv/versions/runs"),
            "overlaps the installation",
        ),
        (home.join("miniconda3/runs"), "overlaps the installation"),
    ];
    for (dir, says) in &cases {
        std::fs::write(
            &manifest,
            format!("{base}[outputs]\ndir = \"{}\"\n", dir.display()),
        )
        .unwrap();
        let before = crate::support::tree(t.path());
        for command in ["plan", "apply"] {
            let out = t.cmd().args([command, manifest.to_str().unwrap()]).run();
            assert_eq!(out.code, 2, "{}: {}", dir.display(), out.render());
            assert!(
                out.stderr.contains(says) && out.stderr.contains("away.toml:"),
                "{}: {}",
                dir.display(),
                out.render()
            );
        }
        assert_eq!(crate::support::tree(t.path()), before, "{}", dir.display());
    }
    // A folder of the user's below the checkout is fine.
    std::fs::write(
        &manifest,
        format!(
            "{base}[outputs]\ndir = \"{}\"\n",
            project.join("runs").display()
        ),
    )
    .unwrap();
    let out = t.cmd().args(["plan", manifest.to_str().unwrap()]).run();
    assert_eq!(out.code, 0, "{}", out.render());
}

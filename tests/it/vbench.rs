//! VBench-ready generations on the tiny bundle: videos named as VBench's standard mode looks them
//! up (`prompts.names_file`), names that cannot be file names renamed by the documented rule, and
//! the `[evaluation]` step with a stand-in evaluation program (Python) that does VBench's lookup
//! and writes scores, fails, writes garbage or writes nothing.

use std::collections::BTreeSet;
use std::path::Path;

use crate::apply::{generation, read_json, records, videos};
use crate::support::{Test, python, sha256_hex};

/// A generation of every line of `extended` in two shards, its videos named after `standard`
/// (the names file), with `extra` appended to the manifest; written to `<name>.toml`.
pub(crate) fn vbench_generation(
    t: &Test,
    name: &str,
    extended: &[&str],
    standard: &[&str],
    extra: &str,
) {
    let path = generation(t, name, &format!("0-{}", extended.len() - 1));
    let prompts = t.path().join(format!("{name}-extended.txt"));
    let names = t.path().join(format!("{name}-standard.txt"));
    std::fs::write(&prompts, extended.join("\n") + "\n").unwrap();
    std::fs::write(&names, standard.join("\n") + "\n").unwrap();
    let tiny = crate::support::repo().join("assets/prompts/tiny.txt");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(&tiny.display().to_string(), &prompts.display().to_string())
        .replace(
            "[prompts]\n",
            &format!("[prompts]\nnames_file = \"{}\"\n", names.display()),
        )
        .replace("[outputs]\n", "[outputs]\nvideo_naming = \"vbench\"\n")
        // The tiny bundle's weights are seeded random ones: these tests score them on purpose.
        .replace("[assets]\n", "[assets]\nallow_random_weights = true\n");
    std::fs::write(&path, text + extra).unwrap();
}

/// The stand-in evaluation: it reads its mode from `mode.txt` in the test folder (`scores F`,
/// `fail`, `garbage`, `nothing`, `sleep`; `slow S`: `scores 1.0` after S seconds; `family`: a
/// child of its own that sleeps, and itself deaf to SIGTERM) and appends its pid to `ran.txt`
/// there. With `scores F` it looks the videos up as VBench's standard
/// mode does (the extension of the folder's first entry; `<prompt>-<i><ext>` for i in 0..4 for
/// every distinct standard prompt) and writes, in VBench's `[score, per-video results]` form,
/// for the k-th dimension: F × (share of the names file's lines whose video it found) − k/100.
const STAND_IN: &str = r#"
import json, os, sys
mode_file, videos, names_file, dimensions, eval_dir = sys.argv[1:6]
mode = open(mode_file).read().split()
print("stand-in evaluation:", " ".join(mode), "over", len(dimensions.split()), "dimensions", flush=True)
open(os.path.join(os.path.dirname(mode_file), "ran.txt"), "a").write("%d\n" % os.getpid())
if mode[0] == "slow":
    import time
    time.sleep(float(mode[1]))
    mode = ["scores", "1.0"]
if mode[0] == "family":
    import signal, subprocess, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "stand-in-grandchild"])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("family started", flush=True)
    time.sleep(600)
if mode[0] == "sleep":
    import time
    time.sleep(600)
if mode[0] == "fail":
    print("RuntimeError: CUDA out of memory (stand-in)", file=sys.stderr)
    sys.exit(3)
if mode[0] == "nothing":
    sys.exit(0)
out = os.path.join(eval_dir, "stand-in", "results_%d_eval_results.json" % os.getpid())
os.makedirs(os.path.dirname(out), exist_ok=True)
if mode[0] == "garbage":
    open(out, "w").write("Traceback (most recent call last): {")
    sys.exit(0)
names = os.listdir(videos)
postfix = os.path.splitext(names[0])[1]
prompts = open(names_file, encoding="utf-8").read().splitlines()
found = []
for p in dict.fromkeys(prompts):
    for i in range(5):
        if p + "-" + str(i) + postfix in names:
            found.append({"video_path": os.path.join(videos, p + "-" + str(i) + postfix)})
share = len(found) / len(prompts)
scores = {d: [float(mode[1]) * share - k / 100, found] for k, d in enumerate(dimensions.split())}
json.dump(scores, open(out, "w"))
"#;

/// The `[evaluation]` table that runs [`STAND_IN`] on `subject_consistency` and `color`.
pub(crate) fn evaluation(t: &Test) -> String {
    let script = t.path().join("stand_in.py");
    std::fs::write(&script, STAND_IN).unwrap();
    let arg = |p: &Path| format!("\"{}\"", p.display());
    format!(
        "[evaluation]\ncommand = [{}, {}, {}, \"{{videos}}\", \"{{names_file}}\", \
         \"{{dimensions}}\", \"{{eval_dir}}\"]\n\
         dimensions = [\"subject_consistency\", \"color\"]\n\
         scores_file = \"stand-in/results_*_eval_results.json\"\n",
        arg(&python()),
        arg(&script),
        arg(&t.path().join("mode.txt")),
    )
}

pub(crate) fn mode(t: &Test, mode: &str) {
    std::fs::write(t.path().join("mode.txt"), mode).unwrap();
}

fn names(run_dir: &Path) -> BTreeSet<String> {
    videos(run_dir).into_iter().map(|(n, _)| n).collect()
}

const BEACH: &str =
    "A beautiful coastal beach in spring, waves lapping on sand by Hokusai, in the style of Ukiyo";
pub(crate) const BUND: &str = "The bund Shanghai, oil painting";
pub(crate) const QUOTES: &str = "a person's \"quoted\" words (loud); 100% sure? yes! -- [ok], {x}";

/// Extended prompts of the pair shape: a long rewrite of each standard prompt.
pub(crate) fn extended(standard: &[&str]) -> Vec<String> {
    standard
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "Extended prompt {i}: {s}, in a long shot with soft morning light, detailed \
                 textures, gentle camera motion, cinematic colour grading and a calm mood, \
                 rendered with natural motion and consistent subjects across every frame."
            )
        })
        .collect()
}

pub(crate) fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// With a names file, each video is `<standard prompt>-<sample>.mp4`: the whole standard prompt
/// as VBench's standard mode looks it up, and a repeated standard prompt's later line its next
/// sample. A stand-in that does VBench's lookup finds every video; the scores land in the
/// records, `report` and `compare`.
#[test]
fn videos_are_named_as_vbench_standard_mode_looks_them_up_and_scored() {
    let t = Test::new();
    let standard = [BEACH, QUOTES, BUND, BEACH, BUND];
    let ext = extended(&standard);
    let eval = evaluation(&t);
    vbench_generation(&t, "std", &strs(&ext), &standard, &eval);
    mode(&t, "scores 1.0");
    let out = t.cmd().args(["apply", "--quiet", "std.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let run_dir = t.path().join("results/std");
    let want: BTreeSet<String> = [
        format!("{BEACH}-0.mp4"),
        format!("{QUOTES}-0.mp4"),
        format!("{BUND}-0.mp4"),
        format!("{BEACH}-1.mp4"),
        format!("{BUND}-1.mp4"),
    ]
    .into();
    assert_eq!(names(&run_dir), want);

    // The index: global index, extended prompt, standard prompt, name, sha256 of the file.
    let index = read_json(&run_dir.join("videos.json"));
    let entries = index["videos"].as_array().unwrap();
    assert_eq!(entries.len(), 5, "{index}");
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e["index"], i as u64, "{e}");
        assert_eq!(e["prompt"], ext[i].as_str(), "{e}");
        assert_eq!(e["standard_prompt"], standard[i], "{e}");
        let file = std::fs::read(run_dir.join("videos").join(e["name"].as_str().unwrap())).unwrap();
        assert_eq!(e["sha256"], sha256_hex(&file), "{e}");
    }
    assert_eq!(entries[3]["name"], format!("{BEACH}-1.mp4"));
    assert_eq!(entries[4]["name"], format!("{BUND}-1.mp4"));

    // VBench's lookup (the stand-in's) found all five: both dimensions score 1.0 and 0.99.
    let run = read_json(&run_dir.join("run.json"));
    assert_eq!(run["status"], "succeeded", "{run}");
    let e = &run["evaluation"];
    assert_eq!(e["status"], "succeeded", "{run}");
    assert_eq!(e["scores"]["subject_consistency"], 1.0, "{run}");
    assert_eq!(e["scores"]["color"], 0.99, "{run}");
    // `{dimensions}` reached the program as one argument; `{videos}` as the videos folder.
    let argv: Vec<&str> = e["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(argv[5], "subject_consistency color", "{argv:?}");
    assert!(argv[3].ends_with("results/std/videos"), "{argv:?}");
    let kept = read_json(&run_dir.join("eval/scores.json"));
    assert_eq!(
        kept,
        serde_json::json!({"subject_consistency": 1.0, "color": 0.99})
    );
    let log = std::fs::read_to_string(run_dir.join("logs/evaluation.log")).unwrap();
    assert!(
        log.contains("stand-in evaluation: scores 1.0 over 2 dimensions"),
        "{log}"
    );
    assert!(
        out.stdout.contains("evaluation: succeeded"),
        "{}",
        out.stdout
    );

    let report = t.cmd().args(["report", "std"]).run();
    assert_eq!(report.code, 0, "{}", report.render());
    assert!(
        report.stdout.contains("subject_consistency  1.0000")
            && report.stdout.contains("color                0.9900"),
        "{}",
        report.stdout
    );
    let json: serde_json::Value =
        serde_json::from_str(&t.cmd().args(["report", "--json", "std"]).run().stdout).unwrap();
    assert_eq!(json["evaluation"]["scores"]["color"], 0.99, "{json}");

    // Applying again: every video is there and scored; nothing runs.
    let timings = records(&run_dir).len();
    let again = t.cmd().args(["apply", "std.toml"]).run();
    assert_eq!(again.code, 0, "{}", again.render());
    assert!(again.stderr.contains("nothing to do"), "{}", again.render());
    assert_eq!(records(&run_dir).len(), timings, "no prompt made again");

    // A second run of the same prompts, scored lower: compare gives per-dimension deltas.
    vbench_generation(&t, "std2", &strs(&ext), &standard, &eval);
    mode(&t, "scores 0.5");
    let out = t.cmd().args(["apply", "--quiet", "std2.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let cmp = t.cmd().args(["compare", "std", "std2"]).run();
    assert_eq!(cmp.code, 0, "{}", cmp.render());
    assert!(
        cmp.stdout.contains("evaluation scores, delta = b - a"),
        "{}",
        cmp.stdout
    );
    let line = cmp
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("color"))
        .unwrap();
    assert!(
        line.contains("0.9900") && line.contains("0.4900") && line.contains("-0.5000"),
        "{line}"
    );
    let json: serde_json::Value = serde_json::from_str(
        &t.cmd()
            .args(["compare", "--json", "std", "std2"])
            .run()
            .stdout,
    )
    .unwrap();
    let rows = json["scores"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{json}");
    let sc = rows
        .iter()
        .find(|r| r["dimension"] == "subject_consistency")
        .unwrap();
    assert_eq!((sc["a"].as_f64(), sc["b"].as_f64()), (Some(1.0), Some(0.5)));
    assert_eq!(sc["delta"].as_f64(), Some(-0.5));
}

/// Standard prompts that cannot be file names as they are (`/`, NUL-free but leading dots, over
/// 255 bytes of UTF-8 in CJK or accents, a collision with a prompt written with `_`) are renamed
/// by the documented rule, listed by `runner plan`, and never two on one file.
#[test]
fn unusable_standard_prompts_are_renamed_listed_and_kept_apart() {
    let t = Test::new();
    let cjk = "桜の花が舞う".repeat(15); // 270 bytes
    let accents = "é".repeat(126) + " à la plage"; // 264 bytes
    let standard = [
        "a cat/dog at night",
        "a cat_dog at night",
        "..hidden beach",
        cjk.as_str(),
        accents.as_str(),
        cjk.as_str(),
    ];
    let ext = extended(&standard);
    vbench_generation(&t, "odd", &strs(&ext), &standard, "");
    let plan = t.cmd().args(["plan", "odd.toml"]).run();
    assert_eq!(plan.code, 0, "{}", plan.render());
    assert!(
        plan.stdout.contains("renamed videos (5:"),
        "{}",
        plan.stdout
    );
    let hash = |s: &str| sha256_hex(s.as_bytes())[..8].to_string();
    assert!(
        plan.stdout.contains(&format!(
            "prompt 0: `a cat/dog at night` -> `a cat_dog at night~{}-0.mp4` (contains `/`)",
            hash("a cat/dog at night")
        )),
        "{}",
        plan.stdout
    );
    assert!(
        plan.stdout.contains(&format!(
            "prompt 2: `..hidden beach` -> `__hidden beach~{}-0.mp4` (starts with `.`)",
            hash("..hidden beach")
        )),
        "{}",
        plan.stdout
    );
    let json: serde_json::Value =
        serde_json::from_str(&t.cmd().args(["plan", "--json", "odd.toml"]).run().stdout).unwrap();
    let renamed: Vec<u64> = json["renamed_videos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["index"].as_u64().unwrap())
        .collect();
    assert_eq!(renamed, [0, 2, 3, 4, 5], "{json}");

    let out = t.cmd().args(["apply", "--quiet", "odd.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let run_dir = t.path().join("results/odd");
    let made = names(&run_dir);
    assert_eq!(made.len(), 6, "one file per prompt: {made:?}");
    for n in &made {
        assert!(n.len() <= 255 && !n.starts_with('.'), "{n}");
    }
    assert!(made.contains("a cat_dog at night-0.mp4"), "{made:?}");
    let long = |sample: u32| {
        made.iter()
            .find(|n| n.starts_with("桜") && n.ends_with(&format!("~{}-{sample}.mp4", hash(&cjk))))
            .unwrap_or_else(|| panic!("{made:?}"))
            .clone()
    };
    // The repeated CJK prompt's later line is its next sample, under the same cut name.
    assert_eq!(long(1), long(0).replace("-0.mp4", "-1.mp4"));
    assert!(
        made.iter()
            .any(|n| n.starts_with("éé") && n.contains(&hash(&accents)))
    );
}

/// A names file must exist to apply and must have the prompt file's line count.
#[test]
fn names_files_are_checked_before_anything_is_written() {
    let t = Test::new();
    vbench_generation(&t, "bad", &["one", "two"], &["one", "two", "three"], "");
    let out = t.cmd().args(["apply", "--quiet", "bad.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("has 3 lines and the prompt file has 2")
            && out.stderr.contains("bad.toml:"),
        "{}",
        out.render()
    );
    std::fs::remove_file(t.path().join("bad-standard.txt")).unwrap();
    let out = t.cmd().args(["apply", "--quiet", "bad.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(out.stderr.contains("does not exist"), "{}", out.render());
    assert!(!t.path().join("results").exists(), "nothing written");
}

pub(crate) fn status(run_dir: &Path) -> (String, String) {
    let run = read_json(&run_dir.join("run.json"));
    (
        run["status"].as_str().unwrap().to_string(),
        run["evaluation"]["status"].as_str().unwrap().to_string(),
    )
}

/// An evaluation that fails, writes garbage or writes nothing: each a clear error, status
/// `evaluation_failed`, exit 1, every video kept; applying again runs only the evaluation, and
/// `runner evaluate` runs it on its own.
#[test]
fn a_failing_evaluation_keeps_the_videos_and_runs_again_alone() {
    let t = Test::new();
    let standard = [BUND, QUOTES, BUND];
    let ext = extended(&standard);
    vbench_generation(&t, "ev", &strs(&ext), &standard, &evaluation(&t));
    let run_dir = t.path().join("results/ev");

    mode(&t, "fail");
    let out = t.cmd().args(["apply", "--quiet", "ev.toml"]).run();
    assert_eq!(out.code, 1, "{}", out.render());
    assert!(
        out.stderr.contains("failed (exit status: 3)")
            && out.stderr.contains("CUDA out of memory (stand-in)")
            && out.stderr.contains("logs/evaluation.log")
            && out.stderr.contains("every video is made and kept"),
        "{}",
        out.render()
    );
    assert_eq!(
        status(&run_dir),
        ("evaluation_failed".into(), "failed".into())
    );
    let made = videos(&run_dir);
    assert_eq!(made.len(), 3);
    let timings = records(&run_dir).len();
    let log = std::fs::read_to_string(run_dir.join("logs/evaluation.log")).unwrap();
    assert!(log.contains("stand-in evaluation: fail"), "{log}");
    let report = t.cmd().args(["report", "ev"]).run();
    assert!(
        report
            .stdout
            .contains("run `ev` (generation): evaluation_failed")
            && report.stdout.contains("evaluation: failed"),
        "{}",
        report.stdout
    );

    // Applying again runs only the evaluation, as the plan says: no prompt is made again.
    let plan = t.cmd().args(["plan", "ev.toml"]).run();
    assert!(
        plan.stdout
            .contains("all 3 prompts done; apply runs only the evaluation"),
        "{}",
        plan.render()
    );
    mode(&t, "garbage");
    let out = t.cmd().args(["apply", "ev.toml"]).run();
    assert_eq!(out.code, 1, "{}", out.render());
    assert!(
        out.stderr.contains("only the evaluation runs")
            && out.stderr.contains("results_")
            && out.stderr.contains("is not JSON"),
        "{}",
        out.render()
    );
    assert_eq!(records(&run_dir).len(), timings, "no prompt made again");
    assert_eq!(videos(&run_dir), made);
    assert_eq!(
        status(&run_dir),
        ("evaluation_failed".into(), "failed".into())
    );

    mode(&t, "nothing");
    let out = t.cmd().args(["evaluate", "ev"]).run();
    assert_eq!(out.code, 1, "{}", out.render());
    assert!(
        out.stderr.contains("exited 0 but wrote no scores file")
            && out.stderr.contains("stand-in/results_*_eval_results.json"),
        "{}",
        out.render()
    );
    // The garbage of the last evaluation was removed before this one ran.
    let left = crate::support::tree(&run_dir.join("eval.attempt"));
    assert!(left.iter().all(|f| !f.contains("results_")), "{left:?}");
    assert_eq!(
        status(&run_dir),
        ("evaluation_failed".into(), "failed".into())
    );

    mode(&t, "scores 1.0");
    let out = t.cmd().args(["evaluate", "ev"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert_eq!(status(&run_dir), ("succeeded".into(), "succeeded".into()));
    assert_eq!(
        read_json(&run_dir.join("eval/scores.json")),
        serde_json::json!({"subject_consistency": 1.0, "color": 0.99})
    );
    assert!(
        out.stdout.contains("subject_consistency  1.0000"),
        "{}",
        out.stdout
    );
    assert_eq!(records(&run_dir).len(), timings);
    assert_eq!(videos(&run_dir), made);
    let plan = t.cmd().args(["plan", "ev.toml"]).run();
    assert!(
        plan.stdout
            .contains("all 3 prompts done; apply resumes and generates nothing"),
        "{}",
        plan.render()
    );
    // --json: the evaluation record, as run.json has it, and nothing else on stdout.
    let out = t.cmd().args(["evaluate", "ev", "--json"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let evaluation: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(evaluation["status"], "succeeded");
    assert_eq!(evaluation["scores"]["subject_consistency"], 1.0);
    assert_eq!(
        evaluation,
        read_json(&run_dir.join("run.json"))["evaluation"]
    );
}

/// A scoring that fails or is interrupted after one that succeeded leaves the earlier scores
/// (in `run.json` and `eval/scores.json`) and the earlier evaluation's output in `eval/` as they
/// were; the report says whose scores they are. The next success replaces them.
#[test]
fn a_failed_evaluation_keeps_the_earlier_scores_and_output() {
    let t = Test::new();
    let standard = [BUND, QUOTES];
    let ext = extended(&standard);
    vbench_generation(&t, "keep", &strs(&ext), &standard, &evaluation(&t));
    let run_dir = t.path().join("results/keep");
    mode(&t, "scores 1.0");
    let out = t.cmd().args(["apply", "--quiet", "keep.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let scores = read_json(&run_dir.join("eval/scores.json"));
    let output = crate::support::tree(&run_dir.join("eval"));
    let recorded = read_json(&run_dir.join("run.json"))["evaluation"]["scores"].clone();
    assert_eq!(recorded, scores);

    for failing in ["fail", "garbage", "nothing"] {
        mode(&t, failing);
        let out = t.cmd().args(["evaluate", "keep"]).run();
        assert_eq!(out.code, 1, "{failing}: {}", out.render());
        assert_eq!(
            status(&run_dir),
            ("evaluation_failed".into(), "failed".into())
        );
        let run = read_json(&run_dir.join("run.json"));
        assert_eq!(run["evaluation"]["scores"], scores, "{failing}: {run}");
        assert_eq!(read_json(&run_dir.join("eval/scores.json")), scores);
        assert_eq!(
            crate::support::tree(&run_dir.join("eval")),
            output,
            "{failing}"
        );
    }
    let report = t.cmd().args(["report", "keep"]).run();
    assert!(
        report
            .stdout
            .contains("eval/scores.json, of the last evaluation that succeeded)"),
        "{}",
        report.stdout
    );

    mode(&t, "scores 0.5");
    let out = t.cmd().args(["evaluate", "keep"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert_eq!(
        read_json(&run_dir.join("eval/scores.json")),
        serde_json::json!({"subject_consistency": 0.5, "color": 0.49})
    );
    assert!(!run_dir.join("eval.attempt").exists());
}

/// `runner evaluate` refuses a run that has no evaluation, or whose generation is not complete.
#[test]
fn evaluate_refuses_runs_it_cannot_score() {
    let t = Test::new();
    let out = t.cmd().args(["evaluate", "nope"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(out.stderr.contains("no run `nope`"), "{}", out.render());

    let standard = [BUND, BUND];
    vbench_generation(
        &t,
        "plain",
        &["a long bund", "a longer bund"],
        &standard,
        "",
    );
    let out = t.cmd().args(["apply", "--quiet", "plain.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let out = t.cmd().args(["evaluate", "plain"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("has no evaluation") && out.stderr.contains("[evaluation]"),
        "{}",
        out.render()
    );
}

/// The command is a list; `--set` gives it as a TOML list in text. One string is refused with
/// where and why (it would need a shell to split), and so is an unknown placeholder.
#[test]
fn evaluation_commands_are_lists_checked_where_they_are_set() {
    let t = Test::new();
    vbench_generation(&t, "cmd", &["one", "two"], &[BUND, QUOTES], "");
    let set = |value: &str| {
        t.cmd()
            .args(["plan", "cmd.toml", "--set"])
            .args([format!("evaluation.command={value}")])
            .run()
    };
    let out = set(r#"["python3", "score.py", "{videos}", "{names_file}"]"#);
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(
        out.stdout.contains(
            "evaluation after a complete generation: python3 score.py {videos} {names_file}"
        ),
        "{}",
        out.render()
    );
    let out = set("vbench evaluate --videos_path {videos}");
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("a list of arguments, not one string")
            && out.stderr.contains("--set evaluation.command"),
        "{}",
        out.render()
    );
    let path = t.path().join("cmd.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text + "[evaluation]\ncommand = [\"score\", \"{video}\"]\n",
    )
    .unwrap();
    let out = t.cmd().args(["plan", "cmd.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("unknown placeholder `{video}`") && out.stderr.contains("cmd.toml:"),
        "{}",
        out.render()
    );
}

/// A probe measures speed and keeps no complete set of videos: an `[evaluation]` there is
/// refused at its line rather than silently never run.
#[test]
fn a_probe_with_an_evaluation_is_refused_at_the_setting() {
    let t = Test::new();
    vbench_generation(&t, "probe", &["one", "two"], &[BUND, QUOTES], "");
    let out = t
        .cmd()
        .args([
            "plan",
            "probe.toml",
            "--set",
            "kind=probe",
            "--set",
            "shards.count=1",
        ])
        .args([r#"--set=evaluation.command=["python3", "score.py", "{videos}"]"#])
        .run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("a probe is not evaluated")
            && out.stderr.contains("--set evaluation.command"),
        "{}",
        out.render()
    );
}

/// Ctrl-C (here SIGTERM) during the evaluation stops the evaluation command too, and the run
/// reads interrupted, not failed; applying again runs only the evaluation.
#[test]
fn an_interrupted_evaluation_is_stopped_and_recorded_as_interrupted() {
    let t = Test::new();
    let standard = [BUND, QUOTES];
    let ext = extended(&standard);
    vbench_generation(&t, "stop", &strs(&ext), &standard, &evaluation(&t));
    let run_dir = t.path().join("results/stop");
    mode(&t, "sleep");
    let mut apply = crate::apply::spawn_apply(&t, "stop.toml");
    let log = run_dir.join("logs/evaluation.log");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains("stand-in evaluation: sleep")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the evaluation never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(apply.id() as libc::pid_t, libc::SIGTERM) };
    let exit = apply.wait().unwrap();
    assert_eq!(exit.code(), Some(130));
    assert_eq!(
        status(&run_dir),
        ("interrupted".into(), "interrupted".into())
    );
    let script = t.path().join("stand_in.py").display().to_string();
    assert!(
        crate::support::processes_with(&script).is_empty(),
        "the evaluation command was stopped with the run"
    );
    let made = videos(&run_dir);
    mode(&t, "scores 1.0");
    let out = t.cmd().args(["apply", "stop.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(
        out.stderr.contains("only the evaluation runs"),
        "{}",
        out.render()
    );
    assert_eq!(status(&run_dir), ("succeeded".into(), "succeeded".into()));
    assert_eq!(videos(&run_dir), made);
}

/// The refusal reads every form of a bundle: the same seeded random weights zipped are refused
/// before anything is written, as the directory is.
#[test]
fn random_weights_in_a_zip_bundle_are_not_scored_either() {
    use std::io::Write;
    let t = Test::new();
    let standard = [BUND, QUOTES];
    let ext = extended(&standard);
    vbench_generation(&t, "rnd", &strs(&ext), &standard, &evaluation(&t));
    mode(&t, "scores 1.0");
    let tiny = crate::support::repo().join("assets/tiny");
    let zip_path = t.path().join("tiny.zip");
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&zip_path).unwrap());
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for entry in std::fs::read_dir(&tiny).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let name = format!("tiny/{}", path.file_name().unwrap().to_str().unwrap());
            zip.start_file(name, options).unwrap();
            zip.write_all(&std::fs::read(&path).unwrap()).unwrap();
        }
    }
    zip.finish().unwrap();
    let path = t.path().join("rnd.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("allow_random_weights = true\n", "")
        .replace(
            &format!("bundle = \"{}\"", tiny.display()),
            &format!("bundle = \"{}\"", zip_path.display()),
        );
    assert!(text.contains("tiny.zip"), "{text}");
    std::fs::write(&path, text).unwrap();
    let before = crate::support::tree(t.path());
    let out = t.cmd().args(["apply", "--quiet", "rnd.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("rnd.toml:")
            && out
                .stderr
                .contains("tiny.zip has seeded random weights (dit, vae, text_encoder)"),
        "{}",
        out.render()
    );
    assert_eq!(crate::support::tree(t.path()), before, "nothing written");
}

/// A generation of seeded random weights with an `[evaluation]` is refused before anything is
/// written, at the bundle's setting, with the way to the released weights and the explicit
/// switch; with `assets.allow_random_weights = true` it runs, and its record says the weights
/// are random. `runner evaluate` refuses such a run's record without the switch.
#[test]
fn random_weights_are_not_scored_unless_the_manifest_says_so() {
    let t = Test::new();
    let standard = [BUND, QUOTES];
    let ext = extended(&standard);
    vbench_generation(&t, "rnd", &strs(&ext), &standard, &evaluation(&t));
    mode(&t, "scores 1.0");
    let path = t.path().join("rnd.toml");
    let allowed = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, allowed.replace("allow_random_weights = true\n", "")).unwrap();
    let before = crate::support::tree(t.path());
    let out = t.cmd().args(["apply", "--quiet", "rnd.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    for needle in [
        "rnd.toml:",
        "seeded random weights (dit, vae, text_encoder)",
        "unstep_export download",
        "export --released",
        "assets.allow_random_weights = true",
    ] {
        assert!(out.stderr.contains(needle), "{needle}: {}", out.render());
    }
    assert_eq!(crate::support::tree(t.path()), before, "nothing written");

    std::fs::write(&path, &allowed).unwrap();
    let out = t.cmd().args(["apply", "--quiet", "rnd.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let run_dir = t.path().join("results/rnd");
    let run = crate::apply::read_json(&run_dir.join("run.json"));
    assert_eq!(run["weights"]["source"], "random", "{run}");
    assert_eq!(
        run["settings"]["assets.allow_random_weights"]["value"],
        true
    );
    let report = t.cmd().args(["report", "rnd"]).run();
    assert!(
        report
            .stdout
            .contains("weights       random (seeded random weights"),
        "{}",
        report.render()
    );

    // A record without the switch (as an older runner wrote it) is not evaluated.
    let mut edited = run.clone();
    edited["settings"]
        .as_object_mut()
        .unwrap()
        .remove("assets.allow_random_weights");
    std::fs::write(run_dir.join("run.json"), edited.to_string()).unwrap();
    let out = t.cmd().args(["evaluate", "rnd"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("seeded random weights")
            && out.stderr.contains("assets.allow_random_weights = true"),
        "{}",
        out.render()
    );
}

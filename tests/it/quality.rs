//! Runs that keep their latents and frames (`outputs.save_latents`, `outputs.save_frames`), and
//! `runner compare` measuring one against another on the same noise, on the tiny bundle and the
//! CPU.

use std::path::Path;

use crate::apply::{generation, read_json};
use crate::support::Test;

/// A two-prompt generation `<name>.toml` that keeps latents and frames, with `extra` appended.
fn keeping(t: &Test, name: &str, extra: &str) {
    let path = generation(t, name, "0-1");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "[outputs]\n",
        "[outputs]\nsave_latents = true\nsave_frames = true\n",
    );
    std::fs::write(&path, format!("{text}{extra}")).unwrap();
}

fn apply(t: &Test, name: &str) {
    let out = t
        .cmd()
        .args(["apply", "--quiet", &format!("{name}.toml")])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
}

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn kept_arrays_measure_a_run_against_another_on_the_same_noise() {
    let t = Test::new();
    keeping(&t, "reference", "");
    keeping(&t, "again", "");
    keeping(&t, "sigma", "");
    keeping(&t, "seed", "");
    keeping(&t, "texts", "");
    // Another prompt file: prompt 0 as in the reference's, prompt 1 another text.
    let tiny =
        std::fs::read_to_string(crate::support::repo().join("assets/prompts/tiny.txt")).unwrap();
    let mut lines: Vec<&str> = tiny.lines().collect();
    lines[1] = "a lighthouse in a storm at night";
    std::fs::write(t.path().join("other.txt"), lines.join("\n") + "\n").unwrap();
    let plan = t.cmd().args(["plan", "reference.toml"]).run();
    assert!(
        plan.stdout.contains(
            "  keeps         results/reference/latents/ and results/reference/frames/ of every \
             measured prompt (for runner compare's quality)\n"
        ),
        "{}",
        plan.render()
    );
    apply(&t, "reference");
    apply(&t, "again");
    let sigma = t
        .cmd()
        .args([
            "apply",
            "--quiet",
            "sigma.toml",
            "--set",
            "method.clean_sigma=0.2",
        ])
        .run();
    assert_eq!(sigma.code, 0, "{}", sigma.render());
    let seed = t
        .cmd()
        .args(["apply", "--quiet", "seed.toml", "--set", "noise.seed=1"])
        .run();
    assert_eq!(seed.code, 0, "{}", seed.render());
    let other_file = format!("prompts.file={}", t.path().join("other.txt").display());
    let texts = t
        .cmd()
        .args(["apply", "--quiet", "texts.toml", "--set", &other_file])
        .run();
    assert_eq!(texts.code, 0, "{}", texts.render());

    // The measured prompts' arrays, whole, and none of the warmups' (they also made prompt 0).
    let run = t.path().join("results/reference");
    assert_eq!(
        file_names(&run.join("latents")),
        ["latents_0.f32", "latents_1.f32"]
    );
    assert_eq!(
        file_names(&run.join("frames")),
        ["frames_0.u8", "frames_1.u8"]
    );
    let frames = std::fs::read(run.join("frames/frames_0.u8")).unwrap();
    assert!(
        !frames.is_empty() && frames.len().is_multiple_of(64 * 112 * 3),
        "{} bytes",
        frames.len()
    );
    let latents = std::fs::metadata(run.join("latents/latents_0.f32")).unwrap();
    assert!(latents.len() > 0 && latents.len().is_multiple_of(4));

    // The report says what the run kept.
    let report = t.cmd().args(["report", "reference"]).run();
    assert!(
        report.stdout.contains(
            "  kept          frames/ of 2 prompts, latents/ of 2 prompts (runner compare \
             measures other runs against them)\n"
        ),
        "{}",
        report.stdout
    );
    let report = t.cmd().args(["report", "reference", "--json"]).run();
    let report: serde_json::Value = serde_json::from_str(&report.stdout).unwrap();
    assert_eq!(
        report["kept"],
        serde_json::json!({"latents": 2, "frames": 2})
    );

    // The same settings: identical outputs.
    let same = t.cmd().args(["compare", "reference", "again"]).run();
    assert_eq!(same.code, 0, "{}", same.render());
    assert_eq!(same.stderr, "", "{}", same.render());
    assert!(
        same.stdout
            .contains("quality of `again` against `reference` on the same noise"),
        "{}",
        same.stdout
    );
    assert!(
        same.stdout.contains("  latents  2 prompts    identical\n"),
        "{}",
        same.stdout
    );
    assert!(
        same.stdout
            .contains("  frames   2 prompts    identical  abs diff mean 0.00  max 0 levels"),
        "{}",
        same.stdout
    );

    // Another clean-cache sigma: measured, as data too.
    let json = t
        .cmd()
        .args(["compare", "reference", "sigma", "--json"])
        .run();
    assert_eq!(json.code, 0, "{}", json.render());
    let q = &serde_json::from_str::<serde_json::Value>(&json.stdout).unwrap()["quality"];
    assert_eq!(q["run"], "sigma");
    assert_eq!(q["against"], "reference");
    assert_eq!(q["latents"]["prompts"], 2);
    let error = q["latents"]["mean_relative_l2"].as_f64().unwrap();
    assert!(error > 0.0 && error.is_finite(), "{q}");
    assert_eq!(q["frames"]["identical"], 0, "{q}");
    // Each prompt's figures, the worst among them.
    let per_prompt = q["latents"]["per_prompt"].as_array().unwrap();
    assert_eq!(per_prompt.len(), 2, "{q}");
    let worst = q["latents"]["worst_prompt"].as_u64().unwrap();
    let max = q["latents"]["max_relative_l2"].as_f64().unwrap();
    assert!(
        per_prompt
            .iter()
            .any(|p| p["prompt"] == worst && p["relative_l2"].as_f64() == Some(max)),
        "{q}"
    );
    let psnr = q["frames"]["mean_psnr_db"].as_f64().unwrap();
    assert!(psnr > 0.0 && psnr.is_finite(), "{q}");
    assert!(q["frames"]["max_abs_diff"].as_u64().unwrap() > 0, "{q}");

    // Another seed: other noise, so no quality, and a warning that says why.
    let other_noise = t.cmd().args(["compare", "reference", "seed"]).run();
    assert_eq!(other_noise.code, 0, "{}", other_noise.render());
    assert!(
        !other_noise.stdout.contains("quality of"),
        "{}",
        other_noise.stdout
    );
    assert!(
        other_noise.stderr.contains(
            "warning: no quality compared: `reference` and `seed` drew different noise \
             (noise.seed: 0 against 1)"
        ),
        "{}",
        other_noise.render()
    );

    // Prompt 1 of another text is another prompt: left out, with a warning; prompt 0 is the same.
    let other_texts = t.cmd().args(["compare", "reference", "texts"]).run();
    assert_eq!(other_texts.code, 0, "{}", other_texts.render());
    assert!(
        other_texts.stderr.contains(
            "warning: 1 prompt left out of the quality: `reference` and `texts` made them from \
             other texts (prompt 1)"
        ),
        "{}",
        other_texts.render()
    );
    assert!(
        other_texts
            .stdout
            .contains("  latents  1 prompt     identical\n"),
        "{}",
        other_texts.stdout
    );

    // Three runs: each later one against the first.
    let three = t
        .cmd()
        .args(["compare", "reference", "again", "sigma"])
        .run();
    assert_eq!(three.code, 0, "{}", three.render());
    for run in ["again", "sigma"] {
        assert!(
            three
                .stdout
                .contains(&format!("quality of `{run}` against `reference`")),
            "{}",
            three.stdout
        );
    }

    // A prompt whose kept latents are lost is made again on the next apply, and only it.
    let kept = run.join("latents/latents_1.f32");
    let before = std::fs::read(&kept).unwrap();
    let untouched = std::fs::metadata(run.join("frames/frames_0.u8"))
        .unwrap()
        .modified()
        .unwrap();
    std::fs::remove_file(&kept).unwrap();
    apply(&t, "reference");
    assert_eq!(std::fs::read(&kept).unwrap(), before);
    assert_eq!(
        std::fs::metadata(run.join("frames/frames_0.u8"))
            .unwrap()
            .modified()
            .unwrap(),
        untouched
    );
    let record = read_json(&run.join("run.json"));
    assert_eq!(record["status"], "succeeded", "{record}");
}

//! `runner worker` as a user meets it: its help, its usage errors before any work, a missing
//! ONNX Runtime, and the environment probe.

use unstep::engine::probe_environment;

use super::{runner, stderr, worker};

#[test]
fn a_missing_onnx_runtime_says_how_to_fix_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("libonnxruntime.so");
    let output = worker(
        dir.path(),
        &["--indices", "0", "--ort-library", missing.to_str().unwrap()],
    );
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(unstep::exit::FAILURE), "{err}");
    assert!(err.contains("no library at"), "{err}");
    assert!(err.contains("scripts/fetch-onnxruntime"), "{err}");
}

#[test]
fn worker_is_hidden_from_the_top_level_help_and_documents_its_flags() {
    let top = runner(&["--help"]);
    assert!(!String::from_utf8_lossy(&top.stdout).contains("worker"));
    let help = runner(&["worker", "--help"]);
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--bundle",
        "--prompts",
        "--indices",
        "--seed",
        "--clean-sigma-override",
        "--emit",
        "--save-latents",
        "--save-frames",
        "--timings",
        "--provider",
        "--threads",
        "--latents-only",
        "--exclude-final-output-layout",
        "--bench",
    ] {
        assert!(text.contains(flag), "worker --help lacks {flag}");
    }
    // `apply --help` points at the broader worker flags and at the method table.
    let apply = runner(&["apply", "--help"]);
    let text = String::from_utf8_lossy(&apply.stdout);
    assert!(
        text.contains("`runner worker --help`") && text.contains("docs/settings.md"),
        "{text}"
    );
    let settings =
        std::fs::read_to_string(crate::support::repo().join("docs/settings.md")).unwrap();
    for key in [
        "clean_sigma",
        "timestep_shift",
        "frames_per_block",
        "svd_rank",
    ] {
        assert!(
            settings.contains(&format!("| `{key}` |")),
            "docs/settings.md's method table lacks {key}"
        );
    }
}

#[test]
fn bad_prompt_indices_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let output = worker(dir.path(), &["--indices", "5,2"]);
    assert_eq!(output.status.code(), Some(unstep::exit::USAGE));
    assert!(stderr(&output).contains("sorted"), "{}", stderr(&output));
    let output = worker(dir.path(), &["--indices", "999"]);
    assert_eq!(output.status.code(), Some(unstep::exit::USAGE));
    assert!(
        stderr(&output).contains("beyond the prompt file"),
        "{}",
        stderr(&output)
    );
}

/// CUDA graphs are ONNX Runtime's CUDA provider's: asked for on another provider, the worker
/// stops with a usage error before any session is built, and writes nothing.
#[test]
fn cuda_graphs_on_another_provider_are_a_usage_error_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let timings = dir.path().join("t.jsonl");
    let output = worker(
        dir.path(),
        &[
            "--provider",
            "cpu",
            "--cuda-graphs",
            "--indices",
            "0",
            "--timings",
            timings.to_str().unwrap(),
        ],
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("--cuda-graphs needs --provider cuda") && err.contains("leave the flag out"),
        "{err}"
    );
    assert!(!timings.exists(), "nothing written");
}

#[test]
fn an_unknown_cuda_arena_growth_is_a_usage_error_naming_the_choices() {
    let dir = tempfile::tempdir().unwrap();
    let output = worker(dir.path(), &["--cuda-arena", "doubling"]);
    assert_eq!(output.status.code(), Some(unstep::exit::USAGE));
    let err = stderr(&output);
    assert!(
        err.contains("same_as_requested") && err.contains("next_power_of_two"),
        "{err}"
    );
}

#[test]
fn unknown_fused_kernels_are_usage_errors_naming_the_choices() {
    let dir = tempfile::tempdir().unwrap();
    for flag in ["--dit-kernels", "--vae-kernels"] {
        let output = worker(dir.path(), &[flag, "fast"]);
        assert_eq!(output.status.code(), Some(unstep::exit::USAGE), "{flag}");
        let err = stderr(&output);
        assert!(
            err.contains(flag) && err.contains("possible values: auto, unstep, onnxruntime"),
            "{err}"
        );
    }
}

#[test]
fn the_environment_probe_reports_onnx_runtime_and_the_cpu_provider() {
    let checks = probe_environment(None);
    let ort = checks
        .iter()
        .find(|c| c.name == "onnx runtime")
        .expect("an onnx runtime check");
    assert!(ort.ok, "{ort:?}");
    assert!(ort.detail.starts_with("1."), "{ort:?}");
    let cpu = checks
        .iter()
        .find(|c| c.name == "execution provider cpu")
        .expect("a cpu check");
    assert!(cpu.ok, "{cpu:?}");
}

/// A worker that writes no videos keeps each prompt (outputs and record written) in turn: a
/// prompt that cannot be kept stops the worker with its error, the prompts before it stay kept,
/// and no prompt after it is generated or recorded.
#[test]
fn a_prompt_that_cannot_be_kept_stops_the_worker_after_the_ones_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let frames = dir.path().join("frames");
    let timings = dir.path().join("timings.jsonl");
    // Prompt 1's frames file cannot be written: a folder holds its name.
    std::fs::create_dir_all(frames.join("frames_1.u8/occupied")).unwrap();
    let output = worker(
        dir.path(),
        &[
            "--indices",
            "0-3",
            "--save-frames",
            frames.to_str().unwrap(),
            "--timings",
            timings.to_str().unwrap(),
        ],
    );
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(unstep::exit::FAILURE), "{err}");
    assert!(err.contains("frames_1.u8"), "{err}");
    let recorded: Vec<u64> = std::fs::read_to_string(&timings)
        .unwrap()
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["prompt"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(
        recorded,
        [0],
        "only the prompt before the failure is recorded"
    );
    assert!(frames.join("frames_0.u8").is_file());
    for later in ["frames_2.u8", "frames_3.u8"] {
        assert!(
            !frames.join(later).exists(),
            "{later} kept after the failure"
        );
    }
}

//! What `runner apply` refuses before any work, and what it leaves then: nothing written, a
//! message that says where and what to do, exit 2.

use std::path::PathBuf;

use super::{Tmpfs, generation, manifest};
use crate::support::{Test, repo};

#[test]
fn unsafe_paths_are_refused_before_anything_is_written() {
    let t = Test::new();
    let text = manifest(&t, "probe", "").replace(
        &format!("dir = \"{}/results\"", t.path().display()),
        &format!("dir = \"{}/assets/tiny/out\"", repo().display()),
    );
    std::fs::write(t.path().join("bad.toml"), text).unwrap();
    let out = t.cmd().args(["apply", "--quiet", "bad.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("overlaps the asset bundle"),
        "{}",
        out.stderr
    );
    assert!(!repo().join("assets/tiny/out").exists());
    assert!(!t.path().join("work").exists());
}

#[test]
fn a_missing_bundle_is_an_apply_error_naming_the_export_command() {
    let t = Test::new();
    let text = manifest(&t, "probe", "")
        .replace("[prompts]\n", "[prompts]\nindices = \"0\"\n")
        .replace(
            &format!("bundle = \"{}\"", repo().join("assets/tiny").display()),
            "bundle = \"nope\"",
        );
    std::fs::write(t.path().join("m.toml"), text).unwrap();
    let plan = t.cmd().args(["plan", "m.toml"]).run();
    assert_eq!(
        plan.code,
        0,
        "a missing bundle is only a warning for plan: {}",
        plan.render()
    );
    assert!(plan.stdout.contains("does not exist yet"));
    let out = t.cmd().args(["apply", "--quiet", "m.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(out.stderr.contains("unstep_export"), "{}", out.stderr);
    assert!(!t.path().join("results").exists());
}

#[test]
fn an_attention_backend_the_provider_lacks_is_refused_before_any_work() {
    let t = Test::new();
    let text = manifest(&t, "probe", "")
        .replace("[prompts]\n", "[prompts]\nindices = \"0\"\n")
        .replace(
            "[method]\n",
            "[method]\nattention_backend = \"cudnn_flash\"\n",
        );
    std::fs::write(t.path().join("m.toml"), text).unwrap();
    let out = t.cmd().args(["apply", "--quiet", "m.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr
            .contains("`cudnn_flash` is not available on the CPU"),
        "{}",
        out.stderr
    );
    assert!(!t.path().join("results").exists() && !t.path().join("work").exists());
}

#[test]
fn a_misspelt_diagnostic_log_level_is_refused_before_any_work() {
    let t = Test::new();
    let text = manifest(&t, "probe", "").replace("[prompts]\n", "[prompts]\nindices = \"0\"\n");
    std::fs::write(t.path().join("m.toml"), text).unwrap();
    let out = t
        .cmd()
        .args(["apply", "--quiet", "m.toml"])
        .env("UNSTEP_ORT_LOG", "verbos")
        .run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr
            .contains("UNSTEP_ORT_LOG=\"verbos\" is not a log level")
            && out.stderr.contains("verbose, info or warning"),
        "{}",
        out.stderr
    );
    assert!(!t.path().join("results").exists() && !t.path().join("work").exists());
}

/// The runner's fused kernels asked for by name where the bundle cannot run them: the tiny bundle
/// is fp32 and its fused DiT's self-attention is cuDNN's (fp16 on CUDA). Refused before any work,
/// at the setting's line.
#[test]
fn fused_kernels_the_bundle_cannot_run_are_refused_at_their_setting_before_any_work() {
    let t = Test::new();
    let text = manifest(&t, "probe", "")
        .replace("[prompts]\n", "[prompts]\nindices = \"0\"\n")
        .replace(
            "provider = \"cpu\"\n",
            "provider = \"cuda\"\ndit_kernels = \"unstep\"\n",
        );
    std::fs::write(t.path().join("m.toml"), &text).unwrap();
    let line = text
        .lines()
        .position(|l| l.starts_with("dit_kernels"))
        .unwrap()
        + 1;
    let out = t.cmd().args(["apply", "--quiet", "m.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains(&format!("m.toml:{line}:"))
            && out.stderr.contains("this one is fp32")
            && out.stderr.contains("dit_kernels"),
        "{}",
        out.stderr
    );
    assert!(!t.path().join("results").exists() && !t.path().join("work").exists());
}

/// The tiny bundle as an fp8 bundle at `<test>/fp8`: its `bundle.toml` says `precision = "fp8"`
/// and every other file is a link to the tiny bundle's (the checks before a run read
/// `bundle.toml` and the tokenizer alone).
fn fp8_bundle(t: &Test) -> PathBuf {
    let tiny = repo().join("assets/tiny");
    let dir = t.path().join("fp8");
    std::fs::create_dir_all(&dir).unwrap();
    // The graphs as links to the tiny bundle's files (a linked folder, such as its golden
    // outputs, would be refused as a bundle's subfolder).
    for entry in std::fs::read_dir(&tiny).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name != "bundle.toml" && entry.path().is_file() {
            std::os::unix::fs::symlink(tiny.join(&name), dir.join(&name)).unwrap();
        }
    }
    let text = std::fs::read_to_string(tiny.join("bundle.toml")).unwrap();
    let text = text.replacen("precision = \"fp32\"", "precision = \"fp8\"", 1);
    std::fs::write(dir.join("bundle.toml"), text).unwrap();
    dir
}

/// An fp8 bundle on the CPU provider, or with ONNX Runtime's kernels for its DiT on CUDA, is
/// refused before any work, at the setting that asked for it.
#[test]
fn an_fp8_bundle_where_it_cannot_run_is_refused_before_any_work() {
    let t = Test::new();
    let bundle = fp8_bundle(&t);
    let fp8 = |runtime: &str| {
        manifest(&t, "probe", "")
            .replace("[prompts]\n", "[prompts]\nindices = \"0\"\n")
            .replace("precision = \"fp32\"", "precision = \"fp8\"")
            .replace(
                &repo().join("assets/tiny").display().to_string(),
                &bundle.display().to_string(),
            )
            .replace("provider = \"cpu\"\n", runtime)
    };
    let cases = [
        (
            "provider = \"cpu\"\n",
            "provider",
            "precision fp8 does not run on the CPU provider, which runs fp32 bundles only",
        ),
        (
            "provider = \"cuda\"\ndit_kernels = \"onnxruntime\"\n",
            "dit_kernels",
            "an fp8 bundle runs its DiT's 8-bit matrix multiplies only with the runner's kernels",
        ),
        (
            "provider = \"tensorrt\"\n",
            "",
            "this run's provider is tensorrt; use runtime.provider = \"cuda\"",
        ),
    ];
    for (runtime, key, problem) in cases {
        let text = fp8(runtime);
        std::fs::write(t.path().join("m.toml"), &text).unwrap();
        let out = t.cmd().args(["apply", "--quiet", "m.toml"]).run();
        assert_eq!(out.code, 2, "{runtime}: {}", out.render());
        assert!(out.stderr.contains(problem), "{runtime}: {}", out.stderr);
        if !key.is_empty() {
            let line = text.lines().position(|l| l.starts_with(key)).unwrap() + 1;
            assert!(
                out.stderr.contains(&format!("m.toml:{line}:")),
                "{runtime}: {}",
                out.stderr
            );
        }
        assert!(
            !t.path().join("results").exists() && !t.path().join("work").exists(),
            "{runtime}"
        );
    }
}

#[test]
fn re_applying_a_run_with_a_changed_configuration_is_refused() {
    let t = Test::new();
    let path = generation(&t, "chg", "0-1");
    let out = t.cmd().args(["apply", "--quiet", "chg.toml"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let before = std::fs::read(t.path().join("results/chg/run.json")).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("[method]\n", "[method]\nclean_sigma = 0.01\n"),
    )
    .unwrap();
    let again = t.cmd().args(["apply", "--quiet", "chg.toml"]).run();
    assert_eq!(again.code, 2, "{}", again.render());
    assert!(
        again.stderr.contains("different configuration")
            && again.stderr.contains("method.clean_sigma: 0.02 → 0.01"),
        "{}",
        again.stderr
    );
    assert!(again.stderr.contains("own run name"), "{}", again.stderr);
    assert_eq!(
        std::fs::read(t.path().join("results/chg/run.json")).unwrap(),
        before,
        "nothing lost"
    );
}

/// A work root on a file system too small for what staging must copy (the bundle and the runner
/// live on another file system, so they cannot be linked) is refused before anything is written,
/// with the bytes needed and free, and a way out.
#[test]
fn a_work_root_without_room_for_the_staging_is_refused_before_anything_is_written() {
    let t = Test::new();
    let Some(_small) = Tmpfs::mount(&t.path().join("work"), "2m") else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    std::fs::write(
        t.path().join("full.toml"),
        manifest(&t, "probe", "").replace("[prompts]\n", "[prompts]\nindices = \"0\"\n"),
    )
    .unwrap();
    let out = t.cmd().args(["apply", "--quiet", "full.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("staging needs ")
            && out.stderr.contains("and its file system has ")
            && out.stderr.contains("free")
            && out.stderr.contains("staging.work_root"),
        "{}",
        out.render()
    );
    assert!(!t.path().join("results").exists(), "{}", out.render());
    assert_eq!(
        std::fs::read_dir(t.path().join("work")).unwrap().count(),
        0,
        "nothing in the work root"
    );
}

/// Without an ONNX Runtime to load, an apply is refused before anything is written (not failed in
/// its workers after staging, whose snapshot would then block the next apply).
#[test]
fn a_missing_onnx_runtime_is_refused_before_staging() {
    let t = Test::new();
    std::fs::write(
        t.path().join("no_ort.toml"),
        manifest(&t, "probe", "").replace("[prompts]\n", "[prompts]\nindices = \"0\"\n"),
    )
    .unwrap();
    let empty = t.path().join("no-onnxruntime-here");
    std::fs::create_dir_all(&empty).unwrap();
    let out = t
        .cmd()
        .env("UNSTEP_ORT_CACHE_DIR", empty.to_str().unwrap())
        .env("ORT_DYLIB_PATH", "")
        .env("PATH", "/usr/bin:/bin")
        .args(["apply", "--quiet", "no_ort.toml"])
        .run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("ONNX Runtime") && out.stderr.contains("runner doctor"),
        "{}",
        out.render()
    );
    assert!(!t.path().join("results").exists(), "{}", out.render());
    assert!(!t.path().join("work").exists(), "{}", out.render());
}

//! `runner doctor` with the real ONNX Runtime: what it finds and how it reports a broken bundle.

use crate::support::{Test, fake_nvidia_smi, filtered, repo, tree};

#[test]
fn doctor_finds_onnx_runtime_and_tells_a_good_bundle_from_a_tampered_one() {
    let t = Test::new();
    let good = repo().join("assets/tiny");
    let bad = t.path().join("tampered");
    std::fs::create_dir_all(&bad).unwrap();
    for entry in std::fs::read_dir(&good).unwrap().flatten() {
        if entry.path().is_file() {
            std::fs::copy(entry.path(), bad.join(entry.file_name())).unwrap();
        }
    }
    let mut dit = std::fs::read(bad.join("dit.onnx")).unwrap();
    let last = dit.len() - 1;
    dit[last] ^= 0xff;
    std::fs::write(bad.join("dit.onnx"), dit).unwrap();

    let out = t
        .cmd()
        .args([
            "doctor",
            "--bundle",
            good.to_str().unwrap(),
            "--bundle",
            "tampered",
        ])
        .run();
    assert_eq!(
        out.code,
        0,
        "only ONNX Runtime and the CPU provider are essential: {}",
        out.render()
    );
    let line = |name: &str| {
        out.stdout
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no line for {name}: {}", out.stdout))
            .to_string()
    };
    assert!(
        line("onnx runtime").starts_with("ok"),
        "{}",
        line("onnx runtime")
    );
    assert!(line("1.31.1").contains("onnx runtime"));
    assert!(line("execution provider cpu").starts_with("ok"));
    assert!(line("assets/tiny").starts_with("ok"));
    let tampered = line("bundle tampered");
    assert!(
        tampered.starts_with("MISS") && tampered.contains("dit.onnx"),
        "{tampered}"
    );
    assert!(out.stdout.contains("fix: re-export the bundle"));
    assert!(line("diagnostics").contains("none set"), "{}", out.stdout);
}

/// The diagnostic switches set where a run would start: named when valid, a miss when misspelt
/// (which `apply` would refuse), without changing the doctor's status.
#[test]
fn doctor_names_the_diagnostic_switches_and_a_misspelt_one() {
    let t = Test::new();
    let tiny = repo().join("assets/tiny");
    let doctor = |var: &str, value: &str| {
        let out = t
            .cmd()
            .args(["doctor", "--bundle", tiny.to_str().unwrap()])
            .env(var, value)
            .run();
        assert_eq!(out.code, 0, "{}", out.render());
        out.stdout
            .lines()
            .find(|l| l.contains("diagnostics"))
            .unwrap_or_else(|| panic!("no diagnostics line: {}", out.stdout))
            .to_string()
    };
    let on = doctor("UNSTEP_CONV_LOG", "1");
    assert!(
        on.starts_with("ok") && on.contains("UNSTEP_CONV_LOG=1 (runs record them"),
        "{on}"
    );
    let bad = doctor("UNSTEP_ORT_LOG", "loud");
    assert!(
        bad.starts_with("MISS") && bad.contains("UNSTEP_ORT_LOG=\"loud\" is not a log level"),
        "{bad}"
    );
}

/// A manifest on the tiny bundle with `provider`, written as `name` in the scratch folder.
fn tiny_manifest(t: Test, name: &str, provider: &str) -> Test {
    let text = format!(
        "kind = \"probe\"\n\n[prompts]\nfile = \"{prompts}\"\nindices = \"0\"\n\n\
         [runtime]\nprovider = \"{provider}\"\n\n[method]\nheight = 64\nwidth = 112\n\
         precision = \"fp32\"\n\n[assets]\nbundle = \"{tiny}\"\n",
        prompts = repo().join("assets/prompts/tiny.txt").display(),
        tiny = repo().join("assets/tiny").display(),
    );
    t.file(name, &text)
}

/// The line of the check `name` (its first line).
fn line_of<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.get(5..).is_some_and(|rest| rest.starts_with(name)))
        .unwrap_or_else(|| panic!("no line for {name}: {stdout}"))
}

/// The smoke manifest (the CPU, the tiny bundle) needs nothing this machine lacks: the status is
/// 0 whatever the GPU checks say, and its bundle is checked as a required one.
#[test]
fn doctor_passes_the_smoke_manifest() {
    let t = Test::new();
    let path = fake_nvidia_smi(&t, None);
    let smoke = repo().join("experiments/smoke.toml");
    let out = t
        .cmd()
        .args(["doctor", smoke.to_str().unwrap()])
        .env("PATH", &path)
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(
        line_of(&out.stdout, "gpus").starts_with("MISS"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("ok   bundle ") && out.stdout.contains("assets/tiny"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("ready for a run of ")
            && out
                .stdout
                .contains("smoke.toml (provider cpu): every required check passed"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("FAIL"), "{}", out.stdout);
}

/// A CUDA manifest on a machine without a driver fails (status 1): the GPU check is required,
/// marked FAIL, with the fix, and the summary says the run is not ready. The same checks
/// without a manifest are information only.
#[test]
fn doctor_fails_a_cuda_manifest_without_a_driver() {
    let t = tiny_manifest(Test::new(), "gpu.toml", "cuda");
    let path = fake_nvidia_smi(&t, None);
    let out = t
        .cmd()
        .args(["doctor", "gpu.toml"])
        .env("PATH", &path)
        .run();
    assert_eq!(out.code, 1, "{}", out.render());
    let gpus = line_of(&out.stdout, "gpus");
    assert!(
        gpus.starts_with("FAIL") && gpus.contains("couldn't communicate with the NVIDIA driver"),
        "{gpus}"
    );
    assert!(
        out.stdout
            .contains("fix: install the NVIDIA driver (580.65.06 or newer)"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("not ready for a run of gpu.toml (provider cuda): ")
            && out.stdout.contains("docs/gpu.md"),
        "{}",
        out.stdout
    );
    // The run's own needs: ONNX Runtime and the bundle pass, and are required.
    assert!(line_of(&out.stdout, "onnx runtime").starts_with("ok"));
    assert!(
        out.stdout.contains("ok   bundle ") && out.stdout.contains("assets/tiny"),
        "{}",
        out.stdout
    );

    // `--set` is a layer over the manifest: on the CPU the same manifest needs no GPU.
    let cpu = t
        .cmd()
        .args(["doctor", "gpu.toml", "--set", "runtime.provider=cpu"])
        .env("PATH", &path)
        .run();
    assert_eq!(cpu.code, 0, "{}", cpu.render());
    assert!(line_of(&cpu.stdout, "gpus").starts_with("MISS"));

    // `--provider cuda` asks the same without a manifest; with neither, nothing GPU is required.
    let provider = t
        .cmd()
        .args(["doctor", "--provider", "cuda"])
        .env("PATH", &path)
        .run();
    assert_eq!(provider.code, 1, "{}", provider.render());
    assert!(line_of(&provider.stdout, "gpus").starts_with("FAIL"));
    assert!(
        provider
            .stdout
            .contains("not ready for a run on provider cuda: "),
        "{}",
        provider.stdout
    );
    let plain = t.cmd().args(["doctor"]).env("PATH", &path).run();
    assert_eq!(plain.code, 0, "{}", plain.render());
    assert!(line_of(&plain.stdout, "gpus").starts_with("MISS"));
}

/// Each GPU is checked against the oldest driver CUDA 13 runs on (580.65.06): an older one
/// fails with the upgrade as its fix, a newer one passes.
#[test]
fn doctor_checks_the_driver_version() {
    let cases = [
        ("550.54.15", false),
        ("575.57.08", false),
        ("580.65.06", true),
        ("580.159.04", true),
    ];
    for (driver, new_enough) in cases {
        let t = Test::new();
        let csv = format!("0, NVIDIA H100 80GB HBM3, 81559, {driver}, 9.0");
        let path = fake_nvidia_smi(&t, Some(&csv));
        let out = t
            .cmd()
            .args(["doctor", "--provider", "cuda", "--json"])
            .env("PATH", &path)
            .run();
        let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        let gpu = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "gpu 0")
            .unwrap_or_else(|| panic!("{driver}: no gpu 0: {}", out.stdout));
        assert_eq!(gpu["ok"], new_enough, "{driver}: {gpu}");
        assert_eq!(gpu["required"], true, "{driver}: {gpu}");
        let detail = gpu["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(&format!("NVIDIA H100 80GB HBM3, 79 GiB, driver {driver}")),
            "{detail}"
        );
        if new_enough {
            assert!(gpu["fix"].is_null(), "{driver}: {gpu}");
        } else {
            let fix = gpu["fix"].as_str().unwrap();
            assert!(
                fix.contains("upgrade the NVIDIA driver to 580.65.06 or newer"),
                "{fix}"
            );
            assert_eq!(out.code, 1, "{driver}: {}", out.render());
        }
    }
}

/// `--json` is one object with fixed keys; each check has a name, ok, required, detail and fix
/// (null when there is none), and `ready` is false exactly when a required check failed.
#[test]
fn doctor_json_has_a_stable_shape() {
    let t = tiny_manifest(Test::new(), "gpu.toml", "cuda");
    let path = fake_nvidia_smi(&t, None);
    let onnxruntime_kernels = [
        "--set",
        "runtime.dit_kernels=onnxruntime",
        "--set",
        "runtime.vae_kernels=onnxruntime",
    ];
    for (args, code, provider, manifest, fused) in [
        (
            vec!["doctor", "gpu.toml", "--json"],
            1,
            "cuda",
            "gpu.toml",
            true,
        ),
        (
            [&["doctor", "gpu.toml", "--json"][..], &onnxruntime_kernels].concat(),
            1,
            "cuda",
            "gpu.toml",
            false,
        ),
        (vec!["doctor", "--json"], 0, "", "", false),
    ] {
        let out = t.cmd().args(args.iter().copied()).env("PATH", &path).run();
        assert_eq!(out.code, code, "{}", out.render());
        let report: serde_json::Value =
            serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
        let keys: Vec<&str> = report
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            ["checks", "manifest", "provider", "ready"],
            "{report}"
        );
        let checks = report["checks"].as_array().unwrap();
        for check in checks {
            let mut keys: Vec<&str> = check
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            keys.sort();
            assert_eq!(keys, ["detail", "fix", "name", "ok", "required"], "{check}");
            assert!(check["name"].is_string() && check["detail"].is_string());
            assert!(check["ok"].is_boolean() && check["required"].is_boolean());
            assert!(
                check["fix"].is_null() || check["fix"].is_string(),
                "{check}"
            );
        }
        let failed_required = checks
            .iter()
            .any(|c| c["required"] == true && c["ok"] == false);
        assert_eq!(report["ready"], !failed_required, "{report}");
        assert_eq!(report["ready"], code == 0);
        let required = |name: &str| {
            checks
                .iter()
                .find(|c| c["name"] == name)
                .unwrap_or_else(|| panic!("no {name}: {report}"))["required"]
                .clone()
        };
        assert_eq!(required("onnx runtime"), true);
        assert_eq!(required("gpus"), !provider.is_empty());
        // The tiny bundle has the fused graphs: on CUDA with the kernels `auto` (the default) a
        // run builds the runner's kernels, and with both `onnxruntime` it builds none.
        assert_eq!(
            required("nvrtc, cublasLt and cudnn (fused kernels)"),
            fused,
            "{args:?}"
        );
        // The fields in the order the text shows them.
        let at = |key: &str| out.stdout.find(&format!("\n  \"{key}\": ")).unwrap();
        assert!(at("ready") < at("provider") && at("provider") < at("manifest"));
        assert!(at("manifest") < at("checks"), "{}", out.stdout);
        if provider.is_empty() {
            assert!(report["provider"].is_null() && report["manifest"].is_null());
        } else {
            assert_eq!(report["provider"], provider);
            assert_eq!(report["manifest"], manifest);
        }
    }
}

/// A manifest that does not load is bad input: status 2, the usual located diagnostic, nothing
/// on stdout and nothing written. So are `--set` without a manifest and `--provider` with one.
#[test]
fn doctor_refuses_a_bad_manifest() {
    let t = Test::new().file(
        "bad.toml",
        "kind = \"probe\"\n\n[runtime]\nprovider = \"cudaa\"\n",
    );
    let before = tree(t.path());
    let out = t.cmd().args(["doctor", "bad.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(out.stdout.is_empty(), "{}", out.render());
    assert_eq!(tree(t.path()), before, "nothing written");
    filtered(t.path(), || {
        insta::assert_snapshot!("doctor_bad_manifest", out.render())
    });

    for args in [
        &["doctor", "--set", "runtime.provider=cuda"][..],
        &["doctor", "bad.toml", "--provider", "cuda"][..],
        &["doctor", "--provider", "rocm"][..],
    ] {
        let out = t.cmd().args(args.iter().copied()).run();
        assert_eq!(out.code, 2, "{args:?}: {}", out.render());
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.render());
    }
}

/// `runner doctor --help` says which checks decide the status.
#[test]
fn doctor_help_says_which_checks_are_required() {
    let out = Test::new().cmd().args(["doctor", "--help"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    for needle in [
        "Which checks decide the exit status",
        "--provider P",
        "ONNX Runtime and its CPU provider only",
        "580.65.06",
    ] {
        assert!(out.stdout.contains(needle), "{needle}: {}", out.stdout);
    }
}

/// `nvidia-smi` that fails says why on its standard output: the check shows that message, not
/// an empty one; a GPU it could not query is a failed check of its own, with the line it wrote.
#[test]
fn doctor_shows_what_nvidia_smi_said() {
    use std::os::unix::fs::PermissionsExt;
    let t = Test::new();
    let dir = t.path().join("driver");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("nvidia-smi");
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap());
    let write = |body: &str| {
        std::fs::write(&script, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write("echo 'NVIDIA-SMI has failed because it could not talk to the driver (stdout)'\nexit 9");
    let out = t.cmd().args(["doctor"]).env("PATH", &path).run();
    let gpus = line_of(&out.stdout, "gpus");
    assert!(
        gpus.contains("nvidia-smi failed: NVIDIA-SMI has failed because it could not talk"),
        "{}",
        out.stdout
    );

    write(
        "echo '0, NVIDIA H200, 143771, 580.95.05, 9.0'\necho 'Unable to determine the device \
         handle for GPU0000:3B:00.0: Unknown Error'\nexit 15",
    );
    let out = t
        .cmd()
        .args(["doctor", "--provider", "cuda"])
        .env("PATH", &path)
        .run();
    assert!(
        line_of(&out.stdout, "gpu 0").starts_with("ok"),
        "{}",
        out.stdout
    );
    let bad = line_of(&out.stdout, "gpu ?");
    assert!(
        bad.starts_with("FAIL") && bad.contains("Unable to determine the device handle"),
        "{}",
        out.stdout
    );
    assert_eq!(out.code, 1, "{}", out.render());
}

//! `runner doctor` with the real ONNX Runtime: what it finds and how it reports a broken bundle.

use crate::support::{Test, repo};

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

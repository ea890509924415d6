//! The 8-bit attention (`method.attention_precision = "int8"`): refused before any work where it
//! cannot run, and on the CPU (its reference kernel, in the runner's fused DiT) recorded as the
//! run's and measured against fp16 by `runner compare`.

use super::{manifest, read_json};
use crate::support::Test;

/// Each setting that keeps the runner's own attention from running refuses the 8-bit mode with
/// its reason, at the line that asked for the mode, and nothing is written.
#[test]
fn the_8bit_attention_where_it_cannot_run_is_refused_before_any_work() {
    let t = Test::new();
    let cases = [
        (
            "provider = \"cpu\"\n",
            "`auto` does not choose there; set runtime.dit_kernels = \"unstep\"",
        ),
        (
            "provider = \"cuda\"\ndit_kernels = \"onnxruntime\"\n",
            "use runtime.dit_kernels = \"auto\" or \"unstep\"",
        ),
        (
            "provider = \"tensorrt\"\n",
            "TensorRT chooses its own attention kernels",
        ),
    ];
    for (runtime, problem) in cases {
        let text = manifest(&t, "probe", "")
            .replace("[prompts]\n", "[prompts]\nindices = \"0\"\n")
            .replace("[method]\n", "[method]\nattention_precision = \"int8\"\n")
            .replace("provider = \"cpu\"\n", runtime);
        std::fs::write(t.path().join("m.toml"), &text).unwrap();
        let out = t.cmd().args(["apply", "--quiet", "m.toml"]).run();
        assert_eq!(out.code, 2, "{runtime}: {}", out.render());
        assert!(out.stderr.contains(problem), "{runtime}: {}", out.stderr);
        let line = text
            .lines()
            .position(|l| l.starts_with("attention_precision"))
            .unwrap()
            + 1;
        assert!(
            out.stderr.contains(&format!("m.toml:{line}:")),
            "{runtime}: {}",
            out.stderr
        );
        assert!(!t.path().join("results").exists() && !t.path().join("work").exists());
    }
}

/// On the CPU with the runner's fused DiT, an int8 run records its attention precision and the
/// 8-bit kernel, its frames stay close to the fp16 run's on the same noise, and `runner compare`
/// warns that the two are not comparable as equals.
#[test]
fn an_8bit_attention_run_records_it_and_compare_measures_it_against_fp16() {
    let t = Test::new();
    for (name, precision) in [("a_fp16", "fp16"), ("a_int8", "int8")] {
        let text = manifest(&t, "probe", "")
            .replace("[outputs]\n", "[outputs]\nsave_frames = true\n")
            .replace("[prompts]\n", "[prompts]\nindices = \"0\"\n")
            .replace(
                "[method]\n",
                &format!("[method]\nattention_precision = \"{precision}\"\n"),
            )
            .replace(
                "provider = \"cpu\"\n",
                "provider = \"cpu\"\ndit_kernels = \"unstep\"\n",
            )
            .replace(
                "kind = \"probe\"\n",
                &format!("kind = \"probe\"\nname = \"{name}\"\n"),
            );
        std::fs::write(t.path().join(format!("{name}.toml")), &text).unwrap();
        let out = t
            .cmd()
            .args(["apply", "--quiet", &format!("{name}.toml")])
            .run();
        assert_eq!(out.code, 0, "{name}: {}", out.render());
        let run = read_json(&t.path().join(format!("results/{name}/run.json")));
        assert_eq!(run["attention_precision"], precision, "{name}");
        let resolved = run["attention_backend"]["resolved"].as_str().unwrap();
        assert_eq!(
            resolved.contains("8-bit"),
            precision == "int8",
            "{resolved}"
        );
    }
    let out = t
        .cmd()
        .args(["compare", "--results", "results", "a_fp16", "a_int8"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(
        all.contains("attention precision differs") && all.contains("not comparable"),
        "{all}"
    );
    let psnr: f64 = all
        .split("PSNR mean ")
        .nth(1)
        .and_then(|s| s.split(" dB").next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no PSNR in {all}"));
    assert!((35.0..100.0).contains(&psnr), "PSNR {psnr}");
}

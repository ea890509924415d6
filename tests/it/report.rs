//! `runner report` and `runner compare` on run directories written through the results API.

use unstep::engine::{OneTimeWork, StartupTimes};
use unstep::manifest::{LoadRequest, load};
use unstep::results::{
    BundleRecord, DeviceRecord, GitState, LibraryVersions, ProcessRole, ProcessStart, RUN_JSON,
    RunRecord, RunStatus, SUMMARY_JSON, Summary, TIMINGS_JSONL, TimingRecord, append_jsonl,
    write_json_atomic,
};

use crate::support::{Test, filtered, tree};

const PROBE: &str = r#"
kind = "probe"
[prompts]
file = "prompts.txt"
indices = "0-4"
[warmup]
indices = "0-1"
repeats = 1
[assets]
bundle = "bundle"
"#;

const PROMPTS: &str = "a cat\na dog\na bird\na fish\na horse\n";

/// Writes `experiments/<name>.toml`, plans it, and writes the records a finished run would
/// leave: run.json, timings.jsonl (a warmup process, then the measurement with `totals`),
/// and summary.json when `with_summary`.
fn fake_run(
    t: &Test,
    name: &str,
    sets: &[&str],
    totals: &[f64],
    with_summary: bool,
    edit: impl FnOnce(&mut RunRecord),
) {
    let dir = t.path();
    std::fs::create_dir_all(dir.join("experiments")).unwrap();
    std::fs::write(dir.join("prompts.txt"), PROMPTS).unwrap();
    let manifest = dir.join(format!("experiments/{name}.toml"));
    std::fs::write(&manifest, PROBE.replace("prompts.txt", "../prompts.txt")).unwrap();
    let resolved = load(&LoadRequest {
        manifest,
        env: Default::default(),
        sets: sets.iter().map(|s| s.to_string()).collect(),
        extra_args: Vec::new(),
        cwd: dir.to_path_buf(),
    })
    .unwrap_or_else(|d| panic!("{d}"));
    let plan = unstep::plan::build(&resolved).unwrap();
    let run_dir = &plan.run_dir;
    std::fs::create_dir_all(run_dir).unwrap();

    let mut record = RunRecord::new(&resolved, &plan, std::time::SystemTime::now());
    record.host = Some("h200-node-3".into());
    record.started_at = "2026-11-30T09:00:00Z".into();
    record.git = Some(GitState {
        commit: "0123456789abcdef0123456789abcdef01234567".into(),
        dirty: false,
    });
    record.execution_provider = Some("CUDAExecutionProvider".into());
    record.attention_backend.resolved = Some("flash".into());
    record.dit_kernels = Some("unstep".into());
    record.vae_kernels = Some("onnxruntime".into());
    record.bundle = Some(BundleRecord {
        path: "assets/wan-1.3b".into(),
        preset: "wan-1.3b".into(),
        exporter_version: "0.8.0".into(),
        bundle_toml_sha256: None,
    });
    record.device = DeviceRecord {
        gpu_model: Some("NVIDIA H200".into()),
        gpu_memory_bytes: Some(150_754_820_096),
        driver_version: Some("570.86.15".into()),
    };
    record.versions = LibraryVersions {
        cuda: Some("12.8".into()),
        cudnn: Some("9.7.1".into()),
        onnxruntime: Some("1.22.0".into()),
    };
    record.finish(RunStatus::Succeeded, None);
    record.ended_at = Some("2026-11-30T09:05:00Z".into());
    edit(&mut record);
    write_json_atomic(&run_dir.join(RUN_JSON), &record).unwrap();

    let timing = |process: usize, role: ProcessRole, prompt: u32, total: f64| TimingRecord {
        process,
        role,
        shard: None,
        slot: "gpu0".into(),
        prompt,
        text_encoding_s: 0.25,
        text_context: None,
        session_run_s: None,
        // Binary fractions, so the phase split prints exactly.
        dit_s: total * 0.5,
        vae_s: total * 0.375,
        layout_s: total * 0.0625,
        timed_total_s: total,
        peak_device_memory_bytes: Some(21 << 30),
        timed_region_ends: record.timed_region_ends,
        config_hash: record.config_hash.clone(),
        prompt_sha256: None,
        video: None,
        video_file: None,
        kept_bytes: Default::default(),
        process_start: None,
        one_time: None,
    };
    // The warmup's first prompt: its start and one-time work, as a GPU worker records them.
    let mut first = timing(0, ProcessRole::Warmup, 0, 40.0);
    first.process_start = Some(ProcessStart {
        started_at: None,
        ready_s: 12.5,
        parts: StartupTimes {
            bundle_check_s: 0.0,
            text_encoder_s: 1.5,
            dit_sessions_s: 6.25,
            decoder_sessions_s: 1.25,
            decoder_first_run_s: 0.75,
            buffers_s: 0.5,
        },
        one_time: OneTimeWork {
            kernel_compile_s: 2.0,
            conv_choices_s: 0.5,
            ..OneTimeWork::default()
        },
        text_contexts: None,
    });
    first.one_time = Some(OneTimeWork {
        attention_plans_s: 20.0,
        conv_choices_s: 8.0,
        gemm_choices_s: 0.25,
        graph_capture_s: 1.5,
        capture_wait_s: 0.5,
        ..OneTimeWork::default()
    });
    let mut records = vec![first, timing(0, ProcessRole::Warmup, 1, 6.0)];
    records.extend(
        totals
            .iter()
            .enumerate()
            .map(|(i, &s)| timing(1, ProcessRole::Measurement, i as u32, s)),
    );
    for r in &records {
        append_jsonl(&run_dir.join(TIMINGS_JSONL), r).unwrap();
    }
    if with_summary {
        let summary = Summary::from_records(&records, record.kind, record.cache.label);
        write_json_atomic(&run_dir.join(SUMMARY_JSON), &summary).unwrap();
    }
}

/// The values of the table row that starts with `label`.
fn row(stdout: &str, label: &str) -> Vec<String> {
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no row `{label}` in\n{stdout}"));
    line.trim_start()[label.len()..]
        .split_whitespace()
        .map(String::from)
        .collect()
}

#[test]
fn report_of_a_probe_shows_statistics_split_and_provenance_and_draws_the_plot() {
    let t = Test::new();
    fake_run(
        &t,
        "speed",
        &["method.clean_sigma=0.01"],
        &[5.0, 4.0, 3.5, 4.5, 4.0],
        true,
        |_| {},
    );
    let svg = t.path().join("results/speed/latency.svg");
    assert!(!svg.exists());
    let out = t.cmd().args(["report", "speed"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    // raw 4.2; excluding the first 4.0; min after first 3.5; last three 4.0.
    assert_eq!(
        row(&out.stdout, "timed total"),
        ["4.200", "4.000", "3.500", "4.000"]
    );
    assert!(
        out.stdout
            .contains("DiT 50.0%   VAE 37.5%   layout 6.2%   other 6.2%")
    );
    filtered(t.path(), || {
        insta::assert_snapshot!("report_probe", out.render())
    });

    // The plot was missing, so the report drew it: a warmup line and a measurement line.
    let text = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(text.matches("<polyline").count(), 2);
    assert_eq!(text.matches("<circle").count(), 7);

    let json = t.cmd().args(["report", "speed", "--json"]).run();
    assert_eq!(json.code, 0, "{}", json.render());
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["summary"]["timed_total"]["raw_mean"], 4.2);
    assert_eq!(
        v["provenance"]["method_overrides"]["method.clean_sigma"],
        0.01
    );
    filtered(t.path(), || {
        insta::assert_snapshot!("report_probe_json", json.render())
    });
}

#[test]
fn one_prompt_report_shows_na_for_statistics_without_inputs() {
    let t = Test::new();
    // No summary.json: the report computes it from the timings.
    fake_run(&t, "one", &["prompts.indices=0"], &[4.25], false, |r| {
        r.device = DeviceRecord::default();
        r.versions = LibraryVersions::default();
        r.execution_provider = None;
        r.attention_backend.resolved = None;
        r.git = None;
    });
    let out = t.cmd().args(["report", "results/one"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    for series in ["timed total", "DiT", "VAE"] {
        let values = row(&out.stdout, series);
        assert_eq!(&values[1..3], ["n/a", "n/a"], "{series}");
        assert_ne!(values[0], "n/a");
        assert_eq!(values[0], values[3], "one prompt: raw mean = steady tail");
    }
    filtered(t.path(), || {
        insta::assert_snapshot!("report_one_prompt", out.render())
    });

    let json = t.cmd().args(["report", "one", "--json"]).run();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let total = &v["summary"]["timed_total"];
    assert_eq!(total["raw_mean"], 4.25);
    assert_eq!(total["steady_tail_mean"], 4.25);
    assert!(total["warm_mean_excluding_first"].is_null());
    assert!(total["min_after_first"].is_null());
}

#[test]
fn compare_shows_deltas_and_ratios_and_warns_about_a_warm_cache_run() {
    let t = Test::new();
    fake_run(&t, "base", &[], &[5.0, 4.0, 4.0, 4.0], true, |_| {});
    fake_run(
        &t,
        "warm",
        &["method.precision=bf16"],
        &[4.0, 3.0, 3.0, 3.0],
        true,
        |r| {
            r.device.gpu_model = Some("NVIDIA GB200".into());
            // A probe measured on the state an earlier measurement left.
            r.cache.label = unstep::results::records::CacheLabel::WarmCache;
        },
    );
    let out = t.cmd().args(["compare", "base", "warm"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert!(out.stderr.contains("warning: run `warm` is warm-cache"));
    assert!(!out.stderr.contains("run `base` is warm-cache"));
    assert!(out.stderr.contains("GPU model differs"));
    assert!(out.stderr.contains("precision differs"));
    assert!(!out.stderr.contains("provider differs"));
    filtered(t.path(), || {
        insta::assert_snapshot!("compare_warm_cache", out.render())
    });

    let json = t.cmd().args(["compare", "base", "warm", "--json"]).run();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let raw = &v["rows"][0];
    assert_eq!(raw["series"], "timed total");
    assert_eq!(raw["statistic"], "raw_mean");
    assert_eq!(raw["a"], 4.25);
    assert_eq!(raw["b"], 3.25);
    assert_eq!(raw["delta"], -1.0);
    assert_eq!(v["warnings"].as_array().unwrap().len(), 3);
}

/// An fp8 run is the reduced-precision mode: its report says so, and a comparison with a
/// full-precision run warns that the two are not comparable as equals; two fp8 runs compare
/// without it.
#[test]
fn fp8_runs_are_reported_and_compared_as_reduced_precision() {
    let t = Test::new();
    fake_run(&t, "fp16", &[], &[5.0, 4.0, 4.0], true, |_| {});
    for name in ["fp8", "fp8b"] {
        fake_run(
            &t,
            name,
            &["method.precision=fp8"],
            &[4.0, 3.0, 3.0],
            true,
            |_| {},
        );
    }
    let report = t.cmd().args(["report", "fp8"]).run();
    assert_eq!(report.code, 0, "{}", report.render());
    assert!(
        report
            .stdout
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")
                == "precision fp8 (reduced precision: DiT matrix multiplies in float8)"),
        "{}",
        report.stdout
    );
    let json = t.cmd().args(["report", "fp8", "--json"]).run();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["provenance"]["precision"], "fp8");
    assert_eq!(
        v["provenance"]["precision_note"],
        "DiT matrix multiplies in float8"
    );
    let full = t.cmd().args(["report", "fp16"]).run();
    assert!(
        !full.stdout.contains("reduced precision"),
        "{}",
        full.stdout
    );

    let warning = "warning: precision differs: `fp16` has fp16, `fp8` has fp8; fp8 is the \
                   reduced-precision mode (DiT matrix multiplies in float8): its times and scores \
                   are not comparable to full precision's as equals";
    let out = t.cmd().args(["compare", "fp16", "fp8"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert_eq!(out.stderr.trim_end(), warning, "{}", out.render());
    let many = t.cmd().args(["compare", "fp16", "fp8", "fp8b"]).run();
    assert_eq!(many.code, 0, "{}", many.render());
    assert!(
        many.stderr.contains("reduced-precision mode"),
        "{}",
        many.render()
    );
    let both = t.cmd().args(["compare", "fp8", "fp8b"]).run();
    assert_eq!(both.code, 0, "{}", both.render());
    assert_eq!(both.stderr, "", "{}", both.render());
}

/// A run measured with diagnostic switches on says so in its report, and a comparison with a run
/// measured with others (or none) warns; two runs with the same switches compare without it.
#[test]
fn runs_measured_with_diagnostics_on_say_so_and_compare_with_a_warning() {
    let t = Test::new();
    fake_run(&t, "plain", &[], &[5.0, 4.0, 4.0], true, |_| {});
    for name in ["profiled", "profiled2"] {
        fake_run(&t, name, &[], &[6.0, 5.0, 5.0], true, |r| {
            r.diagnostics = vec![
                "UNSTEP_ORT_PROFILE=/tmp/profiles".into(),
                "UNSTEP_ORT_DISABLE_OPTIMIZERS=MatMulAddFusion".into(),
            ];
        });
    }
    let report = t.cmd().args(["report", "profiled"]).run();
    assert_eq!(report.code, 0, "{}", report.render());
    assert!(
        report.stdout.contains(
            "  diagnostics   UNSTEP_ORT_PROFILE=/tmp/profiles, \
             UNSTEP_ORT_DISABLE_OPTIMIZERS=MatMulAddFusion (times measured with diagnostics on)"
        ),
        "{}",
        report.stdout
    );
    let json = t.cmd().args(["report", "profiled", "--json"]).run();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        v["provenance"]["diagnostics"][1],
        "UNSTEP_ORT_DISABLE_OPTIMIZERS=MatMulAddFusion"
    );
    let plain = t.cmd().args(["report", "plain"]).run();
    assert!(!plain.stdout.contains("diagnostics"), "{}", plain.stdout);

    let out = t.cmd().args(["compare", "plain", "profiled"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert_eq!(
        out.stderr.trim_end(),
        "warning: diagnostics differ: `plain` ran with none, `profiled` with \
         UNSTEP_ORT_PROFILE=/tmp/profiles, UNSTEP_ORT_DISABLE_OPTIMIZERS=MatMulAddFusion; ONNX \
         Runtime's profiler and log slow a run, and left-out optimizers change its graphs",
        "{}",
        out.render()
    );
    let same = t.cmd().args(["compare", "profiled", "profiled2"]).run();
    assert_eq!(same.code, 0, "{}", same.render());
    assert_eq!(same.stderr, "", "{}", same.render());
}

#[test]
fn compare_of_like_runs_has_no_warnings() {
    let t = Test::new();
    fake_run(&t, "a", &[], &[5.0, 4.0], true, |_| {});
    fake_run(&t, "b", &[], &[5.0, 2.0], true, |_| {});
    let out = t.cmd().args(["compare", "a", "b"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert_eq!(out.stderr, "");
    assert!(
        out.stdout.contains(
            "  timed total  min_after_first                 4.000      2.000     -2.000    0.500"
        ),
        "{}",
        out.stdout
    );
}

#[test]
fn missing_runs_are_usage_errors_with_a_hint() {
    let t = Test::new().file("results/empty/notes.txt", "not a run\n");
    let none = t.cmd().args(["report", "nope"]).run();
    let not_a_run = t.cmd().args(["report", "empty"]).run();
    let bad_path = t.cmd().args(["compare", "./elsewhere/x", "nope"]).run();
    let other_root = t.cmd().args(["report", "nope", "--results", "out"]).run();
    for out in [&none, &not_a_run, &bad_path, &other_root] {
        assert_eq!(out.code, 2, "{}", out.render());
        assert_eq!(out.stdout, "");
    }
    assert!(none.stderr.contains("runner apply experiments/nope.toml"));
    assert!(
        bad_path
            .stderr
            .contains("no run directory at ./elsewhere/x")
    );
    assert!(other_root.stderr.contains("no run `nope` under out/"));
    filtered(t.path(), || {
        insta::assert_snapshot!(
            "report_errors",
            [none, not_a_run, bad_path, other_root]
                .map(|o| o.render())
                .join("\n")
        )
    });
    // Reading a run never writes into a folder that is not one.
    assert_eq!(tree(t.path()), ["results/empty/notes.txt"]);
}

#[test]
fn a_corrupt_record_is_an_internal_error_and_a_torn_last_timing_is_ignored() {
    let t = Test::new();
    fake_run(&t, "torn", &[], &[4.0, 3.0], false, |_| {});
    let timings = t.path().join("results/torn/timings.jsonl");
    let mut text = std::fs::read_to_string(&timings).unwrap();
    text.push_str("{\"process\": 1, \"role\": \"measu");
    std::fs::write(&timings, &text).unwrap();
    let out = t.cmd().args(["report", "torn", "--json"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["summary"]["count"], 2);

    std::fs::write(t.path().join("results/torn/run.json"), "{\"run\": ").unwrap();
    let out = t.cmd().args(["report", "torn"]).run();
    assert_eq!(out.code, 3, "{}", out.render());
    assert!(
        out.stderr.contains("run.json: not a valid record"),
        "{}",
        out.stderr
    );
}

/// `runtime.cuda_graphs` reaches run.json's settings through the manifest, and the report's
/// kernels row says when the DiT ran as CUDA graphs (and says nothing when it did not).
#[test]
fn the_report_says_when_the_dit_ran_as_cuda_graphs() {
    let t = Test::new();
    fake_run(
        &t,
        "graphs",
        &["runtime.cuda_graphs=true"],
        &[3.0, 2.75],
        true,
        |_| {},
    );
    fake_run(&t, "plain", &[], &[3.0, 2.75], true, |_| {});
    let graphs = t.cmd().args(["report", "graphs"]).run();
    assert_eq!(graphs.code, 0, "{}", graphs.render());
    assert_eq!(
        row(&graphs.stdout, "kernels").join(" "),
        "dit unstep, vae onnxruntime; DiT as CUDA graphs"
    );
    let plain = t.cmd().args(["report", "plain"]).run();
    assert_eq!(plain.code, 0, "{}", plain.render());
    assert_eq!(
        row(&plain.stdout, "kernels").join(" "),
        "dit unstep, vae onnxruntime"
    );
}

/// The benchmark guide compares runs that differ in one thing: a comparison names every other
/// difference in what ran — attention kernel, kernel sets, library versions, bundle (by its
/// contents, not its path) and the weights' source — and the report shows the weights.
#[test]
fn compare_warns_when_kernels_libraries_bundle_or_weights_differ() {
    use unstep::results::WeightsRecord;
    let t = Test::new();
    let weights = |source: &str| WeightsRecord {
        source: source.into(),
        dit: source.into(),
        vae: source.into(),
        text_encoder: source.into(),
        tokenizer: None,
    };
    let bundle = |path: &str, sha: &str| BundleRecord {
        path: path.into(),
        preset: "wan-1.3b".into(),
        exporter_version: "0.13.0".into(),
        bundle_toml_sha256: Some(sha.into()),
    };
    fake_run(&t, "base", &[], &[5.0, 4.0], true, |r| {
        r.attention_backend.resolved = Some("cudnn_flash".into());
        r.dit_kernels = Some("unstep".into());
        r.versions.onnxruntime = Some("1.31.1".into());
        r.bundle = Some(bundle("assets/wan-1.3b", &"a".repeat(64)));
        r.weights = Some(weights("released"));
    });
    // The same bundle in another folder is the same bundle.
    fake_run(&t, "moved", &[], &[5.0, 4.0], true, |r| {
        r.attention_backend.resolved = Some("cudnn_flash".into());
        r.dit_kernels = Some("unstep".into());
        r.versions.onnxruntime = Some("1.31.1".into());
        r.bundle = Some(bundle("/data/wan-1.3b", &"a".repeat(64)));
        r.weights = Some(weights("released"));
    });
    fake_run(&t, "other", &[], &[5.0, 4.0], true, |r| {
        r.attention_backend.resolved = Some("fa2".into());
        r.dit_kernels = Some("onnxruntime".into());
        r.versions.onnxruntime = Some("1.30.0".into());
        r.bundle = Some(bundle("assets/wan-1.3b", &"b".repeat(64)));
        r.weights = Some(weights("random"));
    });
    let same = t.cmd().args(["compare", "base", "moved"]).run();
    assert_eq!(same.code, 0, "{}", same.render());
    assert_eq!(same.stderr, "", "{}", same.render());

    let out = t.cmd().args(["compare", "base", "other"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    for line in [
        "warning: attention backend differs: `base` has cudnn_flash (requested auto), `other` has \
         fa2 (requested auto)",
        "warning: kernels differ",
        "warning: library versions differ: `base` has onnxruntime 1.31.1,",
        "`other` has onnxruntime 1.30.0,",
        "warning: bundle differs: `base` has assets/wan-1.3b (bundle.toml sha256 aaaaaaaaaaaa), \
         `other` has assets/wan-1.3b (bundle.toml sha256 bbbbbbbbbbbb)",
        "warning: weights differ: `base` has released, `other` has random",
    ] {
        assert!(out.stderr.contains(line), "{line}\n{}", out.render());
    }
    let report = t.cmd().args(["report", "other"]).run();
    assert!(
        report
            .stdout
            .contains("  weights       random (seeded random weights"),
        "{}",
        report.stdout
    );
    let runs = t.cmd().args(["runs"]).run();
    assert_eq!(runs.code, 0, "{}", runs.render());
    let row: Vec<&str> = runs
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("other "))
        .unwrap()
        .split_whitespace()
        .collect();
    assert!(row.contains(&"random"), "{}", runs.stdout);
}

/// A generation's report prints its last apply's wall time and each slot's process starts in
/// it, from the processes' ready times: a start recorded before that apply (a resumed run's
/// earlier apply) is left out.
#[test]
fn report_of_a_generation_prints_its_wall_time_and_the_starts_in_it() {
    use unstep::results::{ApplyWall, records::StagingRecord};
    let t = Test::new();
    let dir = t.path();
    std::fs::create_dir_all(dir.join("experiments")).unwrap();
    std::fs::write(dir.join("prompts.txt"), PROMPTS).unwrap();
    let manifest = dir.join("experiments/gen.toml");
    // Two GPUs, three shards: gpu0 runs its warmup, shard 0 and shard 2; gpu1 its warmup and
    // shard 1.
    std::fs::write(
        &manifest,
        "kind = \"generation\"\n[prompts]\nfile = \"../prompts.txt\"\nindices = \"0-4\"\n\
         [shards]\ncount = 3\n[runtime]\nvisible_devices = \"0,1\"\n[assets]\nbundle = \"bundle\"\n",
    )
    .unwrap();
    let resolved = load(&LoadRequest {
        manifest,
        env: Default::default(),
        sets: Vec::new(),
        extra_args: Vec::new(),
        cwd: dir.to_path_buf(),
    })
    .unwrap_or_else(|d| panic!("{d}"));
    let plan = unstep::plan::build(&resolved).unwrap();
    let run_dir = &plan.run_dir;
    std::fs::create_dir_all(run_dir).unwrap();
    let mut record = RunRecord::new(&resolved, &plan, std::time::SystemTime::now());
    record.host = Some("h200-node-3".into());
    record.started_at = "2026-12-06T10:00:00Z".into();
    record.resumed_at = vec!["2026-12-06T11:00:00Z".into()];
    record.finish(RunStatus::Succeeded, None);
    record.ended_at = Some("2026-12-06T11:01:20Z".into());
    record.staging = Some(StagingRecord {
        seconds: 2.5,
        reused: true,
        placements: None,
    });
    record.wall = Some(ApplyWall {
        started_at: "2026-12-06T11:00:00Z".into(),
        seconds: 80.0,
    });
    write_json_atomic(&run_dir.join(RUN_JSON), &record).unwrap();

    // (process, role, shard, slot, prompt, start: (when, ready seconds)); process 1 (shard 0)
    // finished its prompts in the first apply and did not run in the second.
    type Row<'a> = (
        usize,
        ProcessRole,
        Option<usize>,
        &'a str,
        u32,
        Option<(&'a str, f64)>,
    );
    let rows: [Row; 7] = [
        (
            1,
            ProcessRole::Shard,
            Some(0),
            "gpu0",
            0,
            Some(("2026-12-06T10:00:05Z", 9.5)),
        ),
        (1, ProcessRole::Shard, Some(0), "gpu0", 1, None),
        (
            0,
            ProcessRole::Warmup,
            None,
            "gpu0",
            0,
            Some(("2026-12-06T11:00:03Z", 10.0)),
        ),
        (
            3,
            ProcessRole::Warmup,
            None,
            "gpu1",
            2,
            Some(("2026-12-06T11:00:03Z", 12.0)),
        ),
        (
            2,
            ProcessRole::Shard,
            Some(2),
            "gpu0",
            4,
            Some(("2026-12-06T11:00:30Z", 5.0)),
        ),
        (
            4,
            ProcessRole::Shard,
            Some(1),
            "gpu1",
            2,
            Some(("2026-12-06T11:00:40Z", 4.0)),
        ),
        (4, ProcessRole::Shard, Some(1), "gpu1", 3, None),
    ];
    let records: Vec<TimingRecord> = rows
        .into_iter()
        .map(|(process, role, shard, slot, prompt, start)| TimingRecord {
            process,
            role,
            shard,
            slot: slot.into(),
            prompt,
            text_encoding_s: 0.0,
            text_context: None,
            dit_s: 2.0,
            vae_s: 0.5,
            layout_s: 0.0,
            timed_total_s: 2.5,
            session_run_s: None,
            peak_device_memory_bytes: None,
            timed_region_ends: record.timed_region_ends,
            config_hash: record.config_hash.clone(),
            prompt_sha256: None,
            video: None,
            video_file: None,
            kept_bytes: Default::default(),
            process_start: start.map(|(when, ready_s)| ProcessStart {
                started_at: Some(when.into()),
                ready_s,
                ..ProcessStart::default()
            }),
            one_time: None,
        })
        .collect();
    for r in &records {
        append_jsonl(&run_dir.join(TIMINGS_JSONL), r).unwrap();
    }

    let out = t.cmd().args(["report", "gen"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    // gpu0: the warmup 10.00 and shard 2 5.00 of the second apply, 15 of 80 s; gpu1: 16 of 80.
    assert!(
        out.stdout.contains(
            "  gpu0  2 processes ready in 15.00 (warmup 10.00, shard 2 5.00): 18.8% of the wall time"
        ),
        "{}",
        out.stdout
    );
    filtered(t.path(), || {
        insta::assert_snapshot!("report_generation_wall", out.render())
    });
    let json = t.cmd().args(["report", "gen", "--json"]).run();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["wall"]["wall_s"], 80.0);
    assert_eq!(v["wall"]["slots"][1]["slot"], "gpu1");
    assert_eq!(v["wall"]["slots"][1]["ready_s"], 16.0);
    assert_eq!(
        v["wall"]["slots"][0]["processes"].as_array().unwrap().len(),
        2
    );
}

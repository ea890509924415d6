use super::*;
use crate::results::testing::{GENERATION, PROBE, resolve};

#[test]
fn run_record_of_a_probe_plan() {
    let dir = tempfile::tempdir().unwrap();
    let r = resolve(
        dir.path(),
        "probe",
        PROBE,
        &[
            "method.clean_sigma=0.01",
            "timing.exclude_final_output_layout=true",
        ],
    );
    let plan = crate::plan::build(&r).unwrap();
    let started = std::time::UNIX_EPOCH + std::time::Duration::from_secs(951_782_400);
    let mut record = RunRecord::new(&r, &plan, started);
    assert_eq!(record.run, "probe");
    assert_eq!(record.status, RunStatus::Running);
    assert_eq!(record.started_at, "2000-02-29T00:00:00Z");
    assert_eq!(record.cache.label, CacheLabel::Fresh);
    assert_eq!(record.timed_region_ends, TimedRegionEnd::VaeOutput);
    assert_eq!(record.config_hash, crate::results::config_hash(&r));
    assert_eq!(record.manifests.len(), 1);
    assert_eq!(record.manifests[0].sha256.len(), 64);
    let sigma = &record.method_overrides["method.clean_sigma"];
    assert_eq!(sigma.value, serde_json::json!(0.01));
    assert_eq!(sigma.layer, "command line");
    assert_eq!(record.settings["noise.seed"].layer, "default");
    assert!(!record.method_overrides.contains_key("method.precision"));
    // Two warmups, then the measurement, all on the first slot.
    let roles: Vec<_> = record
        .processes
        .iter()
        .map(|p| (p.role, p.repeat))
        .collect();
    assert_eq!(
        roles,
        [
            (ProcessRole::Warmup, Some(1)),
            (ProcessRole::Warmup, Some(2)),
            (ProcessRole::Measurement, None)
        ]
    );
    assert_eq!(record.processes[2].prompts, 4);
    assert_eq!(record.processes[2].slot, "cpu0");

    record.finish(RunStatus::Failed, Some("worker 2 exited with 1".into()));
    assert!(record.ended_at.is_some());
    let text = serde_json::to_string(&record).unwrap();
    assert!(text.contains(r#""status":"failed""#));
    let back: RunRecord = serde_json::from_str(&text).unwrap();
    assert_eq!(back, record);
}

/// A resumed run keeps the diagnostic switches of every apply, each once, the first
/// apply's first; a record without them writes no field.
#[test]
fn a_resumed_record_keeps_every_applys_diagnostics() {
    let dir = tempfile::tempdir().unwrap();
    let r = resolve(dir.path(), "probe", PROBE, &[]);
    let plan = crate::plan::build(&r).unwrap();
    let mut first = RunRecord::new(&r, &plan, std::time::SystemTime::now());
    assert!(
        !serde_json::to_string(&first)
            .unwrap()
            .contains("diagnostics")
    );
    first.diagnostics = vec!["UNSTEP_ORT_LOG=info".into(), "UNSTEP_CONV_LOG=1".into()];
    let mut again = RunRecord::new(&r, &plan, std::time::SystemTime::now());
    again.diagnostics = vec!["UNSTEP_CONV_LOG=1".into(), "UNSTEP_ORT_PROFILE=p".into()];
    again.resume(&first);
    assert_eq!(
        again.diagnostics,
        [
            "UNSTEP_ORT_LOG=info",
            "UNSTEP_CONV_LOG=1",
            "UNSTEP_ORT_PROFILE=p"
        ]
    );
    let mut plain = RunRecord::new(&r, &plan, std::time::SystemTime::now());
    plain.resume(&first);
    assert_eq!(plain.diagnostics, first.diagnostics);
}

#[test]
fn shared_generation_is_labelled_warm_cache_with_shard_processes() {
    let dir = tempfile::tempdir().unwrap();
    let r = resolve(dir.path(), "gen", GENERATION, &[]);
    let plan = crate::plan::build(&r).unwrap();
    let record = RunRecord::new(&r, &plan, std::time::SystemTime::now());
    assert_eq!(record.cache.label, CacheLabel::WarmCache);
    assert_eq!(
        serde_json::to_value(record.cache.label).unwrap(),
        "warm-cache"
    );
    let shards: Vec<_> = record.processes.iter().filter_map(|p| p.shard).collect();
    assert_eq!(shards, [0, 1]);
}

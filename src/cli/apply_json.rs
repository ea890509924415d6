//! `runner apply --json`'s output, for one run (`apply.rs`) and for a sweep's runs (`sweep.rs`):
//! each run's record as it is on disk.

/// The record (`run.json`) of the run in `run_dir` as it is on disk; `null` when it has none.
pub(super) fn record_json(run_dir: &std::path::Path) -> serde_json::Value {
    std::fs::read_to_string(run_dir.join(crate::results::RUN_JSON))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// `apply --json`'s output: one run's record, or a sweep's list of them.
pub(super) fn value_text(value: &serde_json::Value) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("JSON values serialise");
    text.push('\n');
    text
}

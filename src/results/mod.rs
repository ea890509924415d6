//! Results of a run under `results/<RUN_NAME>/`: the record types (the file formats), the
//! statistics, the config hash, and crash-safe writing and reading.

pub mod arrays;
pub mod completeness;
pub mod files;
pub mod hash;
pub mod names;
pub mod owner;
pub mod records;
pub mod scores;
pub mod stats;
pub mod summary;
pub mod time;
pub mod video_file;
pub mod video_index;

pub use files::{
    LATENCY_SVG, RUN_JSON, RecordError, SUMMARY_JSON, TIMINGS_JSONL, append_jsonl, read_json,
    read_timings, write_atomic, write_json_atomic,
};
pub use hash::{config_hash, prompt_hash};
pub use records::{
    ApplyWall, AttentionRecord, BundleRecord, CacheLabel, CacheRecord, DeviceRecord, GitState,
    LibraryVersions, ManifestRecord, PlacesRecord, ProcessRecord, ProcessRole, ProcessSkip,
    ProcessStart, RunRecord, RunStatus, SettingRecord, SweepRecord, TimedRegionEnd, TimingRecord,
    TokenizerRecord, WarmupRecord, WeightsRecord,
};
pub use stats::Statistics;
pub use summary::{Summary, measured};

/// Loading small manifests in a scratch folder, for the unit tests of this module.
#[cfg(test)]
pub(crate) mod testing {
    use crate::manifest::{LoadRequest, Resolved, load};

    /// Loads `text` as `dir/<name>.toml` with the given `--set` overrides and no environment.
    pub fn resolve(dir: &std::path::Path, name: &str, text: &str, sets: &[&str]) -> Resolved {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        std::fs::write(dir.join("prompts.txt"), "a cat\na dog\na bird\na fish\n").unwrap();
        load(&LoadRequest {
            manifest: path,
            env: Default::default(),
            sets: sets.iter().map(|s| s.to_string()).collect(),
            extra_args: Vec::new(),
            cwd: dir.to_path_buf(),
        })
        .unwrap_or_else(|d| panic!("{d}"))
    }

    pub const PROBE: &str = r#"
kind = "probe"
[prompts]
file = "prompts.txt"
indices = "0-3"
[warmup]
repeats = 2
[runtime]
provider = "cpu"
[assets]
bundle = "bundle"
"#;

    pub const GENERATION: &str = r#"
kind = "generation"
[prompts]
file = "prompts.txt"
indices = "all"
[shards]
count = 2
[runtime]
provider = "cpu"
cpu_slots = 2
[cache]
mode = "shared"
[assets]
bundle = "bundle"
"#;
}

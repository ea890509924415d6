//! An apply of some shards of a run (`runner apply --shard`): the shards' own locks, and the run
//! record that the applies of a run's shards share, read and written under its own lock.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use super::outcome::ApplyError;
use crate::manifest::diagnostic::display_path;
use crate::plan::Plan;
use crate::results::files::{RUN_JSON, write_json_atomic};
use crate::results::records::RunRecord;

/// The folder of shard `shard`'s own lock: the applies of one run's shards share the run's lock
/// and each holds its shards' locks, so that two applies never run the same shard.
pub(super) fn shard_lock_dir(run_dir: &Path, shard: usize) -> PathBuf {
    run_dir.join("shards").join(shard.to_string())
}

/// Whether a timing file (`timings/NNN.jsonl`) is one of this apply's selected processes.
pub(super) fn timing_file_selected(plan: &Plan, file: &Path) -> bool {
    file.file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse::<usize>().ok())
        .and_then(|i| plan.processes.get(i))
        .is_some_and(|p| plan.selects(p))
}

/// Holds the run record's own lock while a shard apply reads and writes `run.json` (other
/// shards' applies write it too); a whole-run apply, alone in the run, takes none.
pub(super) fn record_guard(
    run_dir: &Path,
    shard_apply: bool,
) -> Result<Option<fs::File>, ApplyError> {
    if !shard_apply {
        return Ok(None);
    }
    let path = run_dir.join(".unstep.record.lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .and_then(|f| f.lock().map(|()| f))
        .map_err(|e| ApplyError::Io(format!("cannot lock {}: {e}", display_path(&path))))?;
    Ok(Some(file))
}

/// A shard apply's record keeps the run's first start and every apply's start, and every shard
/// apply's Slurm job, other shards' included, from the `run.json` they wrote meanwhile.
pub(super) fn merge_concurrent(
    run_dir: &Path,
    record: &mut RunRecord,
    started: &str,
    shard_apply: bool,
) {
    if !shard_apply {
        return;
    }
    let current = crate::results::files::read_json::<RunRecord>(&run_dir.join(RUN_JSON))
        .ok()
        .filter(|c| c.config_hash == record.config_hash);
    record.merge_slurm_jobs(current.as_ref());
    let Some(current) = current else {
        return;
    };
    let mut starts: BTreeSet<String> = current.resumed_at.iter().cloned().collect();
    starts.extend(record.resumed_at.iter().cloned());
    starts.insert(current.started_at.clone());
    starts.insert(started.to_string());
    let first = starts.pop_first().unwrap_or_default();
    record.started_at = first;
    record.resumed_at = starts.into_iter().collect();
    if record.bundle.is_none() {
        record.bundle = current.bundle;
        record.execution_provider = current.execution_provider;
        record.versions = current.versions;
        record.attention_backend = current.attention_backend;
        record.dit_kernels = current.dit_kernels;
        record.vae_kernels = current.vae_kernels;
    }
}

/// Writes the run's record (a shard apply's merged with what other shards' applies wrote).
pub(super) fn write_record(
    run_dir: &Path,
    record: &mut RunRecord,
    started: &str,
    shard_apply: bool,
) -> Result<(), ApplyError> {
    let _guard = record_guard(run_dir, shard_apply)?;
    merge_concurrent(run_dir, record, started, shard_apply);
    write_json_atomic(&run_dir.join(RUN_JSON), record)?;
    Ok(())
}

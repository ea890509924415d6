//! Finding a run directory and reading its records back.

use std::path::{Path, PathBuf};

use crate::results::files::read_process_timings;
use crate::results::{
    RUN_JSON, RecordError, RunRecord, RunStatus, SUMMARY_JSON, Summary, TIMINGS_JSONL,
    TimingRecord, read_json, read_timings,
};

/// Why a run cannot be reported.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("no run `{name}` under {}/", results.display())]
    NoRun { name: String, results: PathBuf },
    #[error("no run directory at {}", path.display())]
    NoRunDir { path: PathBuf },
    #[error("the run name is empty")]
    EmptyName,
    #[error("{} has no {RUN_JSON}", dir.display())]
    NoRunRecord { dir: PathBuf },
    #[error(transparent)]
    Record(#[from] RecordError),
}

impl crate::exit::Failure for ReportError {
    /// What the user can do about it.
    fn hint(&self) -> Option<String> {
        match self {
            ReportError::NoRun { name, .. } => Some(format!(
                "run `runner apply experiments/{name}.toml` first, or pass --results DIR or a \
                 path to the run directory"
            )),
            ReportError::NoRunDir { .. } => {
                Some("pass a run name under --results DIR, or a run directory".into())
            }
            ReportError::EmptyName => Some(
                "pass a run's name (`runner runs` lists them) or the path of a run directory"
                    .into(),
            ),
            ReportError::NoRunRecord { .. } => Some(format!(
                "a run directory holds {RUN_JSON} from its start on; this one is not a run, or \
                 its run never started: re-run `runner apply`"
            )),
            ReportError::Record(e) if !e.is_not_found() => Some(
                "the run's records are damaged; `runner apply` of its manifest writes them again"
                    .into(),
            ),
            ReportError::Record(_) => None,
        }
    }

    /// A run that is not there is the user's input to fix; an unreadable record is not.
    fn exit_code(&self) -> i32 {
        match self {
            ReportError::Record(e) if !e.is_not_found() => crate::exit::INTERNAL,
            _ => crate::exit::USAGE,
        }
    }
}

/// A run read back from disk.
#[derive(Debug, Clone)]
pub struct LoadedRun {
    /// The run's name (from its record).
    pub name: String,
    pub dir: PathBuf,
    pub record: RunRecord,
    pub timings: Vec<TimingRecord>,
    /// `summary.json`, or the summary of the timings when the run ended before writing one.
    pub summary: Summary,
}

/// Finds the directory of `run`: a run name under `results`, else a path to a run directory.
pub fn locate(run: &str, results: &Path) -> Result<PathBuf, ReportError> {
    if run.trim().is_empty() {
        return Err(ReportError::EmptyName);
    }
    let by_name = results.join(run);
    if run.parse::<crate::manifest::RunName>().is_ok() && by_name.is_dir() {
        return Ok(by_name);
    }
    let path = Path::new(run);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    if run.parse::<crate::manifest::RunName>().is_ok() {
        Err(ReportError::NoRun {
            name: run.to_string(),
            results: results.to_path_buf(),
        })
    } else {
        Err(ReportError::NoRunDir {
            path: path.to_path_buf(),
        })
    }
}

/// Reads the records of the run in `dir`. A run that failed before its first prompt has no
/// `timings.jsonl`; that reads as no timings.
///
/// A record that says `running` is either a run in progress (its apply holds the folder's lock)
/// or one whose apply was killed: the latter is reported as interrupted. Either way its timings
/// are the processes' own files, as far as they go.
pub fn load_run(dir: &Path) -> Result<LoadedRun, ReportError> {
    let mut record: RunRecord = match read_json(&dir.join(RUN_JSON)) {
        Ok(r) => r,
        Err(e) if e.is_not_found() => {
            return Err(ReportError::NoRunRecord {
                dir: dir.to_path_buf(),
            });
        }
        Err(e) => return Err(e.into()),
    };
    let evaluating = record.evaluation.as_ref().map(|e| e.status)
        == Some(crate::results::scores::EvaluationStatus::Running);
    if evaluating && !crate::lock_query::is_held(dir) {
        let e = record.evaluation.as_mut().expect("checked above");
        e.status = crate::results::scores::EvaluationStatus::Failed;
        e.failure.get_or_insert_with(|| {
            "the evaluation was killed before it finished; run `runner evaluate` again".into()
        });
    }
    if record.status == RunStatus::Running {
        // A Slurm job's tasks take the lock once they start: a queued job holds nothing yet
        // (`runner status` asks Slurm).
        if record.slurm.is_none() && !crate::lock_query::is_held(dir) {
            record.status = RunStatus::Interrupted;
            record.failure.get_or_insert_with(|| {
                "the apply that ran it ended without finishing (it was killed); apply its \
                 manifest again to continue"
                    .into()
            });
        }
        let timings = read_process_timings(dir).records;
        let summary = Summary::from_records(&timings, record.kind, record.cache.label);
        return Ok(LoadedRun {
            name: record.run.clone(),
            dir: dir.to_path_buf(),
            record,
            timings,
            summary,
        });
    }
    let timings = match read_timings(&dir.join(TIMINGS_JSONL)) {
        Ok(t) => t,
        Err(e) if e.is_not_found() => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let summary = match read_json(&dir.join(SUMMARY_JSON)) {
        Ok(s) => s,
        Err(e) if e.is_not_found() => {
            Summary::from_records(&timings, record.kind, record.cache.label)
        }
        Err(e) => return Err(e.into()),
    };
    Ok(LoadedRun {
        name: record.run.clone(),
        dir: dir.to_path_buf(),
        record,
        timings,
        summary,
    })
}

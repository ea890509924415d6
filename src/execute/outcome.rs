//! What an apply is asked (its options beyond the manifest) and how it ends: its outcome, or the
//! error that stopped it, with the exit status each maps to. Below every step of `apply`, which
//! all return these.

use std::path::PathBuf;

use super::lock::LockError;
use super::staging::StagingError;
use crate::results::records::RunStatus;

/// How `apply` behaves beyond the manifest.
#[derive(Debug, Clone, Default)]
pub struct ApplyOptions {
    /// Reuse an existing staging folder whose audit matches.
    pub reuse_workdir: bool,
    /// No progress output (tests, scripts).
    pub quiet: bool,
    /// Slurm: return once the job is submitted, without following it.
    pub detach: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The user must change something; nothing was written.
    #[error("{message}")]
    Refused {
        message: String,
        hint: Option<String>,
    },
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Staging(#[from] StagingError),
    #[error("cannot write results: {0}")]
    Results(#[from] crate::results::files::RecordError),
    #[error("{0}")]
    Io(String),
    /// An interrupt arrived before the run started: the apply ended before it made the run's
    /// folders its own and wrote its record (a snapshot it staged is removed).
    #[error("interrupted before run `{run}` started")]
    Interrupted { run: String },
}

impl ApplyError {
    pub(super) fn refused(message: impl Into<String>, hint: impl Into<String>) -> Self {
        ApplyError::Refused {
            message: message.into(),
            hint: Some(hint.into()),
        }
    }

    /// Errors of input (bad state, a held lock) rather than of the machine.
    fn is_usage(&self) -> bool {
        matches!(
            self,
            ApplyError::Refused { .. }
                | ApplyError::Lock(LockError::Held { .. })
                | ApplyError::Staging(
                    StagingError::Exists(_)
                        | StagingError::AuditMismatch { .. }
                        | StagingError::Symlink(_)
                )
        )
    }
}

impl crate::exit::Failure for ApplyError {
    fn exit_code(&self) -> i32 {
        if matches!(self, ApplyError::Interrupted { .. }) {
            crate::exit::INTERRUPTED
        } else if self.is_usage() {
            crate::exit::USAGE
        } else {
            crate::exit::FAILURE
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            ApplyError::Refused { hint, .. } => hint.clone(),
            ApplyError::Interrupted { .. } => {
                Some("apply the same manifest again to start it".to_string())
            }
            _ => None,
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: RunStatus,
    pub run_dir: PathBuf,
    pub failures: Vec<String>,
    /// The Slurm job that ran the work (Slurm executor, when there was work to submit).
    pub slurm_job: Option<String>,
}

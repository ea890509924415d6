//! The execute pass: the run's configuration resolved once ([`config`]), preflight checks, locks,
//! staging, worker processes and their jobs and events, and the records they leave.

pub mod apply;
pub mod config;
pub mod device;
pub mod evaluate;
pub mod events;
pub mod job;
mod jobs;
pub mod lock;
pub mod outcome;
mod preflight;
pub mod progress;
mod resume;
mod shard_apply;
pub mod signals;
mod slots;
pub mod slurm;
pub mod staging;
mod start;
pub mod worker;

pub use apply::{ApplyError, ApplyOptions, Outcome, apply};
pub use preflight::{before_work, check_runtime};
pub use resume::{PreviousRun, previous_run};

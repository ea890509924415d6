//! The execute pass: locks, staging, worker processes, and the records they leave.

pub mod apply;
pub mod device;
pub mod lock;
pub mod progress;
pub mod spec;
pub mod staging;

pub use apply::{ApplyError, ApplyOptions, Outcome, PreviousRun, apply, previous_run};

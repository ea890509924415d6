//! Reading runs back: `runner report` (statistics, phase split, provenance), `runner compare`,
//! and the latency plot a run leaves beside its records.

pub mod load;
pub mod render;
pub mod scores;
pub mod svg;

pub use load::{LoadedRun, ReportError, load_run, locate};
pub use render::{CompareRow, Comparison, PhaseSplit, Provenance, Report, report_text};
pub use svg::{latency_svg, write_latency_svg};

//! Reading runs back: `runner report` (statistics, phase split, provenance), `runner compare`,
//! `runner runs` and `runner diff`, the latency plot a run leaves beside its records, and the
//! HTML pages of a report or a comparison.

pub mod first_prompt;
pub mod html;
pub mod load;
pub mod many;
pub mod quality;
pub mod render;
pub mod runs;
pub mod scores;
pub mod svg;
pub mod wall;
pub mod warnings;
mod words;

pub use first_prompt::{FirstPrompt, FirstPrompts};
pub use load::{LoadedRun, ReportError, load_run, locate};
pub use many::ManyComparison;
pub use render::{CompareRow, Comparison, PhaseSplit, Provenance, Report, report_text};
pub use runs::{RunRow, SettingsDiff, list_runs, runs_table};
pub use svg::{latency_svg, write_latency_svg};
pub use wall::WallTime;

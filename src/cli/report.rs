//! `runner report RUN` and `runner compare RUN RUN [RUN…]`.

use std::path::PathBuf;

use clap::Args;

use super::out;
use crate::exit;
use crate::report::{self, Comparison, LoadedRun, ManyComparison, Report, ReportError, html};
use crate::results::LATENCY_SVG;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A run name under the results folder, or a path to a run directory.
    pub run: String,
    /// The results folder run names are looked up in.
    #[arg(long, value_name = "DIR", default_value = "results")]
    pub results: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write the report as one HTML page, FILE or the run's report.html, and print its path.
    #[arg(long, value_name = "FILE", num_args = 0..=1, conflicts_with = "json")]
    pub html: Option<Option<PathBuf>>,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The runs (names or run directories), the reference first. Two runs: a and b, with
    /// deltas and ratios; more: a column per run, with ratios to the first.
    #[arg(required = true, num_args = 2.., value_name = "RUN")]
    pub runs: Vec<String>,
    /// The results folder run names are looked up in.
    #[arg(long, value_name = "DIR", default_value = "results")]
    pub results: PathBuf,
    /// Print the comparison as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write the comparison as one HTML page, FILE or results/compare-A-vs-B.html, and print
    /// its path.
    #[arg(long, value_name = "FILE", num_args = 0..=1, conflicts_with = "json")]
    pub html: Option<Option<PathBuf>>,
}

fn load(run: &str, results: &std::path::Path) -> Result<LoadedRun, ReportError> {
    report::load_run(&report::locate(run, results)?)
}

fn json_text<T: serde::Serialize>(value: &T) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("reports serialise");
    text.push('\n');
    text
}

pub fn run_report(args: &ReportArgs) -> i32 {
    let run = match load(&args.run, &args.results) {
        Ok(r) => r,
        Err(e) => return exit::report(&e),
    };
    if let Some(Some(file)) = &args.html
        && let Err(e) = html::check_page_path(file)
    {
        return exit::report(&e);
    }
    // The orchestrator draws the plot at the end of a run; an interrupted run may lack it.
    if !run.dir.join(LATENCY_SVG).exists()
        && let Err(e) = report::write_latency_svg(&run.dir, &run.timings)
    {
        crate::say!("warning: {e}");
    }
    if let Some(file) = &args.html {
        let path = file
            .clone()
            .unwrap_or_else(|| run.dir.join(html::REPORT_HTML));
        return write_html(&path, |path| html::report_page(&run, path));
    }
    if args.json {
        out(&json_text(&Report::of(&run)))
    } else {
        out(&report::report_text(&run))
    }
}

pub fn run_compare(args: &CompareArgs) -> i32 {
    let mut runs = Vec::new();
    for run in &args.runs {
        match load(run, &args.results) {
            Ok(r) => runs.push(r),
            Err(e) => return exit::report(&e),
        }
    }
    // A page named on the command line is checked before the comparison reads any arrays.
    let page = args.html.as_ref().map(|file| {
        file.clone().unwrap_or_else(|| {
            let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
            args.results.join(html::compare_file_name(&names))
        })
    });
    if let Some(Some(file)) = &args.html
        && let Err(e) = html::check_page_path(file)
    {
        return exit::report(&e);
    }
    if let [a, b] = runs.as_slice() {
        let comparison = Comparison::of(a, b);
        if let Some(path) = &page {
            return write_html(path, |path| {
                html::compare_page(&runs, html::Compared::Two(&comparison), path)
            });
        }
        for w in &comparison.warnings {
            crate::say!("warning: {w}");
        }
        return if args.json {
            out(&json_text(&comparison))
        } else {
            out(&comparison.text())
        };
    }
    let comparison = ManyComparison::of(&runs);
    if let Some(path) = &page {
        return write_html(path, |path| {
            html::compare_page(&runs, html::Compared::Many(&comparison), path)
        });
    }
    for w in &comparison.warnings {
        crate::say!("warning: {w}");
    }
    if args.json {
        out(&json_text(&comparison))
    } else {
        out(&comparison.text())
    }
}

/// Makes the page for `path` with `page`, prints its warnings, writes it and prints its path.
/// A path from the command line has been checked before (`html::check_page_path`).
fn write_html(path: &std::path::Path, page: impl FnOnce(&std::path::Path) -> html::Page) -> i32 {
    let page = page(path);
    for w in &page.warnings {
        crate::say!("warning: {w}");
    }
    if let Err(e) = html::write_page(path, &page.html) {
        return exit::report(&e);
    }
    out(&format!("{}\n", path.display()))
}

//! `runner apply`: run a manifest's plan and record its results.

use clap::Args;

use super::ManifestArgs;
use crate::execute::{self, ApplyOptions};
use crate::exit;
use crate::results::records::RunStatus;

#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub manifest: ManifestArgs,
    /// Reuse an existing staging folder in the work root when its audit matches.
    #[arg(long)]
    pub reuse_workdir: bool,
    /// Print no progress.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(args: &ApplyArgs) -> i32 {
    let (resolved, plan) = match args.manifest.load_plan() {
        Ok(both) => both,
        Err(code) => return code,
    };
    let opts = ApplyOptions {
        reuse_workdir: args.reuse_workdir,
        quiet: args.quiet,
    };
    let outcome = match execute::apply(&resolved, &plan, &opts) {
        Ok(o) => o,
        Err(e) => return exit::report(&e),
    };
    // The statistics table, as `runner report` shows it.
    let report = crate::report::load_run(&outcome.run_dir)
        .map(|run| crate::report::report_text(&run))
        .unwrap_or_default();
    let code = super::out(&report);
    match outcome.status {
        RunStatus::Succeeded => code,
        RunStatus::EvaluationFailed => {
            for f in &outcome.failures {
                eprintln!("error: {f}");
            }
            eprintln!(
                "every video is made and kept, and the evaluation failed; fix it and apply again \
                 (only the evaluation runs) or run `runner evaluate {}`",
                plan.run
            );
            exit::FAILURE
        }
        RunStatus::Interrupted => {
            eprintln!("interrupted; apply the same manifest again to resume");
            exit::INTERRUPTED
        }
        _ => {
            for f in &outcome.failures {
                eprintln!("error: {f}");
            }
            eprintln!(
                "run failed; completed prompts are kept, and applying again resumes (with --reuse-workdir, since the staging is kept for diagnosis)"
            );
            exit::FAILURE
        }
    }
}

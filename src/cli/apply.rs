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
    /// Run only these shards (N or A-B) and the warmups they need, into the same run; other
    /// applies (other machines, other work roots) may run the other shards meanwhile.
    #[arg(long, value_name = "N|A-B")]
    pub shard: Option<crate::plan::ShardRange>,
    /// Slurm executor: submit the job and return at once, printing its id.
    #[arg(long)]
    pub detach: bool,
}

pub fn run(args: &ApplyArgs) -> i32 {
    let mut runs = match args.manifest.load_plans(args.shard) {
        Ok(runs) => runs,
        Err(code) => return code,
    };
    let opts = ApplyOptions {
        reuse_workdir: args.reuse_workdir,
        quiet: args.quiet,
        detach: args.detach,
    };
    if runs[0].0.sweep.is_some() {
        return super::sweep::apply(&runs, &opts);
    }
    let (resolved, plan) = runs.remove(0);
    let outcome = match execute::apply(&resolved, &plan, &opts) {
        Ok(o) => o,
        Err(e) => return exit::report(&e),
    };
    if let (RunStatus::Running, Some(job)) = (outcome.status, &outcome.slurm_job) {
        // `--detach`: the job runs on; its id is the output.
        crate::say!(
            "submitted Slurm job {job}; `runner status {}` shows where the run stands, and applying \
             the manifest again once the job has ended writes its summary",
            outcome.run_dir.display()
        );
        return super::out(&format!("{job}\n"));
    }
    // The statistics table, as `runner report` shows it.
    let report = crate::report::load_run(&outcome.run_dir)
        .map(|run| crate::report::report_text(&run))
        .unwrap_or_default();
    let code = super::out(&report);
    match outcome.status {
        RunStatus::Succeeded => code,
        RunStatus::Partial => {
            crate::say!(
                "the selected shards are done; the run is complete once every shard is (`runner status {}`)",
                outcome.run_dir.display()
            );
            code
        }
        RunStatus::EvaluationFailed => {
            for f in &outcome.failures {
                crate::say!("error: {f}");
            }
            crate::say!(
                "every video is made and kept, and the evaluation failed; fix it and apply again \
                 (only the evaluation runs) or run `runner evaluate {}`",
                plan.run
            );
            exit::FAILURE
        }
        RunStatus::Interrupted => {
            crate::say!("interrupted; apply the same manifest again to resume");
            exit::INTERRUPTED
        }
        _ => {
            for f in &outcome.failures {
                crate::say!("error: {f}");
            }
            crate::say!(
                "run failed; completed prompts are kept, and applying again resumes (with --reuse-workdir, since the staging is kept for diagnosis)"
            );
            exit::FAILURE
        }
    }
}

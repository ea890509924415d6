//! `runner apply`: run a manifest's plan and record its results.

use clap::Args;

use super::ManifestArgs;
use crate::execute::{self, ApplyOptions};
use crate::exit;
use crate::manifest::diagnostic::display_path;
use crate::manifest::{Kind, Resolved};
use crate::plan::Plan;
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
    /// Sweep a setting over values: table.key=v1,v2,… (repeatable; several keys make every
    /// combination), as a `[sweep]` table of those lists would. Refused with a manifest that
    /// has a `[sweep]` table.
    #[arg(long = "sweep", value_name = "KEY=V1,V2,...")]
    pub sweep: Vec<String>,
    /// Print the run's record (its run.json) as JSON on stdout at the end, in place of the
    /// report; a sweep's, a list of its runs' records.
    #[arg(long)]
    pub json: bool,
    /// Slurm executor: submit the job and return at once, printing its id.
    #[arg(long)]
    pub detach: bool,
}

pub fn run(args: &ApplyArgs) -> i32 {
    let mut runs = match args.manifest.load_plans(args.shard, &args.sweep) {
        Ok(runs) => runs,
        Err(code) => return code,
    };
    let opts = ApplyOptions {
        reuse_workdir: args.reuse_workdir,
        quiet: args.quiet,
        detach: args.detach,
    };
    if runs[0].0.sweep.is_some() {
        return super::sweep::apply(&runs, &opts, args.json);
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
        if args.json {
            return super::out(&super::apply_json::value_text(
                &super::apply_json::record_json(&outcome.run_dir),
            ));
        }
        return super::out(&format!("{job}\n"));
    }
    let code = if args.json {
        super::out(&super::apply_json::value_text(
            &super::apply_json::record_json(&outcome.run_dir),
        ))
    } else {
        // The statistics table, as `runner report` shows it.
        let report = crate::report::load_run(&outcome.run_dir)
            .map(|run| crate::report::report_text(&run))
            .unwrap_or_default();
        super::out(&report)
    };
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
            crate::say!("{}", after_failure(args, &resolved, &plan).trim_end());
            exit::FAILURE
        }
    }
}

/// What to run after a failed run, as commands to copy: this apply's own (the variables that
/// set its settings, the manifest, its flags) with what the next apply needs to go on. The
/// failed run keeps its staging, which is refused without `--reuse-workdir`. A probe also keeps
/// its compiler state, which is refused unless `cache.reuse_runtime_state` is set, and is
/// measured afresh, never resumed: with fresh caches under a new name, or with the kept state
/// (setting that changes what is staged, so the kept staging is cleaned away first).
fn after_failure(args: &ApplyArgs, r: &Resolved, plan: &Plan) -> String {
    let staged = plan.work_root.join(&plan.run).exists();
    let again = rerun_command(args, r, None);
    if r.manifest.kind != Kind::Probe {
        return if staged {
            format!(
                "run failed; completed prompts are kept, and its staging for diagnosis; resume \
                 it with\n  {again} --reuse-workdir\n"
            )
        } else {
            format!("run failed; completed prompts are kept; resume it with\n  {again}\n")
        };
    }
    let mut options = Vec::new();
    // A new name gives fresh caches where the state lives in the run's own folder (the default).
    if r.paths.run_state_root.starts_with(&plan.run_dir) {
        let fresh = (2..)
            .map(|n| format!("{}-{n}", plan.run))
            .find(|name| {
                !plan.run_dir.with_file_name(name).exists() && !plan.work_root.join(name).exists()
            })
            .expect("an unused name");
        options.push(format!(
            "with fresh caches under a new name:\n  {}\n",
            rerun_command(args, r, Some(&fresh))
        ));
    }
    let has_state =
        std::fs::read_dir(&r.paths.run_state_root).is_ok_and(|mut d| d.next().is_some());
    let warm = match (has_state, r.manifest.cache.reuse_runtime_state, staged) {
        (true, false, true) => format!(
            "runner clean {} && {again} --set cache.reuse_runtime_state=true",
            shell_quote(&display_path(&plan.run_dir))
        ),
        (true, false, false) => format!("{again} --set cache.reuse_runtime_state=true"),
        (_, _, true) => format!("{again} --reuse-workdir"),
        (_, _, false) => again,
    };
    options.push(format!(
        "with its kept compiler state (its results say warm-cache{}):\n  {warm}\n",
        if warm.starts_with("runner clean") {
            "; the kept staging goes first, as the setting changes what is staged"
        } else {
            ""
        }
    ));
    format!(
        "probe failed; its staging and compiler state are kept for diagnosis, and a probe is \
         measured afresh, not resumed. Measure it again {}",
        options.join("or ")
    )
}

/// `runner apply` as this one was given (with `name` replaced by `new_name` when given),
/// preceded by the environment variables that set its settings (each whole, by its name: one
/// `UNSTEP_EXTRA_ARGS` may set several), quoted for a POSIX shell.
fn rerun_command(args: &ApplyArgs, r: &Resolved, new_name: Option<&str>) -> String {
    let mut vars: Vec<&str> = r
        .settings
        .values()
        .filter_map(|s| s.origin.env_var())
        .collect();
    vars.sort_unstable();
    vars.dedup();
    let mut words: Vec<String> = vars
        .iter()
        .filter_map(|var| {
            let value = std::env::var(var).ok()?;
            Some(format!("{var}={}", shell_quote(&value)))
        })
        .collect();
    words.push("runner apply".into());
    if args.quiet {
        words.push("--quiet".into());
    }
    if let Some(range) = args.shard {
        words.push(format!("--shard {}", range.label()));
    }
    for set in args
        .manifest
        .set
        .iter()
        .filter(|s| new_name.is_none() || !s.starts_with("name="))
    {
        words.push(format!("--set {}", shell_quote(set)));
    }
    if let Some(name) = new_name {
        words.push(format!("--set name={}", shell_quote(name)));
    }
    for extra in &args.manifest.extra_args {
        words.push(format!("--extra-args {}", shell_quote(extra)));
    }
    words.push(shell_quote(&args.manifest.manifest.to_string_lossy()));
    words.join(" ")
}

/// `word` as one word of a POSIX shell: unchanged when it has no special characters, else in
/// single quotes.
fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

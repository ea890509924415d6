//! `runner apply` of a sweep: its runs one after the other, each a normal run, then one table
//! over all of them.

use crate::execute::{self, ApplyError, ApplyOptions, PreviousRun};
use crate::exit::{self, Failure};
use crate::manifest::Resolved;
use crate::plan::Plan;
use crate::report::{self, RunRow};
use crate::results::records::RunStatus;

/// How one run of the sweep ended.
enum Ended {
    Ran(RunStatus),
    /// `apply` refused or failed before the run started (its error is printed).
    Error(i32),
}

/// Applies every run of the sweep in turn. Refusals that can be told before anything runs
/// (a results folder holding another configuration, probe state in the way, and every check
/// `apply` makes before it writes: `execute::before_work`) stop the sweep before its first run. A failed run does not stop the others; an interrupt, or an error of
/// `apply` itself (the bundle, a lock, the staging), stops the sweep after that run. An
/// interrupt is seen from the sweep's start on: one that arrives before a run has started
/// (before the first, or between two) starts no run after it, as `apply` of that run, which
/// ends before it writes anything when the interrupt came first, leaves it not started.
/// With `json`, stdout has the records (`run.json`) of the runs that ran, as a list, in place
/// of the table.
pub fn apply(runs: &[(Resolved, Plan)], opts: &ApplyOptions, json: bool) -> i32 {
    execute::signals::install_signal_handlers();
    let mut refused = false;
    for (resolved, plan) in runs {
        let refusal = match execute::previous_run(resolved, plan) {
            PreviousRun::Refused { message, hint } => Some((message, hint, exit::USAGE)),
            _ => execute::before_work(resolved, plan, opts.reuse_workdir)
                .err()
                .map(|e| (e.to_string(), e.hint(), e.exit_code())),
        };
        if let Some((message, hint, code)) = refusal {
            exit::report(&exit::Plain {
                message: format!("run `{}`: {message}", plan.run),
                hint,
                code,
            });
            refused = true;
        }
    }
    if refused {
        crate::say!("the sweep was not started; nothing was written");
        return exit::USAGE;
    }
    let mut ended: Vec<Ended> = Vec::new();
    for (i, (resolved, plan)) in runs.iter().enumerate() {
        if execute::apply::interrupted() {
            break;
        }
        if !opts.quiet {
            let values = resolved
                .sweep
                .as_ref()
                .map(|p| p.describe())
                .unwrap_or_default();
            crate::say!(
                "sweep: run {} of {}, `{}` ({values})",
                i + 1,
                runs.len(),
                plan.run
            );
        }
        match execute::apply(resolved, plan, opts) {
            Ok(outcome) => {
                for f in &outcome.failures {
                    crate::say!("error: run `{}`: {f}", plan.run);
                }
                let status = outcome.status;
                ended.push(Ended::Ran(status));
                if status == RunStatus::Interrupted {
                    break;
                }
            }
            // Not started: the table lists it so, and the sweep ends as interrupted.
            Err(ApplyError::Interrupted { .. }) => break,
            Err(e) => {
                let e = exit::Plain {
                    message: format!("run `{}`: {e}", plan.run),
                    hint: e.hint(),
                    code: e.exit_code(),
                };
                ended.push(Ended::Error(exit::report(&e)));
                break;
            }
        }
    }
    let code = if json {
        let records = runs
            .iter()
            .zip(&ended)
            .filter(|(_, e)| matches!(e, Ended::Ran(_)))
            .map(|((_, plan), _)| super::apply_json::record_json(&plan.run_dir))
            .collect();
        super::out(&super::apply_json::value_text(&serde_json::Value::Array(
            records,
        )))
    } else {
        super::out(&summary(runs, &ended))
    };
    let ran = |s: RunStatus| ended.iter().any(|e| matches!(e, Ended::Ran(x) if *x == s));
    if ran(RunStatus::Interrupted) || execute::apply::interrupted() {
        crate::say!("interrupted; apply the same manifest again to resume the sweep");
        return exit::INTERRUPTED;
    }
    if let Some(Ended::Error(c)) = ended.last() {
        // An error of the first run: nothing of the sweep ran.
        return if ended.len() == 1 { *c } else { exit::FAILURE };
    }
    if ran(RunStatus::Failed) {
        crate::say!(
            "a run of the sweep failed; completed prompts are kept, and applying the sweep \
             again resumes it (with --reuse-workdir, since a failed run's staging is kept for \
             diagnosis)"
        );
        return exit::FAILURE;
    }
    code
}

/// The table over the sweep's runs, as `runner runs` lists them (a run that did not start is
/// listed as such), then, where the runs kept latents or frames, each later run's quality
/// against the first's on the same noise, as `runner compare` measures it.
fn summary(runs: &[(Resolved, Plan)], ended: &[Ended]) -> String {
    let loaded: Vec<Option<report::LoadedRun>> = runs
        .iter()
        .enumerate()
        .map(|(i, (_, plan))| match ended.get(i) {
            Some(Ended::Ran(_)) => report::load_run(&plan.run_dir).ok(),
            _ => None,
        })
        .collect();
    let rows: Vec<RunRow> = runs
        .iter()
        .zip(&loaded)
        .enumerate()
        .map(|(i, ((_, plan), run))| {
            let status = match (ended.get(i), run) {
                (None, _) => "not started",
                (Some(Ended::Error(_)), _) => "error",
                (Some(Ended::Ran(_)), Some(run)) => return RunRow::of(run),
                (Some(Ended::Ran(_)), None) => "unreadable",
            };
            RunRow::without_record(&plan.run, &plan.run_dir, status)
        })
        .collect();
    // Runs over other noise, other sizes or no common prompts are left out here without a
    // word: `runner compare` of them says why.
    let mut quality = Vec::new();
    if let Some(Some(first)) = loaded.first() {
        for other in loaded[1..].iter().flatten() {
            quality.extend(report::quality::quality(first, other).0);
        }
    }
    let mut quality_text = String::new();
    report::quality::quality_text(&mut quality_text, &quality);
    let base = runs[0]
        .0
        .sweep
        .as_ref()
        .map_or(runs[0].1.run.as_str(), |p| p.base.as_str());
    format!(
        "sweep `{base}`: {} runs\n{}{quality_text}",
        runs.len(),
        report::runs_table(&rows)
    )
}

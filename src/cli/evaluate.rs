//! `runner evaluate RUN`: run a generation's evaluation on its videos, as its record describes
//! it, and record the scores.

use std::path::PathBuf;

use clap::Args;

use super::out;
use crate::execute::lock::{Lock, LockError};
use crate::exit::{self, Plain};
use crate::report::{self, ReportError};
use crate::results::records::{RunRecord, RunStatus};
use crate::results::{RUN_JSON, read_json};

#[derive(Debug, Args)]
pub struct EvaluateArgs {
    /// A run name under the results folder, or a path to a run directory.
    pub run: String,
    /// The results folder run names are looked up in.
    #[arg(long, value_name = "DIR", default_value = "results")]
    pub results: PathBuf,
    /// Score the videos there are even when some prompts of the run are not complete (the
    /// scores are then recorded as the run's, of an incomplete set).
    #[arg(long)]
    pub force: bool,
    /// Print the evaluation record (run.json's `evaluation`: status, scores, failure) as JSON.
    #[arg(long)]
    pub json: bool,
}

fn refuse(message: String, hint: &str) -> i32 {
    exit::report(&Plain {
        message,
        hint: Some(hint.to_string()),
        code: exit::USAGE,
    })
}

pub fn run(args: &EvaluateArgs) -> i32 {
    let dir = match report::locate(&args.run, &args.results) {
        Ok(d) => d,
        Err(e) => return exit::report(&e),
    };
    let record: RunRecord = match read_json(&dir.join(RUN_JSON)) {
        Ok(r) => r,
        Err(e) if e.is_not_found() => {
            return exit::report(&ReportError::NoRunRecord { dir });
        }
        Err(e) => return exit::report(&ReportError::Record(e)),
    };
    let name = record.run.clone();
    // The run's lock: no apply of it may be making videos while they are scored.
    let _lock = match Lock::acquire(&dir, &name) {
        Ok(l) => l,
        Err(e @ LockError::Held { .. }) => {
            return refuse(
                e.to_string(),
                "wait for that apply to end; it evaluates the run itself",
            );
        }
        Err(e) => {
            return exit::report(&Plain {
                message: e.to_string(),
                hint: None,
                code: exit::INTERNAL,
            });
        }
    };
    // Read again under the lock: an apply may have ended in between.
    let mut record: RunRecord = match read_json(&dir.join(RUN_JSON)) {
        Ok(r) => r,
        Err(e) => return exit::report(&ReportError::Record(e)),
    };
    if record.evaluation.is_none() {
        return refuse(
            format!("run `{name}` has no evaluation: its manifest sets no [evaluation] command"),
            "add an [evaluation] table to its manifest (docs/vbench.md) and apply it again: \
             with its videos complete, only the evaluation runs",
        );
    }
    if let Some(weights) = record.weights.as_ref().filter(|w| w.source != "released") {
        let allowed = record
            .settings
            .get("assets.allow_random_weights")
            .is_some_and(|s| s.value == serde_json::Value::Bool(true));
        if !allowed {
            return refuse(
                format!(
                    "run `{name}` was made from seeded random weights ({} weights: DiT {}, VAE {}, \
                     text encoder {}), and its scores would read as the model's",
                    weights.source, weights.dit, weights.vae, weights.text_encoder
                ),
                "generate it again from the released weights (docs/gpu.md), or set \
                 assets.allow_random_weights = true in its manifest and apply it again",
            );
        }
    }
    if !matches!(
        record.status,
        RunStatus::Succeeded | RunStatus::EvaluationFailed
    ) {
        let status = match record.status {
            RunStatus::Running => RunStatus::Interrupted,
            s => s,
        };
        return refuse(
            format!(
                "run `{name}` has status {}: its videos are not complete, and only a complete \
                 generation is evaluated",
                status.as_str()
            ),
            "apply its manifest again to finish the generation; the evaluation follows",
        );
    }
    // The videos must be every prompt's, whole and of its current text, as `runner status`
    // counts them: scores of an incomplete set would pass for the run's.
    if let Some(state) = crate::results::completeness::of_record(&dir, &record) {
        let missing = state.missing();
        if !missing.is_empty() && !args.force {
            return refuse(
                format!(
                    "run `{name}` has {} of its {} prompts not complete: {}; their videos would \
                     be missing from the scores",
                    missing.len(),
                    state.planned.len(),
                    state.missing_text()
                ),
                "apply its manifest again to make them (the evaluation follows), or pass \
                 --force to score the videos there are",
            );
        }
        if !missing.is_empty() {
            crate::say!(
                "warning: {} of the {} prompts of run `{name}` are not complete; the scores are \
                 of the videos there are (--force)",
                missing.len(),
                state.planned.len()
            );
        }
    }
    let status = match crate::execute::evaluate::evaluate_run(&dir, &mut record) {
        Ok(s) => s,
        Err(e) => {
            return exit::report(&Plain {
                message: format!("cannot write the run's record: {e}"),
                hint: None,
                code: exit::INTERNAL,
            });
        }
    };
    let code = if args.json {
        let mut text = serde_json::to_string_pretty(&record.evaluation).expect("records serialise");
        text.push('\n');
        out(&text)
    } else {
        let mut text = String::new();
        crate::report::scores::evaluation_section(&mut text, &record);
        out(text.trim_start())
    };
    match status {
        RunStatus::Succeeded => code,
        RunStatus::Interrupted => {
            crate::say!(
                "interrupted; the videos are kept, and `runner evaluate {}` runs the evaluation \
                 again",
                args.run
            );
            exit::INTERRUPTED
        }
        _ => {
            crate::say!(
                "error: {}",
                record.failure.as_deref().unwrap_or("the evaluation failed")
            );
            crate::say!(
                "  = hint: the videos are kept; fix the evaluation and run `runner evaluate {}` \
                 again",
                args.run
            );
            exit::FAILURE
        }
    }
}

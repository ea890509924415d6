//! `runner plan`: load, validate and expand a manifest, and print the plan.

use clap::Args;

use super::{ManifestArgs, out};
use crate::execute::PreviousRun;

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub manifest: ManifestArgs,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also print every setting with its value and the layer that set it.
    #[arg(long)]
    pub explain: bool,
}

pub fn run(args: &PlanArgs) -> i32 {
    let (resolved, plan) = match args.manifest.load_plan() {
        Ok(both) => both,
        Err(code) => return code,
    };
    let previous = crate::execute::previous_run(&resolved, &plan);
    if args.json {
        let mut value = serde_json::to_value(&plan).expect("plans serialise");
        value["results_state"] = serde_json::to_value(&previous).expect("states serialise");
        let names = crate::results::names::VideoNames::of(&resolved);
        if !names.renamed.is_empty() {
            value["renamed_videos"] =
                serde_json::to_value(&names.renamed).expect("names serialise");
        }
        if args.explain {
            let settings: serde_json::Map<String, serde_json::Value> = resolved
                .settings
                .iter()
                .map(|(k, s)| {
                    (
                        k.clone(),
                        serde_json::json!({
                            "value": serde_json::to_value(&s.value).unwrap_or_default(),
                            "layer": s.origin.layer_name(),
                            "origin": s.origin.to_string(),
                        }),
                    )
                })
                .collect();
            value["settings"] = serde_json::Value::Object(settings);
        }
        let mut text = serde_json::to_string_pretty(&value).expect("json");
        text.push('\n');
        return out(&text);
    }
    let mut text = crate::plan::render::text(&plan, &resolved, &results_state(&previous));
    text.push_str(&videos_and_evaluation(&resolved));
    if args.explain {
        text.push('\n');
        text.push_str(&crate::plan::render::explain(&resolved));
    }
    out(&text)
}

/// What the results folder holds, in words, for the plan's `results` line.
fn results_state(previous: &PreviousRun) -> String {
    match previous {
        PreviousRun::New => "new".into(),
        PreviousRun::Resumes { done, selected } if done == selected => {
            format!("exists: all {selected} prompts done; apply resumes and generates nothing")
        }
        PreviousRun::Resumes { done, selected } => format!(
            "exists: {done} of {selected} prompts done; apply resumes with the other {}",
            selected - done
        ),
        PreviousRun::Remeasures => "exists: apply measures the probe afresh".into(),
        PreviousRun::Refused { message, hint } => match hint {
            Some(hint) => format!("apply will refuse: {message}; {hint}"),
            None => format!("apply will refuse: {message}"),
        },
    }
}

/// The prompts whose videos could not take their standard prompt's name as it is, and the
/// evaluation that follows a complete generation.
fn videos_and_evaluation(r: &crate::manifest::Resolved) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let names = crate::results::names::VideoNames::of(r);
    if !names.renamed.is_empty() {
        let _ = writeln!(
            t,
            "\nrenamed videos ({}: their standard prompts cannot be file names as they are; \
             docs/vbench.md):",
            names.renamed.len()
        );
        for n in &names.renamed {
            let _ = writeln!(
                t,
                "  prompt {}: `{}` -> `{}` ({})",
                n.index,
                n.standard.escape_debug(),
                n.name,
                n.reasons.join(", ")
            );
        }
    }
    if let Some(e) = crate::results::scores::EvaluationRecord::of(r) {
        let _ = writeln!(
            t,
            "\nevaluation after a complete generation: {}\n  scores read from eval/{}",
            e.command.join(" "),
            e.scores_file
        );
    }
    t
}

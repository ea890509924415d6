//! `runner plan`: load, validate and expand a manifest, and print the plan.

use std::fmt::Write as _;

use clap::Args;

use super::{ManifestArgs, out};
use crate::execute::PreviousRun;
use crate::manifest::Resolved;
use crate::manifest::diagnostic::display_path;
use crate::plan::Plan;

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
    /// Sweep a setting over values: table.key=v1,v2,… (repeatable; several keys make every
    /// combination), as a `[sweep]` table of those lists would. Refused with a manifest that
    /// has a `[sweep]` table.
    #[arg(long = "sweep", value_name = "KEY=V1,V2,...")]
    pub sweep: Vec<String>,
    /// Show only what `apply --shard` of these shards runs: N or A-B.
    #[arg(long, value_name = "N|A-B")]
    pub shard: Option<crate::plan::ShardRange>,
}

pub fn run(args: &PlanArgs) -> i32 {
    let runs = match args.manifest.load_plans(args.shard, &args.sweep) {
        Ok(runs) => runs,
        Err(code) => return code,
    };
    if runs[0].0.sweep.is_none() {
        let (resolved, plan) = &runs[0];
        return out(&if args.json {
            json_text(&plan_json(args, resolved, plan))
        } else {
            plan_text(args, resolved, plan)
        });
    }
    // A sweep: its points, then each point's plan as that of a manifest of its own.
    if args.json {
        let value = serde_json::json!({
            "sweep": sweep_json(&runs),
            "runs": runs.iter().map(|(r, p)| plan_json(args, r, p)).collect::<Vec<_>>(),
        });
        return out(&json_text(&value));
    }
    let mut text = sweep_text(&runs);
    for (resolved, plan) in &runs {
        text.push('\n');
        text.push_str(&plan_text(args, resolved, plan));
    }
    out(&text)
}

fn json_text(value: &serde_json::Value) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("json");
    text.push('\n');
    text
}

/// One run's plan as JSON, with what its results folder holds and, with `--explain`, its
/// settings.
fn plan_json(args: &PlanArgs, resolved: &Resolved, plan: &Plan) -> serde_json::Value {
    let previous = crate::execute::previous_run(resolved, plan);
    // With `--shard`, the processes and shards that apply would run.
    let mut shown = plan.clone();
    shown.processes.retain(|p| plan.selects(p));
    shown.shards = plan.selected_shards().cloned().collect();
    let mut value = serde_json::to_value(&shown).expect("plans serialise");
    value["results_state"] = serde_json::to_value(&previous).expect("states serialise");
    let names = crate::results::names::VideoNames::of(resolved);
    if !names.renamed.is_empty() {
        value["renamed_videos"] = serde_json::to_value(&names.renamed).expect("names serialise");
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
                        "layer": resolved.layer_of(k),
                        "origin": s.origin.to_string(),
                    }),
                )
            })
            .collect();
        value["settings"] = serde_json::Value::Object(settings);
    }
    value
}

/// One run's plan as text.
fn plan_text(args: &PlanArgs, resolved: &Resolved, plan: &Plan) -> String {
    let previous = crate::execute::previous_run(resolved, plan);
    let mut text = crate::plan::render::text(plan, resolved, &results_state(&previous));
    text.push_str(&videos_and_evaluation(resolved));
    if args.explain {
        text.push('\n');
        text.push_str(&crate::plan::render::explain(resolved));
    }
    text
}

/// The points of a sweep: each run's name and values, in the order `apply` runs them.
fn sweep_text(runs: &[(Resolved, Plan)]) -> String {
    let first = runs[0].0.sweep.as_ref().expect("a sweep");
    let mut t = String::new();
    let _ = writeln!(
        t,
        "sweep `{}` of {}: {} runs ({}), applied one after the other",
        first.base,
        display_path(&runs[0].0.files[0].path),
        runs.len(),
        first.mode_words()
    );
    let width = runs.iter().map(|(_, p)| p.run.len()).max().unwrap_or(0);
    for (i, (resolved, plan)) in runs.iter().enumerate() {
        let values = resolved
            .sweep
            .as_ref()
            .map(|p| p.describe())
            .unwrap_or_default();
        let _ = writeln!(t, "  {:>3}  {:<width$}  {values}", i + 1, plan.run);
        // The checks `apply` makes before it writes (without --reuse-workdir); what the results
        // folder holds is in each run's own plan below.
        if let Err(e) = crate::execute::before_work(resolved, plan, false) {
            let message = e.to_string();
            let _ = writeln!(t, "       {:<width$}  refused: {message}", "");
        }
    }
    t
}

fn sweep_json(runs: &[(Resolved, Plan)]) -> serde_json::Value {
    let first = runs[0].0.sweep.as_ref().expect("a sweep");
    serde_json::json!({
        "base": first.base,
        "mode": first.mode,
        "keys": first.values.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        "points": runs.iter().map(|(r, p)| serde_json::json!({
            "run": p.run,
            "values": r.sweep.as_ref().map(|s| s.values.iter().map(|(k, e)| {
                (k.clone(), serde_json::to_value(&e.value).unwrap_or_default())
            }).collect::<serde_json::Map<_, _>>()),
        })).collect::<Vec<_>>(),
    })
}

/// What the results folder holds, in words, for the plan's `results` line.
fn results_state(previous: &PreviousRun) -> String {
    match previous {
        PreviousRun::New => "new".into(),
        PreviousRun::Resumes {
            done,
            selected,
            evaluates: true,
        } if done == selected => format!(
            "exists: all {selected} prompts done; apply runs only the evaluation, on their videos"
        ),
        PreviousRun::Resumes { done, selected, .. } if done == selected => {
            format!("exists: all {selected} prompts done; apply resumes and generates nothing")
        }
        PreviousRun::Resumes { done, selected, .. } => format!(
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
    let count = r.prompts.as_deref().unwrap_or_default().len() as u32;
    if r.manifest.kind == crate::manifest::Kind::Generation
        && let Some(w) = names.unread_samples(r.manifest.prompts.indices.resolve(count))
    {
        let _ = writeln!(t, "\n{w}");
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

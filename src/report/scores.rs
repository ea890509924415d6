//! A run's evaluation in `runner report` (its outcome and scores) and in `runner compare` (one
//! row per dimension scored in either run, with the delta).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::Serialize;

use super::load::LoadedRun;
use crate::results::records::RunRecord;
use crate::results::scores::{EVAL_DIR, EvaluationStatus, SCORES_JSON};

fn score(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.4}"))
}

/// Writes the report's evaluation section, when the run has an evaluation.
pub fn evaluation_section(t: &mut String, r: &RunRecord) {
    let Some(e) = &r.evaluation else {
        return;
    };
    let when = match (&e.status, &e.ended_at) {
        (EvaluationStatus::NotRun | EvaluationStatus::Running, _) | (_, None) => String::new(),
        (_, Some(at)) => format!(" at {at}"),
    };
    let _ = writeln!(t, "\nevaluation: {}{when}", e.status.as_str());
    let _ = writeln!(t, "  command       {}", e.command.join(" "));
    if let Some(f) = &e.failure {
        let _ = writeln!(t, "  failure       {f}");
    }
    match &e.scores {
        Some(scores) => {
            // A failed or interrupted evaluation leaves the scores of the last one that
            // succeeded.
            let earlier = if e.status == EvaluationStatus::Succeeded {
                ""
            } else {
                ", of the last evaluation that succeeded"
            };
            let _ = writeln!(
                t,
                "  scores ({} dimension{}, {EVAL_DIR}/{SCORES_JSON}{earlier})",
                scores.len(),
                if scores.len() == 1 { "" } else { "s" }
            );
            let width = scores.keys().map(String::len).max().unwrap_or(0).max(9);
            for (dimension, v) in scores {
                let _ = writeln!(t, "    {dimension:<width$}  {}", score(Some(*v)));
            }
        }
        None => {
            let _ = writeln!(t, "  scores        none yet");
        }
    }
}

/// One dimension's score in both runs.
#[derive(Debug, Clone, Serialize)]
pub struct ScoreRow {
    pub dimension: String,
    pub a: Option<f64>,
    pub b: Option<f64>,
    /// b − a.
    pub delta: Option<f64>,
}

/// A row for every dimension either run has a score for, sorted by name.
pub fn score_rows(a: &LoadedRun, b: &LoadedRun) -> Vec<ScoreRow> {
    let scores = |run: &LoadedRun| {
        run.record
            .evaluation
            .as_ref()
            .and_then(|e| e.scores.clone())
            .unwrap_or_default()
    };
    let (sa, sb) = (scores(a), scores(b));
    let dimensions: BTreeSet<&String> = sa.keys().chain(sb.keys()).collect();
    dimensions
        .into_iter()
        .map(|d| {
            let (va, vb) = (sa.get(d).copied(), sb.get(d).copied());
            ScoreRow {
                dimension: d.clone(),
                a: va,
                b: vb,
                delta: va.zip(vb).map(|(x, y)| y - x),
            }
        })
        .collect()
}

/// Why the scores of two runs may not be comparable: one has none, or they were scored with
/// different evaluation commands.
pub fn score_warnings(a: &LoadedRun, b: &LoadedRun) -> Vec<String> {
    let mut w = Vec::new();
    let (ea, eb) = (&a.record.evaluation, &b.record.evaluation);
    if ea.is_none() && eb.is_none() {
        return w;
    }
    for run in [a, b] {
        if run
            .record
            .evaluation
            .as_ref()
            .is_none_or(|e| e.scores.is_none())
        {
            w.push(format!("run `{}` has no evaluation scores", run.name));
        }
    }
    if let (Some(x), Some(y)) = (ea, eb)
        && (x.command != y.command || x.dimensions != y.dimensions)
    {
        w.push(format!(
            "the evaluation differs: `{}` ran `{}`, `{}` ran `{}`",
            a.name,
            x.command.join(" "),
            b.name,
            y.command.join(" ")
        ));
    }
    w
}

/// The comparison's scores section: a row per dimension, delta = b − a.
pub fn scores_text(t: &mut String, rows: &[ScoreRow]) {
    if rows.is_empty() {
        return;
    }
    let width = rows
        .iter()
        .map(|r| r.dimension.len())
        .max()
        .unwrap_or(0)
        .max(9);
    let _ = writeln!(t, "\nevaluation scores, delta = b - a");
    let _ = writeln!(
        t,
        "  {:<width$} {:>10} {:>10} {:>10}",
        "dimension", "a", "b", "delta"
    );
    for r in rows {
        let _ = writeln!(
            t,
            "  {:<width$} {:>10} {:>10} {:>10}",
            r.dimension,
            score(r.a),
            score(r.b),
            r.delta.map_or_else(|| "n/a".into(), |d| format!("{d:+.4}")),
        );
    }
}

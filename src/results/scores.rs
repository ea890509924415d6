//! A run's evaluation: its settings and outcome as `run.json` keeps them ([`EvaluationRecord`]),
//! and the scores file an evaluation command writes ([`parse_scores`]).
//!
//! The scores file is one JSON object of dimension -> score. A score is a number, or VBench's own
//! form `[score, per-video results]`, whose first element is the number. Anything else (not JSON,
//! not an object, an empty object, another value, a dimension asked for and missing) is an error
//! that names what is wrong. What was read is kept as a plain `{"dimension": score}` object in
//! `results/<RUN>/eval/scores.json` and in `run.json`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::manifest::{Kind, Resolved};

/// The run's evaluation folder, and the scores the runner read, inside it.
pub const EVAL_DIR: &str = "eval";
pub use crate::manifest::evaluation::SCORES_JSON;
/// Where an evaluation writes (its `{eval_dir}`) until it has scores: then it replaces
/// [`EVAL_DIR`], so that a failed evaluation leaves the earlier one's output as it was.
pub const EVAL_ATTEMPT_DIR: &str = "eval.attempt";
/// The evaluation command's output, inside `logs/`.
pub const EVALUATION_LOG: &str = "evaluation.log";

/// Where the last evaluation got to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvaluationStatus {
    /// Not run yet (the generation is not complete).
    NotRun,
    /// Started; a record left so by a killed runner reads as interrupted.
    Running,
    Succeeded,
    Failed,
    /// Stopped by Ctrl-C, SIGTERM or SIGHUP; applying again runs it again.
    Interrupted,
}

impl EvaluationStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            EvaluationStatus::NotRun => "not run",
            EvaluationStatus::Running => "running",
            EvaluationStatus::Succeeded => "succeeded",
            EvaluationStatus::Failed => "failed",
            EvaluationStatus::Interrupted => "interrupted",
        }
    }
}

/// `run.json`'s `evaluation`: what `runner evaluate` needs to run it again without the manifest,
/// and how the last evaluation went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvaluationRecord {
    /// `evaluation.command` as set: the program and its arguments, placeholders unfilled.
    pub command: Vec<String>,
    pub dimensions: Vec<String>,
    /// `evaluation.scores_file`, relative to `eval/`.
    pub scores_file: String,
    /// The names file, resolved, for `{names_file}`.
    pub names_file: Option<PathBuf>,
    /// `evaluation.timeout_seconds`: how long the command may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    pub status: EvaluationStatus,
    /// The arguments the last evaluation ran with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    /// Dimension -> score, from the last evaluation that succeeded: one that fails or is
    /// interrupted later leaves them (and `eval/`) as they were.
    pub scores: Option<BTreeMap<String, f64>>,
    /// Why the last evaluation failed.
    pub failure: Option<String>,
}

impl EvaluationRecord {
    /// The evaluation of a generation that sets `[evaluation] command`, not run yet.
    pub fn of(r: &Resolved) -> Option<EvaluationRecord> {
        let e = &r.manifest.evaluation;
        let command = e.command.as_ref()?;
        (r.manifest.kind == Kind::Generation).then(|| EvaluationRecord {
            command: command.argv().to_vec(),
            dimensions: e.dimensions.0.clone(),
            scores_file: e.scores_file.to_string(),
            names_file: r.paths.names_file.clone(),
            timeout_seconds: e.timeout_seconds.map(|t| t.0),
            status: EvaluationStatus::NotRun,
            argv: Vec::new(),
            started_at: None,
            ended_at: None,
            scores: None,
            failure: None,
        })
    }

    /// Whether `other` is the same evaluation (command, dimensions, scores file, names file).
    pub fn same_settings(&self, other: &EvaluationRecord) -> bool {
        (
            &self.command,
            &self.dimensions,
            &self.scores_file,
            &self.names_file,
        ) == (
            &other.command,
            &other.dimensions,
            &other.scores_file,
            &other.names_file,
        )
    }
}

/// Why a scores file's text gives no scores, in the words that follow "the scores file PATH".
#[derive(Debug, thiserror::Error)]
pub enum ScoresError {
    #[error("is not JSON ({0})")]
    NotJson(serde_json::Error),
    /// The text is JSON but not an object: what it is instead.
    #[error("holds {0}, not an object of dimension -> score")]
    NotAnObject(String),
    #[error("holds no scores (an empty object)")]
    Empty,
    #[error("gives `{0}` more than once, so which score is meant is not clear")]
    Repeated(String),
    /// A dimension's value is not a score: what it is instead.
    #[error("gives `{dimension}` {value}, not a number (or VBench's [score, per-video results])")]
    NotAScore { dimension: String, value: String },
    /// Dimensions asked for that the file has no score for.
    #[error("has no score for {} (evaluation.dimensions)", .0.join(", "))]
    Missing(Vec<String>),
}

/// The first key a JSON object repeats: JSON allows it, and serde_json keeps the last value.
struct FirstRepeat(Option<String>);

impl<'de> serde::Deserialize<'de> for FirstRepeat {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Keys;
        impl<'de> serde::de::Visitor<'de> for Keys {
            type Value = FirstRepeat;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<FirstRepeat, A::Error> {
                let mut seen = std::collections::BTreeSet::new();
                let mut first = None;
                while let Some(key) = m.next_key::<String>()? {
                    m.next_value::<serde::de::IgnoredAny>()?;
                    if !seen.insert(key.clone()) && first.is_none() {
                        first = Some(key);
                    }
                }
                Ok(FirstRepeat(first))
            }
        }
        d.deserialize_map(Keys)
    }
}

/// The scores of a scores file's text; every one of `dimensions` must have one.
pub fn parse_scores(
    text: &str,
    dimensions: &[String],
) -> Result<BTreeMap<String, f64>, ScoresError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(ScoresError::NotJson)?;
    let serde_json::Value::Object(map) = value else {
        return Err(ScoresError::NotAnObject(kind_of(&value)));
    };
    if map.is_empty() {
        return Err(ScoresError::Empty);
    }
    if let Ok(FirstRepeat(Some(key))) = serde_json::from_str(text) {
        return Err(ScoresError::Repeated(key));
    }
    let mut scores = BTreeMap::new();
    for (dimension, v) in &map {
        let score = match v {
            serde_json::Value::Number(n) => n.as_f64(),
            serde_json::Value::Array(a) => a.first().and_then(serde_json::Value::as_f64),
            _ => None,
        };
        let Some(score) = score.filter(|s| s.is_finite()) else {
            return Err(ScoresError::NotAScore {
                dimension: dimension.clone(),
                value: kind_of(v),
            });
        };
        scores.insert(dimension.clone(), score);
    }
    let missing: Vec<String> = dimensions
        .iter()
        .filter(|d| !scores.contains_key(*d))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(ScoresError::Missing(missing));
    }
    Ok(scores)
}

fn kind_of(v: &serde_json::Value) -> String {
    let text = v.to_string();
    let short: String = text.chars().take(40).collect();
    let what = match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    };
    if text.chars().count() > 40 {
        format!("{what} ({short}…)")
    } else {
        format!("{what} ({short})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_dimension_given_twice_is_refused_not_read_as_its_last_value() {
        let text = r#"{"color": 0.5, "subject_consistency": 0.9, "color": [0.7, []]}"#;
        let e = parse_scores(text, &dims(&["color"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`color` more than once"), "{e}");
        let once = r#"{"color": 0.5, "subject_consistency": 0.9}"#;
        assert_eq!(parse_scores(once, &dims(&["color"])).unwrap()["color"], 0.5);
    }

    #[test]
    fn scores_are_numbers_or_vbench_pairs() {
        let s = parse_scores(
            r#"{"color": 0.8, "scene": [0.25, [{"video_path": "x"}]]}"#,
            &[],
        )
        .unwrap();
        assert_eq!(s["color"], 0.8);
        assert_eq!(s["scene"], 0.25);
        assert!(parse_scores(r#"{"color": 1}"#, &dims(&["color"])).is_ok());
    }

    #[test]
    fn anything_else_is_a_clear_error() {
        for (text, want) in [
            ("garbage", "is not JSON"),
            ("", "is not JSON"),
            ("[1, 2]", "holds a list"),
            ("{}", "holds no scores"),
            (r#"{"color": "high"}"#, "gives `color` a string"),
            (r#"{"color": null}"#, "gives `color` null"),
            (r#"{"color": ["x"]}"#, "gives `color` a list"),
            (r#"{"color": NaN}"#, "is not JSON"),
        ] {
            let e = parse_scores(text, &[]).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        let e = parse_scores(r#"{"color": 0.5}"#, &dims(&["color", "scene"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no score for scene"), "{e}");
    }
}

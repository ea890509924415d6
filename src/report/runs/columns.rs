//! The columns `runner runs` shows after each run's name, kind, status and prompts: settings
//! (`method.clean_sigma`), statistics of the timed total (`warm_mean`), scores (`vbench.total`,
//! `vbench.<dimension>`) and the record's `weights`, `started` and `ended`; and the selection
//! of runs (`--name`, `--kind`) and their order (`--sort`).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::RunRow;
use crate::results::records::SettingRecord;
use crate::results::stats::Statistics;

/// The statistics of the timed total a column can show, by column name.
pub const STATISTICS: [&str; 4] = [
    "warm_mean",
    "raw_mean",
    "min_after_first",
    "steady_tail_mean",
];
/// The record's own values a column can show.
pub const RECORD_COLUMNS: [&str; 3] = ["weights", "started", "ended"];
/// The columns every table has, before the chosen ones; `--sort` takes them too.
pub const FIXED_COLUMNS: [&str; 4] = ["run", "kind", "status", "prompts"];
/// The score column prefix; `vbench.total` is the mean of a run's scored dimensions.
pub const SCORE_PREFIX: &str = "vbench.";
pub const SCORE_TOTAL: &str = "vbench.total";

/// What `runner runs` reads of a run beyond its row: its settings, statistics and scores.
#[derive(Debug, Clone, Default)]
pub struct RunValues {
    pub settings: BTreeMap<String, SettingRecord>,
    pub timed_total: Option<Statistics>,
    /// The dimensions its `[evaluation]` scores, scored or not.
    pub dimensions: Vec<String>,
    pub scores: BTreeMap<String, f64>,
}

/// A column that is not one of `available`.
#[derive(Debug, Clone, PartialEq)]
pub struct UnknownColumn {
    pub column: String,
    pub available: Vec<String>,
}

/// Every column the runs can show: statistics, scores, the record's values, then every setting
/// any run records, by name.
pub fn available(rows: &[RunRow]) -> Vec<String> {
    let mut columns: Vec<String> = STATISTICS.iter().map(|s| s.to_string()).collect();
    columns.push(SCORE_TOTAL.into());
    let dimensions: BTreeSet<&String> = rows
        .iter()
        .flat_map(|r| r.values.dimensions.iter().chain(r.values.scores.keys()))
        .collect();
    columns.extend(dimensions.iter().map(|d| format!("{SCORE_PREFIX}{d}")));
    columns.extend(RECORD_COLUMNS.iter().map(|s| s.to_string()));
    let settings: BTreeSet<&String> = rows.iter().flat_map(|r| r.values.settings.keys()).collect();
    columns.extend(settings.into_iter().cloned());
    columns
}

/// Checks each of `wanted` is a column of `available` (or, with `fixed`, one of the columns
/// every table has).
pub fn check(wanted: &[String], available: &[String], fixed: bool) -> Result<(), UnknownColumn> {
    match wanted
        .iter()
        .find(|c| !(available.contains(c) || fixed && FIXED_COLUMNS.contains(&c.as_str())))
    {
        Some(c) => Err(UnknownColumn {
            column: c.clone(),
            available: available.to_vec(),
        }),
        None => Ok(()),
    }
}

/// The default columns of `rows`: the settings whose values differ among them, the weights'
/// source when any run's weights are not the released ones, the warm mean, and the VBench
/// total when any of them has scores. The run's name differs in every run and
/// is its own column; a setting left at a default that carries the run's name (a path
/// `results/<run>/...`) differs only in that name and is left out.
pub fn default_columns(rows: &[RunRow]) -> Vec<String> {
    let keys: BTreeSet<&String> = rows.iter().flat_map(|r| r.values.settings.keys()).collect();
    let mut columns: Vec<String> = keys
        .into_iter()
        .filter(|k| k.as_str() != "name")
        .filter(|k| {
            let values: BTreeSet<String> = rows
                .iter()
                .filter(|r| r.kind.is_some())
                .map(|r| {
                    unnamed(
                        r.values.settings.get(*k),
                        r.copy_of.as_ref().unwrap_or(&r.run),
                    )
                })
                .collect();
            values.len() > 1
        })
        .cloned()
        .collect();
    // Numbers of random weights are not those of the model: the table says so.
    if rows
        .iter()
        .any(|r| r.weights.as_deref().is_some_and(|w| w != "released"))
    {
        columns.push("weights".into());
    }
    columns.push("warm_mean".into());
    if rows.iter().any(|r| !r.values.scores.is_empty()) {
        columns.push(SCORE_TOTAL.into());
    }
    columns
}

/// A setting's value as compared across runs: a default's path segments equal to the run's
/// name stand for the name, as `runner diff` leaves such defaults out.
fn unnamed(s: Option<&SettingRecord>, run: &str) -> String {
    match s {
        None => "\0absent".into(),
        Some(s) => match &s.value {
            Value::String(text) if s.layer == "default" => text
                .split('/')
                .map(|part| if part == run { "\0" } else { part })
                .collect::<Vec<_>>()
                .join("/"),
            v => v.to_string(),
        },
    }
}

/// The value of `column` in `row`: JSON `null` where the run has none.
pub fn value(row: &RunRow, column: &str) -> Value {
    let v = &row.values;
    let number = |x: Option<f64>| x.map_or(Value::Null, Value::from);
    let text = |x: Option<&String>| x.map_or(Value::Null, |s| Value::String(s.clone()));
    match column {
        "run" => Value::String(row.run.clone()),
        "kind" => text(row.kind.as_ref()),
        "status" => Value::String(row.status.clone()),
        "prompts" => row.prompts_done.map_or(Value::Null, Value::from),
        "weights" => text(row.weights.as_ref()),
        "started" => text(row.started_at.as_ref()),
        "ended" => text(row.ended_at.as_ref()),
        "warm_mean" => number(v.timed_total.and_then(|s| s.warm_mean_excluding_first)),
        "raw_mean" => number(v.timed_total.and_then(|s| s.raw_mean)),
        "min_after_first" => number(v.timed_total.and_then(|s| s.min_after_first)),
        "steady_tail_mean" => number(v.timed_total.and_then(|s| s.steady_tail_mean)),
        SCORE_TOTAL => number(
            (!v.scores.is_empty()).then(|| v.scores.values().sum::<f64>() / v.scores.len() as f64),
        ),
        c => match c.strip_prefix(SCORE_PREFIX) {
            Some(d) if !v.settings.contains_key(c) => number(v.scores.get(d).copied()),
            _ => v.settings.get(c).map_or(Value::Null, |s| s.value.clone()),
        },
    }
}

/// `value` as the table shows it: seconds to 3 decimals, scores to 4, strings unquoted, `n/a`
/// for a statistic or score the run has none of, `-` for anything else it lacks.
fn shown(row: &RunRow, column: &str) -> String {
    let is_score = column.starts_with(SCORE_PREFIX) && !row.values.settings.contains_key(column);
    let measured = STATISTICS.contains(&column) || is_score;
    match value(row, column) {
        Value::Null if measured => "n/a".into(),
        Value::Null => "-".into(),
        Value::Number(n) if STATISTICS.contains(&column) => {
            format!("{:.3}", n.as_f64().unwrap_or(0.0))
        }
        Value::Number(n) if is_score => format!("{:.4}", n.as_f64().unwrap_or(0.0)),
        Value::String(s) => s,
        v => v.to_string(),
    }
}

/// Keeps the rows whose name matches `name` (a glob with `*` and `?` when it has either, else
/// a substring) and whose kind is `kind`.
pub fn filter(rows: &mut Vec<RunRow>, name: Option<&str>, kind: Option<&str>) {
    rows.retain(|r| {
        name.is_none_or(|p| matches_name(p, &r.run))
            && kind.is_none_or(|k| r.kind.as_deref() == Some(k))
    });
}

/// Whether `name` matches `pattern`: a glob (`*` any run of characters, `?` one) when the
/// pattern has either, else a substring of the name.
pub fn matches_name(pattern: &str, name: &str) -> bool {
    if !pattern.contains(['*', '?']) {
        return name.contains(pattern);
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // matched[j]: whether the pattern so far matches the first j characters of the name.
    let mut matched = vec![false; n.len() + 1];
    matched[0] = true;
    for c in p {
        let mut next = vec![false; n.len() + 1];
        for j in 0..=n.len() {
            next[j] = match c {
                '*' => matched[j] || j > 0 && next[j - 1],
                '?' => j > 0 && matched[j - 1],
                c => j > 0 && matched[j - 1] && n[j - 1] == c,
            };
        }
        matched = next;
    }
    matched[n.len()]
}

/// Sorts the rows by `column`, ascending or descending; runs without a value come last either
/// way, and runs with equal values keep their order (oldest start first).
pub fn sort(rows: &mut [RunRow], column: &str, descending: bool) {
    rows.sort_by(|a, b| {
        let (x, y) = (value(a, column), value(b, column));
        match (x.is_null(), y.is_null()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => {
                let order = compare(&x, &y);
                if descending { order.reverse() } else { order }
            }
        }
    });
}

/// Numbers by value, anything else by its text.
fn compare(x: &Value, y: &Value) -> Ordering {
    match (x.as_f64(), y.as_f64()) {
        (Some(a), Some(b)) => a.total_cmp(&b),
        _ => {
            let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
            text(x).cmp(&text(y))
        }
    }
}

/// One run in `runner runs --json`: its row and the values of the chosen columns.
#[derive(Debug, Serialize)]
pub struct RunColumns<'a> {
    #[serde(flatten)]
    pub row: &'a RunRow,
    pub columns: BTreeMap<String, Value>,
}

pub fn json_rows<'a>(rows: &'a [RunRow], columns: &[String]) -> Vec<RunColumns<'a>> {
    rows.iter()
        .map(|row| RunColumns {
            row,
            columns: columns.iter().map(|c| (c.clone(), value(row, c))).collect(),
        })
        .collect()
}

/// The rows as a table: run, kind, status, prompts done of planned, then `columns`; a copy's
/// name is marked `*` and explained below, as is a record that cannot be read.
pub fn table(rows: &[RunRow], columns: &[String]) -> String {
    let mut header: Vec<String> = FIXED_COLUMNS.iter().map(|s| s.to_string()).collect();
    header.extend(columns.iter().cloned());
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let name = if r.copy_of.is_some() {
                format!("{}*", r.run)
            } else {
                r.run.clone()
            };
            let prompts = match (r.prompts_done, r.prompts_planned) {
                (Some(d), Some(p)) => format!("{d}/{p}"),
                _ => "-".into(),
            };
            let mut line = vec![
                name,
                r.kind.clone().unwrap_or_else(|| "-".into()),
                r.status.clone(),
                prompts,
            ];
            line.extend(columns.iter().map(|c| shown(r, c)));
            line
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            cells
                .iter()
                .map(|l| l[i].chars().count())
                .chain([header[i].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut t = String::new();
    for line in std::iter::once(&header).chain(&cells) {
        let mut text = String::from(" ");
        for (i, cell) in line.iter().enumerate() {
            let _ = write!(text, " {cell:<width$}", width = widths[i]);
        }
        let _ = writeln!(t, "{}", text.trim_end());
    }
    super::notes(&mut t, rows);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_and_substring() {
        assert!(matches_name("sig", "sweep-sigma-1"));
        assert!(!matches_name("sig", "probe"));
        assert!(matches_name("sigma*", "sigma-0.01"));
        assert!(!matches_name("sigma*", "x-sigma-0.01"));
        assert!(matches_name("*-0.0?", "sigma-0.01"));
        assert!(!matches_name("*-0.0?", "sigma-0.015"));
        assert!(matches_name("a*b*c", "a-x-b-y-c"));
        assert!(!matches_name("a*b*c", "a-x-c-y-b"));
    }

    fn row(run: &str, warm: Option<f64>, sigma: Option<f64>) -> RunRow {
        let mut r = RunRow::without_record(run, std::path::Path::new(run), "succeeded");
        r.kind = Some("probe".into());
        r.values.timed_total = Some(Statistics::of(&[]));
        if let Some(t) = &mut r.values.timed_total {
            t.warm_mean_excluding_first = warm;
        }
        if let Some(s) = sigma {
            r.values.settings.insert(
                "method.clean_sigma".into(),
                SettingRecord {
                    value: s.into(),
                    layer: "sweep".into(),
                    origin: "x".into(),
                },
            );
        }
        r
    }

    #[test]
    fn sort_puts_runs_without_a_value_last_both_ways() {
        let mut rows = vec![
            row("a", Some(2.0), None),
            row("b", None, None),
            row("c", Some(1.0), None),
        ];
        sort(&mut rows, "warm_mean", false);
        let names = |rows: &[RunRow]| rows.iter().map(|r| r.run.clone()).collect::<Vec<_>>();
        assert_eq!(names(&rows), ["c", "a", "b"]);
        sort(&mut rows, "warm_mean", true);
        assert_eq!(names(&rows), ["a", "c", "b"]);
    }

    #[test]
    fn defaults_are_the_differing_settings_and_the_warm_mean() {
        let rows = vec![row("a", None, Some(0.01)), row("b", None, Some(0.02))];
        assert_eq!(default_columns(&rows), ["method.clean_sigma", "warm_mean"]);
        let same = vec![row("a", None, Some(0.01)), row("b", None, Some(0.01))];
        assert_eq!(default_columns(&same), ["warm_mean"]);
        let mut random = same.clone();
        random[0].weights = Some("released".into());
        assert_eq!(default_columns(&random), ["warm_mean"]);
        random[1].weights = Some("random".into());
        assert_eq!(default_columns(&random), ["weights", "warm_mean"]);
        let mut scored = same.clone();
        scored[1]
            .values
            .scores
            .insert("subject_consistency".into(), 0.5);
        scored[1]
            .values
            .scores
            .insert("motion_smoothness".into(), 0.7);
        assert_eq!(default_columns(&scored), ["warm_mean", "vbench.total"]);
        assert_eq!(value(&scored[1], "vbench.total").as_f64(), Some(0.6));
        assert!(value(&scored[0], "vbench.total").is_null());
        let available = available(&scored);
        assert!(check(&["vbench.motion_smoothness".into()], &available, false).is_ok());
        let err = check(&["vbench.nope".into()], &available, false).unwrap_err();
        assert_eq!(err.column, "vbench.nope");
        assert!(check(&["run".into()], &available, true).is_ok());
        assert!(check(&["run".into()], &available, false).is_err());
    }
}

//! The runs of a results folder as a table (`runner runs`), and the settings two runs differ
//! in (`runner diff`), both read from the runs' records.

pub mod columns;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::load::{LoadedRun, ReportError, load_run};
use crate::results::records::{ProcessRole, RunStatus, SettingRecord};
use crate::results::{RUN_JSON, RunRecord};
use columns::RunValues;

/// One run of a results folder, as `runner runs` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    pub run: String,
    /// `probe` or `generation`; absent when the record cannot be read.
    pub kind: Option<String>,
    /// `running`, `succeeded`, `failed`, `interrupted` (as `runner report` tells them),
    /// `incomplete` (a generation recorded as succeeded some of whose prompts are not complete
    /// now), or `unreadable` when `run.json` cannot be read.
    pub status: String,
    /// Prompts measured (a probe) or generated (a generation) so far.
    pub prompts_done: Option<usize>,
    /// Prompts the run's plan measures or generates.
    pub prompts_planned: Option<usize>,
    /// The mean timed total over the measured prompts but the first, in seconds.
    pub warm_mean_s: Option<f64>,
    /// Where the bundle's weights came from: `released`, `random` or `mixed (...)`.
    pub weights: Option<String>,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    pub dir: PathBuf,
    /// Why the record cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The run its record names, when that is not the folder's name: the folder is a copy of a
    /// run (or a run moved under another name), whose record still names the original's
    /// folders.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy_of: Option<String>,
    /// Its settings, statistics and scores, for the columns `runner runs` can show.
    #[serde(skip)]
    pub values: RunValues,
}

impl RunRow {
    pub fn of(run: &LoadedRun) -> RunRow {
        let r = &run.record;
        let role = match r.kind {
            crate::manifest::Kind::Probe => ProcessRole::Measurement,
            crate::manifest::Kind::Generation => ProcessRole::Shard,
        };
        let planned = r
            .processes
            .iter()
            .filter(|p| p.role == role)
            .map(|p| p.prompts)
            .sum();
        // A generation's prompts are done when complete (`results::completeness`), as
        // `runner status` and `runner plan` count them; a probe's when measured.
        let (done, planned) = match r.kind {
            crate::manifest::Kind::Generation => {
                crate::results::completeness::record_counts(&run.dir, r)
            }
            crate::manifest::Kind::Probe => (run.summary.count, planned),
        };
        let status = match r.status {
            RunStatus::Succeeded | RunStatus::EvaluationFailed if done < planned => {
                "incomplete".to_string()
            }
            s => s.as_str().to_string(),
        };
        RunRow {
            run: run.name.clone(),
            kind: Some(r.kind.as_str().to_string()),
            status,
            prompts_done: Some(done),
            prompts_planned: Some(planned),
            warm_mean_s: run.summary.timed_total.warm_mean_excluding_first,
            weights: r.weights.as_ref().map(super::words::weights_of),
            started_at: Some(r.started_at.clone()),
            ended_at: r.ended_at.clone(),
            dir: run.dir.clone(),
            error: None,
            copy_of: None,
            values: RunValues {
                settings: r.settings.clone(),
                timed_total: Some(run.summary.timed_total),
                dimensions: r
                    .evaluation
                    .as_ref()
                    .map(|e| e.dimensions.clone())
                    .unwrap_or_default(),
                scores: r
                    .evaluation
                    .as_ref()
                    .and_then(|e| e.scores.clone())
                    .unwrap_or_default(),
            },
        }
    }

    /// A run that was named but has no row of its own: `status` says why.
    pub fn without_record(run: &str, dir: &Path, status: &str) -> RunRow {
        RunRow {
            run: run.to_string(),
            kind: None,
            status: status.to_string(),
            prompts_done: None,
            prompts_planned: None,
            warm_mean_s: None,
            weights: None,
            started_at: None,
            ended_at: None,
            dir: dir.to_path_buf(),
            error: None,
            copy_of: None,
            values: RunValues::default(),
        }
    }
}

/// The runs under `results`: every folder holding a `run.json`, each under the folder's name,
/// oldest start first (runs whose record cannot be read last, by name). A folder whose record
/// names another run (a copy) is marked with the run it names.
pub fn list_runs(results: &Path) -> std::io::Result<Vec<RunRow>> {
    let mut rows = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(results)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.join(RUN_JSON).exists())
        .collect();
    dirs.sort();
    for dir in dirs {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        rows.push(match load_run(&dir) {
            Ok(run) => {
                let mut row = RunRow::of(&run);
                if row.run != name {
                    row.copy_of = Some(std::mem::replace(&mut row.run, name));
                }
                row
            }
            Err(e) => RunRow {
                error: Some(e.to_string()),
                ..RunRow::without_record(&name, &dir, "unreadable")
            },
        });
    }
    rows.sort_by(|a, b| {
        (a.started_at.is_none(), &a.started_at, &a.run).cmp(&(
            b.started_at.is_none(),
            &b.started_at,
            &b.run,
        ))
    });
    Ok(rows)
}

/// The rows as a table: run, kind, status, prompts done of planned, warm mean, the weights'
/// source, start; a copy's name is marked `*` and explained below.
pub fn runs_table(rows: &[RunRow]) -> String {
    let shown = |r: &RunRow| {
        if r.copy_of.is_some() {
            format!("{}*", r.run)
        } else {
            r.run.clone()
        }
    };
    let width = rows
        .iter()
        .map(|r| shown(r).len())
        .max()
        .unwrap_or(0)
        .max(3);
    let weights_width = rows
        .iter()
        .map(|r| r.weights.as_deref().unwrap_or("-").len())
        .max()
        .unwrap_or(0)
        .max(7);
    let mut t = String::new();
    let _ = writeln!(
        t,
        "  {:<width$}  {:<10}  {:<11}  {:>9}  {:>13}  {:<weights_width$}  started",
        "run", "kind", "status", "prompts", "warm mean (s)", "weights"
    );
    for r in rows {
        let prompts = match (r.prompts_done, r.prompts_planned) {
            (Some(d), Some(p)) => format!("{d}/{p}"),
            _ => "-".into(),
        };
        let _ = writeln!(
            t,
            "  {:<width$}  {:<10}  {:<11}  {:>9}  {:>13}  {:<weights_width$}  {}",
            shown(r),
            r.kind.as_deref().unwrap_or("-"),
            r.status,
            prompts,
            r.warm_mean_s
                .map_or_else(|| "n/a".into(), |v| format!("{v:.3}")),
            r.weights.as_deref().unwrap_or("-"),
            r.started_at.as_deref().unwrap_or("-"),
        );
    }
    notes(&mut t, rows);
    t
}

/// The notes below a table of runs: why a record cannot be read, whose record a copy holds.
pub(super) fn notes(t: &mut String, rows: &[RunRow]) {
    for r in rows {
        if let Some(e) = &r.error {
            let _ = writeln!(t, "note: `{}`: {e}", r.run);
        }
        if let Some(original) = &r.copy_of {
            let _ = writeln!(
                t,
                "note: `{}`*: its record is of run `{original}` (a copy, or a run folder moved \
                 under another name); its staging and runtime state are `{original}`'s",
                r.run
            );
        }
    }
}

/// One setting as two runs have it; `None` where a run's record lacks it.
#[derive(Debug, Clone, Serialize)]
pub struct SettingDiff {
    pub key: String,
    pub a: Option<SettingRecord>,
    pub b: Option<SettingRecord>,
}

/// The JSON form of `runner diff`: the settings whose values differ between two runs' records,
/// each with its value, layer and origin in both.
#[derive(Debug, Clone, Serialize)]
pub struct SettingsDiff {
    pub a: String,
    pub b: String,
    /// Whether both runs have the same configuration hash (the settings that decide their
    /// outputs are equal, and so were their bundles' files).
    pub same_config_hash: bool,
    pub differences: Vec<SettingDiff>,
    /// Settings left at defaults that carry the run name (`cache.run_state_root`), which
    /// differ only in that name: left out of `differences`.
    pub name_defaults: Vec<String>,
}

impl SettingsDiff {
    pub fn of(a: &LoadedRun, b: &LoadedRun) -> SettingsDiff {
        let (name_defaults, differences): (Vec<SettingDiff>, Vec<SettingDiff>) =
            differences(&a.record, &b.record)
                .into_iter()
                .partition(|d| only_the_name(d, &a.record.run, &b.record.run));
        SettingsDiff {
            a: a.name.clone(),
            b: b.name.clone(),
            same_config_hash: a.record.config_hash == b.record.config_hash,
            differences,
            name_defaults: name_defaults.into_iter().map(|d| d.key).collect(),
        }
    }

    pub fn text(&self) -> String {
        let mut t = String::new();
        self.differences_text(&mut t);
        if !self.name_defaults.is_empty() {
            let _ = writeln!(
                t,
                "left out: {}, at defaults that differ only in the run name",
                self.name_defaults.join(", ")
            );
        }
        t
    }

    fn differences_text(&self, t: &mut String) {
        if self.differences.is_empty() {
            let _ = writeln!(
                t,
                "`{}` (a) and `{}` (b) have the same value of every setting",
                self.a, self.b
            );
            return;
        }
        let n = self.differences.len();
        let _ = writeln!(
            t,
            "`{}` (a) and `{}` (b) differ in {n} setting{}: value, then the layer that set it",
            self.a,
            self.b,
            if n == 1 { "" } else { "s" }
        );
        let value = |s: &Option<SettingRecord>| {
            s.as_ref()
                .map_or_else(|| "(not recorded)".to_string(), |s| s.value.to_string())
        };
        let width = self
            .differences
            .iter()
            .flat_map(|d| [value(&d.a).len(), value(&d.b).len()])
            .max()
            .unwrap_or(0);
        for d in &self.differences {
            let _ = writeln!(t, "  {}", d.key);
            for (side, s) in [("a", &d.a), ("b", &d.b)] {
                let layer = s.as_ref().map_or_else(String::new, |s| {
                    if s.layer == s.origin {
                        s.layer.clone()
                    } else {
                        format!("{} ({})", s.layer, s.origin)
                    }
                });
                let _ = writeln!(t, "    {side}  {:<width$}  {layer}", value(s));
            }
        }
    }
}

/// Whether both runs leave the setting at its default and the defaults differ only in the
/// run name that they carry as a part of a path (`results/<run>/runtime_state`).
fn only_the_name(d: &SettingDiff, a: &str, b: &str) -> bool {
    let (Some(x), Some(y)) = (&d.a, &d.b) else {
        return false;
    };
    let default = |s: &SettingRecord| s.layer == "default";
    let unnamed = |text: &str, name: &str| {
        text.split('/')
            .map(|part| if part == name { "\0" } else { part })
            .collect::<Vec<_>>()
            .join("/")
    };
    match (&x.value, &y.value) {
        (serde_json::Value::String(u), serde_json::Value::String(v)) => {
            default(x) && default(y) && u != v && unnamed(u, a) == unnamed(v, b)
        }
        _ => false,
    }
}

/// The settings of two records whose values differ, by key.
fn differences(a: &RunRecord, b: &RunRecord) -> Vec<SettingDiff> {
    let keys: BTreeSet<&String> = a.settings.keys().chain(b.settings.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let (x, y) = (a.settings.get(k), b.settings.get(k));
            (x.map(|s| &s.value) != y.map(|s| &s.value)).then(|| SettingDiff {
                key: k.clone(),
                a: x.cloned(),
                b: y.cloned(),
            })
        })
        .collect()
}

/// Reads the run `run` (a name under `results`, or a run directory).
pub fn load_named(run: &str, results: &Path) -> Result<LoadedRun, ReportError> {
    load_run(&super::load::locate(run, results)?)
}

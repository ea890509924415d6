//! `runner compare` of three or more runs: one table with a column per run, each value with
//! its ratio to the first run's. (Two runs get [`super::Comparison`]: values, delta, ratio.)

use std::fmt::Write as _;

use serde::Serialize;

use super::load::LoadedRun;
use super::render::{seconds, series};
use super::warnings::comparison_warnings;

/// One statistic of every run.
#[derive(Debug, Clone, Serialize)]
pub struct ManyRow {
    pub series: &'static str,
    pub statistic: &'static str,
    /// Seconds, one per run, in the order the runs were given.
    pub values: Vec<Option<f64>>,
    /// Each value over the first run's (the first is 1 where it has a value).
    pub ratios: Vec<Option<f64>>,
}

/// The JSON form of `runner compare` of three or more runs.
#[derive(Debug, Clone, Serialize)]
pub struct ManyComparison {
    /// The runs, the reference first.
    pub runs: Vec<String>,
    pub rows: Vec<ManyRow>,
    /// Each later run's outputs against the first's on the same noise, for those that kept
    /// latents or frames like it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quality: Vec<super::quality::Quality>,
    /// Reasons the numbers may not be comparable.
    pub warnings: Vec<String>,
}

impl ManyComparison {
    pub fn of(runs: &[LoadedRun]) -> ManyComparison {
        let mut rows = Vec::new();
        let all: Vec<_> = runs.iter().map(|r| series(&r.summary)).collect();
        for (i, (series_name, first)) in all[0].iter().enumerate() {
            for (j, (statistic, _)) in first.named().into_iter().enumerate() {
                let values: Vec<Option<f64>> = all.iter().map(|s| s[i].1.named()[j].1).collect();
                let reference = values[0];
                let ratios = values
                    .iter()
                    .map(|v| {
                        v.zip(reference)
                            .and_then(|(v, r)| (r != 0.0).then(|| v / r))
                    })
                    .collect();
                rows.push(ManyRow {
                    series: series_name,
                    statistic,
                    values,
                    ratios,
                });
            }
        }
        let mut warnings: Vec<String> = Vec::new();
        let mut quality = Vec::new();
        for other in &runs[1..] {
            let (q, quality_warnings) = super::quality::quality(&runs[0], other);
            quality.extend(q);
            for w in comparison_warnings(&runs[0], other)
                .into_iter()
                .chain(quality_warnings)
            {
                if !warnings.contains(&w) {
                    warnings.push(w);
                }
            }
        }
        ManyComparison {
            runs: runs.iter().map(|r| r.name.clone()).collect(),
            rows,
            quality,
            warnings,
        }
    }

    pub fn text(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "compare {} runs: seconds, and in brackets the ratio to run 1",
            self.runs.len()
        );
        for (i, run) in self.runs.iter().enumerate() {
            let _ = writeln!(t, "  {:>2}  {run}", i + 1);
        }
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                r.values
                    .iter()
                    .zip(&r.ratios)
                    .enumerate()
                    .map(|(i, (v, ratio))| match (i, ratio) {
                        (0, _) | (_, None) => seconds(*v),
                        (_, Some(x)) => format!("{} ({x:.3})", seconds(*v)),
                    })
                    .collect()
            })
            .collect();
        let width = cells
            .iter()
            .flatten()
            .map(String::len)
            .max()
            .unwrap_or(0)
            .max(4);
        let header: String = (1..=self.runs.len())
            .map(|i| format!("  {:>width$}", i))
            .collect();
        let _ = writeln!(t, "\n  {:<12} {:<26}{header}", "series", "statistic");
        for (r, row) in self.rows.iter().zip(&cells) {
            let values: String = row.iter().map(|c| format!("  {c:>width$}")).collect();
            let _ = writeln!(t, "  {:<12} {:<26}{values}", r.series, r.statistic);
        }
        super::quality::quality_text(&mut t, &self.quality);
        t
    }
}

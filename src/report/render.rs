//! `runner report` and `runner compare` as text and JSON: the provenance of a run, its
//! statistics table, phase split and peak memory, and the comparison of two runs.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::load::LoadedRun;
use super::warnings::comparison_warnings;
use super::words::{name_of, opt, weights_of};
use crate::manifest::Kind;
use crate::manifest::diagnostic::display_path;
use crate::results::{
    CacheLabel, ProcessRecord, ProcessRole, ProcessSkip, RunRecord, RunStatus, Statistics, Summary,
    TimingRecord, measured,
};

/// The three series every summary has, with the names reports show.
pub(super) fn series(s: &Summary) -> [(&'static str, &Statistics); 3] {
    [
        ("timed total", &s.timed_total),
        ("DiT", &s.dit),
        ("VAE", &s.vae),
    ]
}

pub(super) fn seconds(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.3}"))
}

/// Mean share of each phase in the timed total, over the measured prompts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PhaseSplit {
    pub dit: Option<f64>,
    pub vae: Option<f64>,
    pub layout: Option<f64>,
    /// What the phases do not account for (synchronisation, latent de-normalisation).
    pub other: Option<f64>,
}

impl PhaseSplit {
    /// Averages per-prompt shares, so each prompt weighs the same whatever its length.
    pub fn of(records: &[&TimingRecord]) -> PhaseSplit {
        let timed: Vec<&&TimingRecord> = records.iter().filter(|r| r.timed_total_s > 0.0).collect();
        let share = |f: &dyn Fn(&TimingRecord) -> f64| {
            (!timed.is_empty()).then(|| {
                timed.iter().map(|r| f(r) / r.timed_total_s).sum::<f64>() / timed.len() as f64
            })
        };
        PhaseSplit {
            dit: share(&|r| r.dit_s),
            vae: share(&|r| r.vae_s),
            layout: share(&|r| r.layout_s),
            other: share(&|r| r.timed_total_s - r.dit_s - r.vae_s - r.layout_s),
        }
    }
}

/// What a report says about where the numbers came from.
#[derive(Debug, Clone, Serialize)]
pub struct Provenance {
    pub provider: String,
    pub execution_provider: Option<String>,
    pub attention_requested: String,
    pub attention_resolved: Option<String>,
    pub dit_kernels: Option<String>,
    pub vae_kernels: Option<String>,
    /// Whether the DiT's passes ran as CUDA graphs (`runtime.cuda_graphs`).
    pub cuda_graphs: bool,
    /// "path (preset, exporter X)" of the bundle the workers ran.
    pub bundle: Option<String>,
    /// Where the bundle's weights came from: `released`, `random` or `mixed` (with each part's
    /// source when mixed); absent in records of earlier runners.
    pub weights: Option<String>,
    pub precision: String,
    /// What a reduced precision computes below its float type (fp8: the DiT's matrix multiplies
    /// in float8); absent for full precision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision_note: Option<&'static str>,
    pub gpu_model: Option<String>,
    pub gpu_memory_bytes: Option<u64>,
    pub driver_version: Option<String>,
    pub onnxruntime: Option<String>,
    pub cuda: Option<String>,
    pub cudnn: Option<String>,
    pub cache: CacheLabel,
    pub status: RunStatus,
    pub failure: Option<String>,
    pub manifest: Option<String>,
    pub method_overrides: BTreeMap<String, serde_json::Value>,
    pub host: Option<String>,
    pub started_at: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resumed_at: Vec<String>,
    pub ended_at: Option<String>,
    pub git_commit: Option<String>,
    pub git_dirty: Option<bool>,
    pub config_hash: String,
    /// The diagnostic switches the workers ran with (`UNSTEP_ORT_PROFILE=DIR`, ...): times
    /// measured with them on are not the product's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub diagnostics: Vec<String>,
    /// The last apply's staging (absent in records of earlier runners).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staging: Option<crate::results::records::StagingRecord>,
}

impl Provenance {
    pub fn of(r: &RunRecord) -> Provenance {
        Provenance {
            provider: name_of(&r.provider),
            execution_provider: r.execution_provider.clone(),
            attention_requested: name_of(&r.attention_backend.requested),
            attention_resolved: r.attention_backend.resolved.clone(),
            dit_kernels: r.dit_kernels.clone(),
            vae_kernels: r.vae_kernels.clone(),
            cuda_graphs: r
                .settings
                .get("runtime.cuda_graphs")
                .is_some_and(|s| s.value == serde_json::Value::Bool(true)),
            bundle: r
                .bundle
                .as_ref()
                .map(|b| format!("{} ({}, exporter {})", b.path, b.preset, b.exporter_version)),
            weights: r.weights.as_ref().map(weights_of),
            precision: name_of(&r.precision),
            precision_note: r.precision.reduced(),
            gpu_model: r.device.gpu_model.clone(),
            gpu_memory_bytes: r.device.gpu_memory_bytes,
            driver_version: r.device.driver_version.clone(),
            onnxruntime: r.versions.onnxruntime.clone(),
            cuda: r.versions.cuda.clone(),
            cudnn: r.versions.cudnn.clone(),
            cache: r.cache.label,
            status: r.status,
            failure: r.failure.clone(),
            manifest: r.manifests.first().map(|m| m.path.display().to_string()),
            method_overrides: r
                .method_overrides
                .iter()
                .map(|(k, s)| (k.clone(), s.value.clone()))
                .collect(),
            host: r.host.clone(),
            started_at: r.started_at.clone(),
            resumed_at: r.resumed_at.clone(),
            ended_at: r.ended_at.clone(),
            git_commit: r.git.as_ref().map(|g| g.commit.clone()),
            git_dirty: r.git.as_ref().map(|g| g.dirty),
            config_hash: r.config_hash.clone(),
            diagnostics: r.diagnostics.clone(),
            staging: r.staging.clone(),
        }
    }
}

/// The JSON form of `runner report`.
#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub run: &'a str,
    pub kind: Kind,
    pub summary: &'a Summary,
    pub phase_split: PhaseSplit,
    /// The largest peak device memory of the measured prompts.
    pub peak_device_memory_bytes: Option<u64>,
    /// Each process's start and first prompt, and where its extra time went.
    pub first_prompts: super::FirstPrompts,
    /// A generation's last apply: its wall time and its processes' starts in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall: Option<super::WallTime>,
    pub provenance: Provenance,
    /// How many prompts' latents and frames the run kept (`latents`, `frames`), when it kept any.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kept: std::collections::BTreeMap<&'static str, usize>,
    /// The evaluation's settings, outcome and scores, when the run has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<&'a crate::results::scores::EvaluationRecord>,
}

fn peak_memory(records: &[&TimingRecord]) -> Option<u64> {
    records
        .iter()
        .filter_map(|r| r.peak_device_memory_bytes)
        .max()
}

impl<'a> Report<'a> {
    pub fn of(run: &'a LoadedRun) -> Report<'a> {
        Report {
            run: &run.name,
            kind: run.record.kind,
            summary: &run.summary,
            phase_split: PhaseSplit::of(&measured(&run.timings, run.record.kind)),
            peak_device_memory_bytes: peak_memory(&measured(&run.timings, run.record.kind)),
            first_prompts: super::FirstPrompts::of(&run.timings),
            wall: generation_wall(run),
            provenance: Provenance::of(&run.record),
            kept: crate::results::arrays::kept_counts(&run.dir),
            evaluation: run.record.evaluation.as_ref(),
        }
    }
}

/// A generation's wall time and its processes' starts in it, when its record has the wall time.
fn generation_wall(run: &LoadedRun) -> Option<super::WallTime> {
    (run.record.kind == Kind::Generation)
        .then(|| super::WallTime::of(&run.record, &run.timings))
        .flatten()
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

fn percent(v: Option<f64>) -> String {
    // Rounding residue of `other` must not print as -0.0%.
    v.map_or_else(
        || "n/a".into(),
        |v| format!("{:.1}%", if v.abs() < 1e-9 { 0.0 } else { v * 100.0 }),
    )
}

/// The text of `runner report`.
pub fn report_text(run: &LoadedRun) -> String {
    let r = &run.record;
    let p = Provenance::of(r);
    let mut t = String::new();
    let _ = writeln!(
        t,
        "run `{}` ({}): {}",
        run.name,
        r.kind.as_str(),
        r.status.as_str()
    );
    runtime_rows(&mut t, r, &p);
    run_rows(&mut t, r, &p, &run.timings);
    let kept = crate::results::arrays::kept_counts(&run.dir);
    if !kept.is_empty() {
        let list: Vec<String> = kept
            .iter()
            .map(|(dir, n)| format!("{dir}/ of {}", super::quality::prompt_count(*n)))
            .collect();
        row(
            &mut t,
            "kept",
            format!(
                "{} (runner compare measures other runs against them)",
                list.join(", ")
            ),
        );
    }
    statistics_table(&mut t, &run.summary);
    let measured = measured(&run.timings, r.kind);
    phase_split(&mut t, &measured);
    if let Some(wall) = generation_wall(run) {
        wall.write(&mut t);
    }
    super::FirstPrompts::of(&run.timings).write(&mut t);
    let _ = writeln!(
        t,
        "\npeak device memory {} (largest over the measured prompts)",
        peak_memory(&measured).map_or_else(|| "n/a".into(), gib)
    );
    super::scores::evaluation_section(&mut t, r);
    t
}

/// Writes one provenance line of the report: the key in a column of its own, then the value.
fn row(t: &mut String, key: &str, value: String) {
    let _ = writeln!(t, "  {key:<13} {value}");
}

/// Writes the provenance lines on what ran: the manifests, the provider, attention, kernels,
/// bundle, precision, GPU and library versions.
fn runtime_rows(t: &mut String, r: &RunRecord, p: &Provenance) {
    for (i, m) in r.manifests.iter().enumerate() {
        let short = m.sha256.get(..12).unwrap_or(&m.sha256);
        let key = if i == 0 { "manifest" } else { "  extends" };
        row(
            t,
            key,
            format!("{} (sha256 {short})", display_path(&m.path)),
        );
    }
    row(
        t,
        "provider",
        match &p.execution_provider {
            Some(ep) => format!("{} ({ep})", p.provider),
            None => p.provider.clone(),
        },
    );
    row(
        t,
        "attention",
        match &p.attention_resolved {
            Some(a) => format!("{a} (requested {})", p.attention_requested),
            None => format!("{} (resolved n/a)", p.attention_requested),
        },
    );
    if p.dit_kernels.is_some() || p.vae_kernels.is_some() {
        row(
            t,
            "kernels",
            format!(
                "dit {}, vae {}{}",
                opt(p.dit_kernels.as_deref()),
                opt(p.vae_kernels.as_deref()),
                if p.cuda_graphs {
                    "; DiT as CUDA graphs"
                } else {
                    ""
                }
            ),
        );
    }
    if let Some(bundle) = &p.bundle {
        row(t, "bundle", bundle.clone());
    }
    if let Some(weights) = &p.weights {
        let note = if weights == "released" {
            ""
        } else {
            " (seeded random weights: videos and scores say nothing of the model)"
        };
        row(t, "weights", format!("{weights}{note}"));
    }
    row(
        t,
        "precision",
        match &p.precision_note {
            Some(note) => format!("{} (reduced precision: {note})", p.precision),
            None => p.precision.clone(),
        },
    );
    let mut gpu = opt(p.gpu_model.as_deref()).to_string();
    if let Some(b) = p.gpu_memory_bytes {
        let _ = write!(gpu, ", {}", gib(b));
    }
    if let Some(d) = &p.driver_version {
        let _ = write!(gpu, ", driver {d}");
    }
    row(t, "gpu", gpu);
    row(
        t,
        "versions",
        format!(
            "onnxruntime {}, cuda {}, cudnn {}",
            opt(p.onnxruntime.as_deref()),
            opt(p.cuda.as_deref()),
            opt(p.cudnn.as_deref())
        ),
    );
    if !p.diagnostics.is_empty() {
        row(
            t,
            "diagnostics",
            format!(
                "{} (times measured with diagnostics on)",
                p.diagnostics.join(", ")
            ),
        );
    }
}

/// Writes the provenance lines on how the run went: the caches, the timed region, the warmup,
/// the method overrides, the host, the times, the git commit and the failure if any.
fn run_rows(t: &mut String, r: &RunRecord, p: &Provenance, timings: &[TimingRecord]) {
    row(
        t,
        "cache",
        format!(
            "{} ({}, {})",
            r.cache.label.as_str(),
            name_of(&r.cache.mode),
            name_of(&r.cache.scope)
        ),
    );
    row(
        t,
        "timed region",
        format!("ends at {}", r.timed_region_ends),
    );
    row(t, "warmup", warmup(r, timings));
    if let Some(staging) = &r.staging {
        row(
            t,
            "staging",
            format!(
                "{:.2} s before the first worker ({})",
                staging.seconds,
                staging_how(staging)
            ),
        );
    }
    if r.method_overrides.is_empty() {
        row(t, "overrides", "none (method defaults)".into());
    }
    for (i, (k, s)) in r.method_overrides.iter().enumerate() {
        let key = if i == 0 { "overrides" } else { "" };
        row(t, key, format!("{k} = {} ({})", s.value, s.origin));
    }
    row(t, "host", opt(p.host.as_deref()).to_string());
    for (i, job) in r.slurm_jobs().into_iter().enumerate() {
        let tasks: Vec<String> = job
            .tasks
            .iter()
            .map(|task| {
                let gpus = task
                    .gpus
                    .as_ref()
                    .map_or(String::new(), |g| format!(" gpu {g}"));
                format!(
                    "{} on {}{gpus} ({})",
                    task.slot,
                    opt(task.node.as_deref()),
                    opt(task.state.as_deref())
                )
            })
            .collect();
        let shards = job
            .shards
            .map_or(String::new(), |s| format!(" (shard {})", s.label()));
        row(
            t,
            if i == 0 { "slurm" } else { "" },
            format!("job {}{shards}: {}", job.job_id, tasks.join(", ")),
        );
    }
    let resumed = if p.resumed_at.is_empty() {
        String::new()
    } else {
        format!(" (resumed at {})", p.resumed_at.join(", "))
    };
    row(
        t,
        "time",
        format!(
            "{} to {}{resumed}",
            p.started_at,
            opt(p.ended_at.as_deref())
        ),
    );
    if let Some(g) = &r.git {
        let short = g.commit.get(..12).unwrap_or(&g.commit);
        row(
            t,
            "git",
            format!("{short}{}", if g.dirty { " (dirty)" } else { "" }),
        );
    }
    if let Some(f) = &p.failure {
        row(t, "failure", f.lines().last().unwrap_or("").to_string());
    }
}

/// The warmup line's value, from the records: how many of the plan's warmup processes ran
/// (those with timing records) before measurement, and on which prompts; those the shared
/// cache's markers skipped; and those that recorded no prompt (a run that failed or stopped).
fn warmup(r: &RunRecord, timings: &[TimingRecord]) -> String {
    // Where no indices are given, the plan's defaults (plan::build): a probe warms up on the
    // prompts it measures, a generation's slot on the first prompt of its first shard.
    let warmup_prompts = match (&r.warmup.indices, r.kind) {
        (Some(v), _) => format!(
            "prompts {}",
            v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        ),
        (None, Kind::Probe) => "the prompts measured".to_string(),
        (None, Kind::Generation) => "the first prompt of each slot's first shard".to_string(),
    };
    let planned: Vec<&ProcessRecord> = r
        .processes
        .iter()
        .filter(|p| p.role == ProcessRole::Warmup)
        .collect();
    let recorded = |p: &ProcessRecord| {
        timings
            .iter()
            .any(|t| t.process == p.index && t.role == ProcessRole::Warmup)
    };
    let ran = planned.iter().filter(|p| recorded(p)).count();
    let by_marker = planned
        .iter()
        .filter(|p| !recorded(p) && p.skipped == Some(ProcessSkip::WarmupMarker))
        .count();
    let unrecorded = planned.len() - ran - by_marker;
    let processes = |n: usize| format!("{n} process{}", if n == 1 { "" } else { "es" });
    let mut parts = Vec::new();
    if ran > 0 {
        parts.push(format!(
            "{} before measurement, on {warmup_prompts}",
            processes(ran)
        ));
    }
    if by_marker > 0 {
        let what = if by_marker == planned.len() {
            "skipped".to_string()
        } else {
            format!("{} skipped", processes(by_marker))
        };
        parts.push(format!(
            "{what}: the shared cache's warmup marker{} present",
            if by_marker == 1 { " was" } else { "s were" }
        ));
    }
    if unrecorded > 0 {
        parts.push(format!("{} recorded no prompt", processes(unrecorded)));
    }
    if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join("; ")
    }
}

/// Writes the statistics section: a row per series, a column per statistic, in seconds.
fn statistics_table(t: &mut String, s: &Summary) {
    let _ = writeln!(
        t,
        "\nstatistics over {} measured prompt{}, seconds ({})",
        s.count,
        if s.count == 1 { "" } else { "s" },
        s.cache_label.as_str()
    );
    // Each column is as wide as its statistic's name, so the names read as headers.
    let names = Statistics::of(&[]).named().map(|(n, _)| n);
    let header: String = names.iter().map(|n| format!("  {n}")).collect();
    let _ = writeln!(t, "  {:<12}{header}", "");
    for (label, stats) in series(s) {
        let values: String = stats
            .named()
            .iter()
            .map(|(n, v)| format!("  {:>w$}", seconds(*v), w = n.len()))
            .collect();
        let _ = writeln!(t, "  {label:<12}{values}");
    }
}

/// Writes the phase split section: the mean share of each phase in the timed total.
fn phase_split(t: &mut String, measured: &[&TimingRecord]) {
    let split = PhaseSplit::of(measured);
    let _ = writeln!(t, "\nphase split, mean share of the timed total");
    let _ = writeln!(
        t,
        "  DiT {}   VAE {}   layout {}   other {}",
        percent(split.dit),
        percent(split.vae),
        percent(split.layout),
        percent(split.other)
    );
}

/// One statistic of both runs.
#[derive(Debug, Clone, Serialize)]
pub struct CompareRow {
    pub series: &'static str,
    pub statistic: &'static str,
    pub a: Option<f64>,
    pub b: Option<f64>,
    /// b − a.
    pub delta: Option<f64>,
    /// b / a.
    pub ratio: Option<f64>,
}

/// The JSON form of `runner compare`.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub a: String,
    pub b: String,
    pub rows: Vec<CompareRow>,
    /// Evaluation scores per dimension, when either run has them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scores: Vec<super::scores::ScoreRow>,
    /// b's outputs against a's on the same noise, when both kept latents or frames.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality: Option<super::quality::Quality>,
    /// Reasons the numbers may not be comparable.
    pub warnings: Vec<String>,
}

impl Comparison {
    pub fn of(a: &LoadedRun, b: &LoadedRun) -> Comparison {
        let mut rows = Vec::new();
        for ((series, sa), (_, sb)) in series(&a.summary).into_iter().zip(series(&b.summary)) {
            for ((statistic, va), (_, vb)) in sa.named().into_iter().zip(sb.named()) {
                let both = va.zip(vb);
                rows.push(CompareRow {
                    series,
                    statistic,
                    a: va,
                    b: vb,
                    delta: both.map(|(x, y)| y - x),
                    ratio: both.and_then(|(x, y)| (x != 0.0).then(|| y / x)),
                });
            }
        }
        let (quality, quality_warnings) = super::quality::quality(a, b);
        Comparison {
            a: a.name.clone(),
            b: b.name.clone(),
            rows,
            scores: super::scores::score_rows(a, b),
            quality,
            warnings: [
                comparison_warnings(a, b),
                super::scores::score_warnings(a, b),
                quality_warnings,
            ]
            .concat(),
        }
    }

    pub fn text(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "compare `{}` (a) with `{}` (b): seconds, delta = b - a, ratio = b / a",
            self.a, self.b
        );
        let _ = writeln!(
            t,
            "  {:<12} {:<26} {:>10} {:>10} {:>10} {:>8}",
            "series", "statistic", "a", "b", "delta", "ratio"
        );
        for r in &self.rows {
            let _ = writeln!(
                t,
                "  {:<12} {:<26} {:>10} {:>10} {:>10} {:>8}",
                r.series,
                r.statistic,
                seconds(r.a),
                seconds(r.b),
                r.delta.map_or_else(|| "n/a".into(), |d| format!("{d:+.3}")),
                r.ratio.map_or_else(|| "n/a".into(), |x| format!("{x:.3}")),
            );
        }
        super::scores::scores_text(&mut t, &self.scores);
        super::quality::quality_text(&mut t, self.quality.as_slice());
        t
    }
}

/// How a run's snapshot was made, in words.
fn staging_how(staging: &crate::results::records::StagingRecord) -> String {
    if staging.reused {
        return "the kept snapshot hashed again and reused".into();
    }
    let Some(p) = &staging.placements else {
        return "bundle, runner and prompts copied and hashed".into();
    };
    let mut parts = Vec::new();
    if p.unzipped {
        parts.push("bundle unpacked".to_string());
    }
    for (n, how) in [
        (p.reflinked, "reflinked"),
        (p.hard_linked, "hard-linked"),
        (p.copied, "copied"),
    ] {
        if n > 0 {
            parts.push(format!("{n} file(s) {how}"));
        }
    }
    parts.push(format!("{} written", size(p.copied_bytes)));
    format!("{}; every file hashed", parts.join(", "))
}

/// A byte count in B, KiB, MiB or GiB.
pub(crate) fn size(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

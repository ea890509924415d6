//! The page's settings and provenance tables: one run's settings with their layers, the settings
//! that differ between runs, and what ran, side by side.

#[allow(unused_imports)]
use super::*;

/// A setting's value and where it came from, for a table cell.
pub(super) fn setting_cell(s: Option<&crate::results::SettingRecord>) -> String {
    match s {
        None => "<td class=\"none\">(not recorded)</td>".into(),
        Some(s) => {
            let layer = if s.layer == s.origin {
                esc(&s.layer)
            } else {
                format!("{} ({})", esc(&s.layer), esc(&s.origin))
            };
            format!(
                "<td><code>{}</code><br><span class=\"layer\">{layer}</span></td>",
                esc(&s.value.to_string())
            )
        }
    }
}

/// One run's settings: those not at their default, then every setting folded away.
pub(super) fn settings_one(run: &LoadedRun) -> String {
    let settings = &run.record.settings;
    let set: Vec<_> = settings
        .iter()
        .filter(|(_, s)| s.layer != "default")
        .collect();
    let mut s = String::new();
    if set.is_empty() {
        s.push_str("<p>every setting at its default</p>");
    } else {
        s.push_str(
            "<p>the settings not at their default, with the layer that set each</p>\
             <table><thead><tr><th>setting</th><th>value and layer</th></tr></thead><tbody>",
        );
        for (key, setting) in set {
            let _ = write!(
                s,
                "<tr><td><code>{}</code></td>{}</tr>",
                esc(key),
                setting_cell(Some(setting))
            );
        }
        s.push_str("</tbody></table>");
    }
    let _ = write!(
        s,
        "<details><summary>all {} settings</summary><table><tbody>",
        settings.len()
    );
    for (key, setting) in settings {
        let _ = write!(
            s,
            "<tr><td><code>{}</code></td>{}</tr>",
            esc(key),
            setting_cell(Some(setting))
        );
    }
    s.push_str("</tbody></table></details>");
    s
}

/// The settings whose values differ between the runs (as `runner diff` finds them between the
/// reference and each later run), each run's value with the layer that set it.
pub(super) fn settings_diff(runs: &[LoadedRun]) -> String {
    let diffs: Vec<SettingsDiff> = runs[1..]
        .iter()
        .map(|other| SettingsDiff::of(&runs[0], other))
        .collect();
    let keys: BTreeSet<&String> = diffs
        .iter()
        .flat_map(|d| d.differences.iter().map(|x| &x.key))
        .collect();
    let left_out: BTreeSet<&String> = diffs.iter().flat_map(|d| &d.name_defaults).collect();
    let mut s = String::new();
    if diffs.iter().all(|d| d.same_config_hash) {
        s.push_str("<p>the runs have the same configuration hash</p>");
    }
    if keys.is_empty() {
        s.push_str("<p>the runs have the same value of every setting</p>");
    } else {
        s.push_str("<table><thead><tr><th>setting</th>");
        for run in runs {
            let _ = write!(s, "<th><code>{}</code></th>", esc(&run.name));
        }
        s.push_str("</tr></thead><tbody>");
        for key in keys {
            let _ = write!(s, "<tr><td><code>{}</code></td>", esc(key));
            for run in runs {
                s.push_str(&setting_cell(run.record.settings.get(key)));
            }
            s.push_str("</tr>");
        }
        s.push_str("</tbody></table>");
    }
    if !left_out.is_empty() {
        let list: Vec<String> = left_out
            .iter()
            .map(|k| format!("<code>{}</code>", esc(k)))
            .collect();
        let _ = write!(
            s,
            "<p class=\"note\">left out: {}, at defaults that differ only in the run name</p>",
            list.join(", ")
        );
    }
    s
}

/// What a run's provenance rows say, in the order the page shows them.
pub(super) fn provenance_rows(run: &LoadedRun) -> Vec<(&'static str, String)> {
    let r = &run.record;
    let p = Provenance::of(r);
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "n/a".into());
    let manifests: Vec<String> = r
        .manifests
        .iter()
        .map(|m| {
            format!(
                "{} (sha256 {})",
                crate::manifest::diagnostic::display_path(&m.path),
                m.sha256.get(..12).unwrap_or(&m.sha256)
            )
        })
        .collect();
    let mut gpu = opt(&p.gpu_model);
    if let Some(b) = p.gpu_memory_bytes {
        let _ = write!(gpu, ", {}", crate::report::render::size(b));
    }
    let kept = crate::results::arrays::kept_counts(&run.dir);
    let peak = measured(&run.timings, r.kind)
        .iter()
        .filter_map(|t| t.peak_device_memory_bytes)
        .max();
    let mut rows = vec![
        ("status", r.status.as_str().to_string()),
        ("kind", r.kind.as_str().to_string()),
        ("manifests", manifests.join("; ")),
        (
            "provider",
            match &p.execution_provider {
                Some(ep) => format!("{} ({ep})", p.provider),
                None => p.provider.clone(),
            },
        ),
        (
            "attention",
            format!(
                "{} (requested {})",
                opt(&p.attention_resolved),
                p.attention_requested
            ),
        ),
        (
            "kernels",
            format!(
                "dit {}, vae {}, CUDA graphs {}",
                opt(&p.dit_kernels),
                opt(&p.vae_kernels),
                if p.cuda_graphs { "on" } else { "off" }
            ),
        ),
        ("bundle", opt(&p.bundle)),
        ("weights", opt(&p.weights)),
        (
            "precision",
            match p.precision_note {
                Some(note) => format!("{} (reduced precision: {note})", p.precision),
                None => p.precision.clone(),
            },
        ),
        ("gpu", gpu),
        ("driver", opt(&p.driver_version)),
        (
            "versions",
            format!(
                "onnxruntime {}, cuda {}, cudnn {}",
                opt(&p.onnxruntime),
                opt(&p.cuda),
                opt(&p.cudnn)
            ),
        ),
        ("cache", p.cache.as_str().to_string()),
        ("timed region", format!("ends at {}", r.timed_region_ends)),
        ("warmup processes", r.warmup.repeats.to_string()),
        (
            "peak device memory",
            peak.map_or_else(|| "n/a".into(), crate::report::render::size),
        ),
        ("host", opt(&p.host)),
        ("started", p.started_at.clone()),
        ("ended", opt(&p.ended_at)),
        (
            "git",
            match (&p.git_commit, p.git_dirty) {
                (Some(c), dirty) => format!(
                    "{}{}",
                    c.get(..12).unwrap_or(c),
                    if dirty == Some(true) { " (dirty)" } else { "" }
                ),
                (None, _) => "n/a".into(),
            },
        ),
        (
            "config hash",
            p.config_hash
                .get(..16)
                .unwrap_or(&p.config_hash)
                .to_string(),
        ),
    ];
    if !p.resumed_at.is_empty() {
        rows.push(("resumed", p.resumed_at.join(", ")));
    }
    if !p.diagnostics.is_empty() {
        rows.push(("diagnostics", p.diagnostics.join(", ")));
    }
    if !kept.is_empty() {
        let list: Vec<String> = kept
            .iter()
            .map(|(dir, n)| format!("{dir}/ of {}", crate::report::quality::prompt_count(*n)))
            .collect();
        rows.push(("kept arrays", list.join(", ")));
    }
    if let Some(f) = &p.failure {
        rows.push(("failure", f.lines().last().unwrap_or("").to_string()));
    }
    rows.push(("folder", run.dir.display().to_string()));
    rows
}

/// The runs' provenance side by side; the rows whose values differ are marked.
pub(super) fn provenance_table(runs: &[LoadedRun]) -> String {
    let all: Vec<Vec<(&'static str, String)>> = runs.iter().map(provenance_rows).collect();
    let mut keys: Vec<&'static str> = Vec::new();
    for rows in &all {
        for (k, _) in rows {
            if !keys.contains(k) {
                keys.push(k);
            }
        }
    }
    let mut s = String::from("<table><thead><tr><th></th>");
    for run in runs {
        let _ = write!(s, "<th><code>{}</code></th>", esc(&run.name));
    }
    s.push_str("</tr></thead><tbody>");
    for key in keys {
        let values: Vec<&str> = all
            .iter()
            .map(|rows| {
                rows.iter()
                    .find(|(k, _)| *k == key)
                    .map_or("", |(_, v)| v.as_str())
            })
            .collect();
        let differs = runs.len() > 1 && values.iter().any(|v| *v != values[0]);
        let _ = write!(
            s,
            "<tr{}><th scope=\"row\">{key}</th>",
            if differs { " class=\"differs\"" } else { "" }
        );
        for v in values {
            let _ = write!(s, "<td>{}</td>", esc(v));
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table>");
    if runs.len() > 1 {
        s.push_str("<p class=\"note\">marked: rows whose values differ between the runs</p>");
    }
    s
}

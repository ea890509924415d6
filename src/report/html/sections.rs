//! The page's sections: statistics, the phase split, plots, scores, quality, the video grid,
//! settings and provenance, each as an HTML fragment from the report's own data.

#[allow(unused_imports)]
use super::*;

/// One run's videos by prompt: the index entry and the link from the page.
pub(super) struct RunVideos {
    pub(super) by_prompt: BTreeMap<u32, (VideoEntry, String)>,
}

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

pub(super) fn status_badge(status: &str) -> String {
    format!("<span class=\"status {0}\">{0}</span>", esc(status))
}

/// `path` made absolute against the current folder, symbolic links resolved where it exists.
pub(super) fn absolute(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    })
}

/// The path from the folder `from` to `to`, both absolute.
pub(super) fn relative(from: &Path, to: &Path) -> PathBuf {
    let (f, t): (Vec<Component>, Vec<Component>) =
        (from.components().collect(), to.components().collect());
    let common = f.iter().zip(&t).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c.as_os_str());
    }
    out
}

/// A relative path as a URL path: each part percent-encoded but for unreserved characters,
/// parts joined by `/` (video names may hold spaces, `#`, `?` or `%`).
pub(super) fn url_path(path: &Path) -> String {
    let mut out = String::new();
    for (i, part) in path.iter().enumerate() {
        if i > 0 {
            out.push('/');
        }
        for &byte in part.as_bytes() {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                out.push(byte as char);
            } else {
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
    out
}

pub(super) fn num(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.decimals$}"))
}

/// A signed delta cell: green where lower is better and it went down, red where it went up.
pub(super) fn delta_cell(d: Option<f64>, decimals: usize, lower_is_better: bool) -> String {
    match d {
        None => "<td class=\"n\">n/a</td>".into(),
        Some(d) => {
            let class = if d == 0.0 {
                ""
            } else if (d < 0.0) == lower_is_better {
                " better"
            } else {
                " worse"
            };
            format!("<td class=\"n{class}\">{d:+.decimals$}</td>")
        }
    }
}

/// A sort key for a cell of a sortable table: a number, or empty for none.
pub(super) fn sort_key(v: Option<f64>) -> String {
    match v {
        None => String::new(),
        Some(v) if v.is_nan() => "Infinity".into(),
        Some(v) if v == f64::INFINITY => "Infinity".into(),
        Some(v) if v == f64::NEG_INFINITY => "-Infinity".into(),
        Some(v) => format!("{v}"),
    }
}

/// One run's statistics: a row per series, a column per statistic, in seconds.
pub(super) fn stats_one(s: &mut String, run: &LoadedRun) {
    let summary = &run.summary;
    let _ = write!(
        s,
        "<p>over {} measured prompt{}, seconds ({})</p><table><thead><tr><th>series</th>",
        summary.count,
        if summary.count == 1 { "" } else { "s" },
        summary.cache_label.as_str()
    );
    for (name, _) in summary.timed_total.named() {
        let _ = write!(s, "<th>{name}</th>");
    }
    s.push_str("</tr></thead><tbody>");
    for (label, stats) in crate::report::render::series(summary) {
        let _ = write!(s, "<tr><td>{label}</td>");
        for (_, v) in stats.named() {
            let _ = write!(s, "<td class=\"n\">{}</td>", seconds(v));
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table>");
}

/// Two runs' statistics: a, b, delta and ratio per statistic, as `runner compare` computes them.
pub(super) fn stats_two(s: &mut String, c: &Comparison) {
    let _ = write!(
        s,
        "<p>seconds; delta = b − a, ratio = b / a</p><table><thead><tr><th>series</th>\
         <th>statistic</th><th><code>{}</code> (a)</th><th><code>{}</code> (b)</th>\
         <th>delta</th><th>ratio</th></tr></thead><tbody>",
        esc(&c.a),
        esc(&c.b)
    );
    for r in &c.rows {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>{}\
             <td class=\"n\">{}</td></tr>",
            r.series,
            r.statistic,
            seconds(r.a),
            seconds(r.b),
            delta_cell(r.delta, 3, true),
            num(r.ratio, 3)
        );
    }
    s.push_str("</tbody></table>");
}

/// Three or more runs' statistics: a column per run, each later value with its ratio to the
/// first's, as `runner compare` computes them.
pub(super) fn stats_many(s: &mut String, c: &ManyComparison) {
    s.push_str(
        "<p>seconds, and in brackets the ratio to the first run</p><table><thead><tr>\
         <th>series</th><th>statistic</th>",
    );
    for run in &c.runs {
        let _ = write!(s, "<th><code>{}</code></th>", esc(run));
    }
    s.push_str("</tr></thead><tbody>");
    for r in &c.rows {
        let _ = write!(s, "<tr><td>{}</td><td>{}</td>", r.series, r.statistic);
        for (i, (v, ratio)) in r.values.iter().zip(&r.ratios).enumerate() {
            let class = match ratio {
                Some(x) if i > 0 && *x < 1.0 => " better",
                Some(x) if i > 0 && *x > 1.0 => " worse",
                _ => "",
            };
            match (i, ratio) {
                (0, _) | (_, None) => {
                    let _ = write!(s, "<td class=\"n\">{}</td>", seconds(*v));
                }
                (_, Some(x)) => {
                    let _ = write!(s, "<td class=\"n{class}\">{} ({x:.3})</td>", seconds(*v));
                }
            }
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table>");
}

pub(super) fn percent(v: Option<f64>) -> String {
    v.map_or_else(
        || "n/a".into(),
        |v| format!("{:.1}%", if v.abs() < 1e-9 { 0.0 } else { v * 100.0 }),
    )
}

/// Each run's phase split (the mean share of each phase in the timed total), with a bar.
pub(super) fn phase_table(runs: &[LoadedRun]) -> String {
    let mut s = String::from(
        "<table><thead><tr><th>run</th><th>DiT</th><th>VAE</th><th>layout</th><th>other</th>\
         <th></th></tr></thead><tbody>",
    );
    for run in runs {
        let split = PhaseSplit::of(&measured(&run.timings, run.record.kind));
        let parts = [
            ("dit", split.dit),
            ("vae", split.vae),
            ("layout", split.layout),
            ("other", split.other),
        ];
        let _ = write!(s, "<tr><td><code>{}</code></td>", esc(&run.name));
        for (_, v) in parts {
            let _ = write!(s, "<td class=\"n\">{}</td>", percent(v));
        }
        s.push_str("<td><div class=\"bar\">");
        for (class, v) in parts {
            if let Some(v) = v.filter(|v| *v > 0.0) {
                let _ = write!(
                    s,
                    "<span class=\"{class}\" style=\"width:{:.2}%\" title=\"{class} {}\"></span>",
                    (v * 100.0).min(100.0),
                    percent(Some(v))
                );
            }
        }
        s.push_str("</div></td></tr>");
    }
    s.push_str("</tbody></table>");
    s
}

/// Each run's latency plot, inline, drawn here from its timings: the plot `latency.svg` holds,
/// but never that file's bytes, which would run whatever script a results folder's file holds
/// when the page opens.
pub(super) fn latency_plots(runs: &[LoadedRun]) -> String {
    let mut s = String::from("<div class=\"plots\">");
    for run in runs {
        let svg = crate::report::latency_svg(&run.name, &run.timings);
        let _ = write!(
            s,
            "<figure><figcaption><code>{}</code></figcaption>{}</figure>",
            esc(&run.name),
            svg.trim()
        );
    }
    s.push_str("</div>");
    s
}

/// One run's score of a dimension, with its delta to the first run's.
pub(super) struct ScoreCell {
    pub(super) value: Option<f64>,
    pub(super) delta: Option<f64>,
}

/// Two runs' scores, as the comparison has them.
pub(super) fn two_scores(c: &Comparison) -> Vec<(String, Vec<ScoreCell>)> {
    c.scores
        .iter()
        .map(|r| {
            (
                r.dimension.clone(),
                vec![
                    ScoreCell {
                        value: r.a,
                        delta: None,
                    },
                    ScoreCell {
                        value: r.b,
                        delta: r.delta,
                    },
                ],
            )
        })
        .collect()
}

/// Three or more runs' scores: each later run's rows against the first, as `score_rows` makes
/// them for two runs, side by side.
pub(super) fn many_scores(runs: &[LoadedRun]) -> Vec<(String, Vec<ScoreCell>)> {
    let pairs: Vec<Vec<crate::report::scores::ScoreRow>> = runs[1..]
        .iter()
        .map(|other| crate::report::scores::score_rows(&runs[0], other))
        .collect();
    let dimensions: BTreeSet<&String> = pairs.iter().flatten().map(|r| &r.dimension).collect();
    dimensions
        .into_iter()
        .map(|d| {
            let find = |rows: &[crate::report::scores::ScoreRow]| {
                rows.iter()
                    .find(|r| &r.dimension == d)
                    .map(|r| (r.a, r.b, r.delta))
            };
            let first = pairs.iter().find_map(|rows| find(rows)).and_then(|x| x.0);
            let mut cells = vec![ScoreCell {
                value: first,
                delta: None,
            }];
            for rows in &pairs {
                let (b, delta) = find(rows).map_or((None, None), |x| (x.1, x.2));
                cells.push(ScoreCell { value: b, delta });
            }
            (d.clone(), cells)
        })
        .collect()
}

/// Scores per dimension, a column per run; each later run's with its delta to the first's.
pub(super) fn scores_table(runs: &[String], rows: &[(String, Vec<ScoreCell>)]) -> String {
    let mut s = String::from("<table><thead><tr><th>dimension</th>");
    for (i, run) in runs.iter().enumerate() {
        let _ = write!(s, "<th><code>{}</code></th>", esc(run));
        if i > 0 {
            s.push_str("<th>delta</th>");
        }
    }
    s.push_str("</tr></thead><tbody>");
    for (dimension, cells) in rows {
        let _ = write!(s, "<tr><td>{}</td>", esc(dimension));
        for (i, cell) in cells.iter().enumerate() {
            let _ = write!(s, "<td class=\"n\">{}</td>", num(cell.value, 4));
            if i > 0 {
                s.push_str(&delta_cell(cell.delta, 4, false));
            }
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table>");
    if runs.len() > 1 {
        s.push_str("<p class=\"note\">delta: the run's score minus the first run's</p>");
    }
    s
}

/// The per-prompt quality of each measured run against the reference, from its kept arrays:
/// a row per prompt, sortable by any numeric column, the largest change first.
pub(super) fn quality_table(quality: &[Quality], videos: &[RunVideos]) -> String {
    // The prompt's text, from the first run whose video index has it.
    let text = |i: u32| {
        videos
            .iter()
            .find_map(|v| v.by_prompt.get(&i))
            .map(|(e, _)| e.prompt.as_str())
    };
    // A column: its header, whether its largest change is its smallest value, and each
    // prompt's value.
    type Column = (String, bool, BTreeMap<u32, Option<f64>>, usize);
    let mut columns: Vec<Column> = Vec::new();
    for q in quality {
        let who = if quality.len() > 1 {
            format!(" <code>{}</code>", esc(&q.run))
        } else {
            String::new()
        };
        if let Some(l) = &q.latents {
            columns.push((
                format!("latents relative L2{who}"),
                false,
                l.per_prompt
                    .iter()
                    .map(|p| (p.prompt, Some(p.relative_l2)))
                    .collect(),
                4,
            ));
        }
        if let Some(f) = &q.frames {
            columns.push((
                format!("frames PSNR dB{who}"),
                true,
                f.per_prompt
                    .iter()
                    .map(|p| (p.prompt, Some(p.psnr_db.unwrap_or(f64::INFINITY))))
                    .collect(),
                2,
            ));
            columns.push((
                format!("frames max abs diff{who}"),
                false,
                f.per_prompt
                    .iter()
                    .map(|p| (p.prompt, Some(f64::from(p.max_abs_diff))))
                    .collect(),
                0,
            ));
        }
    }
    let prompts: BTreeSet<u32> = columns.iter().flat_map(|c| c.2.keys().copied()).collect();
    let mut order: Vec<u32> = prompts.into_iter().collect();
    // The largest change first by the first column: the largest error, or the lowest PSNR.
    if let Some((_, ascending, values, _)) = columns.first() {
        let key = |i: &u32| values.get(i).copied().flatten();
        order.sort_by(|x, y| match (key(x), key(y)) {
            (Some(a), Some(b)) => {
                let (a, b) = (nan_high(a), nan_high(b));
                if *ascending {
                    a.total_cmp(&b)
                } else {
                    b.total_cmp(&a)
                }
            }
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        });
    }
    let mut s = String::new();
    for q in quality {
        let _ = write!(
            s,
            "<p><code>{}</code> against <code>{}</code> on the same noise{}</p>",
            esc(&q.run),
            esc(&q.against),
            summary_line(q)
        );
    }
    s.push_str(
        "<p class=\"note\">click a header to sort; PSNR of identical frames is ∞</p>\
         <div class=\"scroll\"><table class=\"sortable\" id=\"quality-table\"><thead><tr>\
         <th data-first=\"asc\">prompt</th><th>text</th>",
    );
    for (i, (header, ascending, _, _)) in columns.iter().enumerate() {
        let first = if *ascending { "asc" } else { "desc" };
        let dir = if i == 0 {
            format!(" data-dir=\"{first}\"")
        } else {
            String::new()
        };
        let _ = write!(s, "<th data-first=\"{first}\"{dir}>{header}</th>");
    }
    s.push_str("</tr></thead><tbody>");
    for i in order {
        let _ = write!(
            s,
            "<tr><td class=\"n\" data-v=\"{i}\">{i}</td><td>{}</td>",
            esc(text(i).unwrap_or(""))
        );
        for (_, _, values, decimals) in &columns {
            let v = values.get(&i).copied().flatten();
            let shown = match v {
                None => String::new(),
                Some(x) if x == f64::INFINITY => "∞".into(),
                Some(x) if *decimals == 4 => format!("{x:.4e}"),
                Some(x) => format!("{x:.decimals$}"),
            };
            let _ = write!(s, "<td class=\"n\" data-v=\"{}\">{shown}</td>", sort_key(v));
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table></div>");
    s
}

/// A NaN error (non-finite latents) sorts as the largest.
pub(super) fn nan_high(v: f64) -> f64 {
    if v.is_nan() { f64::INFINITY } else { v }
}

/// The quality's summary figures after the heading of a measured run.
pub(super) fn summary_line(q: &Quality) -> String {
    let mut parts = Vec::new();
    if let Some(l) = &q.latents {
        parts.push(format!(
            "latents of {}: relative L2 mean {:.3e}, max {:.3e}",
            crate::report::quality::prompt_count(l.prompts),
            l.mean_relative_l2,
            l.max_relative_l2
        ));
    }
    if let Some(f) = &q.frames {
        parts.push(format!(
            "frames of {}: PSNR mean {} dB, min {} dB",
            crate::report::quality::prompt_count(f.prompts),
            num(f.mean_psnr_db, 1),
            num(f.min_psnr_db, 1)
        ));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join("; "))
    }
}

/// The video grid: a row per prompt any run has a video of, that prompt's video from each run
/// side by side, one control per row, and a filter over the prompts' texts. None when no run
/// has videos.
pub(super) fn video_grid(runs: &[LoadedRun], videos: &[RunVideos]) -> Option<String> {
    let prompts: BTreeSet<u32> = videos
        .iter()
        .flat_map(|v| v.by_prompt.keys().copied())
        .collect();
    if prompts.is_empty() {
        return None;
    }
    let mut s = String::with_capacity(prompts.len() * 600);
    let _ = write!(
        s,
        "<p class=\"filter\"><input id=\"filter\" type=\"search\" placeholder=\"filter prompts\" \
         aria-label=\"filter prompts\"> <span id=\"shown\">{0} of {0} prompts</span></p>\
         <p class=\"note\">▶ plays, pauses and seeks the videos of a row together; they load \
         as their row comes into view</p><table class=\"grid\"><thead><tr><th>prompt</th>\
         <th>text</th>",
        prompts.len()
    );
    for run in runs {
        let _ = write!(s, "<th><code>{}</code></th>", esc(&run.name));
    }
    s.push_str("</tr></thead><tbody>");
    for i in prompts {
        let entries: Vec<Option<&(VideoEntry, String)>> =
            videos.iter().map(|v| v.by_prompt.get(&i)).collect();
        let first = entries.iter().flatten().next().expect("a run has it");
        let _ = write!(
            s,
            "<tr class=\"prompt\" data-index=\"{i}\"><td class=\"n\">{i}</td><td class=\"text\">\
             <p>{}</p>",
            esc(&first.0.prompt)
        );
        // Another run's video of this index made from another text is another prompt's.
        for (run, e) in runs.iter().zip(&entries) {
            if let Some((e, _)) = e
                && e.prompt != first.0.prompt
            {
                let _ = write!(
                    s,
                    "<p class=\"other\"><code>{}</code>: {}</p>",
                    esc(&run.name),
                    esc(&e.prompt)
                );
            }
        }
        s.push_str(
            "<div class=\"ctl\"><button type=\"button\" class=\"play\" title=\"play or pause the \
             row\">▶</button><input class=\"seek\" type=\"range\" min=\"0\" max=\"1000\" \
             value=\"0\" aria-label=\"seek the row\"></div></td>",
        );
        for (run, e) in runs.iter().zip(&entries) {
            match e {
                Some((e, href)) => {
                    let _ = write!(
                        s,
                        "<td><video muted playsinline preload=\"none\" data-src=\"{}\" \
                         title=\"{}: {}\"></video></td>",
                        esc(href),
                        esc(&run.name),
                        esc(&e.name)
                    );
                }
                None => s.push_str("<td class=\"none\">no video</td>"),
            }
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table>");
    Some(s)
}

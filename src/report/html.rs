//! `runner report --html` and `runner compare --html`: one static HTML page that a browser opens
//! from disk, with no server and nothing fetched from elsewhere. It shows what the text forms
//! show (provenance, settings, statistics with deltas, the phase split, scores, the quality of
//! kept arrays) from the same data structures, the latency plots inline, and a grid of the runs'
//! videos, one row per prompt, each row's videos played, paused and sought together.
//!
//! The videos are linked by paths relative to the page and get their `src` only when their row
//! comes into view, so a page of 946 prompts opens at once and the page keeps working when the
//! results folder is copied elsewhere as a whole. Every string that comes from records (prompts,
//! settings, paths) is escaped. The page's script is small and uses nothing but the browser.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use super::load::LoadedRun;
use super::quality::Quality;
use super::render::{PhaseSplit, Provenance, seconds};
use super::{Comparison, ManyComparison, SettingsDiff};
use crate::results::video_index::{self, VIDEOS_DIR, VideoEntry, VideoIndex};
use crate::results::{LATENCY_SVG, RecordError, measured, write_atomic};

/// The page `runner report RUN --html` writes in the run's folder by default.
pub const REPORT_HTML: &str = "report.html";

/// The longest file stem a comparison's page gets from its runs' names (see
/// [`compare_file_name`]).
const MAX_STEM: usize = 150;

/// Why a page cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum HtmlError {
    #[error("the page `{}` is not an .html file", path.display())]
    NotHtml { path: PathBuf },
    #[error("the page `{}` is a folder", path.display())]
    IsFolder { path: PathBuf },
    #[error("no folder `{}` to write the page `{}` into", dir.display(), path.display())]
    NoFolder { dir: PathBuf, path: PathBuf },
    #[error("cannot create the results folder `{}`: {source}", dir.display())]
    CreateResults {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Write(#[from] RecordError),
}

impl crate::exit::Failure for HtmlError {
    fn hint(&self) -> Option<String> {
        match self {
            HtmlError::NotHtml { .. } => Some(
                "name a file ending in .html (`--html=FILE.html`), or give --html alone for the \
                 default page; --html takes the word after it as its file, so put it after the \
                 runs"
                    .into(),
            ),
            HtmlError::IsFolder { .. } => Some("name a file in that folder".into()),
            HtmlError::NoFolder { .. } => {
                Some("create the folder first, or name a file in an existing one".into())
            }
            HtmlError::CreateResults { .. } | HtmlError::Write(_) => None,
        }
    }

    fn exit_code(&self) -> i32 {
        match self {
            HtmlError::NotHtml { .. } | HtmlError::IsFolder { .. } | HtmlError::NoFolder { .. } => {
                crate::exit::USAGE
            }
            HtmlError::CreateResults { .. } | HtmlError::Write(_) => crate::exit::INTERNAL,
        }
    }
}

/// Checks a page path given on the command line before anything is computed or written: an
/// `.html` (or `.htm`) file, not a folder, in a folder that exists.
pub fn check_page_path(path: &Path) -> Result<(), HtmlError> {
    let html = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("html") || e.eq_ignore_ascii_case("htm"));
    if !html {
        return Err(HtmlError::NotHtml {
            path: path.to_path_buf(),
        });
    }
    if path.is_dir() {
        return Err(HtmlError::IsFolder {
            path: path.to_path_buf(),
        });
    }
    let dir = folder_of(path);
    if !dir.is_dir() {
        return Err(HtmlError::NoFolder {
            dir,
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// The folder a page lies in (`.` for a bare file name).
fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The file name of the page comparing `runs`: `compare-A-vs-B.html`, `compare-A-vs-B-vs-C.html`.
/// A stem longer than 150 characters (long sweep names, many runs) is cut to 141 and ended with
/// `-` and the first 8 hex digits of the SHA-256 of the whole stem, so it stays a valid file name
/// and distinct.
pub fn compare_file_name(runs: &[&str]) -> String {
    let stem = format!("compare-{}", runs.join("-vs-"));
    if stem.len() <= MAX_STEM {
        return format!("{stem}.html");
    }
    let digest = crate::manifest::load::hex(&Sha256::digest(stem.as_bytes()));
    let mut cut = MAX_STEM - 9;
    while !stem.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}-{}.html", &stem[..cut], &digest[..8])
}

/// Writes `page` at `path` (atomically); for the default page of a comparison, creates the
/// results folder when it is missing.
pub fn write_page(path: &Path, page: &str) -> Result<(), HtmlError> {
    let dir = folder_of(path);
    if !dir.is_dir() {
        std::fs::create_dir_all(&dir).map_err(|source| HtmlError::CreateResults {
            dir: dir.clone(),
            source,
        })?;
    }
    write_atomic(path, page.as_bytes())?;
    Ok(())
}

/// What a comparison's page is made from: the comparison `runner compare` computed.
#[derive(Clone, Copy)]
pub enum Compared<'a> {
    Two(&'a Comparison),
    Many(&'a ManyComparison),
}

/// A page, and what its making found amiss (also shown on the page), for the command to print.
pub struct Page {
    pub html: String,
    pub warnings: Vec<String>,
}

/// The page of `runner report RUN --html`, to be written at `page_path`.
pub fn report_page(run: &LoadedRun, page_path: &Path) -> Page {
    let mut b = Builder::new(format!("run {}", run.name));
    let r = &run.record;
    let _ = write!(
        b.header,
        "<h1>run <code>{}</code></h1><p class=\"sub\">{} · {} · {} measured prompt{}</p>",
        esc(&run.name),
        r.kind.as_str(),
        status_badge(r.status.as_str()),
        run.summary.count,
        if run.summary.count == 1 { "" } else { "s" }
    );
    if let Some(f) = &r.failure {
        b.warnings
            .push(format!("failure: {}", f.lines().last().unwrap_or("")));
    }
    let runs = std::slice::from_ref(run);
    let videos = b.videos(runs, page_path);

    let mut s = String::new();
    stats_one(&mut s, run);
    b.section("statistics", "Statistics", s);
    b.section("phases", "Phase split", phase_table(runs));
    b.section("latency", "Latency", latency_plots(runs));
    let mut s = String::new();
    let first = {
        let mut t = String::new();
        super::FirstPrompts::of(&run.timings).write(&mut t);
        t
    };
    if !first.trim().is_empty() {
        let _ = write!(s, "<pre>{}</pre>", esc(first.trim_matches('\n')));
        b.section("first", "First prompts", s);
    }
    if let Some(scores) = r.evaluation.as_ref().and_then(|e| e.scores.as_ref()) {
        let rows: Vec<(String, Vec<ScoreCell>)> = scores
            .iter()
            .map(|(d, v)| {
                (
                    d.clone(),
                    vec![ScoreCell {
                        value: Some(*v),
                        delta: None,
                    }],
                )
            })
            .collect();
        b.section(
            "scores",
            "Scores",
            scores_table(std::slice::from_ref(&run.name), &rows),
        );
    }
    if let Some(grid) = video_grid(runs, &videos) {
        b.section("videos", "Videos", grid);
    }
    b.section("settings", "Settings", settings_one(run));
    b.section("provenance", "Provenance", provenance_table(runs));
    b.finish()
}

/// The page of `runner compare A B … --html`, to be written at `page_path`, from the
/// comparison `compared` of `runs` (the reference first).
pub fn compare_page(runs: &[LoadedRun], compared: Compared<'_>, page_path: &Path) -> Page {
    let names: Vec<String> = runs.iter().map(|r| r.name.clone()).collect();
    let mut b = Builder::new(format!("compare {}", names.join(", ")));
    let _ = write!(
        b.header,
        "<h1>compare {} runs</h1><ol class=\"runs\">",
        runs.len()
    );
    for (i, run) in runs.iter().enumerate() {
        let role = match (i, runs.len()) {
            (0, 2) => " (a, the reference)",
            (1, 2) => " (b)",
            (0, _) => " (the reference)",
            _ => "",
        };
        let _ = write!(
            b.header,
            "<li><code>{}</code>{role} · {} · {} · {} measured prompt{}</li>",
            esc(&run.name),
            run.record.kind.as_str(),
            status_badge(run.record.status.as_str()),
            run.summary.count,
            if run.summary.count == 1 { "" } else { "s" }
        );
    }
    b.header.push_str("</ol>");
    let (warnings, quality): (&[String], &[Quality]) = match compared {
        Compared::Two(c) => (&c.warnings, c.quality.as_slice()),
        Compared::Many(c) => (&c.warnings, &c.quality),
    };
    b.warnings.extend(warnings.iter().cloned());
    let videos = b.videos(runs, page_path);

    b.section("settings", "Settings that differ", settings_diff(runs));
    let mut s = String::new();
    match compared {
        Compared::Two(c) => stats_two(&mut s, c),
        Compared::Many(c) => stats_many(&mut s, c),
    }
    b.section("statistics", "Statistics", s);
    b.section("phases", "Phase split", phase_table(runs));
    b.section("latency", "Latency", latency_plots(runs));
    let scores = match compared {
        Compared::Two(c) => two_scores(c),
        Compared::Many(_) => many_scores(runs),
    };
    if !scores.is_empty() {
        b.section("scores", "Scores", scores_table(&names, &scores));
    }
    if !quality.is_empty() {
        b.section(
            "quality",
            "Quality per prompt",
            quality_table(quality, &videos),
        );
    }
    if let Some(grid) = video_grid(runs, &videos) {
        b.section("videos", "Videos", grid);
    }
    b.section("provenance", "Provenance", provenance_table(runs));
    b.finish()
}

/// The page under construction: its header, sections in order and warnings.
struct Builder {
    title: String,
    header: String,
    sections: Vec<(&'static str, &'static str, String)>,
    warnings: Vec<String>,
}

impl Builder {
    fn new(title: String) -> Builder {
        Builder {
            title,
            header: String::new(),
            sections: Vec::new(),
            warnings: Vec::new(),
        }
    }

    fn section(&mut self, id: &'static str, title: &'static str, body: String) {
        self.sections.push((id, title, body));
    }

    /// Each run's video index, with each video's path relative to the page; a run without
    /// one has none, and an unreadable one is a warning.
    fn videos(&mut self, runs: &[LoadedRun], page_path: &Path) -> Vec<RunVideos> {
        let page_dir = absolute(&folder_of(page_path));
        runs.iter()
            .map(|run| {
                let index = match video_index::read(&run.dir) {
                    Ok(index) => index,
                    Err(e) => {
                        if !e.is_not_found() {
                            self.warnings
                                .push(format!("the videos of `{}` are left out: {e}", run.name));
                        }
                        VideoIndex::default()
                    }
                };
                let videos_dir = absolute(&run.dir).join(VIDEOS_DIR);
                let by_prompt = index
                    .videos
                    .into_iter()
                    .map(|v| {
                        let href = url_path(&relative(&page_dir, &videos_dir.join(&v.name)));
                        (v.index, (v, href))
                    })
                    .collect();
                RunVideos { by_prompt }
            })
            .collect()
    }

    fn finish(self) -> Page {
        let mut h = String::with_capacity(64 * 1024);
        let _ = write!(
            h,
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <meta name=\"generator\" content=\"unstep runner {}\">\n<title>{}</title>\n\
             <style>{STYLE}</style>\n</head>\n<body>\n<header>{}<nav>",
            env!("CARGO_PKG_VERSION"),
            esc(&self.title),
            self.header
        );
        for (id, title, _) in &self.sections {
            let _ = write!(h, "<a href=\"#{id}\">{title}</a>");
        }
        h.push_str("</nav></header>\n");
        if !self.warnings.is_empty() {
            h.push_str("<ul class=\"warnings\">");
            for w in &self.warnings {
                let _ = write!(h, "<li>{}</li>", esc(w));
            }
            h.push_str("</ul>\n");
        }
        for (id, title, body) in &self.sections {
            let _ = write!(
                h,
                "<section id=\"{id}\">\n<h2>{title}</h2>\n{body}\n</section>\n"
            );
        }
        let _ = write!(h, "<script>{SCRIPT}</script>\n</body>\n</html>\n");
        Page {
            html: h,
            warnings: self.warnings,
        }
    }
}

/// One run's videos by prompt: the index entry and the link from the page.
struct RunVideos {
    by_prompt: BTreeMap<u32, (VideoEntry, String)>,
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

fn status_badge(status: &str) -> String {
    format!("<span class=\"status {0}\">{0}</span>", esc(status))
}

/// `path` made absolute against the current folder, symbolic links resolved where it exists.
fn absolute(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    })
}

/// The path from the folder `from` to `to`, both absolute.
fn relative(from: &Path, to: &Path) -> PathBuf {
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
fn url_path(path: &Path) -> String {
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

fn num(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.decimals$}"))
}

/// A signed delta cell: green where lower is better and it went down, red where it went up.
fn delta_cell(d: Option<f64>, decimals: usize, lower_is_better: bool) -> String {
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
fn sort_key(v: Option<f64>) -> String {
    match v {
        None => String::new(),
        Some(v) if v.is_nan() => "Infinity".into(),
        Some(v) if v == f64::INFINITY => "Infinity".into(),
        Some(v) if v == f64::NEG_INFINITY => "-Infinity".into(),
        Some(v) => format!("{v}"),
    }
}

/// One run's statistics: a row per series, a column per statistic, in seconds.
fn stats_one(s: &mut String, run: &LoadedRun) {
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
    for (label, stats) in super::render::series(summary) {
        let _ = write!(s, "<tr><td>{label}</td>");
        for (_, v) in stats.named() {
            let _ = write!(s, "<td class=\"n\">{}</td>", seconds(v));
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table>");
}

/// Two runs' statistics: a, b, delta and ratio per statistic, as `runner compare` computes them.
fn stats_two(s: &mut String, c: &Comparison) {
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
fn stats_many(s: &mut String, c: &ManyComparison) {
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

fn percent(v: Option<f64>) -> String {
    v.map_or_else(
        || "n/a".into(),
        |v| format!("{:.1}%", if v.abs() < 1e-9 { 0.0 } else { v * 100.0 }),
    )
}

/// Each run's phase split (the mean share of each phase in the timed total), with a bar.
fn phase_table(runs: &[LoadedRun]) -> String {
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

/// Each run's latency plot, inline: the run's `latency.svg`, or the same plot drawn from its
/// timings where the file is missing (a run interrupted before the end draws none).
fn latency_plots(runs: &[LoadedRun]) -> String {
    let mut s = String::from("<div class=\"plots\">");
    for run in runs {
        let svg = std::fs::read_to_string(run.dir.join(LATENCY_SVG))
            .ok()
            .filter(|t| t.trim_start().starts_with("<svg"))
            .unwrap_or_else(|| super::latency_svg(&run.name, &run.timings));
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
struct ScoreCell {
    value: Option<f64>,
    delta: Option<f64>,
}

/// Two runs' scores, as the comparison has them.
fn two_scores(c: &Comparison) -> Vec<(String, Vec<ScoreCell>)> {
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
fn many_scores(runs: &[LoadedRun]) -> Vec<(String, Vec<ScoreCell>)> {
    let pairs: Vec<Vec<super::scores::ScoreRow>> = runs[1..]
        .iter()
        .map(|other| super::scores::score_rows(&runs[0], other))
        .collect();
    let dimensions: BTreeSet<&String> = pairs.iter().flatten().map(|r| &r.dimension).collect();
    dimensions
        .into_iter()
        .map(|d| {
            let find = |rows: &[super::scores::ScoreRow]| {
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
fn scores_table(runs: &[String], rows: &[(String, Vec<ScoreCell>)]) -> String {
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
fn quality_table(quality: &[Quality], videos: &[RunVideos]) -> String {
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
fn nan_high(v: f64) -> f64 {
    if v.is_nan() { f64::INFINITY } else { v }
}

/// The quality's summary figures after the heading of a measured run.
fn summary_line(q: &Quality) -> String {
    let mut parts = Vec::new();
    if let Some(l) = &q.latents {
        parts.push(format!(
            "latents of {}: relative L2 mean {:.3e}, max {:.3e}",
            super::quality::prompt_count(l.prompts),
            l.mean_relative_l2,
            l.max_relative_l2
        ));
    }
    if let Some(f) = &q.frames {
        parts.push(format!(
            "frames of {}: PSNR mean {} dB, min {} dB",
            super::quality::prompt_count(f.prompts),
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
fn video_grid(runs: &[LoadedRun], videos: &[RunVideos]) -> Option<String> {
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

/// A setting's value and where it came from, for a table cell.
fn setting_cell(s: Option<&crate::results::SettingRecord>) -> String {
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
fn settings_one(run: &LoadedRun) -> String {
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
fn settings_diff(runs: &[LoadedRun]) -> String {
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
fn provenance_rows(run: &LoadedRun) -> Vec<(&'static str, String)> {
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
        let _ = write!(gpu, ", {}", super::render::size(b));
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
            peak.map_or_else(|| "n/a".into(), super::render::size),
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
            .map(|(dir, n)| format!("{dir}/ of {}", super::quality::prompt_count(*n)))
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
fn provenance_table(runs: &[LoadedRun]) -> String {
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

const STYLE: &str = "\
body{font:14px/1.45 system-ui,sans-serif;color:#1d1d1f;margin:0 auto;max-width:1500px;padding:0 18px 40px}\
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:8px 0;z-index:1}\
h1{font-size:20px;margin:4px 0}h2{font-size:16px;margin:22px 0 6px}\
nav a{margin-right:14px}.sub,.note{color:#666}ol.runs{margin:2px 0 6px}\
code{font:12.5px ui-monospace,monospace}\
.status{padding:0 5px;border-radius:3px;background:#eee}.status.succeeded{background:#d9f2df}\
.status.failed,.status.interrupted{background:#f8d7d4}\
.warnings{background:#fff4e0;border-left:4px solid #e0a030;padding:8px 8px 8px 28px}\
table{border-collapse:collapse;margin:6px 0}\
th,td{border-bottom:1px solid #e4e4e4;padding:3px 8px;text-align:left;vertical-align:top;overflow-wrap:anywhere}\
.scroll{max-height:65vh;overflow:auto;display:inline-block;max-width:100%}\
thead th{background:#f6f6f6;white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.better{color:#0a7a2a}.worse{color:#b3261e}tr.differs{background:#fff8db}\
.layer{color:#777;font-size:12px}td.none{color:#999}\
th[data-first]{cursor:pointer;user-select:none}\
th[data-dir=asc]::after{content:' \\25B2'}th[data-dir=desc]::after{content:' \\25BC'}\
.plots{display:flex;flex-wrap:wrap;gap:14px}.plots figure{margin:0}.plots svg{max-width:100%;height:auto}\
.bar{display:flex;width:260px;height:12px;background:#eee}.bar span{height:100%}\
.bar .dit{background:#1f77b4}.bar .vae{background:#ff7f0e}.bar .layout{background:#2ca02c}.bar .other{background:#aaa}\
.grid td.text{max-width:360px}.grid td.text p{margin:0 0 6px}.grid p.other{color:#8a4b00}\
.ctl{display:flex;gap:6px;align-items:center}.ctl button{width:34px}.ctl input{flex:1;min-width:80px}\
video{display:block;width:300px;max-width:100%;aspect-ratio:16/9;background:#222;cursor:pointer}\
.filter input{width:320px;padding:4px}\
";

/// The page's script: sortable tables, lazy videos, a control per row that plays, pauses and
/// seeks its videos together, the filter, and a self-test. The self-test runs only when the
/// page is opened with `#selftest`: it sorts the first sortable table by its first column (both
/// ways), plays, pauses and seeks the first row of videos through its control, and writes what
/// the rows and videos did into `<pre id="selftest">` (for tests in a headless browser).
/// `#filter=TEXT` opens the page filtered, `#only=SECTION` with that section alone
/// (`#only=videos`).
const SCRIPT: &str = r#"
(() => {
"use strict";
const all = (sel, root) => Array.from((root || document).querySelectorAll(sel));
const params = new URLSearchParams(location.hash.slice(1));
for (const table of all("table.sortable")) {
  const body = table.tBodies[0], heads = all("thead th", table);
  heads.forEach((th, col) => {
    if (!th.dataset.first) return;
    th.addEventListener("click", () => {
      const dir = th.dataset.dir ? (th.dataset.dir === "asc" ? "desc" : "asc") : th.dataset.first;
      heads.forEach(h => delete h.dataset.dir);
      th.dataset.dir = dir;
      const key = tr => { const v = tr.cells[col].dataset.v; return v ? parseFloat(v) : null; };
      const rows = Array.from(body.rows).sort((x, y) => {
        const a = key(x), b = key(y);
        if (a === null || b === null) return (a === null) - (b === null);
        return a === b ? 0 : (dir === "asc") === (a < b) ? -1 : 1;
      });
      body.append(...rows);
    });
  });
}
if (params.has("only")) for (const s of all("section")) s.hidden = s.id !== params.get("only");
const rows = all("tr.prompt");
const load = tr => {
  for (const v of all("video[data-src]", tr)) {
    if (!v.getAttribute("src")) { v.preload = "metadata"; v.src = v.dataset.src; }
  }
};
if ("IntersectionObserver" in window) {
  const seen = new IntersectionObserver(entries => {
    for (const e of entries) if (e.isIntersecting) { load(e.target); seen.unobserve(e.target); }
  }, { rootMargin: "300px 0px" });
  rows.forEach(tr => seen.observe(tr));
} else rows.forEach(load);
for (const tr of rows) {
  const videos = all("video[data-src]", tr), lead = videos[0];
  const button = tr.querySelector("button.play"), seek = tr.querySelector("input.seek");
  if (!lead) { button.disabled = seek.disabled = true; continue; }
  const show = () => { button.textContent = lead.paused ? "\u25B6" : "\u275A\u275A"; };
  lead.addEventListener("play", show);
  lead.addEventListener("pause", show);
  button.addEventListener("click", () => {
    load(tr);
    if (!lead.paused) { videos.forEach(v => v.pause()); return; }
    const t = lead.ended ? 0 : lead.currentTime;
    videos.forEach(v => { v.currentTime = t; v.play().catch(() => {}); });
  });
  videos.forEach(v => v.addEventListener("click", () => button.click()));
  lead.addEventListener("timeupdate", () => {
    if (lead.duration) seek.value = Math.round(1000 * lead.currentTime / lead.duration);
    if (lead.paused) return;
    for (const v of videos) {
      if (v !== lead && !v.ended && Math.abs(v.currentTime - lead.currentTime) > 0.2) v.currentTime = lead.currentTime;
    }
  });
  lead.addEventListener("ended", () => videos.forEach(v => v.pause()));
  seek.addEventListener("input", () => {
    load(tr);
    const go = () => {
      const t = seek.value / 1000 * lead.duration;
      videos.forEach(v => { v.currentTime = Math.min(t, v.duration || t); });
    };
    if (lead.readyState >= 1) go(); else lead.addEventListener("loadedmetadata", go, { once: true });
  });
}
const filter = document.getElementById("filter"), shown = document.getElementById("shown");
if (filter) {
  const texts = rows.map(tr => all("td.text p", tr).map(p => p.textContent).join("\n").toLowerCase());
  const apply = () => {
    const q = filter.value.trim().toLowerCase();
    let n = 0;
    rows.forEach((tr, i) => { tr.hidden = q !== "" && !texts[i].includes(q); if (!tr.hidden) n++; });
    shown.textContent = n + " of " + rows.length + " prompts";
  };
  filter.addEventListener("input", apply);
  if (params.has("filter")) { filter.value = params.get("filter"); apply(); }
}
if (params.has("selftest")) {
  const out = document.createElement("pre");
  out.id = "selftest";
  out.hidden = true;
  document.body.append(out);
  const result = { rows: rows.length };
  const table = document.querySelector("table.sortable");
  if (table) {
    const order = () => Array.from(table.tBodies[0].rows, r => Number(r.cells[0].dataset.v));
    const head = table.tHead.rows[0].cells[0];
    result.sorted = [order()];
    head.click();
    result.sorted.push(order());
    head.click();
    result.sorted.push(order());
  }
  const tr = rows.find(r => r.querySelector("video[data-src]"));
  const state = () => all("video[data-src]", tr).map(v => ({
    src: v.getAttribute("src"), paused: v.paused, time: v.currentTime,
    duration: v.duration || null, ready: v.readyState, error: v.error && v.error.code }));
  const wait = ms => new Promise(r => setTimeout(r, ms));
  (async () => {
    if (tr) {
      const button = tr.querySelector("button.play"), seek = tr.querySelector("input.seek");
      button.click();
      await wait(1500);
      result.playing = state();
      button.click();
      await wait(300);
      result.paused = state();
      seek.value = "500";
      seek.dispatchEvent(new Event("input"));
      await wait(300);
      result.seeked = state();
    }
    out.textContent = JSON.stringify(result);
  })();
}
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_every_character_that_could_end_a_text_or_an_attribute() {
        assert_eq!(
            esc(r#"a "cat" <b>&</b> it's"#),
            "a &quot;cat&quot; &lt;b&gt;&amp;&lt;/b&gt; it&#39;s"
        );
    }

    #[test]
    fn relative_paths_climb_to_the_common_folder_and_are_url_encoded() {
        let rel = relative(
            Path::new("/r/results"),
            Path::new("/r/results/run=1/videos/a cat #1?.mp4"),
        );
        assert_eq!(rel, Path::new("run=1/videos/a cat #1?.mp4"));
        assert_eq!(url_path(&rel), "run%3D1/videos/a%20cat%20%231%3F.mp4");
        let up = relative(
            Path::new("/r/out/pages"),
            Path::new("/r/results/a/videos/0.mp4"),
        );
        assert_eq!(url_path(&up), "../../results/a/videos/0.mp4");
        // Non-ASCII names are encoded byte by byte, as UTF-8.
        assert_eq!(url_path(Path::new("é.mp4")), "%C3%A9.mp4");
    }

    #[test]
    fn comparison_pages_are_named_after_the_runs_and_long_names_are_cut_with_a_hash() {
        assert_eq!(compare_file_name(&["a", "b"]), "compare-a-vs-b.html");
        assert_eq!(
            compare_file_name(&["ref", "sig=0.01", "sig=0.02"]),
            "compare-ref-vs-sig=0.01-vs-sig=0.02.html"
        );
        let long: Vec<String> = (0..8)
            .map(|i| format!("sweep-clean_sigma=0.00{i}"))
            .collect();
        let long: Vec<&str> = long.iter().map(String::as_str).collect();
        let name = compare_file_name(&long);
        assert_eq!(name.len(), MAX_STEM + ".html".len());
        assert!(
            name.starts_with("compare-sweep-clean_sigma=0.000-vs-"),
            "{name}"
        );
        let mut other = long.clone();
        other[7] = "sweep-clean_sigma=0.009";
        assert_ne!(compare_file_name(&other), name);
    }

    #[test]
    fn page_paths_must_be_html_files_in_existing_folders() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(check_page_path(&d.join("page.html")).is_ok());
        assert!(check_page_path(&d.join("PAGE.HTM")).is_ok());
        assert!(matches!(
            check_page_path(&d.join("run-b")),
            Err(HtmlError::NotHtml { .. })
        ));
        assert!(matches!(
            check_page_path(&d.join("missing/page.html")),
            Err(HtmlError::NoFolder { .. })
        ));
        std::fs::create_dir(d.join("x.html")).unwrap();
        assert!(matches!(
            check_page_path(&d.join("x.html")),
            Err(HtmlError::IsFolder { .. })
        ));
    }
}

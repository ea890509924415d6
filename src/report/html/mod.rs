//! `runner report --html` and `runner compare --html`: one static HTML page that a browser opens
//! from disk, with no server and nothing fetched from elsewhere. It shows what the text forms
//! show (provenance, settings, statistics with deltas, the phase split, scores, the quality of
//! kept arrays) from the same data structures, the latency plots inline, and a grid of the runs'
//! videos, one row per prompt, each row's videos played, paused and sought together.
//!
//! The videos are linked by paths relative to the page and get their `src` only when their row
//! comes into view, so a page of 946 prompts opens at once and the page keeps working when the
//! results folder is copied elsewhere as a whole. A results folder may come from anyone, so every
//! byte taken from a run folder is data: every string from its records (prompts, settings,
//! paths) is escaped, the latency plots are drawn from the timings rather than read from its
//! `latency.svg`, and a video is linked only when `videos.json` names a plain file of the run's
//! `videos/` folder. The page's script is small and uses nothing but the browser.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use super::load::LoadedRun;
use super::quality::Quality;
use super::render::{PhaseSplit, Provenance, seconds};
use super::{Comparison, ManyComparison, SettingsDiff};
use crate::results::video_index::{self, VIDEOS_DIR, VIDEOS_JSON, VideoEntry, VideoIndex};
use crate::results::{RecordError, measured, write_atomic};

mod assets;
mod sections;
mod settings;
#[cfg(test)]
mod tests;

use assets::{SCRIPT, STYLE};
use sections::*;
use settings::*;

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
                let run_dir = absolute(&run.dir);
                let (mut by_prompt, mut outside) = (BTreeMap::new(), Vec::new());
                for v in index.videos {
                    match v.file_in(&run_dir) {
                        Some(file) => {
                            let href = url_path(&relative(&page_dir, &file));
                            by_prompt.insert(v.index, (v, href));
                        }
                        None => outside.push(v.name),
                    }
                }
                if let Some(first) = outside.first() {
                    self.warnings.push(format!(
                        "{} video(s) of `{}` are left out: {VIDEOS_JSON} names {} outside the \
                         run's {VIDEOS_DIR}/ folder, such as `{first}` (the runner writes plain \
                         file names there: check where this results folder came from)",
                        outside.len(),
                        run.name,
                        if outside.len() == 1 {
                            "a file"
                        } else {
                            "files"
                        },
                    ));
                }
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

//! The latency plot of a run, `latency.svg`: timed total per prompt in measurement order, one
//! line per process role. Hand-written SVG keeps a plotting stack out of the runner; the plot
//! is simple enough.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::manifest::Kind;
use crate::results::{LATENCY_SVG, ProcessRole, RecordError, TimingRecord, measured, write_atomic};

const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;

/// Writes `run_dir/latency.svg` (atomically) and returns its path. The run's name, shown as the
/// title, is the directory's name.
pub fn write_latency_svg(run_dir: &Path, records: &[TimingRecord]) -> Result<PathBuf, RecordError> {
    let title = run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let path = run_dir.join(LATENCY_SVG);
    write_atomic(&path, latency_svg(&title, records).as_bytes())?;
    Ok(path)
}

/// The records of one role in the order they were measured: warmups and the measurement by
/// process then as written; shards as a generation summarises them.
fn role_series(records: &[TimingRecord], role: ProcessRole) -> Vec<&TimingRecord> {
    if role == ProcessRole::Shard {
        return measured(records, Kind::Generation);
    }
    let mut v: Vec<&TimingRecord> = records.iter().filter(|r| r.role == role).collect();
    v.sort_by_key(|r| r.process);
    v
}

fn color(role: ProcessRole) -> &'static str {
    match role {
        ProcessRole::Warmup => "#8c8c8c",
        ProcessRole::Measurement => "#1f77b4",
        ProcessRole::Shard => "#d62728",
    }
}

/// A tick step of 1, 2 or 5 times a power of ten that cuts `max` into about `target` parts.
pub(crate) fn nice_step(max: f64, target: f64) -> f64 {
    if max.is_nan() || max <= 0.0 || max.is_infinite() {
        return 1.0;
    }
    let raw = max / target;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let m = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Formats a tick value with no more decimals than the step needs.
fn tick_label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.decimals$}")
}

/// The plot's scales: prompt positions across, seconds up, fitted to the records drawn.
struct Frame {
    /// The most prompts any series has.
    n: usize,
    y_step: f64,
    /// The top of the y axis: the slowest prompt rounded up to a whole tick step.
    y_top: f64,
    plot_w: f64,
    plot_h: f64,
}

impl Frame {
    fn of(series: &[(ProcessRole, Vec<&TimingRecord>)]) -> Frame {
        let n = series.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
        let max_y = series
            .iter()
            .flat_map(|(_, v)| v.iter().map(|r| r.timed_total_s))
            .fold(0.0, f64::max);
        let y_step = nice_step(max_y, 5.0);
        Frame {
            n,
            y_step,
            y_top: ((max_y / y_step).ceil() * y_step).max(y_step),
            plot_w: WIDTH - LEFT - RIGHT,
            plot_h: HEIGHT - TOP - BOTTOM,
        }
    }

    /// The x coordinate of a 1-based prompt position; a single prompt sits in the middle.
    fn x(&self, i: usize) -> f64 {
        if self.n <= 1 {
            LEFT + self.plot_w / 2.0
        } else {
            LEFT + (i - 1) as f64 / (self.n - 1) as f64 * self.plot_w
        }
    }

    /// The y coordinate of a time in seconds.
    fn y(&self, v: f64) -> f64 {
        TOP + self.plot_h - v / self.y_top * self.plot_h
    }
}

/// The SVG text of the plot.
pub fn latency_svg(title: &str, records: &[TimingRecord]) -> String {
    let series: Vec<(ProcessRole, Vec<&TimingRecord>)> = [
        ProcessRole::Warmup,
        ProcessRole::Measurement,
        ProcessRole::Shard,
    ]
    .into_iter()
    .map(|role| (role, role_series(records, role)))
    .filter(|(_, v)| !v.is_empty())
    .collect();
    let f = Frame::of(&series);
    let mut s = String::new();
    header(&mut s, &f, title);
    axes(&mut s, &f);
    y_ticks(&mut s, &f);
    x_ticks(&mut s, &f);
    axis_titles(&mut s, &f);
    for (j, (role, recs)) in series.iter().enumerate() {
        series_line(&mut s, &f, *role, recs);
        legend_entry(&mut s, &f, j, *role);
    }
    s.push_str("</svg>\n");
    s
}

/// Writes the opening `<svg>` tag, the white background and the title.
fn header(s: &mut String, f: &Frame, title: &str) {
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{} — timed total per prompt</text>"#,
        LEFT + f.plot_w / 2.0,
        escape(title)
    );
}

/// Writes the two axes as one path: down the left edge, then along the bottom.
fn axes(s: &mut String, f: &Frame) {
    let _ = writeln!(
        s,
        r#"<path d="M{LEFT},{TOP} V{} H{}" fill="none" stroke="black"/>"#,
        TOP + f.plot_h,
        LEFT + f.plot_w
    );
}

/// Writes the y ticks from zero to the top of the axis, each with its grid line and label.
fn y_ticks(s: &mut String, f: &Frame) {
    let mut k = 0.0;
    while k <= f.y_top + f.y_step / 2.0 {
        let yy = f.y(k);
        let _ = writeln!(
            s,
            r##"<line class="ytick" x1="{}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#e0e0e0"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT,
            LEFT + f.plot_w,
            LEFT - 6.0,
            yy + 4.0,
            tick_label(k, f.y_step)
        );
        k += f.y_step;
    }
}

/// Writes the x ticks, the first prompt and multiples of a round step, or a note in the middle
/// of the plot when there are no timings.
fn x_ticks(s: &mut String, f: &Frame) {
    let n = f.n;
    if n > 0 {
        let x_step = nice_step(n as f64, 10.0).max(1.0).round() as usize;
        let ticks = std::iter::once(1).chain((x_step..=n).step_by(x_step).filter(|&i| i != 1));
        for i in ticks {
            let xx = f.x(i);
            let _ = writeln!(
                s,
                r#"<line class="xtick" x1="{xx:.1}" y1="{}" x2="{xx:.1}" y2="{}" stroke="black"/><text x="{xx:.1}" y="{}" text-anchor="middle">{i}</text>"#,
                TOP + f.plot_h,
                TOP + f.plot_h + 5.0,
                TOP + f.plot_h + 19.0
            );
        }
    } else {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">no timings recorded</text>"#,
            LEFT + f.plot_w / 2.0,
            TOP + f.plot_h / 2.0
        );
    }
}

/// Writes the titles of the x axis (below it) and the y axis (turned, left of it).
fn axis_titles(s: &mut String, f: &Frame) {
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">prompt, in measurement order</text>"#,
        LEFT + f.plot_w / 2.0,
        HEIGHT - 15.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">timed total (s)</text>"#,
        TOP + f.plot_h / 2.0
    );
}

/// Writes one role's line, with a point per prompt that names it on hover.
fn series_line(s: &mut String, f: &Frame, role: ProcessRole, recs: &[&TimingRecord]) {
    let c = color(role);
    let points: Vec<String> = recs
        .iter()
        .enumerate()
        .map(|(i, r)| format!("{:.1},{:.1}", f.x(i + 1), f.y(r.timed_total_s)))
        .collect();
    let _ = writeln!(
        s,
        r#"<polyline class="series" data-role="{}" points="{}" fill="none" stroke="{c}" stroke-width="1.5"/>"#,
        role.as_str(),
        points.join(" ")
    );
    for (i, r) in recs.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{c}"><title>{} process {}, prompt {}: {:.3} s</title></circle>"#,
            f.x(i + 1),
            f.y(r.timed_total_s),
            role.as_str(),
            r.process,
            r.prompt,
            r.timed_total_s
        );
    }
}

/// Writes the legend entry of the `j`th series drawn, right of the plot: a short stroke in the
/// role's colour and the role's name.
fn legend_entry(s: &mut String, f: &Frame, j: usize, role: ProcessRole) {
    let ly = TOP + 10.0 + 20.0 * j as f64;
    let lx = LEFT + f.plot_w + 15.0;
    let _ = writeln!(
        s,
        r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
        lx + 20.0,
        color(role),
        lx + 26.0,
        ly + 4.0,
        role.as_str()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::TimedRegionEnd;

    fn rec(process: usize, role: ProcessRole, prompt: u32, total: f64) -> TimingRecord {
        TimingRecord {
            session_run_s: None,
            process,
            role,
            shard: (role == ProcessRole::Shard).then_some(process),
            slot: "gpu0".into(),
            prompt,
            text_encoding_s: 0.0,
            text_context: None,
            dit_s: 0.0,
            vae_s: 0.0,
            layout_s: 0.0,
            timed_total_s: total,
            peak_device_memory_bytes: None,
            timed_region_ends: TimedRegionEnd::Uint8Frames,
            config_hash: String::new(),
            prompt_sha256: None,
            video: None,
            video_file: None,
            kept_bytes: Default::default(),
            process_start: None,
            one_time: None,
        }
    }

    #[test]
    fn tick_steps_are_round() {
        for (max, target, want) in [
            (4.7, 5.0, 1.0),
            (9.0, 5.0, 2.0),
            (0.3, 5.0, 0.1),
            (946.0, 10.0, 100.0),
            (12.0, 10.0, 2.0),
            (0.0, 5.0, 1.0),
        ] {
            assert!((nice_step(max, target) - want).abs() < 1e-9, "{max}");
        }
        assert_eq!(tick_label(0.30000000000000004, 0.1), "0.3");
        assert_eq!(tick_label(4.0, 1.0), "4");
    }

    #[test]
    fn one_line_per_role_with_a_point_per_prompt() {
        let records = vec![
            rec(0, ProcessRole::Warmup, 0, 30.0),
            rec(0, ProcessRole::Warmup, 1, 6.0),
            rec(1, ProcessRole::Measurement, 0, 4.5),
            rec(1, ProcessRole::Measurement, 1, 4.0),
            rec(1, ProcessRole::Measurement, 2, 4.1),
        ];
        let svg = latency_svg("a<b", &records);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a&lt;b"));
        let lines: Vec<&str> = svg.lines().filter(|l| l.contains("<polyline")).collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].contains(r#"data-role="warmup""#));
        assert!(lines[1].contains(r#"data-role="measurement""#));
        // Three points for the measurement, spanning the plot's width.
        let pts = lines[1]
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let xs: Vec<f64> = pts
            .split(' ')
            .map(|p| p.split(',').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(
            xs,
            [LEFT, LEFT + (WIDTH - LEFT - RIGHT) / 2.0, WIDTH - RIGHT]
        );
        assert_eq!(svg.matches("<circle").count(), 5);
        // The y axis reaches past the slowest prompt: ticks 0, 10, 20, 30.
        assert_eq!(svg.matches(r#"class="ytick""#).count(), 4);
        assert!(svg.contains(">30</text>"));
        assert_eq!(svg.matches(r#"class="xtick""#).count(), 3);
    }

    #[test]
    fn an_empty_run_still_draws_axes() {
        let svg = latency_svg("empty", &[]);
        assert!(svg.contains("no timings recorded"));
        assert!(!svg.contains("<polyline"));
    }

    #[test]
    fn write_puts_the_plot_in_the_run_directory() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("myrun");
        std::fs::create_dir(&run).unwrap();
        let path = write_latency_svg(&run, &[rec(0, ProcessRole::Shard, 0, 1.0)]).unwrap();
        assert_eq!(path, run.join(LATENCY_SVG));
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.contains("myrun — timed total"));
        assert!(text.contains(r#"data-role="shard""#));
    }
}

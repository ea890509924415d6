//! `runner report --html` and `runner compare --html` opened in a real browser: headless
//! Chromium loads the pages from disk, the tests read the DOM after the page's script ran
//! (`--dump-dom`) and keep screenshots. The page's `#selftest` plays, pauses and seeks the first
//! row of videos through the row's own control and writes what the videos did into the DOM.
//!
//! `scripts/test` installs Debian's `chromium` when it is missing; where it cannot,
//! it sets `UNSTEP_SKIP_BROWSER_TESTS=1` and the browser's part of these tests is skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use unstep::manifest::{LoadRequest, load};
use unstep::results::video_index::{VIDEOS_JSON, VideoEntry, VideoIndex};
use unstep::results::{
    ProcessRole, RUN_JSON, RunRecord, RunStatus, SUMMARY_JSON, Summary, TIMINGS_JSONL,
    TimingRecord, append_jsonl, write_json_atomic,
};

use crate::apply::{generation, read_json};
use crate::support::{Test, tree};

/// The browser, or None (with a note) where `UNSTEP_SKIP_BROWSER_TESTS=1` says it cannot be had.
fn browser() -> Option<PathBuf> {
    if std::env::var("UNSTEP_SKIP_BROWSER_TESTS").as_deref() == Ok("1") {
        eprintln!("note: UNSTEP_SKIP_BROWSER_TESTS=1: the pages are not opened in a browser");
        return None;
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("chromium"))
            .find(|p| p.is_file())
    });
    assert!(
        found.is_some(),
        "no `chromium` on PATH: scripts/test installs Debian's chromium package (as root: \
         apt-get install chromium), or set UNSTEP_SKIP_BROWSER_TESTS=1"
    );
    found
}

/// Runs headless Chromium on `page` (with the URL fragment `fragment`) and `args`, in a fresh
/// profile, and returns its stdout and how long it took; fails after two minutes.
fn chromium(chromium: &Path, page: &Path, fragment: &str, args: &[&str]) -> (String, Duration) {
    let profile = tempfile::tempdir().unwrap();
    let url = format!(
        "file://{}{fragment}",
        page.canonicalize().unwrap().display()
    );
    let out = tempfile::NamedTempFile::new().unwrap();
    let start = Instant::now();
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,900",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(&url)
        .stdout(out.reopen().unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "chromium on {url}: {status}");
            break;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish {url} within two minutes");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let elapsed = start.elapsed();
    (std::fs::read_to_string(out.path()).unwrap(), elapsed)
}

/// The DOM of `page` after its script ran.
fn dump(browser: &Path, page: &Path, fragment: &str) -> (String, Duration) {
    chromium(browser, page, fragment, &["--dump-dom"])
}

/// A screenshot of `page` at `png`, copied to the test target's folder to outlive the test.
fn screenshot(browser: &Path, page: &Path, fragment: &str, png: &Path) {
    chromium(
        browser,
        page,
        fragment,
        &[&format!("--screenshot={}", png.display())],
    );
    let bytes = std::fs::read(png).unwrap();
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 5000,
        "{}",
        png.display()
    );
    let keep = Path::new(env!("CARGO_TARGET_TMPDIR")).join("html");
    std::fs::create_dir_all(&keep).unwrap();
    std::fs::copy(png, keep.join(png.file_name().unwrap())).unwrap();
}

/// An attribute of an element's opening tag.
fn attr(tag: &str, name: &str) -> Option<String> {
    let re = regex::Regex::new(&format!(r#"\s{name}="([^"]*)""#)).unwrap();
    re.captures(tag).map(|c| unescape(&c[1]))
}

fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Every opening tag of `element` in `html`.
fn tags<'a>(html: &'a str, element: &str) -> Vec<&'a str> {
    let re = regex::Regex::new(&format!(r"<{element}\b[^>]*>")).unwrap();
    re.find_iter(html).map(|m| m.as_str()).collect()
}

/// The rows of the video grid.
fn grid_rows(dom: &str) -> Vec<&str> {
    tags(dom, "tr")
        .into_iter()
        .filter(|t| attr(t, "class").as_deref() == Some("prompt"))
        .collect()
}

/// A URL path back to a file path.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// What `#selftest` wrote.
fn selftest(dom: &str) -> serde_json::Value {
    let re = regex::Regex::new(r#"(?s)<pre id="selftest"[^>]*>(.*?)</pre>"#).unwrap();
    let text = re
        .captures(dom)
        .unwrap_or_else(|| panic!("no self-test result in the page:\n{dom}"))[1]
        .to_string();
    serde_json::from_str(&unescape(&text)).unwrap()
}

/// Checks the self-test's record of the first row: every video played (advanced past its
/// start, together), paused together, and was sought to the middle together.
fn check_synced_row(result: &serde_json::Value, videos: usize) {
    let states = |phase: &str| -> Vec<(bool, f64, f64)> {
        let list = result[phase]
            .as_array()
            .unwrap_or_else(|| panic!("{result}"));
        assert_eq!(list.len(), videos, "{phase}: {result}");
        list.iter()
            .map(|v| {
                assert!(v["error"].is_null(), "{result}");
                (
                    v["paused"].as_bool().unwrap(),
                    v["time"].as_f64().unwrap(),
                    v["duration"].as_f64().unwrap_or(0.0),
                )
            })
            .collect()
    };
    let playing = states("playing");
    for &(paused, time, duration) in &playing {
        assert!(!paused && time > 0.3 && duration > time, "{result}");
    }
    let spread = |s: &[(bool, f64, f64)]| {
        let times = s.iter().map(|v| v.1);
        times.clone().fold(f64::MIN, f64::max) - times.fold(f64::MAX, f64::min)
    };
    assert!(spread(&playing) < 0.25, "out of sync: {result}");
    let paused = states("paused");
    assert!(paused.iter().all(|v| v.0), "{result}");
    assert!(spread(&paused) < 0.25, "{result}");
    for &(paused, time, duration) in &states("seeked") {
        assert!(paused, "{result}");
        assert!((time - duration / 2.0).abs() < 0.1, "{result}");
    }
}

/// Checks every video of the grid: its `data-src`, relative to the page, is the run's MP4 that
/// videos.json names for the row's prompt; those whose row was in view got it as `src`, the
/// rest none. Returns how many got a `src`.
fn check_video_sources(dom: &str, page: &Path, runs: &[&Path]) -> usize {
    let page_dir = page.parent().unwrap();
    let indexes: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| read_json(&r.join(VIDEOS_JSON)))
        .collect();
    let row_re = regex::Regex::new(r#"(?s)<tr class="prompt"[^>]*>(.*?)</tr>"#).unwrap();
    let mut loaded = 0;
    for row in row_re.captures_iter(dom) {
        let index: u64 = attr(&row[0], "data-index").unwrap().parse().unwrap();
        let videos = tags(&row[1], "video");
        assert_eq!(videos.len(), runs.len(), "{}", &row[0]);
        for ((video, run), index_json) in videos.iter().zip(runs).zip(&indexes) {
            let name = index_json["videos"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["index"] == index)
                .unwrap()["name"]
                .as_str()
                .unwrap()
                .to_string();
            let rel = attr(video, "data-src").unwrap();
            assert!(!rel.starts_with('/') && !rel.contains("://"), "{rel}");
            let file = page_dir.join(percent_decode(&rel)).canonicalize().unwrap();
            assert_eq!(file, run.join("videos").join(&name).canonicalize().unwrap());
            assert_eq!(
                attr(video, "preload").as_deref().map(|p| p != "auto"),
                Some(true)
            );
            match attr(video, "src") {
                Some(src) => {
                    assert_eq!(src, rel);
                    loaded += 1;
                }
                None => assert_eq!(attr(video, "preload").as_deref(), Some("none")),
            }
        }
    }
    loaded
}

/// A three-prompt generation `<name>.toml` of `prompts` that keeps latents and frames, with
/// `method` added to its `[method]` table.
fn smoke(t: &Test, name: &str, prompts: &Path, method: &str) {
    let path = generation(t, name, "0-2");
    let tiny = crate::support::repo().join("assets/prompts/tiny.txt");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(&tiny.display().to_string(), &prompts.display().to_string())
        .replace(
            "[outputs]\n",
            "[outputs]\nsave_latents = true\nsave_frames = true\n",
        )
        .replace("[method]\n", &format!("[method]\n{method}"));
    std::fs::write(&path, text).unwrap();
    let out = t
        .cmd()
        .args(["apply", "--quiet", &format!("{name}.toml")])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
}

/// A prompt with every character HTML gives a meaning to.
const MARKUP_PROMPT: &str = r#"a "quoted" <b>cat</b> & the dog's <script>bowl</script>"#;

#[test]
fn report_and_comparison_of_two_smoke_runs_show_their_videos_in_sync_in_a_browser() {
    let t = Test::new();
    let prompts = t.path().join("prompts.txt");
    std::fs::write(
        &prompts,
        format!(
            "a red fox running through snow\n{MARKUP_PROMPT}\nwaves crashing against dark rocks\n"
        ),
    )
    .unwrap();
    smoke(&t, "base", &prompts, "");
    smoke(&t, "sigma", &prompts, "clean_sigma = 0.2\n");
    let (base, sigma) = (
        t.path().join("results/base"),
        t.path().join("results/sigma"),
    );

    // The report's page, at its default place.
    let out = t.cmd().args(["report", "base", "--html"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert_eq!(out.stdout, "results/base/report.html\n");
    let report = base.join("report.html");
    let html = std::fs::read_to_string(&report).unwrap();
    // Self-contained: nothing is fetched from elsewhere.
    for external in ["http://", "https://", "<link", "src=\"/"] {
        let outside = html
            .replace("http://www.w3.org/2000/svg", "")
            .contains(external);
        assert!(!outside, "{external}");
    }
    assert!(html.contains("<svg"), "the latency plot is inline");

    // The comparison's page, named after the runs.
    let out = t.cmd().args(["compare", "base", "sigma", "--html"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    assert_eq!(out.stdout, "results/compare-base-vs-sigma.html\n");
    let compare = t.path().join("results/compare-base-vs-sigma.html");
    let html = std::fs::read_to_string(&compare).unwrap();
    // The prompt's markup is text: escaped wherever it is shown, never an element.
    let escaped = "a &quot;quoted&quot; &lt;b&gt;cat&lt;/b&gt; &amp; the dog&#39;s \
                   &lt;script&gt;bowl&lt;/script&gt;";
    assert!(html.contains(escaped));
    assert!(!html.contains("<b>cat</b>") && !html.contains("<script>bowl"));
    // The settings that differ, with the layer that set each.
    let settings =
        &html[html.find("id=\"settings\"").unwrap()..html.find("id=\"statistics\"").unwrap()];
    assert!(
        settings.contains("<code>method.clean_sigma</code>"),
        "{settings}"
    );
    assert!(settings.contains("<code>0.2</code>"), "{settings}");
    assert!(settings.contains("manifest ("), "{settings}");
    assert!(!settings.contains("runtime.provider"), "{settings}");
    // The statistics are the comparison's: `runner compare --json`'s rows, delta and ratio.
    let json = t.cmd().args(["compare", "base", "sigma", "--json"]).run();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let raw = &v["rows"][0];
    assert!(html.contains(&format!(
        "<td class=\"n\">{:.3}</td><td class=\"n\">{:.3}</td>",
        raw["a"].as_f64().unwrap(),
        raw["b"].as_f64().unwrap()
    )));
    // The quality table: a row per prompt, the largest relative error first.
    let per_prompt = v["quality"]["latents"]["per_prompt"].as_array().unwrap();
    let mut errors: Vec<(u64, f64)> = per_prompt
        .iter()
        .map(|p| {
            (
                p["prompt"].as_u64().unwrap(),
                p["relative_l2"].as_f64().unwrap(),
            )
        })
        .collect();
    errors.sort_by(|x, y| y.1.total_cmp(&x.1));
    let table = &html[html.find("id=\"quality-table\"").unwrap()..];
    let order: Vec<u64> = regex::Regex::new(r#"<tr><td class="n" data-v="(\d+)">"#)
        .unwrap()
        .captures_iter(table)
        .map(|c| c[1].parse().unwrap())
        .collect();
    assert_eq!(order, errors.iter().map(|e| e.0).collect::<Vec<_>>());

    let Some(browser) = browser() else { return };

    // The report: one video per row, played through the row's control.
    // Opened with the videos alone, every row is in view: each loads its video.
    let (dom, _) = dump(&browser, &report, "#only=videos&selftest");
    assert_eq!(grid_rows(&dom).len(), 3);
    assert_eq!(check_video_sources(&dom, &report, &[&base]), 3);
    check_synced_row(&selftest(&dom), 1);
    screenshot(&browser, &report, "", &base.join("report.png"));

    // The comparison: both runs' videos side by side, in sync; the quality table sorts.
    let (dom, _) = dump(&browser, &compare, "#only=videos&selftest");
    assert_eq!(grid_rows(&dom).len(), 3);
    assert_eq!(check_video_sources(&dom, &compare, &[&base, &sigma]), 6);
    let result = selftest(&dom);
    check_synced_row(&result, 2);
    assert_eq!(
        result["sorted"][1],
        serde_json::json!([0, 1, 2]),
        "{result}"
    );
    assert_eq!(
        result["sorted"][2],
        serde_json::json!([2, 1, 0]),
        "{result}"
    );
    // The DOM's serialiser escapes only `&`, `<` and `>` in text.
    let in_dom =
        "a \"quoted\" &lt;b&gt;cat&lt;/b&gt; &amp; the dog's &lt;script&gt;bowl&lt;/script&gt;";
    assert!(dom.contains(in_dom) && !dom.contains("<b>cat</b>"));

    // The filter box over the prompts' texts, opened from the URL.
    let (dom, _) = dump(&browser, &compare, "#filter=QUOTED");
    let rows = grid_rows(&dom);
    let hidden: Vec<bool> = rows.iter().map(|r| r.contains(" hidden")).collect();
    assert_eq!(hidden, [true, false, true], "{rows:?}");
    assert!(dom.contains("<span id=\"shown\">1 of 3 prompts</span>"));
    screenshot(
        &browser,
        &compare,
        "#only=videos",
        &t.path().join("results/compare-base-vs-sigma.png"),
    );

    // Three runs: a column of videos per run.
    let out = t
        .cmd()
        .args(["compare", "base", "sigma", "base", "--html=three.html"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let three = t.path().join("three.html");
    let (dom, _) = dump(&browser, &three, "#only=videos&selftest");
    assert_eq!(
        check_video_sources(&dom, &three, &[&base, &sigma, &base]),
        9
    );
    check_synced_row(&selftest(&dom), 3);
}

#[test]
fn bad_page_paths_are_refused_with_a_hint_and_nothing_is_written() {
    let t = Test::new();
    let prompts = t.path().join("prompts.txt");
    std::fs::write(&prompts, "a cat\n").unwrap();
    // Records only: these refusals come before any array or video is read.
    for name in ["a", "b"] {
        fake_generation(&t, name, 1, None);
    }
    let before = tree(t.path());
    for (args, message) in [
        (
            vec!["report", "a", "--html", "notes.txt"],
            "error: the page `notes.txt` is not an .html file",
        ),
        (
            vec!["compare", "a", "b", "--html=nowhere/page.html"],
            "error: no folder `nowhere` to write the page `nowhere/page.html` into",
        ),
        (
            vec!["report", "a", "--html=results"],
            "error: the page `results` is not an .html file",
        ),
        (
            vec!["compare", "a", "nope", "--html"],
            "error: no run `nope` under results/",
        ),
        (
            vec!["report", "a", "--html", "--json"],
            "error: the argument '--html [<FILE>]' cannot be used with '--json'",
        ),
    ] {
        let out = t.cmd().args(args.clone()).run();
        assert_eq!(out.code, 2, "{args:?}: {}", out.render());
        assert!(
            out.stderr.starts_with(message),
            "{args:?}: {}",
            out.render()
        );
        assert_eq!(out.stdout, "", "{args:?}");
    }
    let hinted = t.cmd().args(["report", "a", "--html", "a"]).run();
    assert!(
        hinted
            .stderr
            .contains("  = hint: name a file ending in .html")
    );
    assert_eq!(tree(t.path()), before);

    // Runs without videos (a probe, a generation that kept none) have pages without a grid.
    let out = t.cmd().args(["report", "a", "--html=a.html"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let page = std::fs::read_to_string(t.path().join("a.html")).unwrap();
    assert!(page.contains("<section id=\"statistics\">"));
    assert!(!page.contains("<section id=\"videos\">"));
    let out = t.cmd().args(["compare", "a", "b", "--html"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let page = std::fs::read_to_string(t.path().join("results/compare-a-vs-b.html")).unwrap();
    assert!(!page.contains("<section id=\"videos\">"));
    assert!(page.contains("<code>prompts.file</code>"));
}

/// A generation run `name` of `count` prompts written through the results API, as a finished
/// apply leaves it: run.json, a timing record per prompt, summary.json and, with `video`, the
/// same MP4 hard-linked as every prompt's video and indexed in videos.json.
fn fake_generation(t: &Test, name: &str, count: usize, video: Option<&Path>) -> PathBuf {
    let dir = t.path();
    let prompts: Vec<String> = (0..count)
        .map(|i| match i % 3 {
            0 => format!("prompt {i}: a red fox running through snow"),
            1 => format!("prompt {i}: a <small> boat & a \"big\" wave"),
            _ => format!("prompt {i}: fireworks over a city at night"),
        })
        .collect();
    std::fs::write(
        dir.join(format!("{name}-prompts.txt")),
        prompts.join("\n") + "\n",
    )
    .unwrap();
    let manifest = dir.join(format!("{name}.toml"));
    std::fs::write(
        &manifest,
        format!(
            "kind = \"generation\"\n[prompts]\nfile = \"{name}-prompts.txt\"\nindices = \"all\"\n\
             [shards]\ncount = 2\n[runtime]\nprovider = \"cpu\"\ncpu_slots = 2\n\
             [assets]\nbundle = \"bundle\"\n"
        ),
    )
    .unwrap();
    let resolved = load(&LoadRequest {
        manifest,
        env: Default::default(),
        sets: Vec::new(),
        extra_args: Vec::new(),
        cwd: dir.to_path_buf(),
    })
    .unwrap_or_else(|d| panic!("{d}"));
    let plan = unstep::plan::build(&resolved).unwrap();
    let run_dir = plan.run_dir.clone();
    std::fs::create_dir_all(run_dir.join("videos")).unwrap();
    let mut record = RunRecord::new(&resolved, &plan, std::time::SystemTime::now());
    record.finish(RunStatus::Succeeded, None);
    write_json_atomic(&run_dir.join(RUN_JSON), &record).unwrap();
    let mut records = Vec::new();
    let mut index = VideoIndex::default();
    for (i, prompt) in prompts.iter().enumerate() {
        let file = format!("{i:04}.mp4");
        let total = 2.0 + (i % 7) as f64 * 0.125;
        records.push(TimingRecord {
            process: 1 + i * 2 / count,
            role: ProcessRole::Shard,
            shard: Some(i * 2 / count),
            slot: format!("cpu{}", i * 2 / count),
            prompt: i as u32,
            text_encoding_s: 0.25,
            text_context: None,
            session_run_s: None,
            dit_s: total * 0.5,
            vae_s: total * 0.375,
            layout_s: total * 0.0625,
            timed_total_s: total,
            peak_device_memory_bytes: None,
            timed_region_ends: record.timed_region_ends,
            config_hash: record.config_hash.clone(),
            prompt_sha256: Some(unstep::results::prompt_hash(prompt)),
            video: Some(format!("videos/{file}")),
            video_file: None,
            process_start: None,
            one_time: None,
            kept_bytes: Default::default(),
        });
        if let Some(mp4) = video {
            std::fs::hard_link(mp4, run_dir.join("videos").join(&file)).unwrap();
            index.videos.push(VideoEntry {
                index: i as u32,
                prompt: prompt.clone(),
                standard_prompt: None,
                name: file,
                sha256: "0".repeat(64),
                bytes: std::fs::metadata(mp4).unwrap().len(),
            });
        }
    }
    for r in &records {
        append_jsonl(&run_dir.join(TIMINGS_JSONL), r).unwrap();
    }
    let summary = Summary::from_records(&records, record.kind, record.cache.label);
    write_json_atomic(&run_dir.join(SUMMARY_JSON), &summary).unwrap();
    if video.is_some() {
        write_json_atomic(&run_dir.join(VIDEOS_JSON), &index).unwrap();
    }
    run_dir
}

/// A short real MP4 (32 frames of a moving gradient at 112×64), through the runner's encoder.
fn short_mp4(path: &Path) {
    let (frames, height, width) = (32, 64, 112);
    let mut rgb = vec![0u8; frames * height * width * 3];
    for f in 0..frames {
        for y in 0..height {
            for x in 0..width {
                let p = ((f * height + y) * width + x) * 3;
                rgb[p] = (x * 2 + f * 6) as u8;
                rgb[p + 1] = (y * 3) as u8;
                rgb[p + 2] = 255 - (f * 7) as u8;
            }
        }
    }
    unstep::video::write_mp4(path, &rgb, frames, height, width, 16).unwrap();
}

/// The full protocol's size: a comparison of two runs of 946 prompts opens in seconds, because
/// its videos load only as their rows come into view.
#[test]
fn a_946_prompt_comparison_opens_with_only_the_rows_in_view_loaded() {
    let t = Test::new();
    let mp4 = t.path().join("short.mp4");
    short_mp4(&mp4);
    let a = fake_generation(&t, "ref", 946, Some(&mp4));
    let b = fake_generation(&t, "alt", 946, Some(&mp4));
    let out = t.cmd().args(["compare", "ref", "alt", "--html"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let page = t.path().join("results/compare-ref-vs-alt.html");
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(html.matches("<tr class=\"prompt\"").count(), 946);
    assert!(html.len() < 2 << 20, "{} bytes", html.len());
    assert!(html.contains("a &lt;small&gt; boat &amp; a &quot;big&quot; wave"));

    let Some(browser) = browser() else { return };
    let (dom, took) = dump(&browser, &page, "#only=videos&selftest");
    // A generous bound: a page that fetched every video would take far longer than this.
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert_eq!(grid_rows(&dom).len(), 946);
    let loaded = check_video_sources(&dom, &page, &[&a, &b]);
    // The rows in and near the view, a few of 946.
    assert!((2..=40).contains(&loaded), "{loaded} videos loaded");
    check_synced_row(&selftest(&dom), 2);
    screenshot(
        &browser,
        &page,
        "#only=videos",
        &t.path().join("results/compare-ref-vs-alt.png"),
    );
}

/// Markup that, if a page ran it, would mark the page's root element with `data-pwned="<at>"`:
/// a script, an image's error handler and an SVG's load handler, after quotes that would end an
/// attribute.
fn payload(at: &str) -> String {
    let mark = format!("document.documentElement.setAttribute('data-pwned','{at}')");
    format!(
        "\"'><script>{mark}</script><img src=x onerror=\"{mark}\"><svg onload=\"{mark}\"></svg>"
    )
}

/// `doc` with the payload added to every string (and every key of a map) that still reads as a
/// `T` afterwards, each marked with its place (`label` and its JSON pointer); a change that `T`
/// refuses, or a key that `T` drops, is undone.
fn inject<T: serde::de::DeserializeOwned + serde::Serialize>(
    doc: serde_json::Value,
    label: &str,
) -> serde_json::Value {
    use serde_json::Value;
    fn places(v: &Value, at: String, out: &mut Vec<(String, Option<String>)>) {
        match v {
            Value::String(_) => out.push((at, None)),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    places(item, format!("{at}/{i}"), out);
                }
            }
            Value::Object(map) => {
                for (k, item) in map {
                    out.push((at.clone(), Some(k.clone())));
                    places(item, format!("{at}/{k}"), out);
                }
            }
            _ => {}
        }
    }
    let reads = |v: &Value| serde_json::from_value::<T>(v.clone()).ok();
    assert!(reads(&doc).is_some(), "{label}: {doc}");
    let mut found = Vec::new();
    places(&doc, String::new(), &mut found);
    let mut doc = doc;
    // Values first, then keys: a renamed key moves the pointers below it.
    found.sort_by_key(|(_, key)| key.is_some());
    found.reverse();
    found.sort_by_key(|(_, key)| key.is_some());
    for (at, key) in found {
        let mut next = doc.clone();
        let mark: String = format!("{label}{at}")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let new_key = match &key {
            None => {
                let Some(Value::String(s)) = next.pointer_mut(&at) else {
                    continue;
                };
                s.push_str(&payload(&mark));
                None
            }
            Some(k) => {
                let Some(Value::Object(map)) = next.pointer_mut(&at) else {
                    continue;
                };
                let v = map.remove(k).unwrap();
                let new_key = format!("{k}{}", payload(&mark));
                map.insert(new_key.clone(), v);
                Some(new_key)
            }
        };
        let Some(read) = reads(&next) else { continue };
        let kept = match new_key {
            None => true,
            Some(new_key) => serde_json::to_string(&read)
                .unwrap()
                .contains(serde_json::to_string(&new_key).unwrap().trim_matches('"')),
        };
        if kept {
            doc = next;
        }
    }
    doc
}

/// Every file of a run folder that the pages read, with the payload in every string it can
/// hold: run.json (with a failure and evaluation scores), summary.json, each line of
/// timings.jsonl, videos.json (with names that lead out of the run's videos/ folder), and a
/// latency.svg that is nothing but script.
fn inject_run_folder(run_dir: &Path, label: &str) {
    let mut run = read_json(&run_dir.join(RUN_JSON));
    run["failure"] = "a worker failed".into();
    run["evaluation"] = serde_json::json!({
        "command": ["vbench"], "dimensions": ["color"], "scores_file": "scores.json",
        "names_file": null, "status": "succeeded", "started_at": null, "ended_at": null,
        "scores": {"color": 0.5}, "failure": null
    });
    let run = inject::<RunRecord>(run, &format!("{label}_run"));
    write_json_atomic(&run_dir.join(RUN_JSON), &run).unwrap();
    let summary = inject::<Summary>(
        read_json(&run_dir.join(SUMMARY_JSON)),
        &format!("{label}_summary"),
    );
    write_json_atomic(&run_dir.join(SUMMARY_JSON), &summary).unwrap();
    let timings: String = std::fs::read_to_string(run_dir.join(TIMINGS_JSONL))
        .unwrap()
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let v = inject::<TimingRecord>(
                serde_json::from_str(line).unwrap(),
                &format!("{label}_timing{i}"),
            );
            serde_json::to_string(&v).unwrap() + "\n"
        })
        .collect();
    std::fs::write(run_dir.join(TIMINGS_JSONL), timings).unwrap();
    // The videos keep their names (a name with markup holds a `/` and is left out, below).
    let videos = read_json(&run_dir.join(VIDEOS_JSON));
    let names: Vec<serde_json::Value> = videos["videos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].clone())
        .collect();
    let mut videos = inject::<VideoIndex>(videos, &format!("{label}_videos"));
    let list = videos["videos"].as_array_mut().unwrap();
    for (v, name) in list.iter_mut().zip(names) {
        v["name"] = name;
    }
    let first = list[0].clone();
    let hostile = [
        "../../../outside.mp4".to_string(),
        "/etc/hostname".to_string(),
        "javascript:alert(1)".to_string(),
        "..".to_string(),
        payload(&format!("{label}_video_name")),
    ];
    for (i, name) in hostile.into_iter().enumerate() {
        let mut v = first.clone();
        v["index"] = (100 + i).into();
        v["name"] = name.into();
        list.push(v);
    }
    write_json_atomic(&run_dir.join(VIDEOS_JSON), &videos).unwrap();
    let mark = format!("document.documentElement.setAttribute('data-pwned','{label}_svg')");
    std::fs::write(
        run_dir.join("latency.svg"),
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" onload=\"{mark}\"><script>{mark}</script>\
             <foreignObject><img xmlns=\"http://www.w3.org/1999/xhtml\" src=\"x\" \
             onerror=\"{mark}\"/></foreignObject></svg>\n"
        ),
    )
    .unwrap();
}

/// Every byte a page takes from a run folder is data: with markup in every string of every file
/// the pages read and a latency.svg of script, neither page runs any of it in a browser (the
/// plots are drawn from the timings, the rest escaped), and every video the pages link is a file
/// in its run's videos/ folder.
#[test]
fn markup_in_the_run_folders_files_never_runs_in_the_pages() {
    let t = Test::new();
    let mp4 = t.path().join("short.mp4");
    short_mp4(&mp4);
    let a = fake_generation(&t, "a", 3, Some(&mp4));
    let b = fake_generation(&t, "b", 3, Some(&mp4));
    inject_run_folder(&a, "a");
    inject_run_folder(&b, "b");
    let report = t.path().join("report.html");
    let compare = t.path().join("compare.html");
    for (args, page) in [
        (vec!["report", "a", "--html=report.html"], &report),
        (vec!["compare", "a", "b", "--html=compare.html"], &compare),
    ] {
        let out = t.cmd().args(args.clone()).run();
        assert_eq!(out.code, 0, "{args:?}: {}", out.render());
        let html = std::fs::read_to_string(page).unwrap();
        // The markup reached the page, as text: from the record, its scores, the video index's
        // prompts and, in the report's first prompts, the timings.
        let timings = (args[0] == "report").then_some("a_timing0_slot");
        for at in [
            "a_run_failure",
            "a_run_evaluation_scores",
            "a_run_settings_method_precision_value",
            "a_videos_videos_0_prompt",
        ]
        .into_iter()
        .chain(timings)
        {
            let text = format!(
                "&lt;script&gt;document.documentElement.setAttribute(&#39;data-pwned&#39;,\
                 &#39;{at}&#39;)"
            );
            assert!(html.contains(&text), "{args:?}: {at}");
        }
        for raw in [
            "<script>document",
            "<img src=x",
            "<svg onload",
            "<foreignObject",
        ] {
            assert!(!html.contains(raw), "{args:?}: {raw} in the page");
        }
        // (The run's name, from run.json, holds the markup too.)
        let left_out = "` are left out: videos.json names files outside the run&#39;s videos/ \
                        folder, such as `../../../outside.mp4`";
        assert_eq!(
            html.matches(left_out).count(),
            args.len() - 2,
            "{args:?}: {}",
            &html[html.find("<ul class=\"warnings\">").unwrap_or(0)..][..2000]
        );
        // Every video linked is a file of its run's videos/ folder.
        let videos = tags(&html, "video");
        assert_eq!(videos.len(), (args.len() - 2) * 4, "{args:?}");
        for video in videos {
            let rel = percent_decode(&attr(video, "data-src").unwrap());
            let mut file = PathBuf::new();
            for part in t.path().join(&rel).iter() {
                if part == ".." {
                    file.pop();
                } else {
                    file.push(part);
                }
            }
            assert!(
                [&a, &b]
                    .iter()
                    .any(|r| file.parent() == Some(r.join("videos").as_path())),
                "{args:?}: {rel} is not a run's video"
            );
        }
    }

    let Some(browser) = browser() else { return };
    for (page, runs) in [(&report, 1), (&compare, 2)] {
        for fragment in ["", "#only=videos&selftest"] {
            let (dom, _) = dump(&browser, page, fragment);
            let root = tags(&dom, "html");
            assert!(
                !root.is_empty() && root.iter().all(|t| !t.contains("data-pwned")),
                "{}{fragment}: script from the run folder ran: {root:?}",
                page.display()
            );
            assert!(dom.contains("<section id=\"latency\""));
            if !fragment.is_empty() {
                // The page's own script ran: scripts do run here.
                check_synced_row(&selftest(&dom), runs);
            }
        }
    }
}

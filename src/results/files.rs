//! Writing and reading the files of a run directory so that a crash at any moment leaves
//! something a reader accepts: JSON files are replaced atomically (temporary file in the same
//! folder, fsync, rename), and `timings.jsonl` grows by whole lines.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::records::TimingRecord;

/// File names inside `results/<RUN_NAME>/`.
pub const RUN_JSON: &str = "run.json";
pub const TIMINGS_JSONL: &str = "timings.jsonl";
pub const SUMMARY_JSON: &str = "summary.json";
pub const LATENCY_SVG: &str = "latency.svg";

/// A results file that could not be written or read back.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: not a valid record: {source}", path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}:{line}: not a timing record: {source}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    /// A record's path names something that is not a regular file (a FIFO, a device, a
    /// folder), or a file larger than any record the runner writes.
    #[error("cannot read {}: {reason}", path.display())]
    NotARecord { path: PathBuf, reason: String },
}

impl From<crate::bounded_read::ReadError> for RecordError {
    fn from(e: crate::bounded_read::ReadError) -> Self {
        use crate::bounded_read::ReadError;
        match e {
            ReadError::Read { path, source } => RecordError::Read { path, source },
            ReadError::NotRegular { path, reason } => RecordError::NotARecord { path, reason },
        }
    }
}

impl RecordError {
    /// Whether the file is simply absent (as opposed to unreadable or corrupt).
    pub fn is_not_found(&self) -> bool {
        matches!(self, RecordError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

fn write_err(path: &Path) -> impl FnOnce(io::Error) -> RecordError + '_ {
    move |source| RecordError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// Replaces `path` with `bytes` so that readers see the old file or the new one, never a mix
/// ([`crate::atomic_file::write_with`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RecordError> {
    crate::atomic_file::write_with(path, |w| w.write_all(bytes)).map_err(write_err(path))
}

/// Writes `value` as pretty JSON (with a final newline), atomically.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), RecordError> {
    let mut text = serde_json::to_string_pretty(value).map_err(|source| RecordError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    text.push('\n');
    write_atomic(path, text.as_bytes())
}

/// Appends `value` as one JSON line. The file is locked for the append, so processes that all
/// use this function never interleave; a torn tail left by a crash (bytes after the last
/// newline) is cut off first, so the new line does not fuse with it into garbage.
pub fn append_jsonl<T: Serialize>(path: &Path, value: &T) -> Result<(), RecordError> {
    let mut line = serde_json::to_string(value).map_err(|source| RecordError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    line.push('\n');
    let mut f = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(write_err(path))?;
    // An exclusive advisory lock (`flock` on Linux), released when `f` is closed on return.
    f.lock().map_err(write_err(path))?;
    cut_torn_tail(&mut f).map_err(write_err(path))?;
    // One write call: with O_APPEND the line lands whole at the end of the file.
    f.write_all(line.as_bytes()).map_err(write_err(path))?;
    f.sync_data().map_err(write_err(path))
}

/// Truncates the file after its last newline when it does not end with one.
fn cut_torn_tail(f: &mut File) -> io::Result<()> {
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8];
    f.seek(SeekFrom::Start(len - 1))?;
    f.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(());
    }
    // Lines are short; read back far enough to find the previous newline.
    let mut keep = 0;
    let mut end = len;
    while end > 0 {
        let start = end.saturating_sub(64 * 1024);
        let mut buf = vec![0u8; (end - start) as usize];
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf)?;
        if let Some(i) = buf.iter().rposition(|&b| b == b'\n') {
            keep = start + i as u64 + 1;
            break;
        }
        end = start;
    }
    f.set_len(keep)
}

/// The largest JSON record read (`run.json`, `summary.json`, `videos.json`, a task report).
pub const RECORD_LIMIT: u64 = 64 << 20;
/// The largest timing file read (a process's records; a 946-prompt shard writes under 1 MiB).
pub const TIMINGS_LIMIT: u64 = 256 << 20;

/// [`crate::bounded_read::open_regular`], its error a [`RecordError`].
pub fn open_regular(path: &Path, limit: u64) -> Result<(File, u64), RecordError> {
    Ok(crate::bounded_read::open_regular(path, limit)?)
}

/// [`crate::bounded_read::read_bounded`], its error a [`RecordError`].
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, RecordError> {
    Ok(crate::bounded_read::read_bounded(path, limit)?)
}

/// [`crate::bounded_read::read_bounded_text`], its error a [`RecordError`].
pub fn read_bounded_text(path: &Path, limit: u64) -> Result<String, RecordError> {
    Ok(crate::bounded_read::read_bounded_text(path, limit)?)
}

/// Reads a JSON file written by [`write_json_atomic`].
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, RecordError> {
    let text = read_bounded_text(path, RECORD_LIMIT)?;
    serde_json::from_str(&text).map_err(|source| RecordError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// The timing records of a run's processes (`timings/NNN.jsonl`, in process order), and what was
/// wrong with the files: a line that does not parse is skipped (its prompt then counts as not
/// done) and named in `damaged`, so that a damaged file costs one prompt, not the whole file.
#[derive(Debug, Default)]
pub struct ProcessTimings {
    pub records: Vec<TimingRecord>,
    /// `file:line: reason` of each skipped line, and the files they are in.
    pub damaged: Vec<String>,
    pub damaged_files: Vec<PathBuf>,
}

/// Reads every `timings/*.jsonl` of a run directory.
pub fn read_process_timings(run_dir: &Path) -> ProcessTimings {
    let mut files: Vec<PathBuf> = fs::read_dir(run_dir.join("timings"))
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let mut out = ProcessTimings::default();
    for file in files {
        let text = match read_bounded_text(&file, TIMINGS_LIMIT) {
            Ok(text) => text,
            Err(e) => {
                out.damaged.push(e.to_string());
                out.damaged_files.push(file);
                continue;
            }
        };
        let (records, bad) = parse_timing_lines(&text);
        out.records.extend(records);
        for (line, e) in &bad {
            out.damaged.push(format!("{}:{line}: {e}", file.display()));
        }
        if !bad.is_empty() {
            out.damaged_files.push(file);
        }
    }
    out
}

/// Rewrites a timing file with only its lines that parse (atomically); the damaged original is
/// kept beside it as `<name>.damaged` for inspection.
pub fn repair_timings(path: &Path) -> Result<(), RecordError> {
    let text = read_bounded(path, TIMINGS_LIMIT)?;
    let text = String::from_utf8_lossy(&text);
    let good: String = text
        .lines()
        .filter(|l| serde_json::from_str::<TimingRecord>(l).is_ok())
        .map(|l| format!("{l}\n"))
        .collect();
    let mut damaged = path.as_os_str().to_owned();
    damaged.push(".damaged");
    write_atomic(Path::new(&damaged), text.as_bytes())?;
    write_atomic(path, good.as_bytes())
}

/// Reads `timings.jsonl`. An unparseable final line is what a crash in the middle of an append
/// leaves, so it is ignored; an unparseable line anywhere else is an error.
pub fn read_timings(path: &Path) -> Result<Vec<TimingRecord>, RecordError> {
    let text = read_bounded_text(path, TIMINGS_LIMIT)?;
    match parse_timing_lines(&text) {
        (records, bad) if bad.is_empty() => Ok(records),
        (_, mut bad) => {
            let (line, source) = bad.swap_remove(0);
            Err(RecordError::Line {
                path: path.to_path_buf(),
                line,
                source,
            })
        }
    }
}

/// The records of a JSON-lines timing text, and the (1-based) line and error of each line that
/// does not parse. An unparseable last line is what a crash in the middle of an append leaves
/// (the next append cuts it), so it is dropped without a word; blank lines are skipped.
fn parse_timing_lines(text: &str) -> (Vec<TimingRecord>, Vec<(usize, serde_json::Error)>) {
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    let mut records = Vec::with_capacity(lines.len());
    let mut bad = Vec::new();
    for (i, (n, line)) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(r) => records.push(r),
            Err(_) if i + 1 == lines.len() => {}
            Err(e) => bad.push((n + 1, e)),
        }
    }
    (records, bad)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::results::records::{ProcessRole, TimedRegionEnd};

    pub(crate) fn record(prompt: u32, total: f64) -> TimingRecord {
        TimingRecord {
            session_run_s: None,
            process: 1,
            role: ProcessRole::Measurement,
            shard: None,
            slot: "gpu0".into(),
            prompt,
            text_encoding_s: 0.05,
            text_context: None,
            dit_s: total * 0.6,
            vae_s: total * 0.35,
            layout_s: total * 0.05,
            timed_total_s: total,
            peak_device_memory_bytes: Some(20 << 30),
            timed_region_ends: TimedRegionEnd::Uint8Frames,
            config_hash: "abc".into(),
            prompt_sha256: None,
            video: None,
            video_file: None,
            kept_bytes: Default::default(),
            process_start: None,
            one_time: None,
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn timings_round_trip_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TIMINGS_JSONL);
        let written: Vec<_> = (0..4).map(|i| record(i, 3.0 + f64::from(i))).collect();
        for r in &written {
            append_jsonl(&path, r).unwrap();
        }
        assert_eq!(read_timings(&path).unwrap(), written);
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 4);
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn a_torn_last_line_is_ignored_on_read_and_cut_on_append() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TIMINGS_JSONL);
        append_jsonl(&path, &record(0, 4.0)).unwrap();
        append_jsonl(&path, &record(1, 4.0)).unwrap();
        // A crash halfway through the third line.
        let third = serde_json::to_string(&record(2, 4.0)).unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&third.as_bytes()[..third.len() / 2]).unwrap();
        drop(f);
        let read = read_timings(&path).unwrap();
        assert_eq!(read.iter().map(|r| r.prompt).collect::<Vec<_>>(), [0, 1]);

        // The next append starts a clean line instead of gluing onto the fragment.
        append_jsonl(&path, &record(2, 4.0)).unwrap();
        let read = read_timings(&path).unwrap();
        assert_eq!(read.iter().map(|r| r.prompt).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 3);
    }

    #[test]
    fn a_bad_line_before_the_end_is_an_error_with_its_line_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TIMINGS_JSONL);
        let good = serde_json::to_string(&record(0, 4.0)).unwrap();
        fs::write(&path, format!("{good}\n{{\"process\": \n{good}\n")).unwrap();
        let err = read_timings(&path).unwrap_err();
        assert!(matches!(err, RecordError::Line { line: 2, .. }), "{err}");
    }

    #[test]
    fn atomic_json_write_replaces_and_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SUMMARY_JSON);
        write_json_atomic(&path, &record(0, 1.0)).unwrap();
        write_json_atomic(&path, &record(7, 2.0)).unwrap();
        let back: TimingRecord = read_json(&path).unwrap();
        assert_eq!(back, record(7, 2.0));
        assert_eq!(names(dir.path()), [SUMMARY_JSON]);
    }

    #[test]
    fn failed_atomic_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        // The target is a non-empty folder, so the rename fails after the temp file is written.
        let path = dir.path().join("blocked");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("inside"), "x").unwrap();
        let err = write_atomic(&path, b"new").unwrap_err();
        assert!(matches!(err, RecordError::Write { .. }));
        assert_eq!(names(dir.path()), ["blocked"]);
        assert!(!RecordError::is_not_found(&err));
    }

    #[test]
    fn missing_files_are_told_apart_from_corrupt_ones() {
        let dir = tempfile::tempdir().unwrap();
        let missing = read_json::<TimingRecord>(&dir.path().join("nope.json")).unwrap_err();
        assert!(missing.is_not_found());
        fs::write(dir.path().join("bad.json"), "{").unwrap();
        let bad = read_json::<TimingRecord>(&dir.path().join("bad.json")).unwrap_err();
        assert!(!bad.is_not_found());
        assert!(matches!(bad, RecordError::Json { .. }));
    }
}

//! A generation's evaluation: the `[evaluation]` command run on its complete videos, without a
//! shell, in the run's results folder, its output in `logs/evaluation.log`, and the scores it
//! wrote read back into `eval/scores.json` and the run's record.
//!
//! `runner apply` runs it once every selected prompt has its video (and alone, when an apply
//! finds them all made already); `runner evaluate RUN` runs it from the run's record. Any
//! failure (the command cannot start, exits non-zero, or leaves no valid scores file) ends the
//! run with status `evaluation_failed`; the videos are kept, and so are the scores and the
//! `eval/` folder of an earlier evaluation that succeeded: the command writes into
//! `eval.attempt/`, which replaces `eval/` only once its scores are read.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::lock::{Lock, LockError};
use super::outcome::{ApplyError, ApplyOptions, Outcome};
use crate::manifest::diagnostic::display_path;
use crate::manifest::evaluation::{
    CommandTemplate, CommandTemplateError, ScoresFile, ScoresFileError, quote,
};
use crate::manifest::{Kind, Resolved};
use crate::plan::Plan;
use crate::results::files::{RUN_JSON, RecordError, read_json, write_json_atomic};
use crate::results::names::VideoNames;
use crate::results::records::{RunRecord, RunStatus};
use crate::results::scores::{
    EVAL_ATTEMPT_DIR, EVAL_DIR, EVALUATION_LOG, EvaluationRecord, EvaluationStatus, SCORES_JSON,
    ScoresError, parse_scores,
};
use crate::results::time::now;
use crate::results::video_index;
use crate::results::video_index::VIDEOS_DIR;

/// Lines of the evaluation log a failure message quotes.
const LOG_TAIL_LINES: usize = 5;

/// Why an evaluation gave no scores: what went wrong and where to look. `tail` is the log's
/// last output as [`log_tail`] quotes it, `log` the log's path.
#[derive(Debug, thiserror::Error)]
enum EvaluationError {
    #[error("the recorded evaluation command is not valid: {0}")]
    Command(CommandTemplateError),
    #[error("the recorded evaluation.scores_file is not valid: {0}")]
    ScoresFileSetting(ScoresFileError),
    #[error("cannot create {}: {source}", display_path(path))]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot write {}: {source}", display_path(path))]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot list {}: {source}", display_path(path))]
    List { path: PathBuf, source: io::Error },
    #[error("cannot remove the earlier attempt {}: {source}", display_path(path))]
    RemoveEarlier { path: PathBuf, source: io::Error },
    #[error(
        "cannot put the new evaluation in place of {}: {source}",
        display_path(path)
    )]
    Replace { path: PathBuf, source: io::Error },
    #[error(
        "cannot start the evaluation command `{shown}`: {source}; install `{program}` \
         (docs/vbench.md) or fix evaluation.command"
    )]
    Start {
        shown: String,
        program: String,
        source: io::Error,
    },
    #[error("the evaluation command `{shown}` was interrupted")]
    Interrupted { shown: String },
    #[error(
        "the evaluation command `{shown}` ran past evaluation.timeout_seconds ({seconds} s) and \
         was stopped{tail}; its output is in {}",
        display_path(log)
    )]
    TimedOut {
        shown: String,
        seconds: u64,
        tail: String,
        log: PathBuf,
    },
    #[error("cannot wait for the evaluation command: {0}")]
    Wait(io::Error),
    #[error(
        "the evaluation command `{shown}` failed ({status}){tail}; its output is in {}",
        display_path(log)
    )]
    Failed {
        shown: String,
        status: ExitStatus,
        tail: String,
        log: PathBuf,
    },
    #[error(
        "the evaluation command exited 0 but wrote no scores file {}/{scores_file}{tail}; its \
         output is in {}",
        display_path(eval_dir),
        display_path(log)
    )]
    NoScoresFile {
        eval_dir: PathBuf,
        scores_file: ScoresFile,
        tail: String,
        log: PathBuf,
    },
    #[error(
        "the evaluation command wrote {} files matching {scores_file}: {}; give \
         evaluation.scores_file a pattern that matches one",
        files.len(),
        files.iter().map(|p| display_path(p)).collect::<Vec<_>>().join(", ")
    )]
    ManyScoresFiles {
        scores_file: ScoresFile,
        files: Vec<PathBuf>,
    },
    #[error("the scores file: {0}")]
    ReadScores(RecordError),
    #[error("the scores file {} {source}", display_path(path))]
    Scores { path: PathBuf, source: ScoresError },
    #[error("cannot keep the scores: {0}")]
    KeepScores(RecordError),
}

/// Runs the evaluation of the run in `run_dir` as its record describes it, recording its start
/// and its outcome in `run.json`: status `succeeded` with the scores, or `evaluation_failed`
/// with why. The caller holds the run's lock. Errors are those of writing the record.
pub fn evaluate_run(
    run_dir: &Path,
    record: &mut RunRecord,
) -> Result<RunStatus, crate::results::files::RecordError> {
    let Some(eval) = record.evaluation.as_mut() else {
        return Ok(record.status);
    };
    // An interruption stops the evaluation (its command too) and is recorded as one.
    super::signals::install_signal_handlers();
    eval.status = EvaluationStatus::Running;
    eval.started_at = Some(now());
    eval.ended_at = None;
    eval.failure = None;
    write_json_atomic(&run_dir.join(RUN_JSON), &*record)?;
    let eval = record.evaluation.as_mut().expect("set above");
    let outcome = run(run_dir, &record.run, eval);
    let eval = record.evaluation.as_mut().expect("set above");
    eval.ended_at = Some(now());
    let interrupted = super::signals::INTERRUPTED.load(Ordering::SeqCst);
    let status = match outcome {
        Err(_) if interrupted => {
            eval.status = EvaluationStatus::Interrupted;
            eval.failure = Some("interrupted".into());
            record.failure = None;
            RunStatus::Interrupted
        }
        Ok(scores) => {
            eval.status = EvaluationStatus::Succeeded;
            eval.scores = Some(scores);
            record.failure = None;
            RunStatus::Succeeded
        }
        Err(why) => {
            let why = why.to_string();
            eval.status = EvaluationStatus::Failed;
            eval.failure = Some(why.clone());
            record.failure = Some(why);
            RunStatus::EvaluationFailed
        }
    };
    record.status = status;
    record.ended_at = eval.ended_at.clone();
    write_json_atomic(&run_dir.join(RUN_JSON), &*record)?;
    Ok(status)
}

/// Runs the command and reads its scores; the error says what went wrong and where to look.
fn run(
    run_dir: &Path,
    run: &str,
    eval: &mut EvaluationRecord,
) -> Result<std::collections::BTreeMap<String, f64>, EvaluationError> {
    let template = CommandTemplate::new(eval.command.clone()).map_err(EvaluationError::Command)?;
    let scores_file = eval
        .scores_file
        .parse::<ScoresFile>()
        .map_err(EvaluationError::ScoresFileSetting)?;
    let run_dir = std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_path_buf());
    // The command writes into a folder of its own, empty, so that what an earlier attempt left
    // cannot pass for its scores, and `eval/` stays as the last evaluation that succeeded left
    // it until this one has scores.
    let eval_dir = run_dir.join(EVAL_ATTEMPT_DIR);
    if let Err(source) = fs::remove_dir_all(&eval_dir)
        && source.kind() != io::ErrorKind::NotFound
    {
        return Err(EvaluationError::RemoveEarlier {
            path: eval_dir,
            source,
        });
    }
    let logs = run_dir.join("logs");
    for d in [&eval_dir, &logs] {
        fs::create_dir_all(d).map_err(|source| EvaluationError::Create {
            path: d.clone(),
            source,
        })?;
    }
    let names_file = eval
        .names_file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let argv = template.render(|name| match name {
        "videos" => run_dir.join(VIDEOS_DIR).display().to_string(),
        "run_dir" => run_dir.display().to_string(),
        "run" => run.to_string(),
        "names_file" => names_file.clone(),
        "dimensions" => eval.dimensions.join(" "),
        "eval_dir" => eval_dir.display().to_string(),
        "scores_file" => eval_dir.join(scores_file.as_str()).display().to_string(),
        other => unreachable!("placeholder {other} is checked when the command is read"),
    });
    eval.argv = argv.clone();
    let log_path = logs.join(EVALUATION_LOG);
    let log = fs::File::create(&log_path).map_err(|source| EvaluationError::Create {
        path: log_path.clone(),
        source,
    })?;
    let err_log = log.try_clone().map_err(|source| EvaluationError::Write {
        path: log_path.clone(),
        source,
    })?;
    let words: Vec<String> = argv.iter().map(|a| quote(a)).collect();
    let shown = words.join(" ");
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .current_dir(&run_dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err_log);
    own_process_group(&mut command);
    let mut child = command.spawn().map_err(|source| EvaluationError::Start {
        shown: shown.clone(),
        program: argv[0].clone(),
        source,
    })?;
    let group = Group(child.id());
    // A limit past what the clock can hold (a record edited by hand; the manifest's is bounded)
    // sets no deadline rather than overflowing.
    let deadline = eval
        .timeout_seconds
        .and_then(|s| Instant::now().checked_add(Duration::from_secs(s)));
    // Waited for in steps, so that an interruption or the time limit stops the command and
    // whatever it started, rather than waiting out a scoring that may take hours.
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if super::signals::INTERRUPTED.load(Ordering::SeqCst) => {
                group.stop(&mut child);
                return Err(EvaluationError::Interrupted { shown });
            }
            Ok(None) if deadline.is_some_and(|d| Instant::now() >= d) => {
                group.stop(&mut child);
                return Err(EvaluationError::TimedOut {
                    shown,
                    seconds: eval.timeout_seconds.unwrap_or_default(),
                    tail: log_tail(&log_path),
                    log: log_path,
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => {
                group.stop(&mut child);
                return Err(EvaluationError::Wait(e));
            }
        }
    };
    // What the command left running (a scorer's workers) would go on writing into the run.
    group.stop_rest();
    if !status.success() {
        return Err(EvaluationError::Failed {
            shown,
            status,
            tail: log_tail(&log_path),
            log: log_path,
        });
    }
    let found = matching(&eval_dir, &scores_file)?;
    let path = match found.as_slice() {
        [one] => one.clone(),
        [] => {
            return Err(EvaluationError::NoScoresFile {
                eval_dir,
                scores_file,
                tail: log_tail(&log_path),
                log: log_path,
            });
        }
        many => {
            return Err(EvaluationError::ManyScoresFiles {
                scores_file,
                files: many.to_vec(),
            });
        }
    };
    let text = read_limited(&path)?;
    let scores = parse_scores(&text, &eval.dimensions)
        .map_err(|source| EvaluationError::Scores { path, source })?;
    write_json_atomic(&eval_dir.join(SCORES_JSON), &scores).map_err(EvaluationError::KeepScores)?;
    replace_eval_dir(&run_dir, &eval_dir)?;
    Ok(scores)
}

/// Puts the evaluation that has its scores (`attempt`) in place of the run's `eval/`: the
/// earlier folder is moved aside, the new one renamed in, then the earlier one removed.
fn replace_eval_dir(run_dir: &Path, attempt: &Path) -> Result<(), EvaluationError> {
    let current = run_dir.join(EVAL_DIR);
    let aside = run_dir.join(format!("{EVAL_DIR}.replaced"));
    let replace = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EvaluationError::Replace { path, source }
    };
    if let Err(e) = fs::remove_dir_all(&aside)
        && e.kind() != io::ErrorKind::NotFound
    {
        return Err(replace(&aside)(e));
    }
    match fs::rename(&current, &aside) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(replace(&current)(e)),
        _ => {}
    }
    fs::rename(attempt, &current).map_err(replace(&current))?;
    // The earlier output is no longer the run's; a folder that cannot be removed is only space.
    let _ = fs::remove_dir_all(&aside);
    Ok(())
}

/// How long the command's process group has to end after SIGTERM before it is killed, unless
/// a second interrupt asks for it at once.
const GRACE: Duration = Duration::from_secs(15);

/// Puts the command in a process group of its own, whose members the runner stops together,
/// and kills it if the runner dies first (even by SIGKILL).
fn own_process_group(command: &mut Command) {
    command.process_group(0);
    crate::os::end_with_parent(command, None);
}

/// The evaluation command's process group: its leader's pid.
struct Group(u32);

impl Group {
    fn signal(&self, signal: crate::os::Signal) -> bool {
        // The leader is not reaped yet, or the call fails once no member is left.
        crate::os::signal_group(self.0, signal)
    }

    /// Stops the whole group: SIGTERM, then SIGKILL after [`GRACE`] (or at a second interrupt),
    /// and reaps the leader.
    fn stop(&self, leader: &mut Child) {
        let interrupts = super::signals::INTERRUPTS.load(Ordering::SeqCst);
        self.signal(crate::os::Signal::Term);
        let until = Instant::now() + GRACE;
        while Instant::now() < until
            && super::signals::INTERRUPTS.load(Ordering::SeqCst) <= interrupts
            && self.signal(crate::os::Signal::Probe)
        {
            let _ = leader.try_wait();
            std::thread::sleep(Duration::from_millis(50));
        }
        self.signal(crate::os::Signal::Kill);
        let _ = leader.wait();
    }

    /// Stops what is left of the group once its leader has ended.
    fn stop_rest(&self) {
        if !self.signal(crate::os::Signal::Probe) {
            return;
        }
        self.signal(crate::os::Signal::Term);
        let until = Instant::now() + GRACE;
        while Instant::now() < until && self.signal(crate::os::Signal::Probe) {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.signal(crate::os::Signal::Kill);
    }
}

/// The largest scores file read (VBench's holds every video's result as well).
const SCORES_LIMIT: u64 = 256 << 20;

fn read_limited(path: &Path) -> Result<String, EvaluationError> {
    crate::results::files::read_bounded_text(path, SCORES_LIMIT)
        .map_err(EvaluationError::ReadScores)
}

/// The files of `eval_dir` that `scores` names: the one file, or those its `*` matches.
fn matching(eval_dir: &Path, scores: &ScoresFile) -> Result<Vec<PathBuf>, EvaluationError> {
    let path = eval_dir.join(scores.as_str());
    if !scores.is_pattern() {
        return Ok(if path.is_file() {
            vec![path]
        } else {
            Vec::new()
        });
    }
    let dir = path.parent().unwrap_or(eval_dir);
    let pattern = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (prefix, suffix) = pattern.split_once('*').expect("a pattern holds a `*`");
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(EvaluationError::List {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.len() >= prefix.len() + suffix.len()
                && name.starts_with(prefix)
                && name.ends_with(suffix)
        })
        .map(|e| e.path())
        .collect();
    found.sort();
    Ok(found)
}

/// The last lines of the log, as `: last output "…"`, or nothing when it is empty.
fn log_tail(log: &Path) -> String {
    let text = fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
    format!("; its last output: {}", tail.join(" | "))
}

/// Runs the evaluation of a run whose videos are complete; its outcome is the run's.
/// The applies of a run's different shards may each find every video made: the evaluation's own
/// lock (in `logs/`) lets one of them run it, and the others say where it runs.
pub(super) fn evaluated(run_dir: &Path, record: &mut RunRecord) -> Result<Outcome, ApplyError> {
    let outcome = |status, failures| Outcome {
        status,
        run_dir: run_dir.to_path_buf(),
        failures,
        slurm_job: None,
    };
    let _lock = match Lock::acquire(&run_dir.join("logs"), &record.run) {
        Ok(lock) => lock,
        Err(LockError::Held { pid, .. }) => {
            crate::say!(
                "note: every prompt has its video; the evaluation runs in another apply of this \
                 run (pid {pid}): `runner status {}` shows its outcome",
                record.run
            );
            return Ok(outcome(record.status, Vec::new()));
        }
        Err(e) => return Err(ApplyError::Io(e.to_string())),
    };
    // Another apply's evaluation may have ended while this one waited for its shards.
    if let Some(settings) = &record.evaluation
        && let Ok(now) = read_json::<RunRecord>(&run_dir.join(RUN_JSON))
        && now.scored_by(settings)
    {
        crate::say!("note: every prompt has its video and another apply of this run scored them");
        *record = now;
        return Ok(outcome(record.status, Vec::new()));
    }
    let status = super::evaluate::evaluate_run(run_dir, record)?;
    Ok(outcome(status, record.failure.iter().cloned().collect()))
}

/// A generation with an evaluation whose selected prompts all have their videos already: only
/// the evaluation runs (again, unless the last one succeeded with the same settings). `None`
/// when there are prompts to make, or no evaluation.
pub(super) fn evaluate_only(
    r: &Resolved,
    plan: &Plan,
    previous: &RunRecord,
    done: &BTreeSet<u32>,
    opts: &ApplyOptions,
) -> Result<Option<Outcome>, ApplyError> {
    let Some(settings) = crate::results::scores::EvaluationRecord::of(r) else {
        return Ok(None);
    };
    let all_done = plan
        .shards
        .iter()
        .flat_map(|sh| &sh.prompts)
        .all(|i| done.contains(i));
    if !all_done {
        return Ok(None);
    }
    let run_dir = &plan.run_dir;
    let mut record = previous.clone();
    if record.scored_by(&settings) {
        if !opts.quiet {
            crate::say!(
                "note: every prompt has its video and the evaluation has its scores; nothing to \
                 do (`runner evaluate {}` scores the videos again)",
                plan.run
            );
        }
        return Ok(Some(Outcome {
            status: RunStatus::Succeeded,
            run_dir: run_dir.clone(),
            failures: Vec::new(),
            slurm_job: None,
        }));
    }
    if !opts.quiet {
        crate::say!("note: every prompt has its video; only the evaluation runs");
    }
    write_video_index(r, run_dir)?;
    let mut fresh = settings;
    if let Some(old) = &record.evaluation
        && old.same_settings(&fresh)
    {
        fresh.scores = old.scores.clone();
    }
    record.evaluation = Some(fresh);
    evaluated(run_dir, &mut record).map(Some)
}

pub(super) fn saves_videos(r: &Resolved) -> bool {
    r.manifest.kind == Kind::Generation && r.manifest.outputs.save_videos
}

/// `videos.json`, the index of a run's videos, when the run saves them.
pub(super) fn write_video_index(r: &Resolved, run_dir: &Path) -> Result<(), ApplyError> {
    if saves_videos(r) {
        video_index::write(
            run_dir,
            r.prompts.as_deref().unwrap_or_default(),
            &VideoNames::of(r),
        )?;
    }
    Ok(())
}

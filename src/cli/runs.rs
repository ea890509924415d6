//! Managing the runs of a results folder: `runner runs` lists them, `runner diff A B` shows the
//! settings two runs differ in, and `runner clean RUN` removes what a run keeps outside its
//! results (its staging snapshot, its runtime state) or the whole run.

use std::path::{Path, PathBuf};

use clap::Args;

use super::out;
use crate::execute::lock::{Lock, LockError};
use crate::execute::slurm;
use crate::exit::{self, Failure};
use crate::manifest::diagnostic::display_path;
use crate::report::runs::columns;
use crate::report::{self, ReportError, SettingsDiff};
use crate::results::owner::{self, OWNER_FILE};
use crate::results::records::RunStatus;
use crate::results::{RUN_JSON, RunRecord, read_json};

#[derive(Debug, Args)]
pub struct RunsArgs {
    /// The results folder to list.
    #[arg(long, value_name = "DIR", default_value = "results")]
    pub results: PathBuf,
    /// Print the list as JSON: one object per run, with the chosen columns' values under
    /// `columns`.
    #[arg(long)]
    pub json: bool,
    /// The columns after run, kind, status and prompts, comma-separated (repeatable): a
    /// setting (method.clean_sigma), a statistic of the timed total (warm_mean, raw_mean,
    /// min_after_first, steady_tail_mean), a score (vbench.total, the mean of a run's scored
    /// dimensions, or vbench.<dimension>), or weights, started, ended. Default: the settings
    /// that differ among the listed runs, weights when any run's are not the released ones,
    /// warm_mean, and vbench.total when any run has scores.
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',')]
    pub columns: Vec<String>,
    /// Sort the runs by a column (or run, kind, status, prompts); a leading `-` sorts
    /// descending (--sort=-warm_mean). Runs without a value come last. Default: oldest first.
    #[arg(long, value_name = "COLUMN", allow_hyphen_values = true)]
    pub sort: Option<String>,
    /// List only the runs whose name matches: a glob when it has `*` or `?` ('sigma-*'), else
    /// a part of the name.
    #[arg(long, value_name = "PATTERN")]
    pub name: Option<String>,
    /// List only the runs of this kind.
    #[arg(long, value_parser = ["probe", "generation"])]
    pub kind: Option<String>,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The first run (a): a run name or a run directory.
    pub run_a: String,
    /// The second run (b).
    pub run_b: String,
    /// The results folder run names are looked up in.
    #[arg(long, value_name = "DIR", default_value = "results")]
    pub results: PathBuf,
    /// Print the differences as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CleanArgs {
    /// The run: a run name or a run directory.
    pub run: String,
    /// The results folder run names are looked up in.
    #[arg(long, value_name = "DIR", default_value = "results")]
    pub results: PathBuf,
    /// Also remove the run's runtime state (compiler caches, unpacked bundle).
    #[arg(long, conflicts_with = "all")]
    pub state: bool,
    /// Remove the whole run: its staging, its runtime state and its results folder.
    #[arg(long)]
    pub all: bool,
    /// Print what was removed as JSON: the run and one object per folder (`removed`,
    /// `absent` or `kept`), with notes.
    #[arg(long)]
    pub json: bool,
}

/// What `runner clean` did, folder by folder (`--json`).
#[derive(Debug, serde::Serialize)]
struct Cleaned {
    run: String,
    folders: Vec<CleanedFolder>,
    notes: Vec<String>,
}

/// One folder `runner clean` removed, found absent, or kept.
#[derive(Debug, serde::Serialize)]
struct CleanedFolder {
    /// `staging`, `runtime state`, `shared runtime state` or `results`.
    what: String,
    path: PathBuf,
    /// `removed`, `absent` or `kept`.
    action: &'static str,
}

fn json_text<T: serde::Serialize>(value: &T) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("records serialise");
    text.push('\n');
    text
}

/// Why a run cannot be cleaned.
#[derive(Debug, thiserror::Error)]
enum CleanError {
    #[error("run `{run}` is in progress (pid {pid}): its results folder {} is locked", display_path(.dir))]
    InProgress {
        run: String,
        pid: String,
        dir: PathBuf,
    },
    #[error(
        "{} holds the record of run `{recorded}`, not of a run `{folder}`: it is a copy of a run \
         folder, or one moved under another name, and the staging and runtime state its record \
         names are `{recorded}`'s; nothing was removed",
        display_path(.dir)
    )]
    NotThisRun {
        dir: PathBuf,
        folder: String,
        recorded: String,
    },
    #[error(
        "{} is a symbolic link to {}: `--all` would remove the link and leave the run; nothing \
         was removed",
        display_path(.dir),
        display_path(.target)
    )]
    Symlinked { dir: PathBuf, target: PathBuf },
    #[error(
        "run `{run}` does not own {}: {}; nothing was removed",
        if .folders.len() == 1 { "a folder its record names" } else { "folders its record names" },
        .folders.join("; ")
    )]
    NotOwned { run: String, folders: Vec<String> },
    #[error(
        "run `{run}`'s Slurm job {job} still has task(s) {} queued or running: they run from its \
         staging and write into its results; nothing was removed",
        .tasks.join(", ")
    )]
    SlurmJobLive {
        run: String,
        job: String,
        tasks: Vec<String>,
    },
    #[error(
        "cannot tell whether run `{run}`'s Slurm job {job} has ended: Slurm did not answer \
         ({why}), and not every task has reported its end; nothing was removed"
    )]
    SlurmJobUnknown {
        run: String,
        job: String,
        why: String,
    },
    #[error("{0}")]
    Report(#[from] ReportError),
    #[error("{0}")]
    Lock(LockError),
    #[error("cannot remove {}: {source}", display_path(.path))]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Failure for CleanError {
    fn hint(&self) -> Option<String> {
        match self {
            CleanError::InProgress { .. } => Some(
                "wait for its apply to end, or stop it (Ctrl-C), then clean it; nothing was \
                 removed"
                    .into(),
            ),
            CleanError::NotThisRun { dir, recorded, .. } => Some(format!(
                "remove the copy itself with `rm -r {}`; `runner clean {recorded}` cleans the \
                 run `{recorded}`",
                display_path(dir)
            )),
            CleanError::Symlinked { target, .. } => Some(format!(
                "clean the run where it is, `runner clean {} --all`, then remove the link",
                display_path(target)
            )),
            CleanError::NotOwned { .. } => Some(format!(
                "an apply marks each folder of its run outside the results folder \
                 ({OWNER_FILE}); a folder that carries another run's mark is that run's (clean \
                 that run), and one without a mark, if it is no run's, is yours to remove"
            )),
            CleanError::SlurmJobLive { run, job, .. } => Some(format!(
                "wait for the job to end (`runner status {run}` shows where it stands), or cancel \
                 it with `scancel {job}`; then clean the run"
            )),
            CleanError::SlurmJobUnknown { run, job, .. } => Some(format!(
                "clean the run once Slurm answers (`runner status {run}` asks it), or cancel the \
                 job with `scancel {job}` first"
            )),
            CleanError::Report(e) => e.hint(),
            _ => None,
        }
    }

    fn exit_code(&self) -> i32 {
        match self {
            CleanError::InProgress { .. }
            | CleanError::NotThisRun { .. }
            | CleanError::Symlinked { .. }
            | CleanError::NotOwned { .. }
            | CleanError::SlurmJobLive { .. }
            | CleanError::SlurmJobUnknown { .. } => exit::USAGE,
            CleanError::Report(e) => e.exit_code(),
            _ => exit::FAILURE,
        }
    }
}

pub fn run_runs(args: &RunsArgs) -> i32 {
    let rows = match report::list_runs(&args.results) {
        Ok(rows) => rows,
        Err(e) => {
            crate::say!(
                "error: cannot read the results folder {}: {e}",
                display_path(&args.results)
            );
            crate::say!("hint: run `runner runs` where results/ is, or pass --results DIR");
            return exit::USAGE;
        }
    };
    let mut rows = rows;
    // Columns are checked against every run of the folder, so that a filter that leaves out
    // the runs with a setting or a score does not make its column unknown.
    let available = columns::available(&rows);
    let (sort, descending) = match args.sort.as_deref() {
        Some(c) => match c.strip_prefix('-') {
            Some(c) => (Some(c.to_string()), true),
            None => (Some(c.to_string()), false),
        },
        None => (None, false),
    };
    let checked = columns::check(&args.columns, &available, false)
        .and_then(|()| columns::check(sort.as_slice(), &available, true));
    if let Err(e) = checked {
        crate::say!("error: unknown column `{}`", e.column);
        crate::say!(
            "hint: the columns are run, kind, status, prompts (for --sort), then {}",
            e.available.join(", ")
        );
        return exit::USAGE;
    }
    columns::filter(&mut rows, args.name.as_deref(), args.kind.as_deref());
    let shown = if args.columns.is_empty() {
        columns::default_columns(&rows)
    } else {
        args.columns.clone()
    };
    if let Some(column) = &sort {
        columns::sort(&mut rows, column, descending);
    }
    if args.json {
        return out(&json_text(&columns::json_rows(&rows, &shown)));
    }
    if rows.is_empty() {
        let filtered = args.name.is_some() || args.kind.is_some();
        return out(&format!(
            "no runs under {}/{}\n",
            display_path(&args.results),
            if filtered { " match --name/--kind" } else { "" }
        ));
    }
    out(&columns::table(&rows, &shown))
}

pub fn run_diff(args: &DiffArgs) -> i32 {
    let (a, b) = match (
        report::runs::load_named(&args.run_a, &args.results),
        report::runs::load_named(&args.run_b, &args.results),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return exit::report(&e),
    };
    let diff = SettingsDiff::of(&a, &b);
    if args.json {
        out(&json_text(&diff))
    } else {
        out(&diff.text())
    }
}

pub fn run_clean(args: &CleanArgs) -> i32 {
    match clean(args) {
        Ok(cleaned) if args.json => out(&json_text(&cleaned)),
        Ok(cleaned) => out(&clean_text(&cleaned)),
        Err(e) => exit::report(&e),
    }
}

/// What `clean` did, a line each.
fn clean_text(cleaned: &Cleaned) -> String {
    let mut t = String::new();
    for note in &cleaned.notes {
        t.push_str(&format!("note: {note}\n"));
    }
    for f in &cleaned.folders {
        let path = display_path(&f.path);
        t.push_str(&match f.action {
            "removed" => format!("removed {} {path}\n", f.what),
            "absent" => format!("no {} at {path}\n", f.what),
            _ => format!("kept {} {path}: other runs use it too\n", f.what),
        });
    }
    t
}

/// Removes what `args` asks for, holding the run's lock so that no apply of it starts
/// meanwhile; returns what it did, a line each. Before anything is removed, every folder to
/// remove is checked to be the run's own (`results::owner`): inside its results folder, or
/// marked as that folder's run's; otherwise nothing is removed.
fn clean(args: &CleanArgs) -> Result<Cleaned, CleanError> {
    let dir = report::locate(&args.run, &args.results)?;
    // Recorded folders are absolute: so is the run's, for telling which are inside it.
    let dir = std::path::absolute(&dir).unwrap_or(dir);
    let record: RunRecord = match read_json(&dir.join(RUN_JSON)) {
        Ok(r) => r,
        Err(e) if e.is_not_found() => {
            return Err(ReportError::NoRunRecord { dir: dir.clone() }.into());
        }
        Err(e) => return Err(ReportError::Record(e).into()),
    };
    // A run's folder has the run's name: a folder of another name holding its record is a
    // copy, whose record names the original's folders.
    let folder = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if folder != record.run {
        return Err(CleanError::NotThisRun {
            dir,
            folder,
            recorded: record.run,
        });
    }
    if args.all && dir.is_symlink() {
        let target = dir.canonicalize().unwrap_or_else(|_| dir.clone());
        return Err(CleanError::Symlinked { dir, target });
    }
    check_no_live_job(&dir, &record)?;
    let _lock = match Lock::acquire(&dir, &record.run) {
        Ok(lock) => lock,
        Err(LockError::Held { pid, .. }) => {
            return Err(CleanError::InProgress {
                run: record.run.clone(),
                pid,
                dir,
            });
        }
        Err(e) => return Err(CleanError::Lock(e)),
    };
    let mut done = Cleaned {
        run: record.run.clone(),
        folders: Vec::new(),
        notes: Vec::new(),
    };
    let (staging, state) = places(&record, &dir);
    let mut removals: Vec<(PathBuf, &str)> = Vec::new();
    match staging {
        Some(staging) => removals.push((staging, "staging")),
        None => done.notes.push(format!(
            "the record of run `{}` does not say where its staging is (an earlier runner \
             wrote it); remove `<staging.work_root>/{}` yourself",
            record.run, record.run
        )),
    }
    if args.state || args.all {
        removals.extend(state.into_iter().map(|f| (f, "runtime state")));
    }
    let refused: Vec<String> = removals
        .iter()
        .filter(|(path, _)| std::fs::symlink_metadata(path).is_ok())
        .filter_map(|(path, what)| {
            let why = owner::check(path, &record.run, &dir).err()?;
            Some(format!("its {what} {} ({why})", display_path(path)))
        })
        .collect();
    if !refused.is_empty() {
        return Err(CleanError::NotOwned {
            run: record.run.clone(),
            folders: refused,
        });
    }
    for (path, what) in &removals {
        remove(path, what, &mut done)?;
        // `runtime_state/` of the results folder, once its last slot's folder is gone.
        if *what == "runtime state"
            && let Some(parent) = path.parent().filter(|p| p.starts_with(&dir) && *p != dir)
        {
            let _ = std::fs::remove_dir(parent);
        }
    }
    if (args.state || args.all)
        && let Some(shared) = record.places.as_ref().and_then(|p| p.shared_state.as_ref())
    {
        done.folders.push(CleanedFolder {
            what: "shared runtime state".into(),
            path: shared.clone(),
            action: "kept",
        });
    }
    if args.all {
        remove(&dir, "results", &mut done)?;
    }
    Ok(done)
}

/// Refuses to clean a run one of whose Slurm jobs (a `--detach`ed apply's, or a shard apply's)
/// still has tasks queued or running: a queued task holds no lock yet, and would start without
/// its staging. When Slurm does not answer, a run whose record says it is running is refused
/// too (its job may live); one whose apply recorded its end is not (that apply saw every task
/// end).
fn check_no_live_job(dir: &Path, record: &RunRecord) -> Result<(), CleanError> {
    for job in record.slurm_jobs() {
        match slurm::standing(dir, job) {
            slurm::Standing::Ended => {}
            slurm::Standing::Unknown(_) if record.status != RunStatus::Running => {}
            slurm::Standing::Live(live) => {
                return Err(CleanError::SlurmJobLive {
                    run: record.run.clone(),
                    job: job.job_id.clone(),
                    tasks: live
                        .iter()
                        .map(|(t, s)| format!("{}_{t} ({})", job.job_id, s.state))
                        .collect(),
                });
            }
            slurm::Standing::Unknown(why) => {
                return Err(CleanError::SlurmJobUnknown {
                    run: record.run.clone(),
                    job: job.job_id.clone(),
                    why,
                });
            }
        }
    }
    Ok(())
}

/// The run's staging folder (when its record says) and its runtime state folders.
fn places(record: &RunRecord, dir: &Path) -> (Option<PathBuf>, Vec<PathBuf>) {
    match &record.places {
        Some(p) => (Some(p.staging.clone()), p.runtime_state.clone()),
        // Records of earlier runners: a generation's isolated state is inside its folder.
        None => (None, vec![dir.join("runtime_state")]),
    }
}

/// Removes `path` (a folder) if it exists, saying so in `done`.
fn remove(path: &Path, what: &str, done: &mut Cleaned) -> Result<(), CleanError> {
    let mut record = |action| {
        done.folders.push(CleanedFolder {
            what: what.to_string(),
            path: path.to_path_buf(),
            action,
        })
    };
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            record("absent");
            Ok(())
        }
        Err(source) => Err(CleanError::Remove {
            path: path.to_path_buf(),
            source,
        }),
        Ok(_) => {
            std::fs::remove_dir_all(path).map_err(|source| CleanError::Remove {
                path: path.to_path_buf(),
                source,
            })?;
            record("removed");
            Ok(())
        }
    }
}

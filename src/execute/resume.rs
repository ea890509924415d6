//! What an earlier apply of the same run left: the prompts already complete (resume), and what
//! `runner plan` says an apply would do with it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::apply::ApplyError;
use super::lock::Lock;
use super::preflight::{probe_state_preflight, short_list};
use crate::manifest::diagnostic::display_path;
use crate::manifest::{Kind, Resolved};
use crate::plan::Plan;
use crate::results::arrays::ArrayKind;
use crate::results::files::{RUN_JSON, read_json, read_process_timings};
use crate::results::records::{ProcessRole, RunRecord, RunStatus, TimingRecord};

/// What a previous apply of the same run left.
#[derive(Default)]
pub(super) struct Completed {
    /// The prompts already complete.
    pub done: BTreeSet<u32>,
    /// Its run record (a generation's, which this apply resumes; a probe is measured afresh).
    pub previous: Option<RunRecord>,
    /// Videos to remove before their prompts are made again: made from a prompt's earlier text,
    /// or cut short.
    pub stale_videos: Vec<PathBuf>,
    /// Timing files with lines that do not parse, to be repaired once the run holds its lock.
    pub damaged_timings: Vec<PathBuf>,
    /// What an apply tells before it starts (`note: …` / `warning: …`); `runner plan`, which
    /// changes nothing, leaves them out.
    pub notes: Vec<String>,
}

pub(super) fn completed(
    r: &Resolved,
    run_dir: &Path,
    config_hash: &str,
) -> Result<Completed, ApplyError> {
    let run_json = run_dir.join(RUN_JSON);
    if !run_json.exists() {
        return Ok(Completed::default());
    }
    let previous: RunRecord = read_json(&run_json)?;
    let mut notes = Vec::new();
    if let (RunStatus::Running, Some(job)) = (previous.status, &previous.slurm) {
        notes.push(format!(
            "note: run `{}` continues from its Slurm job {}, which has ended",
            previous.run, job.job_id
        ));
    } else if previous.status == RunStatus::Running && !Lock::is_held(run_dir) {
        notes.push(format!(
            "note: the last apply of run `{}` was killed before it finished; this one continues it",
            previous.run
        ));
    }
    if r.manifest.kind == Kind::Probe {
        return Ok(Completed {
            notes,
            ..Completed::default()
        });
    }
    // Records of runners before the hash's version 2 carry the legacy form of the same hash.
    let legacy = crate::results::hash::legacy_config_hash(r);
    let same_config = |hash: &str| hash == config_hash || hash == legacy;
    if !same_config(&previous.config_hash) {
        return Err(ApplyError::refused(
            format!(
                "{} holds run `{}` made with a different configuration ({})",
                display_path(run_dir),
                previous.run,
                what_differs(&previous, r)
            ),
            "give this configuration its own run name (`name = \"…\"` or --set name=…)",
        ));
    }
    // A prompt is done when a record of its latest output has this configuration, the prompt's
    // current text, its video and the arrays the manifest keeps; the latest record decides (a
    // prompt made again after its text changed has a newer record).
    let prompts = r.prompts.as_deref().unwrap_or_default();
    let timings = read_process_timings(run_dir);
    for line in &timings.damaged {
        notes.push(format!(
            "warning: {line}: not a timing record; the line is skipped (its prompt is made again) and the file repaired"
        ));
    }
    let mut latest: BTreeMap<u32, TimingRecord> = BTreeMap::new();
    for rec in timings.records {
        if rec.role == ProcessRole::Shard {
            latest.insert(rec.prompt, rec);
        }
    }
    let mut done = BTreeSet::new();
    let mut changed = Vec::new();
    let mut stale_videos = Vec::new();
    let names = crate::results::names::VideoNames::of(r);
    let mut renamed = Vec::new();
    for (prompt, rec) in &latest {
        // A video under another name than the prompt's now (the names file or the naming
        // changed) is made again under its name, and the old file goes.
        let expected = names.name(*prompt).map(|n| format!("videos/{n}"));
        let text = prompts
            .get(*prompt as usize)
            .map(|t| crate::results::prompt_hash(t));
        if let Some(v) = &rec.video
            && expected.as_ref().is_some_and(|e| e != v)
            && rec.prompt_sha256 == text
        {
            renamed.push(*prompt);
            stale_videos.push(run_dir.join(v));
            continue;
        }
        let video_ok = match &rec.video {
            Some(v) => match crate::video::check_mp4(&run_dir.join(v)) {
                Ok(()) => true,
                Err(_) if !run_dir.join(v).exists() => false,
                Err(e) => {
                    notes.push(format!(
                        "warning: the video of prompt {prompt}, {}, is damaged ({e}); it is made again",
                        display_path(&run_dir.join(v))
                    ));
                    stale_videos.push(run_dir.join(v));
                    false
                }
            },
            None => !r.manifest.outputs.save_videos,
        };
        let text = prompts
            .get(*prompt as usize)
            .map(|t| crate::results::prompt_hash(t));
        let same_text = rec.prompt_sha256.is_some() && rec.prompt_sha256 == text;
        if rec.prompt_sha256.is_some() && !same_text {
            changed.push(*prompt);
            stale_videos.extend(rec.video.as_ref().map(|v| run_dir.join(v)));
        }
        // Latents or frames asked for now but not kept then (or lost): the prompt is made again.
        let arrays_ok = ArrayKind::ALL
            .into_iter()
            .filter(|kind| kind.kept_by(&r.manifest.outputs))
            .all(|kind| {
                run_dir
                    .join(kind.dir())
                    .join(kind.file_name(*prompt))
                    .is_file()
            });
        if same_config(&rec.config_hash) && video_ok && same_text && arrays_ok {
            done.insert(*prompt);
        }
    }
    if !renamed.is_empty() {
        notes.push(format!(
            "warning: the video(s) of prompt(s) {} in {} have another name than their prompts \
             get now (prompts.names_file or outputs.video_naming changed); they are generated \
             again",
            short_list(&renamed),
            display_path(run_dir),
        ));
    }
    if !changed.is_empty() {
        notes.push(format!(
            "warning: the text of prompt(s) {} in {} differs from the text their videos in {} were made from; they are generated again",
            short_list(&changed),
            display_path(&r.paths.prompts_file),
            display_path(run_dir),
        ));
    }
    Ok(Completed {
        done,
        previous: Some(previous),
        stale_videos,
        damaged_timings: timings.damaged_files,
        notes,
    })
}

/// What an `apply` of a plan finds under its results folder, as `runner plan` tells it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PreviousRun {
    /// Nothing there yet.
    New,
    /// A generation of the same configuration: apply resumes it, skipping the `done` prompts
    /// of the `selected`; `evaluates` when its evaluation runs after them (set, and not yet
    /// succeeded with the same settings).
    Resumes {
        done: usize,
        selected: usize,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        evaluates: bool,
    },
    /// A probe's record (its runtime state reused, as the manifest asks): apply measures the
    /// probe afresh.
    Remeasures,
    /// Apply would refuse the run, with this message and hint.
    Refused {
        message: String,
        hint: Option<String>,
    },
}

/// What an `apply` of `plan` would find under its results folder.
pub fn previous_run(r: &Resolved, plan: &Plan) -> PreviousRun {
    let selected: BTreeSet<u32> = plan
        .selected_shards()
        .flat_map(|sh| sh.prompts.iter().copied())
        .collect();
    let refused = |e: ApplyError| PreviousRun::Refused {
        message: e.to_string(),
        hint: crate::exit::Failure::hint(&e),
    };
    if let Err(e) = probe_state_preflight(r) {
        return refused(e);
    }
    match completed(r, &plan.run_dir, &crate::results::config_hash(r)) {
        Err(e) => refused(e),
        Ok(Completed {
            done,
            previous: Some(previous),
            ..
        }) => PreviousRun::Resumes {
            done: done.intersection(&selected).count(),
            selected: selected.len(),
            evaluates: crate::results::scores::EvaluationRecord::of(r)
                .is_some_and(|settings| !settings.scored(&previous)),
        },
        // `completed` gives no record to resume for a probe's (measured afresh) or for none.
        Ok(_) if plan.run_dir.join(RUN_JSON).exists() => PreviousRun::Remeasures,
        Ok(_) => PreviousRun::New,
    }
}

/// The output-deciding settings (`method.*`, `noise.*`) whose values differ between a run's
/// record and the resolved manifest, as `key: old → new`; when none does, the bundle's contents.
fn what_differs(previous: &RunRecord, r: &Resolved) -> String {
    let mut differs = Vec::new();
    for (key, setting) in &r.settings {
        if !(key.starts_with("method.") || key.starts_with("noise.")) {
            continue;
        }
        let now = serde_json::to_value(&setting.value).unwrap_or(serde_json::Value::Null);
        let before = previous.settings.get(key).map(|s| &s.value);
        if before != Some(&now) {
            let before = before.map_or("unset".to_string(), |v| v.to_string());
            differs.push(format!("{key}: {before} → {now}"));
        }
    }
    if differs.is_empty() {
        "the asset bundle's contents differ".into()
    } else {
        differs.join(", ")
    }
}

//! What an earlier apply of the same run left: the prompts already complete (resume), and what
//! `runner plan` says an apply would do with it.

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::lock::Lock;
use super::outcome::ApplyError;
use super::preflight::{probe_state_preflight, short_list};
use crate::manifest::diagnostic::display_path;
use crate::manifest::{Kind, Resolved};
use crate::plan::Plan;
use crate::results::arrays::ArrayKind;
use crate::results::completeness::{Completeness, Expected, PromptState};
use crate::results::files::{RUN_JSON, read_json};
use crate::results::records::{RunRecord, RunStatus};

/// What a previous apply of the same run left.
#[derive(Default)]
pub(super) struct Completed {
    /// The prompts already complete.
    pub done: BTreeSet<u32>,
    /// Its run record (a generation's, which this apply resumes; a probe is measured afresh).
    pub previous: Option<RunRecord>,
    /// Videos to remove before their prompts are made again (made from a prompt's earlier text,
    /// under another name, or cut short), with their prompts.
    pub stale_videos: Vec<(u32, PathBuf)>,
    /// Timing files with lines that do not parse, to be repaired once the run holds its lock.
    pub damaged_timings: Vec<PathBuf>,
    /// What an apply tells before it starts (`note: …` / `warning: …`); `runner plan`, which
    /// changes nothing, leaves them out.
    pub notes: Vec<String>,
}

pub(super) fn completed(
    r: &Resolved,
    plan: &Plan,
    config_hash: &str,
) -> Result<Completed, ApplyError> {
    let run_dir = plan.run_dir.as_path();
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
    // Whether each prompt is complete is decided in one place (`results::completeness`), as
    // `runner status`, `runner runs` and `runner evaluate` decide it.
    let expected = expected_of(r, config_hash, &legacy);
    let planned = plan.shards.iter().flat_map(|sh| sh.prompts.iter().copied());
    let state = Completeness::of(run_dir, planned, &expected);
    for line in &state.damaged {
        notes.push(format!(
            "warning: {line}: not a timing record; the line is skipped (its prompt is made again) and the file repaired"
        ));
    }
    let done = state.complete();
    let mut changed = Vec::new();
    let mut stale_videos = Vec::new();
    let mut renamed = Vec::new();
    for (&prompt, s) in &state.states {
        match s {
            PromptState::Renamed { .. } => renamed.push(prompt),
            PromptState::OtherText { .. } => changed.push(prompt),
            PromptState::DamagedVideo { video, why } => notes.push(format!(
                "warning: the video of prompt {prompt}, {}, is damaged ({why}); it is made again",
                display_path(&run_dir.join(video))
            )),
            PromptState::OtherVideo { video, why } => notes.push(format!(
                "warning: the video of prompt {prompt}, {}, is not the one its worker wrote \
                 ({why}); it is made again",
                display_path(&run_dir.join(video))
            )),
            _ => {}
        }
        if let Some(v) = s.stale_video() {
            stale_videos.push((prompt, run_dir.join(v)));
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
        damaged_timings: state.damaged_files,
        notes,
    })
}

/// What a complete prompt of the run `r` has: a record of this configuration (or its legacy
/// form) and the prompt's current text, its video under its current name, the arrays kept.
pub(super) fn expected_of(r: &Resolved, config_hash: &str, legacy: &str) -> Expected {
    let m = &r.manifest;
    Expected {
        config_hashes: vec![config_hash.to_string(), legacy.to_string()],
        prompts: Some(r.prompts.clone().unwrap_or_default()),
        videos: m.kind == Kind::Generation && m.outputs.save_videos,
        names: Some(crate::results::names::VideoNames::of(r)),
        arrays: ArrayKind::ALL
            .into_iter()
            .filter(|kind| m.outputs.keeps(*kind))
            .collect(),
    }
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
    match completed(r, plan, &crate::results::config_hash(r)) {
        Err(e) => refused(e),
        Ok(Completed {
            done,
            previous: Some(previous),
            ..
        }) => PreviousRun::Resumes {
            done: done.intersection(&selected).count(),
            selected: selected.len(),
            evaluates: crate::results::scores::EvaluationRecord::of(r)
                .is_some_and(|settings| !previous.scored_by(&settings)),
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

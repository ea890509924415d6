//! Whether each prompt of a generation is complete, decided in one place ([`prompt_state`]) for
//! every command that asks: `runner apply` (which prompts to make again, and whether a run, or an
//! `apply --shard`'s whole run, has succeeded), `runner plan`, `runner status`, `runner runs`
//! and `runner evaluate`.
//!
//! A prompt is complete when the latest timing record of its shard processes has the run's
//! configuration and the prompt's current text, its video (when the run writes videos) is a
//! whole MP4 under the name the prompt has now and the very video its worker wrote (its size,
//! and its sha256 where the file is not untouched since: [`VideoFile`]), and each array the run
//! keeps is there with the size it was written with.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::arrays::ArrayKind;
use super::files::read_process_timings;
use super::names::VideoNames;
use super::records::{ProcessRole, RunRecord, TimingRecord};
#[cfg(doc)]
use super::video_file::VideoFile;

/// What a complete prompt of a run has.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    /// The configuration hashes its record may carry (the run's, and the legacy form of it).
    pub config_hashes: Vec<String>,
    /// Each prompt's current text, by global index; `None` when it is not known (the prompt file
    /// cannot be read), and then not checked.
    pub prompts: Option<Vec<String>>,
    /// Whether the run writes a video per prompt.
    pub videos: bool,
    /// The video name each prompt has now; `None` when only the record is known, whose video
    /// name is then taken as it is.
    pub names: Option<VideoNames>,
    /// The kinds of arrays the run keeps per prompt.
    pub arrays: Vec<ArrayKind>,
}

/// Where one prompt stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptState {
    Complete,
    /// No timing record of a shard process.
    NotMade,
    /// Its record is of another configuration.
    OtherConfig,
    /// Its video was made from another text than the prompt has now.
    OtherText {
        video: Option<String>,
    },
    /// Its video has another name than the prompt gets now.
    Renamed {
        video: String,
    },
    /// The run writes videos, and the record names none or the file is gone.
    NoVideo,
    /// The video is there and not a whole MP4.
    DamagedVideo {
        video: String,
        why: String,
    },
    /// The file under the video's name is not the video its worker wrote (swapped, overwritten,
    /// zero-filled).
    OtherVideo {
        video: String,
        why: String,
    },
    /// A kept array is missing, or of another size than written.
    Array {
        kind: ArrayKind,
        why: String,
    },
}

impl PromptState {
    pub fn is_complete(&self) -> bool {
        *self == PromptState::Complete
    }

    /// The video (relative to the run folder) to remove before the prompt is made again: one
    /// made from another text, under another name, or damaged.
    pub fn stale_video(&self) -> Option<&str> {
        match self {
            PromptState::OtherText { video } => video.as_deref(),
            PromptState::Renamed { video }
            | PromptState::DamagedVideo { video, .. }
            | PromptState::OtherVideo { video, .. } => Some(video),
            _ => None,
        }
    }

    /// Why the prompt is not complete, in a few words.
    pub fn why(&self) -> String {
        match self {
            PromptState::Complete => "complete".into(),
            PromptState::NotMade => "not made".into(),
            PromptState::OtherConfig => "made with another configuration".into(),
            PromptState::OtherText { .. } => "its text changed since its video was made".into(),
            PromptState::Renamed { .. } => "its video has another name now".into(),
            PromptState::NoVideo => "its video is missing".into(),
            PromptState::DamagedVideo { why, .. } => format!("its video is damaged ({why})"),
            PromptState::OtherVideo { why, .. } => {
                format!("its video is not the one recorded ({why})")
            }
            PromptState::Array { kind, why } => format!("its kept {} {why}", kind.dir()),
        }
    }
}

/// Where prompt `prompt` of the run in `run_dir` stands, given its latest shard record.
pub fn prompt_state(
    run_dir: &Path,
    prompt: u32,
    record: Option<&TimingRecord>,
    expected: &Expected,
) -> PromptState {
    let Some(rec) = record else {
        return PromptState::NotMade;
    };
    let text = expected
        .prompts
        .as_ref()
        .map(|p| p.get(prompt as usize).map(|t| super::prompt_hash(t)));
    // Records of earlier runners carry no prompt hash: such a prompt is made again.
    let same_text = match &text {
        Some(now) => rec.prompt_sha256.is_some() && rec.prompt_sha256 == *now,
        None => true,
    };
    let wanted_name = expected
        .names
        .as_ref()
        .and_then(|n| n.name(prompt))
        .map(|n| format!("{}/{n}", super::video_index::VIDEOS_DIR));
    if let Some(v) = &rec.video
        && wanted_name.as_ref().is_some_and(|w| w != v)
        && same_text
    {
        return PromptState::Renamed { video: v.clone() };
    }
    if rec.prompt_sha256.is_some() && !same_text {
        return PromptState::OtherText {
            video: rec.video.clone(),
        };
    }
    if expected.videos {
        let Some(v) = &rec.video else {
            return PromptState::NoVideo;
        };
        let path = run_dir.join(v);
        if std::fs::symlink_metadata(&path).is_err() {
            return PromptState::NoVideo;
        }
        if let Err(why) = crate::video::check_mp4(&path) {
            return PromptState::DamagedVideo {
                video: v.clone(),
                why: why.to_string(),
            };
        }
        // A whole MP4 may still be another prompt's, or another run's.
        if let Some(why) = rec.video_file.as_ref().and_then(|f| f.differs(&path)) {
            return PromptState::OtherVideo {
                video: v.clone(),
                why,
            };
        }
    }
    if !same_text {
        return PromptState::OtherText { video: None };
    }
    for &kind in &expected.arrays {
        let path = run_dir.join(kind.dir()).join(kind.file_name(prompt));
        let why = match std::fs::metadata(&path) {
            Err(_) => Some("is missing".to_string()),
            Ok(m) if !m.is_file() => Some("is not a regular file".to_string()),
            Ok(m) => match rec.kept_bytes.get(kind.dir()) {
                Some(&written) if m.len() != written => Some(format!(
                    "holds {} bytes where {written} were written",
                    m.len()
                )),
                None if m.len() == 0 => Some("is empty".to_string()),
                _ => None,
            },
        };
        if let Some(why) = why {
            return PromptState::Array { kind, why };
        }
    }
    if !expected.config_hashes.contains(&rec.config_hash) {
        return PromptState::OtherConfig;
    }
    PromptState::Complete
}

/// Where every planned prompt, and every other prompt with a record, stands in the run in
/// `run_dir`, from its timing records.
#[derive(Debug, Default)]
pub struct Completeness {
    /// The prompts the run's plan makes.
    pub planned: BTreeSet<u32>,
    /// The state of each planned or recorded prompt.
    pub states: BTreeMap<u32, PromptState>,
    /// `file:line: reason` of each timing line that does not parse, and the files they are in.
    pub damaged: Vec<String>,
    pub damaged_files: Vec<PathBuf>,
}

impl Completeness {
    /// The state of every prompt of `planned` and of every prompt with a record; the latest
    /// shard record of a prompt decides (a prompt made again after its text changed has a newer
    /// record).
    pub fn of(
        run_dir: &Path,
        planned: impl IntoIterator<Item = u32>,
        expected: &Expected,
    ) -> Completeness {
        let timings = read_process_timings(run_dir);
        let mut latest: BTreeMap<u32, TimingRecord> = BTreeMap::new();
        for rec in timings.records {
            if rec.role == ProcessRole::Shard {
                latest.insert(rec.prompt, rec);
            }
        }
        let planned: BTreeSet<u32> = planned.into_iter().collect();
        let states = planned
            .iter()
            .chain(latest.keys())
            .map(|&p| (p, prompt_state(run_dir, p, latest.get(&p), expected)))
            .collect();
        Completeness {
            planned,
            states,
            damaged: timings.damaged,
            damaged_files: timings.damaged_files,
        }
    }

    /// The complete prompts, planned or not (a resume under another `prompts.indices` skips
    /// them too).
    pub fn complete(&self) -> BTreeSet<u32> {
        self.states
            .iter()
            .filter(|(_, s)| s.is_complete())
            .map(|(p, _)| *p)
            .collect()
    }

    /// How many planned prompts are complete.
    pub fn planned_complete(&self) -> usize {
        self.planned
            .iter()
            .filter(|p| self.states.get(p).is_some_and(PromptState::is_complete))
            .count()
    }

    /// The planned prompts that are not complete, with their states.
    pub fn missing(&self) -> Vec<(u32, &PromptState)> {
        self.planned
            .iter()
            .filter_map(|p| Some((*p, self.states.get(p)?)))
            .filter(|(_, s)| !s.is_complete())
            .collect()
    }

    /// The incomplete prompts in words: `3 (its video is missing), 7 (not made)`, the first few.
    pub fn missing_text(&self) -> String {
        const SHOWN: usize = 5;
        let missing = self.missing();
        let mut parts: Vec<String> = missing
            .iter()
            .take(SHOWN)
            .map(|(p, s)| format!("{p} ({})", s.why()))
            .collect();
        if missing.len() > SHOWN {
            parts.push(format!("and {} more", missing.len() - SHOWN));
        }
        parts.join(", ")
    }
}

/// What a complete prompt of the run that `record` describes has, as far as the record and the
/// files it names tell: its configuration hash, its prompt file read again now (a prompt whose
/// text changed since is not complete), and the outputs its settings keep.
pub fn expected_of_record(record: &RunRecord) -> Expected {
    let flag = |key: &str| {
        record
            .settings
            .get(key)
            .is_some_and(|s| s.value == serde_json::Value::Bool(true))
    };
    let prompts = record
        .prompts_file
        .as_ref()
        .and_then(|f| crate::manifest::inputs::read_prompt_file(f).ok());
    Expected {
        config_hashes: vec![record.config_hash.clone()],
        prompts,
        videos: flag("outputs.save_videos"),
        names: None,
        arrays: ArrayKind::ALL
            .into_iter()
            .filter(|k| flag(&format!("outputs.save_{}", k.dir())))
            .collect(),
    }
}

/// The prompts of a generation's shards as its record lists them; `None` for a record of an
/// earlier runner whose shards' prompts are not contiguous (only their count is known).
pub fn planned_prompts(record: &RunRecord) -> Option<Vec<u32>> {
    let mut all = Vec::new();
    for p in record
        .processes
        .iter()
        .filter(|p| p.role == ProcessRole::Shard)
    {
        if !p.indices.is_empty() {
            all.extend(&p.indices);
            continue;
        }
        match (p.first_prompt, p.last_prompt) {
            (Some(a), Some(b)) if (b - a) as usize + 1 == p.prompts => all.extend(a..=b),
            (None, None) if p.prompts == 0 => {}
            _ => return None,
        }
    }
    all.sort_unstable();
    all.dedup();
    Some(all)
}

/// Where each planned prompt of the generation in `run_dir` stands, from its record and its
/// files; `None` for a record that does not list its prompts ([`planned_prompts`]).
pub fn of_record(run_dir: &Path, record: &RunRecord) -> Option<Completeness> {
    let planned = planned_prompts(record)?;
    Some(Completeness::of(
        run_dir,
        planned,
        &expected_of_record(record),
    ))
}

/// How many of a generation's planned prompts are complete, and how many it plans, from its
/// record and its files.
pub fn record_counts(run_dir: &Path, record: &RunRecord) -> (usize, usize) {
    match of_record(run_dir, record) {
        Some(c) => (c.planned_complete(), c.planned.len()),
        None => {
            let expected = expected_of_record(record);
            // Only the count is known: the prompts that have records are judged.
            let planned: usize = record
                .processes
                .iter()
                .filter(|p| p.role == ProcessRole::Shard)
                .map(|p| p.prompts)
                .sum();
            let recorded: BTreeSet<u32> = read_process_timings(run_dir)
                .records
                .iter()
                .filter(|r| r.role == ProcessRole::Shard)
                .map(|r| r.prompt)
                .collect();
            let done = Completeness::of(run_dir, recorded, &expected)
                .complete()
                .len();
            (done.min(planned), planned)
        }
    }
}

//! `results/<RUN>/videos.json`: which video holds which prompt. One entry per prompt whose video
//! is complete: its global index, its (extended) prompt, its standard prompt (with a names
//! file), the file name in `videos/` and the sha256 of the MP4.
//!
//! It lies beside `videos/`, not in it: VBench's standard mode takes the file extension it looks
//! up from the first file it lists in the videos folder, so that folder holds the MP4s only.
//! It is written whole and atomically at the end of every apply, from the timing records (a
//! prompt's latest record names its video), so a resumed run's index is that of all its videos.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::files::{RecordError, read_json, read_process_timings, write_json_atomic};
use super::names::VideoNames;
use super::records::ProcessRole;
use crate::manifest::load::hex;

pub const VIDEOS_JSON: &str = "videos.json";
/// The folder of a generation's videos, in the run folder.
pub const VIDEOS_DIR: &str = "videos";

/// The largest video hashed into the index.
const VIDEO_LIMIT: u64 = 4 << 30;

/// One complete video.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VideoEntry {
    /// Global prompt index.
    pub index: u32,
    /// The prompt the video was generated from.
    pub prompt: String,
    /// The standard prompt of the names file, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standard_prompt: Option<String>,
    /// The file name in `videos/`.
    pub name: String,
    pub sha256: String,
    pub bytes: u64,
}

impl VideoEntry {
    /// The video's file in the run folder `run_dir`, or `None` where its name is not a plain file
    /// name (empty, `.`, `..`, or holding a `/` or a NUL byte): `videos.json` is read like any
    /// file of a results folder, which may come from anywhere, and what it names stays inside the
    /// run's `videos/` folder.
    pub fn file_in(&self, run_dir: &Path) -> Option<PathBuf> {
        let n = self.name.as_str();
        let plain = !matches!(n, "" | "." | "..") && !n.contains(['/', '\0']);
        plain.then(|| run_dir.join(VIDEOS_DIR).join(n))
    }
}

/// `videos.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VideoIndex {
    /// By global prompt index.
    pub videos: Vec<VideoEntry>,
}

/// Writes the index of the run in `run_dir` from its timing records: every prompt whose latest
/// record names the video it has now (`names`), made from its current text, and whose file
/// exists.
pub fn write(
    run_dir: &Path,
    prompts: &[String],
    names: &VideoNames,
) -> Result<VideoIndex, RecordError> {
    let mut latest = BTreeMap::new();
    for rec in read_process_timings(run_dir).records {
        if rec.role == ProcessRole::Shard {
            latest.insert(rec.prompt, rec);
        }
    }
    let mut index = VideoIndex::default();
    for (prompt, rec) in latest {
        let (Some(video), Some(name), Some(text)) = (
            rec.video.as_deref(),
            names.name(prompt),
            prompts.get(prompt as usize),
        ) else {
            continue;
        };
        let same_text = rec.prompt_sha256.as_deref() == Some(&super::prompt_hash(text));
        if video != format!("{VIDEOS_DIR}/{name}") || !same_text {
            continue;
        }
        let path = run_dir.join(video);
        let bytes = match super::files::read_bounded(&path, VIDEO_LIMIT) {
            Ok(b) => b,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        index.videos.push(VideoEntry {
            index: prompt,
            prompt: text.clone(),
            standard_prompt: names.standard_prompt(prompt).map(str::to_string),
            name: name.to_string(),
            sha256: hex(&Sha256::digest(&bytes)),
            bytes: bytes.len() as u64,
        });
    }
    write_json_atomic(&run_dir.join(VIDEOS_JSON), &index)?;
    Ok(index)
}

/// Reads `videos.json`.
pub fn read(run_dir: &Path) -> Result<VideoIndex, RecordError> {
    read_json(&run_dir.join(VIDEOS_JSON))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a plain file name is a video of the run: nothing `videos.json` says leads outside
    /// its `videos/` folder.
    #[test]
    fn a_video_is_a_plain_file_in_the_runs_videos_folder() {
        let entry = |name: &str| VideoEntry {
            index: 0,
            prompt: "a cat".into(),
            standard_prompt: None,
            name: name.into(),
            sha256: String::new(),
            bytes: 0,
        };
        let run = Path::new("/r/results/run");
        for name in ["0000.mp4", "a cat #1?.mp4", "javascript:alert(1)", "..mp4"] {
            assert_eq!(
                entry(name).file_in(run),
                Some(run.join("videos").join(name)),
                "{name}"
            );
        }
        for name in [
            "",
            ".",
            "..",
            "../0000.mp4",
            "../../other/videos/0000.mp4",
            "/etc/passwd",
            "sub/0000.mp4",
            "0000.mp4\0",
        ] {
            assert_eq!(entry(name).file_in(run), None, "{name:?}");
        }
    }
}

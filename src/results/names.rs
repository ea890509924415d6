//! The file names of a generation's videos, and the check that no two prompts of a run share
//! one (run before anything is written).
//!
//! Three forms:
//! - `indexed`: `NNNN.mp4`, the global prompt index.
//! - `vbench` with a names file (`prompts.names_file`, line-aligned with the prompt file): the
//!   standard VBench prompt of the line followed by `-<sample>.mp4`, which is what VBench's
//!   standard mode looks up (`f"{prompt_en}-{i}.mp4"`, i in 0..4, the whole prompt). The first
//!   occurrence of a standard prompt in the prompt file is sample 0, a later one sample 1 and so
//!   on, so two prompts never share a file. A standard prompt that cannot be a file name as it
//!   is (see `fix_standard`) is renamed by a fixed rule that keeps it unique.
//! - `vbench` without a names file: the extended prompt itself, cut at 180 characters,
//!   `-0.mp4` (names two prompts could share are refused by [`VideoNames::shared`]).

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

use crate::manifest::load::hex;
use crate::manifest::{Kind, Resolved, VideoNaming};

/// A file name's longest length on common Linux file systems, in bytes.
pub const NAME_MAX: usize = 255;
/// Characters of the prompt kept in a `vbench` name without a names file.
const PROMPT_CHARS: usize = 180;
/// Hex digits of the standard prompt's sha256 that a renamed video's name carries.
const HASH_DIGITS: usize = 8;

/// The video file name of prompt `index` with text `text`, without a names file. `indexed`:
/// `NNNN.mp4`. `vbench`: the prompt and the sample index, `<prompt>-0.mp4`, with `/` and NUL
/// written as `_`, surrounding white space trimmed, and the prompt cut at 180 characters or at a
/// character boundary that keeps the name within 255 bytes of UTF-8, whichever is shorter.
pub fn video_name(naming: VideoNaming, index: u32, text: &str) -> String {
    match naming {
        VideoNaming::Indexed => format!("{index:04}.mp4"),
        VideoNaming::Vbench => {
            let suffix = "-0.mp4";
            let clean = text
                .trim()
                .chars()
                .map(|c| if c == '/' || c == '\0' { '_' } else { c });
            let mut name = String::new();
            for c in clean.take(PROMPT_CHARS) {
                if name.len() + c.len_utf8() + suffix.len() > NAME_MAX {
                    break;
                }
                name.push(c);
            }
            name + suffix
        }
    }
}

/// A prompt whose standard prompt could not be its video's name as it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Renamed {
    /// Global prompt index.
    pub index: u32,
    /// The standard prompt of the names file.
    pub standard: String,
    /// The name its video gets.
    pub name: String,
    /// Why: `contains "/"`, `starts with "."`, `is 300 bytes long` …
    pub reasons: Vec<String>,
}

/// The video name of every prompt of a prompt file (by global index), and the prompts whose
/// standard prompt had to be renamed.
#[derive(Debug, Clone, Default)]
pub struct VideoNames {
    names: Vec<String>,
    /// The standard prompt of each prompt, with a names file.
    standard: Option<Vec<String>>,
    /// The sample index of each prompt's video, with a names file.
    samples: Vec<u32>,
    pub renamed: Vec<Renamed>,
}

/// How many samples of each prompt VBench's standard mode reads (`-0` to `-4`).
pub const VBENCH_SAMPLES: u32 = 5;

impl VideoNames {
    /// The names of a run's videos: a probe's are indexed (its debug videos), a generation's
    /// follow `outputs.video_naming` and the names file.
    pub fn of(r: &Resolved) -> VideoNames {
        let prompts = r.prompts.as_deref().unwrap_or_default();
        let naming = match r.manifest.kind {
            Kind::Probe => VideoNaming::Indexed,
            Kind::Generation => r.manifest.outputs.video_naming,
        };
        match (naming, r.names.as_deref()) {
            (VideoNaming::Vbench, Some(standard)) => Self::standard(standard),
            _ => VideoNames {
                names: (0..prompts.len() as u32)
                    .map(|i| video_name(naming, i, &prompts[i as usize]))
                    .collect(),
                standard: None,
                samples: Vec::new(),
                renamed: Vec::new(),
            },
        }
    }

    /// Names from the standard prompts of a names file, one a prompt.
    pub fn standard(standard: &[String]) -> VideoNames {
        let mut samples: HashMap<&str, u32> = HashMap::new();
        let mut names = Vec::with_capacity(standard.len());
        let mut sample_of = Vec::with_capacity(standard.len());
        let mut renamed = Vec::new();
        for (index, line) in standard.iter().enumerate() {
            let prompt = line.trim();
            let sample = samples.entry(prompt).or_insert(0);
            let (name, reasons) = standard_name(prompt, *sample);
            sample_of.push(*sample);
            *sample += 1;
            if !reasons.is_empty() {
                renamed.push(Renamed {
                    index: index as u32,
                    standard: prompt.to_string(),
                    name: name.clone(),
                    reasons,
                });
            }
            names.push(name);
        }
        VideoNames {
            names,
            standard: Some(standard.iter().map(|s| s.trim().to_string()).collect()),
            samples: sample_of,
            renamed,
        }
    }

    /// The video name of prompt `index`.
    pub fn name(&self, index: u32) -> Option<&str> {
        self.names.get(index as usize).map(String::as_str)
    }

    /// The standard prompt of prompt `index`, with a names file.
    pub fn standard_prompt(&self, index: u32) -> Option<&str> {
        self.standard
            .as_ref()?
            .get(index as usize)
            .map(String::as_str)
    }

    /// A warning naming the prompts of `selected` whose videos are samples VBench's standard
    /// mode never reads (the sixth and later occurrence of a standard prompt); `None` when there
    /// are none or no names file.
    pub fn unread_samples(&self, selected: impl IntoIterator<Item = u32>) -> Option<String> {
        let unread: Vec<String> = selected
            .into_iter()
            .filter(|&i| {
                self.samples
                    .get(i as usize)
                    .is_some_and(|&s| s >= VBENCH_SAMPLES)
            })
            .map(|i| i.to_string())
            .collect();
        (!unread.is_empty()).then(|| {
            format!(
                "warning: prompts {} repeat a standard prompt more than {VBENCH_SAMPLES} times: \
                 their videos are made, but VBench's standard mode reads samples 0-{} only",
                unread.join(", "),
                VBENCH_SAMPLES - 1
            )
        })
    }

    /// Prompts of `selected` whose videos would share a file name, as a message naming each name
    /// and its prompts; `None` when every name is unique.
    pub fn shared(&self, selected: impl IntoIterator<Item = u32>) -> Option<String> {
        let mut by_name: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for index in selected {
            if let Some(name) = self.name(index) {
                by_name.entry(name).or_default().push(index);
            }
        }
        let shared: Vec<String> = by_name
            .into_iter()
            .filter(|(_, indices)| indices.len() > 1)
            .map(|(name, indices)| {
                let list: Vec<String> = indices.iter().map(u32::to_string).collect();
                format!("prompts {} would all be `{name}`", list.join(", "))
            })
            .collect();
        (!shared.is_empty()).then(|| shared.join("; "))
    }
}

/// The name of sample `sample` of the standard prompt `prompt`, and why it had to be renamed
/// (empty when it is VBench's `<prompt>-<sample>.mp4`).
fn standard_name(prompt: &str, sample: u32) -> (String, Vec<String>) {
    let suffix = format!("-{sample}.mp4");
    let (clean, mut reasons) = fix_standard(prompt);
    if reasons.is_empty() && prompt.len() + suffix.len() <= NAME_MAX {
        return (format!("{prompt}{suffix}"), reasons);
    }
    let full = prompt.len() + suffix.len();
    if full > NAME_MAX {
        reasons.push(format!(
            "`<prompt>{suffix}` is {full} bytes of UTF-8, more than the {NAME_MAX} a file name holds"
        ));
    }
    let tag = format!(
        "~{}",
        &hex(&Sha256::digest(prompt.as_bytes()))[..HASH_DIGITS]
    );
    let room = NAME_MAX - tag.len() - suffix.len();
    let mut cut = String::new();
    for c in clean.chars() {
        if cut.len() + c.len_utf8() > room {
            break;
        }
        cut.push(c);
    }
    (format!("{cut}{tag}{suffix}"), reasons)
}

/// The standard prompt with what cannot be in a file name replaced: `/` and NUL become `_`, and
/// so do leading dots (a leading dot hides the file, and the runner's temporary files start with
/// one); with the reasons, empty when nothing was replaced.
fn fix_standard(prompt: &str) -> (String, Vec<String>) {
    let mut reasons = Vec::new();
    if prompt.contains('/') {
        reasons.push("contains `/`".to_string());
    }
    if prompt.contains('\0') {
        reasons.push("contains NUL".to_string());
    }
    let dots = prompt.len() - prompt.trim_start_matches('.').len();
    if dots > 0 {
        reasons.push("starts with `.`".to_string());
    }
    let clean: String = prompt
        .char_indices()
        .map(|(i, c)| {
            if c == '/' || c == '\0' || i < dots {
                '_'
            } else {
                c
            }
        })
        .collect();
    (clean, reasons)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vbench_names_are_the_prompt_and_never_a_path() {
        assert_eq!(
            video_name(VideoNaming::Vbench, 3, " a cat/dog on a skateboard "),
            "a cat_dog on a skateboard-0.mp4"
        );
        assert_eq!(video_name(VideoNaming::Indexed, 3, "x"), "0003.mp4");
    }

    /// A long prompt of three-byte characters is cut to fit the file system, not at 180
    /// characters (540 bytes).
    #[test]
    fn long_utf8_prompts_fit_in_255_bytes() {
        let cjk = "猫".repeat(300);
        let name = video_name(VideoNaming::Vbench, 0, &cjk);
        assert!(name.len() <= 255, "{}", name.len());
        assert!(name.ends_with("-0.mp4"));
        assert_eq!(name.len(), 83 * 3 + 6);
        let ascii = "a".repeat(300);
        assert_eq!(video_name(VideoNaming::Vbench, 0, &ascii).len(), 180 + 6);
    }

    fn without_names(prompts: &[&str]) -> VideoNames {
        VideoNames {
            names: prompts
                .iter()
                .enumerate()
                .map(|(i, p)| video_name(VideoNaming::Vbench, i as u32, p))
                .collect(),
            standard: None,
            samples: Vec::new(),
            renamed: Vec::new(),
        }
    }

    #[test]
    fn samples_past_the_fifth_are_named_as_unread() {
        let standard: Vec<String> = std::iter::repeat_n("a cat".to_string(), 7)
            .chain(["a dog".to_string()])
            .collect();
        let names = VideoNames::standard(&standard);
        assert_eq!(names.name(6), Some("a cat-6.mp4"));
        let w = names.unread_samples(0..8).unwrap();
        assert!(w.contains("prompts 5, 6 repeat"), "{w}");
        assert_eq!(names.unread_samples([0, 4, 7]), None);
    }

    #[test]
    fn prompts_that_would_share_a_video_are_named() {
        let long = "x".repeat(200);
        let longer = format!("{long} and more");
        let prompts = [
            "a cat",
            "a dog",
            " a cat ",
            "a/b",
            "a_b",
            long.as_str(),
            longer.as_str(),
        ];
        let names = without_names(&prompts);
        let message = names.shared(0..7).unwrap();
        assert!(
            message.contains("prompts 0, 2 would all be `a cat-0.mp4`"),
            "{message}"
        );
        assert!(message.contains("prompts 3, 4"), "{message}");
        assert!(message.contains("prompts 5, 6"), "{message}");
        assert!(!message.contains("prompts 1"), "{message}");
        // Only the selected prompts count.
        assert_eq!(names.shared([0, 1, 3]), None);
    }

    fn lines(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// VBench's standard mode looks up `f"{prompt_en}-{i}.mp4"`: the whole prompt, punctuation
    /// and quotes as they are, and a repeated prompt's later occurrence is its next sample.
    #[test]
    fn standard_names_are_what_vbench_looks_up() {
        let long = "A beautiful coastal beach in spring, waves lapping on sand by Hokusai, in the \
                    style of Ukiyo";
        let standard = lines(&[
            long,
            "a person's \"quoted\" (shot), 100% real; ok?",
            "The bund Shanghai, oil painting",
            long,
            "The bund Shanghai, oil painting ",
            long,
        ]);
        let names = VideoNames::standard(&standard);
        assert_eq!(names.name(0), Some(format!("{long}-0.mp4").as_str()));
        assert_eq!(
            names.name(1),
            Some("a person's \"quoted\" (shot), 100% real; ok?-0.mp4")
        );
        assert_eq!(names.name(2), Some("The bund Shanghai, oil painting-0.mp4"));
        assert_eq!(names.name(3), Some(format!("{long}-1.mp4").as_str()));
        assert_eq!(names.name(4), Some("The bund Shanghai, oil painting-1.mp4"));
        assert_eq!(names.name(5), Some(format!("{long}-2.mp4").as_str()));
        assert!(names.renamed.is_empty());
        assert_eq!(names.shared(0..6), None);
        assert_eq!(
            names.standard_prompt(4),
            Some("The bund Shanghai, oil painting")
        );
    }

    #[test]
    fn unusable_standard_prompts_are_renamed_uniquely() {
        let cjk = "猫が".repeat(60); // 360 bytes
        let accents = "é".repeat(130); // 260 bytes
        let standard = lines(&[
            "a/b",
            "a_b",
            "a\0b",
            ".hidden",
            "..hidden",
            "_hidden",
            &cjk,
            &format!("{cjk}x"),
            &accents,
            &cjk,
        ]);
        let names = VideoNames::standard(&standard);
        let all: Vec<&str> = (0..10).map(|i| names.name(i).unwrap()).collect();
        for name in &all {
            assert!(name.len() <= NAME_MAX, "{name}");
            assert!(!name.contains('/') && !name.contains('\0'), "{name:?}");
            assert!(!name.starts_with('.'), "{name}");
        }
        assert_eq!(names.shared(0..10), None, "{all:?}");
        // Usable prompts keep their VBench name; renamed ones carry a hash of the prompt.
        assert_eq!(all[1], "a_b-0.mp4");
        assert_eq!(all[5], "_hidden-0.mp4");
        let hash = &hex(&Sha256::digest(b"a/b"))[..8];
        assert_eq!(all[0], format!("a_b~{hash}-0.mp4"));
        assert!(all[3].starts_with("_hidden~"), "{}", all[3]);
        assert!(all[4].starts_with("__hidden~"), "{}", all[4]);
        // The repeated long prompt keeps its own name with the next sample.
        assert_eq!(all[9], all[6].replace("-0.mp4", "-1.mp4"));
        let renamed: Vec<u32> = names.renamed.iter().map(|r| r.index).collect();
        assert_eq!(renamed, [0, 2, 3, 4, 6, 7, 8, 9]);
        let r = &names.renamed[0];
        assert_eq!(r.reasons, ["contains `/`"]);
        assert!(names.renamed[4].reasons[0].contains("bytes of UTF-8"));
    }
}

//! The file names of a generation's videos, and the check that no two prompts of a run share
//! one (run before anything is written).

use std::collections::BTreeMap;

use crate::manifest::VideoNaming;

/// A file name's longest length on common Linux file systems, in bytes.
const NAME_MAX: usize = 255;
/// Characters of the prompt kept in a `vbench` name.
const PROMPT_CHARS: usize = 180;

/// The video file name of prompt `index` with text `text`. `indexed`: `NNNN.mp4`. `vbench`: the
/// prompt and the sample index, `<prompt>-0.mp4`, with `/` and NUL written as `_`, surrounding
/// white space trimmed, and the prompt cut at 180 characters or at a character boundary that keeps
/// the name within 255 bytes of UTF-8, whichever is shorter.
pub fn video_name(naming: VideoNaming, index: u32, text: &str) -> String {
    match naming {
        VideoNaming::Indexed => format!("{index:04}.mp4"),
        VideoNaming::Vbench => {
            let suffix = "-0.mp4";
            let mut name = String::new();
            let clean = text
                .trim()
                .chars()
                .map(|c| if c == '/' || c == '\0' { '_' } else { c });
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

/// Prompts of `prompts` (global index, text) whose videos would share a file name, as a message
/// naming each name and its prompts; `None` when every name is unique.
pub fn shared_names<'a>(
    naming: VideoNaming,
    prompts: impl IntoIterator<Item = (u32, &'a str)>,
) -> Option<String> {
    let mut by_name: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (index, text) in prompts {
        by_name
            .entry(video_name(naming, index, text))
            .or_default()
            .push(index);
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

    #[test]
    fn prompts_that_would_share_a_video_are_named() {
        let long = "x".repeat(200);
        let longer = format!("{long} and more");
        let prompts = [
            (0, "a cat"),
            (1, "a dog"),
            (2, " a cat "),
            (3, "a/b"),
            (4, "a_b"),
            (5, long.as_str()),
            (6, longer.as_str()),
        ];
        let message = shared_names(VideoNaming::Vbench, prompts).unwrap();
        assert!(
            message.contains("prompts 0, 2 would all be `a cat-0.mp4`"),
            "{message}"
        );
        assert!(message.contains("prompts 3, 4"), "{message}");
        assert!(message.contains("prompts 5, 6"), "{message}");
        assert!(!message.contains("prompts 1"), "{message}");
        assert_eq!(shared_names(VideoNaming::Indexed, prompts), None);
    }
}

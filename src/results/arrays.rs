//! The arrays a run keeps per measured prompt when its manifest asks (`outputs.save_latents`,
//! `outputs.save_frames`): raw little-endian files under the run folder, one per prompt, named
//! by its global index, which `runner compare` reads to measure one run against another on the
//! same noise. `runner worker --save-latents DIR --save-frames DIR` writes the same files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use crate::vocab::ArrayKind;

/// The files of `kind` in `dir` (the run folder's `latents/` or `frames/`) by prompt index; empty
/// when the folder does not exist. Temporary files of an interrupted write (dot-prefixed) and
/// anything else are passed over.
pub fn kept_files(dir: &Path, kind: ArrayKind) -> BTreeMap<u32, PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let index = kind.index_of(e.file_name().to_str()?)?;
            Some((index, e.path()))
        })
        .collect()
}

/// How many prompts' arrays of each kind the run in `run_dir` kept, for the kinds it kept any of.
pub fn kept_counts(run_dir: &Path) -> BTreeMap<&'static str, usize> {
    ArrayKind::ALL
        .into_iter()
        .map(|kind| {
            (
                kind.dir(),
                kept_files(&run_dir.join(kind.dir()), kind).len(),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// File names round-trip through their index, and nothing else is read as one.
    #[test]
    fn kept_file_names_carry_the_prompt_index() {
        for (kind, index, name) in [
            (ArrayKind::Latents, 0, "latents_0.f32"),
            (ArrayKind::Latents, 945, "latents_945.f32"),
            (ArrayKind::Frames, 12, "frames_12.u8"),
        ] {
            assert_eq!(kind.file_name(index), name);
            assert_eq!(kind.index_of(name), Some(index));
        }
        for (kind, name) in [
            (ArrayKind::Latents, "frames_1.u8"),
            (ArrayKind::Frames, "latents_1.f32"),
            (ArrayKind::Latents, "latents_.f32"),
            (ArrayKind::Latents, "latents_01.f32"),
            (ArrayKind::Latents, "latents_+1.f32"),
            (ArrayKind::Latents, "latents_1.f32.tmp"),
            (ArrayKind::Frames, ".frames_1.u8.tmp12-0"),
            (ArrayKind::Frames, "frames_99999999999.u8"),
        ] {
            assert_eq!(kind.index_of(name), None, "{name}");
        }
    }

    /// A folder's files are listed by index; temporaries and other files are not, and a missing
    /// folder has none.
    #[test]
    fn kept_files_are_listed_by_prompt_index() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "frames_10.u8",
            "frames_2.u8",
            ".frames_3.u8.tmp1-0",
            "notes.txt",
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        std::fs::create_dir(dir.path().join("frames_4.u8")).unwrap();
        let files = kept_files(dir.path(), ArrayKind::Frames);
        assert_eq!(files.keys().copied().collect::<Vec<_>>(), [2, 10]);
        assert_eq!(files[&2], dir.path().join("frames_2.u8"));
        assert!(kept_files(&dir.path().join("none"), ArrayKind::Frames).is_empty());
    }
}

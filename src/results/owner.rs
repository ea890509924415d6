//! Which folders a run owns, by identity. A run owns its results folder and what lies inside it;
//! a folder of it elsewhere (its staging snapshot `<work_root>/<run>`, runtime state under
//! another `cache.run_state_root`) carries an owner mark, written by the apply that uses it:
//! the run's name and the identity of its results folder (device and inode, which a copy of the
//! folder does not share, and its path for people). `runner clean` removes a folder only when it
//! is inside the run's folder or its mark names that very folder; a recorded absolute path alone
//! never suffices, since a copied `run.json` names the original's folders.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::files::{RecordError, read_json, write_json_atomic};

/// The owner mark inside a folder a run owns outside its results folder.
pub const OWNER_FILE: &str = ".unstep-owner.json";

/// What an owner mark says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerMark {
    pub run: String,
    /// The run's results folder when the mark was written (for people; the identity decides).
    pub run_dir: PathBuf,
    /// The device and inode of the run's results folder.
    pub dev: u64,
    pub ino: u64,
}

/// Why a folder is not a run's to remove, in the words that follow the folder's name.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error("it is outside the run's results folder and carries no owner mark ({OWNER_FILE})")]
    Unmarked,
    #[error("its owner mark cannot be read: {0}")]
    MarkUnreadable(RecordError),
    /// The mark names another run: its name and results folder.
    #[error("its owner mark names run `{run}` of {}", run_dir.display())]
    OtherRun { run: String, run_dir: PathBuf },
    /// The mark names another results folder (`run_dir`) of the run `run`.
    #[error(
        "its owner mark names the results folder {} of run `{run}`, and this folder is another \
         (a copy, or another run of the same name)",
        run_dir.display()
    )]
    OtherFolder { run: String, run_dir: PathBuf },
    #[error("the run's folder cannot be read: {0}")]
    RunDirUnreadable(std::io::Error),
}

/// The device and inode of `dir` (a symbolic link followed).
fn identity(dir: &Path) -> std::io::Result<(u64, u64)> {
    let meta = std::fs::metadata(dir)?;
    Ok((meta.dev(), meta.ino()))
}

/// Marks `folder` as the run `run`'s, whose results folder is `run_dir`.
pub fn mark(folder: &Path, run: &str, run_dir: &Path) -> Result<(), RecordError> {
    let (dev, ino) = identity(run_dir).map_err(|source| RecordError::Read {
        path: run_dir.to_path_buf(),
        source,
    })?;
    let run_dir = std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_path_buf());
    std::fs::create_dir_all(folder).map_err(|source| RecordError::Write {
        path: folder.to_path_buf(),
        source,
    })?;
    write_json_atomic(
        &folder.join(OWNER_FILE),
        &OwnerMark {
            run: run.to_string(),
            run_dir,
            dev,
            ino,
        },
    )
}

/// Whether `folder` (which exists) is the run `run`'s to remove, the run's results folder
/// being `run_dir`: `Err` says why not.
pub fn check(folder: &Path, run: &str, run_dir: &Path) -> Result<(), OwnerError> {
    // Inside the run's folder as named (absolute, `..` taken away lexically: a run may be named
    // `../r` and its folders recorded as absolute paths), and also once symbolic links are
    // resolved.
    let lexical = |p: &Path| {
        crate::manifest::paths::normalize(&std::path::absolute(p).unwrap_or_else(|_| p.into()))
    };
    if lexical(folder).starts_with(lexical(run_dir))
        && let (Ok(f), Ok(d)) = (folder.canonicalize(), run_dir.canonicalize())
        && f.starts_with(&d)
    {
        return Ok(());
    }
    let mark: OwnerMark = match read_json(&folder.join(OWNER_FILE)) {
        Ok(m) => m,
        Err(e) if e.is_not_found() => return Err(OwnerError::Unmarked),
        Err(e) => return Err(OwnerError::MarkUnreadable(e)),
    };
    if mark.run != run {
        return Err(OwnerError::OtherRun {
            run: mark.run,
            run_dir: mark.run_dir,
        });
    }
    match identity(run_dir) {
        Ok((dev, ino)) if (dev, ino) == (mark.dev, mark.ino) => Ok(()),
        Ok(_) => Err(OwnerError::OtherFolder {
            run: run.to_string(),
            run_dir: mark.run_dir,
        }),
        Err(e) => Err(OwnerError::RunDirUnreadable(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_folder_is_its_runs_and_not_a_copys() {
        let root = tempfile::tempdir().unwrap();
        let run_dir = root.path().join("results/r");
        let copy = root.path().join("results-copy/r");
        std::fs::create_dir_all(&run_dir).unwrap();
        std::fs::create_dir_all(&copy).unwrap();
        let staging = root.path().join("work/r");
        assert!(check(&staging, "r", &run_dir).is_err(), "no mark yet");
        mark(&staging, "r", &run_dir).unwrap();
        check(&staging, "r", &run_dir).unwrap();
        let other = check(&staging, "r", &copy).unwrap_err().to_string();
        assert!(other.contains("this folder is another"), "{other}");
        let name = check(&staging, "s", &run_dir).unwrap_err().to_string();
        assert!(name.contains("names run `r`"), "{name}");
        // Inside the run's own folder, no mark is needed.
        std::fs::create_dir(run_dir.join("runtime_state")).unwrap();
        check(&run_dir.join("runtime_state"), "r", &run_dir).unwrap();
    }

    /// A run named through `..` (`runner clean ../r --state`) owns what lies inside its folder,
    /// whose recorded path has no `..`.
    #[test]
    fn a_run_named_through_dotdot_owns_its_folder() {
        let root = tempfile::tempdir().unwrap();
        let run_dir = root.path().join("results/r");
        std::fs::create_dir_all(run_dir.join("runtime_state")).unwrap();
        std::fs::create_dir_all(root.path().join("results/x")).unwrap();
        let named = root.path().join("results/x/../r");
        check(&run_dir.join("runtime_state"), "r", &named).unwrap();
        check(&named.join("runtime_state"), "r", &run_dir).unwrap();
        // Lexically inside but a link out of it is still not the run's.
        let outside = root.path().join("elsewhere");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, run_dir.join("link")).unwrap();
        assert!(check(&named.join("link"), "r", &run_dir).is_err());
    }
}

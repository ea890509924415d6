//! Placing a snapshot's files without a second copy where the file system allows (a reflink,
//! else a hard link, else a copy), and the bytes a snapshot will really write: what staging
//! needs of the file system, apart from what a snapshot is (the parent module).

use std::fs;
use std::path::{Path, PathBuf};

use crate::results::records::Placements;

/// A file operation that failed, with the path (or both ends) it was about.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot stage {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A copy names both ends: a full disk is the destination's, a vanished file the source's.
    #[error("cannot copy {} to {}: {source}", .from.display(), .to.display())]
    Copy {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
}

/// An I/O error at `path`, as a [`FileError`].
pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |source| FileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How a file reached the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// A copy-on-write clone (`FICLONE`): no data copied, and independent of its source.
    Reflink,
    /// A second name of the source file: no data copied.
    HardLink,
    /// A copy of the bytes.
    Copy,
}

/// Counts one placed file of `bytes`.
pub fn count(placements: &mut Placements, how: Placement, bytes: u64) {
    match how {
        Placement::Reflink => placements.reflinked += 1,
        Placement::HardLink => placements.hard_linked += 1,
        Placement::Copy => {
            placements.copied += 1;
            placements.copied_bytes += bytes;
        }
    }
}

pub fn is_zip(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("zip"))
}

pub fn copy_file(src: &Path, dst: &Path) -> Result<(), FileError> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent).map_err(io(parent))?;
    }
    fs::copy(src, dst).map_err(|source| FileError::Copy {
        from: src.to_path_buf(),
        to: dst.to_path_buf(),
        source,
    })?;
    Ok(())
}

/// Places `src` at `dst` without copying its bytes where the file system allows: a reflink,
/// else a hard link, else a copy (another file system, or links refused).
pub fn place_file(src: &Path, dst: &Path) -> Result<Placement, FileError> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent).map_err(io(parent))?;
    }
    if reflink(src, dst).is_ok() {
        return Ok(Placement::Reflink);
    }
    if fs::hard_link(src, dst).is_ok() {
        return Ok(Placement::HardLink);
    }
    copy_file(src, dst)?;
    Ok(Placement::Copy)
}

/// A copy-on-write clone of `src` at `dst` (Linux's `FICLONE`, on Btrfs, XFS and the like);
/// leaves no `dst` behind when the file system cannot clone.
fn reflink(src: &Path, dst: &Path) -> std::io::Result<()> {
    let from = fs::File::open(src)?;
    let to = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)?;
    crate::os::clone_file(&from, &to).inspect_err(|_| {
        drop(to);
        let _ = fs::remove_file(dst);
    })
}

pub fn place_dir(src: &Path, dst: &Path, placements: &mut Placements) -> Result<(), FileError> {
    fs::create_dir_all(dst).map_err(io(dst))?;
    for entry in fs::read_dir(src).map_err(io(src))? {
        let entry = entry.map_err(io(src))?;
        let path = entry.path();
        let target = dst.join(entry.file_name());
        if path.is_dir() {
            place_dir(&path, &target, placements)?;
        } else {
            let len = fs::metadata(&path).map_err(io(&path))?.len();
            count(placements, place_file(&path, &target)?, len);
        }
    }
    Ok(())
}

/// The bytes of every file below `dir`.
pub fn dir_size(dir: &Path) -> u64 {
    let mut files = Vec::new();
    let _ = walk_files(dir, dir, &mut files);
    files
        .iter()
        .filter_map(|(_, p)| fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// What staging a request will write into the work root, and what its file system has free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceNeeded {
    pub needed: u64,
    pub available: u64,
}

/// The bytes a new snapshot will really write under `work_root` (files on another file system
/// than the work root's are copied, those on the same one linked; a `.zip` bundle is unpacked;
/// the small files are copied), and the bytes free there for this user. `None` when the free
/// space cannot be read.
pub fn space_needed(
    work_root: &Path,
    bundle: &Path,
    runner: &Path,
    small_files: &[&Path],
) -> Option<SpaceNeeded> {
    use std::os::unix::fs::MetadataExt;
    let mut existing = work_root;
    while !existing.exists() {
        existing = existing.parent()?;
    }
    let device = fs::metadata(existing).ok()?.dev();
    let available = crate::os::free_bytes(existing)?;
    let placed = |path: &Path| -> u64 {
        fs::metadata(path)
            .map(|m| if m.dev() == device { 0 } else { m.len() })
            .unwrap_or(0)
    };
    let mut needed: u64 = placed(runner);
    needed += small_files
        .iter()
        .filter_map(|p| fs::metadata(p).ok())
        .map(|m| m.len())
        .sum::<u64>();
    if is_zip(bundle) {
        needed += zip_unpacked_size(bundle).unwrap_or(0);
    } else {
        let mut files = Vec::new();
        let _ = walk_files(bundle, bundle, &mut files);
        needed += files.iter().map(|(_, p)| placed(p)).sum::<u64>();
    }
    Some(SpaceNeeded { needed, available })
}

/// The bytes a `.zip` bundle unpacks to, as its entries declare them.
fn zip_unpacked_size(archive: &Path) -> Option<u64> {
    let mut zip = zip::ZipArchive::new(fs::File::open(archive).ok()?).ok()?;
    let mut total = 0u64;
    for i in 0..zip.len() {
        total = total.saturating_add(zip.by_index_raw(i).ok()?.size());
    }
    Some(total)
}

/// Every file below `dir` (symbolic links to files included), by path relative to `base`, in
/// name order.
pub fn walk_files(
    base: &Path,
    dir: &Path,
    files: &mut Vec<(String, PathBuf)>,
) -> Result<(), FileError> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .map_err(io(dir))?
        .collect::<Result<_, _>>()
        .map_err(io(dir))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        if path.is_dir() {
            walk_files(base, &path, files)?;
        } else {
            let rel = path.strip_prefix(base).expect("below base");
            files.push((rel.to_string_lossy().into_owned(), path));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy onto a full device (`/dev/full`, as a full disk) names the destination as well as
    /// the source, and the reason.
    #[test]
    fn a_failed_copy_names_both_ends() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("weights.onnx");
        std::fs::write(&src, vec![7u8; 1 << 16]).unwrap();
        let error = copy_file(&src, Path::new("/dev/full"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("weights.onnx") && error.contains("to /dev/full"),
            "{error}"
        );
        assert!(error.contains("No space left"), "{error}");
    }
}

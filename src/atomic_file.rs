//! Replacing a file so that readers see the old contents or the new, never a mix: the one
//! writer that records, summaries and videos all go through.

use std::fs::{self, File};
use std::io::{self, BufWriter};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// A file name's longest length on common Linux file systems, in bytes.
const NAME_MAX: usize = 255;

/// Writes `path` through `write` into a uniquely named temporary file beside it, syncs it to
/// disk, renames it into place and syncs the folder. The rename stays within one folder (one
/// file system), so it is atomic; the process id and a counter keep concurrent writers (other
/// processes, other threads) off each other's temporary file, and its leading dot keeps it out
/// of globs like `*.mp4`. On failure the temporary file is removed and `path` is untouched.
pub fn write_with(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let suffix = format!(
        ".tmp{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    // The temporary name fits the 255 bytes a file name holds however long the final name is
    // (a video named after a long prompt): the process id and counter keep it unique.
    let mut base = name.to_string_lossy().into_owned();
    while 1 + base.len() + suffix.len() > NAME_MAX {
        base.pop();
    }
    let tmp = dir.join(format!(".{base}{suffix}"));
    let result = (|| {
        let file = File::options().write(true).create_new(true).open(&tmp)?;
        let mut w = BufWriter::new(file);
        write(&mut w)?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        // Data on disk before the rename makes it visible, or a power loss could leave a
        // complete-looking name over incomplete contents.
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename itself is durable only once the folder is synced; best effort, as not every
    // file system can sync a folder.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// [`write_with`] of `bytes`, making `path`'s folder first: for the files a process keeps for
/// later ones (kernel choices, text contexts) in folders that may not exist yet.
pub fn write_making_folder(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    write_with(path, |w| io::Write::write_all(w, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file written with its folder made is whole, with no temporary beside it, and a second
    /// write replaces it.
    #[test]
    fn a_file_is_written_into_a_folder_made_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nvrtc").join("kernels.cubin");
        write_making_folder(&file, b"image").unwrap();
        write_making_folder(&file, b"second").unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"second");
        let names: Vec<_> = fs::read_dir(file.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["kernels.cubin"]);
    }

    #[test]
    fn a_name_of_255_bytes_is_written_through_a_shorter_temporary_name() {
        let dir = tempfile::tempdir().unwrap();
        let name = format!("{}-0.mp4", "桜".repeat(83)); // 249 + 6 bytes
        assert_eq!(name.len(), NAME_MAX);
        let path = dir.path().join(&name);
        write_with(&path, |w| std::io::Write::write_all(w, b"video")).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"video");
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "no temporary file left");
    }
}

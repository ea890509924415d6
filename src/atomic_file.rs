//! Replacing a file so that readers see the old contents or the new, never a mix: the one
//! writer that records, summaries and videos all go through.

use std::fs::{self, File};
use std::io::{self, BufWriter};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

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
    let tmp = dir.join(format!(
        ".{}.tmp{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
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

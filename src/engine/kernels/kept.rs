//! Files the kernels keep in the kernel cache folder ([`super::KernelSettings`]) between
//! processes: convolution choices, attention plans, the compiled image of `kernels.cu`. Each is
//! written whole (a temporary file renamed into place), so a reader sees all of one or nothing; a
//! file that is missing, unreadable or stale means doing the work again, and one that cannot be
//! written only costs the next process that work.

use std::path::Path;

/// The bytes of a kept file; `None` when there is none (or it cannot be read).
pub(crate) fn read(file: &Path) -> Option<Vec<u8>> {
    std::fs::read(file).ok()
}

/// Writes a kept file whole, making its folder.
pub(crate) fn write(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    crate::atomic_file::write_with(file, |w| w.write_all(bytes))
}

/// [`write`], with a warning on standard error when it fails (`what`: what the next process
/// will do again).
pub(crate) fn keep(file: &Path, bytes: &[u8], what: &str) {
    if let Err(e) = write(file, bytes) {
        eprintln!(
            "warning: {}: could not keep {}: {e}; the next process {what} again",
            super::DOMAIN,
            file.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept file is written whole into a folder made for it, with no temporary left beside it,
    /// and read back; a missing one reads as none.
    #[test]
    fn a_kept_file_is_written_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nvrtc").join("kernels.bin");
        assert_eq!(read(&file), None);
        write(&file, b"image").unwrap();
        assert_eq!(read(&file).as_deref(), Some(&b"image"[..]));
        write(&file, b"second").unwrap();
        assert_eq!(read(&file).as_deref(), Some(&b"second"[..]));
        let names: Vec<_> = std::fs::read_dir(file.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["kernels.bin"]);
    }
}

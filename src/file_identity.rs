//! A file's size and identity as its metadata gives them, and its sha256: what tells a file left
//! untouched from one replaced or written in place. No call sets a file's status-change time
//! (ctime) back, so a file whose inode and times are those recorded has not been written since;
//! any other is judged by its hash. The staging's stamps of linked bundle files and the records
//! of written videos both compare them. Below every pass: it uses no other module.

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

/// A file's size, inode, and modification and status-change times (nanoseconds since the
/// epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    pub len: u64,
    pub inode: u64,
    pub modified_ns: i128,
    pub changed_ns: i128,
}

impl FileIdentity {
    /// The identity of the file at `path` (links followed).
    pub fn of(path: &Path) -> std::io::Result<FileIdentity> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Ok(FileIdentity {
            len: meta.len(),
            inode: meta.ino(),
            modified_ns: ns(meta.mtime(), meta.mtime_nsec()),
            changed_ns: ns(meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// The sha256 of a file, lowercase hex, read in 1 MiB pieces.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

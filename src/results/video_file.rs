//! What a prompt's video was when its worker wrote it ([`VideoFile`], kept in the prompt's
//! timing record), and whether the file under its name is still that video: a video swapped
//! with another, overwritten or zero-filled is a whole MP4 all the same, and is not the
//! prompt's.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::file_identity::{FileIdentity, sha256_file};

/// A video as its worker wrote it: its size and sha256, and the file's identity then (its inode
/// and its modification and status-change times). A file with that identity has not been
/// replaced or written since (no call sets the status-change time back), so it is judged without
/// being read; any other is hashed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VideoFile {
    pub bytes: u64,
    pub sha256: String,
    pub inode: u64,
    /// Modification time, nanoseconds since the epoch.
    pub modified_ns: i128,
    /// Status-change time, nanoseconds since the epoch.
    pub changed_ns: i128,
}

impl VideoFile {
    /// The video at `path` as it is now, read whole (a worker's own video, just written).
    pub fn of(path: &Path) -> std::io::Result<VideoFile> {
        let now = FileIdentity::of(path)?;
        Ok(VideoFile {
            bytes: now.len,
            sha256: sha256_file(path)?,
            inode: now.inode,
            modified_ns: now.modified_ns,
            changed_ns: now.changed_ns,
        })
    }

    /// Why the file at `path` is not this video, or `None` when it is: another size, or, where
    /// its identity is not the one recorded (another file put in its place, or the file written
    /// since, whatever its modification time says), another sha256.
    pub fn differs(&self, path: &Path) -> Option<String> {
        let now = match FileIdentity::of(path) {
            Ok(now) => now,
            Err(e) => return Some(format!("cannot be read: {e}")),
        };
        if now.len != self.bytes {
            return Some(format!(
                "holds {} bytes where its worker wrote {}",
                now.len, self.bytes
            ));
        }
        let recorded = (self.inode, self.modified_ns, self.changed_ns);
        if (now.inode, now.modified_ns, now.changed_ns) == recorded {
            return None;
        }
        match sha256_file(path) {
            Ok(h) if h == self.sha256 => None,
            Ok(_) => Some("its bytes are not the ones its worker wrote (another sha256)".into()),
            Err(e) => Some(format!("cannot be read: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An untouched video is itself without being read; one written in place (zero-filled, its
    /// size kept), one swapped in under its name, or one of another size is not; written back
    /// as it was, or copied elsewhere whole, it is again (by its hash).
    #[test]
    fn a_video_is_the_one_written_only_with_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.mp4"), dir.path().join("b.mp4"));
        std::fs::write(&a, b"video a").unwrap();
        std::fs::write(&b, b"video b").unwrap();
        let written = VideoFile::of(&a).unwrap();
        assert_eq!(written.bytes, 7);
        assert_eq!(written.differs(&a), None);

        std::fs::write(&a, [0u8; 7]).unwrap();
        assert!(written.differs(&a).unwrap().contains("another sha256"));
        std::fs::write(&a, b"video a").unwrap();
        assert_eq!(written.differs(&a), None);

        std::fs::rename(&a, dir.path().join("tmp")).unwrap();
        std::fs::rename(&b, &a).unwrap();
        assert!(written.differs(&a).unwrap().contains("another sha256"));

        std::fs::write(&a, b"a longer video").unwrap();
        assert_eq!(
            written.differs(&a).as_deref(),
            Some("holds 14 bytes where its worker wrote 7")
        );
        let copy = dir.path().join("copy.mp4");
        std::fs::copy(dir.path().join("tmp"), &copy).unwrap();
        assert_eq!(written.differs(&copy), None);
        assert!(written.differs(&dir.path().join("gone.mp4")).is_some());
    }
}

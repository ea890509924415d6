//! Proving a placed bundle file unchanged since its audit: a hard-linked file changes when its
//! source is rewritten in place, and its modification time can be set back, so its stamp keeps
//! its status-change time too, and a file whose times moved is hashed again.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::file_identity::{FileIdentity, sha256_file};

/// A placed file as the audit saw it: its size, its modification and status-change times, and
/// the sha256 the audit recorded. A hard-linked file rewritten in place through its source
/// changes its status-change time (ctime) whatever else the writer restores, since no call sets
/// that time; a worker that finds a stamp's times moved hashes the file again, and refuses it
/// unless it still has the audited hash (a change of its metadata alone, such as another link to
/// it, moves the time too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    pub len: u64,
    /// Modification time, nanoseconds since the epoch.
    pub modified_ns: i128,
    /// Status-change time, nanoseconds since the epoch.
    pub changed_ns: i128,
    pub sha256: String,
}

impl FileStamp {
    /// The stamp of a file of identity `now` and hash `sha256`.
    pub fn new(now: FileIdentity, sha256: String) -> FileStamp {
        FileStamp {
            len: now.len,
            modified_ns: now.modified_ns,
            changed_ns: now.changed_ns,
            sha256,
        }
    }

    /// Whether a file of identity `now` has this stamp's size and times.
    fn matches(&self, now: &FileIdentity) -> bool {
        (self.len, self.modified_ns, self.changed_ns) == (now.len, now.modified_ns, now.changed_ns)
    }
}

/// The files that differ from their stamps, by path relative to `bundle`: missing, another
/// size, or, where a time moved, another sha256 than the audited one. A file whose times moved
/// but whose bytes are the audited ones (its metadata changed, or it was written back as it was)
/// gets its stamp updated to its times now, so that it is not hashed again at the next check.
pub fn changed_since_staged(
    bundle: &Path,
    stamps: &mut BTreeMap<String, FileStamp>,
) -> Vec<String> {
    let mut changed = Vec::new();
    for (rel, stamp) in stamps.iter_mut() {
        let path = bundle.join(rel);
        let Ok(now) = FileIdentity::of(&path) else {
            changed.push(rel.clone());
            continue;
        };
        if stamp.matches(&now) {
            continue;
        }
        // The audited bytes, whatever moved its times: another link made to the same file (a
        // concurrent staging of the bundle) moves its ctime, and a read of the times after the
        // hash could see another one. A rewrite, even one caught half-way, hashes otherwise.
        let same = now.len == stamp.len && sha256_file(&path).is_ok_and(|h| h == stamp.sha256);
        if same {
            *stamp = FileStamp::new(now, stamp.sha256.clone());
        } else {
            changed.push(rel.clone());
        }
    }
    changed
}

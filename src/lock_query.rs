//! Whether some process holds a folder's lock, asked without taking it: the read-only side of
//! `execute::lock`, which `status`, `runs` and `report` ask of a run folder to tell a run in
//! progress from one that stopped. Below every pass: it uses no other module.

use std::fs::File;
use std::path::Path;

/// The lock file inside a locked folder.
pub const LOCK_FILE: &str = ".unstep.lock";

/// `dir`'s lock file, open, when some process holds its lock now, exclusively or shared (its
/// holder's name is in it); `None` for a free lock, a folder without a lock file, or a lock
/// file that cannot be asked. Takes nothing: a free lock is released at once.
pub fn held_lock_file(dir: &Path) -> Option<File> {
    let file = File::open(dir.join(LOCK_FILE)).ok()?;
    // An exclusive try conflicts with every holder.
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            None
        }
        Err(std::fs::TryLockError::WouldBlock) => Some(file),
        Err(std::fs::TryLockError::Error(_)) => None,
    }
}

/// Whether some process holds `dir`'s lock now (see [`held_lock_file`]).
pub fn is_held(dir: &Path) -> bool {
    held_lock_file(dir).is_some()
}

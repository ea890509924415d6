//! Exclusive advisory locks (`File::try_lock`, `flock` on Linux) on a run's results folder, work
//! root and shared cache folder. A lock is held for as long as its [`Lock`] lives, and by every
//! worker process it is handed to ([`Lock::fd`]); the kernel releases it when the last holder
//! ends, so a crashed run never leaves a stale lock behind.
//!
//! The folders a lock creates are the process's to remove again: when a lock is released, each
//! folder a lock of this process created that holds nothing now but lock files no one holds
//! (an apply refused after taking its locks) is removed, lock files and all, so that a refused
//! apply leaves nothing behind. A lock file is only removed while its remover holds it, and a
//! taker checks that the file it locked is still the one at its path, so two holders never
//! hold two files of one folder.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The uppermost folder each lock of this process created, until it is removed again or holds
/// more than lock files.
static CREATED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// How many times a taker opens a lock file again that was removed after it opened it.
const TAKE_TRIES: usize = 8;

pub use crate::lock_query::LOCK_FILE;

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{} is in use by run `{holder}` (pid {pid}); wait for it, or give this run its own folder", .dir.display())]
    Held {
        dir: PathBuf,
        holder: String,
        pid: String,
    },
    #[error("cannot lock {}: {source}", .dir.display())]
    Io {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// A held lock; dropping it releases the lock.
#[derive(Debug)]
pub struct Lock {
    file: File,
    pub dir: PathBuf,
    /// Held with others (`flock(LOCK_SH)`): the applies of different shards of one run.
    shared: bool,
}

impl Lock {
    /// Takes the lock of `dir` (created if missing) at once, or fails naming the holder.
    pub fn acquire(dir: &Path, run: &str) -> Result<Lock, LockError> {
        Lock::take(dir, run, false)
    }

    /// Takes `dir`'s lock shared with other shared holders (the applies of a run's different
    /// shards), at once, or fails naming the exclusive holder. Each shared holder appends its
    /// line to the lock file; the next exclusive holder starts it afresh.
    pub fn acquire_shared(dir: &Path, run: &str) -> Result<Lock, LockError> {
        Lock::take(dir, run, true)
    }

    fn take(dir: &Path, run: &str, shared: bool) -> Result<Lock, LockError> {
        let io = |source| LockError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        let mut tries = 0;
        let mut file = loop {
            tries += 1;
            let created = uppermost_missing(dir);
            std::fs::create_dir_all(dir).map_err(io)?;
            if let Some(top) = created {
                CREATED.lock().unwrap_or_else(|e| e.into_inner()).push(top);
            }
            let opened = OpenOptions::new()
                .read(true)
                .write(true)
                // Shared holders append their lines at once, whoever writes first.
                .append(shared)
                .create(true)
                .truncate(false)
                .open(dir.join(LOCK_FILE));
            let mut file = match opened {
                Ok(file) => file,
                // The folder was removed after it was made (a released lock's, see `prune`).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < TAKE_TRIES => {
                    continue;
                }
                Err(e) => return Err(io(e)),
            };
            // `File::try_lock` is `flock(LOCK_EX | LOCK_NB)` on Linux, `try_lock_shared` the
            // same with `LOCK_SH`: held by this open file.
            let taken = if shared {
                file.try_lock_shared()
            } else {
                file.try_lock()
            };
            match taken {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => return Err(held(dir, &mut file)),
                Err(std::fs::TryLockError::Error(err)) => return Err(io(err)),
            }
            // A released lock's file removed between the open and the lock: this file is no
            // longer the folder's lock; take the one at the path now.
            if is_at(&file, &dir.join(LOCK_FILE)) {
                break file;
            }
            if tries >= TAKE_TRIES {
                return Err(io(std::io::Error::other(
                    "its lock file was removed each time it was taken",
                )));
            }
        };
        // The exclusive holder starts the file afresh; shared holders add their line at its end.
        if !shared {
            file.set_len(0).map_err(io)?;
            file.seek(SeekFrom::Start(0)).map_err(io)?;
        }
        writeln!(file, "run={run} pid={}", std::process::id()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(Lock {
            file,
            dir: dir.to_path_buf(),
            shared,
        })
    }
}

/// The uppermost of `dir` and its parents that does not exist: what creating `dir` creates.
fn uppermost_missing(dir: &Path) -> Option<PathBuf> {
    let mut top = None;
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        top = Some(d.to_path_buf());
        at = d.parent();
    }
    top
}

/// Whether `file` is the file at `path` now.
fn is_at(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// What pruning a folder did.
#[derive(PartialEq)]
enum Pruned {
    /// It is gone (or was already).
    Removed,
    /// Some lock file in it is held: it may be removed once that is released.
    Held,
    /// It holds more than lock files: it stays.
    Kept,
}

/// Removes every folder a lock of this process created that holds nothing but lock files that
/// no one holds, and forgets those that hold more; called as each lock is released.
fn prune_created() {
    let mut created = CREATED.lock().unwrap_or_else(|e| e.into_inner());
    // Inner folders first: one may lie inside another.
    created.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    created.dedup();
    created.retain(|dir| prune(dir) == Pruned::Held);
}

/// Removes `dir` when it holds nothing but folders and lock files that no one holds.
fn prune(dir: &Path) -> Pruned {
    if !dir.exists() {
        return Pruned::Removed;
    }
    if !only_lock_files(dir) {
        return Pruned::Kept;
    }
    remove_locks(dir)
}

/// Whether `dir` and its folders hold lock files only.
fn only_lock_files(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().all(|e| match e.file_type() {
        Ok(t) if t.is_dir() => only_lock_files(&e.path()),
        Ok(t) if t.is_file() => e.file_name() == LOCK_FILE,
        _ => false,
    })
}

/// Removes the free lock files of `dir` and its folders, and the folders: each lock file while
/// holding it (the removal fails where anything else appeared meanwhile, which stays).
fn remove_locks(dir: &Path) -> Pruned {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let done = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_locks(&path)
        } else if entry.file_name() == LOCK_FILE {
            remove_free_lock(&path)
        } else {
            Pruned::Kept
        };
        if done != Pruned::Removed {
            return done;
        }
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Pruned::Removed,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Pruned::Removed,
        Err(_) => Pruned::Kept,
    }
}

/// Removes the lock file at `path` when no one holds it, holding it meanwhile.
fn remove_free_lock(path: &Path) -> Pruned {
    let Ok(file) = OpenOptions::new().read(true).write(true).open(path) else {
        return Pruned::Removed;
    };
    match file.try_lock() {
        Ok(()) if is_at(&file, path) => match std::fs::remove_file(path) {
            Ok(()) => Pruned::Removed,
            Err(_) => Pruned::Kept,
        },
        // Another lock file took its place meanwhile: it may be held, and is looked at again.
        Ok(()) => Pruned::Held,
        Err(_) => Pruned::Held,
    }
}

impl Lock {
    /// Turns a held exclusive lock into a shared one (`flock(LOCK_SH)` converts it), so that the
    /// tasks of the run's Slurm job can take it shared while exclusive holders stay out.
    pub fn share(&mut self) -> Result<(), LockError> {
        self.file.lock_shared().map_err(|source| LockError::Io {
            dir: self.dir.clone(),
            source,
        })?;
        self.shared = true;
        Ok(())
    }

    /// The locked file's descriptor, for worker processes to inherit: the lock then stays held
    /// while any of them lives.
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Whether some process holds `dir`'s lock now. Reads only: a folder without a lock file
    /// is not held.
    pub fn is_held(dir: &Path) -> bool {
        crate::lock_query::is_held(dir)
    }

    /// Refuses, naming the holder, when some process holds `dir`'s lock now, exclusively or
    /// shared; writes nothing, so that a refusal leaves no trace (a free lock is taken with
    /// [`Lock::acquire`]).
    pub fn check_free(dir: &Path) -> Result<(), LockError> {
        match crate::lock_query::held_lock_file(dir) {
            Some(mut file) => Err(held(dir, &mut file)),
            None => Ok(()),
        }
    }
}

/// The refusal for a held lock, naming the holder its file records.
fn held(dir: &Path, file: &mut File) -> LockError {
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    let field = |name: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .unwrap_or("?")
            .to_string()
    };
    LockError::Held {
        dir: dir.to_path_buf(),
        holder: field("run"),
        pid: field("pid"),
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Clearing the holder first means a reader never names a run that has finished (a
        // shared holder leaves the file to the others).
        if !self.shared {
            let _ = self.file.set_len(0);
        }
        let _ = self.file.unlock();
        prune_created();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_named_and_admitted_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let first = Lock::acquire(dir.path(), "alpha").unwrap();
        // flock locks belong to open file descriptions, so a second open in this same process
        // conflicts just as another process would.
        match Lock::acquire(dir.path(), "beta") {
            Err(LockError::Held { holder, pid, .. }) => {
                assert_eq!(holder, "alpha");
                assert_eq!(pid, std::process::id().to_string());
            }
            other => panic!("{other:?}"),
        }
        assert!(Lock::is_held(dir.path()));
        drop(first);
        assert!(!Lock::is_held(dir.path()));
        assert!(Lock::acquire(dir.path(), "beta").is_ok());
    }

    #[test]
    fn a_lock_removes_the_folders_it_created_when_they_hold_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b");
        let first = Lock::acquire(&dir, "run").unwrap();
        let inner = Lock::acquire(&dir.join("c"), "run").unwrap();
        drop(first);
        assert!(
            dir.join("c").join(LOCK_FILE).exists(),
            "a held lock's folder stays"
        );
        drop(inner);
        assert!(
            !root.path().join("a").exists(),
            "both folders and their lock files are gone"
        );
        // A folder with more than lock files in it stays, its lock file too.
        let kept = Lock::acquire(&dir, "run").unwrap();
        std::fs::write(dir.join("run.json"), "{}").unwrap();
        drop(kept);
        assert!(dir.join(LOCK_FILE).exists() && dir.join("run.json").exists());
    }

    #[test]
    fn shared_holders_admit_each_other_and_keep_exclusive_holders_out() {
        let dir = tempfile::tempdir().unwrap();
        let a = Lock::acquire_shared(dir.path(), "run").unwrap();
        let b = Lock::acquire_shared(dir.path(), "run").unwrap();
        assert!(matches!(
            Lock::acquire(dir.path(), "other"),
            Err(LockError::Held { holder, .. }) if holder == "run"
        ));
        assert!(Lock::is_held(dir.path()));
        drop(a);
        assert!(Lock::is_held(dir.path()), "one shared holder is left");
        drop(b);
        // An exclusive holder keeps shared ones out until it shares its lock.
        let mut whole = Lock::acquire(dir.path(), "whole").unwrap();
        assert!(Lock::acquire_shared(dir.path(), "run").is_err());
        whole.share().unwrap();
        let task = Lock::acquire_shared(dir.path(), "run").unwrap();
        assert!(Lock::acquire(dir.path(), "other").is_err());
        drop(whole);
        assert!(Lock::is_held(dir.path()), "the task still holds it");
        drop(task);
        assert!(!Lock::is_held(dir.path()));
    }
}

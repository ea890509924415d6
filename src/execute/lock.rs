//! Exclusive advisory locks (`File::try_lock`, `flock` on Linux) on a run's results folder, work
//! root and shared cache folder. A lock is held for as long as its [`Lock`] lives, and by every
//! worker process it is handed to ([`Lock::fd`]); the kernel releases it when the last holder
//! ends, so a crashed run never leaves a stale lock behind.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

/// The lock file inside a locked folder.
pub const LOCK_FILE: &str = ".unstep.lock";

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
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            // Shared holders append their lines at once, whoever writes first.
            .append(shared)
            .create(true)
            .truncate(false)
            .open(dir.join(LOCK_FILE))
            .map_err(io)?;
        // `File::try_lock` is `flock(LOCK_EX | LOCK_NB)` on Linux, `try_lock_shared` the same
        // with `LOCK_SH`: held by this open file.
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
        Self::check_free(dir).is_err()
    }

    /// Refuses, naming the holder, when some process holds `dir`'s lock now, exclusively or
    /// shared; writes nothing, so that a refusal leaves no trace (a free lock is taken with
    /// [`Lock::acquire`]).
    pub fn check_free(dir: &Path) -> Result<(), LockError> {
        let Ok(mut file) = File::open(dir.join(LOCK_FILE)) else {
            return Ok(());
        };
        // An exclusive try conflicts with every holder; released at once when it succeeds.
        match file.try_lock() {
            Ok(()) => {
                let _ = file.unlock();
                Ok(())
            }
            Err(std::fs::TryLockError::WouldBlock) => Err(held(dir, &mut file)),
            Err(std::fs::TryLockError::Error(_)) => Ok(()),
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

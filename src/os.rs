//! The operating system calls the runner makes outside the engine, each behind a safe function:
//! the rest of the crate outside `engine/` has no `unsafe` (`src/layering.rs` checks it). Linux
//! calls through `libc`; below every pass, it uses no other module.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// A signal the runner sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
    /// No signal: asks only whether the target is still there.
    Probe,
}

impl Signal {
    fn number(self) -> libc::c_int {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
            Signal::Probe => 0,
        }
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// Whether this process may write in `path` (`access(W_OK)`: its permissions and a read-only
/// mount both count); the error says why not.
pub fn check_writable(path: &Path) -> io::Result<()> {
    let c = c_path(path)?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends `signal` to process `pid`; false when it is gone (or not ours to signal).
pub fn signal_process(pid: u32, signal: Signal) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill takes any pid and signal number, and fails with ESRCH or EPERM.
    unsafe { libc::kill(pid, signal.number()) == 0 }
}

/// Sends `signal` to every process of the group that `leader` leads; false when none is left.
pub fn signal_group(leader: u32, signal: Signal) -> bool {
    let Ok(leader) = libc::pid_t::try_from(leader) else {
        return false;
    };
    // SAFETY: killpg takes any group and signal number, and fails with ESRCH or EPERM.
    unsafe { libc::killpg(leader, signal.number()) == 0 }
}

/// Makes the child that `command` starts end with this process: the kernel kills it (SIGKILL)
/// when the thread that started it ends, even when this process is killed by SIGKILL, and it
/// never starts when this process died between the fork and that request. With `inherit`, the
/// child also inherits that open file (its close-on-exec flag cleared in the child alone), so
/// that a lock it holds lasts as long as the child.
pub fn end_with_parent(command: &mut Command, inherit: Option<RawFd>) {
    // SAFETY: getpid before the fork; in the child only async-signal-safe calls (prctl,
    // getppid, fcntl, _exit).
    let parent = unsafe { libc::getpid() };
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent died between the fork and the prctl: nothing would kill the child.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            if let Some(fd) = inherit {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Makes `to` a copy-on-write clone of `from` (Linux's `FICLONE`, on Btrfs, XFS and the like);
/// an error where the file system cannot clone.
pub fn clone_file(from: &File, to: &File) -> io::Result<()> {
    // _IOW(0x94, 9, int)
    const FICLONE: libc::c_ulong = 0x4004_9409;
    // SAFETY: both descriptors are open for the duration of the call.
    if unsafe { libc::ioctl(to.as_raw_fd(), FICLONE as _, from.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Bytes free for an unprivileged user on the file system of `path` (`statvfs`).
pub fn free_bytes(path: &Path) -> Option<u64> {
    let c = c_path(path).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a valid NUL-terminated path and a buffer of the right type.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs succeeded and filled it.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// The host name, for telling runs on different machines apart.
pub fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    (!name.is_empty()).then_some(name)
}

/// Makes a named pipe (FIFO) at `path`: what tests put where a file is read, to check that a
/// reader refuses it instead of blocking.
pub fn make_fifo(path: &Path) -> io::Result<()> {
    let c = c_path(path)?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calls_answer_as_the_system_does() {
        let dir = tempfile::tempdir().unwrap();
        check_writable(dir.path()).unwrap();
        assert!(check_writable(&dir.path().join("absent")).is_err());
        assert!(free_bytes(dir.path()).is_some_and(|n| n > 0));
        assert!(hostname().is_some_and(|h| !h.is_empty()));
        let fifo = dir.path().join("fifo");
        make_fifo(&fifo).unwrap();
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        assert!(make_fifo(&fifo).is_err(), "it exists");
        // A child of ours takes a signal; a pid that is not a process does not.
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        assert!(signal_process(child.id(), Signal::Term));
        assert!(!child.wait().unwrap().success());
        assert!(!signal_process(child.id(), Signal::Probe), "reaped");
        assert!(!signal_process(u32::MAX, Signal::Term));
    }

    use std::os::unix::fs::FileTypeExt;
}

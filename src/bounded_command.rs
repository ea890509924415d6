//! Running a short query command (`nvidia-smi`, `squeue`, ...) with a deadline: a command that
//! hangs, in a driver call or on a dead controller, must not hang the runner with it.

use std::io::{self, Read};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What a command that ended said.
#[derive(Debug)]
pub struct Answer {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Answer {
    /// What it said about its failure, for a message: its standard error, else its standard
    /// output (`nvidia-smi` writes its errors there), else its exit status.
    pub fn failure_text(&self) -> String {
        [self.stderr.trim(), self.stdout.trim()]
            .into_iter()
            .find(|s| !s.is_empty())
            .map_or_else(|| self.status.to_string(), str::to_string)
    }
}

/// Why a command gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{program} could not be started ({source})")]
    Start {
        program: &'static str,
        source: io::Error,
    },
    #[error("{program} did not answer in {} s", timeout.as_secs_f64())]
    Timeout {
        program: &'static str,
        timeout: Duration,
    },
    #[error("cannot wait for {program}: {source}")]
    Wait {
        program: &'static str,
        source: io::Error,
    },
}

/// Runs `program` with `args`, its standard input closed, and gives it `timeout` to end. One
/// that does not is killed and left: it is not waited for, as a process stuck in a driver call
/// may not die until the call returns.
pub fn run(
    program: &'static str,
    args: &[&str],
    timeout: Duration,
) -> Result<Answer, CommandError> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| CommandError::Start { program, source })?;
    // Read while it runs, so that a long answer cannot fill the pipe and stall it.
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr.read_to_end(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                return Err(CommandError::Timeout { program, timeout });
            }
            Err(source) => return Err(CommandError::Wait { program, source }),
        }
    };
    // A child of the command may still hold the pipes open: its output is what arrived by the
    // deadline's end of a short grace, not what a left-over process writes later.
    let grace = Instant::now() + Duration::from_millis(500);
    let collect = |handle: std::thread::JoinHandle<Vec<u8>>| {
        while !handle.is_finished() && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(5));
        }
        if handle.is_finished() {
            String::from_utf8_lossy(&handle.join().unwrap_or_default()).into_owned()
        } else {
            String::new()
        }
    };
    let stdout = collect(out);
    let stderr = collect(err);
    Ok(Answer {
        status,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_past_its_deadline_is_killed_and_reported() {
        let started = Instant::now();
        let e = run("sleep", &["30"], Duration::from_millis(200)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "{e}");
        assert!(matches!(e, CommandError::Timeout { .. }), "{e}");
        assert_eq!(e.to_string(), "sleep did not answer in 0.2 s");
    }

    #[test]
    fn a_failure_says_what_the_command_wrote() {
        let a = run("sh", &["-c", "echo out; exit 3"], Duration::from_secs(10)).unwrap();
        assert!(!a.status.success());
        assert_eq!(a.failure_text(), "out");
        let a = run(
            "sh",
            &["-c", "echo out; echo err >&2; exit 3"],
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(a.failure_text(), "err");
        let a = run("sh", &["-c", "exit 3"], Duration::from_secs(10)).unwrap();
        assert_eq!(a.failure_text(), "exit status: 3");
    }
}

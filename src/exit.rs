//! Exit statuses of the `runner` binary, in one place.

/// Everything went as asked.
pub const OK: i32 = 0;
/// A run started but failed (a worker crashed, a generation error), or `runner doctor` found a
/// check the run in question needs failing.
pub const FAILURE: i32 = 1;
/// The user's input is wrong: a manifest, an override, a flag. Nothing was written.
pub const USAGE: i32 = 2;
/// Something the user cannot fix by changing input (a bug, an I/O error).
pub const INTERNAL: i32 = 3;
/// The run was interrupted (Ctrl-C); state is consistent and a re-apply resumes.
pub const INTERRUPTED: i32 = 130;

/// Writes `text` to stderr as it is. A stderr that cannot be written is no reason to stop:
/// when its reader is gone (`runner apply 2>&1 | head -1`) the text is dropped and the work goes
/// on, where `eprint!` would panic and leave a run's records half written.
pub fn to_stderr(text: &str) {
    use std::io::Write;
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes());
    let _ = stderr.flush();
}

/// `eprintln!` that survives a closed stderr ([`to_stderr`]): what every command prints its
/// progress, warnings and errors with.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::exit::to_stderr(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// Every status with what it means, as `runner --help` lists them.
pub const STATUSES: [(i32, &str); 5] = [
    (OK, "done"),
    (
        FAILURE,
        "a run failed, or `runner doctor` found a check the run needs failing",
    ),
    (
        USAGE,
        "bad input (a manifest, an override, a flag); nothing was written",
    ),
    (INTERNAL, "an internal error (a bug, an I/O error)"),
    (INTERRUPTED, "interrupted (Ctrl-C); applying again resumes"),
];

/// The exit statuses section of `runner --help`, from [`STATUSES`].
pub fn statuses_help() -> String {
    let mut text = String::from("Exit statuses:");
    for (code, meaning) in STATUSES {
        text.push_str(&format!("\n  {code:<5}{meaning}"));
    }
    text
}

/// An error as every command reports it: its message, what to do about it, and its exit status.
pub trait Failure: std::fmt::Display {
    /// One of this module's statuses.
    fn exit_code(&self) -> i32;
    /// What the user can do about it, when there is something to say.
    fn hint(&self) -> Option<String> {
        None
    }
}

/// Prints `error: …` and, when there is one, the `  = hint: …` line (the form manifest
/// diagnostics use), and gives the error's exit status. An interrupt ([`INTERRUPTED`]) is the
/// user's doing, not an error: it is said as an interrupted run's end is, `… ; what to do`.
pub fn report(error: &dyn Failure) -> i32 {
    to_stderr(&report_text(error));
    error.exit_code()
}

/// What [`report`] prints of `error`.
fn report_text(error: &dyn Failure) -> String {
    match (error.exit_code() == INTERRUPTED, error.hint()) {
        (true, Some(hint)) => format!("{error}; {hint}\n"),
        (true, None) => format!("{error}\n"),
        (false, Some(hint)) => format!("error: {error}\n  = hint: {hint}\n"),
        (false, None) => format!("error: {error}\n"),
    }
}

/// A message with a hint and a status, for the command line's own refusals.
#[derive(Debug)]
pub struct Plain {
    pub message: String,
    pub hint: Option<String>,
    pub code: i32,
}

impl std::fmt::Display for Plain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Failure for Plain {
    fn exit_code(&self) -> i32 {
        self.code
    }

    fn hint(&self) -> Option<String> {
        self.hint.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_reported_as_errors_and_interrupts_as_ends() {
        let failure = |code, hint: Option<&str>| Plain {
            message: "it stopped".into(),
            hint: hint.map(String::from),
            code,
        };
        assert_eq!(
            report_text(&failure(FAILURE, Some("run it again"))),
            "error: it stopped\n  = hint: run it again\n"
        );
        assert_eq!(report_text(&failure(USAGE, None)), "error: it stopped\n");
        assert_eq!(
            report_text(&failure(INTERRUPTED, Some("apply again"))),
            "it stopped; apply again\n"
        );
    }
}

//! Exit statuses of the `runner` binary, in one place.

/// Everything went as asked.
pub const OK: i32 = 0;
/// A run started but failed (a worker crashed, a generation error).
pub const FAILURE: i32 = 1;
/// The user's input is wrong: a manifest, an override, a flag. Nothing was written.
pub const USAGE: i32 = 2;
/// Something the user cannot fix by changing input (a bug, an I/O error).
pub const INTERNAL: i32 = 3;
/// The run was interrupted (Ctrl-C); state is consistent and a re-apply resumes.
pub const INTERRUPTED: i32 = 130;

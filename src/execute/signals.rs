//! The interrupt: SIGINT, SIGTERM and SIGHUP set a flag (and count themselves) that the steps
//! of a run check between processes and while waiting, so that a run ends recorded as
//! interrupted, with what it started stopped. The flag is set for the rest of the process: an
//! apply that it finds set before its run has started ends without starting it, so an interrupt
//! between the runs of a sweep starts none of the runs after it.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Set by the SIGINT/SIGTERM/SIGHUP handler; checked between processes and while waiting.
pub(crate) static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// How many interrupts arrived: a second one stops what the first asked to end gracefully
/// (an evaluation command that does not end on SIGTERM) at once.
pub(crate) static INTERRUPTS: AtomicU32 = AtomicU32::new(0);

/// Whether an interrupt arrived since the handlers were installed (as `apply` begins, or as a
/// sweep does, before its checks of every run): a caller that applies several runs in turn
/// starts no further run after one.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Counts the interrupt and sets [`INTERRUPTED`]; counted first, so that whoever sees
/// [`INTERRUPTED`] sees this interrupt counted.
fn on_signal() {
    INTERRUPTS.fetch_add(1, Ordering::SeqCst);
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Runs [`on_signal`] on SIGINT, SIGTERM and SIGHUP (a closed terminal stops the run as Ctrl-C
/// does); installed once per process, and never taken back: from then on no interrupt ends the
/// process at once (their default) or goes unseen (ignored, as a shell starts a background
/// command).
pub fn install_signal_handlers() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        for signal in [SIGINT, SIGTERM, SIGHUP] {
            // SAFETY: the action only touches atomics, which is async-signal-safe. Registering
            // fails only for the signals that cannot be caught, which these are not.
            unsafe { signal_hook::low_level::register(signal, on_signal) }
                .expect("SIGINT, SIGTERM and SIGHUP can be caught");
        }
    });
}

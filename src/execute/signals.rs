//! The interrupt: SIGINT, SIGTERM and SIGHUP set a flag (and count themselves) that the steps
//! of a run check between processes and while waiting, so that a run ends recorded as
//! interrupted, with what it started stopped.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Set by the SIGINT/SIGTERM/SIGHUP handler; checked between processes and while waiting.
pub(crate) static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// How many interrupts arrived: a second one stops what the first asked to end gracefully
/// (an evaluation command that does not end on SIGTERM) at once.
pub(crate) static INTERRUPTS: AtomicU32 = AtomicU32::new(0);

/// Whether an interrupt arrived since the first `apply` of this process installed its handlers:
/// a caller that applies several runs in turn starts no further run after one.
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
/// does); installed once per process.
pub(crate) fn install_signal_handlers() {
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

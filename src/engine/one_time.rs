//! The one-time work of a process: what it does once per shape (or once at all) before a prompt
//! runs at its steady speed. Each kind is timed where it happens and added to a process-wide
//! ledger, which the generation loop takes after every prompt ([`take`]): a process's first prompt
//! (and a prompt with a new shape) carries the work it did, the others carry none.
//!
//! The kinds overlap other work: the decoder's convolution choices are made on the decoder's
//! thread while the DiT runs beside it, so the sum of the kinds need not add up to the first
//! prompt's extra time, and what the ledger does not name (ONNX Runtime's own first runs: its
//! arena growing, its convolution searches) is the rest.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use crate::vocab::OneTimeWork;

/// A kind of one-time work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// NVRTC compiling the runner's CUDA kernels (`kernels.cu`), or reading a kept image.
    KernelCompile,
    /// cuDNN attention plans built (or read back from the cache folder), per call shape.
    AttentionPlans,
    /// The decoder convolutions' engine choices (plans built and timed, or a kept one built).
    ConvChoices,
    /// cuBLASLt's algorithm choices of the fused matmuls, per call shape.
    GemmChoices,
    /// The DiT passes that capture a CUDA graph (one per block shape), from their start.
    GraphCapture,
    /// A capturing pass waiting for the decoder's run in progress to end (the GPU runs the
    /// decoder alone meanwhile, so this is not idle time).
    CaptureWait,
}

const KINDS: usize = OneTimeWork::KINDS;

static NANOS: [AtomicU64; KINDS] = [const { AtomicU64::new(0) }; KINDS];

/// Adds `elapsed` to `work`'s total.
pub(crate) fn add(work: Work, elapsed: Duration) {
    let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
    NANOS[work as usize].fetch_add(nanos, Ordering::Relaxed);
}

/// Runs `f`, adding its wall time to `work`'s total.
pub(crate) fn timed<T>(work: Work, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    add(work, started.elapsed());
    out
}

/// The one-time work done since the last [`take`], in seconds, and the ledger cleared.
pub fn take() -> OneTimeWork {
    let take = |work: Work| NANOS[work as usize].swap(0, Ordering::Relaxed) as f64 * 1e-9;
    OneTimeWork {
        kernel_compile_s: take(Work::KernelCompile),
        attention_plans_s: take(Work::AttentionPlans),
        conv_choices_s: take(Work::ConvChoices),
        gemm_choices_s: take(Work::GemmChoices),
        graph_capture_s: take(Work::GraphCapture),
        capture_wait_s: take(Work::CaptureWait),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work is added by kind and taken once: the next take starts from nothing. (The one test of
    /// this process-wide ledger: others would race it.)
    #[test]
    fn work_is_added_by_kind_and_taken_once() {
        let _ = take();
        add(Work::AttentionPlans, Duration::from_millis(1500));
        add(Work::AttentionPlans, Duration::from_millis(500));
        let value = timed(Work::GraphCapture, || {
            std::thread::sleep(Duration::from_millis(20));
            7
        });
        assert_eq!(value, 7);
        let work = take();
        assert!((work.attention_plans_s - 2.0).abs() < 1e-9, "{work:?}");
        assert!(work.graph_capture_s >= 0.02, "{work:?}");
        assert_eq!(work.conv_choices_s, 0.0);
        assert!(!work.is_empty());
        assert!(take().is_empty(), "taken work is cleared");
    }
}

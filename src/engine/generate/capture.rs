//! The DiT's CUDA graphs: which graph id each pass runs as ([`GraphIds`], one graph per block
//! shape), and the turns a capturing pass and the decoder thread beside the DiT take
//! ([`CaptureGate`]). Only the CUDA provider with `cuda_graphs` captures; elsewhere every pass is
//! a plain run.

use std::sync::PoisonError;

use crate::engine::one_time;

use super::buffers::Buf;

/// The DiT's CUDA graphs (ONNX Runtime's `enable_cuda_graph`, in the DiT's session only).
///
/// ONNX Runtime replays a captured graph with the addresses and shapes of its capture. Every pass
/// of a block binds the same views (the KV cache's prefix and the block's rows, `x`, `flow`, the
/// context's keys and values, the block's frame offset) and its timestep is copied into one
/// buffer before the pass, so one graph per block shape serves all its passes, in every prompt.
/// A shape's first two passes run as usual (`gpu_graph_id = -1`): the first sizes the arena, the
/// second allocates ONNX Runtime's memory pattern, so the capture (the third) allocates nothing
/// new; later passes replay it.
///
/// ONNX Runtime captures in CUDA's global mode, in which another thread's allocation or
/// synchronisation breaks the capture: a capturing pass and the decoder beside the DiT take turns
/// through a [`CaptureGate`], so the decoder waits out the captures of a process's first prompt
/// and runs beside every other pass.
pub(super) struct GraphCapture {
    pub(super) ids: GraphIds,
    /// The timestep of the pass being run, `[1, frames_per_block]` float32, at one address.
    pub(super) timestep: Buf,
}

/// Which graph each pass of the DiT runs as.
#[derive(Default, Debug)]
pub(super) struct GraphIds {
    /// The block shapes seen, each with the passes run so far with it; a shape's graph id is its
    /// position here plus one (0 is ONNX Runtime's default id, -1 a plain run).
    pub(super) shapes: Vec<(BlockShape, u32)>,
    /// Set when a buffer of the DiT's arena was reallocated after a capture: the chunks a graph
    /// captured may now hold that buffer, so no graph is replayed again.
    pub(super) stale: bool,
}

/// What distinguishes one block's DiT binding from another's.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct BlockShape {
    pub(super) block: usize,
    /// The first row of the KV cache the block's passes take (the attention window's first).
    pub(super) past_start: usize,
    /// The rows the earlier blocks wrote.
    pub(super) kv_len: usize,
}

/// Regular runs of a block shape before its capture (see [`GraphCapture`]).
const RUNS_BEFORE_CAPTURE: u32 = 2;

impl GraphIds {
    /// The `gpu_graph_id` of the next pass with this shape: -1 (a plain run) for its first
    /// passes or when the graphs went stale, else the shape's graph; and whether that pass
    /// captures it (its first use).
    pub(super) fn next_id(&mut self, shape: BlockShape) -> (i32, bool) {
        if self.stale {
            return (-1, false);
        }
        let index = match self.shapes.iter().position(|(s, _)| *s == shape) {
            Some(index) => index,
            None => {
                self.shapes.push((shape, 0));
                self.shapes.len() - 1
            }
        };
        let runs = &mut self.shapes[index].1;
        *runs = runs.saturating_add(1);
        if *runs <= RUNS_BEFORE_CAPTURE {
            (-1, false)
        } else {
            (index as i32 + 1, *runs == RUNS_BEFORE_CAPTURE + 1)
        }
    }
}

/// Turns between the DiT's capturing passes and the decoder's runs (see [`GraphCapture`]): a
/// capture waits for the decoder's run in progress, and a decoder run waits while a capture is
/// wanted or under way, so a capture waits for one decoder run at most (a plain mutex lets the
/// decoder take it back run after run).
#[derive(Default)]
pub(super) struct CaptureGate {
    state: std::sync::Mutex<GateState>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct GateState {
    /// A capture asked for its turn, or has it.
    capture: bool,
    /// A decoder run is under way.
    decoding: bool,
}

impl CaptureGate {
    fn wait_while<'a>(
        &'a self,
        state: std::sync::MutexGuard<'a, GateState>,
        busy: impl Fn(&GateState) -> bool,
    ) -> std::sync::MutexGuard<'a, GateState> {
        self.changed
            .wait_while(state, |s| busy(s))
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` as a capture: after the decoder's run in progress, with no decoder run beside it.
    /// The wait goes to the one-time ledger's `CaptureWait`.
    pub(super) fn capture<T>(&self, f: impl FnOnce() -> T) -> T {
        let asked = std::time::Instant::now();
        let mut state = self.lock();
        state.capture = true;
        drop(self.wait_while(state, |s| s.decoding));
        let _turn = Turn(self, |s: &mut GateState| s.capture = false);
        one_time::add(one_time::Work::CaptureWait, asked.elapsed());
        f()
    }

    /// Runs `f` as a decoder run: when no capture is wanted or under way.
    pub(super) fn decode<T>(&self, f: impl FnOnce() -> T) -> T {
        let state = self.lock();
        self.wait_while(state, |s| s.capture).decoding = true;
        let _turn = Turn(self, |s: &mut GateState| s.decoding = false);
        f()
    }
}

/// Ends a turn of the [`CaptureGate`] when dropped, also when the turn's work panics, so that the
/// other thread never waits for a turn that will not end.
struct Turn<'a, F: Fn(&mut GateState)>(&'a CaptureGate, F);

impl<F: Fn(&mut GateState)> Drop for Turn<'_, F> {
    fn drop(&mut self) {
        (self.1)(&mut self.0.lock());
        self.0.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(block: usize) -> BlockShape {
        BlockShape {
            block,
            past_start: 0,
            kv_len: block * 10,
        }
    }

    /// Each block shape runs twice as usual, then captures its own graph once and replays it;
    /// the next prompt replays every block's graph from its first pass.
    #[test]
    fn each_block_shape_runs_plainly_twice_then_captures_one_graph_and_replays_it() {
        let mut ids = GraphIds::default();
        let shapes = [shape(0), shape(1)];
        let plain = (-1, false);
        let first: Vec<_> = (0..5).map(|_| ids.next_id(shapes[0])).collect();
        assert_eq!(first, [plain, plain, (1, true), (1, false), (1, false)]);
        let second: Vec<_> = (0..5).map(|_| ids.next_id(shapes[1])).collect();
        assert_eq!(second, [plain, plain, (2, true), (2, false), (2, false)]);
        // Another prompt: every pass replays, none captures.
        assert_eq!(ids.next_id(shapes[0]), (1, false));
        assert_eq!(ids.next_id(shapes[1]), (2, false));
        // A shape not seen before (another attention window) gets its own graph, after two
        // plain passes.
        let windowed = BlockShape {
            past_start: 10,
            ..shape(2)
        };
        let third: Vec<_> = (0..3).map(|_| ids.next_id(windowed)).collect();
        assert_eq!(third, [plain, plain, (3, true)]);
    }

    /// A capture asked for while the decoder runs waits for that run alone: the decoder starts no
    /// run while the capture is wanted or under way (real threads; the decoder's first run lasts
    /// until the capture has asked for its turn).
    #[test]
    fn a_capture_waits_for_the_decoder_run_in_progress_and_no_more() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let gate = CaptureGate::default();
        let decoding = AtomicBool::new(false);
        let finished = AtomicUsize::new(0);
        let (started, first_started) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for run in 0..4 {
                    gate.decode(|| {
                        decoding.store(true, Ordering::SeqCst);
                        if run == 0 {
                            started.send(()).unwrap();
                            while !gate.lock().capture {
                                std::thread::yield_now();
                            }
                        }
                        decoding.store(false, Ordering::SeqCst);
                        finished.fetch_add(1, Ordering::SeqCst);
                    });
                }
            });
            first_started.recv().unwrap();
            let seen = gate.capture(|| {
                assert!(
                    !decoding.load(Ordering::SeqCst),
                    "a decoder run beside the capture"
                );
                finished.load(Ordering::SeqCst)
            });
            assert_eq!(
                seen, 1,
                "the capture waited for the run in progress and no other"
            );
        });
        assert_eq!(
            finished.load(Ordering::SeqCst),
            4,
            "the decoder went on after it"
        );
    }

    /// A turn that panics still ends: the other side does not wait for it forever.
    #[test]
    fn a_panicking_turn_ends_its_turn() {
        let gate = CaptureGate::default();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            gate.decode(|| panic!("a decoder run failed"))
        }));
        assert!(caught.is_err());
        assert_eq!(gate.capture(|| 7), 7, "the capture got its turn");
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            gate.capture(|| panic!("a capture failed"))
        }));
        assert!(caught.is_err());
        assert_eq!(gate.decode(|| 8), 8, "the decoder got its turn");
    }

    /// Stale graphs are never replayed: every pass runs plainly, and none captures.
    #[test]
    fn stale_graphs_are_never_replayed() {
        let mut ids = GraphIds::default();
        for _ in 0..3 {
            ids.next_id(shape(0));
        }
        ids.stale = true;
        assert_eq!(ids.next_id(shape(0)), (-1, false));
        assert_eq!(ids.next_id(shape(1)), (-1, false));
    }
}

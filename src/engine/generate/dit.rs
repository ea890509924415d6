//! The DiT's side of the loop: the block loop (denoising steps, the clean-cache pass, the block's
//! output latents), each block's binding of the KV cache and context, the DiT passes, and the
//! scheduler arithmetic between them as the runner's `axpby` graph.
//!
//! The KV cache is one buffer per layer and kind; `past_*.{i}` are bound as views of its prefix
//! (or of the window's suffix of it) and `new_*.{i}` as views straight after it; a graph that
//! writes the cache in place ([`KvInterface::InPlace`]) takes `kv_*.{i}`, one view of the prefix
//! and the block's rows after it. Every pass writes its keys and values there; only the
//! clean-cache pass's survive, because the next block's prefix is extended only after it.

use std::time::Instant;

use ort::session::{RunOptions, Session};

use super::buffers::{Bound, Buf};
use super::capture::{BlockShape, CaptureGate};
use super::state::DeviceLoop;
use super::{GenerateError, PhaseTimes, run_error};
use crate::engine::one_time::Work;
use crate::engine::schedule::{Emit, MethodSettings, Schedule};
use crate::engine::session::KvInterface;

/// Coefficient pairs (a, b) of [`crate::engine::onnx_graph::axpby`] used by one schedule, uploaded once per
/// prompt: index `2k` holds a, `2k + 1` holds b.
pub(super) struct Coefficients {
    pub(super) values: Vec<f32>,
}

impl Coefficients {
    fn push(&mut self, a: f32, b: f32) -> usize {
        self.values.push(a);
        self.values.push(b);
        self.values.len() / 2 - 1
    }
}

/// Indices into the coefficient table for one schedule.
pub(super) struct Plan {
    /// (1, 0): a copy.
    copy: usize,
    /// Per step j: (1, −σ_j), giving x0.
    x0: Vec<usize>,
    /// Per step j > 0: (1 − σ_j, σ_j), the re-noising to step j.
    renoise: Vec<usize>,
    /// (1 − σ_c, σ_c), the re-noising to the clean-cache level.
    clean: usize,
    /// (1, −σ_c), the clean-cache pass's x0.
    clean_x0: usize,
}

pub(super) fn plan(schedule: &Schedule) -> (Coefficients, Plan) {
    let mut c = Coefficients { values: Vec::new() };
    let copy = c.push(1.0, 0.0);
    let x0 = schedule
        .steps
        .iter()
        .map(|l| c.push(1.0, -l.sigma))
        .collect();
    let renoise = schedule
        .steps
        .iter()
        .map(|l| c.push(1.0 - l.sigma, l.sigma))
        .collect();
    let sc = schedule.clean.sigma;
    let clean = c.push(1.0 - sc, sc);
    let clean_x0 = c.push(1.0, -sc);
    (
        c,
        Plan {
            copy,
            x0,
            renoise,
            clean,
            clean_x0,
        },
    )
}

/// What the block loop needs of one prompt's method.
pub(super) struct Steps<'a> {
    pub(super) schedule: &'a Schedule,
    pub(super) plan: Plan,
    pub(super) method: &'a MethodSettings,
    /// Noise draws per block.
    pub(super) draws: usize,
}

impl DeviceLoop {
    /// `out = a·p + b·q` (and its bundle-typed copy into `out_model`).
    #[allow(clippy::too_many_arguments)]
    fn axpby(
        &mut self,
        q_is_model: bool,
        p: (&Buf, usize),
        q: (&Buf, usize),
        coefficient: usize,
        out: (&Buf, usize),
        out_model: (&Buf, usize),
        times: &mut PhaseTimes,
    ) -> Result<(), GenerateError> {
        let e = run_error("axpby");
        let n = self.d.block_elems() as i64;
        let one = [1i64];
        let mut binding = if q_is_model {
            self.graphs.axpby_model.create_binding().map(Bound::new)
        } else {
            self.graphs.axpby_f32.create_binding().map(Bound::new)
        }
        .map_err(e)?;
        binding.input("p", self.view(p.0, p.1, &[n])?).map_err(e)?;
        binding.input("q", self.view(q.0, q.1, &[n])?).map_err(e)?;
        binding
            .input("a", self.view(&self.coefficients, 2 * coefficient, &one)?)
            .map_err(e)?;
        binding
            .input(
                "b",
                self.view(&self.coefficients, 2 * coefficient + 1, &one)?,
            )
            .map_err(e)?;
        binding
            .output("y", self.view(out.0, out.1, &[n])?)
            .map_err(e)?;
        binding
            .output("y_model", self.view(out_model.0, out_model.1, &[n])?)
            .map_err(e)?;
        let session = if q_is_model {
            &mut self.graphs.axpby_model
        } else {
            &mut self.graphs.axpby_f32
        };
        let start = Instant::now();
        session.run_binding(&binding.binding).map_err(e)?;
        times.session_run += start.elapsed();
        Ok(())
    }

    /// The block loop: denoising steps, the clean-cache pass, the block's output latents.
    pub(super) fn denoise(
        &mut self,
        dit: &mut Session,
        gate: &CaptureGate,
        latents: &Buf,
        work: &Steps<'_>,
        times: &mut PhaseTimes,
        on_block: &mut dyn FnMut(usize),
    ) -> Result<(), GenerateError> {
        let Steps {
            schedule,
            plan,
            method,
            draws,
        } = work;
        let (method, draws) = (*method, *draws);
        let d = self.d;
        let steps = schedule.steps.len();
        let block = d.block_elems();
        for (b, shape) in self.block_shapes(method).into_iter().enumerate() {
            let mut binding = self.dit_binding(dit, shape)?;
            let noise_at = |k: usize| (b * draws + k) * block;
            // x = ε_0 (and its bundle-typed copy for the DiT).
            let (x, xm, x0, flow, scratch, nz) = (
                &self.x as *const Buf,
                &self.x_model as *const Buf,
                &self.x0 as *const Buf,
                &self.flow as *const Buf,
                &self.scratch as *const Buf,
                &self.noise as *const Buf,
            );
            // SAFETY: the buffers are fields of `self` that `axpby` only reads through views; the
            // raw pointers only sidestep borrowing `self` mutably (for the session) and immutably
            // (for the buffers) in the same call.
            let (x, xm, x0, flow, scratch, nz) =
                unsafe { (&*x, &*xm, &*x0, &*flow, &*scratch, &*nz) };
            self.axpby(
                false,
                (nz, noise_at(0)),
                (nz, noise_at(0)),
                plan.copy,
                (x, 0),
                (xm, 0),
                times,
            )?;
            for j in 0..steps {
                self.dit_pass(dit, &mut binding, shape, gate, j, times)?;
                self.axpby(
                    true,
                    (x, 0),
                    (flow, 0),
                    plan.x0[j],
                    (x0, 0),
                    (scratch, 0),
                    times,
                )?;
                if j + 1 < steps {
                    self.axpby(
                        false,
                        (x0, 0),
                        (nz, noise_at(j + 1)),
                        plan.renoise[j + 1],
                        (x, 0),
                        (xm, 0),
                        times,
                    )?;
                }
            }
            // The clean-cache pass fills the KV cache for later blocks; after the last block it
            // only matters when its output is what the block emits.
            let last = b + 1 == d.blocks();
            if !last || method.emit == Emit::CachePass || self.run_unread_clean_pass {
                self.axpby(
                    false,
                    (x0, 0),
                    (nz, noise_at(steps)),
                    plan.clean,
                    (x, 0),
                    (xm, 0),
                    times,
                )?;
                self.dit_pass(dit, &mut binding, shape, gate, steps, times)?;
            }
            match method.emit {
                Emit::CachePass => self.axpby(
                    true,
                    (x, 0),
                    (flow, 0),
                    plan.clean_x0,
                    (latents, b * block),
                    (scratch, 0),
                    times,
                )?,
                Emit::Denoised => self.axpby(
                    false,
                    (x0, 0),
                    (x0, 0),
                    plan.copy,
                    (latents, b * block),
                    (scratch, 0),
                    times,
                )?,
            }
            // The block's latents are final on the device (the run has synchronised): hand it
            // to the decoder.
            on_block(b);
        }
        Ok(())
    }

    /// Each block's rows of the KV cache: the earlier blocks' (`kv_len`), of which the DiT takes
    /// those from `past_start` (the attention window's first).
    fn block_shapes(&self, method: &MethodSettings) -> Vec<BlockShape> {
        let d = self.d;
        let window_tokens = (method.attention_window >= 0)
            .then(|| method.attention_window as usize * d.tokens_per_frame);
        (0..d.blocks())
            .map(|block| {
                let kv_len = block * d.block_tokens();
                BlockShape {
                    block,
                    past_start: window_tokens.map_or(0, |w| kv_len.saturating_sub(w)),
                    kv_len,
                }
            })
            .collect()
    }

    /// The DiT binding of one block: the same for all its passes, but for the timestep, which
    /// `dit_pass` binds (or, with CUDA graphs, copies into the one buffer bound here).
    fn dit_binding(&self, dit: &Session, shape: BlockShape) -> Result<Bound, GenerateError> {
        let e = run_error("dit");
        let d = self.d;
        let BlockShape {
            block,
            past_start,
            kv_len,
        } = shape;

        let mut binding = dit.create_binding().map(Bound::new).map_err(e)?;
        if let Some(capture) = &self.capture {
            let f = d.frames_per_block as i64;
            binding
                .input("timestep", self.view(&capture.timestep, 0, &[1, f])?)
                .map_err(e)?;
        }
        let x_shape = d.block_shape();
        binding
            .input("x", self.view(&self.x_model, 0, &x_shape)?)
            .map_err(e)?;
        // The context itself, or (from `dit_context`) its keys and values.
        if self.context_kv.is_empty() {
            binding.input("context", self.context_view()?).map_err(e)?;
        }
        for (name, view) in self.context_kv_views()? {
            binding.input(name, view).map_err(e)?;
        }
        binding
            .input("frame_offset", self.view(&self.offsets, block, &[1])?)
            .map_err(e)?;
        // The cache's rows the graph takes: the earlier blocks' (from `past_start`, the attention
        // window's first), and in place the block's own after them.
        let in_place = self.names.interface == KvInterface::InPlace;
        let taken = kv_len - past_start + if in_place { d.block_tokens() } else { 0 };
        let past = [1, taken as i64, d.dim as i64];
        let new = [1, d.block_tokens() as i64, d.dim as i64];
        let last = block + 1 == d.blocks();
        for layer in 0..d.layers {
            for (kind, cache, scratch) in [
                (0, &self.kv_k[layer], &self.kv_scratch[0]),
                (1, &self.kv_v[layer], &self.kv_scratch[1]),
            ] {
                binding
                    .input(
                        self.names.inputs[layer][kind].as_str(),
                        self.view(cache, past_start * d.dim, &past)?,
                    )
                    .map_err(e)?;
                let Some(outputs) = self.names.outputs.get(layer) else {
                    continue;
                };
                let new_view = if last {
                    self.view(scratch, 0, &new)?
                } else {
                    self.view(cache, kv_len * d.dim, &new)?
                };
                binding
                    .output(outputs[kind].as_str(), new_view)
                    .map_err(e)?;
            }
        }
        binding
            .output("flow", self.view(&self.flow, 0, &x_shape)?)
            .map_err(e)?;
        Ok(binding)
    }

    /// One DiT pass at level `level` (steps, then the clean level).
    fn dit_pass(
        &mut self,
        dit: &mut Session,
        binding: &mut Bound,
        shape: BlockShape,
        gate: &CaptureGate,
        level: usize,
        times: &mut PhaseTimes,
    ) -> Result<(), GenerateError> {
        let e = run_error("dit");
        let f = self.d.frames_per_block;
        let timestep = self.view(&self.timesteps, level * f, &[1, f as i64])?;
        let start = Instant::now();
        match &mut self.capture {
            None => {
                binding.input("timestep", timestep).map_err(e)?;
                dit.run_binding(&binding.binding).map_err(e)?;
            }
            Some(capture) => {
                // The level's timestep into the buffer every pass of the graph reads.
                let copy = run_error("timestep copy");
                let identity = &mut self.graphs.identity_f32;
                let mut copy_binding = identity.create_binding().map(Bound::new).map_err(copy)?;
                copy_binding.input("x", timestep).map_err(copy)?;
                copy_binding
                    .output(
                        "y",
                        capture
                            .timestep
                            .view(&self.mem, 0, &[1, f as i64])
                            .map_err(copy)?,
                    )
                    .map_err(copy)?;
                identity.run_binding(&copy_binding.binding).map_err(copy)?;
                let (id, capturing) = capture.ids.next_id(shape);
                let mut options = RunOptions::new().map_err(e)?;
                options.set("gpu_graph_id", id.to_string()).map_err(e)?;
                let mut run = || {
                    dit.run_binding_with_options(&binding.binding, &options)
                        .map(drop)
                };
                let result = if capturing {
                    gate.capture(|| crate::engine::one_time::timed(Work::GraphCapture, run))
                } else {
                    run()
                };
                result.map_err(e)?;
            }
        }
        times.session_run += start.elapsed();
        self.dit_passes += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::generate::{GenerateOptions, Generator};
    use crate::engine::schedule::{Emit, MethodSettings};

    /// Under `emit = "denoised"` the last block's clean-cache pass is skipped: nothing reads its
    /// output or the cache it writes. Making it anyway (one DiT pass more) leaves the latents and
    /// frames byte-identical (the tiny bundle, CPU).
    #[test]
    fn skipping_the_unread_clean_pass_leaves_the_video_byte_identical() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let prompts = std::fs::read_to_string(root.join("assets/prompts/tiny.txt")).unwrap();
        let prompt = prompts.lines().next().unwrap();
        let unpack = tempfile::tempdir().unwrap();
        let mut generator = Generator::open(
            &root.join("assets/tiny"),
            unpack.path(),
            &Default::default(),
            &Default::default(),
        )
        .expect("open the tiny bundle");
        let options = GenerateOptions {
            method: MethodSettings {
                emit: Emit::Denoised,
                ..MethodSettings::default()
            },
            ..GenerateOptions::default()
        };
        let run = |generator: &mut Generator| {
            let before = generator.state.dit_passes;
            let generated = generator.generate(0, prompt, &options).unwrap();
            (generated, generator.state.dit_passes - before)
        };
        let (skipped, skipped_passes) = run(&mut generator);
        generator.state.run_unread_clean_pass = true;
        let (made, made_passes) = run(&mut generator);
        assert_eq!(made_passes, skipped_passes + 1, "one DiT pass more");
        assert!(!skipped.frames.is_empty());
        assert_eq!(skipped.latents, made.latents, "latents");
        assert_eq!(skipped.frames, made.frames, "frames");
    }
}

//! One prompt through the loop, phase by phase: before the timed region, the context, every noise
//! draw of the prompt (drawn on the host and uploaded in one copy, as the exporter's reference
//! draws it) and the schedule's tables; the timed region, the DiT with the VAE decoder beside it
//! or after it, then the uint8 layout; after it, the copies of latents and frames to the host.

use std::time::{Duration, Instant};

use ort::memory::Allocator;
use ort::value::TensorElementType;

use super::arena::log_arenas;
use super::buffers::Buf;
use super::capture::{CaptureGate, GraphCapture};
use super::context::HostContext;
use super::decode::{VaeBufs, VaeParts, decode_all, decode_blocks, layout_frames};
use super::dims::Dims;
use super::dit::{Steps, plan};
use super::state::{DeviceLoop, DeviceOutput};
use super::{GenerateError, GenerateOptions, PhaseTimes, TimedRegionEnd, run_error};
use crate::engine::schedule::Schedule;
use crate::engine::session::GraphSessions;

/// How the DiT's side of the timed region ended.
struct DitRun {
    result: Result<(), GenerateError>,
    /// When the DiT's last block was done.
    end: Instant,
    /// With the decoder beside the DiT, its result: the time it spent in `Session::run`.
    decoded: Option<Result<Duration, GenerateError>>,
}

impl DeviceLoop {
    /// Generates one prompt from its text context (encoded on the host, in `encoding`).
    pub(super) fn generate(
        &mut self,
        sessions: &mut GraphSessions,
        context: &HostContext,
        encoding: Duration,
        noise: &(dyn Fn(u32, &mut [f32]) + Sync),
        schedule: &Schedule,
        options: &GenerateOptions,
    ) -> Result<DeviceOutput, GenerateError> {
        let mut vae = self.vae.take().ok_or_else(|| GenerateError::Run {
            graph: "device loop",
            message: "the decoder state was lost by an earlier panic".into(),
        })?;
        // Outside the timed region, like the noise and tables of `upload_tables`.
        self.upload_context(context)?;
        let result = self
            .generate_with(&mut vae, sessions, noise, schedule, options)
            .map(|mut out| {
                out.times.text_encoding = encoding;
                out
            });
        self.vae = Some(vae);
        if self.memory.is_some() {
            log_arenas(sessions, &self.mem);
        }
        result
    }

    fn generate_with(
        &mut self,
        vae: &mut VaeParts,
        sessions: &mut GraphSessions,
        noise: &(dyn Fn(u32, &mut [f32]) + Sync),
        schedule: &Schedule,
        options: &GenerateOptions,
    ) -> Result<DeviceOutput, GenerateError> {
        let mut times = PhaseTimes::default();
        // Outside the timed region: noise, tables.
        let work = self.upload_tables(noise, schedule, options)?;
        let end = self.timed_region(vae, sessions, &work, options, &mut times)?;
        let peak_device_memory = self.memory.as_ref().and_then(|m| m.in_use());
        // After the timed region: copies to the host.
        let (latents, frames) = self.download(&vae.bufs, options.latents_only)?;
        Ok(DeviceOutput {
            latents,
            frames,
            times,
            end,
            peak_device_memory,
        })
    }

    /// Uploads every noise draw of the prompt, the schedule's `axpby` coefficients and its
    /// timesteps (outside the timed region).
    fn upload_tables<'a>(
        &mut self,
        noise: &(dyn Fn(u32, &mut [f32]) + Sync),
        schedule: &'a Schedule,
        options: &'a GenerateOptions,
    ) -> Result<Steps<'a>, GenerateError> {
        let d = self.d;
        let setup = run_error("device upload");
        let steps = schedule.steps.len();
        let draws = schedule.draws_per_block() as usize;
        let block = d.block_elems();
        let total_draws = d.blocks() * draws;
        self.grow_tables(total_draws * block, steps)?;
        let mut host_noise = vec![0.0f32; total_draws * block];
        {
            use rayon::prelude::*;
            host_noise
                .par_chunks_mut(block)
                .enumerate()
                .for_each(|(draw, chunk)| noise(draw as u32, chunk));
        }
        self.noise
            .upload(&mut self.graphs.identity_f32, &self.mem, &host_noise)
            .map_err(setup)?;
        let (coefficients, plan) = plan(schedule);
        self.coefficients
            .upload(
                &mut self.graphs.identity_f32,
                &self.mem,
                &coefficients.values,
            )
            .map_err(setup)?;
        // Timesteps: per step level, then the clean level, `fpb` values each.
        let mut ts = Vec::with_capacity((steps + 1) * d.frames_per_block);
        for level in schedule.steps.iter().chain([&schedule.clean]) {
            ts.extend(std::iter::repeat_n(level.timestep, d.frames_per_block));
        }
        self.timesteps
            .upload(&mut self.graphs.identity_f32, &self.mem, &ts)
            .map_err(setup)?;
        Ok(Steps {
            schedule,
            plan,
            method: &options.method,
            draws,
        })
    }

    /// Grows the noise and schedule tables, sized for the default schedule, once for a longer
    /// one (`noise_len` elements of noise, `steps` denoising steps).
    fn grow_tables(&mut self, noise_len: usize, steps: usize) -> Result<(), GenerateError> {
        let d = self.d;
        let grow =
            |buf: &mut Buf, ty, len: usize, alloc: &Allocator| -> Result<bool, GenerateError> {
                if buf.len < len {
                    *buf = Buf::new(alloc, ty, len).map_err(run_error("device setup"))?;
                    return Ok(true);
                }
                Ok(false)
            };
        let f32_ = TensorElementType::Float32;
        let grown = grow(&mut self.noise, f32_, noise_len, &self.alloc)?
            | grow(
                &mut self.coefficients,
                f32_,
                2 * (2 * steps + 3),
                &self.alloc,
            )?
            | grow(
                &mut self.timesteps,
                f32_,
                (steps + 1) * d.frames_per_block,
                &self.alloc,
            )?;
        if let Some(GraphCapture { ids, .. }) = &mut self.capture
            && grown
            && !ids.shapes.is_empty()
            && !ids.stale
        {
            ids.stale = true;
            eprintln!(
                "warning: the schedule outgrew the loop's buffers after the DiT's CUDA graphs were \
                 captured; this process runs the DiT without them from now on"
            );
        }
        Ok(())
    }

    /// The timed region: `dit_context`, the DiT's blocks with the decoder beside them or after
    /// them, and the layout. Returns where the region ended.
    fn timed_region(
        &mut self,
        vae: &mut VaeParts,
        sessions: &mut GraphSessions,
        work: &Steps<'_>,
        options: &GenerateOptions,
        times: &mut PhaseTimes,
    ) -> Result<TimedRegionEnd, GenerateError> {
        let timed_start = Instant::now();
        if let Some(session) = &mut sessions.dit_context {
            self.context_keys_values(session, times)?;
        }
        let overlap = self.overlap_vae && !options.latents_only;
        // Turns between a DiT pass that captures a CUDA graph and the decoder's runs.
        let gate = CaptureGate::default();
        let dit = self.dit_beside_decoder(vae, sessions, &gate, work, overlap, times);
        dit.result?;
        let dit_end = dit.end;
        times.dit = dit_end - timed_start;

        if options.latents_only {
            times.timed_total = times.dit;
            return Ok(TimedRegionEnd::Latents);
        }
        // With the overlap, what is left of the decode after the DiT's last block; otherwise
        // the whole decode, here on this thread.
        let VaeParts {
            latent_frame,
            layout,
            bufs,
        } = vae;
        let decode_run = match dit.decoded {
            Some(result) => result?,
            None => decode_all(
                bufs,
                latent_frame,
                &mut sessions.vae_first,
                &mut sessions.vae_step,
                &gate,
            )?,
        };
        times.session_run += decode_run;
        let vae_end = Instant::now();
        times.vae = vae_end - dit_end;
        layout_frames(bufs, layout, &self.mem, times)?;
        let layout_end = Instant::now();
        times.layout = layout_end - vae_end;
        Ok(if options.exclude_final_output_layout {
            // The layout ran after the region's end: none of the timed total is the layout's.
            times.timed_total = vae_end - timed_start;
            times.layout = Duration::ZERO;
            TimedRegionEnd::VaeOutput
        } else {
            times.timed_total = layout_end - timed_start;
            TimedRegionEnd::Uint8Frames
        })
    }

    /// Runs the DiT's blocks on this thread; with `overlap`, a decoder thread beside it decodes
    /// each block as the DiT hands it over.
    fn dit_beside_decoder(
        &mut self,
        vae: &mut VaeParts,
        sessions: &mut GraphSessions,
        gate: &CaptureGate,
        work: &Steps<'_>,
        overlap: bool,
        times: &mut PhaseTimes,
    ) -> DitRun {
        let GraphSessions {
            dit,
            vae_first,
            vae_step,
            ..
        } = sessions;
        let VaeParts {
            latent_frame, bufs, ..
        } = vae;
        let bufs: &VaeBufs = bufs;
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel::<usize>();
            let decoder = if overlap {
                let (lf, first, step) = (&mut *latent_frame, &mut *vae_first, &mut *vae_step);
                Some(scope.spawn(move || decode_blocks(bufs, lf, first, step, rx, gate)))
            } else {
                None
            };
            let result = self.denoise(dit, gate, &bufs.latents, work, times, &mut |b| {
                if overlap {
                    // A closed channel means the decoder failed; its error is reported below.
                    let _ = tx.send(b);
                }
            });
            drop(tx);
            let end = Instant::now();
            let decoded = decoder.map(|h| h.join().expect("the VAE decoder thread panicked"));
            DitRun {
                result,
                end,
                decoded,
            }
        })
    }

    /// Copies the latents (in the video's order) and, unless only latents were asked for, the
    /// uint8 frames to the host (after the timed region).
    fn download(
        &mut self,
        bufs: &VaeBufs,
        latents_only: bool,
    ) -> Result<(Vec<f32>, Vec<u8>), GenerateError> {
        let d = self.d;
        let down = run_error("device download");
        let blocks_f32: Vec<f32> = bufs
            .latents
            .download(
                &mut self.graphs.identity_f32,
                &self.mem,
                d.blocks() * d.block_elems(),
            )
            .map_err(down)?;
        let latents = video_order(&d, &blocks_f32);
        let frames = if latents_only {
            Vec::new()
        } else {
            bufs.frames_u8
                .download(&mut self.graphs.identity_u8, &self.mem, bufs.frames_u8.len)
                .map_err(down)?
        };
        Ok((latents, frames))
    }
}

/// Latents block after block, `[blocks][C][F][h][w]`, in the video's order,
/// `[C][latent_frames][h][w]`.
fn video_order(d: &Dims, blocks_f32: &[f32]) -> Vec<f32> {
    let block = d.block_elems();
    let plane = d.h * d.w;
    let mut latents = vec![0.0f32; blocks_f32.len()];
    for b in 0..d.blocks() {
        for c in 0..d.channels {
            for f in 0..d.frames_per_block {
                let src = &blocks_f32[b * block + (c * d.frames_per_block + f) * plane..][..plane];
                let t = b * d.frames_per_block + f;
                latents[(c * d.latent_frames + t) * plane..][..plane].copy_from_slice(src);
            }
        }
    }
    latents
}

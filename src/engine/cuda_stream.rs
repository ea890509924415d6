//! CUDA streams the runner owns and hands to ONNX Runtime's CUDA provider
//! (`user_compute_stream`), so that the device loop can queue a whole block's runs without waiting
//! for the device between them.
//!
//! ONNX Runtime waits for its stream at the end of every `run`. Between two runs the device then
//! idles while the host returns, rebinds and starts the next run, and the first small kernels of a
//! DiT pass (the time embedding, the cross-attention keys of 30 layers) run one launch at a time
//! behind the host. Measured on wan-1.3b (one H200, kernel trace with the VAE after the DiT):
//! about 1.5 ms of idle device at each DiT pass's start and 40 µs per layer. With every session
//! of one thread on one stream, runs on that thread are ordered by the stream alone; the loop
//! waits for the stream only where another thread or the host reads what the runs wrote (a block's
//! latents for the decoder, the end of the timed region). Same call, five videos each: 2.852 s
//! per video against 2.876 s (the decoder beside the DiT already filled much of that idle time),
//! 2.911 s with the VAE after the DiT; peak device memory 17.6 GiB against 18.4; videos
//! byte-identical.

use std::sync::Arc;

use cudarc::driver::{result as driver, sys};

/// A context made current on this thread for as long as the guard lives (pushed only when it is
/// not current already).
pub(crate) struct CurrentContext {
    pushed: bool,
}

impl CurrentContext {
    pub(crate) fn enter(context: sys::CUcontext) -> Result<Self, driver::DriverError> {
        if driver::ctx::get_current()? == Some(context) {
            return Ok(Self { pushed: false });
        }
        // SAFETY: `context` is a retained primary context, alive while its owner holds it.
        unsafe { sys::cuCtxPushCurrent_v2(context) }.result()?;
        Ok(Self { pushed: true })
    }
}

impl Drop for CurrentContext {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped = std::ptr::null_mut();
            // SAFETY: pops the context `enter` pushed on this thread.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

/// One non-blocking stream in a device's primary context (the context ONNX Runtime's CUDA
/// provider runs in).
pub(crate) struct Stream {
    raw: sys::CUstream,
    context: sys::CUcontext,
    device: sys::CUdevice,
}

// SAFETY: a CUDA stream and a primary context may be used from any thread; `Stream` only passes
// them to the driver.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    fn new(ordinal: i32) -> Result<Self, String> {
        let fail = |what: &str, e: driver::DriverError| {
            format!("CUDA stream for the device loop: {what} on CUDA device {ordinal}: {e}")
        };
        // SAFETY: only checks that the driver library opens.
        if !unsafe { sys::is_culib_present() } {
            return Err(
                "CUDA stream for the device loop: could not load the CUDA driver library \
                 (libcuda.so.1); install the NVIDIA driver"
                    .into(),
            );
        }
        driver::init().map_err(|e| fail("cuInit", e))?;
        let device = driver::device::get(ordinal).map_err(|e| fail("cuDeviceGet", e))?;
        // SAFETY: `device` came from cuDeviceGet; released in `drop`.
        let context = unsafe { driver::primary_ctx::retain(device) }
            .map_err(|e| fail("cuDevicePrimaryCtxRetain", e))?;
        let made = (|| {
            let _current = CurrentContext::enter(context)?;
            driver::stream::create(driver::stream::StreamKind::NonBlocking)
        })();
        match made {
            Ok(raw) => Ok(Self {
                raw,
                context,
                device,
            }),
            Err(e) => {
                // SAFETY: the reference retained above.
                let _ = unsafe { driver::primary_ctx::release(device) };
                Err(fail("cuStreamCreate", e))
            }
        }
    }

    /// The stream as ONNX Runtime's `user_compute_stream` takes it.
    pub(crate) fn handle(&self) -> usize {
        self.raw as usize
    }

    /// Waits until everything queued on the stream has run.
    pub(crate) fn synchronize(&self) -> Result<(), String> {
        let _current =
            CurrentContext::enter(self.context).map_err(|e| format!("cuCtxPushCurrent: {e}"))?;
        // SAFETY: the stream lives until `self` is dropped.
        unsafe { driver::stream::synchronize(self.raw) }
            .map_err(|e| format!("cuStreamSynchronize: {e}"))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(_current) = CurrentContext::enter(self.context) {
            // SAFETY: no session uses the stream any more (its owners drop their sessions first).
            let _ = unsafe { driver::stream::destroy(self.raw) };
        }
        // SAFETY: the reference `new` retained.
        let _ = unsafe { driver::primary_ctx::release(self.device) };
    }
}

/// The device loop's two streams: one for the thread that runs the DiT (and the scheduler
/// arithmetic, uploads and downloads around it), one for the decoder's thread.
pub(crate) struct DeviceStreams {
    pub(crate) dit: Stream,
    pub(crate) vae: Stream,
}

impl DeviceStreams {
    pub(crate) fn new(ordinal: i32) -> Result<Arc<Self>, String> {
        Ok(Arc::new(Self {
            dit: Stream::new(ordinal)?,
            vae: Stream::new(ordinal)?,
        }))
    }
}

//! Device memory in use, read from the CUDA runtime that ONNX Runtime's CUDA provider loaded
//! (`cudaMemGetInfo`), without linking CUDA into the runner.
//!
//! ONNX Runtime's CUDA arena grows and never shrinks (unless asked to), so the memory in use after
//! a prompt is at least the most the prompt ever needed: it is reported as the prompt's peak. It
//! counts the whole device (the CUDA context and every process on it), so it is an upper bound.

use libloading::{Library, Symbol};

type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> i32;

pub(crate) struct MemoryProbe {
    library: Library,
}

impl MemoryProbe {
    /// The CUDA runtime, when one can be loaded (the one on the library path, as ONNX Runtime's
    /// CUDA provider loads it); `None` leaves peak memory unreported.
    pub(crate) fn open() -> Option<Self> {
        ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
            .into_iter()
            // SAFETY: loading the CUDA runtime runs no initialisers with preconditions.
            .find_map(|name| unsafe { Library::new(name) }.ok())
            .map(|library| Self { library })
    }

    /// Bytes in use on the current device now (`total - free`).
    pub(crate) fn in_use(&self) -> Option<u64> {
        // SAFETY: `cudaMemGetInfo(size_t *free, size_t *total)` has this signature in every CUDA
        // runtime since 2.0.
        unsafe {
            let f: Symbol<MemGetInfo> = self.library.get(b"cudaMemGetInfo\0").ok()?;
            let (mut free, mut total) = (0usize, 0usize);
            (f(&mut free, &mut total) == 0).then(|| (total - free) as u64)
        }
    }
}

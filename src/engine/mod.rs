//! The engine: everything that touches ONNX Runtime and the GPU lives here and only here.
//!
//! Passes, in the order a worker uses them: [`ort_lib`] finds and loads ONNX Runtime once per
//! process; [`bundle`] opens and checks an asset bundle; [`session`] builds the graphs' sessions
//! on the requested execution provider; [`generate`] runs the block-causal loop with
//! [`schedule`] and [`noise`]; [`probe`] reports the environment for `runner doctor`.
//!
//! ```no_run
//! use std::path::Path;
//! use unstep::engine::{ExportSettings, GenerateOptions, Generator, MethodSettings, RuntimeOptions};
//!
//! // Opening checks the bundle (checksums, graph contract, export settings) before any
//! // generation; a `.zip` bundle is unpacked into the second path.
//! let mut generator = Generator::open(
//!     Path::new("assets/tiny"),
//!     Path::new("/tmp/unpacked-bundles"),
//!     &ExportSettings::default(),
//!     &RuntimeOptions::default(),
//! )?;
//! let options = GenerateOptions {
//!     method: MethodSettings { clean_sigma: 0.01, ..MethodSettings::default() },
//!     ..GenerateOptions::default()
//! };
//! // The index is the prompt's global index: it selects the noise.
//! let video = generator.generate(7, "a campfire crackling under a starry sky", &options)?;
//! println!("{} frames in {:?}", video.frame_shape[0], video.times.timed_total);
//! # Ok::<(), unstep::engine::GenerateError>(())
//! ```

pub mod bundle;
mod cuda_memory;
mod device;
pub mod generate;
pub(crate) mod kernels;
pub mod noise;
pub mod onnx_graph;
pub mod ort_lib;
pub mod probe;
pub mod schedule;
pub mod session;

pub use bundle::{Bundle, BundleError, BundleManifest, ExportSettings, Precision, SvdRank};
pub use generate::{
    GenerateError, GenerateOptions, Generated, Generator, PhaseTimes, TimedRegionEnd,
};
pub use noise::fill_normal;
pub use ort_lib::{OrtLoadError, OrtLocation, OrtRuntime, OrtSource};
pub use probe::{Check, probe_environment};
pub use schedule::{Emit, MethodSettings, Schedule, ScheduleError};
pub use session::{
    ArenaExtend, AttentionKernel, ContextInterface, ConvAlgoSearch, CudaOptions, FusedKernels,
    FusedPart, KvInterface, Provider, RuntimeOptions, SessionError, TensorRtOptions,
};

/// Why a shared library did not load, in the dynamic loader's words (`libloading`'s own message
/// is only "dlopen failed"; the loader's is its source).
pub fn loader_message(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(source) => source.to_string(),
        None => e.to_string(),
    }
}

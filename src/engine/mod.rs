//! The engine: everything that touches ONNX Runtime and the GPU lives here and only here.
//!
//! Passes, in the order a worker uses them: [`ort_lib`] finds and loads ONNX Runtime once per
//! process; [`bundle`] opens and checks an asset bundle; [`session`] builds the graphs' sessions
//! on the requested execution provider; [`generate`] runs the block-causal loop with
//! [`schedule`] and [`noise`]; [`probe`] reports the environment for `runner doctor`.

pub mod bundle;
pub mod generate;
pub mod noise;
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
    ArenaExtend, ConvAlgoSearch, CudaOptions, Provider, RuntimeOptions, SessionError,
    TensorRtOptions,
};

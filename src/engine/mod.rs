//! The engine: everything that touches ONNX Runtime and the GPU lives here and only here.
//!
//! Passes, in the order a worker uses them: [`ort_lib`] finds and loads ONNX Runtime once per
//! process; [`bundle`] opens and checks an asset bundle, and [`text`] is its prompt tokenizer;
//! [`session`] builds the graphs' sessions on the requested execution provider; [`generate`] runs
//! the block-causal loop with [`schedule`] and [`noise`]; [`probe`] reports the environment for
//! `runner doctor`.
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
pub mod generate;
pub(crate) mod graph_rewrite;
pub(crate) mod kernels;
pub mod noise;
pub mod one_time;
pub mod onnx_graph;
pub mod options;
pub mod ort_lib;
pub mod probe;
pub mod schedule;
pub mod session;
pub mod session_error;
pub use crate::vocab::settings;
pub mod text;

pub use crate::vocab::{ContextSource, TextContexts};
pub use bundle::{Bundle, BundleError, BundleManifest, ExportSettings};
pub use generate::{
    GenerateError, GenerateOptions, Generated, Generator, PhaseTimes, TimedRegionEnd,
};
pub use noise::fill_normal;
pub use one_time::OneTimeWork;
pub use options::{
    CudaOptions, Diagnostics, DiagnosticsEnvError, DitAttention, FusedPart, Provider,
    RuntimeOptions, TensorRtOptions, check_diagnostics_env, int8_attention_refusal,
};
pub use ort_lib::{OrtLoadError, OrtLocation, OrtRuntime, OrtSource};
pub use probe::{Check, probe_environment};
pub use schedule::{MethodSettings, Schedule, ScheduleError};
pub use session::{ContextInterface, KvInterface, SessionError, StartupTimes};
pub use settings::{
    ArenaExtend, AttentionBackend, AttentionPrecision, ConvAlgoSearch, Emit, FusedKernels,
    Precision, ProviderKind, SvdRank,
};
pub use text::{PromptTokenizer, PromptTokens, TokenizerError};

/// The path of the shared library this process has mapped whose file name starts with `stem`,
/// read from `maps` (the text of `/proc/self/maps`): the library actually loaded, whatever its
/// path. Of several, the longest name, the fully versioned one (`libcudnn.so.9.19.0` over a
/// `libcudnn.so.9` mapped beside it).
pub fn mapped_library<'a>(maps: &'a str, stem: &str) -> Option<&'a str> {
    maps.lines()
        .filter_map(|l| l.find('/').map(|i| &l[i..]))
        .filter(|path| file_name(path).starts_with(stem))
        .max_by_key(|path| file_name(path).len())
}

/// The last component of a `/`-separated path.
pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Why a shared library did not load, in the dynamic loader's words (`libloading`'s own message
/// is only "dlopen failed"; the loader's is its source).
pub fn loader_message(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(source) => source.to_string(),
        None => e.to_string(),
    }
}

/// Loads `name` (a soname, or a path) as the dynamic loader resolves it and returns the path of
/// the file it mapped ([`mapped_library`]), or the loader's message. The library stays
/// loaded: for `runner doctor`, a short process.
pub fn load_library_kept(name: &str) -> Result<String, String> {
    // SAFETY: loading runs the library's initialisers; the CUDA and cuDNN libraries `runner
    // doctor` loads have none with preconditions, and nothing of the library is called here. ONNX Runtime's provider libraries have (`missing_links` checks them without loading).
    let library = unsafe { libloading::Library::new(name) }.map_err(|e| loader_message(&e))?;
    std::mem::forget(library);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    Ok(mapped_library(&maps, file_name(name))
        .unwrap_or(name)
        .to_string())
}

#[cfg(test)]
mod tests {
    /// The library is found by the start of its file name, the fully versioned file preferred;
    /// a name that only shares a prefix of the stem (`libcublasLt` for `libcublas.so.`) is not
    /// taken.
    #[test]
    fn mapped_libraries_are_found_by_their_file_names() {
        let maps = "7f0-7f1 r-xp 0 08:01 1 /usr/lib/libcudnn.so.9\n\
                    7f1-7f2 r-xp 0 08:01 2 /opt/nvidia/cudnn/lib/libcudnn.so.9.10.2\n\
                    7f2-7f3 r-xp 0 08:01 3 /opt/a/libcublasLt.so.13.1.0\n\
                    7f3-7f4 r-xp 0 08:01 4 /opt/c/libcublas.so.13.1.0\n\
                    7f4-7f5 rw-p 0 00:00 0 [heap]\n";
        assert_eq!(
            super::mapped_library(maps, "libcudnn.so.9"),
            Some("/opt/nvidia/cudnn/lib/libcudnn.so.9.10.2")
        );
        assert_eq!(
            super::mapped_library(maps, "libcublas.so."),
            Some("/opt/c/libcublas.so.13.1.0")
        );
        assert_eq!(super::mapped_library(maps, "libcudart.so."), None);
    }
}

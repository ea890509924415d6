//! Every environment variable the runner reads that is not a setting, declared once with what it
//! does. The settings' variables (`PROMPT_INDICES`, `UNSTEP_<TABLE>__<KEY>`, ...) are
//! [`crate::manifest::layers::ENV_VARS`]; the README lists both tables (a test checks it).

/// Names of the environment variables, as constants so that each is spelt once.
pub struct EnvVars;

impl EnvVars {
    /// The `libonnxruntime` to load, after `runtime.ort_library` and before the Python package's.
    pub const ORT_DYLIB_PATH: &str = "ORT_DYLIB_PATH";
    /// The folder `scripts/fetch-onnxruntime` fills: the last place ONNX Runtime is looked for.
    pub const UNSTEP_ORT_CACHE_DIR: &str = "UNSTEP_ORT_CACHE_DIR";
    /// Diagnostics: a folder for ONNX Runtime's per-node profile of every session.
    pub const UNSTEP_ORT_PROFILE: &str = "UNSTEP_ORT_PROFILE";
    /// Diagnostics: ONNX Runtime's own log of every session at this level and above (`verbose`,
    /// `info`, `warning`), on standard error with its timestamps, and each of the runner's CUDA
    /// kernels' creation time: where a session's build went.
    pub const UNSTEP_ORT_LOG: &str = "UNSTEP_ORT_LOG";
    /// Diagnostics: the graph optimizers to leave out (comma-separated), replacing the provider's
    /// own list; empty leaves every optimizer on.
    pub const UNSTEP_ORT_DISABLE_OPTIMIZERS: &str = "UNSTEP_ORT_DISABLE_OPTIMIZERS";
    /// The folder where the runner's CUDA kernels keep what they decide and compile (convolution
    /// choices, attention plans, compiled kernels) between processes; `runner apply` sets it to
    /// each process's cache directory.
    pub const UNSTEP_KERNEL_CACHE: &str = "UNSTEP_KERNEL_CACHE";
    /// Diagnostics: `1` prints how long each convolution engine choice took.
    pub const UNSTEP_CONV_LOG: &str = "UNSTEP_CONV_LOG";
}

/// The variables of [`EnvVars`] with what they do, for the README's check.
pub const OTHER_ENV_VARS: &[(&str, &str)] = &[
    (EnvVars::ORT_DYLIB_PATH, "the ONNX Runtime library to load"),
    (
        EnvVars::UNSTEP_ORT_CACHE_DIR,
        "the pinned ONNX Runtime's folder",
    ),
    (
        EnvVars::UNSTEP_ORT_PROFILE,
        "ONNX Runtime profiles, per session",
    ),
    (EnvVars::UNSTEP_ORT_LOG, "ONNX Runtime's log, per session"),
    (
        EnvVars::UNSTEP_ORT_DISABLE_OPTIMIZERS,
        "graph optimizers to leave out",
    ),
    (
        EnvVars::UNSTEP_KERNEL_CACHE,
        "kept kernel choices, plans and images",
    ),
    (
        EnvVars::UNSTEP_CONV_LOG,
        "log of convolution engine choices",
    ),
];

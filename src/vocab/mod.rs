//! The words that manifest, engine, results and report share: the method table (`method.rs`,
//! each setting declared once), the settings' value types (precision, providers, attention
//! kernels, bounded numbers, …) and what a process measures of its start (start-up times,
//! one-time work). This module depends on no other module of the crate, so
//! each of them can use it without depending on another.

pub mod arrays;
pub mod method;
pub mod settings;
pub mod times;
pub mod values;

pub use arrays::ArrayKind;
pub use method::{Method, MethodFlags};
pub use settings::{
    ArenaExtend, AttentionBackend, AttentionPrecision, ConvAlgoSearch, Emit, FusedKernels,
    Precision, ProviderKind, SvdRank, TimedRegionEnd,
};
pub use times::{ContextSource, OneTimeWork, StartupTimes, TextContexts};

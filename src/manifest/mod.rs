//! Manifests: wire types, the override layers, and validation with source locations.
//!
//! The pass runs `load` → [`Resolved`]: the `extends` chain is read with spans
//! ([`source`]), each layer becomes a flat map of settings ([`layers`]), the merge is
//! deserialised into the typed [`Manifest`] ([`settings`], [`values`]), and cross-setting and
//! path checks run. Every problem becomes a [`Diagnostic`] with a location and a hint.

mod checks;
pub mod diagnostic;
mod dotted;
pub mod evaluation;
mod extra_args;
pub mod inputs;
mod layer;
pub mod layers;
pub mod load;
mod names_file;
pub mod paths;
mod run_paths;
pub mod schema;
pub mod settings;
pub mod source;
pub mod sweep;
pub mod sweep_flags;
pub mod values;

pub use diagnostic::{Diagnostic, Diagnostics, Origin};
pub use load::{LoadRequest, Resolved, Setting, load, load_sweep, load_sweep_with};
pub use run_paths::RunPaths;
pub use settings::*;
pub use values::*;

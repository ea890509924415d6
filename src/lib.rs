//! unstep: experiment manifests, plans and a generation engine on ONNX Runtime for a
//! block-causal text-to-video model.
//!
//! The modules follow the passes of a run: [`manifest`] (wire types, layers, validation) →
//! [`plan`] (processes, shards, caches) → [`engine`] (ONNX Runtime and the generation loop) →
//! [`results`] → [`report`]. [`cli`] is the edge that turns errors into exit codes; [`vocab`] holds
//! the words they share, below all of them.

pub mod atomic_file;
pub mod bounded_command;
pub mod bounded_read;
pub mod cli;
pub mod engine;
pub mod env_vars;
pub mod execute;
pub mod exit;
pub mod file_identity;
#[cfg(test)]
mod layering;
pub mod lock_query;
pub mod manifest;
pub mod os;
pub mod plan;
pub mod report;
pub mod results;
pub mod video;
pub mod vocab;

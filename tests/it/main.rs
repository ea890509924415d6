//! The one integration-test binary; each module covers one part of the product.

mod apply;
mod cli;
mod doctor;
mod engine;
mod evaluation;
mod guide;
mod hardening;
mod html;
mod leftovers;
mod manifest;
mod prompt_lists;
mod prompts;
mod properties;
mod quality;
mod report;
mod runs;
mod slurm;
mod soak;
mod support;
mod sweeps;
mod vbench;
mod video;

//! The one integration-test binary; each module covers one part of the product.

mod apply;
mod doctor;
mod engine;
mod hardening;
mod manifest;
mod prompts;
mod report;
mod support;
mod vbench;
mod video;

//! Manifests: wire types, the override layers, and validation with source locations.

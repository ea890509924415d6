//! The config hash: the identity of the settings that decide what a prompt's output is.
//!
//! A re-apply resumes per prompt: a prompt whose video and timing exist is skipped when its
//! recorded hash equals the current one, and a changed hash refuses the run. So the hash covers
//! exactly what changes generated pixels:
//! - every `method.*` setting (clean sigma, steps, schedule, attention, emit, and the
//!   export-time shape and precision),
//! - every `noise.*` setting (seed, stream, reseeding),
//! - the asset bundle: its resolved path and the sha256 of its `bundle.toml`, which lists the
//!   sha256 of every model file, so re-exported weights change the hash.
//!
//! Left out on purpose: the prompt file and indices (a prompt's output depends only on its own
//! text and global index, which the resume check compares directly), sharding, caches, runtime
//! threads and timing switches (they change how fast, not what), and output naming.

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::manifest::Resolved;
use crate::manifest::load::hex;

/// Bumped when the hashed content changes shape, so old records do not match by accident.
const VERSION: u32 = 1;

/// The sha256 (hex) of the output-deciding settings of `resolved`.
pub fn config_hash(resolved: &Resolved) -> String {
    let m = &resolved.manifest;
    let bundle = &resolved.paths.bundle;
    // A .zip bundle is hashed by its path only: reading gigabytes here would slow every plan.
    let bundle_toml = std::fs::read(bundle.join("bundle.toml"))
        .ok()
        .map(|b| hex(&Sha256::digest(&b)));
    let identity = json!({
        "version": VERSION,
        "method": m.method,
        "noise": m.noise,
        "bundle": bundle.to_string_lossy(),
        "bundle_toml_sha256": bundle_toml,
    });
    // serde_json's maps are sorted, so the text is canonical.
    hex(&Sha256::digest(identity.to_string().as_bytes()))
}

/// The sha256 (hex) of a prompt's text, recorded beside each prompt's output so that a resume
/// skips a prompt only when its text is the one its video was made from.
pub fn prompt_hash(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::testing::{PROBE, resolve};

    #[test]
    fn hash_follows_output_settings_only() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let base = config_hash(&resolve(d, "p", PROBE, &[]));
        assert_eq!(base.len(), 64);
        assert_eq!(base, config_hash(&resolve(d, "p", PROBE, &[])));
        for changes in [
            "method.clean_sigma=0.01",
            "noise.seed=7",
            "method.attention_backend=math",
        ] {
            assert_ne!(
                base,
                config_hash(&resolve(d, "p", PROBE, &[changes])),
                "{changes} must change the hash"
            );
        }
        for same in [
            "prompts.indices=1-2",
            "warmup.repeats=0",
            "runtime.cpu_threads_per_process=4",
            "timing.exclude_final_output_layout=true",
        ] {
            assert_eq!(
                base,
                config_hash(&resolve(d, "p", PROBE, &[same])),
                "{same} must not change the hash"
            );
        }
    }

    #[test]
    fn hash_follows_the_bundle_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("bundle")).unwrap();
        let without = config_hash(&resolve(d, "p", PROBE, &[]));
        std::fs::write(d.join("bundle/bundle.toml"), "dit_sha256 = \"aa\"\n").unwrap();
        let with = config_hash(&resolve(d, "p", PROBE, &[]));
        std::fs::write(d.join("bundle/bundle.toml"), "dit_sha256 = \"bb\"\n").unwrap();
        let reexported = config_hash(&resolve(d, "p", PROBE, &[]));
        assert_ne!(without, with);
        assert_ne!(with, reexported);
    }
}

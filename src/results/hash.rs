//! The config hash: the identity of the settings that decide what a prompt's output is.
//!
//! A re-apply resumes per prompt: a prompt whose video and timing exist is skipped when its
//! recorded hash equals the current one, and a changed hash refuses the run. So the hash covers
//! exactly what changes generated pixels:
//! - every `method.*` setting (clean sigma, steps, schedule, attention, emit, and the
//!   export-time shape and precision),
//! - every `noise.*` setting (seed, stream, reseeding),
//! - the asset bundle's contents: the sha256 of its `bundle.toml`, which lists the sha256 of
//!   every model file, so re-exported weights change the hash and a moved or re-cloned copy of
//!   the same bundle does not (a `.zip` bundle, whose `bundle.toml` is not read here, by its
//!   path).
//!
//! Left out on purpose: the prompt file and indices (a prompt's output depends only on its own
//! text and global index, which the resume check compares directly), sharding, caches, runtime
//! threads and timing switches (they change how fast, not what), and output naming.

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::manifest::Resolved;
use crate::manifest::load::hex;

/// Bumped when the hashed content changes shape, so old records do not match by accident.
const VERSION: u32 = 2;

/// The sha256 (hex) of the output-deciding settings of `resolved`.
pub fn config_hash(resolved: &Resolved) -> String {
    let m = &resolved.manifest;
    let bundle = &resolved.paths.bundle;
    let identity = match bundle_toml_sha256(resolved) {
        Some(sha) => json!({
            "version": VERSION,
            "method": m.method,
            "noise": m.noise,
            "bundle_toml_sha256": sha,
        }),
        // A .zip bundle is hashed by its path: reading gigabytes here would slow every plan.
        None => json!({
            "version": VERSION,
            "method": m.method,
            "noise": m.noise,
            "bundle": bundle.to_string_lossy(),
        }),
    };
    // serde_json's maps are sorted, so the text is canonical.
    hex(&Sha256::digest(identity.to_string().as_bytes()))
}

/// The hash runners before version 2 recorded (it also covered the bundle's path), so that a run
/// they started still resumes when nothing but the hash's form has changed.
pub fn legacy_config_hash(resolved: &Resolved) -> String {
    let m = &resolved.manifest;
    let identity = json!({
        "version": 1,
        "method": m.method,
        "noise": m.noise,
        "bundle": resolved.paths.bundle.to_string_lossy(),
        "bundle_toml_sha256": bundle_toml_sha256(resolved),
    });
    hex(&Sha256::digest(identity.to_string().as_bytes()))
}

fn bundle_toml_sha256(resolved: &Resolved) -> Option<String> {
    std::fs::read(resolved.paths.bundle.join("bundle.toml"))
        .ok()
        .map(|b| hex(&Sha256::digest(&b)))
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

    /// The same bundle moved or cloned elsewhere is the same configuration; the legacy form of
    /// the hash (runners before version 2) still follows the path.
    #[test]
    fn a_moved_bundle_with_the_same_contents_keeps_the_hash() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        for d in [a.path(), b.path()] {
            std::fs::create_dir(d.join("bundle")).unwrap();
            std::fs::write(d.join("bundle/bundle.toml"), "dit_sha256 = \"aa\"\n").unwrap();
        }
        let (ra, rb) = (
            resolve(a.path(), "p", PROBE, &[]),
            resolve(b.path(), "p", PROBE, &[]),
        );
        assert_eq!(config_hash(&ra), config_hash(&rb));
        assert_ne!(legacy_config_hash(&ra), legacy_config_hash(&rb));
        assert_ne!(config_hash(&ra), legacy_config_hash(&ra));
    }
}

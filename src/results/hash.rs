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
//! A setting added to `method` or `noise` after the hash took its present form is hashed only
//! when its value differs from its default ([`ALWAYS_HASHED`]): a run recorded before the setting
//! existed generated with that default, so it keeps its hash and resumes.
//!
//! Left out on purpose: the prompt file and indices (a prompt's output depends only on its own
//! text and global index, which the resume check compares directly), sharding, caches, runtime
//! threads and timing switches (they change how fast, not what), and output naming.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::manifest::load::hex;
use crate::manifest::{Manifest, Resolved};

/// Bumped when the hashed content changes shape, so old records do not match by accident.
const VERSION: u32 = 2;

/// The keys of `method` and `noise` hashed whatever their value: every key those tables had
/// when the hash took its present form (version 2). Any other key is hashed only when its value
/// differs from its default.
const ALWAYS_HASHED: [(&str, &[&str]); 2] = [
    (
        "method",
        &[
            "attention_backend",
            "attention_window",
            "clean_sigma",
            "denoising_steps",
            "emit",
            "frames_per_block",
            "height",
            "latent_frames",
            "precision",
            "svd_rank",
            "timestep_shift",
            "warp_denoising_steps",
            "width",
        ],
    ),
    ("noise", &["mode", "reseed", "seed"]),
];

/// The hashed tables of a manifest: `method` and `noise`, each as [`hashed_table`] keeps it.
fn hashed_tables(m: &Manifest) -> [(&'static str, Value); 2] {
    let defaults = Manifest::defaults(m.kind, "defaults");
    [
        ("method", json!(m.method), json!(defaults.method)),
        ("noise", json!(m.noise), json!(defaults.noise)),
    ]
    .map(|(table, value, default)| (table, hashed_table(table, value, &default)))
}

/// A table of settings as the hash covers it: its keys of [`ALWAYS_HASHED`], and every other key
/// whose value differs from its default.
fn hashed_table(table: &str, value: Value, defaults: &Value) -> Value {
    let always = ALWAYS_HASHED
        .iter()
        .find(|(name, _)| *name == table)
        .map_or(&[][..], |(_, keys)| keys);
    match value {
        Value::Object(mut settings) => {
            settings.retain(|key, value| {
                always.contains(&key.as_str()) || defaults.get(key) != Some(value)
            });
            Value::Object(settings)
        }
        other => other,
    }
}

/// The sha256 (hex) of an identity object: `tables` and `fields` as its keys. serde_json's maps
/// are sorted, so the text is canonical.
fn digest(tables: [(&str, Value); 2], fields: Value) -> String {
    let mut identity = fields;
    for (table, value) in tables {
        identity[table] = value;
    }
    hex(&Sha256::digest(identity.to_string().as_bytes()))
}

/// The sha256 (hex) of the output-deciding settings of `resolved`.
pub fn config_hash(resolved: &Resolved) -> String {
    let tables = hashed_tables(&resolved.manifest);
    match bundle_toml_sha256(resolved) {
        Some(sha) => digest(
            tables,
            json!({ "version": VERSION, "bundle_toml_sha256": sha }),
        ),
        // A .zip bundle is hashed by its path: reading gigabytes here would slow every plan.
        None => digest(
            tables,
            json!({ "version": VERSION, "bundle": resolved.paths.bundle.to_string_lossy() }),
        ),
    }
}

/// The hash runners before version 2 recorded (it also covered the bundle's path), so that a run
/// they started still resumes when nothing but the hash's form has changed.
pub fn legacy_config_hash(resolved: &Resolved) -> String {
    digest(
        hashed_tables(&resolved.manifest),
        json!({
            "version": 1,
            "bundle": resolved.paths.bundle.to_string_lossy(),
            "bundle_toml_sha256": bundle_toml_sha256(resolved),
        }),
    )
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

    /// The hash of a fixed configuration, pinned: a change to what the hash covers or how it is
    /// written changes every recorded run's hash, and would stop them resuming.
    #[test]
    fn the_hash_of_a_fixed_configuration_is_pinned() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("bundle")).unwrap();
        std::fs::write(d.join("bundle/bundle.toml"), "dit_sha256 = \"aa\"\n").unwrap();
        let pinned = [
            (
                vec![],
                "17bf45f99d13ce796cd14f255f8727410d8fa590acbb7b446166345e2b0b7df5",
            ),
            (
                vec!["method.clean_sigma=0.01", "noise.seed=7"],
                "54f3ea4b167749099c0c8363f68d166a7fd39cda1178645d60020e1896665a11",
            ),
        ];
        for (sets, hash) in pinned {
            assert_eq!(
                config_hash(&resolve(d, "p", PROBE, &sets)),
                hash,
                "{sets:?}"
            );
        }
    }

    /// A setting added to `method` at its default leaves the hash as it was before the setting
    /// existed, so a run recorded then still resumes; set to anything else, it changes the hash.
    /// A setting of [`ALWAYS_HASHED`] at its default stays in the hash.
    #[test]
    fn a_new_setting_at_its_default_keeps_the_hash() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("bundle")).unwrap();
        std::fs::write(d.join("bundle/bundle.toml"), "dit_sha256 = \"aa\"\n").unwrap();
        let r = resolve(d, "p", PROBE, &[]);
        let defaults = Manifest::defaults(r.manifest.kind, "defaults");
        let fields = json!({ "version": VERSION, "bundle_toml_sha256": bundle_toml_sha256(&r) });
        let with_new = |value: Value| {
            let (mut method, mut method_defaults) =
                (json!(r.manifest.method), json!(defaults.method));
            method["future_setting"] = value;
            method_defaults["future_setting"] = json!(3);
            let noise = json!(r.manifest.noise);
            let tables = [
                ("method", hashed_table("method", method, &method_defaults)),
                (
                    "noise",
                    hashed_table("noise", noise, &json!(defaults.noise)),
                ),
            ];
            digest(tables, fields.clone())
        };
        assert_eq!(with_new(json!(3)), config_hash(&r));
        assert_ne!(with_new(json!(4)), config_hash(&r));
        let kept = hashed_table("method", json!(defaults.method), &json!(defaults.method));
        assert_eq!(kept["clean_sigma"], json!(0.02));
    }
}

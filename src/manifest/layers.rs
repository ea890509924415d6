//! The override layers and their precedence, lowest first:
//!
//! 1. built-in defaults ([`Manifest::defaults`](super::settings::Manifest::defaults));
//! 2. the manifest chain, base first (each file its own layer; a child replaces its parent);
//! 3. environment variables: the benchmark scripts' names ([`ENV_VARS`]), the generic
//!    `UNSTEP_<TABLE>__<KEY>`, and `UNSTEP_EXTRA_ARGS`;
//! 4. the command line: `--set table.key=value` and `--extra-args '…'`.
//!
//! A layer is a flat map from dotted key to value and origin. Within one layer a key may be set
//! once: a second setting is an error, never a silent last-wins. This is a hand-rolled merge
//! rather than figment's because every value must keep a `file:line:col` origin and the
//! duplicate rule must hold per layer, which figment's providers do not express.

use std::collections::BTreeMap;

use super::diagnostic::{Diagnostic, Excerpt, Origin, did_you_mean};
use super::extra_args::extra_args;
pub use super::layer::{Entry, Layer, OverrideValueError, parse_text};
use super::schema::keys;
use super::settings::Kind;

/// A named environment variable (the names the reference benchmark scripts read) and the setting
/// it controls.
pub struct EnvVar {
    pub var: &'static str,
    pub key: &'static str,
    /// Read only for probes (the probe controls).
    pub probe_only: bool,
}

/// The named environment variables, each read once here; the README lists them (a test checks
/// the list). `UNSTEP_EXTRA_ARGS` and `CUDA_VISIBLE_DEVICES`
/// are handled beside these.
pub const ENV_VARS: &[EnvVar] = &[
    EnvVar {
        var: "PROMPT_INDICES",
        key: "prompts.indices",
        probe_only: true,
    },
    EnvVar {
        var: "WARMUP_PROMPT_INDICES",
        key: "warmup.indices",
        probe_only: true,
    },
    EnvVar {
        var: "WARMUP_REPEATS",
        key: "warmup.repeats",
        probe_only: true,
    },
    EnvVar {
        var: "DISABLE_GC_DURING_MEASUREMENT",
        key: "timing.quiet_measurement",
        probe_only: true,
    },
    EnvVar {
        var: "EXCLUDE_FINAL_OUTPUT_LAYOUT_TIMING",
        key: "timing.exclude_final_output_layout",
        probe_only: false,
    },
    EnvVar {
        var: "UNSTEP_CPU_THREADS_PER_PROCESS",
        key: "runtime.cpu_threads_per_process",
        probe_only: false,
    },
    EnvVar {
        var: "TORCHINDUCTOR_COMPILE_THREADS",
        key: "runtime.compile_threads",
        probe_only: false,
    },
    EnvVar {
        var: "UNSTEP_COMPILE_THREADS",
        key: "runtime.compile_threads",
        probe_only: false,
    },
    EnvVar {
        var: "UNSTEP_ATTENTION_BACKEND",
        key: "method.attention_backend",
        probe_only: false,
    },
    EnvVar {
        var: "UNSTEP_ATTENTION_PRECISION",
        key: "method.attention_precision",
        probe_only: false,
    },
    EnvVar {
        var: "UNSTEP_CACHE_MODE",
        key: "cache.mode",
        probe_only: false,
    },
    EnvVar {
        var: "UNSTEP_CACHE_SCOPE",
        key: "cache.scope",
        probe_only: false,
    },
    EnvVar {
        var: "UNSTEP_CLEAR_GLOBAL_RUNTIME_CACHES",
        key: "cache.clear_global",
        probe_only: false,
    },
    EnvVar {
        var: "UNSTEP_SHARED_RUNTIME_STATE_DIR",
        key: "cache.shared_state_dir",
        probe_only: false,
    },
    EnvVar {
        var: "UNSTEP_RUN_STATE_ROOT",
        key: "cache.run_state_root",
        probe_only: true,
    },
    EnvVar {
        var: "UNSTEP_REUSE_RUNTIME_STATE",
        key: "cache.reuse_runtime_state",
        probe_only: false,
    },
    EnvVar {
        var: "UNSTEP_WORK_ROOT",
        key: "staging.work_root",
        probe_only: false,
    },
    EnvVar {
        var: "CUDA_VISIBLE_DEVICES",
        key: "runtime.visible_devices",
        probe_only: false,
    },
];

/// The variable that carries extra method flags.
pub const EXTRA_ARGS_VAR: &str = "UNSTEP_EXTRA_ARGS";

/// Variables of the `UNSTEP_` namespace that are not settings (they configure the runner's
/// surroundings) and so are never read as `UNSTEP_<TABLE>__<KEY>`.
const NOT_SETTINGS: &[&str] = &["UNSTEP_ORT_CACHE_DIR"];

/// Parses an override's text for `key` and sets it, or records why it is not a valid value.
fn set_text(
    layer: &mut Layer,
    key: &str,
    text: &str,
    origin: Origin,
    errors: &mut Vec<Diagnostic>,
) {
    match parse_text(key, text) {
        Ok(value) => layer.set(
            key,
            Entry {
                value,
                origin,
                excerpt: None,
            },
            errors,
        ),
        Err(msg) => {
            errors.push(Diagnostic::new(format!("invalid value for `{key}`: {msg}")).at(origin))
        }
    }
}

/// Builds the environment layer from a snapshot of the environment.
pub fn env_layer(
    env: &BTreeMap<String, String>,
    kind: Kind,
    errors: &mut Vec<Diagnostic>,
    warnings: &mut Vec<String>,
) -> Layer {
    let mut layer = Layer::default();
    for spec in ENV_VARS {
        let Some(text) = env.get(spec.var).filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        if spec.probe_only && kind != Kind::Probe {
            warnings.push(format!(
                "{} is a probe control and is ignored by this {} run; use --set {}=… instead",
                spec.var,
                kind.as_str(),
                spec.key
            ));
            continue;
        }
        let origin = Origin::Env {
            var: spec.var.to_string(),
        };
        match parse_text(spec.key, text) {
            Ok(value) => {
                // Two seed names for one setting (the compile threads) agree when equal.
                if let Some(first) = layer.entries.get(spec.key)
                    && first.value == value
                {
                    continue;
                }
                layer.set(
                    spec.key,
                    Entry {
                        value,
                        origin,
                        excerpt: None,
                    },
                    errors,
                )
            }
            Err(msg) => errors.push(
                Diagnostic::new(format!("invalid value for `{}`: {msg}", spec.key)).at(origin),
            ),
        }
    }
    for (var, text) in env {
        let Some(rest) = var.strip_prefix("UNSTEP_") else {
            continue;
        };
        if NOT_SETTINGS.contains(&var.as_str()) || !rest.contains("__") || text.trim().is_empty() {
            continue;
        }
        let key = rest.to_ascii_lowercase().replace("__", ".");
        let origin = Origin::Env { var: var.clone() };
        if !keys().contains_key(&key) {
            let candidates: Vec<String> = keys()
                .keys()
                .map(|k| format!("UNSTEP_{}", k.to_ascii_uppercase().replace('.', "__")))
                .collect();
            let mut d = Diagnostic::new(format!("`{var}` names no setting (`{key}`)")).at(origin);
            if let Some(s) = did_you_mean(var, candidates.iter().map(String::as_str)) {
                d = d.hint(format!("did you mean `{s}`?"));
            } else {
                d = d.hint(
                    "variables of the form UNSTEP_<TABLE>__<KEY> set manifest keys; unset it",
                );
            }
            errors.push(d);
            continue;
        }
        set_text(&mut layer, &key, text, origin, errors);
    }
    if let Some(text) = env.get(EXTRA_ARGS_VAR) {
        let origin = |arg: &str| Origin::Env {
            var: format!("{EXTRA_ARGS_VAR} ({arg})"),
        };
        extra_args(text, &origin, &mut layer, errors);
    }
    layer
}

/// Builds the command-line layer from `--set` assignments and `--extra-args` strings.
pub fn flag_layer(sets: &[String], extras: &[String], errors: &mut Vec<Diagnostic>) -> Layer {
    let mut layer = Layer::default();
    for assignment in sets {
        let origin = Origin::Flag {
            arg: format!("--set {assignment}"),
        };
        let Some((key, text)) = assignment.split_once('=') else {
            errors.push(
                Diagnostic::new(format!("`--set {assignment}` is not an assignment"))
                    .at(origin)
                    .hint("write --set table.key=value, e.g. --set cache.scope=shard"),
            );
            continue;
        };
        let key = key.trim();
        if !keys().contains_key(key) {
            errors.push(unknown_key(key, origin, None));
            continue;
        }
        set_text(&mut layer, key, text, origin, errors);
    }
    for text in extras {
        let origin = |arg: &str| Origin::Flag {
            arg: format!("--extra-args '{arg}'"),
        };
        extra_args(text, &origin, &mut layer, errors);
    }
    layer
}

/// The error for a key no manifest table has, with the closest known key.
pub fn unknown_key(key: &str, origin: Origin, excerpt: Option<Excerpt>) -> Diagnostic {
    let d = Diagnostic::new(format!("unknown key `{key}`"))
        .at(origin)
        .excerpt(excerpt);
    let known = keys()
        .keys()
        .map(String::as_str)
        .chain(["name", "extends", "kind"]);
    // Compare the last segment too, so `method.clean_sigm` and `clean_sigma` both find it.
    let suggestion = did_you_mean(key, known.clone()).or_else(|| {
        let last = key.rsplit('.').next().unwrap_or(key);
        known
            .map(|k| (k, k.rsplit('.').next().unwrap_or(k)))
            .filter(|(_, tail)| strsim::jaro_winkler(last, tail) > 0.9)
            .map(|(k, _)| k)
            .next()
    });
    match suggestion {
        Some(s) => d.hint(format!("did you mean `{s}`?")),
        None => d.hint("see `runner schema` for every key"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn seed_variables_map_to_keys() {
        let mut errors = vec![];
        let mut warnings = vec![];
        let layer = env_layer(
            &env(&[
                ("PROMPT_INDICES", "0"),
                ("DISABLE_GC_DURING_MEASUREMENT", "0"),
                ("UNSTEP_CACHE_SCOPE", "shard"),
                (
                    "UNSTEP_EXTRA_ARGS",
                    "--clean-sigma-override 0.01 --save-videos",
                ),
            ]),
            Kind::Probe,
            &mut errors,
            &mut warnings,
        );
        assert!(errors.is_empty(), "{errors:?}");
        let get = |k: &str| layer.entries[k].value.clone();
        assert_eq!(get("prompts.indices"), toml::Value::String("0".into()));
        assert_eq!(get("timing.quiet_measurement"), toml::Value::Boolean(false));
        assert_eq!(get("cache.scope"), toml::Value::String("shard".into()));
        assert_eq!(get("method.clean_sigma"), toml::Value::Float(0.01));
        assert_eq!(get("outputs.save_videos"), toml::Value::Boolean(true));
    }

    #[test]
    fn probe_controls_are_ignored_with_a_warning_for_generations() {
        let mut errors = vec![];
        let mut warnings = vec![];
        let layer = env_layer(
            &env(&[("PROMPT_INDICES", "0-3")]),
            Kind::Generation,
            &mut errors,
            &mut warnings,
        );
        assert!(layer.entries.is_empty());
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn generic_and_seed_name_for_one_key_conflict() {
        let mut errors = vec![];
        env_layer(
            &env(&[
                ("UNSTEP_CACHE_SCOPE", "shard"),
                ("UNSTEP_CACHE__SCOPE", "run_gpu"),
            ]),
            Kind::Generation,
            &mut errors,
            &mut vec![],
        );
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].message.contains("set twice"),
            "{}",
            errors[0].message
        );
    }

    #[test]
    fn extra_args_are_classified() {
        let cases = [
            ("--clean-sigma-override 0.01", None),
            ("--clean-sigma-override=0.01", None),
            ("--no-warp-denoising-steps", None),
            ("--timestep-shift 3", Some("config setting")),
            (
                "--svd-rank 64",
                Some("fixed when the asset bundle is exported"),
            ),
            ("--seed 3", Some("set by the launcher")),
            ("--shard-index 1", Some("set by the launcher")),
            ("--clean-sigma-overide 0.01", Some("unknown method flag")),
            ("--clean-sigma-override", Some("needs a value")),
            ("0.01", Some("unexpected")),
            (
                "--clean-sigma-override 0.01 --clean-sigma-override 0.02",
                Some("set twice"),
            ),
        ];
        for (text, want) in cases {
            let mut errors = vec![];
            flag_layer(&[], &[text.to_string()], &mut errors);
            match want {
                None => assert!(errors.is_empty(), "{text}: {errors:?}"),
                Some(w) => {
                    assert_eq!(errors.len(), 1, "{text}: {errors:?}");
                    assert!(
                        errors[0].message.contains(w),
                        "{text}: {}",
                        errors[0].message
                    );
                }
            }
        }
    }

    #[test]
    fn quoted_text_values_lose_their_quotes() {
        let mut errors = vec![];
        let layer = flag_layer(
            &[
                "staging.work_root='/tmp/x y'".into(),
                "outputs.dir=plain".into(),
            ],
            &[],
            &mut errors,
        );
        assert!(errors.is_empty(), "{errors:?}");
        let text = |k: &str| layer.entries[k].value.as_str().unwrap().to_string();
        assert_eq!(text("staging.work_root"), "/tmp/x y");
        assert_eq!(text("outputs.dir"), "plain");
        let mut errors = vec![];
        flag_layer(&["outputs.dir=\"a\"b\"".into()], &[], &mut errors);
        assert_eq!(errors.len(), 1, "{errors:?}");
    }

    #[test]
    fn set_values_are_typed_by_the_schema() {
        let mut errors = vec![];
        let layer = flag_layer(
            &[
                "warmup.repeats=0".into(),
                "method.denoising_steps=1000,500".into(),
                "cache.scope=run_gpu".into(),
            ],
            &[],
            &mut errors,
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            layer.entries["warmup.repeats"].value,
            toml::Value::Integer(0)
        );
        assert!(matches!(
            layer.entries["method.denoising_steps"].value,
            toml::Value::Array(_)
        ));
        let mut errors = vec![];
        flag_layer(
            &["warmup.repeats=x".into(), "cache.scpoe=shard".into()],
            &[],
            &mut errors,
        );
        assert_eq!(errors.len(), 2);
        assert!(errors[1].hint.as_deref().unwrap().contains("cache.scope"));
    }
}

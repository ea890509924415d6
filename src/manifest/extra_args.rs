//! Extra args (`--extra-args`, `UNSTEP_EXTRA_ARGS`): a reference script's method flags, each
//! read into the layer it came with as the manifest key the method table declares for it, and
//! every flag that is not a method flag, or that names a setting extra args cannot set, refused
//! with a diagnostic that says where to set it.

use super::diagnostic::{Diagnostic, Origin, did_you_mean};
use super::layer::{Entry, Layer, parse_text};
use super::schema::{MethodClass, keys};

/// A method flag accepted in extra args, or the reason it is not.
enum ExtraFlag {
    /// A supported flag: its key, and whether it takes a value (else it is a switch to `switch`).
    Method {
        key: &'static str,
        switch: Option<bool>,
    },
    /// A flag the launcher sets itself from a manifest key.
    LauncherOwned { key: &'static str },
}

/// Reference scripts' spellings of method settings, besides each setting's flag and key.
const REFERENCE_SPELLINGS: &[(&str, &str)] = &[
    ("--num-frame-per-block", "method.frames_per_block"),
    ("--num-latent-frames", "method.latent_frames"),
    ("--dtype", "method.precision"),
];

fn lookup_flag(flag: &str) -> Option<ExtraFlag> {
    use ExtraFlag::*;
    if let Some(found) = method_flag(flag) {
        return Some(found);
    }
    Some(match flag {
        "--save-videos" => Method {
            key: "outputs.save_videos",
            switch: Some(true),
        },
        "--seed" => LauncherOwned { key: "noise.seed" },
        "--prompt-indices" | "--prompts" | "--prompt-file" => LauncherOwned {
            key: "prompts.indices / prompts.file",
        },
        "--shard-index" | "--shard-id" => LauncherOwned {
            key: "shards.count",
        },
        "--num-shards" | "--shard-count" => LauncherOwned {
            key: "shards.count",
        },
        "--gpu" | "--device" | "--device-id" => LauncherOwned {
            key: "runtime.visible_devices (CUDA_VISIBLE_DEVICES)",
        },
        "--run-name" | "--name" => LauncherOwned { key: "name" },
        "--output" | "--output-dir" | "--output-folder" => LauncherOwned { key: "outputs.dir" },
        "--work-dir" | "--work-root" | "--workdir" => LauncherOwned {
            key: "staging.work_root",
        },
        "--cache-dir" | "--state-dir" => LauncherOwned {
            key: "cache.shared_state_dir / cache.run_state_root",
        },
        _ => return None,
    })
}

/// A method setting by its flag (`runner worker`'s, from the method table), its key with
/// dashes, `--no-` before either for a switch, or a reference script's spelling.
fn method_flag(flag: &str) -> Option<ExtraFlag> {
    if let Some(&(_, key)) = REFERENCE_SPELLINGS.iter().find(|(f, _)| *f == flag) {
        return Some(ExtraFlag::Method { key, switch: None });
    }
    let name = flag.strip_prefix("--")?;
    crate::vocab::Method::FLAGS.iter().find_map(|f| {
        let names = [f.name(), f.key_name()];
        if names.iter().any(|n| n == name) {
            return Some(ExtraFlag::Method {
                key: f.key,
                switch: f.is_switch().then_some(true),
            });
        }
        let negated = name.strip_prefix("no-")?;
        (f.is_switch() && names.iter().any(|n| n == negated)).then_some(ExtraFlag::Method {
            key: f.key,
            switch: Some(false),
        })
    })
}

/// The flags extra args accept, for suggestions: the flag-class method settings' (a switch's
/// `--no-` form too) and `--save-videos`.
fn supported_flags() -> Vec<String> {
    let mut flags = Vec::new();
    for f in crate::vocab::Method::FLAGS
        .iter()
        .filter(|f| f.class == "flag")
    {
        flags.push(format!("--{}", f.name()));
        if f.is_switch() {
            flags.push(format!("--no-{}", f.name()));
        }
    }
    flags.push("--save-videos".into());
    flags
}

/// Splits an extra-args string on whitespace and adds each method flag to `layer`.
pub(super) fn extra_args(
    text: &str,
    origin: &dyn Fn(&str) -> Origin,
    layer: &mut Layer,
    errors: &mut Vec<Diagnostic>,
) {
    let mut tokens = text.split_whitespace().peekable();
    while let Some(token) = tokens.next() {
        let (flag, inline) = match token.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (token, None),
        };
        if !flag.starts_with("--") {
            errors.push(
                Diagnostic::new(format!("unexpected `{token}` in extra args"))
                    .at(origin(text))
                    .hint("extra args are method flags like `--clean-sigma-override 0.01`"),
            );
            continue;
        }
        match lookup_flag(flag) {
            None => {
                let mut d =
                    Diagnostic::new(format!("unknown method flag `{flag}`")).at(origin(text));
                let supported = supported_flags();
                d = match did_you_mean(flag, supported.iter().map(String::as_str)) {
                    Some(s) => d.hint(format!("did you mean `{s}`?")),
                    None => d.hint(format!(
                        "extra args accept {}; other settings go in the manifest or --set",
                        supported.join(", ")
                    )),
                };
                errors.push(d);
                // A value after an unknown flag would be misread as a flag of its own.
                if inline.is_none() && tokens.peek().is_some_and(|t| !t.starts_with("--")) {
                    tokens.next();
                }
            }
            Some(ExtraFlag::LauncherOwned { key }) => {
                errors.push(
                    Diagnostic::new(format!(
                        "`{flag}` is set by the launcher, not by extra args"
                    ))
                    .at(origin(text))
                    .hint(format!(
                        "set `{key}` in the manifest (or with --set) instead"
                    )),
                );
                if inline.is_none() && tokens.peek().is_some_and(|t| !t.starts_with("--")) {
                    tokens.next();
                }
            }
            Some(ExtraFlag::Method { key, switch }) => {
                let value_text = match (switch, inline) {
                    (Some(on), None) => Some(on.to_string()),
                    (Some(_), Some(v)) | (None, Some(v)) => Some(v),
                    (None, None) => match tokens.peek() {
                        Some(v) if !v.starts_with("--") || v.parse::<f64>().is_ok() => {
                            tokens.next().map(str::to_string)
                        }
                        _ => None,
                    },
                };
                let class = keys().get(key).and_then(|k| k.class);
                match class {
                    Some(MethodClass::Config) => {
                        errors.push(
                            Diagnostic::new(format!(
                                "`{flag}` is a config setting and cannot be passed in extra args"
                            ))
                            .at(origin(text))
                            .hint(format!("set `{key}` in the manifest, or use --set {key}=…")),
                        );
                        continue;
                    }
                    Some(MethodClass::Export) => {
                        errors.push(
                            Diagnostic::new(format!(
                                "`{flag}` is fixed when the asset bundle is exported"
                            ))
                            .at(origin(text))
                            .hint(format!(
                                "state `{key}` in the manifest to check it against the bundle, \
                                 and export a bundle with the value you want"
                            )),
                        );
                        continue;
                    }
                    _ => {}
                }
                let Some(value_text) = value_text else {
                    errors.push(
                        Diagnostic::new(format!("`{flag}` needs a value"))
                            .at(origin(text))
                            .hint(format!("write e.g. `{flag} <value>`")),
                    );
                    continue;
                };
                let arg = format!("{flag} {value_text}");
                match parse_text(key, &value_text) {
                    Ok(value) => layer.set(
                        key,
                        Entry {
                            value,
                            origin: origin(&arg),
                            excerpt: None,
                        },
                        errors,
                    ),
                    Err(msg) => errors.push(
                        Diagnostic::new(format!("invalid value for `{flag}`: {msg}"))
                            .at(origin(&arg)),
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every method setting is reachable in extra args by its key with dashes and by its
    /// worker flag, a switch by `--no-` too, each to its own key; the suggestions name the
    /// flag-class settings' flags.
    #[test]
    fn extra_args_spell_every_method_setting_as_the_table_declares_it() {
        for f in crate::vocab::Method::FLAGS {
            for name in [f.name(), f.key_name()] {
                let Some(ExtraFlag::Method { key, switch }) = lookup_flag(&format!("--{name}"))
                else {
                    panic!("--{name} is not a method flag");
                };
                assert_eq!(key, f.key);
                assert_eq!(switch, f.is_switch().then_some(true), "--{name}");
                let negated = lookup_flag(&format!("--no-{name}"));
                match negated {
                    Some(ExtraFlag::Method { key, switch }) => {
                        assert!(f.is_switch() && key == f.key && switch == Some(false));
                    }
                    _ => assert!(!f.is_switch(), "--no-{name}"),
                }
            }
        }
        assert!(matches!(
            lookup_flag("--clean-sigma-override"),
            Some(ExtraFlag::Method {
                key: "method.clean_sigma",
                switch: None
            })
        ));
        assert!(matches!(
            lookup_flag("--dtype"),
            Some(ExtraFlag::Method {
                key: "method.precision",
                ..
            })
        ));
        assert!(lookup_flag("--no-height").is_none());
        let supported = supported_flags();
        assert!(supported.contains(&"--no-warp-denoising-steps".to_string()));
        assert!(
            !supported.contains(&"--height".to_string()),
            "{supported:?}"
        );
    }
}

//! `--sweep table.key=v1,v2,…` (on `runner apply` and `runner plan`): a sweep given on the
//! command line, the same as a `[sweep]` table of the manifest with those lists (product mode,
//! keys in the flags' order). A manifest that has a `[sweep]` table is refused with the flags:
//! which of the two lists a setting's points take would be ambiguous.

use super::diagnostic::{Diagnostic, Origin};
use super::layers::{Entry, parse_text, unknown_key};
use super::schema::keys;
use super::settings::SweepMode;
use super::sweep::{Axis, Sweep, label_axes, refusal};

/// The sweep the `--sweep` flags give; `None` when there are none, or when one is wrong (each
/// problem added to `errors`, at its flag).
pub fn read(flags: &[String], errors: &mut Vec<Diagnostic>) -> Option<Sweep> {
    if flags.is_empty() {
        return None;
    }
    let before = errors.len();
    let mut axes: Vec<Axis> = Vec::new();
    for flag in flags {
        let origin = Origin::Flag {
            arg: format!("--sweep {flag}"),
        };
        let Some((key, list)) = flag.split_once('=') else {
            errors.push(
                Diagnostic::new(format!("`--sweep {flag}` is not a list of values"))
                    .at(origin)
                    .hint("write --sweep table.key=first,second,…, e.g. --sweep method.clean_sigma=0.005,0.01"),
            );
            continue;
        };
        let key = key.trim();
        if let Some((message, hint)) = refusal(key) {
            errors.push(Diagnostic::new(message).at(origin).hint(hint));
            continue;
        }
        if !keys().contains_key(key) {
            errors.push(unknown_key(key, origin, None));
            continue;
        }
        if axes.iter().any(|a| a.key == key) {
            errors.push(
                Diagnostic::new(format!("`{key}` is swept by two --sweep flags"))
                    .at(origin)
                    .hint(format!(
                        "give all of `{key}`'s values in one flag: --sweep {key}=a,b,…"
                    )),
            );
            continue;
        }
        let mut values = Vec::new();
        for text in split_values(list) {
            if text.trim().is_empty() {
                errors.push(
                    Diagnostic::new(format!("`--sweep {flag}` has an empty value"))
                        .at(origin.clone())
                        .hint("separate the values with single commas, without one at the end"),
                );
                continue;
            }
            match parse_text(key, text) {
                Ok(value) => values.push(Entry {
                    value,
                    origin: origin.clone(),
                    excerpt: None,
                }),
                Err(msg) => errors.push(
                    Diagnostic::new(format!("invalid value for `{key}`: {msg}"))
                        .at(origin.clone())
                        .hint("each value of --sweep is written as --set writes one"),
                ),
            }
        }
        axes.push(Axis {
            key: key.to_string(),
            label: String::new(),
            values,
        });
    }
    if errors.len() > before {
        return None;
    }
    label_axes(&mut axes);
    Some(Sweep {
        mode: SweepMode::Product,
        axes,
    })
}

/// The sweep of a run: the manifest's `[sweep]` table (`table`, read; `has_table`, whether the
/// manifest has one, read or not), or that of the flags. Both is an error.
pub fn or_table(
    table: Option<Sweep>,
    has_table: bool,
    flags: &[String],
    errors: &mut Vec<Diagnostic>,
) -> Option<Sweep> {
    if flags.is_empty() {
        return table;
    }
    if has_table {
        errors.push(with_table(flags));
        return None;
    }
    read(flags, errors)
}

/// The error for `--sweep` flags given with a manifest that has a `[sweep]` table.
fn with_table(flags: &[String]) -> Diagnostic {
    Diagnostic::new("the manifest has a [sweep] table, and --sweep sweeps it again")
        .at(Origin::Flag {
            arg: format!("--sweep {}", flags[0]),
        })
        .hint("put the lists in the [sweep] table, or run a manifest without one with --sweep")
}

/// The values of a `--sweep` list: split at the commas outside brackets and quotes, so that a
/// list value (`[1000,750]`) or a quoted text with a comma is one value.
fn split_values(list: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut quote, mut start) = (0i32, None, 0);
    for (i, c) in list.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') => depth -= 1,
            (None, ',') if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_split_outside_brackets_and_quotes() {
        assert_eq!(split_values("0.005,0.01"), ["0.005", "0.01"]);
        assert_eq!(
            split_values("[1000,750],[1000,500]"),
            ["[1000,750]", "[1000,500]"]
        );
        assert_eq!(split_values("\"a,b\",c"), ["\"a,b\"", "c"]);
        assert_eq!(split_values("a,"), ["a", ""]);
    }

    #[test]
    fn flags_make_a_product_sweep_and_bad_ones_say_which_flag() {
        let mut errors = Vec::new();
        let flags = [
            "method.clean_sigma=0.005,0.01".to_string(),
            "noise.seed=1,2,3".to_string(),
        ];
        let sweep = read(&flags, &mut errors).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(sweep.axes.len(), 2);
        assert_eq!(sweep.axes[1].values.len(), 3);
        assert_eq!(sweep.axes[0].values[1].value, toml::Value::Float(0.01));
        let steps = read(
            &["method.denoising_steps=[1000,500],[1000,750,500]".to_string()],
            &mut errors,
        )
        .unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        let lengths: Vec<usize> = steps.axes[0]
            .values
            .iter()
            .map(|v| v.value.as_array().map_or(0, Vec::len))
            .collect();
        assert_eq!(lengths, [2, 3]);

        for (flag, want) in [
            ("noise.seed=1,x", "`x` is not an integer"),
            ("method.clean_sigm=1", "unknown key `method.clean_sigm`"),
            ("noise.seed", "is not a list of values"),
            ("noise.seed=1,", "has an empty value"),
            ("name=a,b", "cannot be swept"),
        ] {
            let mut errors = Vec::new();
            assert!(read(&[flag.to_string()], &mut errors).is_none(), "{flag}");
            let text = errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n");
            assert!(text.contains(want), "{flag}: {text}");
            assert!(text.contains(&format!("--sweep {flag}")), "{flag}: {text}");
        }
    }
}

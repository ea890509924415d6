//! Property tests of the command line's front door: whatever a manifest's text or a `--set`
//! value is, `runner plan` answers with exit 0, or exit 2 and an error that says where (the
//! manifest's file:line:col, or the flag), never a panic or another status.

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::support::{Output, Test, repo};

/// Every `table.key` the schema knows, so that generated manifests mostly hit real settings.
fn schema_keys() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("schemas/manifest.schema.json")).unwrap();
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut keys = Vec::new();
    let top = schema["properties"].as_object().unwrap();
    for (table, spec) in top {
        match resolve(&schema, spec)["properties"].as_object() {
            Some(props) => keys.extend(props.keys().map(|k| format!("{table}.{k}"))),
            None => keys.push(table.clone()),
        }
    }
    assert!(keys.len() > 30, "the schema lists the settings: {keys:?}");
    keys
}

/// Follows a `$ref` (or the first of an `allOf`) to the definition it names.
fn resolve<'a>(
    schema: &'a serde_json::Value,
    spec: &'a serde_json::Value,
) -> &'a serde_json::Value {
    let reference = spec["$ref"]
        .as_str()
        .or_else(|| spec["allOf"][0]["$ref"].as_str());
    match reference {
        Some(r) => {
            let name = r.rsplit('/').next().unwrap();
            let defs = if schema["$defs"].is_object() {
                "$defs"
            } else {
                "definitions"
            };
            &schema[defs][name]
        }
        None => spec,
    }
}

/// A TOML value, well formed or not: the types a setting might get, edge numbers, strings with
/// any characters, and text that is not TOML at all.
fn value() -> impl Strategy<Value = String> {
    fn text(words: Vec<&'static str>) -> BoxedStrategy<String> {
        prop::sample::select(words).prop_map(str::to_string).boxed()
    }
    prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        (-3i64..70).prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        text(vec!["nan", "inf", "-inf", "0.0", "-0.0", "1e400", "true"]),
        any::<bool>().prop_map(|b| b.to_string()),
        "\\PC{0,24}".prop_map(|s| format!("{s:?}")),
        "[a-z0-9_.,\\- ]{0,12}".prop_map(|s| format!("\"{s}\"")),
        prop::collection::vec(-2i64..40, 0..4).prop_map(|v| format!("{v:?}")),
        text(vec![
            "{}",
            "{ a = 1 }",
            "[[1], [\"x\"]]",
            "'''\n'''",
            "\"\\u0000\""
        ]),
        "\\PC{0,12}".prop_map(|s| s),
    ]
}

/// One assignment: a real setting most of the time, sometimes an unknown or odd key.
fn key(keys: Vec<String>) -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(keys),
        1 => "[a-z_]{1,8}\\.[a-z_]{1,8}",
        1 => "\\PC{1,10}",
    ]
}

/// A manifest: a valid generation over the tiny bundle with generated assignments after it,
/// sometimes with a line of garbage spliced in or its text cut short.
fn manifest(keys: Vec<String>, base: String) -> impl Strategy<Value = String> {
    (
        prop::collection::vec((key(keys), value()), 0..6),
        prop::option::of(("\\PC{0,16}", any::<prop::sample::Index>())),
        prop::option::of(any::<prop::sample::Index>()),
    )
        .prop_map(move |(sets, garbage, cut)| {
            let mut text = base.clone();
            for (key, value) in sets {
                // A dotted key at the top level sets `table.key`, as a `[table]` header would.
                text.push_str(&format!("{key} = {value}\n"));
            }
            if let Some((line, at)) = garbage {
                let lines: Vec<&str> = text.lines().collect();
                let i = at.index(lines.len() + 1);
                let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
                out.insert(i, line);
                text = out.join("\n");
            }
            if let Some(at) = cut {
                let mut i = at.index(text.len() + 1);
                while !text.is_char_boundary(i) {
                    i -= 1;
                }
                text.truncate(i);
            }
            text
        })
}

/// The base manifest: valid, every path inside the test's folder.
fn base(root: &Path) -> String {
    format!(
        "kind = \"generation\"\n\
         name = \"prop\"\n\
         prompts.file = \"{prompts}\"\n\
         runtime.provider = \"cpu\"\n\
         method.height = 64\nmethod.width = 112\nmethod.precision = \"fp32\"\n\
         outputs.dir = \"{root}/results\"\n\
         staging.work_root = \"{root}/work\"\n\
         assets.bundle = \"{bundle}\"\n",
        prompts = repo().join("assets/prompts/tiny.txt").display(),
        bundle = repo().join("assets/tiny").display(),
        root = root.display(),
    )
}

/// Exit 0, or exit 2 with an `error:` that names a place: `where` (the manifest file, or the
/// flag), followed by a line and a column when it is a file.
fn answered_with_a_place(out: &Output, place: &regex::Regex) -> Result<(), TestCaseError> {
    prop_assert!(
        !out.stderr.contains("panicked"),
        "a panic:\n{}",
        out.render()
    );
    prop_assert!(
        out.code == 0 || out.code == 2,
        "exit {}:\n{}",
        out.code,
        out.render()
    );
    if out.code == 2 {
        prop_assert!(out.stderr.contains("error:"), "{}", out.render());
        prop_assert!(
            place.is_match(&out.stderr),
            "the error does not say where ({place}):\n{}",
            out.render()
        );
    }
    Ok(())
}

/// A runner with a fixed seed, so that a failure in CI fails again on a laptop;
/// `UNSTEP_PROPTEST_CASES=N` runs N cases from a random seed instead, to look further.
fn runner(cases: u32) -> TestRunner {
    let explore = std::env::var("UNSTEP_PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok());
    let config = Config {
        cases: explore.unwrap_or(cases),
        failure_persistence: None,
        ..Config::default()
    };
    match explore {
        Some(_) => TestRunner::new(config),
        None => TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha)),
    }
}

#[test]
fn any_manifest_text_is_planned_or_refused_with_its_line_and_column() {
    let t = Test::new();
    let file = t.path().join("m.toml");
    let strategy = manifest(schema_keys(), base(t.path()));
    let place = regex::Regex::new(r"m\.toml:\d+:\d+").unwrap();
    runner(96)
        .run(&strategy, |text| {
            std::fs::write(&file, &text).unwrap();
            let out = t.cmd().args(["plan", "m.toml"]).run();
            answered_with_a_place(&out, &place)?;
            prop_assert!(!t.path().join("results").exists(), "plan wrote results");
            Ok(())
        })
        .unwrap();
}

#[test]
fn any_set_value_is_planned_or_refused_naming_the_flag() {
    let t = Test::new();
    std::fs::write(t.path().join("m.toml"), base(t.path())).unwrap();
    let strategy = prop::collection::vec((key(schema_keys()), value()), 1..3);
    // A refused `--set` names itself; a refused value from the manifest names its line.
    let place = regex::Regex::new(r"(--set|m\.toml:\d+:\d+)").unwrap();
    runner(96)
        .run(&strategy, |sets| {
            let mut args = vec!["plan".to_string(), "m.toml".to_string()];
            for (key, value) in &sets {
                // One argument, so that a value starting with `-` is not read as a flag.
                args.push(format!("--set={key}={value}"));
            }
            let out = t.cmd().args(args).run();
            answered_with_a_place(&out, &place)
        })
        .unwrap();
}

//! The rules of docs/ARCHITECTURE.md's "Who may call whom" that a module's imports show, checked
//! on the sources: `manifest` and `report` never name `engine`, and `vocab` names no other module
//! of the crate.

use std::path::{Path, PathBuf};

/// The crate's top-level modules that `text` names through `crate::` paths (`crate::engine::X`,
/// `crate::{engine, manifest}`), comment lines left out.
fn named_modules(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut names = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let group = match rest.strip_prefix('{') {
            Some(inner) => &inner[..inner.find('}').unwrap_or(inner.len())],
            None => rest,
        };
        // In a group every item counts (`crate::{engine::X, manifest}`); outside, the first.
        let items: Vec<&str> = if rest.starts_with('{') {
            group.split(',').collect()
        } else {
            vec![group]
        };
        for item in items {
            let name: String = item
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.push(name);
            }
        }
    }
    names
}

fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// Every `crate::` module that a file under `src/<module>/` (or `src/<module>.rs`) names and
/// `allowed` refuses, as `file: module`.
fn violations(module: &str, allowed: impl Fn(&str) -> bool) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = sources(&src.join(module));
    files.push(src.join(format!("{module}.rs")));
    let mut found = Vec::new();
    for file in files.iter().filter(|f| f.exists()) {
        let text = std::fs::read_to_string(file).unwrap();
        for name in named_modules(&text) {
            if !allowed(&name) {
                found.push(format!("{}: crate::{name}", file.display()));
            }
        }
    }
    assert!(!files.is_empty(), "no sources of {module}");
    found
}

#[test]
fn the_scanner_finds_paths_and_groups() {
    let text = "use crate::engine::X;\n// crate::plan in a comment\nuse crate::{manifest, \
                results::Y};\nlet a = crate::vocab::Z;";
    assert_eq!(
        named_modules(text),
        ["engine", "manifest", "results", "vocab"]
    );
}

#[test]
fn manifest_and_report_do_not_import_the_engine() {
    for module in ["manifest", "report"] {
        let found = violations(module, |name| name != "engine");
        assert!(
            found.is_empty(),
            "{module} imports the engine:\n{}",
            found.join("\n")
        );
    }
}

#[test]
fn vocab_imports_no_other_module() {
    let found = violations("vocab", |name| name == "vocab");
    assert!(found.is_empty(), "vocab imports:\n{}", found.join("\n"));
}

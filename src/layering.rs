//! The rules of docs/ARCHITECTURE.md's "Who may call whom" that a module's imports show, checked
//! on the sources: `manifest` and `report` never name `engine`, `vocab` names no other module
//! of the crate, and no two of `execute`'s modules import each other, even through others.

use std::path::{Path, PathBuf};

/// The crate's top-level modules that `text` names through `crate::` paths (`crate::engine::X`,
/// `crate::{engine, manifest}`), comment lines left out.
fn named_modules(text: &str) -> Vec<String> {
    named_after(text, "crate::")
}

/// The names that follow `prefix` in `text` (the first of a path, every item of a group),
/// comment lines left out.
fn named_after(text: &str, prefix: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut names = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find(prefix) {
        rest = &rest[at + prefix.len()..];
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
    let folder = src.join(module);
    let mut files = if folder.is_dir() {
        sources(&folder)
    } else {
        Vec::new()
    };
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

#[test]
fn the_bottom_helpers_import_no_other_module() {
    for module in ["atomic_file", "bounded_command", "file_identity"] {
        let found = violations(module, |name| name == module);
        assert!(found.is_empty(), "{module} imports:\n{}", found.join("\n"));
    }
}

/// `execute`'s modules and the others of them each imports: `super::X` in its own files
/// (`super::super::X` in a folder module's inner files) and `crate::execute::X` anywhere.
fn execute_imports() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/execute");
    let mut graph = std::collections::BTreeMap::new();
    for file in sources(&dir) {
        let rel = file.strip_prefix(&dir).unwrap();
        let parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        if parts == ["mod"] {
            continue;
        }
        let module = parts[0].clone();
        // Up to `execute`: `super::` from `execute/x.rs` and `execute/x/mod.rs`, one more
        // `super::` for each folder below.
        let depth = parts.len() - usize::from(parts.last().is_some_and(|p| p == "mod"));
        let up = "super::".repeat(depth);
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let mut named = named_after(code, &up);
        named.retain(|n| n != "super");
        named.extend(named_after(code, "crate::execute::"));
        let entry: &mut std::collections::BTreeSet<String> =
            graph.entry(module.clone()).or_default();
        entry.extend(named.into_iter().filter(|n| *n != module));
    }
    graph
}

#[test]
fn execute_has_no_import_cycle() {
    let graph = execute_imports();
    assert!(graph["apply"].contains("evaluate"), "{graph:?}");
    // Every module's imports, followed to their ends, never come back to it.
    for start in graph.keys() {
        let mut seen = std::collections::BTreeSet::new();
        let mut todo: Vec<(&String, Vec<&String>)> = vec![(start, vec![start])];
        while let Some((module, path)) = todo.pop() {
            for next in graph.get(module).into_iter().flatten() {
                let mut path = path.clone();
                path.push(next);
                assert!(next != start, "an import cycle in execute: {path:?}");
                if seen.insert(next) {
                    todo.push((next, path));
                }
            }
        }
    }
}

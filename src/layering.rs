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
    for module in [
        "atomic_file",
        "bounded_command",
        "bounded_read",
        "file_identity",
        "lock_query",
    ] {
        let found = violations(module, |name| name == module);
        assert!(found.is_empty(), "{module} imports:\n{}", found.join("\n"));
    }
}

/// The modules of the folder `src/<folder>` and the others of them each imports: `super::X` in
/// its own files (`super::super::X` in a folder module's inner files) and `crate::<folder>::X`
/// anywhere in it; test code left out.
fn folder_imports(
    folder: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(folder);
    let absolute = format!("crate::{}::", folder.replace('/', "::"));
    let mut graph = std::collections::BTreeMap::new();
    for file in sources(&dir) {
        let rel = file.strip_prefix(&dir).unwrap();
        let parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        // The folder module itself, and test code in files of its own.
        let test_code = |p: &String| ["tests", "gpu_tests", "test_support"].contains(&p.as_str());
        if parts == ["mod"] || parts.iter().any(test_code) {
            continue;
        }
        let module = parts[0].clone();
        // Up to the folder: `super::` from `folder/x.rs` and `folder/x/mod.rs`, one more
        // `super::` for each folder below.
        let depth = parts.len() - usize::from(parts.last().is_some_and(|p| p == "mod"));
        let up = "super::".repeat(depth);
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let mut named = named_after(code, &up);
        named.retain(|n| n != "super");
        named.extend(named_after(code, &absolute));
        let entry: &mut std::collections::BTreeSet<String> =
            graph.entry(module.clone()).or_default();
        entry.extend(named.into_iter().filter(|n| *n != module));
    }
    graph
}

/// The import cycles of a folder's graph, each as the path that comes back to its start.
fn cycles(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for start in graph.keys() {
        let mut seen = std::collections::BTreeSet::new();
        let mut todo: Vec<(&String, Vec<&String>)> = vec![(start, vec![start])];
        while let Some((module, path)) = todo.pop() {
            for next in graph.get(module).into_iter().flatten() {
                let mut path = path.clone();
                path.push(next);
                if next == start {
                    found.push(path.iter().map(|s| s.to_string()).collect());
                } else if seen.insert(next) {
                    todo.push((next, path));
                }
            }
        }
    }
    found
}

/// Every folder under `src/`, relative to it.
fn folders() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut todo = vec![src.clone()];
    let mut found = Vec::new();
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                found.push(
                    path.strip_prefix(&src)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
                todo.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The import circles inside folders not yet broken, each as its folder and its modules in
/// order: none may be added, and one that is broken leaves this list.
const CIRCLES_LEFT: [&str; 1] = ["manifest: checks load names_file run_paths"];

#[test]
fn no_folder_has_an_import_circle_but_those_left() {
    let mut found = std::collections::BTreeSet::new();
    for folder in folders() {
        for cycle in cycles(&folder_imports(&folder)) {
            let modules: std::collections::BTreeSet<String> = cycle.into_iter().collect();
            found.insert((folder.clone(), modules));
        }
    }
    // A circle through several modules also shows as its smaller circles' union: keep, for each
    // folder, the union of every circle that shares a module (the strongly connected parts).
    let mut merged: Vec<(String, std::collections::BTreeSet<String>)> = Vec::new();
    for (folder, modules) in found {
        match merged
            .iter_mut()
            .find(|(f, m)| *f == folder && !m.is_disjoint(&modules))
        {
            Some((_, m)) => m.extend(modules),
            None => merged.push((folder, modules)),
        }
    }
    let found: std::collections::BTreeSet<String> = merged
        .into_iter()
        .map(|(folder, modules)| {
            format!(
                "{folder}: {}",
                modules.into_iter().collect::<Vec<_>>().join(" ")
            )
        })
        .collect();
    let left: std::collections::BTreeSet<String> =
        CIRCLES_LEFT.iter().map(|c| c.to_string()).collect();
    let new: Vec<_> = found.difference(&left).collect();
    assert!(new.is_empty(), "new import circles: {new:?}");
    let broken: Vec<_> = left.difference(&found).collect();
    assert!(
        broken.is_empty(),
        "circles broken: take {broken:?} out of CIRCLES_LEFT"
    );
}

#[test]
fn the_import_scanner_sees_a_folders_imports() {
    let graph = folder_imports("execute");
    assert!(graph["apply"].contains("evaluate"), "{graph:?}");
    let mut circle = std::collections::BTreeMap::new();
    circle.insert("a".to_string(), ["b".to_string()].into());
    circle.insert("b".to_string(), ["a".to_string()].into());
    assert!(!cycles(&circle).is_empty());
    circle.get_mut("b").unwrap().clear();
    assert!(cycles(&circle).is_empty());
}

/// The crate's top-level modules (`src/<m>/` or `src/<m>.rs`) and, for each, the others its
/// files name through `crate::` paths.
fn top_level_imports() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() || (path.extension().is_some_and(|e| e == "rs") && name != "lib") {
            modules.insert(name);
        }
    }
    modules.remove("main");
    modules
        .iter()
        .map(|module| {
            let named: std::collections::BTreeSet<String> = violations(module, |_| false)
                .into_iter()
                .filter_map(|found| found.rsplit("crate::").next().map(str::to_string))
                .filter(|name| name != module && modules.contains(name))
                .collect();
            (module.clone(), named)
        })
        .collect()
}

/// No two top-level modules import each other: the passes and the bottom helpers form a
/// hierarchy (docs/ARCHITECTURE.md), and a helper both need lives below both.
#[test]
fn no_two_top_level_modules_import_each_other() {
    let imports = top_level_imports();
    assert!(imports["execute"].contains("plan"), "the scan sees imports");
    let mut pairs = Vec::new();
    for (a, named) in &imports {
        for b in named {
            if a < b && imports[b].contains(a) {
                pairs.push(format!("{a} <-> {b}"));
            }
        }
    }
    assert!(
        pairs.is_empty(),
        "modules that import each other: {pairs:?}"
    );
}

/// Files outside `engine/` and `os.rs` that still have `unsafe` code, each for a reason of its
/// own: none may be added, and one that loses it leaves this list.
const UNSAFE_LEFT: [&str; 2] = [
    // signal_hook's handler registration, whose handler must be async-signal-safe.
    "execute/signals.rs",
    // An option set through OpenH264's C interface (not an operating system call).
    "video/encode.rs",
];

/// The operating system calls live in `os.rs` and the libraries' C interfaces in `engine/`:
/// no other file has `unsafe` code but those [`UNSAFE_LEFT`] names.
#[test]
fn no_unsafe_outside_the_engine_and_os() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for file in sources(&src) {
        let name = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if name.starts_with("engine/") || name == "os.rs" || name == "layering.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .any(|l| {
                l.contains("unsafe {") || l.contains("unsafe fn") || l.contains("unsafe impl")
            });
        if code {
            found.push(name);
        }
    }
    found.sort();
    let left: Vec<String> = UNSAFE_LEFT.iter().map(|s| s.to_string()).collect();
    let added: Vec<&String> = found.iter().filter(|f| !left.contains(f)).collect();
    let gone: Vec<&String> = left.iter().filter(|f| !found.contains(f)).collect();
    assert!(
        added.is_empty(),
        "unsafe code outside engine/ and os.rs: {added:?}"
    );
    assert!(
        gone.is_empty(),
        "no unsafe left in {gone:?}: take them out of UNSAFE_LEFT"
    );
}

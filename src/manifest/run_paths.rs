//! Where a run's paths point: each path setting resolved against the layer that set it (a
//! manifest's folder, the current folder for the environment and the command line, the project's
//! checkout for the built-in defaults), and the checkouts that output folders must not overlap.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::diagnostic::{Diagnostic, Origin};
use super::layers::Entry;
use super::load::LoadRequest;
use super::paths;
use super::settings::Manifest;
use super::source::SourceFile;
use super::values::RunName;

/// Every path of a run, resolved (absolute, normalised).
#[derive(Debug, Clone)]
pub struct RunPaths {
    pub prompts_file: PathBuf,
    pub bundle: PathBuf,
    pub outputs_dir: PathBuf,
    /// `outputs_dir/<name>`.
    pub run_dir: PathBuf,
    pub shared_state_dir: PathBuf,
    pub run_state_root: PathBuf,
    pub work_root: PathBuf,
    pub ort_library: Option<PathBuf>,
    /// `prompts.names_file`, when set.
    pub names_file: Option<PathBuf>,
    /// The user-level compiler caches apply purges before the run ([`paths::global_compiler_caches`]);
    /// empty unless `cache.clear_global` is on.
    pub global_caches: Vec<PathBuf>,
}

/// The folder the built-in defaults' relative paths (`results`, `assets/wan-1.3b`, …) resolve
/// against: the checkout that holds the top manifest, so that a run started from another folder
/// still writes into the project's `results/`; the current folder for a manifest outside any
/// checkout.
pub(super) struct ProjectRoot(PathBuf);

impl ProjectRoot {
    pub(super) fn of(manifest_path: &Path, cwd: &Path) -> ProjectRoot {
        ProjectRoot(
            manifest_path
                .parent()
                .and_then(paths::checkout_root)
                .unwrap_or_else(|| cwd.to_path_buf()),
        )
    }
}

/// The source checkouts a run may not write over: those holding a manifest of the chain, the
/// asset bundle or the prompt file, each once.
pub(super) fn checkouts_of(chain: &[SourceFile], run_paths: &RunPaths) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let files = chain
        .iter()
        .map(|f| f.path.as_path())
        .chain([run_paths.bundle.as_path(), run_paths.prompts_file.as_path()]);
    for root in files.filter_map(paths::checkout_root) {
        if !out.contains(&root) {
            out.push(root);
        }
    }
    out
}

/// Resolves every path of the run with [`resolve_path`], in a fixed order (so their errors come
/// out in that order); the run folder is `outputs.dir/<name>`.
pub(super) fn resolve_paths(
    manifest: &Manifest,
    name: &RunName,
    merged: &BTreeMap<String, Entry>,
    req: &LoadRequest,
    project: &ProjectRoot,
    errors: &mut Vec<Diagnostic>,
) -> RunPaths {
    let mut path_of = |key: &str, text: &str| resolve_path(key, text, merged, req, project, errors);
    let outputs_dir = path_of("outputs.dir", &manifest.outputs.dir);
    let run_dir = outputs_dir.join(name.as_str());
    RunPaths {
        prompts_file: path_of("prompts.file", &manifest.prompts.file),
        bundle: path_of("assets.bundle", &manifest.assets.bundle),
        outputs_dir,
        shared_state_dir: path_of("cache.shared_state_dir", &manifest.cache.shared_state_dir),
        // Unset, a probe's state lives in its run folder, wherever `outputs.dir` puts that.
        run_state_root: match merged.get("cache.run_state_root").map(|e| &e.origin) {
            None | Some(Origin::Default) => run_dir.join("runtime_state"),
            Some(_) => path_of("cache.run_state_root", &manifest.cache.run_state_root),
        },
        work_root: path_of("staging.work_root", &manifest.staging.work_root),
        run_dir,
        ort_library: manifest
            .runtime
            .ort_library
            .clone()
            .map(|p| path_of("runtime.ort_library", &p)),
        names_file: manifest
            .prompts
            .names_file
            .clone()
            .map(|p| path_of("prompts.names_file", &p)),
        global_caches: if manifest.cache.clear_global {
            paths::global_compiler_caches(&req.env, &req.cwd)
        } else {
            Vec::new()
        },
    }
}

/// Resolves the path `text` of the setting `key`: variables are expanded from the request's
/// environment, and a relative path is joined onto the folder of the manifest that set it, onto
/// the project root for a built-in default, or onto the request's folder when a variable or the
/// command line set it. A path that does not expand is reported at its origin and kept as
/// written.
pub(super) fn resolve_path(
    key: &str,
    text: &str,
    merged: &BTreeMap<String, Entry>,
    req: &LoadRequest,
    project: &ProjectRoot,
    errors: &mut Vec<Diagnostic>,
) -> PathBuf {
    match paths::expand(text, &req.env) {
        Ok(t) => {
            let base = match merged.get(key).map(|e| &e.origin) {
                Some(Origin::File { path, .. }) => {
                    path.parent().unwrap_or(Path::new(".")).to_path_buf()
                }
                Some(Origin::Default) => project.0.clone(),
                _ => req.cwd.clone(),
            };
            paths::resolve(&base, &t)
        }
        Err(msg) => {
            let e = &merged[key];
            errors.push(
                Diagnostic::new(format!("invalid path for `{key}`: {msg}"))
                    .at(e.origin.clone())
                    .excerpt(e.excerpt.clone()),
            );
            PathBuf::from(text)
        }
    }
}

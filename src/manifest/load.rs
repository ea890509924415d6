//! Loading a manifest: the `extends` chain, the layers, the merge, deserialisation, path
//! resolution, and the call into the checks of the `checks` module. Everything the user got wrong
//! is collected into one [`Diagnostics`] before anything is planned or written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::checks;
use super::diagnostic::{self, Diagnostic, Diagnostics, Origin, display_path};
use super::dotted::{flatten, unflatten};
use super::inputs;
use super::layers::{Entry, Layer, env_layer, flag_layer, unknown_key};
use super::paths;
use super::run_paths::{ProjectRoot, RunPaths, checkouts_of, resolve_paths};
use super::schema::keys;
use super::settings::{Kind, Manifest};
use super::source::SourceFile;
use super::sweep::{self, SweepPoint};
use super::sweep_flags;
use super::values::RunName;

/// What to load: a manifest file and the overrides on top of it.
#[derive(Debug, Clone)]
pub struct LoadRequest {
    pub manifest: PathBuf,
    /// A snapshot of the environment (tests pass their own).
    pub env: BTreeMap<String, String>,
    /// `--set table.key=value` assignments, in order.
    pub sets: Vec<String>,
    /// `--extra-args` strings, each split on whitespace.
    pub extra_args: Vec<String>,
    /// The folder that command-line and environment paths resolve against.
    pub cwd: PathBuf,
}

impl LoadRequest {
    /// A request for `manifest` with the process's environment and current folder.
    pub fn from_process(manifest: PathBuf, sets: Vec<String>, extra_args: Vec<String>) -> Self {
        LoadRequest {
            manifest,
            env: std::env::vars().collect(),
            sets,
            extra_args,
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
        }
    }
}

/// One setting after the merge: its value and the layer that set it.
#[derive(Debug, Clone)]
pub struct Setting {
    pub value: toml::Value,
    pub origin: Origin,
    /// Lower layers (other than the defaults) whose values this one replaced, lowest first.
    pub replaced: Vec<Origin>,
}

/// A manifest file of the chain, with its hash for provenance.
#[derive(Debug, Clone)]
pub struct ManifestFile {
    pub path: PathBuf,
    pub sha256: String,
}

/// A loaded, validated manifest with the origin of every setting.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub manifest: Manifest,
    pub name: RunName,
    /// The chain, top file first.
    pub files: Vec<ManifestFile>,
    /// Every leaf setting with the layer that set it.
    pub settings: BTreeMap<String, Setting>,
    pub paths: RunPaths,
    /// Prompts of the prompt file, when it exists.
    pub prompts: Option<Vec<String>>,
    /// Standard prompts of the names file (`prompts.names_file`), when it is set and exists.
    pub names: Option<Vec<String>>,
    /// Things worth saying that do not stop a plan (a missing bundle, ignored variables).
    pub warnings: Vec<String>,
    /// The sweep point this run is, when the manifest is a sweep.
    pub sweep: Option<SweepPoint>,
    /// The GPUs the driver lists (their indices), when the command read them: a generation run
    /// by local processes with `CUDA_VISIBLE_DEVICES` unset uses every one. Loading never reads
    /// them (it does no device I/O); `None` plans with GPU 0.
    pub driver_gpus: Option<Vec<String>>,
}

impl Resolved {
    pub fn kind(&self) -> Kind {
        self.manifest.kind
    }

    /// The name of the layer that set `key`: its origin's, or `sweep` for a setting this run's
    /// sweep point gives (whose origin is its value in the `[sweep]` table).
    pub fn layer_of(&self, key: &str) -> &'static str {
        if self
            .sweep
            .as_ref()
            .is_some_and(|p| p.values.iter().any(|(k, _)| k == key))
        {
            return sweep::LAYER;
        }
        self.settings
            .get(key)
            .map_or("default", |s| s.origin.layer_name())
    }

    /// Method settings set by any layer above the defaults, for the record of a run.
    pub fn method_overrides(&self) -> BTreeMap<String, (toml::Value, Origin)> {
        self.settings
            .iter()
            .filter(|(k, s)| k.starts_with("method.") && s.origin != Origin::Default)
            .map(|(k, s)| (k.clone(), (s.value.clone(), s.origin.clone())))
            .collect()
    }
}

/// Keys that belong to one file and are never merged from parents.
const FILE_KEYS: &[&str] = &["name", "extends"];

/// Loads and validates a manifest with its overrides. A manifest with a `[sweep]` table is
/// refused: it is several runs, which [`load_sweep`] loads.
///
/// The steps run in a fixed order and add their problems to one list, so one manifest always
/// gives its diagnostics in the same order. The load stops early only where a later step cannot
/// run: the chain cannot be read, the kind is missing or unknown, the run name is invalid, or the
/// merged settings do not deserialise.
pub fn load(req: &LoadRequest) -> Result<Resolved, Diagnostics> {
    let (manifest_path, chain) = read_chain(req)?;
    if let Some((_, leaf)) = chain[0].leaves.iter().find(|(k, _)| sweep::in_table(k)) {
        return Err(Diagnostic::new(format!(
            "{} is a sweep (it has a [sweep] table): it is several runs, and this command \
             takes one",
            display_path(&manifest_path)
        ))
        .at(chain[0].origin(&leaf.key_span))
        .excerpt(Some(chain[0].excerpt(&leaf.key_span)))
        .hint("`runner plan` and `runner apply` take a sweep; see docs/runs.md")
        .into());
    }
    load_point(req, &manifest_path, &chain, None)
}

/// Loads a manifest as the runs it stands for: each point of its `[sweep]` table, in order, or
/// the manifest alone when it has none. Every point is validated before any is returned, and a
/// problem that several points share is reported once.
pub fn load_sweep(req: &LoadRequest) -> Result<Vec<Resolved>, Diagnostics> {
    load_sweep_with(req, &[])
}

/// [`load_sweep`] with the sweep of `--sweep` flags (`sweep_flags`), in place of a `[sweep]`
/// table; a manifest with a table and flags is refused.
pub fn load_sweep_with(req: &LoadRequest, flags: &[String]) -> Result<Vec<Resolved>, Diagnostics> {
    let (manifest_path, chain) = read_chain(req)?;
    let mut errors = Vec::new();
    let table = sweep::read(&chain, &mut errors);
    let has_table = chain[0].leaves.iter().any(|(k, _)| sweep::in_table(k));
    let Some(table) = sweep_flags::or_table(table, has_table, flags, &mut errors) else {
        if !errors.is_empty() {
            return Err(Diagnostics(errors));
        }
        return load_point(req, &manifest_path, &chain, None).map(|r| vec![r]);
    };
    // The base name, as `load` would give it; its own problems are the points' too.
    let base = run_name(req, &chain, &mut Vec::new());
    let base = base.map_or_else(|| file_stem(&manifest_path), |n| n.to_string());
    let points = table.points(&base, &mut errors);
    let mut runs = Vec::new();
    for point in &points {
        match load_point(req, &manifest_path, &chain, Some(point)) {
            Ok(r) => runs.push(r),
            Err(Diagnostics(ds)) => {
                for d in ds {
                    if !errors.contains(&d) {
                        errors.push(d);
                    }
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(runs)
    } else {
        Err(Diagnostics(errors))
    }
}

/// The manifest's path (normalised) and its `extends` chain, top file first.
fn read_chain(req: &LoadRequest) -> Result<(PathBuf, Vec<SourceFile>), Diagnostics> {
    let manifest_path = paths::normalize(&paths::through_links(&req.cwd.join(&req.manifest)));
    let chain = load_chain(&manifest_path)?;
    Ok((manifest_path, chain))
}

/// Loads one run of the chain: the manifest alone, or one point of its sweep (the point's
/// layer above the files, its name the manifest's with the point's suffix).
fn load_point(
    req: &LoadRequest,
    manifest_path: &Path,
    chain: &[SourceFile],
    point: Option<&SweepPoint>,
) -> Result<Resolved, Diagnostics> {
    let mut errors: Vec<Diagnostic> = Vec::new();
    let mut warnings: Vec<String> = Vec::new();

    check_unknown_keys(chain, &mut errors);
    let name = run_name(req, chain, &mut errors).and_then(|n| match point {
        Some(p) => point_name(&n, p, &mut errors),
        None => Some(n),
    });

    let mut file_layers = file_layers(chain);
    let flags = command_line_layer(req, &mut errors);
    let Some((kind, kind_entry)) = kind_of(&flags, &file_layers, manifest_path, &mut errors) else {
        return Err(Diagnostics(errors));
    };
    let kind_entry = kind_entry.clone();
    let Some(name) = name else {
        return Err(Diagnostics(errors));
    };

    let env = env_layer(&req.env, kind, &mut errors, &mut warnings);
    if let Some(p) = point {
        for (key, swept) in &p.values {
            for other in [&env, &flags]
                .into_iter()
                .filter_map(|l| l.entries.get(key))
            {
                errors.push(sweep::set_elsewhere(key, swept, other));
            }
        }
        file_layers.push(p.layer());
    }
    let defaults = defaults_layer(kind, name.as_str());
    let (mut merged, replaced) = merge(&defaults, &file_layers, &env, &flags, kind, &kind_entry);

    let manifest = deserialize(&mut merged, &defaults, &mut errors);
    let settings = settings_of(&merged, &replaced);
    let Some(mut manifest) = manifest else {
        return Err(Diagnostics(errors));
    };
    manifest.name = Some(name.clone());

    let project = ProjectRoot::of(manifest_path, &req.cwd);
    let run_paths = resolve_paths(&manifest, &name, &merged, req, &project, &mut errors);
    let checkouts = checkouts_of(chain, &run_paths);
    let (prompts, names) = check_run(
        &manifest,
        &run_paths,
        &checkouts,
        &merged,
        &req.env,
        &mut errors,
        &mut warnings,
    );

    if !errors.is_empty() {
        return Err(Diagnostics(errors));
    }
    Ok(Resolved {
        manifest,
        name,
        files: manifest_files(chain),
        settings,
        paths: run_paths,
        prompts,
        names,
        warnings,
        sweep: point.cloned(),
        driver_gpus: None,
    })
}

/// A sweep point's run name: the manifest's, `-`, the point's suffix; a name too long is
/// reported at the point's first value.
fn point_name(base: &RunName, point: &SweepPoint, errors: &mut Vec<Diagnostic>) -> Option<RunName> {
    let text = format!("{base}-{}", point.suffix);
    match text.parse::<RunName>() {
        Ok(n) => Some(n),
        Err(msg) => {
            let first = &point.values[0].1;
            errors.push(
                Diagnostic::new(format!("invalid run name for a sweep point: {msg}"))
                    .at(first.origin.clone())
                    .excerpt(first.excerpt.clone())
                    .hint("shorten the run name or sweep fewer settings"),
            );
            None
        }
    }
}

/// Reports every key of every file of the chain that the schema does not know, at the key.
/// Only the keys whose errors are shown get a "did you mean" (each costs a comparison with
/// every known key).
fn check_unknown_keys(chain: &[SourceFile], errors: &mut Vec<Diagnostic>) {
    let mut unknown = 0;
    for file in chain {
        for (key, leaf) in &file.leaves {
            // The `[sweep]` table's keys are read and reported by `sweep::read`.
            if !keys().contains_key(key) && !sweep::in_table(key) {
                unknown += 1;
                let (origin, excerpt) = (file.origin(&leaf.key_span), file.excerpt(&leaf.key_span));
                errors.push(if unknown <= diagnostic::SHOWN {
                    unknown_key(key, origin, Some(excerpt))
                } else {
                    Diagnostic::new(format!("unknown key `{key}`"))
                        .at(origin)
                        .excerpt(Some(excerpt))
                });
            }
        }
    }
}

/// The run name: `--set name=…` if given, else the top file's `name`, else the top file's
/// stem. An invalid name is reported and gives `None`; a valid one is then checked against the
/// name of the manifest that the top file extends.
fn run_name(
    req: &LoadRequest,
    chain: &[SourceFile],
    errors: &mut Vec<Diagnostic>,
) -> Option<RunName> {
    let top = &chain[0];
    let flag_name = req.sets.iter().find_map(|s| s.strip_prefix("name="));
    let (name_text, name_origin, name_excerpt) = match (flag_name, top.leaves.get("name")) {
        (Some(n), _) => (
            // Quoted as in a manifest (`--set name="x"`) is the name inside the quotes.
            super::layer::unquote(n.trim()).unwrap_or_else(|_| n.to_string()),
            Origin::Flag {
                arg: format!("--set name={n}"),
            },
            None,
        ),
        (None, Some(leaf)) => (
            leaf.value.as_str().unwrap_or_default().to_string(),
            top.origin(&leaf.value_span),
            Some(top.excerpt(&leaf.value_span)),
        ),
        (None, None) => (file_stem(&top.path), Origin::Default, None),
    };
    let name = match name_text.parse::<RunName>() {
        Ok(n) => n,
        Err(msg) => {
            let mut d = Diagnostic::new(format!("invalid run name: {msg}"))
                .at(name_origin.clone())
                .excerpt(name_excerpt);
            if name_origin == Origin::Default {
                d = d.hint("rename the file or set `name = \"…\"` in it");
            }
            errors.push(d);
            return None;
        }
    };
    check_parent_name(&name, &name_origin, chain, errors);
    Some(name)
}

/// Reports a run name equal to that of the manifest the top file extends: an ablation that
/// reused its parent's name would mix their results. The error sits at the top file's `name`
/// when it has one, and at `name_origin` otherwise.
fn check_parent_name(
    name: &RunName,
    name_origin: &Origin,
    chain: &[SourceFile],
    errors: &mut Vec<Diagnostic>,
) {
    let Some(parent) = chain.get(1) else {
        return;
    };
    let top = &chain[0];
    let parent_name = parent
        .leaves
        .get("name")
        .and_then(|l| l.value.as_str().map(str::to_string))
        .unwrap_or_else(|| file_stem(&parent.path));
    if parent_name == name.as_str() {
        let at = top.leaves.get("name").map(|l| l.value_span.clone());
        errors.push(
            Diagnostic::new(format!(
                "run name `{name}` is the same as that of the manifest it extends ({})",
                display_path(&parent.path)
            ))
            .at(at.as_ref().map_or(name_origin.clone(), |s| top.origin(s)))
            .excerpt(at.as_ref().map(|s| top.excerpt(s)))
            .hint("give each configuration its own run name"),
        );
    }
}

/// One layer per file of the chain, base first. The file-only keys and keys the schema does not
/// know (already reported) are left out.
fn file_layers(chain: &[SourceFile]) -> Vec<Layer> {
    chain
        .iter()
        .rev()
        .map(|file| {
            let mut layer = Layer::default();
            for (key, leaf) in &file.leaves {
                if FILE_KEYS.contains(&key.as_str()) || !keys().contains_key(key) {
                    continue;
                }
                let entry = Entry {
                    value: leaf.value.clone(),
                    origin: file.origin(&leaf.value_span),
                    excerpt: Some(file.excerpt(&leaf.value_span)),
                };
                layer.entries.insert(key.clone(), entry);
            }
            layer
        })
        .collect()
}

/// The command-line layer: the `--set` assignments other than `name=…` (which `run_name`
/// reads) and the `--extra-args` strings. An `extends` set there is reported.
fn command_line_layer(req: &LoadRequest, errors: &mut Vec<Diagnostic>) -> Layer {
    let flags = flag_layer(
        &req.sets
            .iter()
            .filter(|s| !s.starts_with("name="))
            .cloned()
            .collect::<Vec<_>>(),
        &req.extra_args,
        errors,
    );
    if let Some(e) = flags.entries.get("extends") {
        errors.push(
            Diagnostic::new("`extends` cannot be set from the command line")
                .at(e.origin.clone())
                .hint("write `extends = \"…\"` in a manifest"),
        );
    }
    flags
}

/// The run's kind, which decides the defaults and which variables apply, with the entry that set
/// it: the command line's `kind` if set, else that of the topmost file that sets one. A missing
/// or unknown kind is reported and gives `None`.
fn kind_of<'a>(
    flags: &'a Layer,
    file_layers: &'a [Layer],
    manifest_path: &Path,
    errors: &mut Vec<Diagnostic>,
) -> Option<(Kind, &'a Entry)> {
    let kind_entry = flags
        .entries
        .get("kind")
        .or_else(|| file_layers.iter().rev().find_map(|l| l.entries.get("kind")));
    let Some(e) = kind_entry else {
        errors.push(
            Diagnostic::new(format!("{} sets no `kind`", display_path(manifest_path)))
                .at(Origin::File {
                    path: manifest_path.to_path_buf(),
                    line: 1,
                    col: 1,
                })
                .hint("add `kind = \"probe\"` or `kind = \"generation\"` at the top"),
        );
        return None;
    };
    match Kind::deserialize(e.value.clone()) {
        Ok(k) => Some((k, e)),
        Err(_) => {
            errors.push(
                Diagnostic::new(format!("unknown kind {}", e.value))
                    .at(e.origin.clone())
                    .excerpt(e.excerpt.clone())
                    .hint("use `probe` or `generation`"),
            );
            None
        }
    }
}

/// Merged settings by key, and for each key the origins (other than the defaults) whose values
/// a later layer replaced, lowest first.
type Merged = (BTreeMap<String, Entry>, BTreeMap<String, Vec<Origin>>);

/// Merges the layers, lowest first: the defaults, the files base first, the environment, the
/// command line. A later layer's value wins and every value keeps its origin. The file-only keys
/// are left out, and `kind` is set to the kind already decided, at the entry that set it.
fn merge(
    defaults: &Layer,
    file_layers: &[Layer],
    env: &Layer,
    flags: &Layer,
    kind: Kind,
    kind_entry: &Entry,
) -> Merged {
    let mut merged: BTreeMap<String, Entry> = BTreeMap::new();
    let mut replaced: BTreeMap<String, Vec<Origin>> = BTreeMap::new();
    for layer in std::iter::once(defaults)
        .chain(file_layers.iter())
        .chain([env, flags])
    {
        for (k, e) in &layer.entries {
            if FILE_KEYS.contains(&k.as_str()) {
                continue;
            }
            if let Some(old) = merged.insert(k.clone(), e.clone())
                && old.origin != Origin::Default
            {
                replaced.entry(k.clone()).or_default().push(old.origin);
            }
        }
    }
    merged.insert(
        "kind".into(),
        Entry {
            value: toml::Value::String(kind.as_str().into()),
            origin: kind_entry.origin.clone(),
            excerpt: kind_entry.excerpt.clone(),
        },
    );
    (merged, replaced)
}

/// Every merged setting with its origin and the origins it replaced, for [`Resolved::settings`].
fn settings_of(
    merged: &BTreeMap<String, Entry>,
    replaced: &BTreeMap<String, Vec<Origin>>,
) -> BTreeMap<String, Setting> {
    merged
        .iter()
        .map(|(k, e)| {
            (
                k.clone(),
                Setting {
                    value: e.value.clone(),
                    origin: e.origin.clone(),
                    replaced: replaced.get(k).cloned().unwrap_or_default(),
                },
            )
        })
        .collect()
}

/// Settings the reference scripts have that change nothing here (their schema descriptions say
/// why): accepted, so the scripts' variables work, and warned about when set.
const INERT_KEYS: &[&str] = &["timing.quiet_measurement", "runtime.compile_threads"];

/// Reads the prompt file and runs the cross-setting, prompt and path checks of [`checks`], at
/// the origins of the merged settings; warns when the asset bundle does not exist yet. Returns
/// the prompts, or `None` when the prompt file cannot be read (a warning, not an error), and the
/// names file's standard prompts likewise.
fn check_run(
    manifest: &Manifest,
    run_paths: &RunPaths,
    checkouts: &[PathBuf],
    merged: &BTreeMap<String, Entry>,
    env: &BTreeMap<String, String>,
    errors: &mut Vec<Diagnostic>,
    warnings: &mut Vec<String>,
) -> (Option<Vec<String>>, Option<Vec<String>>) {
    let lookup = |key: &str| {
        merged
            .get(key)
            .map(|e| (e.origin.clone(), e.excerpt.clone()))
    };
    for key in INERT_KEYS {
        if let Some(entry) = merged.get(*key)
            && entry.origin != Origin::Default
        {
            warnings.push(format!(
                "`{key}` (set by {}) has no effect in this runner; see `runner schema` for why",
                entry.origin
            ));
        }
    }
    let prompts = read_prompts(&run_paths.prompts_file, warnings, errors, &lookup);
    checks::validate(manifest, prompts.as_deref(), run_paths, &lookup, errors);
    checks::check_paths(manifest, run_paths, checkouts, env, &lookup, errors);
    let names = run_paths.names_file.as_ref().and_then(|path| {
        let count = prompts.as_ref().map(Vec::len);
        super::names_file::read(path, count, warnings, errors, &lookup)
    });
    super::names_file::check_evaluation(manifest, &lookup, errors);
    if !run_paths.bundle.exists() {
        warnings.push(format!(
            "asset bundle {} does not exist yet; download the released weights and export them before `runner apply` (docs/gpu.md, \"Weights\")",
            display_path(&run_paths.bundle)
        ));
    }
    (prompts, names)
}

/// The files of the chain, top first, each with the SHA-256 of its text.
fn manifest_files(chain: &[SourceFile]) -> Vec<ManifestFile> {
    chain
        .iter()
        .map(|f| ManifestFile {
            path: f.path.clone(),
            sha256: hex(&Sha256::digest(f.text.as_bytes())),
        })
        .collect()
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads the top manifest and everything it extends, top first; cycles and missing files are
/// reported at the `extends` value that names them.
fn load_chain(top: &Path) -> Result<Vec<SourceFile>, Diagnostics> {
    let read = |path: &Path| inputs::read_text_file(path, inputs::MANIFEST_LIMIT, "manifest");
    let text = read(top).map_err(|e| {
        Diagnostic::new(format!("cannot read manifest {}: {e}", display_path(top)))
            .hint("check the path; manifests live in experiments/")
    })?;
    let mut chain = vec![SourceFile::parse(top.to_path_buf(), text)?];
    let mut seen = vec![std::fs::canonicalize(top).unwrap_or_else(|_| top.to_path_buf())];
    loop {
        let current = chain.last().expect("chain is never empty");
        let Some(leaf) = current.leaves.get("extends") else {
            break;
        };
        let at = |d: Diagnostic| {
            d.at(current.origin(&leaf.value_span))
                .excerpt(Some(current.excerpt(&leaf.value_span)))
        };
        let Some(rel) = leaf.value.as_str() else {
            return Err(at(Diagnostic::new("`extends` must be a path string"))
                .hint("write extends = \"other.toml\"")
                .into());
        };
        let path = paths::normalize(&paths::through_links(&current.dir().join(rel)));
        let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if seen.contains(&canonical) {
            let names: Vec<String> = chain.iter().map(|f| display_path(&f.path)).collect();
            return Err(at(Diagnostic::new(format!(
                "`extends` forms a cycle: {} -> {}",
                names.join(" -> "),
                display_path(&path)
            )))
            .hint("remove one `extends` so the chain ends at a manifest without one")
            .into());
        }
        let text = match read(&path) {
            Ok(t) => t,
            Err(e) => {
                return Err(at(Diagnostic::new(format!(
                    "cannot read extended manifest {}: {e}",
                    display_path(&path)
                )))
                .hint("paths in `extends` are relative to the manifest that names them")
                .into());
            }
        };
        chain.push(SourceFile::parse(path, text)?);
        seen.push(canonical);
    }
    Ok(chain)
}

fn defaults_layer(kind: Kind, name: &str) -> Layer {
    let value = toml::Value::try_from(Manifest::defaults(kind, name)).expect("defaults serialise");
    let mut layer = Layer::default();
    flatten("", &value, &mut |k, v| {
        layer.entries.insert(
            k.to_string(),
            Entry {
                value: v.clone(),
                origin: Origin::Default,
                excerpt: None,
            },
        );
    });
    layer
}

/// Deserialises the merged settings. Each bad value is reported at its origin and replaced by
/// its default, and deserialisation is tried again, so all independent errors come out at once.
fn deserialize(
    merged: &mut BTreeMap<String, Entry>,
    defaults: &Layer,
    errors: &mut Vec<Diagnostic>,
) -> Option<Manifest> {
    let mut failed = false;
    for _ in 0..=merged.len() {
        let value = unflatten(merged);
        match serde_path_to_error::deserialize::<_, Manifest>(value) {
            Ok(m) => return (!failed).then_some(m),
            Err(e) => {
                failed = true;
                let key = e.path().to_string();
                let message = e.inner().to_string();
                // The deserialiser appends "in `key`"; the location says that better.
                let message = message.lines().next().unwrap_or_default().trim();
                // An element of a list (`shards.gpu_map[0]`) is reported at the list's origin.
                let setting = key.split('[').next().unwrap_or(&key).to_string();
                let Some(entry) = merged.get(&setting).cloned() else {
                    errors.push(Diagnostic::new(format!(
                        "invalid manifest: {message} at `{key}`"
                    )));
                    return None;
                };
                let mut d = Diagnostic::new(format!("invalid value for `{key}`: {message}"))
                    .at(entry.origin.clone())
                    .excerpt(entry.excerpt.clone());
                // Messages that already say what to write need no hint.
                if !(message.contains("expected") || message.contains("use ")) {
                    d = d.hint(hint_for(&key));
                }
                errors.push(d);
                match defaults.entries.get(&setting) {
                    Some(d) if entry.origin != Origin::Default => {
                        merged.insert(setting, d.clone());
                    }
                    Some(_) => return None,
                    None => {
                        merged.remove(&setting);
                    }
                }
            }
        }
    }
    None
}

fn hint_for(key: &str) -> String {
    format!("see `runner schema` for the values `{key}` accepts")
}

/// The prompt file's prompts. A missing file is a warning (`runner plan` works without it); one
/// that cannot be a prompt file is an error at `prompts.file`.
fn read_prompts(
    path: &Path,
    warnings: &mut Vec<String>,
    errors: &mut Vec<Diagnostic>,
    lookup: &checks::Lookup<'_>,
) -> Option<Vec<String>> {
    let read = inputs::read_text_file(path, inputs::PROMPTS_LIMIT, "prompt file");
    if read == Err(inputs::TextFileError::Missing) {
        warnings.push(format!(
            "prompt file {} does not exist; `runner apply` needs it (see assets/prompts/README.md)",
            display_path(path)
        ));
        return None;
    }
    match read
        .map_err(inputs::PromptFileError::from)
        .and_then(|text| inputs::parse_prompt_file(&text))
    {
        Ok(prompts) => Some(prompts),
        Err(e) => {
            errors.push(checks::at_key(
                Diagnostic::new(format!("prompt file {} {e}", display_path(path)))
                    .hint("one prompt per line, UTF-8 (see assets/prompts/README.md)"),
                "prompts.file",
                lookup,
            ));
            None
        }
    }
}

//! Loading a manifest: the `extends` chain, the layers, the merge, and validation. Everything the
//! user got wrong is collected into one [`Diagnostics`] before anything is planned or written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::diagnostic::{Diagnostic, Diagnostics, Excerpt, Origin, display_path};
use super::layers::{Entry, Layer, env_layer, flag_layer, unknown_key};
use super::paths;
use super::schema::keys;
use super::settings::{Kind, Manifest, ProviderKind};
use super::source::SourceFile;
use super::values::{IndexList, RunName};

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
    /// Things worth saying that do not stop a plan (a missing bundle, ignored variables).
    pub warnings: Vec<String>,
}

impl Resolved {
    pub fn kind(&self) -> Kind {
        self.manifest.kind
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

/// Loads and validates a manifest with its overrides.
pub fn load(req: &LoadRequest) -> Result<Resolved, Diagnostics> {
    let mut errors: Vec<Diagnostic> = Vec::new();
    let mut warnings: Vec<String> = Vec::new();

    let manifest_path = paths::normalize(&req.cwd.join(&req.manifest));
    let chain = load_chain(&manifest_path)?;
    let top = &chain[0];

    // Unknown keys in any file, reported at the key.
    for file in &chain {
        for (key, leaf) in &file.leaves {
            if !keys().contains_key(key) {
                errors.push(unknown_key(
                    key,
                    file.origin(&leaf.key_span),
                    Some(file.excerpt(&leaf.key_span)),
                ));
            }
        }
    }

    // The run name: the top file's `name`, or its stem; `--set name=…` above both.
    let flag_name = req.sets.iter().find_map(|s| s.strip_prefix("name="));
    let (name_text, name_origin, name_excerpt) = match (flag_name, top.leaves.get("name")) {
        (Some(n), _) => (
            n.to_string(),
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
        Ok(n) => Some(n),
        Err(msg) => {
            let mut d = Diagnostic::new(format!("invalid run name: {msg}"))
                .at(name_origin.clone())
                .excerpt(name_excerpt);
            if name_origin == Origin::Default {
                d = d.hint("rename the file or set `name = \"…\"` in it");
            }
            errors.push(d);
            None
        }
    };
    // An ablation must not reuse the name of what it extends: its results would mix.
    if let (Some(name), Some(parent)) = (&name, chain.get(1)) {
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

    // File layers, base first.
    let file_layers: Vec<Layer> = chain
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
        .collect();
    let flags = flag_layer(
        &req.sets
            .iter()
            .filter(|s| !s.starts_with("name="))
            .cloned()
            .collect::<Vec<_>>(),
        &req.extra_args,
        &mut errors,
    );
    if let Some(e) = flags.entries.get("extends") {
        errors.push(
            Diagnostic::new("`extends` cannot be set from the command line")
                .at(e.origin.clone())
                .hint("write `extends = \"…\"` in a manifest"),
        );
    }

    // The kind decides the defaults and which variables apply.
    let kind_entry = flags
        .entries
        .get("kind")
        .or_else(|| file_layers.iter().rev().find_map(|l| l.entries.get("kind")));
    let kind = match kind_entry {
        None => {
            errors.push(
                Diagnostic::new(format!("{} sets no `kind`", display_path(&manifest_path)))
                    .hint("add `kind = \"probe\"` or `kind = \"generation\"` at the top"),
            );
            return Err(Diagnostics(errors));
        }
        Some(e) => match Kind::deserialize(e.value.clone()) {
            Ok(k) => k,
            Err(_) => {
                errors.push(
                    Diagnostic::new(format!("unknown kind {}", e.value))
                        .at(e.origin.clone())
                        .excerpt(e.excerpt.clone())
                        .hint("use `probe` or `generation`"),
                );
                return Err(Diagnostics(errors));
            }
        },
    };
    let name = match name {
        Some(n) => n,
        None => return Err(Diagnostics(errors)),
    };

    let env = env_layer(&req.env, kind, &mut errors, &mut warnings);
    let defaults = defaults_layer(kind, name.as_str());

    // Merge: later layers win; every value keeps its origin.
    let mut merged: BTreeMap<String, Entry> = BTreeMap::new();
    let mut replaced: BTreeMap<String, Vec<Origin>> = BTreeMap::new();
    for layer in std::iter::once(&defaults)
        .chain(file_layers.iter())
        .chain([&env, &flags])
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
            origin: kind_entry.map_or(Origin::Default, |e| e.origin.clone()),
            excerpt: kind_entry.and_then(|e| e.excerpt.clone()),
        },
    );

    let manifest = deserialize(&mut merged, &defaults, &mut errors);
    let settings: BTreeMap<String, Setting> = merged
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
        .collect();
    let Some(mut manifest) = manifest else {
        return Err(Diagnostics(errors));
    };
    manifest.name = Some(name.clone());

    let base_of = |key: &str| -> PathBuf {
        match merged.get(key).map(|e| &e.origin) {
            Some(Origin::File { path, .. }) => {
                path.parent().unwrap_or(Path::new(".")).to_path_buf()
            }
            _ => req.cwd.clone(),
        }
    };
    let mut path_of = |key: &str, text: &str| -> PathBuf {
        match paths::expand(text, &req.env) {
            Ok(t) => paths::resolve(&base_of(key), &t),
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
    };
    let outputs_dir = path_of("outputs.dir", &manifest.outputs.dir);
    let run_paths = RunPaths {
        prompts_file: path_of("prompts.file", &manifest.prompts.file),
        bundle: path_of("assets.bundle", &manifest.assets.bundle),
        run_dir: outputs_dir.join(name.as_str()),
        outputs_dir,
        shared_state_dir: path_of("cache.shared_state_dir", &manifest.cache.shared_state_dir),
        run_state_root: path_of("cache.run_state_root", &manifest.cache.run_state_root),
        work_root: path_of("staging.work_root", &manifest.staging.work_root),
        ort_library: manifest
            .runtime
            .ort_library
            .clone()
            .map(|p| path_of("runtime.ort_library", &p)),
    };

    let prompts = read_prompts(&run_paths.prompts_file, &mut warnings);
    let lookup = |key: &str| {
        merged
            .get(key)
            .map(|e| (e.origin.clone(), e.excerpt.clone()))
    };
    validate(
        &manifest,
        prompts.as_deref(),
        &run_paths,
        &lookup,
        &mut errors,
    );
    check_paths(&manifest, &run_paths, &req.env, &lookup, &mut errors);
    if !run_paths.bundle.exists() {
        warnings.push(format!(
            "asset bundle {} does not exist yet; export it before `runner apply` (see assets/export/README.md)",
            display_path(&run_paths.bundle)
        ));
    }

    if !errors.is_empty() {
        return Err(Diagnostics(errors));
    }
    let files = chain
        .iter()
        .map(|f| ManifestFile {
            path: f.path.clone(),
            sha256: hex(&Sha256::digest(f.text.as_bytes())),
        })
        .collect();
    Ok(Resolved {
        manifest,
        name,
        files,
        settings,
        paths: run_paths,
        prompts,
        warnings,
    })
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
    let read = |path: &Path| std::fs::read_to_string(path);
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
        let path = paths::resolve(current.dir(), rel);
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

fn flatten(prefix: &str, v: &toml::Value, f: &mut dyn FnMut(&str, &toml::Value)) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, f);
            }
        }
        other => f(prefix, other),
    }
}

fn unflatten(entries: &BTreeMap<String, Entry>) -> toml::Value {
    let mut root = toml::Table::new();
    for (key, e) in entries {
        let mut table = &mut root;
        let mut parts = key.split('.').peekable();
        while let Some(part) = parts.next() {
            if parts.peek().is_none() {
                table.insert(part.to_string(), e.value.clone());
            } else {
                table = table
                    .entry(part.to_string())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                    .as_table_mut()
                    .expect("keys of one manifest never collide with tables");
            }
        }
    }
    toml::Value::Table(root)
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
                let Some(entry) = merged.get(&key).cloned() else {
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
                match defaults.entries.get(&key) {
                    Some(d) if entry.origin != Origin::Default => {
                        merged.insert(key, d.clone());
                    }
                    Some(_) => return None,
                    None => {
                        merged.remove(&key);
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

/// The prompts of a prompt file's text: one a line (`\n` or `\r\n`), blank lines left out. A
/// prompt's global index is its place in this list.
pub fn prompt_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.trim_end_matches('\r').to_string())
        .filter(|l| !l.trim().is_empty())
        .collect()
}

fn read_prompts(path: &Path, warnings: &mut Vec<String>) -> Option<Vec<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Some(prompt_lines(&text)),
        Err(_) => {
            warnings.push(format!(
                "prompt file {} does not exist; `runner apply` needs it (see assets/prompts/README.md)",
                display_path(path)
            ));
            None
        }
    }
}

type Lookup<'a> = dyn Fn(&str) -> Option<(Origin, Option<Excerpt>)> + 'a;

fn at_key(d: Diagnostic, key: &str, lookup: &Lookup<'_>) -> Diagnostic {
    match lookup(key) {
        Some((origin, excerpt)) => d.at(origin).excerpt(excerpt),
        None => d,
    }
}

/// Checks that span several settings or need the prompt file.
fn validate(
    m: &Manifest,
    prompts: Option<&[String]>,
    run_paths: &RunPaths,
    lookup: &Lookup<'_>,
    errors: &mut Vec<Diagnostic>,
) {
    let fpb = m.method.frames_per_block.0;
    let lf = m.method.latent_frames.0;
    if !lf.is_multiple_of(fpb) {
        errors.push(at_key(
            Diagnostic::new(format!(
                "latent_frames ({lf}) is not a multiple of frames_per_block ({fpb})"
            ))
            .hint("blocks must tile the video; e.g. 21 latent frames in blocks of 3"),
            "method.latent_frames",
            lookup,
        ));
    }
    for key in ["method.height", "method.width"] {
        let v = if key.ends_with("height") {
            m.method.height.0
        } else {
            m.method.width.0
        };
        if v % 16 != 0 {
            errors.push(at_key(
                Diagnostic::new(format!("{} ({v}) is not a multiple of 16", &key[7..]))
                    .hint("the VAE (x8) and the DiT patch (x2) need multiples of 16"),
                key,
                lookup,
            ));
        }
    }
    if m.runtime.cuda_graphs && m.runtime.provider != ProviderKind::Cuda {
        errors.push(at_key(
            Diagnostic::new(format!(
                "runtime.cuda_graphs needs the CUDA provider; runtime.provider is \"{}\"",
                crate::plan::render::word(&m.runtime.provider)
            ))
            .hint("set runtime.provider = \"cuda\", or remove `cuda_graphs`"),
            "runtime.cuda_graphs",
            lookup,
        ));
    }
    if m.kind == Kind::Probe && m.shards.count.0 != 1 {
        errors.push(at_key(
            Diagnostic::new("a probe runs one logical shard")
                .hint("remove `shards.count`, or make this a generation"),
            "shards.count",
            lookup,
        ));
    }
    if let Some(map) = &m.shards.gpu_map
        && map.len() as u64 != m.shards.count.0
    {
        errors.push(at_key(
            Diagnostic::new(format!(
                "shards.gpu_map has {} entries for {} shards",
                map.len(),
                m.shards.count.0
            ))
            .hint("give one GPU slot per shard"),
            "shards.gpu_map",
            lookup,
        ));
    }
    let count = match prompts {
        Some(p) => p.len() as u32,
        None => return,
    };
    if let Some(expect) = m.prompts.expect_count
        && expect != count
    {
        errors.push(at_key(
            Diagnostic::new(format!(
                "prompt file {} has {count} prompts, expected {expect}",
                display_path(&run_paths.prompts_file)
            ))
            .hint("use the full prompt file, or change `prompts.expect_count`"),
            "prompts.expect_count",
            lookup,
        ));
    }
    let mut check_range = |list: &IndexList, key: &str| {
        if let Some(max) = list.max()
            && max >= count
        {
            errors.push(at_key(
                Diagnostic::new(format!(
                    "prompt index {max} is out of range: {} has {count} prompts (0..={})",
                    display_path(&run_paths.prompts_file),
                    count.saturating_sub(1)
                ))
                .hint("pick indices inside the prompt file"),
                key,
                lookup,
            ));
        }
    };
    check_range(&m.prompts.indices, "prompts.indices");
    if let Some(w) = &m.warmup.indices {
        check_range(w, "warmup.indices");
    }
    let selected = m.prompts.indices.resolve(count).len() as u64;
    if m.kind == Kind::Generation && selected < m.shards.count.0 {
        errors.push(at_key(
            Diagnostic::new(format!(
                "{} shards for {selected} prompts would leave shards empty",
                m.shards.count.0
            ))
            .hint("use at most one shard per prompt"),
            "shards.count",
            lookup,
        ));
    }
}

/// Output, cache and work directories must not overlap the source checkout, the asset
/// bundle, installations or broad roots; the work root may not contain outputs or caches.
fn check_paths(
    m: &Manifest,
    p: &RunPaths,
    env: &BTreeMap<String, String>,
    lookup: &Lookup<'_>,
    errors: &mut Vec<Diagnostic>,
) {
    let checkout =
        paths::checkout_root(&p.bundle).or_else(|| paths::checkout_root(&p.prompts_file));
    let mut dirs: Vec<(&str, &Path)> = vec![
        ("outputs.dir", &p.outputs_dir),
        ("staging.work_root", &p.work_root),
    ];
    match (m.kind, m.cache.mode) {
        (Kind::Probe, _) => dirs.push(("cache.run_state_root", &p.run_state_root)),
        (Kind::Generation, super::settings::CacheMode::Shared) => {
            dirs.push(("cache.shared_state_dir", &p.shared_state_dir))
        }
        _ => {}
    }
    let broad = paths::broad_roots(env);
    let installs = paths::installations(env);
    for (key, dir) in &dirs {
        let fail = |msg: String, hint: &str| {
            at_key(Diagnostic::new(msg).hint(hint.to_string()), key, lookup)
        };
        if let Some(root) = broad.iter().find(|r| *dir == r.as_path()) {
            errors.push(fail(
                format!("`{key}` is {}, a broad root", root.display()),
                "use a dedicated folder below it, e.g. /tmp/unstep_probe_gpu1",
            ));
            continue;
        }
        if let Some(inst) = installs.iter().find(|i| paths::overlaps(dir, i)) {
            errors.push(fail(
                format!(
                    "`{key}` ({}) overlaps the installation {}",
                    dir.display(),
                    inst.display()
                ),
                "write runs outside system, Python and CUDA installations",
            ));
            continue;
        }
        if paths::overlaps(dir, &p.bundle) {
            errors.push(fail(
                format!(
                    "`{key}` ({}) overlaps the asset bundle at {}",
                    display_path(dir),
                    display_path(&p.bundle)
                ),
                "keep outputs, caches and staging out of the bundle",
            ));
            continue;
        }
        if let Some(checkout) = &checkout {
            // Results below the checkout (results/ is git-ignored) are fine; a folder that
            // contains the checkout, or staging inside it, is not.
            let inside_ok = *key != "staging.work_root";
            if checkout.starts_with(dir) || (!inside_ok && dir.starts_with(checkout)) {
                errors.push(fail(
                    format!(
                        "`{key}` ({}) overlaps the source checkout {}",
                        display_path(dir),
                        display_path(checkout)
                    ),
                    "point it at a dedicated folder outside the checkout",
                ));
                continue;
            }
        }
    }
    // A work root that is itself refused above says enough.
    let work_root_ok = !broad.contains(&p.work_root);
    for (key, dir) in dirs
        .iter()
        .filter(|(k, _)| *k != "staging.work_root" && work_root_ok)
    {
        if dir.starts_with(&p.work_root) {
            errors.push(at_key(
                Diagnostic::new(format!(
                    "`{key}` ({}) is inside the work root {}",
                    display_path(dir),
                    display_path(&p.work_root)
                ))
                .hint("the work root is staging only; keep outputs and caches outside it"),
                key,
                lookup,
            ));
        }
    }
}

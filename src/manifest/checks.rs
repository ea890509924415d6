//! Checks on a deserialised manifest that no single setting can make alone: settings that must
//! agree with each other, settings that must agree with the prompt file, and the run's folders,
//! which must not overlap the checkout, the asset bundle, installations, broad roots or the work
//! root. Each problem is reported at the setting it names, through a [`Lookup`] of origins.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::diagnostic::{Diagnostic, Excerpt, Origin, display_path};
use super::paths;
use super::run_paths::RunPaths;
use super::settings::{CacheMode, Kind, Manifest, ProviderKind};
use super::values::IndexList;

/// Where a setting came from, by key: its origin and an excerpt of its value, or `None` for a
/// key that no layer set.
pub(super) type Lookup<'a> = dyn Fn(&str) -> Option<(Origin, Option<Excerpt>)> + 'a;

/// Places `d` at the origin of the setting `key`, when it has one.
pub(super) fn at_key(d: Diagnostic, key: &str, lookup: &Lookup<'_>) -> Diagnostic {
    at_keys(d, &[key], lookup)
}

/// Places `d`, a conflict between settings, at the first of `keys` that a layer above the
/// defaults set (the one the user wrote), else at the first that has an origin.
pub(super) fn at_keys(d: Diagnostic, keys: &[&str], lookup: &Lookup<'_>) -> Diagnostic {
    let found: Vec<_> = keys.iter().filter_map(|k| lookup(k)).collect();
    let chosen = found
        .iter()
        .find(|(origin, _)| *origin != Origin::Default)
        .or(found.first());
    match chosen {
        Some((origin, excerpt)) => d.at(origin.clone()).excerpt(excerpt.clone()),
        None => d,
    }
}

/// Checks that span several settings or need the prompt file. The prompt checks run only when
/// the prompt file was read (`prompts` is `Some`).
pub(super) fn validate(
    m: &Manifest,
    prompts: Option<&[String]>,
    run_paths: &RunPaths,
    lookup: &Lookup<'_>,
    errors: &mut Vec<Diagnostic>,
) {
    check_video_shape(m, lookup, errors);
    check_runtime_and_shards(m, lookup, errors);
    check_executor(m, lookup, errors);
    if let Some(p) = prompts {
        check_prompts(m, p.len() as u32, run_paths, lookup, errors);
    }
}

/// The Slurm options must be ones sbatch can take: at least one CPU per task, non-empty values,
/// and `extra` items that are options (the array, the script and its output are apply's).
fn check_executor(m: &Manifest, lookup: &Lookup<'_>, errors: &mut Vec<Diagnostic>) {
    let e = &m.executor;
    if e.cpus_per_task == Some(0) {
        errors.push(at_key(
            Diagnostic::new("executor.cpus_per_task is 0; a task needs at least one CPU")
                .hint("leave it out (runtime.cpu_threads_per_process) or give 1 or more"),
            "executor.cpus_per_task",
            lookup,
        ));
    }
    for (key, value) in [
        ("executor.partition", &e.partition),
        ("executor.account", &e.account),
        ("executor.time", &e.time),
        ("executor.mem", &e.mem),
    ] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            errors.push(at_key(
                Diagnostic::new(format!("{key} is empty"))
                    .hint("leave it out for Slurm's default, or give a value"),
                key,
                lookup,
            ));
        }
    }
    for arg in &e.extra {
        let name = arg.split('=').next().unwrap_or_default();
        let problem = if !arg.starts_with('-') {
            Some(format!(
                "executor.extra item `{arg}` is not an sbatch option (each item is one argument starting with `-`)"
            ))
        } else if ["--array", "-a", "--wrap", "--parsable", "--output", "-o"].contains(&name) {
            Some(format!(
                "executor.extra item `{arg}`: runner apply sets {name} itself (the job array, its script and its output files)"
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            errors.push(at_key(
                Diagnostic::new(problem)
                    .hint("e.g. extra = [\"--qos=high\", \"--constraint=h200\"]"),
                "executor.extra",
                lookup,
            ));
        }
    }
}

/// The latent frames must tile into blocks, and the height and width must be multiples of 16.
fn check_video_shape(m: &Manifest, lookup: &Lookup<'_>, errors: &mut Vec<Diagnostic>) {
    let fpb = m.method.frames_per_block.0;
    let lf = m.method.latent_frames.0;
    if !lf.is_multiple_of(fpb) {
        errors.push(at_keys(
            Diagnostic::new(format!(
                "latent_frames ({lf}) is not a multiple of frames_per_block ({fpb})"
            ))
            .hint("blocks must tile the video; e.g. 21 latent frames in blocks of 3"),
            &["method.latent_frames", "method.frames_per_block"],
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
}

/// CUDA graphs need the CUDA provider, a probe runs one shard, and a GPU map gives one slot per
/// shard.
fn check_runtime_and_shards(m: &Manifest, lookup: &Lookup<'_>, errors: &mut Vec<Diagnostic>) {
    if m.runtime.cuda_graphs && m.runtime.provider != ProviderKind::Cuda {
        errors.push(at_keys(
            Diagnostic::new(format!(
                "runtime.cuda_graphs needs the CUDA provider; runtime.provider is \"{}\"",
                m.runtime.provider
            ))
            .hint("set runtime.provider = \"cuda\", or remove `cuda_graphs`"),
            &["runtime.cuda_graphs", "runtime.provider"],
            lookup,
        ));
    }
    if m.kind == Kind::Probe && m.shards.count.0 != 1 {
        errors.push(at_keys(
            Diagnostic::new("a probe runs one logical shard")
                .hint("remove `shards.count`, or make this a generation"),
            &["shards.count", "kind"],
            lookup,
        ));
    }
    if let Some(map) = &m.shards.gpu_map
        && map.len() as u64 != m.shards.count.0
    {
        errors.push(at_keys(
            Diagnostic::new(format!(
                "shards.gpu_map has {} entries for {} shards",
                map.len(),
                m.shards.count.0
            ))
            .hint("give one GPU slot per shard"),
            &["shards.gpu_map", "shards.count"],
            lookup,
        ));
    }
}

/// Checks against the `count` prompts of the prompt file: the expected count, the prompt and
/// warm-up indices, and (for a generation) at least one selected prompt per shard.
fn check_prompts(
    m: &Manifest,
    count: u32,
    run_paths: &RunPaths,
    lookup: &Lookup<'_>,
    errors: &mut Vec<Diagnostic>,
) {
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
}

/// Output, cache and work directories must not overlap a source checkout (`checkouts`: those
/// of the manifests, the bundle and the prompt file), the asset bundle, installations or broad
/// roots; the work root may not contain outputs or caches.
pub(super) fn check_paths(
    m: &Manifest,
    p: &RunPaths,
    checkouts: &[PathBuf],
    env: &BTreeMap<String, String>,
    lookup: &Lookup<'_>,
    errors: &mut Vec<Diagnostic>,
) {
    let mut dirs: Vec<(&str, &Path)> = vec![
        ("outputs.dir", &p.outputs_dir),
        ("staging.work_root", &p.work_root),
    ];
    match (m.kind, m.cache.mode) {
        (Kind::Probe, _) => dirs.push(("cache.run_state_root", &p.run_state_root)),
        (Kind::Generation, CacheMode::Shared) => {
            dirs.push(("cache.shared_state_dir", &p.shared_state_dir))
        }
        _ => {}
    }
    let broad = paths::broad_roots(env);
    check_overlaps(&dirs, p, checkouts, env, &broad, lookup, errors);
    check_outside_work_root(&dirs, p, &broad, lookup, errors);
    check_global_caches(p, checkouts, env, &broad, lookup, errors);
}

/// The folders `cache.clear_global` removes (CUDA's JIT caches, one of them wherever
/// `CUDA_CACHE_PATH` points) must hold nothing but a cache: one that is a broad root, overlaps an
/// installation, or holds a source checkout, the asset bundle or the run's own folders is
/// refused at `cache.clear_global` before anything is removed.
fn check_global_caches(
    p: &RunPaths,
    checkouts: &[PathBuf],
    env: &BTreeMap<String, String>,
    broad: &[PathBuf],
    lookup: &Lookup<'_>,
    errors: &mut Vec<Diagnostic>,
) {
    let installs = paths::installations(env);
    let kept = [
        &p.bundle,
        &p.outputs_dir,
        &p.work_root,
        &p.shared_state_dir,
        &p.run_state_root,
    ];
    for dir in &p.global_caches {
        let problem = if broad.contains(dir) {
            Some("a broad root".to_string())
        } else if let Some(inst) = installs.iter().find(|i| paths::overlaps(dir, i)) {
            Some(format!("overlapping the installation {}", inst.display()))
        } else {
            checkouts
                .iter()
                .chain(kept)
                .find(|k| k.starts_with(dir))
                .map(|k| format!("holding {}", display_path(k)))
        };
        if let Some(problem) = problem {
            errors.push(at_key(
                Diagnostic::new(format!(
                    "cache.clear_global would remove {}, {problem}",
                    display_path(dir)
                ))
                .hint(
                    "point CUDA_CACHE_PATH at a folder that holds CUDA's JIT cache only, or \
                     leave cache.clear_global off",
                ),
                "cache.clear_global",
                lookup,
            ));
        }
    }
}

/// Reports, for each of `dirs`, the first of these it breaks: it is a broad root, it overlaps an
/// installation, it overlaps the asset bundle, or it overlaps a source checkout.
fn check_overlaps(
    dirs: &[(&str, &Path)],
    p: &RunPaths,
    checkouts: &[PathBuf],
    env: &BTreeMap<String, String>,
    broad: &[PathBuf],
    lookup: &Lookup<'_>,
    errors: &mut Vec<Diagnostic>,
) {
    let installs = paths::installations(env);
    for (key, dir) in dirs {
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
        // Results below a checkout (results/ is git-ignored) are fine, but not in its own
        // folders (`paths::CHECKOUT_OWN_DIRS`); a folder that contains the checkout, or staging
        // inside it, is not.
        let inside_ok = *key != "staging.work_root";
        let in_own_dir = |c: &PathBuf| {
            paths::CHECKOUT_OWN_DIRS
                .iter()
                .any(|own| dir.starts_with(c.join(own)))
        };
        if let Some(checkout) = checkouts
            .iter()
            .find(|c| c.starts_with(dir) || (!inside_ok && dir.starts_with(c)) || in_own_dir(c))
        {
            errors.push(fail(
                format!(
                    "`{key}` ({}) overlaps the source checkout {}",
                    display_path(dir),
                    display_path(checkout)
                ),
                "point it at a dedicated folder outside the checkout",
            ));
        }
    }
}

/// Reports each of `dirs` other than the work root that lies inside the work root, which is
/// for staging only.
fn check_outside_work_root(
    dirs: &[(&str, &Path)],
    p: &RunPaths,
    broad: &[PathBuf],
    lookup: &Lookup<'_>,
    errors: &mut Vec<Diagnostic>,
) {
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

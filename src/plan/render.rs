//! The plan as a person reads it, section by section (locations, settings, shards, processes,
//! notes), and the `--explain` table of settings and the layers that set them.

use std::fmt::Write;
use std::path::Path;

use crate::manifest::diagnostic::display_path;
use crate::manifest::{CacheMode, IndexList, Kind, Origin, Resolved};
use crate::vocab::ArrayKind;

use super::build::{Plan, Role};

fn p(path: &Path) -> String {
    display_path(path)
}

/// The manifest spelling of an enum value (`run_gpu`, not `RunGpu`).
pub fn word<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

fn indices(v: &[u32]) -> String {
    if v.is_empty() {
        "(none)".into()
    } else {
        IndexList::compact(v)
    }
}

/// Renders the plan as text; `results_state` says what the results folder holds already.
pub fn text(plan: &Plan, r: &Resolved, results_state: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "plan for run `{}` ({})", plan.run, plan.kind.as_str());
    locations(&mut s, plan, r, results_state);
    settings(&mut s, plan, r);
    shards(&mut s, plan);
    processes(&mut s, plan);
    notes(&mut s, plan, r);
    s
}

/// Writes the header lines on where the run reads and writes: the manifest chain, the results
/// folder, the work root, the bundle and the prompts.
fn locations(s: &mut String, plan: &Plan, r: &Resolved, results_state: &str) {
    let chain: Vec<String> = plan.manifests.iter().map(|f| p(f)).collect();
    let _ = writeln!(s, "  manifests     {}", chain.join(" <- "));
    let _ = writeln!(s, "  results       {} ({results_state})", p(&plan.run_dir));
    let _ = writeln!(
        s,
        "  work root     {} (exclusive lock for the whole run)",
        p(&plan.work_root)
    );
    let _ = writeln!(s, "  bundle        {}", p(&plan.bundle));
    let count = match plan.prompt_count {
        Some(n) => format!("{n} prompts"),
        None => "prompt count unknown".into(),
    };
    let selected: usize = plan.shards.iter().map(|sh| sh.prompts.len()).sum();
    let _ = writeln!(
        s,
        "  prompts       {} ({count}); indices {}, {selected} selected",
        p(&plan.prompts_file),
        r.manifest.prompts.indices
    );
    if let Some(range) = plan.selection {
        let mine: usize = plan.selected_shards().map(|sh| sh.prompts.len()).sum();
        let _ = writeln!(
            s,
            "  --shard       {} of {} shards: {mine} prompts; the other shards are left to other applies",
            range.label(),
            plan.shards.len()
        );
    }
    let e = &r.manifest.executor;
    if e.kind == crate::manifest::ExecutorKind::Slurm {
        let mut opts = Vec::new();
        for (name, value) in [
            ("partition", &e.partition),
            ("account", &e.account),
            ("time", &e.time),
            ("mem", &e.mem),
        ] {
            if let Some(v) = value {
                opts.push(format!("{name} {v}"));
            }
        }
        let _ = writeln!(
            s,
            "  executor      slurm: one job array, a task per slot with work{}",
            if opts.is_empty() {
                String::new()
            } else {
                format!(" ({})", opts.join(", "))
            }
        );
    }
}

/// Writes the header lines on how the run generates: the provider and its devices, the noise,
/// the caches, the timed region and the method settings that differ from their defaults.
fn settings(s: &mut String, plan: &Plan, r: &Resolved) {
    let m = &r.manifest;
    let devices: Vec<&str> = plan.slots.iter().map(|sl| sl.device.as_str()).collect();
    let _ = writeln!(
        s,
        "  provider      {} on {} [{}]{}",
        word(&plan.provider),
        if plan.provider == crate::manifest::ProviderKind::Cpu {
            "cpu slots"
        } else {
            "GPUs"
        },
        devices.join(", "),
        if m.runtime.cuda_graphs {
            "; the DiT as CUDA graphs (captured in each process's first prompt)"
        } else {
            ""
        }
    );
    if let Some(from) = &plan.gpus_from {
        let _ = writeln!(s, "  GPUs          {from}");
    }
    let _ = writeln!(
        s,
        "  noise         seed {}, sequential_global, reseed initial_only",
        plan.seed
    );
    let _ = writeln!(
        s,
        "  cache         {}, scope {} ({}){}",
        word(&plan.cache_mode),
        word(&plan.cache_scope),
        plan.cache_label,
        if m.cache.clear_global {
            "; global caches purged first (see below)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "  timed region  {} -> {}",
        plan.timed_region.starts, plan.timed_region.ends
    );
    let kept: Vec<String> = ArrayKind::ALL
        .into_iter()
        .filter(|kind| m.outputs.keeps(*kind))
        .map(|kind| format!("{}/", p(&plan.run_dir.join(kind.dir()))))
        .collect();
    if !kept.is_empty() {
        let _ = writeln!(
            s,
            "  keeps         {} of every measured prompt (for runner compare's quality)",
            kept.join(" and ")
        );
    }
    let overrides = r.method_overrides();
    if !overrides.is_empty() {
        let list: Vec<String> = overrides
            .iter()
            .map(|(k, (v, o))| format!("{}={v} ({o})", &k["method.".len()..]))
            .collect();
        let _ = writeln!(s, "  method        {}", list.join(", "));
    }
}

/// Writes the shards section: a table of each shard's prompts, slot, noise start and key tag.
fn shards(s: &mut String, plan: &Plan) {
    let _ = match plan.selection {
        Some(range) => writeln!(
            s,
            "\nshards ({} of {}, contiguous)",
            range.label(),
            plan.shards.len()
        ),
        None => writeln!(s, "\nshards ({}, contiguous)", plan.shards.len()),
    };
    let _ = writeln!(
        s,
        "  {:>5}  {:<12} {:>6}  {:<5}  {:<12}  cache key tag",
        "shard", "prompts", "count", "slot", "noise from"
    );
    for sh in plan.selected_shards() {
        let _ = writeln!(
            s,
            "  {:>5}  {:<12} {:>6}  {:<5}  {:<12}  {}",
            sh.index,
            indices(&sh.prompts),
            sh.prompts.len(),
            plan.slots[sh.slot].device,
            sh.noise_from.map_or("-".into(), |i| format!("prompt {i}")),
            sh.cache_key_tag
        );
    }
}

/// Writes the processes section: each process in order with its slot, role, prompts and cache,
/// and the marker that skips it where there is one.
fn processes(s: &mut String, plan: &Plan) {
    let _ = writeln!(
        s,
        "\nprocesses ({}; one at a time on each slot{})",
        plan.processes.iter().filter(|pr| plan.selects(pr)).count(),
        if plan.slots.len() > 1 {
            ", slots in parallel"
        } else {
            ""
        }
    );
    for pr in plan.processes.iter().filter(|pr| plan.selects(pr)) {
        let role = match pr.role {
            Role::Warmup { repeat } => format!("warmup {repeat}"),
            Role::Measurement => "measurement".into(),
            Role::Shard { shard } => format!("shard {shard}"),
        };
        let _ = writeln!(
            s,
            "  {:>3}  slot {:<4} {:<12} prompts {}",
            pr.index,
            plan.slots[pr.slot].device,
            role,
            indices(&pr.prompts)
        );
        let _ = writeln!(
            s,
            "       cache {} [{}]",
            p(&pr.cache_dir),
            pr.cache_key_tag
        );
        if let Some(marker) = &pr.skip_if_marker {
            let _ = writeln!(s, "       skipped when {} exists", p(marker));
        }
    }
}

/// Writes the closing notes: where a probe's debug videos go, the label shared caches give the
/// results, and the plan's warnings.
fn notes(s: &mut String, plan: &Plan, r: &Resolved) {
    let m = &r.manifest;
    if m.kind == Kind::Probe && m.outputs.save_videos {
        let _ = writeln!(
            s,
            "\ndebug videos go to ${{TMPDIR:-/tmp}}/unstep_wrapper_generation_outputs/{}/indexed_videos and are deleted after each process",
            plan.run
        );
    }
    if m.shares_state() {
        let _ = writeln!(
            s,
            "\nshared caches: results are labelled warm-cache, never fresh"
        );
    } else if m.cache.mode == CacheMode::Shared {
        let _ = writeln!(
            s,
            "\ncache.mode = \"shared\" does not apply to a probe: its state is its own \
             (cache.run_state_root), and its results are labelled fresh"
        );
    }
    if m.cache.clear_global {
        let caches: Vec<String> = r.paths.global_caches.iter().map(|c| p(c)).collect();
        let caches = match caches.len() {
            0 => "cache: none here (HOME and CUDA_CACHE_PATH are unset)".to_string(),
            1 => format!("cache {}", caches[0]),
            _ => format!("caches {}", caches.join(" and ")),
        };
        let _ = writeln!(
            s,
            "\nglobal caches (cache.clear_global): apply first removes CUDA's JIT {caches}; other \
             jobs of this user use them too, so opt in only when no other jobs use those caches \
             (this run's processes never read them: each has its own)"
        );
    }
    if !plan.warnings.is_empty() {
        let _ = writeln!(s, "\nwarnings");
        for w in &plan.warnings {
            let _ = writeln!(s, "  - {w}");
        }
    }
}

/// Renders every setting with its value and the layer that set it.
pub fn explain(r: &Resolved) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "settings of run `{}` (layers: default < manifest < {}environment < command line)",
        r.name,
        if r.sweep.is_some() { "sweep < " } else { "" }
    );
    let width = r.settings.keys().map(String::len).max().unwrap_or(0);
    let _ = writeln!(
        s,
        "  {:width$}  {:<28}  manifest name or file stem{}",
        "name",
        format!("\"{}\"", r.name),
        if r.sweep.is_some() {
            ", and the sweep point's values"
        } else {
            ""
        }
    );
    for (key, setting) in &r.settings {
        let mut origin = match &setting.origin {
            Origin::Default => "default".to_string(),
            o => format!("{} ({})", r.layer_of(key), o),
        };
        for lower in setting.replaced.iter().rev() {
            origin.push_str(&format!(", over {lower}"));
        }
        let _ = writeln!(
            s,
            "  {key:width$}  {:<28}  {origin}",
            setting.value.to_string()
        );
    }
    s
}

//! Expanding a resolved manifest into a plan: the prompts selected, the worker slots (GPUs), the
//! shards and the slots they run on, the processes in order with their cache directories, key
//! tags and log files. Pure: reads nothing, writes nothing.

use std::path::PathBuf;

use serde::Serialize;

use crate::manifest::{CacheMode, CacheScope, IndexList, Kind, ProviderKind, Resolved};

/// A worker slot: one GPU, or with the CPU provider one stand-in worker.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Slot {
    /// Position in the visible list.
    pub index: usize,
    /// The device: the CUDA device id as the driver numbers it, or the CPU slot number.
    pub device: String,
    /// Name used in cache folders and key tags: `gpu0`, or `cpu0` for a CPU slot.
    pub label: String,
}

/// A contiguous run of the selected prompts, generated in one process.
#[derive(Debug, Clone, Serialize)]
pub struct Shard {
    pub index: usize,
    /// Global prompt indices, in order.
    pub prompts: Vec<u32>,
    pub slot: usize,
    /// The shard's own cache key tag (also when its cache directory is shared with others).
    pub cache_key_tag: String,
    /// Where the shard enters the `sequential_global` noise stream: its first prompt.
    pub noise_from: Option<u32>,
}

/// What a process does.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Role {
    /// A separate warmup process; its timings are recorded but never summarised.
    Warmup { repeat: u32 },
    /// A probe's measured process.
    Measurement,
    /// A generation process for one shard.
    Shard { shard: usize },
}

/// One worker process, in the order it runs on its slot.
#[derive(Debug, Clone, Serialize)]
pub struct Process {
    pub index: usize,
    #[serde(flatten)]
    pub role: Role,
    pub slot: usize,
    pub prompts: Vec<u32>,
    /// Compiler caches of this process (ORT optimised models, TensorRT caches, CUDA JIT cache).
    pub cache_dir: PathBuf,
    pub cache_key_tag: String,
    /// Shared mode: a warmup is skipped when this marker exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip_if_marker: Option<PathBuf>,
    pub log: PathBuf,
}

impl Process {
    pub fn is_warmup(&self) -> bool {
        matches!(self.role, Role::Warmup { .. })
    }
}

/// Where timing starts and stops.
#[derive(Debug, Clone, Serialize)]
pub struct TimedRegion {
    pub starts: &'static str,
    pub ends: &'static str,
}

/// The whole plan of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub run: String,
    pub kind: Kind,
    pub manifests: Vec<PathBuf>,
    pub run_dir: PathBuf,
    pub work_root: PathBuf,
    pub bundle: PathBuf,
    pub prompts_file: PathBuf,
    /// Prompts in the prompt file (or `expect_count` when the file is missing).
    pub prompt_count: Option<u32>,
    pub provider: ProviderKind,
    pub slots: Vec<Slot>,
    /// Why the run has these GPUs (`CUDA_VISIBLE_DEVICES`, every GPU the driver lists, or GPU
    /// 0); absent on the CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus_from: Option<String>,
    pub seed: u64,
    pub cache_mode: CacheMode,
    pub cache_scope: CacheScope,
    /// `warm-cache` for a run that keeps its state in the shared folder
    /// ([`crate::manifest::Manifest::shares_state`]), else `fresh`.
    pub cache_label: &'static str,
    pub timed_region: TimedRegion,
    pub shards: Vec<Shard>,
    pub processes: Vec<Process>,
    pub warnings: Vec<String>,
    /// The shards an apply runs (`--shard`); none: all of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selection: Option<super::shard_range::ShardRange>,
}

/// The problems that stop a plan even though every setting is valid on its own.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("shards.gpu_map names slot {slot}, but only {visible} are visible")]
    SlotOutOfRange { slot: u32, visible: usize },
}

/// Splits `n` items into `k` contiguous parts whose sizes differ by at most one, larger first:
/// 946 over 8 gives 119, 119, 118, 118, 118, 118, 118, 118.
pub fn shard_sizes(n: usize, k: usize) -> Vec<usize> {
    (0..k).map(|i| n / k + usize::from(i < n % k)).collect()
}

/// The GPUs a run may use: `CUDA_VISIBLE_DEVICES` (`runtime.visible_devices`) when it lists
/// some; else, for a generation run by local processes, every GPU the driver lists
/// (`Resolved::driver_gpus`, read by the command before planning); else GPU 0.
pub fn visible_devices(r: &Resolved) -> Vec<String> {
    gpu_choice(r).0
}

/// [`visible_devices`] and why, in words for the plan.
fn gpu_choice(r: &Resolved) -> (Vec<String>, String) {
    let devices: Vec<String> = match &r.manifest.runtime.visible_devices {
        Some(list) => list
            .split(',')
            .map(|d| d.trim().to_string())
            .filter(|d| !d.is_empty())
            .collect(),
        None => Vec::new(),
    };
    if !devices.is_empty() {
        let origin = r.settings.get("runtime.visible_devices").map_or_else(
            || "runtime.visible_devices".into(),
            |s| s.origin.to_string(),
        );
        return (devices, format!("as {origin} lists them"));
    }
    let generation = r.kind() == Kind::Generation;
    match &r.driver_gpus {
        Some(all) if generation && !all.is_empty() => (
            all.clone(),
            format!(
                "every GPU the driver lists ({}), as CUDA_VISIBLE_DEVICES is unset",
                all.len()
            ),
        ),
        _ if generation => (
            vec!["0".into()],
            "GPU 0: CUDA_VISIBLE_DEVICES is unset and the driver listed no GPUs here".into(),
        ),
        _ => (
            vec!["0".into()],
            "a probe measures on the first GPU: GPU 0, as CUDA_VISIBLE_DEVICES is unset".into(),
        ),
    }
}

/// The visible worker slots: `CUDA_VISIBLE_DEVICES` (GPU 0 when unset) or CPU slots.
fn slots(r: &Resolved) -> Vec<Slot> {
    let rt = &r.manifest.runtime;
    if rt.provider == ProviderKind::Cpu {
        return (0..rt.cpu_slots.0 as usize)
            .map(|i| Slot {
                index: i,
                device: format!("cpu{i}"),
                label: format!("cpu{i}"),
            })
            .collect();
    }
    let devices = visible_devices(r);
    // A probe uses the first visible GPU only.
    let take = if r.kind() == Kind::Probe {
        1
    } else {
        devices.len()
    };
    devices
        .into_iter()
        .take(take)
        .enumerate()
        .map(|(i, d)| Slot {
            index: i,
            label: format!("gpu{d}"),
            device: d,
        })
        .collect()
}

/// Builds the plan of a resolved manifest.
pub fn build(r: &Resolved) -> Result<Plan, PlanError> {
    let m = &r.manifest;
    let mut warnings = r.warnings.clone();
    let slots = slots(r);
    let gpus_from = (m.runtime.provider != ProviderKind::Cpu).then(|| gpu_choice(r).1);
    let prompt_count = prompt_count(r, &mut warnings);
    let selected = selected_prompts(&m.prompts.indices, prompt_count);
    let mut list = ProcessList::new(r.paths.run_dir.join("logs"));
    let shards = match m.kind {
        Kind::Probe => probe(r, &slots, &selected, prompt_count, &mut list),
        Kind::Generation => {
            let shards = generation_shards(r, &slots, &selected)?;
            generation_processes(r, &slots, &shards, prompt_count, &mut list);
            let empty: Vec<usize> = shards
                .iter()
                .filter(|s| s.prompts.is_empty())
                .map(|s| s.index)
                .collect();
            if !empty.is_empty() {
                warnings.push(format!(
                    "{} prompt(s) over {} shards leave shard(s) {} without prompts: they are \
                     skipped (no process), and the others keep their contiguous prompts and noise",
                    selected.len(),
                    shards.len(),
                    empty
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            shards
        }
    };
    Ok(Plan {
        run: r.name.as_str().to_string(),
        kind: m.kind,
        manifests: r.files.iter().map(|f| f.path.clone()).collect(),
        run_dir: r.paths.run_dir.clone(),
        work_root: r.paths.work_root.clone(),
        bundle: r.paths.bundle.clone(),
        prompts_file: r.paths.prompts_file.clone(),
        prompt_count,
        provider: m.runtime.provider,
        slots,
        gpus_from,
        seed: m.noise.seed,
        cache_mode: m.cache.mode,
        cache_scope: m.cache.scope,
        cache_label: if m.shares_state() {
            "warm-cache"
        } else {
            "fresh"
        },
        timed_region: timed_region(m.timing.exclude_final_output_layout),
        shards,
        processes: list.processes,
        warnings,
        selection: None,
    })
}

/// The number of prompts the plan is made for: the prompt file's, or `prompts.expect_count`
/// (with a warning) while the file does not exist yet.
fn prompt_count(r: &Resolved, warnings: &mut Vec<String>) -> Option<u32> {
    match &r.prompts {
        Some(p) => Some(p.len() as u32),
        None => {
            let expected = r.manifest.prompts.expect_count;
            if let Some(n) = expected {
                warnings.push(format!(
                    "planned for {n} prompts (prompts.expect_count) until the prompt file exists"
                ));
            }
            expected
        }
    }
}

/// The global indices of the prompts the run generates; none while `all` is asked for and the
/// prompt count is unknown.
fn selected_prompts(indices: &IndexList, prompt_count: Option<u32>) -> Vec<u32> {
    match (indices, prompt_count) {
        (IndexList::List(v), _) => v.clone(),
        (IndexList::All, Some(n)) => (0..n).collect(),
        (IndexList::All, None) => Vec::new(),
    }
}

/// The cache key tag of a slot (`run/gpu0`), or of one shard on it (`run/gpu0/shard3`).
fn key_tag(run: &str, slot: &Slot, shard: Option<usize>) -> String {
    match shard {
        Some(s) => format!("{run}/{}/shard{s}", slot.label),
        None => format!("{run}/{}", slot.label),
    }
}

/// Where timing starts and stops, given `timing.exclude_final_output_layout`.
fn timed_region(exclude_final_output_layout: bool) -> TimedRegion {
    TimedRegion {
        starts: "text context ready on the device",
        ends: if exclude_final_output_layout {
            "VAE output on the device (final clamp and layout excluded)"
        } else {
            "uint8 frames on the device, synchronised"
        },
    }
}

/// The processes of a plan in the order they are added; each is numbered by its position and
/// logs to a file of the run's `logs` folder named after that number and its role.
struct ProcessList {
    logs: PathBuf,
    processes: Vec<Process>,
}

impl ProcessList {
    fn new(logs: PathBuf) -> ProcessList {
        ProcessList {
            logs,
            processes: Vec::new(),
        }
    }

    /// Appends a process. With `marker`, the process is skipped when `warmup.done` exists in its
    /// cache directory.
    fn push(
        &mut self,
        role: Role,
        slot: usize,
        prompts: Vec<u32>,
        cache_dir: PathBuf,
        cache_key_tag: String,
        marker: bool,
    ) {
        let index = self.processes.len();
        let file = match role {
            Role::Warmup { repeat } => format!("{index:02}-warmup{repeat}-slot{slot}.log"),
            Role::Measurement => format!("{index:02}-measurement.log"),
            Role::Shard { shard } => format!("{index:02}-shard{shard}.log"),
        };
        self.processes.push(Process {
            index,
            role,
            slot,
            prompts,
            skip_if_marker: marker.then(|| cache_dir.join("warmup.done")),
            cache_dir,
            cache_key_tag,
            log: self.logs.join(file),
        });
    }
}

/// A probe's one shard and its processes: `warmup.repeats` warmups, then the measurement, all on
/// the first slot with that slot's folder of the run's state as cache.
fn probe(
    r: &Resolved,
    slots: &[Slot],
    selected: &[u32],
    prompt_count: Option<u32>,
    list: &mut ProcessList,
) -> Vec<Shard> {
    let m = &r.manifest;
    let tag = key_tag(r.name.as_str(), &slots[0], Some(0));
    let state = r.paths.run_state_root.join(&slots[0].label);
    // Without `warmup.indices`, a probe warms up on the prompts it measures.
    let warm = m
        .warmup
        .indices
        .as_ref()
        .map(|w| match (w, prompt_count) {
            (IndexList::All, Some(n)) => (0..n).collect(),
            (IndexList::All, None) => Vec::new(),
            (IndexList::List(v), _) => v.clone(),
        })
        .unwrap_or_else(|| selected.to_vec());
    for repeat in 1..=m.warmup.repeats.0 as u32 {
        list.push(
            Role::Warmup { repeat },
            0,
            warm.clone(),
            state.clone(),
            tag.clone(),
            false,
        );
    }
    list.push(
        Role::Measurement,
        0,
        selected.to_vec(),
        state,
        tag.clone(),
        false,
    );
    vec![Shard {
        index: 0,
        prompts: selected.to_vec(),
        slot: 0,
        cache_key_tag: tag,
        noise_from: selected.first().copied(),
    }]
}

/// A generation's shards: `shards.count` contiguous runs of the selected prompts, placed on the
/// slots of `shards.gpu_map` or round-robin.
fn generation_shards(
    r: &Resolved,
    slots: &[Slot],
    selected: &[u32],
) -> Result<Vec<Shard>, PlanError> {
    let m = &r.manifest;
    let k = m.shards.count.0 as usize;
    let mut shards = Vec::with_capacity(k);
    let mut start = 0;
    for (i, size) in shard_sizes(selected.len(), k).into_iter().enumerate() {
        let slot = match &m.shards.gpu_map {
            Some(map) => {
                let s = map[i];
                if s as usize >= slots.len() {
                    return Err(PlanError::SlotOutOfRange {
                        slot: s,
                        visible: slots.len(),
                    });
                }
                s as usize
            }
            None => i % slots.len(),
        };
        let prompts = selected[start..start + size].to_vec();
        start += size;
        shards.push(Shard {
            index: i,
            noise_from: prompts.first().copied(),
            prompts,
            slot,
            cache_key_tag: key_tag(r.name.as_str(), &slots[slot], Some(i)),
        });
    }
    Ok(shards)
}

/// A generation's processes, slot by slot. Isolated caches of scope `run_gpu` give each slot one
/// cache directory and one warmup before its shards; every other combination gives each shard its
/// own cache directory and warmup, and shared caches skip a warmup whose marker exists.
fn generation_processes(
    r: &Resolved,
    slots: &[Slot],
    shards: &[Shard],
    prompt_count: Option<u32>,
    list: &mut ProcessList,
) {
    let m = &r.manifest;
    let shared = m.cache.mode == CacheMode::Shared;
    let state_root = if shared {
        r.paths.shared_state_dir.clone()
    } else {
        r.paths.run_dir.join("runtime_state")
    };
    // Without `warmup.indices`, a warmup runs the first prompt of the shard it precedes.
    let warm = |shard: &Shard| match &m.warmup.indices {
        Some(w) => w.resolve(prompt_count.unwrap_or(0)),
        None => shard.prompts.first().copied().into_iter().collect(),
    };
    for (slot, slot_info) in slots.iter().enumerate() {
        // A shard left without prompts (fewer prompts than shards) has no process.
        let mine: Vec<&Shard> = shards
            .iter()
            .filter(|s| s.slot == slot && !s.prompts.is_empty())
            .collect();
        let Some(first) = mine.first() else { continue };
        match (m.cache.scope, shared) {
            (CacheScope::RunGpu, false) => {
                let dir = state_root.join(&slot_info.label);
                list.push(
                    Role::Warmup { repeat: 1 },
                    slot,
                    warm(first),
                    dir.clone(),
                    key_tag(r.name.as_str(), slot_info, None),
                    false,
                );
                for s in &mine {
                    list.push(
                        Role::Shard { shard: s.index },
                        slot,
                        s.prompts.clone(),
                        dir.clone(),
                        s.cache_key_tag.clone(),
                        false,
                    );
                }
            }
            _ => {
                for s in &mine {
                    let dir = state_root.join(format!("shard{}", s.index));
                    list.push(
                        Role::Warmup { repeat: 1 },
                        slot,
                        warm(s),
                        dir.clone(),
                        s.cache_key_tag.clone(),
                        shared,
                    );
                    list.push(
                        Role::Shard { shard: s.index },
                        slot,
                        s.prompts.clone(),
                        dir,
                        s.cache_key_tag.clone(),
                        false,
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_sizes_are_contiguous_and_balanced() {
        assert_eq!(
            shard_sizes(946, 8),
            vec![119, 119, 118, 118, 118, 118, 118, 118]
        );
        assert_eq!(shard_sizes(16, 2), vec![8, 8]);
        assert_eq!(shard_sizes(3, 3), vec![1, 1, 1]);
        for (n, k) in [(946, 8), (10, 3), (1, 1), (100, 7)] {
            let sizes = shard_sizes(n, k);
            assert_eq!(sizes.iter().sum::<usize>(), n);
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        }
    }
}

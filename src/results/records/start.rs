//! `run.json` as an apply starts it ([`RunRecord::new`]): drawn from the resolved manifest (each
//! setting with where it was set) and the plan (processes, slots, places), apart from the
//! formats themselves, which the rest of `records.rs` defines.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::*;
use crate::manifest::Resolved;
use crate::plan::Plan;

fn setting_record(value: &toml::Value, origin: &crate::manifest::Origin) -> SettingRecord {
    SettingRecord {
        value: serde_json::to_value(value).unwrap_or(serde_json::Value::Null),
        layer: origin.layer_name().to_string(),
        origin: origin.to_string(),
    }
}

/// Every resolved setting's record, with the layer that set it.
fn setting_records(resolved: &Resolved) -> BTreeMap<String, SettingRecord> {
    resolved
        .settings
        .iter()
        .map(|(k, s)| {
            let mut record = setting_record(&s.value, &s.origin);
            record.layer = resolved.layer_of(k).to_string();
            (k.clone(), record)
        })
        .collect()
}

/// Where the run of `plan` keeps its staging and runtime state.
fn places(resolved: &Resolved, plan: &Plan) -> PlacesRecord {
    let shared = resolved.manifest.shares_state();
    let mut runtime_state: Vec<PathBuf> = Vec::new();
    if !shared {
        for p in &plan.processes {
            if !runtime_state.contains(&p.cache_dir) {
                runtime_state.push(p.cache_dir.clone());
            }
        }
    }
    PlacesRecord {
        staging: plan.work_root.join(&plan.run),
        runtime_state,
        shared_state: shared.then(|| resolved.paths.shared_state_dir.clone()),
    }
}

/// The record of the sweep point `resolved` is, if any.
fn sweep_record(resolved: &Resolved) -> Option<SweepRecord> {
    let p = resolved.sweep.as_ref()?;
    Some(SweepRecord {
        base: p.base.clone(),
        point: p.index + 1,
        points: p.count,
        values: p
            .values
            .iter()
            .map(|(k, e)| {
                let value = serde_json::to_value(&e.value).unwrap_or(serde_json::Value::Null);
                (k.clone(), value)
            })
            .collect(),
    })
}

impl RunRecord {
    /// A `running` record of the plan, started at `started`. Device, library versions, the
    /// registered execution provider, the resolved attention backend and git state are left
    /// empty for the orchestrator, which learns them from the workers and the checkout.
    pub fn new(resolved: &Resolved, plan: &Plan, started: SystemTime) -> RunRecord {
        let m = &resolved.manifest;
        let settings = setting_records(resolved);
        let slot_label = |slot: usize| {
            plan.slots
                .get(slot)
                .map_or_else(|| slot.to_string(), |s| s.label.clone())
        };
        let processes = plan
            .processes
            .iter()
            .map(|p| ProcessRecord {
                index: p.index,
                role: p.role.into(),
                repeat: match p.role {
                    Role::Warmup { repeat } => Some(repeat),
                    _ => None,
                },
                shard: match p.role {
                    Role::Shard { shard } => Some(shard),
                    _ => None,
                },
                slot: slot_label(p.slot),
                cache_key_tag: Some(p.cache_key_tag.clone()),
                prompts: p.prompts.len(),
                first_prompt: p.prompts.first().copied(),
                last_prompt: p.prompts.last().copied(),
                skipped: None,
                indices: match (p.prompts.first(), p.prompts.last()) {
                    (Some(a), Some(b)) if (b - a) as usize + 1 != p.prompts.len() => {
                        p.prompts.clone()
                    }
                    _ => Vec::new(),
                },
            })
            .collect();
        RunRecord {
            runner_version: env!("CARGO_PKG_VERSION").to_string(),
            run: plan.run.clone(),
            kind: plan.kind,
            git: None,
            manifests: resolved
                .files
                .iter()
                .map(|f| ManifestRecord {
                    path: f.path.clone(),
                    sha256: f.sha256.clone(),
                })
                .collect(),
            method_overrides: resolved
                .method_overrides()
                .keys()
                .filter_map(|k| Some((k.clone(), settings.get(k)?.clone())))
                .collect(),
            settings,
            provider: m.runtime.provider,
            execution_provider: None,
            attention_backend: AttentionRecord {
                requested: m.method.attention_backend,
                resolved: None,
            },
            dit_kernels: None,
            vae_kernels: None,
            bundle: None,
            tokenizer: None,
            weights: None,
            precision: m.method.precision,
            attention_precision: m.method.attention_precision,
            device: DeviceRecord::default(),
            versions: LibraryVersions::default(),
            warmup: WarmupRecord {
                repeats: m.warmup.repeats.0,
                indices: m
                    .warmup
                    .indices
                    .as_ref()
                    .map(|w| w.resolve(plan.prompt_count.unwrap_or(0))),
            },
            cache: CacheRecord {
                mode: m.cache.mode,
                scope: m.cache.scope,
                label: CacheLabel::of(m),
                clear_global: m.cache.clear_global,
            },
            timed_region_ends: TimedRegionEnd::of(
                resolved.manifest.timing.exclude_final_output_layout,
            ),
            host: crate::os::hostname(),
            started_at: super::super::time::rfc3339(started),
            resumed_at: Vec::new(),
            ended_at: None,
            status: RunStatus::Running,
            failure: None,
            config_hash: super::super::config_hash(resolved),
            diagnostics: Vec::new(),
            staging: None,
            wall: None,
            processes,
            sweep: sweep_record(resolved),
            places: Some(places(resolved, plan)),
            prompts_file: (m.kind == Kind::Generation).then(|| {
                std::path::absolute(&resolved.paths.prompts_file)
                    .unwrap_or_else(|_| resolved.paths.prompts_file.clone())
            }),
            slurm: None,
            slurm_shard_jobs: Vec::new(),
            evaluation: super::super::scores::EvaluationRecord::of(resolved),
        }
    }
}

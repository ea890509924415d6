//! The jobs of a run: one `JobSpec` per process of the plan, from the run's configuration, its
//! staged snapshot and what earlier applies completed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use super::config::RunConfig;
use super::job::{BenchOptions, JobLabel, JobSpec, PromptSpec};
use super::staging::Stage;
use crate::manifest::{Kind, Resolved};
use crate::plan::{Plan, Process, Role};
use crate::results::arrays::ArrayKind;
use crate::results::names::VideoNames;
use crate::results::records::ProcessRole;

/// Builds each process's job from the run's configuration.
pub(super) struct JobFactory<'a> {
    pub(super) r: &'a Resolved,
    pub(super) plan: &'a Plan,
    pub(super) config: &'a RunConfig,
    pub(super) stage: &'a Stage,
    pub(super) videos: &'a Option<PathBuf>,
    pub(super) config_hash: &'a str,
    pub(super) done: &'a BTreeSet<u32>,
    /// The name of each prompt's video.
    pub(super) names: &'a VideoNames,
}

impl JobFactory<'_> {
    pub(super) fn jobs(&self) -> Vec<Option<JobSpec>> {
        // The audit hashed every staged file; workers take the bundle's hashes from it.
        let bundle_sha256: BTreeMap<String, String> = self
            .stage
            .audit
            .files
            .iter()
            .filter_map(|(path, hash)| {
                Some((path.strip_prefix("bundle/")?.to_string(), hash.clone()))
            })
            .collect();
        self.plan
            .processes
            .iter()
            .map(|p| self.job(p, &bundle_sha256))
            .collect()
    }

    /// Where a process of `role` keeps its prompts' arrays of `kind`, when the manifest asks for
    /// them: the run folder's `latents/` or `frames/`; never for a warmup.
    fn kept(&self, role: ProcessRole, kind: ArrayKind) -> Option<PathBuf> {
        (self.r.manifest.outputs.keeps(kind) && role != ProcessRole::Warmup)
            .then(|| self.plan.run_dir.join(kind.dir()))
    }

    /// The texts of the prompts that the processes after warmup `p` with its cache folder will
    /// generate (a generation's shards on its slot, a probe's measurement) and `p` does not,
    /// each once: `p` encodes and keeps their contexts, which those processes then read. Text
    /// encoding is outside the timed region, so this moves no timed work.
    fn later_texts(&self, p: &Process, own: &[PromptSpec]) -> Vec<String> {
        let prompts = self.r.prompts.as_deref().unwrap_or_default();
        let mut texts: Vec<String> = Vec::new();
        for q in &self.plan.processes[p.index + 1..] {
            if q.is_warmup() || q.cache_dir != p.cache_dir || !self.plan.selects(q) {
                continue;
            }
            let shard = matches!(q.role, Role::Shard { .. });
            for &i in &q.prompts {
                if shard && self.done.contains(&i) {
                    continue;
                }
                let Some(text) = prompts.get(i as usize) else {
                    continue;
                };
                if !own.iter().any(|o| &o.text == text) && !texts.contains(text) {
                    texts.push(text.clone());
                }
            }
        }
        texts
    }

    /// The job of process `p`, or `None` when it has nothing to do: a resumed shard whose
    /// prompts are complete, its slot's warmup when every shard of the slot is, or a process
    /// whose skip marker exists.
    fn job(&self, p: &Process, bundle_sha256: &BTreeMap<String, String>) -> Option<JobSpec> {
        // `--shard`: the other shards, and the warmups only they use, are other applies'.
        if !self.plan.selects(p) {
            return None;
        }
        let prompts = self.r.prompts.as_deref().unwrap_or_default();
        let todo: Vec<PromptSpec> = p
            .prompts
            .iter()
            .filter(|i| !matches!(p.role, Role::Shard { .. }) || !self.done.contains(i))
            .map(|&i| PromptSpec {
                index: i,
                text: prompts.get(i as usize).cloned().unwrap_or_default(),
                video: self.names.name(i).map(str::to_string),
            })
            .collect();
        let (role, shard) = match p.role {
            Role::Warmup { .. } => (ProcessRole::Warmup, None),
            Role::Measurement => (ProcessRole::Measurement, Some(0)),
            Role::Shard { shard } => (ProcessRole::Shard, Some(shard)),
        };
        if role == ProcessRole::Shard && todo.is_empty() {
            return None;
        }
        if role == ProcessRole::Warmup && self.r.manifest.kind == Kind::Generation {
            let slot_busy = self.plan.processes.iter().any(|q| {
                q.slot == p.slot
                    && matches!(q.role, Role::Shard { .. })
                    && self.plan.selects(q)
                    && q.prompts.iter().any(|i| !self.done.contains(i))
            });
            if !slot_busy {
                return None;
            }
        }
        if p.skip_if_marker.as_ref().is_some_and(|m| m.exists()) {
            return None;
        }
        let run_dir = &self.plan.run_dir;
        let contexts_for_later = if role == ProcessRole::Warmup {
            self.later_texts(p, &todo)
        } else {
            Vec::new()
        };
        Some(JobSpec {
            label: JobLabel {
                run: self.plan.run.clone(),
                process: p.index,
                role,
                shard,
                slot: self.plan.slots[p.slot].label.clone(),
            },
            bundle: self.stage.bundle.clone(),
            bundle_sha256: bundle_sha256.clone(),
            bundle_stamps: self.stage.bundle_stamps.clone(),
            unpack_dir: p.cache_dir.join("bundle_unpacked"),
            prompts: todo,
            contexts_for_later,
            engine: self.config.engine_for(&p.cache_dir),
            method: self.config.method.clone(),
            export: self.config.export.clone(),
            exclude_final_output_layout: self.config.exclude_final_output_layout,
            video_naming: self.config.video_naming,
            timings: Some(
                run_dir
                    .join("timings")
                    .join(format!("{:03}.jsonl", p.index)),
            ),
            run_dir: run_dir.clone(),
            // Warmups never keep videos, latents or frames.
            videos: if role == ProcessRole::Warmup {
                None
            } else {
                self.videos.clone()
            },
            latents: self.kept(role, ArrayKind::Latents),
            frames: self.kept(role, ArrayKind::Frames),
            config_hash: self.config_hash.to_string(),
            events: true,
            bench: BenchOptions::default(),
        })
    }
}

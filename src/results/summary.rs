//! `summary.json` ([`Summary`]): the statistics of a run's measured prompts, and which records
//! a run measures ([`measured`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::records::{CacheLabel, ProcessRole, TimedRegionEnd, TimingRecord};
use super::stats::Statistics;
use crate::manifest::Kind;

/// `summary.json`: the statistics of the measured prompts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub kind: Kind,
    /// Measured prompts the statistics cover.
    pub count: usize,
    /// Their global indices, in measurement order.
    pub prompts: Vec<u32>,
    pub cache_label: CacheLabel,
    /// `None` only when nothing was measured.
    pub timed_region_ends: Option<TimedRegionEnd>,
    pub timed_total: Statistics,
    pub dit: Statistics,
    pub vae: Statistics,
}

/// The records a summary covers, in measurement order. A probe: the measurement process's
/// records as they were written. A generation: every shard process's records in shard order
/// and, within a shard, prompt order; a prompt recorded twice (a shard re-run after a crash
/// between its timing and its video) counts once, with its latest record.
pub fn measured(records: &[TimingRecord], kind: Kind) -> Vec<&TimingRecord> {
    match kind {
        Kind::Probe => records
            .iter()
            .filter(|r| r.role == ProcessRole::Measurement)
            .collect(),
        Kind::Generation => {
            // One record per prompt, the last one read: a prompt made again (in any shard
            // layout, after a resume with another shard count too) counts once.
            let mut latest: BTreeMap<u32, &TimingRecord> = BTreeMap::new();
            for r in records.iter().filter(|r| r.role == ProcessRole::Shard) {
                latest.insert(r.prompt, r);
            }
            let mut kept: Vec<&TimingRecord> = latest.into_values().collect();
            kept.sort_by_key(|r| (r.shard.unwrap_or(0), r.prompt));
            kept
        }
    }
}

impl Summary {
    /// The summary of a run's records; `cache_label` comes from the run (records do not
    /// carry it).
    pub fn from_records(records: &[TimingRecord], kind: Kind, cache_label: CacheLabel) -> Summary {
        let measured = measured(records, kind);
        let series = |f: fn(&TimingRecord) -> f64| {
            Statistics::of(&measured.iter().map(|r| f(r)).collect::<Vec<_>>())
        };
        Summary {
            kind,
            count: measured.len(),
            prompts: measured.iter().map(|r| r.prompt).collect(),
            cache_label,
            timed_region_ends: measured.first().map(|r| r.timed_region_ends),
            timed_total: series(|r| r.timed_total_s),
            dit: series(|r| r.dit_s),
            vae: series(|r| r.vae_s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::files::tests::record;

    /// A record of `role` (and `shard`) for `prompt`: DiT half and VAE a quarter of `total`.
    fn rec(role: ProcessRole, shard: Option<usize>, prompt: u32, total: f64) -> TimingRecord {
        TimingRecord {
            role,
            shard,
            dit_s: total / 2.0,
            vae_s: total / 4.0,
            timed_region_ends: TimedRegionEnd::VaeOutput,
            ..record(prompt, total)
        }
    }

    #[test]
    fn probe_summary_uses_the_measurement_process_in_order() {
        let records = vec![
            rec(ProcessRole::Warmup, None, 0, 100.0),
            rec(ProcessRole::Measurement, None, 3, 8.0),
            rec(ProcessRole::Measurement, None, 1, 4.0),
            rec(ProcessRole::Measurement, None, 2, 6.0),
        ];
        let s = Summary::from_records(&records, Kind::Probe, CacheLabel::Fresh);
        assert_eq!(s.count, 3);
        assert_eq!(s.prompts, [3, 1, 2]);
        assert_eq!(s.timed_total.raw_mean, Some(6.0));
        assert_eq!(s.timed_total.warm_mean_excluding_first, Some(5.0));
        assert_eq!(s.timed_total.min_after_first, Some(4.0));
        assert_eq!(s.dit.raw_mean, Some(3.0));
        assert_eq!(s.vae.raw_mean, Some(1.5));
        assert_eq!(s.timed_region_ends, Some(TimedRegionEnd::VaeOutput));
    }

    #[test]
    fn generation_summary_orders_by_shard_and_counts_a_rerun_prompt_once() {
        let records = vec![
            rec(ProcessRole::Warmup, Some(1), 2, 100.0),
            rec(ProcessRole::Shard, Some(1), 2, 5.0),
            rec(ProcessRole::Shard, Some(0), 0, 9.0),
            rec(ProcessRole::Shard, Some(0), 1, 3.0),
            rec(ProcessRole::Shard, Some(1), 3, 7.0),
            // Prompt 2 again after a resume: the later record wins.
            rec(ProcessRole::Shard, Some(1), 2, 1.0),
        ];
        // Prompt 3 again under another shard layout (a resume with more shards) counts once.
        let mut relaid = records.clone();
        relaid.push(rec(ProcessRole::Shard, Some(3), 3, 7.0));
        let again = Summary::from_records(&relaid, Kind::Generation, CacheLabel::WarmCache);
        assert_eq!(again.prompts, [0, 1, 2, 3]);
        let s = Summary::from_records(&records, Kind::Generation, CacheLabel::WarmCache);
        assert_eq!(s.prompts, [0, 1, 2, 3]);
        assert_eq!(s.timed_total.raw_mean, Some(5.0));
        assert_eq!(s.timed_total.min_after_first, Some(1.0));
        assert_eq!(s.timed_total.steady_tail_mean, Some(11.0 / 3.0));
    }

    #[test]
    fn empty_summary_has_no_statistics() {
        let s = Summary::from_records(&[], Kind::Probe, CacheLabel::Fresh);
        assert_eq!(s.count, 0);
        let json = serde_json::to_value(&s).unwrap();
        assert!(json["timed_total"]["raw_mean"].is_null());
        assert!(json["timed_region_ends"].is_null());
        assert_eq!(serde_json::from_value::<Summary>(json).unwrap(), s);
    }
}

//! A subset of a generation's shards (`--shard N`, `--shard A-B`): the plan stays whole (its
//! shard layout, noise entry points, process numbers and record names are the full run's), and
//! the selection says which of its processes an apply runs: the selected shards and the warmups
//! that prepare their caches. A warmup's own files (its log, job spec and event file) are named
//! by the selection too, since the applies of other shards of its slot run the same warmup,
//! side by side or one after another, and each apply's are kept.

use super::build::{Plan, Process, Role, Shard};
use super::shard_range::ShardRange;
use crate::manifest::Kind;

/// Why a selection does not fit the plan.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    #[error("--shard {range}: the plan has {count} shard(s), numbered 0 to {last}")]
    OutOfRange {
        range: String,
        count: usize,
        last: usize,
    },
    #[error("--shard is for generations; a probe has one measurement")]
    Probe,
}

impl Plan {
    /// Restricts the plan's work to `range`; refuses shards the plan does not have.
    pub fn select_shards(&mut self, range: ShardRange) -> Result<(), SelectError> {
        if self.kind == Kind::Probe {
            return Err(SelectError::Probe);
        }
        let count = self.shards.len();
        if range.last >= count {
            return Err(SelectError::OutOfRange {
                range: range.label(),
                count,
                last: count.saturating_sub(1),
            });
        }
        self.selection = Some(range);
        let own: Vec<(usize, String)> = self
            .processes
            .iter()
            .filter_map(|p| Some((p.index, self.file_suffix(p)?)))
            .collect();
        for (index, suffix) in own {
            let p = &mut self.processes[index];
            let name = p.log.file_stem().unwrap_or_default().to_string_lossy();
            p.log = p.log.with_file_name(format!("{name}{suffix}.log"));
        }
        Ok(())
    }

    /// What the names of process `p`'s own files (its log, job spec and event file) add to the
    /// whole run's: `.shard-<range>` for a warmup of an apply of some shards (the applies of the
    /// other shards of its slot run the same warmup), nothing for the rest.
    pub fn file_suffix(&self, p: &Process) -> Option<String> {
        let range = self.selection?;
        matches!(p.role, Role::Warmup { .. }).then(|| format!(".shard-{}", range.label()))
    }

    /// Whether an apply of this plan runs process `p`: every process without a selection; with
    /// one, the selected shards and each warmup whose cache one of them uses.
    pub fn selects(&self, p: &Process) -> bool {
        let Some(range) = self.selection else {
            return true;
        };
        match p.role {
            Role::Shard { shard } => range.contains(shard),
            Role::Measurement => true,
            Role::Warmup { .. } => self.processes.iter().any(|q| {
                q.slot == p.slot
                    && q.cache_dir == p.cache_dir
                    && matches!(q.role, Role::Shard { shard } if range.contains(shard))
            }),
        }
    }

    /// The shards an apply of this plan generates.
    pub fn selected_shards(&self) -> impl Iterator<Item = &Shard> {
        self.shards
            .iter()
            .filter(|s| self.selection.is_none_or(|r| r.contains(s.index)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_range_reads_n_or_a_to_b_and_refuses_the_rest() {
        let r = |s: &str| s.parse::<ShardRange>();
        assert_eq!(r("3"), Ok(ShardRange { first: 3, last: 3 }));
        assert_eq!(r("0-2"), Ok(ShardRange { first: 0, last: 2 }));
        assert_eq!(r("0-2").unwrap().label(), "0-2");
        assert_eq!(r("3").unwrap().label(), "3");
        assert_eq!(
            r("2-0").unwrap_err().to_string(),
            "`2-0`: the range's first shard is after its last"
        );
        assert_eq!(
            r("x").unwrap_err().to_string(),
            "`x` is not a shard number or range (N or A-B)"
        );
        assert!(r("-1").is_err());
    }
}

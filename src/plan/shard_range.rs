//! A set of a generation's shards as `--shard` gives it (`N` or `A-B`): what `select.rs`
//! narrows a plan to, and what a plan and the run's record name.

use serde::{Deserialize, Serialize};

/// The shards one apply runs, as given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRange {
    pub first: usize,
    pub last: usize,
}

impl ShardRange {
    pub fn contains(&self, shard: usize) -> bool {
        (self.first..=self.last).contains(&shard)
    }

    /// The range as the command line writes it: `3` or `2-5`.
    pub fn label(&self) -> String {
        if self.first == self.last {
            self.first.to_string()
        } else {
            format!("{}-{}", self.first, self.last)
        }
    }
}

/// Why `--shard`'s value is not a shard range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardRangeError {
    #[error("`{0}` is not a shard number or range (N or A-B)")]
    NotARange(String),
    #[error("`{0}`: the range's first shard is after its last")]
    Reversed(String),
}

impl std::str::FromStr for ShardRange {
    type Err = ShardRangeError;

    /// `N` or `A-B` (A ≤ B), shard numbers as the plan numbers them.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .map_err(|_| ShardRangeError::NotARange(s.to_string()))
        };
        let (first, last) = match s.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(s)?, num(s)?),
        };
        if first > last {
            return Err(ShardRangeError::Reversed(s.to_string()));
        }
        Ok(ShardRange { first, last })
    }
}

//! Plans: a validated manifest expanded into runs, processes, shards and cache directories.

pub mod build;
pub mod render;
pub mod select;
pub mod shard_range;

pub use build::{
    Plan, PlanError, Process, Role, Shard, Slot, TimedRegion, build, shard_sizes, visible_devices,
};
pub use select::SelectError;
pub use shard_range::{ShardRange, ShardRangeError};

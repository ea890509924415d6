//! A generation's wall time and what its processes' starts cost in it: the last apply's wall
//! time from the run's record, and the ready time of each process that apply started, from its
//! timing records, summed per slot (a slot runs its processes one after another, so a slot's
//! starts add to its share of the wall time; slots run side by side).

use std::fmt::Write as _;
use std::time::SystemTime;

use serde::Serialize;

use crate::results::{ApplyWall, ProcessRole, RunRecord, TimingRecord};

/// One process's start: how long it took from its `main` to its sessions ready.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessReady {
    pub process: usize,
    pub role: ProcessRole,
    pub shard: Option<usize>,
    pub ready_s: f64,
}

/// The starts of one slot's processes in the last apply, in the order they ran.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SlotStarts {
    pub slot: String,
    pub processes: Vec<ProcessReady>,
    /// Their ready times together.
    pub ready_s: f64,
    /// `ready_s` over the apply's wall time.
    pub share: f64,
}

/// The last apply's wall time and its processes' starts in it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WallTime {
    /// When the apply started.
    pub started_at: String,
    pub wall_s: f64,
    /// Of it, the apply's staging snapshot, before any worker started.
    pub staging_s: Option<f64>,
    pub slots: Vec<SlotStarts>,
    /// Processes whose start was recorded without when it was (records of earlier runners),
    /// left out because the run was resumed and they may be an earlier apply's.
    pub undated: usize,
}

impl WallTime {
    /// From a run's record and timing records; `None` when the record has no wall time (an
    /// apply that ran no workers to their end, records of earlier runners). A process counts
    /// when its start is recorded at or after the last apply's start; one whose start has no
    /// date counts only while the run was never resumed.
    pub fn of(record: &RunRecord, timings: &[TimingRecord]) -> Option<WallTime> {
        let wall = record.wall.as_ref()?;
        let resumed = !record.resumed_at.is_empty();
        let staging_s = record.staging.as_ref().map(|s| s.seconds);
        Some(Self::of_apply(wall, resumed, staging_s, timings))
    }

    /// [`WallTime::of`] an apply's wall time, whether the run was resumed, and its staging.
    fn of_apply(
        wall: &ApplyWall,
        resumed: bool,
        staging_s: Option<f64>,
        timings: &[TimingRecord],
    ) -> WallTime {
        let since = parse(&wall.started_at);
        let mut slots: Vec<SlotStarts> = Vec::new();
        let mut undated = 0;
        let mut seen = Vec::new();
        for t in timings {
            let Some(start) = &t.process_start else {
                continue;
            };
            let this_apply = match (start.started_at.as_deref().and_then(parse), since) {
                (Some(at), Some(since)) => at >= since,
                _ if resumed => {
                    undated += 1;
                    false
                }
                _ => true,
            };
            // One start per process and apply; a process's earlier applies are left out above.
            if !this_apply || seen.contains(&t.process) {
                continue;
            }
            seen.push(t.process);
            let ready = ProcessReady {
                process: t.process,
                role: t.role,
                shard: t.shard,
                ready_s: start.ready_s,
            };
            match slots.iter_mut().find(|s| s.slot == t.slot) {
                Some(slot) => slot.processes.push(ready),
                None => slots.push(SlotStarts {
                    slot: t.slot.clone(),
                    processes: vec![ready],
                    ready_s: 0.0,
                    share: 0.0,
                }),
            }
        }
        for slot in &mut slots {
            slot.processes.sort_by_key(|p| p.process);
            slot.ready_s = slot.processes.iter().map(|p| p.ready_s).sum();
            slot.share = if wall.seconds > 0.0 {
                slot.ready_s / wall.seconds
            } else {
                0.0
            };
        }
        WallTime {
            started_at: wall.started_at.clone(),
            wall_s: wall.seconds,
            staging_s,
            slots,
            undated,
        }
    }

    /// The report's section: the wall time, then a line per slot with its processes' ready
    /// times.
    pub fn write(&self, t: &mut String) {
        let staging = self
            .staging_s
            .map_or_else(String::new, |s| format!("; staging {s:.2} of it"));
        let _ = writeln!(
            t,
            "\nwall time {:.2} s (the apply started {}, from its start to its workers' \
             end{staging}); process starts in it, per slot (its processes one after another), \
             seconds",
            self.wall_s, self.started_at
        );
        if self.slots.is_empty() {
            let _ = writeln!(t, "  no process start recorded");
        }
        for slot in &self.slots {
            let each: Vec<String> = slot
                .processes
                .iter()
                .map(|p| {
                    let name = match (p.role, p.shard) {
                        (ProcessRole::Shard, Some(shard)) => format!("shard {shard}"),
                        (role, _) => role.as_str().to_string(),
                    };
                    format!("{name} {:.2}", p.ready_s)
                })
                .collect();
            let n = slot.processes.len();
            let _ = writeln!(
                t,
                "  {}  {n} process{} ready in {:.2} ({}): {:.1}% of the wall time",
                slot.slot,
                if n == 1 { "" } else { "es" },
                slot.ready_s,
                each.join(", "),
                100.0 * slot.share
            );
        }
        if self.undated > 0 {
            let _ = writeln!(
                t,
                "  {} process start(s) without a date left out: the run was resumed, and they \
                 may be an earlier apply's",
                self.undated
            );
        }
    }
}

fn parse(rfc3339: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339(rfc3339).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::ProcessStart;
    use crate::results::files::tests::record;

    fn started(process: usize, slot: &str, at: Option<&str>, ready_s: f64) -> TimingRecord {
        let mut r = record(0, 1.0);
        r.process = process;
        r.slot = slot.into();
        r.process_start = Some(ProcessStart {
            started_at: at.map(str::to_string),
            ready_s,
            ..ProcessStart::default()
        });
        r
    }

    /// A start dated before the apply is an earlier apply's; one without a date (records of
    /// earlier runners) counts while the run was never resumed, and once it was is left out and
    /// counted apart. Each slot sums its processes' ready times over the wall time.
    #[test]
    fn an_applys_starts_are_those_dated_from_its_start() {
        let wall = ApplyWall {
            started_at: "2026-12-06T11:00:00Z".into(),
            seconds: 40.0,
        };
        let timings = [
            started(0, "gpu0", Some("2026-12-06T10:59:59Z"), 9.0),
            started(1, "gpu0", Some("2026-12-06T11:00:00Z"), 6.0),
            started(2, "gpu1", None, 4.0),
            started(3, "gpu0", Some("2026-12-06T11:00:20Z"), 2.0),
        ];
        let resumed = WallTime::of_apply(&wall, true, Some(1.5), &timings);
        assert_eq!(resumed.undated, 1);
        assert_eq!(resumed.slots.len(), 1);
        let gpu0 = &resumed.slots[0];
        assert_eq!(
            (gpu0.slot.as_str(), gpu0.ready_s, gpu0.share),
            ("gpu0", 8.0, 0.2)
        );
        let processes: Vec<usize> = gpu0.processes.iter().map(|p| p.process).collect();
        assert_eq!(processes, [1, 3]);
        let mut t = String::new();
        resumed.write(&mut t);
        assert!(t.contains("staging 1.50 of it"), "{t}");
        assert!(
            t.contains("1 process start(s) without a date left out"),
            "{t}"
        );

        let once = WallTime::of_apply(&wall, false, None, &timings);
        assert_eq!(once.undated, 0);
        let slots: Vec<(&str, f64)> = once
            .slots
            .iter()
            .map(|s| (s.slot.as_str(), s.ready_s))
            .collect();
        assert_eq!(slots, [("gpu0", 8.0), ("gpu1", 4.0)]);
    }
}

//! The four statistics of a series of per-prompt times, in measurement order.
//!
//! The first measured prompt of a process pays for lazy work (allocator growth, kernel
//! selection, graph capture) that a warmup process cannot always absorb, so besides the plain
//! mean the summary has statistics that leave it out, and the mean of the last three prompts as
//! the steady state. A statistic without inputs is `None` (JSON `null`, shown as `n/a`), never 0.

use serde::{Deserialize, Serialize};

/// How many trailing prompts `steady_tail_mean` averages.
pub const STEADY_TAIL: usize = 3;

/// The statistics of one series (timed total, DiT or VAE), in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Statistics {
    /// Mean over every prompt.
    pub raw_mean: Option<f64>,
    /// Mean over every prompt but the first.
    pub warm_mean_excluding_first: Option<f64>,
    /// Minimum over every prompt but the first.
    pub min_after_first: Option<f64>,
    /// Mean over the last three prompts (fewer when fewer exist).
    pub steady_tail_mean: Option<f64>,
}

impl Statistics {
    /// The statistics of `times`, which must be in measurement order.
    pub fn of(times: &[f64]) -> Statistics {
        Statistics {
            raw_mean: raw_mean(times),
            warm_mean_excluding_first: warm_mean_excluding_first(times),
            min_after_first: min_after_first(times),
            steady_tail_mean: steady_tail_mean(times),
        }
    }

    /// The four values with their names, in the order reports show them.
    pub fn named(&self) -> [(&'static str, Option<f64>); 4] {
        [
            ("raw_mean", self.raw_mean),
            ("warm_mean_excluding_first", self.warm_mean_excluding_first),
            ("min_after_first", self.min_after_first),
            ("steady_tail_mean", self.steady_tail_mean),
        ]
    }
}

fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

pub fn raw_mean(times: &[f64]) -> Option<f64> {
    mean(times)
}

pub fn warm_mean_excluding_first(times: &[f64]) -> Option<f64> {
    mean(times.get(1..).unwrap_or_default())
}

pub fn min_after_first(times: &[f64]) -> Option<f64> {
    times
        .get(1..)
        .unwrap_or_default()
        .iter()
        .copied()
        .reduce(f64::min)
}

pub fn steady_tail_mean(times: &[f64]) -> Option<f64> {
    mean(&times[times.len().saturating_sub(STEADY_TAIL)..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Option<f64>, b: Option<f64>) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => (a - b).abs() < 1e-12,
            (None, None) => true,
            _ => false,
        }
    }

    #[test]
    fn statistics_of_series() {
        // (times, raw, warm excluding first, min after first, steady tail)
        type Case<'a> = (
            &'a [f64],
            Option<f64>,
            Option<f64>,
            Option<f64>,
            Option<f64>,
        );
        let cases: &[Case] = &[
            (&[], None, None, None, None),
            // One prompt: nothing remains once the first is left out.
            (&[4.0], Some(4.0), None, None, Some(4.0)),
            (&[6.0, 4.0], Some(5.0), Some(4.0), Some(4.0), Some(5.0)),
            (&[4.0, 6.0], Some(5.0), Some(6.0), Some(6.0), Some(5.0)),
            (&[1.0, 2.0, 3.0], Some(2.0), Some(2.5), Some(2.0), Some(2.0)),
            // A slow first prompt, then a dip that is not in the tail.
            (
                &[10.0, 4.0, 3.0, 5.0, 6.0],
                Some(5.6),
                Some(4.5),
                Some(3.0),
                Some(14.0 / 3.0),
            ),
        ];
        for (times, raw, warm, min, tail) in cases {
            let s = Statistics::of(times);
            assert!(close(s.raw_mean, *raw), "{times:?} raw {:?}", s.raw_mean);
            assert!(
                close(s.warm_mean_excluding_first, *warm),
                "{times:?} warm {:?}",
                s.warm_mean_excluding_first
            );
            assert!(
                close(s.min_after_first, *min),
                "{times:?} min {:?}",
                s.min_after_first
            );
            assert!(
                close(s.steady_tail_mean, *tail),
                "{times:?} tail {:?}",
                s.steady_tail_mean
            );
        }
    }

    #[test]
    fn missing_statistics_serialise_as_null() {
        let json = serde_json::to_value(Statistics::of(&[2.5])).unwrap();
        assert_eq!(json["raw_mean"], 2.5);
        assert!(json["warm_mean_excluding_first"].is_null());
        assert!(json["min_after_first"].is_null());
        let back: Statistics = serde_json::from_value(json).unwrap();
        assert_eq!(back, Statistics::of(&[2.5]));
    }
}

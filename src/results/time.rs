//! RFC 3339 timestamps (UTC, whole seconds) for the start and end of a run.

use std::time::{SystemTime, UNIX_EPOCH};

/// Formats `t` as `YYYY-MM-DDTHH:MM:SSZ`. Times before 1970 are clamped to the epoch: a run
/// record never needs them.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t.max(UNIX_EPOCH)).to_string()
}

/// The current time, formatted.
pub fn now() -> String {
    rfc3339(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_known_instants() {
        // Expected values from `date -u -d @SECS`.
        for (secs, want) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_709_251_199, "2024-02-29T23:59:59Z"),
            (1_796_023_462, "2026-11-30T07:24:22Z"),
            (4_107_542_399, "2100-02-28T23:59:59Z"),
        ] {
            assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(secs)), want);
        }
    }

    #[test]
    fn drops_fractions_and_clamps_times_before_the_epoch() {
        let t = UNIX_EPOCH + Duration::from_millis(1_709_251_199_999);
        assert_eq!(rfc3339(t), "2024-02-29T23:59:59Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_secs(86_400)),
            "1970-01-01T00:00:00Z"
        );
    }
}

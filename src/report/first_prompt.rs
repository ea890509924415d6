//! The first prompt of each process: how long the process took to get its sessions ready, how
//! its first prompt compares with the prompts after it, and where the difference went (the
//! one-time work the worker recorded, `engine::one_time`).

use std::fmt::Write as _;

use serde::Serialize;

use crate::results::{ProcessRole, ProcessStart, TimingRecord};
use crate::vocab::OneTimeWork;

/// One process's first recorded prompt.
#[derive(Debug, Clone, Serialize)]
pub struct FirstPrompt {
    pub process: usize,
    pub role: ProcessRole,
    pub slot: String,
    pub prompt: u32,
    /// The process's start (absent in records of earlier runners).
    pub start: Option<ProcessStart>,
    /// The first prompt's timed total.
    pub first_s: f64,
    /// Its one-time work (zero on the CPU and in records of earlier runners).
    pub one_time: OneTimeWork,
}

/// The first prompts of a run, and the steady time they are compared with.
#[derive(Debug, Clone, Serialize)]
pub struct FirstPrompts {
    pub processes: Vec<FirstPrompt>,
    /// The mean timed total of every prompt after its process's first (warmups included: they
    /// run the same work); `None` when no process recorded a second prompt.
    pub steady_s: Option<f64>,
}

impl FirstPrompts {
    /// From a run's records, in the order they were written.
    pub fn of(timings: &[TimingRecord]) -> FirstPrompts {
        let mut processes: Vec<FirstPrompt> = Vec::new();
        let mut after_first = Vec::new();
        for r in timings {
            if processes.iter().any(|p| p.process == r.process) {
                after_first.push(r.timed_total_s);
                continue;
            }
            processes.push(FirstPrompt {
                process: r.process,
                role: r.role,
                slot: r.slot.clone(),
                prompt: r.prompt,
                start: r.process_start.clone(),
                first_s: r.timed_total_s,
                one_time: r.one_time.unwrap_or_default(),
            });
        }
        let steady_s = (!after_first.is_empty())
            .then(|| after_first.iter().sum::<f64>() / after_first.len() as f64);
        FirstPrompts {
            processes,
            steady_s,
        }
    }

    /// The report's section: per process, its start and its first prompt, then the one-time
    /// work of that prompt and the rest of its time beyond the steady time.
    pub fn write(&self, t: &mut String) {
        if self.processes.is_empty() {
            return;
        }
        let _ = writeln!(
            t,
            "\nfirst prompt of each process, seconds (steady {}: the mean of the prompts after \
             each process's first)",
            self.steady_s
                .map_or_else(|| "n/a".to_string(), |s| format!("{s:.3}"))
        );
        for p in &self.processes {
            let ready = p.start.as_ref().map_or_else(
                || "ready time not recorded".to_string(),
                |s| {
                    format!(
                        "ready in {:.2} ({}{}, DiT sessions {:.2}, decoder \
                         sessions and first run beside them {:.2}{}, buffers {:.2}{})",
                        s.ready_s,
                        // Shown where it took a hundredth of a second or more: a bundle whose
                        // files were read whole to check them (a worker started on its own).
                        if s.parts.bundle_check_s >= 0.005 {
                            format!("bundle check {:.2}, ", s.parts.bundle_check_s)
                        } else {
                            String::new()
                        },
                        text_part(s),
                        s.parts.dit_sessions_s,
                        s.parts.decoder_sessions_s,
                        if s.parts.decoder_first_run_s > 0.0 {
                            format!(" (first run {:.2})", s.parts.decoder_first_run_s)
                        } else {
                            String::new()
                        },
                        s.parts.buffers_s,
                        work_list(&s.one_time)
                            .map_or_else(String::new, |w| format!("; of them {w}"))
                    )
                },
            );
            let times_steady = self
                .steady_s
                .filter(|s| *s > 0.0)
                .map_or_else(String::new, |s| format!(", {:.1}x steady", p.first_s / s));
            let _ = writeln!(
                t,
                "  process {} ({}, {}): {ready}; first prompt ({}) {:.3}{times_steady}",
                p.process,
                p.role.as_str(),
                p.slot,
                p.prompt,
                p.first_s
            );
            if let Some(steady) = self.steady_s {
                let work: f64 = p.one_time.named().iter().map(|(_, s)| s).sum();
                let rest = (p.first_s - steady - work).max(0.0);
                let _ = writeln!(
                    t,
                    "    beyond steady {:.2}: {}the rest {rest:.2}",
                    (p.first_s - steady).max(0.0),
                    work_list(&p.one_time).map_or_else(String::new, |w| format!("{w}; "))
                );
            }
        }
    }
}

/// The text contexts' part of a process's start: the text encoder's time, with how many contexts
/// it encoded and read where the record says; or, where every context was read from those an
/// earlier process kept, that (the text encoder was not loaded).
fn text_part(s: &ProcessStart) -> String {
    let seconds = s.parts.text_encoder_s;
    let Some(c) = s.text_contexts else {
        return format!("text encoder {seconds:.2}");
    };
    let plural = |n: u32| if n == 1 { "" } else { "s" };
    if c.encoded == 0 {
        return format!(
            "{} text context{} read {seconds:.2}, text encoder not loaded",
            c.read,
            plural(c.read)
        );
    }
    let mut parts = vec![format!(
        "{} context{} encoded",
        c.encoded,
        plural(c.encoded)
    )];
    if c.for_later > 0 {
        parts.push(format!("{} of them for later processes", c.for_later));
    }
    if c.read > 0 {
        parts.push(format!("{} read", c.read));
    }
    format!("text encoder {seconds:.2} ({})", parts.join(", "))
}

/// The kinds of work done, with their seconds (`attention plans 1.90, graph capture 2.29`), or
/// `None` when none was; kinds that print as 0.00 are left out (a capture's wait of a few
/// microseconds), though "the rest" counts them.
fn work_list(work: &OneTimeWork) -> Option<String> {
    let parts: Vec<String> = work
        .named()
        .iter()
        .filter(|(_, s)| *s >= 0.005)
        .map(|(name, s)| format!("{name} {s:.2}"))
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::files::tests::record;
    use crate::vocab::StartupTimes;

    /// Each process's first record is its first prompt; the steady time is the mean of the
    /// others; the section splits the difference into the recorded work and the rest.
    #[test]
    fn the_first_prompt_of_each_process_is_split_into_its_one_time_work() {
        let mut records = Vec::new();
        for (process, role, totals) in [
            (0, ProcessRole::Warmup, vec![30.0, 3.0]),
            (1, ProcessRole::Measurement, vec![8.0, 2.0, 2.0]),
        ] {
            for (i, total) in totals.into_iter().enumerate() {
                let mut r = record(i as u32, total);
                r.process = process;
                r.role = role;
                if i == 0 {
                    r.process_start = Some(ProcessStart {
                        started_at: None,
                        ready_s: 4.5,
                        parts: StartupTimes {
                            // The warmup read its bundle whole to check it; the measurement
                            // process was handed the hashes (a thousandth: not shown).
                            bundle_check_s: if process == 0 { 1.75 } else { 0.001 },
                            dit_sessions_s: 2.0,
                            // The measurement process's decoder ran once at start.
                            decoder_sessions_s: 3.0 * process as f64,
                            decoder_first_run_s: 1.25 * process as f64,
                            ..StartupTimes::default()
                        },
                        one_time: OneTimeWork {
                            kernel_compile_s: 1.5,
                            ..OneTimeWork::default()
                        },
                        text_contexts: None,
                    });
                    r.one_time = Some(OneTimeWork {
                        attention_plans_s: 20.0 - 16.0 * process as f64,
                        graph_capture_s: 1.0,
                        // Prints as 0.00: left out of the list.
                        capture_wait_s: 2e-6,
                        ..OneTimeWork::default()
                    });
                }
                records.push(r);
            }
        }
        let first = FirstPrompts::of(&records);
        assert_eq!(first.processes.len(), 2);
        assert_eq!(first.steady_s, Some(7.0 / 3.0));
        assert_eq!(first.processes[1].first_s, 8.0);
        let mut t = String::new();
        first.write(&mut t);
        assert!(t.contains("steady 2.333"), "{t}");
        assert!(
            t.contains(
                "process 0 (warmup, gpu0): ready in 4.50 (bundle check 1.75, text encoder 0.00, \
                 DiT sessions 2.00, decoder sessions and first run beside them 0.00, buffers \
                 0.00; of them kernel compile 1.50)"
            ),
            "{t}"
        );
        assert!(t.contains("first prompt (0) 30.000, 12.9x steady"), "{t}");
        // 30 − 2.333 = 27.67 beyond steady: 20 + 1 recorded, 6.67 the rest.
        assert!(
            t.contains(
                "beyond steady 27.67: attention plans 20.00, graph capture 1.00; the rest 6.67"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "process 1 (measurement, gpu0): ready in 4.50 (text encoder 0.00, DiT sessions \
                 2.00, decoder sessions and first run beside them 3.00 (first run 1.25), buffers"
            ),
            "{t}"
        );
        assert!(t.contains("3.4x steady"), "{t}");
    }

    /// A start says how its text contexts came: encoded (some for the processes after it), or
    /// all read from those an earlier process kept, without the text encoder.
    #[test]
    fn the_start_says_which_text_contexts_were_read_rather_than_encoded() {
        use crate::vocab::TextContexts;
        let start = |contexts: Option<TextContexts>| ProcessStart {
            parts: StartupTimes {
                text_encoder_s: 1.5,
                ..StartupTimes::default()
            },
            text_contexts: contexts,
            ..ProcessStart::default()
        };
        let counts = |encoded, read, for_later| TextContexts {
            encoded,
            read,
            for_later,
        };
        for (contexts, expected) in [
            (None, "text encoder 1.50"),
            (
                Some(counts(5, 0, 4)),
                "text encoder 1.50 (5 contexts encoded, 4 of them for later processes)",
            ),
            (
                Some(counts(1, 2, 0)),
                "text encoder 1.50 (1 context encoded, 2 read)",
            ),
            (
                Some(counts(0, 1, 0)),
                "1 text context read 1.50, text encoder not loaded",
            ),
            (
                Some(counts(0, 3, 0)),
                "3 text contexts read 1.50, text encoder not loaded",
            ),
        ] {
            assert_eq!(text_part(&start(contexts)), expected);
        }
    }

    /// Records of earlier runners (no start, no work) still give each process's first prompt.
    #[test]
    fn records_without_the_split_still_show_the_first_prompt() {
        let records = vec![record(0, 5.0), record(1, 1.0)];
        let mut t = String::new();
        FirstPrompts::of(&records).write(&mut t);
        assert!(t.contains("ready time not recorded"), "{t}");
        assert!(t.contains("beyond steady 4.00: the rest 4.00"), "{t}");
    }
}

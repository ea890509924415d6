//! Progress of a run, drawn by the orchestrator (never inside a measured worker): one indicatif
//! bar per worker slot on a terminal, plain lines otherwise, nothing with `--quiet`.

use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use super::events::RunEventKind;

/// One slot's share of the work.
pub struct SlotWork {
    pub label: String,
    /// Prompts the slot's measurement or shard processes will generate.
    pub prompts: usize,
}

pub enum Progress {
    Quiet,
    Lines,
    Bars(MultiProgress, Vec<ProgressBar>),
}

impl Progress {
    /// `skipped` prompts were complete already (resume).
    pub fn new(quiet: bool, slots: &[SlotWork], skipped: usize) -> Progress {
        if quiet {
            return Progress::Quiet;
        }
        if skipped > 0 {
            let left: usize = slots.iter().map(|s| s.prompts).sum();
            crate::say!("resuming: {skipped} prompts already complete, {left} to go");
        }
        if !std::io::stderr().is_terminal() {
            return Progress::Lines;
        }
        let multi = MultiProgress::new();
        let style = ProgressStyle::with_template(
            "{prefix:>6} [{elapsed_precise}] {bar:30} {pos}/{len} prompts {msg}",
        )
        .expect("a valid template");
        let bars = slots
            .iter()
            .map(|s| {
                let bar = multi.add(ProgressBar::new(s.prompts as u64));
                bar.set_style(style.clone());
                bar.set_prefix(s.label.clone());
                bar
            })
            .collect();
        Progress::Bars(multi, bars)
    }

    /// An event of the run; `what` names its process (`warmup 1`, `shard 3`).
    pub fn event(&self, slot: usize, what: &str, warmup: bool, event: &RunEventKind) {
        match (self, event) {
            (Progress::Quiet, _) => {}
            (Progress::Lines, RunEventKind::Ready(facts)) => crate::say!(
                "{what}: sessions ready on {}, attention {}, kernels dit {}, vae {}",
                facts.provider,
                facts.attention_backend,
                facts.dit_kernels,
                facts.vae_kernels
            ),
            (
                Progress::Lines,
                RunEventKind::PromptDone {
                    prompt,
                    timed_total_s,
                },
            ) => {
                crate::say!("{what}: prompt {prompt} done in {timed_total_s:.3} s")
            }
            (Progress::Bars(_, bars), RunEventKind::Ready(_)) => {
                if let Some(bar) = bars.get(slot) {
                    bar.set_message(format!("{what}: starting"));
                }
            }
            (
                Progress::Bars(_, bars),
                RunEventKind::PromptDone {
                    prompt,
                    timed_total_s,
                },
            ) => {
                if let Some(bar) = bars.get(slot) {
                    // Warmup prompts are not part of the run's count.
                    if !warmup {
                        bar.inc(1);
                    }
                    bar.set_message(format!("{what}: prompt {prompt} in {timed_total_s:.2} s"));
                }
            }
            // Starts and ends show through the prompts; failures are reported at the end.
            (_, RunEventKind::Started { .. } | RunEventKind::Finished { .. }) => {}
        }
    }

    pub fn finish(&self) {
        if let Progress::Bars(_, bars) = self {
            for bar in bars {
                bar.finish_and_clear();
            }
        }
    }
}

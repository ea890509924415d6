//! Progress of a run, drawn by the orchestrator (never inside a measured worker): an indicatif
//! bar on a terminal, plain lines otherwise, nothing with `--quiet`.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use super::spec::WorkerEvent;

pub enum Progress {
    Quiet,
    Lines,
    Bar(ProgressBar),
}

impl Progress {
    /// `total` prompts are left to generate; `skipped` were complete already (resume).
    pub fn new(quiet: bool, total: usize, skipped: usize) -> Progress {
        if quiet {
            return Progress::Quiet;
        }
        if skipped > 0 {
            eprintln!("resuming: {skipped} prompts already complete, {total} to go");
        }
        if !std::io::stderr().is_terminal() {
            return Progress::Lines;
        }
        let bar = ProgressBar::new(total as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} prompts {msg}",
            )
            .expect("a valid template"),
        );
        Progress::Bar(bar)
    }

    pub fn event(&self, process: usize, event: &WorkerEvent) {
        match (self, event) {
            (Progress::Quiet, _) => {}
            (
                Progress::Lines,
                WorkerEvent::Ready {
                    provider,
                    attention_backend,
                    ..
                },
            ) => {
                eprintln!(
                    "process {process}: sessions ready on {provider}, attention {attention_backend}"
                )
            }
            (
                Progress::Lines,
                WorkerEvent::Prompt {
                    prompt,
                    timed_total_s,
                },
            ) => {
                eprintln!("process {process}: prompt {prompt} done in {timed_total_s:.3} s")
            }
            (
                Progress::Bar(bar),
                WorkerEvent::Prompt {
                    prompt,
                    timed_total_s,
                },
            ) => {
                bar.inc(1);
                bar.set_message(format!("prompt {prompt}: {timed_total_s:.2} s"));
            }
            (Progress::Bar(_), WorkerEvent::Ready { .. }) => {}
        }
    }

    pub fn finish(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

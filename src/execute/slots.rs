//! Worker processes: each slot's processes run one after another (slots in parallel) as
//! `runner worker --spec` processes of the staged binary. Every thread sends what happens as
//! [`RunEvent`]s to the calling thread, which hands them to the run's consumers and forwards an
//! interruption to the workers.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufRead, BufReader};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc;

use super::events::{RunEvent, RunEventKind};
use super::job::JobSpec;
use super::signals::INTERRUPTED;
use crate::engine::ProviderKind;
use crate::manifest::diagnostic::display_path;
use crate::plan::{Plan, Process, Role};
use crate::results::files::{RecordError, write_atomic};

/// Why a worker process did not succeed, naming the process.
#[derive(Debug, thiserror::Error)]
pub(super) enum ProcessError {
    #[error("{name}: {source}")]
    Spec { name: String, source: RecordError },
    #[error("{name}: cannot create {}: {source}", path.display())]
    Create {
        name: String,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{name}: cannot start {}: {source}", runner.display())]
    Start {
        name: String,
        runner: PathBuf,
        source: io::Error,
    },
    #[error("{name}: cannot start the worker: {source}")]
    StartWorker { name: String, source: io::Error },
    /// The runner's own path cannot be found, or the worker cannot be waited for.
    #[error("{name}: {source}")]
    Io { name: String, source: io::Error },
    /// It ended with a failure: its exit status (`None`: killed by a signal) and its log's last
    /// lines.
    #[error("{name} {} (log {}):\n{tail}", ended(*code), display_path(log))]
    Failed {
        name: String,
        code: Option<i32>,
        log: PathBuf,
        tail: String,
    },
}

/// How a failed process ended, from its exit status (`None`: killed by a signal).
fn ended(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exited with status {c}"),
        None => "was killed by a signal".to_string(),
    }
}

/// A run's worker processes: the plan, each process's job (`None`: nothing to do), and the
/// staged runner that executes them.
pub(super) struct Workers<'a> {
    pub plan: &'a Plan,
    pub jobs: &'a [Option<JobSpec>],
    pub runner: &'a Path,
    pub run_dir: &'a Path,
    pub provider: ProviderKind,
    /// Threads of each worker's CPU work (`OMP_NUM_THREADS`).
    pub cpu_threads: u64,
    /// A probe's debug videos are removed after each process.
    pub probe: bool,
    /// The run folder's lock, which every worker holds too.
    pub run_lock: RawFd,
}

impl Workers<'_> {
    /// Runs every slot's processes and gives each event to `on_event`, on this thread, in the
    /// order they arrive. A slot stops at its first failed process: later ones depend on its
    /// warm state.
    pub fn run(&self, mut on_event: impl FnMut(&RunEvent)) {
        let (tx, rx) = mpsc::channel::<RunEvent>();
        let mut children: BTreeMap<usize, u32> = BTreeMap::new();
        std::thread::scope(|scope| {
            for slot in 0..self.plan.slots.len() {
                let tx = tx.clone();
                scope.spawn(move || self.run_slot(slot, &tx));
            }
            drop(tx);
            loop {
                match rx.recv_timeout(std::time::Duration::from_millis(100)) {
                    Ok(event) => {
                        match event.kind {
                            RunEventKind::Started { pid } => {
                                children.insert(event.process, pid);
                            }
                            RunEventKind::Finished { .. } => {
                                children.remove(&event.process);
                            }
                            _ => {}
                        }
                        on_event(&event);
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
                if INTERRUPTED.load(Ordering::SeqCst) {
                    for pid in children.values() {
                        crate::os::signal_process(*pid, crate::os::Signal::Term);
                    }
                }
            }
        });
    }

    fn run_slot(&self, slot: usize, tx: &mpsc::Sender<RunEvent>) {
        for (p, job) in self.plan.processes.iter().zip(self.jobs) {
            if p.slot != slot {
                continue;
            }
            let Some(job) = job else { continue };
            if INTERRUPTED.load(Ordering::SeqCst) {
                return;
            }
            let result = self.run_process(p, job, tx);
            if self.probe
                && let Some(v) = &job.videos
            {
                // Debug videos never outlive their probe process, failed or not.
                let _ = fs::remove_dir_all(v);
            }
            if result.is_ok()
                && let Some(marker) = &p.skip_if_marker
            {
                let _ = fs::write(marker, format!("{}\n", self.plan.run));
            }
            let failed = result.is_err();
            let _ = tx.send(RunEvent {
                process: p.index,
                kind: RunEventKind::Finished {
                    failure: result.err().map(|e| e.to_string()),
                },
            });
            if failed {
                return;
            }
        }
    }

    fn run_process(
        &self,
        p: &Process,
        job: &JobSpec,
        tx: &mpsc::Sender<RunEvent>,
    ) -> Result<(), ProcessError> {
        let describe = || process_name(self.plan, p);
        let spec_path = spec_path(self.run_dir, self.plan, p);
        let text = serde_json::to_string_pretty(job).expect("jobs serialise");
        write_atomic(&spec_path, text.as_bytes()).map_err(|source| ProcessError::Spec {
            name: describe(),
            source,
        })?;
        let cannot_create = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ProcessError::Create {
                name: describe(),
                path,
                source,
            }
        };
        fs::create_dir_all(&p.cache_dir).map_err(cannot_create(&p.cache_dir))?;
        if let Some(v) = &job.videos {
            fs::create_dir_all(v).map_err(cannot_create(v))?;
        }
        let log = fs::File::create(&p.log).map_err(cannot_create(&p.log))?;
        let mut cmd = Command::new(self.runner);
        cmd.arg("worker")
            .arg("--spec")
            .arg(&spec_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            // The CUDA driver's JIT cache is this process's, nothing global (the decoder
            // convolutions' choices are in its job).
            .env("CUDA_CACHE_PATH", p.cache_dir.join("cuda_jit"))
            .env("OMP_NUM_THREADS", self.cpu_threads.to_string());
        if self.provider != ProviderKind::Cpu {
            cmd.env("CUDA_VISIBLE_DEVICES", &self.plan.slots[p.slot].device);
        }
        bind_to_parent(&mut cmd, self.run_lock);
        let mut child = cmd.spawn().map_err(|source| ProcessError::Start {
            name: describe(),
            runner: self.runner.to_path_buf(),
            source,
        })?;
        let send = |kind| {
            let _ = tx.send(RunEvent {
                process: p.index,
                kind,
            });
        };
        send(RunEventKind::Started { pid: child.id() });
        if let Some(out) = child.stdout.take() {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                // Only the worker's own events: `Started` and `Finished` are the orchestrator's.
                if let Some(kind @ (RunEventKind::Ready(_) | RunEventKind::PromptDone { .. })) =
                    RunEventKind::from_line(&line)
                {
                    send(kind);
                }
            }
        }
        let status = child.wait().map_err(|source| ProcessError::Io {
            name: describe(),
            source,
        })?;
        if status.success() {
            return Ok(());
        }
        Err(ProcessError::Failed {
            name: describe(),
            code: status.code(),
            log: p.log.clone(),
            tail: log_tail(&p.log, 20),
        })
    }
}

/// Makes a worker end with the orchestrator and hold the run folder's lock while it lives: the
/// kernel kills it when the thread that started it ends (the orchestrator killed, even with
/// SIGKILL, included), and it inherits the lock's open file, so a next apply of the run is
/// refused until the last worker is gone.
pub(super) fn bind_to_parent(cmd: &mut Command, run_lock: RawFd) {
    crate::os::end_with_parent(cmd, Some(run_lock));
}

/// Where process `p`'s job spec goes: `specs/<index>.json`, named by the selection for a warmup
/// of an apply of some shards ([`Plan::file_suffix`]).
pub(super) fn spec_path(run_dir: &Path, plan: &Plan, p: &Process) -> PathBuf {
    let suffix = plan.file_suffix(p).unwrap_or_default();
    run_dir
        .join("specs")
        .join(format!("{:03}{suffix}.json", p.index))
}

/// A process as messages name it: `gpu0 warmup 1`, `cpu1 shard 3`.
pub(super) fn process_name(plan: &Plan, p: &Process) -> String {
    let slot = &plan.slots[p.slot].label;
    match p.role {
        Role::Warmup { repeat } => format!("{slot} warmup {repeat}"),
        Role::Measurement => format!("{slot} measurement"),
        Role::Shard { shard } => format!("{slot} shard {shard}"),
    }
}

/// The last `n` lines of a log, for failure reports.
pub(super) fn log_tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

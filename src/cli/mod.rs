//! The command line: argument parsing, and the mapping of errors to exit statuses.

mod apply;
mod apply_json;
mod completions;
mod doctor;
mod evaluate;
mod plan;
mod prompts;
mod report;
mod runs;
mod status;
mod sweep;
pub mod worker;

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::exit;

#[derive(Debug, Parser)]
#[command(
    name = "runner",
    version,
    about = "Run speed probes, ablations and generations of a block-causal text-to-video model",
    long_about = "Run speed probes, ablations and generations of a block-causal text-to-video \
                  model over ONNX Runtime.\n\nExperiments are TOML manifests (experiments/*.toml). \
                  Settings are layered, lowest first: built-in defaults < the manifest chain \
                  (extends) < environment variables < --set / --extra-args.",
    after_help = exit::statuses_help()
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// The doc comments are the commands' help text, where `<name>` is a placeholder, not HTML.
#[allow(rustdoc::invalid_html_tags)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a manifest (warmups, then measurement or shards) into results/<name>/; applying again resumes.
    #[command(
        after_help = "Settings come from the manifest, the environment and --set / --extra-args \
                      (docs/settings.md, with the table of which method settings are flags, \
                      config-only, or fixed by the export). `runner worker --help` documents the \
                      per-process flags of a worker, a broader set than --extra-args accepts."
    )]
    Apply(apply::ApplyArgs),
    /// Show what `apply` would do: processes, shards, GPUs, caches, and whether it resumes a run. Nothing is written.
    Plan(plan::PlanArgs),
    /// Print the JSON Schema of manifests.
    Schema,
    /// Check ONNX Runtime, execution providers, GPUs, CUDA libraries and asset bundles.
    Doctor(doctor::DoctorArgs),
    /// Show how a bundle's tokenizer reads each prompt of a prompt file: tokens, truncation, ids.
    Prompts(prompts::PromptsArgs),
    /// Generate prompts in this process (started by `runner apply`; see `runner worker --help`).
    #[command(hide = true)]
    Worker(Box<worker::WorkerArgs>),
    /// Show a run's statistics, phase split and provenance (and draw latency.svg if missing).
    Report(report::ReportArgs),
    /// Compare the statistics of two or more runs in one table: values, deltas and ratios.
    Compare(report::CompareArgs),
    /// List the runs under the results folder as a table: status, prompts done, then settings,
    /// statistics and scores (--columns), sorted (--sort) and filtered (--name, --kind).
    Runs(runs::RunsArgs),
    /// Show the settings that differ between two runs, with the layer that set each.
    Diff(runs::DiffArgs),
    /// Remove a run's staging snapshot (--state: and its runtime state; --all: the whole run).
    Clean(runs::CleanArgs),
    /// Show where a run stands: its status, prompts done, its apply or Slurm job and tasks.
    Status(status::StatusArgs),
    /// Run one task of a run's Slurm job (started by Slurm from the script `runner apply` wrote).
    #[command(hide = true)]
    SlurmTask(status::SlurmTaskArgs),
    /// Load ONNX Runtime and check it has a provider, in this process (started by `runner apply`
    /// for a run whose library is not the one it loaded).
    #[command(hide = true)]
    CheckRuntime(CheckRuntimeArgs),
    /// Run a generation's evaluation (its `[evaluation]` command) on its videos and record the scores.
    Evaluate(evaluate::EvaluateArgs),
    /// Print a shell completion script: `runner completions bash > /etc/bash_completion.d/runner`.
    Completions(completions::CompletionsArgs),
}

/// `runner check-runtime`'s arguments.
#[derive(Debug, Args)]
pub struct CheckRuntimeArgs {
    /// The library to load (else where ONNX Runtime is looked for).
    #[arg(long, value_name = "PATH")]
    pub ort_library: Option<PathBuf>,
    /// The execution provider it must have.
    #[arg(long, value_name = "PROVIDER")]
    pub provider: crate::engine::ProviderKind,
}

/// The manifest and the command-line layer, shared by every command that reads a manifest.
#[derive(Debug, Clone, Args)]
pub struct ManifestArgs {
    /// The manifest, e.g. experiments/sigma001.toml.
    pub manifest: PathBuf,
    /// Override a setting: table.key=value (repeatable; highest precedence).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Method flags, split on whitespace, e.g. '--clean-sigma-override 0.01'.
    #[arg(long = "extra-args", value_name = "FLAGS", allow_hyphen_values = true)]
    pub extra_args: Vec<String>,
}

impl ManifestArgs {
    pub fn load(&self) -> Result<crate::manifest::Resolved, crate::manifest::Diagnostics> {
        crate::manifest::load(&self.request())
    }

    /// Loads, validates and plans every run of the manifest: each point of its `[sweep]`, or
    /// the manifest alone. On failure prints the problems and returns the exit status.
    /// With `shards` (`--shard`), each plan is restricted to them; `sweep` are the `--sweep`
    /// flags, a sweep in place of a `[sweep]` table.
    pub fn load_plans(
        &self,
        shards: Option<crate::plan::ShardRange>,
        sweep: &[String],
    ) -> Result<Vec<(crate::manifest::Resolved, crate::plan::Plan)>, i32> {
        let runs = crate::manifest::load_sweep_with(&self.request(), sweep).map_err(|diags| {
            exit::to_stderr(&diags.to_string());
            exit::USAGE
        })?;
        let mut plans = Vec::new();
        let mut failed = false;
        for mut resolved in runs {
            crate::execute::device::read_driver_gpus(&mut resolved);
            match crate::plan::build(&resolved) {
                Ok(mut plan) => {
                    if let Some(range) = shards
                        && let Err(e) = plan.select_shards(range)
                    {
                        crate::say!("error: {e}");
                        crate::say!(
                            "  = hint: `runner plan {}` lists the shards",
                            self.manifest.display()
                        );
                        return Err(exit::USAGE);
                    }
                    plans.push((resolved, plan));
                }
                Err(e) => {
                    match &resolved.sweep {
                        Some(_) => crate::say!("error: run `{}`: {e}", resolved.name),
                        None => crate::say!("error: {e}"),
                    }
                    failed = true;
                }
            }
        }
        if failed {
            return Err(exit::USAGE);
        }
        Ok(plans)
    }

    fn request(&self) -> crate::manifest::LoadRequest {
        crate::manifest::LoadRequest::from_process(
            self.manifest.clone(),
            self.set.clone(),
            self.extra_args.clone(),
        )
    }
}

/// Writes to stdout; a closed pipe (`runner plan | head`) ends quietly.
pub(crate) fn out(text: &str) -> i32 {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush())
    {
        Ok(()) => exit::OK,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => exit::OK,
        Err(e) => {
            crate::say!("error: cannot write output: {e}");
            exit::INTERNAL
        }
    }
}

/// Runs the command line and returns the process exit status.
pub fn main() -> i32 {
    crate::execute::worker::mark_process_start();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
        }
    };
    // The diagnostic switches of the commands that build sessions, checked before any work.
    if matches!(
        cli.command,
        Command::Apply(_) | Command::Worker(_) | Command::SlurmTask(_)
    ) && let Err(e) = crate::engine::check_diagnostics_env()
    {
        crate::say!("error: {e}");
        return exit::USAGE;
    }
    match cli.command {
        Command::Apply(args) => apply::run(&args),
        Command::Doctor(args) => doctor::run(&args),
        Command::Prompts(args) => prompts::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Schema => out(&crate::manifest::schema::manifest_schema_text()),
        Command::Worker(args) => worker::run(*args),
        Command::Report(args) => report::run_report(&args),
        Command::Compare(args) => report::run_compare(&args),
        Command::Runs(args) => runs::run_runs(&args),
        Command::Diff(args) => runs::run_diff(&args),
        Command::Clean(args) => runs::run_clean(&args),
        Command::Status(args) => status::run(&args),
        Command::SlurmTask(args) => crate::execute::slurm::run_task(&args.tasks, args.task),
        Command::CheckRuntime(args) => {
            match crate::execute::check_runtime(args.ort_library.as_deref(), args.provider) {
                Ok(()) => exit::OK,
                Err(e) => exit::report(&e),
            }
        }
        Command::Evaluate(args) => evaluate::run(&args),
        Command::Completions(args) => completions::run(&args),
    }
}

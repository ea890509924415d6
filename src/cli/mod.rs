//! The command line: argument parsing and the mapping of errors to exit statuses.

use clap::Parser;

pub mod worker;

#[derive(Debug, Parser)]
#[command(
    name = "runner",
    version,
    about = "Run speed probes, ablations and generations of a block-causal text-to-video model"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Generate prompts in this process: the worker that `runner apply` starts (hidden).
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
}

/// Runs the command line and returns the process exit status.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Worker(args) => worker::run(args),
    }
}

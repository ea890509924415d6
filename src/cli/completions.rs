//! `runner completions SHELL`: the shell's completion script for every command and flag.

use clap::{Args, CommandFactory};

use super::{Cli, out};

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Prints the completion script, made from the same command definition that parses the
/// command line, so it names every command and flag there is. The hidden commands (those other
/// processes start: `worker`, `slurm-task`) are left out, as `runner --help` leaves them out;
/// clap_complete would offer them.
pub fn run(args: &CompletionsArgs) -> i32 {
    let cli = Cli::command();
    let mut visible = clap::Command::new("runner")
        .version(env!("CARGO_PKG_VERSION"))
        .subcommands(cli.get_subcommands().filter(|c| !c.is_hide_set()).cloned());
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut visible, "runner", &mut script);
    out(&String::from_utf8_lossy(&script))
}

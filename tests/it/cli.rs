//! The command line itself: shell completions and the exit statuses in `runner --help`.

use crate::support::Test;

/// The visible subcommands, as `runner --help` lists them.
fn subcommands(t: &Test) -> Vec<String> {
    let help = t.cmd().args(["--help"]).run();
    assert_eq!(help.code, 0, "{}", help.render());
    help.stdout
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect()
}

#[test]
fn completion_scripts_name_every_command() {
    let t = Test::new();
    let commands = subcommands(&t);
    assert!(commands.len() >= 12, "{commands:?}");
    for required in ["apply", "report", "compare", "completions"] {
        assert!(commands.iter().any(|c| c == required), "{commands:?}");
    }
    for (shell, marker) in [
        ("bash", "complete -F _runner"),
        ("zsh", "#compdef runner"),
        ("fish", "complete -c runner"),
    ] {
        let out = t.cmd().args(["completions", shell]).run();
        assert_eq!(out.code, 0, "{shell}: {}", out.render());
        assert!(out.stdout.contains(marker), "{shell}:\n{}", out.stdout);
        for command in &commands {
            assert!(
                out.stdout.contains(command.as_str()),
                "{shell} lacks `{command}`"
            );
        }
        // The flags of a command are completed too.
        assert!(out.stdout.contains("html"), "{shell} lacks --html");
        // Hidden commands (the worker) are not offered.
        assert!(!out.stdout.contains("slurm-task"), "{shell}");
        assert!(!out.stdout.contains("worker"), "{shell}");
    }
    let bad = t.cmd().args(["completions", "tcsh"]).run();
    assert_eq!(bad.code, 2, "{}", bad.render());
    assert!(
        bad.stderr.contains("[possible values: bash,"),
        "{}",
        bad.stderr
    );
}

#[test]
fn help_lists_every_exit_status() {
    let t = Test::new();
    let help = t.cmd().args(["--help"]).run();
    assert_eq!(help.code, 0, "{}", help.render());
    let section: Vec<&str> = help
        .stdout
        .lines()
        .skip_while(|l| *l != "Exit statuses:")
        .skip(1)
        .collect();
    assert_eq!(
        section.len(),
        unstep::exit::STATUSES.len(),
        "{}",
        help.stdout
    );
    for ((code, meaning), line) in unstep::exit::STATUSES.iter().zip(&section) {
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some(code.to_string().as_str()), "{line}");
        assert_eq!(words.collect::<Vec<_>>().join(" "), *meaning);
    }
    for code in [
        unstep::exit::OK,
        unstep::exit::FAILURE,
        unstep::exit::USAGE,
        unstep::exit::INTERNAL,
        unstep::exit::INTERRUPTED,
    ] {
        assert!(unstep::exit::STATUSES.iter().any(|(c, _)| *c == code));
    }
}

//! User-facing problems with a manifest or an override, each with where it comes from and a hint.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where a value came from: the layer that set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A built-in default.
    Default,
    /// A manifest file, at a 1-based line and column.
    File {
        path: PathBuf,
        line: usize,
        col: usize,
    },
    /// An environment variable.
    Env { var: String },
    /// A command-line flag, as written.
    Flag { arg: String },
}

impl Origin {
    /// The environment variable that set the value, by its name alone: an `Env` origin's `var`
    /// may add which of its arguments did (`UNSTEP_EXTRA_ARGS (--steps)`). `None` for other
    /// layers.
    pub fn env_var(&self) -> Option<&str> {
        match self {
            Origin::Env { var } => var.split(' ').next(),
            _ => None,
        }
    }

    /// The layer's rank in the precedence order (higher wins).
    pub fn layer_name(&self) -> &'static str {
        match self {
            Origin::Default => "default",
            Origin::File { .. } => "manifest",
            Origin::Env { .. } => "environment",
            Origin::Flag { .. } => "command line",
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => f.write_str("default"),
            Origin::File { path, line, col } => {
                write!(f, "{}:{line}:{col}", display_path(path))
            }
            Origin::Env { var } => write!(f, "env {var}"),
            Origin::Flag { arg } => write!(f, "flag {arg}"),
        }
    }
}

/// Paths are shown relative to the current directory when they are below it, so messages and
/// plans read the same on every machine; the current directory itself is shown in full (as
/// relative it would be an empty name).
pub fn display_path(path: &Path) -> String {
    if let Ok(cwd) = std::env::current_dir()
        && let Ok(rel) = path.strip_prefix(&cwd)
        && !rel.as_os_str().is_empty()
    {
        return rel.display().to_string();
    }
    path.display().to_string()
}

/// A source excerpt to show under a message: the offending line and the span to underline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excerpt {
    pub line_text: String,
    /// 1-based column of the span's start, in characters.
    pub col: usize,
    /// Length of the span in characters (at least 1), clipped to the line.
    pub len: usize,
}

/// One problem found while loading or validating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub message: String,
    pub origin: Option<Origin>,
    pub excerpt: Option<Excerpt>,
    pub hint: Option<String>,
}

impl Diagnostic {
    pub fn new(message: impl Into<String>) -> Self {
        Diagnostic {
            message: message.into(),
            origin: None,
            excerpt: None,
            hint: None,
        }
    }

    pub fn at(mut self, origin: Origin) -> Self {
        self.origin = Some(origin);
        self
    }

    pub fn excerpt(mut self, excerpt: Option<Excerpt>) -> Self {
        self.excerpt = excerpt;
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "error: {}", self.message)?;
        match (&self.origin, &self.excerpt) {
            (Some(origin @ Origin::File { line, .. }), Some(ex)) => {
                let gutter = line.to_string().len();
                writeln!(f, "{:gutter$}--> {origin}", "")?;
                writeln!(f, "{:gutter$} |", "")?;
                writeln!(f, "{line} | {}", ex.line_text)?;
                writeln!(
                    f,
                    "{:gutter$} | {}{}",
                    "",
                    " ".repeat(ex.col.saturating_sub(1)),
                    "^".repeat(ex.len.max(1))
                )?;
            }
            (Some(origin), _) => writeln!(f, "  --> {origin}")?,
            (None, _) => {}
        }
        if let Some(hint) = &self.hint {
            writeln!(f, "  = hint: {hint}")?;
        }
        Ok(())
    }
}

/// All problems of one load, reported together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

/// How many problems are shown in full; the rest are counted (a file of many thousand unknown
/// keys is one mistake, not a screenful per key).
pub const SHOWN: usize = 50;

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().take(SHOWN).enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        if self.0.len() > SHOWN {
            writeln!(f, "\n… and {} more not shown", self.0.len() - SHOWN)?;
        }
        if self.0.len() > 1 {
            writeln!(f, "\n{} errors; nothing was run or written", self.0.len())?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

impl From<Diagnostic> for Diagnostics {
    fn from(d: Diagnostic) -> Self {
        Diagnostics(vec![d])
    }
}

/// Suggests the closest of `candidates` to `word`, if one is close enough to be a typo.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A variable's name is what a shell sets, also when the origin says which argument of it
    /// set the value.
    #[test]
    fn an_env_origin_names_its_variable() {
        let of = |var: &str| Origin::Env { var: var.into() };
        assert_eq!(
            of("UNSTEP_EXTRA_ARGS (--clean-sigma-override)").env_var(),
            Some("UNSTEP_EXTRA_ARGS")
        );
        assert_eq!(of("PROMPT_INDICES").env_var(), Some("PROMPT_INDICES"));
        assert_eq!(Origin::Default.env_var(), None);
    }
}

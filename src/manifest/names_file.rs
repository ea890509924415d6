//! `prompts.names_file`: the standard prompt of every line of the prompt file, read and checked
//! against it when the manifest loads, and the evaluation settings that depend on it.

use std::path::Path;

use super::checks::{Lookup, at_key};
use super::diagnostic::{Diagnostic, display_path};
use super::inputs;
use super::settings::{Kind, Manifest};

/// Reads the names file at `path`. A missing file is a warning (`runner plan` works without it;
/// `runner apply` refuses); one that is not a prompt-style file, or whose line count differs
/// from the prompt file's `prompts` lines, is an error at `prompts.names_file`.
pub(super) fn read(
    path: &Path,
    prompts: Option<usize>,
    warnings: &mut Vec<String>,
    errors: &mut Vec<Diagnostic>,
    lookup: &Lookup<'_>,
) -> Option<Vec<String>> {
    let read = inputs::read_text_file(path, inputs::PROMPTS_LIMIT, "names file");
    if read == Err(inputs::TextFileError::Missing) {
        warnings.push(format!(
            "names file {} does not exist; `runner apply` needs it (see docs/vbench.md)",
            display_path(path)
        ));
        return None;
    }
    let names = read
        .map_err(inputs::PromptFileError::from)
        .and_then(|text| inputs::parse_prompt_file(&text));
    let error = |message: String, hint: &str| {
        at_key(
            Diagnostic::new(format!("names file {} {message}", display_path(path)))
                .hint(hint.to_string()),
            "prompts.names_file",
            lookup,
        )
    };
    match names {
        Err(e) => {
            errors.push(error(
                e.to_string(),
                "one standard prompt per line, UTF-8 (see docs/vbench.md)",
            ));
            None
        }
        Ok(names) => match prompts {
            Some(n) if n != names.len() => {
                errors.push(error(
                    format!(
                        "has {} lines and the prompt file has {n}; line i of the names file is \
                         the standard prompt of line i of the prompt file",
                        names.len()
                    ),
                    "use the standard prompt list in the same order as the prompt file (for \
                     VBench: prompts/all_dimension.txt)",
                ));
                None
            }
            _ => Some(names),
        },
    }
}

/// The evaluation command's placeholders must have something to stand for.
pub(super) fn check_evaluation(m: &Manifest, lookup: &Lookup<'_>, errors: &mut Vec<Diagnostic>) {
    let Some(command) = &m.evaluation.command else {
        return;
    };
    let mut fail = |message: &str, hint: &str| {
        errors.push(at_key(
            Diagnostic::new(message.to_string()).hint(hint.to_string()),
            "evaluation.command",
            lookup,
        ));
    };
    if m.kind == Kind::Probe {
        fail(
            "a probe is not evaluated: the evaluation runs after a complete generation",
            "remove [evaluation], or make this a generation (kind = \"generation\")",
        );
    }
    if command.uses("names_file") && m.prompts.names_file.is_none() {
        fail(
            "the evaluation command uses {names_file}, and prompts.names_file is not set",
            "set prompts.names_file, or remove {names_file} from the command",
        );
    }
    if command.uses("dimensions") && m.evaluation.dimensions.0.is_empty() {
        fail(
            "the evaluation command uses {dimensions}, and evaluation.dimensions is empty",
            "list the dimensions to score in evaluation.dimensions",
        );
    }
    if command.uses("scores_file") && m.evaluation.scores_file.is_pattern() {
        fail(
            "the evaluation command uses {scores_file}, and evaluation.scores_file is a pattern \
             (it names no one file)",
            "pass the folder instead ({eval_dir}/…), or give scores_file without `*`",
        );
    }
}

//! `runner prompts BUNDLE FILE`: how the bundle's tokenizer reads each prompt of a prompt file,
//! as a run would encode it: its token count (`</s>` included), whether it was cut at the
//! bundle's `text_len`, and its ids.

use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use super::out;
use crate::engine::{Bundle, BundleError, PromptTokenizer};
use crate::exit;
use crate::manifest::diagnostic::display_path;
use crate::manifest::inputs::read_prompt_file;

#[derive(Debug, Args)]
pub struct PromptsArgs {
    /// The asset bundle: a directory, or a .zip of one.
    pub bundle: PathBuf,
    /// The prompt file: one prompt per line, as `prompts.file` (blank lines are not prompts).
    pub file: PathBuf,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// `--json`'s document.
#[derive(Debug, Serialize)]
struct PromptsReport {
    bundle: String,
    tokenizer: &'static str,
    text_len: usize,
    prompts: Vec<PromptEntry>,
    /// How many prompts were cut at `text_len`.
    truncated: usize,
    /// The prompts that look like mojibake the reference pipeline would repair first.
    mojibake: Vec<usize>,
}

#[derive(Debug, Serialize)]
struct PromptEntry {
    index: usize,
    /// The prompt's tokens, `</s>` included, padding not.
    tokens: usize,
    truncated: bool,
    mojibake: bool,
    ids: Vec<i64>,
}

pub fn run(args: &PromptsArgs) -> i32 {
    let tokenizer = match open_tokenizer(&args.bundle) {
        Ok(t) => t,
        Err(e) => {
            crate::say!("error: bundle {}: {e}", display_path(&args.bundle));
            return exit::USAGE;
        }
    };
    let prompts = match read_prompt_file(&args.file) {
        Ok(prompts) => prompts,
        Err(e) => {
            return exit::report(&exit::Plain {
                message: format!("prompt file {} {e}", display_path(&args.file)),
                hint: Some("give a UTF-8 file with one prompt per line".into()),
                code: exit::USAGE,
            });
        }
    };
    let mut entries = Vec::new();
    for (index, prompt) in prompts.iter().enumerate() {
        match tokenizer.encode(prompt) {
            Ok(tokens) => entries.push(PromptEntry {
                index,
                tokens: tokens.len,
                truncated: tokens.truncated,
                mojibake: tokens.mojibake,
                ids: tokens.prompt_ids().to_vec(),
            }),
            Err(e) => {
                crate::say!("error: prompt {index}: {e}");
                return exit::FAILURE;
            }
        }
    }
    let report = PromptsReport {
        bundle: display_path(&args.bundle),
        tokenizer: tokenizer.kind(),
        text_len: tokenizer.text_len(),
        truncated: entries.iter().filter(|e| e.truncated).count(),
        mojibake: entries
            .iter()
            .filter(|e| e.mojibake)
            .map(|e| e.index)
            .collect(),
        prompts: entries,
    };
    for index in &report.mojibake {
        crate::say!(
            "warning: prompt {index} looks like mojibake (UTF-8 read as Latin-1 or Windows-1252): \
             the reference pipeline's ftfy repairs such text before tokenizing and this runner \
             does not, so its tokens may differ"
        );
    }
    if args.json {
        let mut text = serde_json::to_string(&report).expect("the report serialises");
        text.push('\n');
        return out(&text);
    }
    out(&render(&report))
}

/// The bundle's tokenizer, read and checked. A directory's other files are not hashed (its
/// graphs may be gigabytes); a `.zip` is unpacked and checked whole.
fn open_tokenizer(path: &Path) -> Result<std::sync::Arc<PromptTokenizer>, BundleError> {
    let bundle = if path.is_dir() {
        Bundle::peek(path)?
    } else {
        Bundle::open(path, &std::env::temp_dir().join("unstep-prompts-unpack"))?
    };
    bundle.tokenizer()
}

/// One line per prompt (index, token count, `truncated`, ids), then the count of truncated
/// prompts.
fn render(report: &PromptsReport) -> String {
    let last = report.prompts.len().saturating_sub(1);
    let index_width = last.to_string().len();
    let count_width = report.text_len.to_string().len();
    let mut text = String::new();
    for p in &report.prompts {
        let ids: Vec<String> = p.ids.iter().map(i64::to_string).collect();
        let cut = if p.truncated { "truncated" } else { "" };
        text.push_str(&format!(
            "{:>index_width$}  {:>count_width$} tokens  {cut:<9}  {}\n",
            p.index,
            p.tokens,
            ids.join(" ")
        ));
    }
    let plural = if report.prompts.len() == 1 { "" } else { "s" };
    text.push_str(&format!(
        "{} prompt{plural}, {} truncated at text_len {} ({} tokenizer of {})\n",
        report.prompts.len(),
        report.truncated,
        report.text_len,
        report.tokenizer,
        report.bundle
    ));
    text
}

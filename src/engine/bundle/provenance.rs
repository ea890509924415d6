//! The tables of `bundle.toml` that say where a bundle's weights and prompt tokenizer come from
//! (`[tokenizer]`, `[text_encoder]`, `[weights]`, exporter 0.13.0 and later), and their checks.

use serde::Deserialize;

use super::Precision;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    /// UTF-8 bytes + 1, 0 = padding, truncated to `text_len`.
    Bytes,
    /// A UMT5 `tokenizer.json` in the bundle, with the reference pipeline's cleaning.
    Umt5,
}

impl TokenizerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenizerKind::Bytes => "bytes",
            TokenizerKind::Umt5 => "umt5",
        }
    }
}

/// How a prompt is cleaned before it is tokenized (`[tokenizer] clean`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptCleaning {
    /// Wan2.1's `clean='whitespace'`: ftfy's fixes, HTML unescaping, whitespace runs to one
    /// space, stripped.
    Whitespace,
}

/// `[tokenizer]`: `kind = "bytes"` alone, or `umt5` with its file and cleaning.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerSection {
    pub kind: TokenizerKind,
    /// The tokenizer.json, relative to the bundle and listed in `[files]` (umt5 only).
    #[serde(default)]
    pub file: Option<String>,
    #[serde(default)]
    pub clean: Option<PromptCleaning>,
}

/// `[text_encoder]` (exporter 0.13.0 and later).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextEncoderSection {
    pub layers: usize,
    /// Rows of the token embedding: every token id must be below it.
    pub vocab: usize,
    /// What the encoder graph computes in; its `context` output is in the bundle's precision.
    pub precision: Precision,
}

/// Where a part's weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightSource {
    /// Read from a released checkpoint.
    Released,
    /// Seeded random weights.
    Random,
}

impl WeightSource {
    pub fn as_str(self) -> &'static str {
        match self {
            WeightSource::Released => "released",
            WeightSource::Random => "random",
        }
    }
}

/// `[weights.dit]`, `[weights.vae]`, `[weights.text_encoder]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartWeights {
    pub source: WeightSource,
    /// Released only: the checkpoint's file name as the user gave it.
    #[serde(default)]
    pub file: Option<String>,
    /// Released only: the checkpoint's sha256.
    #[serde(default)]
    pub sha256: Option<String>,
    /// The DiT only, released only: the checkpoint's entry that holds the weights.
    #[serde(default)]
    pub entry: Option<String>,
    /// Random only.
    #[serde(default)]
    pub seed: Option<u64>,
}

/// Where a umt5 bundle's tokenizer.json came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerSource {
    /// From a released Wan2.1 folder.
    Released,
    /// A file given on its own.
    File,
}

impl TokenizerSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenizerSource::Released => "released",
            TokenizerSource::File => "file",
        }
    }
}

/// `[weights.tokenizer]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerWeights {
    pub source: TokenizerSource,
    pub file: String,
    pub sha256: String,
}

/// `[weights]` (exporter 0.13.0 and later); a bundle without it has seeded random weights.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightsSection {
    #[serde(default)]
    pub dit: Option<PartWeights>,
    #[serde(default)]
    pub vae: Option<PartWeights>,
    #[serde(default)]
    pub text_encoder: Option<PartWeights>,
    #[serde(default)]
    pub tokenizer: Option<TokenizerWeights>,
}

/// The weights of a whole bundle, in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightsSummary {
    Released,
    Random,
    Mixed,
}

impl WeightsSummary {
    pub fn as_str(self) -> &'static str {
        match self {
            WeightsSummary::Released => "released",
            WeightsSummary::Random => "random",
            WeightsSummary::Mixed => "mixed",
        }
    }
}

impl WeightsSection {
    /// The sources of the DiT, the VAE and the text encoder, in that order; a part without a
    /// table has seeded random weights (the exporter wrote none before 0.13.0).
    pub fn sources(&self) -> [(&'static str, WeightSource); 3] {
        let source =
            |p: &Option<PartWeights>| p.as_ref().map_or(WeightSource::Random, |p| p.source);
        [
            ("dit", source(&self.dit)),
            ("vae", source(&self.vae)),
            ("text_encoder", source(&self.text_encoder)),
        ]
    }

    /// Released when every part is, random when every part is, mixed otherwise.
    pub fn summary(&self) -> WeightsSummary {
        let sources = self.sources().map(|(_, s)| s);
        if sources.iter().all(|&s| s == WeightSource::Released) {
            WeightsSummary::Released
        } else if sources.iter().all(|&s| s == WeightSource::Random) {
            WeightsSummary::Random
        } else {
            WeightsSummary::Mixed
        }
    }
}

/// Why a bundle's `[weights]` tables do not fit their sources (`table`: `[weights.<part>]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum WeightsTableError {
    #[error("{table} source = \"released\" needs its file")]
    ReleasedWithoutFile { table: String },
    #[error("{table} source = \"released\" needs the file's sha256 (64 hex digits)")]
    ReleasedWithoutSha256 { table: String },
    #[error("{table} source = \"released\" takes no seed")]
    ReleasedWithSeed { table: String },
    #[error("{table} source = \"random\" takes no file, sha256 or entry")]
    RandomWithFile { table: String },
    #[error("{table} takes no entry (only the DiT's checkpoint has entries)")]
    EntryNotDit { table: String },
    #[error("[weights.tokenizer] belongs to a umt5 tokenizer only")]
    TokenizerNotUmt5,
    #[error("[weights.tokenizer] sha256 must be 64 hex digits")]
    TokenizerSha256,
}

/// `[weights]`: a released part names its file and sha256 and has no seed, a random part names
/// no file; only the DiT has an entry, and only a umt5 bundle a tokenizer.
pub(super) fn check_weights(
    weights: &WeightsSection,
    tokenizer: TokenizerKind,
) -> Result<(), WeightsTableError> {
    let parts = [
        ("dit", &weights.dit),
        ("vae", &weights.vae),
        ("text_encoder", &weights.text_encoder),
    ];
    for (part, w) in parts {
        let Some(w) = w else { continue };
        let table = format!("[weights.{part}]");
        match w.source {
            WeightSource::Released => {
                if w.file.is_none() {
                    return Err(WeightsTableError::ReleasedWithoutFile { table });
                }
                match &w.sha256 {
                    Some(hash) if is_sha256(hash) => {}
                    _ => return Err(WeightsTableError::ReleasedWithoutSha256 { table }),
                }
                if w.seed.is_some() {
                    return Err(WeightsTableError::ReleasedWithSeed { table });
                }
            }
            WeightSource::Random => {
                if w.file.is_some() || w.sha256.is_some() || w.entry.is_some() {
                    return Err(WeightsTableError::RandomWithFile { table });
                }
            }
        }
        if part != "dit" && w.entry.is_some() {
            return Err(WeightsTableError::EntryNotDit { table });
        }
    }
    if let Some(t) = &weights.tokenizer {
        if tokenizer != TokenizerKind::Umt5 {
            return Err(WeightsTableError::TokenizerNotUmt5);
        }
        if !is_sha256(&t.sha256) {
            return Err(WeightsTableError::TokenizerSha256);
        }
    }
    Ok(())
}

fn is_sha256(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())
}

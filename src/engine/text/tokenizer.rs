//! A bundle's prompt tokenizer: prompt text to the text encoder's `input_ids` and
//! `attention_mask`, `text_len` of each.
//!
//! `umt5` follows the reference pipeline (Wan2.1's `HuggingfaceTokenizer` with
//! `clean='whitespace'`, `assets/export/unstep_export/tokenizer.py`): clean the prompt
//! ([`super::clean_whitespace`]), tokenize it with `tokenizer.json` and its special tokens (the
//! post-processor appends `</s>`), truncate to `text_len` tokens keeping `</s>`, pad with
//! `<pad>`. Like transformers' T5 tokenizer, which the reference loads the file through,
//! `</s>`, `<unk>` and `<pad>` are registered as special tokens, so that a prompt that spells one
//! of them gets its id. A tokenizer folder's `special_tokens_map.json` could name more; a bundle
//! carries `tokenizer.json` alone, so only these three are registered.

use std::fmt;
use std::path::{Path, PathBuf};

use tokenizers::{AddedToken, ModelWrapper, Tokenizer, TruncationParams};

use super::clean::clean_whitespace;

/// The special tokens the reference's tokenizer registers (T5's end, unknown and padding).
const SPECIAL_TOKENS: [&str; 3] = ["</s>", "<unk>", "<pad>"];

/// The ids the `bytes` tokenizer gives: one per UTF-8 byte, 1 to 256.
pub const BYTES_VOCAB: usize = 257;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(
        "cannot read {} as a tokenizers tokenizer.json: {message}; export the bundle again with google/umt5-xxl's tokenizer.json",
        .path.display()
    )]
    Parse { path: PathBuf, message: String },
    #[error(
        "{} is a {model} tokenizer, but a umt5 bundle's tokenizer.json is the Unigram model of google/umt5-xxl; export the bundle again with that tokenizer.json (`--wan-dir` or `--tokenizer`)",
        .path.display()
    )]
    NotUnigram { path: PathBuf, model: &'static str },
    #[error(
        "{} has no `{token}` token, which {role}; export the bundle again with google/umt5-xxl's tokenizer.json",
        .path.display()
    )]
    MissingToken {
        path: PathBuf,
        token: &'static str,
        role: &'static str,
    },
    #[error(
        "{} gives token ids up to {max_id}, but the text encoder has {vocab} embedding rows ([text_encoder] vocab); export the bundle again with this tokenizer",
        .path.display()
    )]
    BeyondVocab {
        path: PathBuf,
        max_id: u64,
        vocab: usize,
    },
    #[error("set up {} for text_len {text_len}: {message}", .path.display())]
    Truncation {
        path: PathBuf,
        text_len: usize,
        message: String,
    },
    #[error("tokenize a prompt with {}: {message}", .path.display())]
    Encode { path: PathBuf, message: String },
}

/// One prompt's tokens, `text_len` of them with the padding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptTokens {
    /// Token ids, padded to `text_len`.
    pub ids: Vec<i64>,
    /// 1 for the prompt's tokens, 0 for the padding.
    pub mask: Vec<i64>,
    /// How many of `ids` are the prompt's (`</s>` included); the rest is padding.
    pub len: usize,
    /// The prompt had more tokens than `text_len` and was cut.
    pub truncated: bool,
    /// The prompt looked like mojibake that the reference's ftfy repairs before tokenizing and
    /// this cleaning does not (`super::ftfy` module doc), so its tokens may differ.
    pub mojibake: bool,
}

impl PromptTokens {
    /// The prompt's own ids, without the padding.
    pub fn prompt_ids(&self) -> &[i64] {
        &self.ids[..self.len]
    }

    fn padded(prompt_ids: impl Iterator<Item = i64>, text_len: usize, pad: i64) -> Self {
        let mut ids: Vec<i64> = prompt_ids.take(text_len).collect();
        let len = ids.len();
        ids.resize(text_len, pad);
        let mut mask = vec![1; len];
        mask.resize(text_len, 0);
        Self {
            ids,
            mask,
            len,
            truncated: false,
            mojibake: false,
        }
    }
}

/// The tokenizer a bundle's `[tokenizer]` names.
#[derive(Debug, Clone)]
pub enum PromptTokenizer {
    /// UTF-8 bytes + 1, 0 = padding, truncated to `text_len` (the tiny and older bundles).
    Bytes { text_len: usize },
    /// The UMT5 `tokenizer.json` with the reference pipeline's cleaning.
    Umt5(Box<Umt5Tokenizer>),
}

impl PromptTokenizer {
    /// `bundle.toml`'s name of this kind.
    pub fn kind(&self) -> &'static str {
        match self {
            PromptTokenizer::Bytes { .. } => "bytes",
            PromptTokenizer::Umt5(_) => "umt5",
        }
    }

    pub fn text_len(&self) -> usize {
        match self {
            PromptTokenizer::Bytes { text_len } => *text_len,
            PromptTokenizer::Umt5(t) => t.text_len,
        }
    }

    pub fn encode(&self, prompt: &str) -> Result<PromptTokens, TokenizerError> {
        match self {
            PromptTokenizer::Bytes { text_len } => Ok(byte_tokens(prompt, *text_len)),
            PromptTokenizer::Umt5(t) => t.encode(prompt),
        }
    }
}

/// Tokens of the `bytes` tokenizer: UTF-8 bytes + 1, 0 = padding, truncated to `text_len`.
pub fn byte_tokens(prompt: &str, text_len: usize) -> PromptTokens {
    let bytes = prompt.as_bytes();
    let mut tokens = PromptTokens::padded(bytes.iter().map(|&b| i64::from(b) + 1), text_len, 0);
    tokens.truncated = bytes.len() > text_len;
    tokens
}

/// A checked UMT5 `tokenizer.json`, set up to truncate at `text_len`.
#[derive(Clone)]
pub struct Umt5Tokenizer {
    path: PathBuf,
    tokenizer: Tokenizer,
    pad_id: u32,
    text_len: usize,
    /// One past the largest id the vocabulary has.
    id_bound: u64,
}

impl fmt::Debug for Umt5Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Umt5Tokenizer")
            .field("path", &self.path)
            .field("text_len", &self.text_len)
            .field("id_bound", &self.id_bound)
            .finish_non_exhaustive()
    }
}

impl Umt5Tokenizer {
    /// Reads and checks `json`, the text of the tokenizer.json at `path`: a Unigram model with
    /// `<pad>` and `</s>`, and with `vocab` given (the text encoder's embedding rows), no id the
    /// vocabulary has at `vocab` or beyond.
    pub fn from_json(
        path: &Path,
        json: &str,
        text_len: usize,
        vocab: Option<usize>,
    ) -> Result<Self, TokenizerError> {
        let path = path.to_path_buf();
        let mut tokenizer: Tokenizer = json.parse().map_err(|e| TokenizerError::Parse {
            path: path.clone(),
            message: error_text(&e),
        })?;
        let model = match tokenizer.get_model() {
            ModelWrapper::Unigram(_) => None,
            ModelWrapper::BPE(_) => Some("BPE"),
            ModelWrapper::WordPiece(_) => Some("WordPiece"),
            ModelWrapper::WordLevel(_) => Some("WordLevel"),
        };
        if let Some(model) = model {
            return Err(TokenizerError::NotUnigram { path, model });
        }
        let id = |token: &'static str, role: &'static str| {
            tokenizer
                .token_to_id(token)
                .ok_or_else(|| TokenizerError::MissingToken {
                    path: path.clone(),
                    token,
                    role,
                })
        };
        let pad_id = id("<pad>", "the prompts are padded with")?;
        id("</s>", "ends every prompt")?;
        let added: Vec<String> = tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .map(|t| t.content)
            .collect();
        let special: Vec<AddedToken> = SPECIAL_TOKENS
            .into_iter()
            .filter(|t| !added.iter().any(|a| a == t) && tokenizer.token_to_id(t).is_some())
            .map(|t| AddedToken::from(t, true).normalized(false))
            .collect();
        if !special.is_empty() {
            tokenizer
                .add_special_tokens(special)
                .map_err(|e| TokenizerError::Parse {
                    path: path.clone(),
                    message: error_text(&e),
                })?;
        }
        let id_bound = tokenizer
            .get_vocab(true)
            .into_values()
            .max()
            .map_or(0, |max| u64::from(max) + 1);
        if let Some(vocab) = vocab
            && id_bound > vocab as u64
        {
            return Err(TokenizerError::BeyondVocab {
                path,
                max_id: id_bound - 1,
                vocab,
            });
        }
        let truncation = TruncationParams {
            max_length: text_len,
            ..TruncationParams::default()
        };
        tokenizer
            .with_truncation(Some(truncation))
            .map_err(|e| TokenizerError::Truncation {
                path: path.clone(),
                text_len,
                message: error_text(&e),
            })?;
        Ok(Self {
            path,
            tokenizer,
            pad_id,
            text_len,
            id_bound,
        })
    }

    /// One past the largest token id this tokenizer can give.
    pub fn id_bound(&self) -> u64 {
        self.id_bound
    }

    pub fn encode(&self, prompt: &str) -> Result<PromptTokens, TokenizerError> {
        let cleaned = clean_whitespace(prompt);
        let encoding = self
            .tokenizer
            .encode(cleaned.text.as_str(), true)
            .map_err(|e| TokenizerError::Encode {
                path: self.path.clone(),
                message: error_text(&e),
            })?;
        let ids = encoding.get_ids().iter().map(|&id| i64::from(id));
        let mut tokens = PromptTokens::padded(ids, self.text_len, i64::from(self.pad_id));
        tokens.truncated = !encoding.get_overflowing().is_empty();
        tokens.mojibake = cleaned.mojibake;
        Ok(tokens)
    }
}

/// A `tokenizers` error as one line.
fn error_text(e: &impl fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_tokenizer(text_len: usize) -> Umt5Tokenizer {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/tokenizer/tokenizer.json");
        let json = std::fs::read_to_string(&path).unwrap();
        Umt5Tokenizer::from_json(&path, &json, text_len, None).unwrap()
    }

    #[test]
    fn byte_tokens_shift_pad_and_truncate() {
        let t = byte_tokens("ab", 4);
        assert_eq!(t.ids, [98, 99, 0, 0]);
        assert_eq!(t.mask, [1, 1, 0, 0]);
        assert_eq!((t.len, t.truncated), (2, false));
        let t = byte_tokens("héllo", 3);
        assert_eq!(t.ids, [105, 0xc3 + 1, 0xa9 + 1]);
        assert_eq!(t.mask, [1, 1, 1]);
        assert_eq!((t.len, t.truncated), (3, true));
    }

    /// Every prompt ends with `</s>` (id 1), also when it is cut, and is padded with `<pad>`
    /// (id 0) behind a mask of its length.
    #[test]
    fn umt5_tokens_end_with_the_end_token_and_are_padded() {
        let tokenizer = test_tokenizer(8);
        let short = tokenizer.encode("a cat").unwrap();
        assert!(!short.truncated);
        assert_eq!(short.prompt_ids().last(), Some(&1));
        assert!(short.ids[short.len..].iter().all(|&id| id == 0));
        assert_eq!(short.mask.iter().sum::<i64>() as usize, short.len);
        let long = tokenizer
            .encode("a cat sits on a mat in the warm light of the evening sun")
            .unwrap();
        assert!(long.truncated);
        assert_eq!(long.len, 8);
        assert_eq!(long.ids[7], 1);
        let empty = tokenizer.encode("  \t ").unwrap();
        assert_eq!(empty.prompt_ids(), [1]);
    }

    /// The special tokens are matched as a whole in the prompt's text, as the reference's
    /// T5 tokenizer does, `<unk>` (not an added token of the file) included.
    #[test]
    fn special_tokens_in_a_prompt_get_their_ids() {
        let tokens = test_tokenizer(16).encode("<unk></s><pad>").unwrap();
        assert_eq!(tokens.prompt_ids(), [2, 1, 0, 1]);
    }
}

//! Prompt text to the text encoder's inputs: the reference pipeline's prompt cleaning
//! ([`clean`]: ftfy's fixes, HTML unescaping and whitespace, as Python does them) and the bundle's
//! tokenizer ([`tokenizer`]). Nothing here touches ONNX Runtime.

pub mod clean;
pub mod ftfy;
pub mod html;
mod tables;
pub mod tokenizer;

pub use clean::{Cleaned, clean_whitespace};
pub use tokenizer::{PromptTokenizer, PromptTokens, TokenizerError, Umt5Tokenizer};

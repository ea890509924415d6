//! The reference pipeline's prompt cleaning for `clean = "whitespace"` (Wan2.1's
//! `HuggingfaceTokenizer`): `whitespace_clean(basic_clean(text))`, with Python's notion of
//! whitespace (`str.isspace`, which `\s` in its `re` and `str.strip` share), not Rust's.

use super::ftfy;
use super::html;
use super::tables::is_py_space;

/// A cleaned prompt, and whether its text looked like mojibake that the reference's ftfy would
/// have tried to repair ([`ftfy::looks_like_mojibake`]), which this cleaning does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cleaned {
    pub text: String,
    pub mojibake: bool,
}

/// `whitespace_clean(basic_clean(text))`.
pub fn clean_whitespace(text: &str) -> Cleaned {
    let basic = basic_clean(text);
    Cleaned {
        text: whitespace_clean(&basic.text),
        mojibake: basic.mojibake,
    }
}

/// `basic_clean`: `ftfy.fix_text`, `html.unescape` twice, then `strip()`; with whether ftfy's
/// mojibake repair would have looked at it.
pub fn basic_clean(text: &str) -> Cleaned {
    let fixed = ftfy::fix_text(text);
    let text = html::unescape(&html::unescape(&fixed.text));
    Cleaned {
        text: py_strip(&text).to_string(),
        mojibake: fixed.mojibake,
    }
}

/// `whitespace_clean`: `re.sub(r"\s+", " ", text).strip()`.
pub fn whitespace_clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_space = false;
    for c in text.chars() {
        if is_py_space(c) {
            if !in_space {
                out.push(' ');
            }
            in_space = true;
        } else {
            out.push(c);
            in_space = false;
        }
    }
    py_strip(&out).to_string()
}

/// Python's `str.strip()` without arguments.
pub fn py_strip(text: &str) -> &str {
    text.trim_matches(is_py_space)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python's whitespace includes the information separators U+001C to U+001F, which Rust's
    /// `char::is_whitespace` does not, and excludes U+200B, like Rust.
    #[test]
    fn whitespace_is_python_s() {
        for c in [
            '\t', '\n', '\x0b', '\x0c', '\r', '\x1c', '\x1f', '\u{85}', '\u{a0}', '\u{3000}',
        ] {
            assert!(is_py_space(c), "{c:?}");
        }
        for c in ['a', '\u{200b}', '\u{180e}', '\x00'] {
            assert!(!is_py_space(c), "{c:?}");
        }
        assert_eq!(whitespace_clean("\x1c a \t\u{2028} b\u{3000}"), "a b");
    }

    /// Values taken from the reference's `clean` (unstep_export.tokenizer).
    #[test]
    fn cleaning_follows_the_reference() {
        let cases = [
            ("  a  cat\t on\n a mat  ", "a cat on a mat"),
            ("&amp;amp;amp;", "&"),
            ("Tom &amp; Jerry&nbsp;&nbsp;run", "Tom & Jerry run"),
            ("<i>&amp;amp;</i>", "<i>&</i>"),
            ("\u{201c}Quoted\u{201d} \u{fb01}ne", "\"Quoted\" fine"),
            ("\u{ff21}\u{ff22}\u{3000}\u{ff23}", "AB C"),
            ("a\x0bb\x1cc", "abc"),
            ("", ""),
        ];
        for (input, expected) in cases {
            assert_eq!(clean_whitespace(input).text, expected, "{input:?}");
        }
    }
}

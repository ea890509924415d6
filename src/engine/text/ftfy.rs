//! ftfy 6.3.1's `fix_text` with its default configuration, as the reference pipeline calls it on
//! every prompt, without its mojibake repair.
//!
//! The text is fixed in segments (each line with its `\n`, and at most a million code points),
//! and each segment is fixed again until it no longer changes, as ftfy does. One pass applies,
//! in ftfy's order: HTML entities (ftfy's own rules, and only while no segment so far has had a
//! `<`), C1 control characters as Windows-1252, Latin ligatures, halfwidth and fullwidth forms,
//! curly quotes, line breaks, terminal escapes, control characters, then NFC.
//!
//! Not done here:
//! - ftfy's `fix_encoding` (with `restore_byte_a0`, `replace_lossy_sequences` and
//!   `decode_inconsistent_utf8`), which re-decodes text that looks like mojibake (UTF-8 decoded
//!   in a single-byte encoding) and runs before the other fixes. Its trigger is a large heuristic
//!   of character sequences; [`looks_like_mojibake`] finds its plain cases (UTF-8 sequences read
//!   as Latin-1 or Windows-1252, also with a lost continuation byte or no-break space) so that a
//!   caller can warn about the prompt. Mojibake of the other single-byte encodings ftfy tries
//!   (Windows-1250/1251/1253/1254/1257, ISO 8859-2, MacRoman, CP437) goes unnoticed, and so does
//!   a repair that ftfy's heuristic starts from another part of the text: their tokens can
//!   differ from the reference's.
//! - `fix_surrogates`: a Rust string holds no surrogate code points.
//! - NFC comes from the `unicode-normalization` crate, whose Unicode version is newer than
//!   Python 3.11's 14.0: a character assigned since then with a canonical decomposition (a few
//!   scripts' vowel signs) composes here but not in the reference.

use unicode_normalization::UnicodeNormalization;

use super::html::ftfy_unescape;
use super::tables::ftfy_chars::{C1_WINDOWS_1252, CONTROL_CHARS, LIGATURES, WIDTH_MAP};
use super::tables::python_chars::PY_DECIMAL;

/// ftfy's `max_decode_length`: the longest segment it fixes at once, in code points.
const MAX_SEGMENT: usize = 1_000_000;

/// What [`fix_text`] made of a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixed {
    pub text: String,
    /// Some pass met text that [`looks_like_mojibake`], where ftfy would have tried its repair.
    pub mojibake: bool,
}

/// `ftfy.fix_text(text)` with the default configuration, less the mojibake repair (module doc).
pub fn fix_text(text: &str) -> Fixed {
    let mut out = String::with_capacity(text.len());
    let mut mojibake = false;
    // ftfy turns HTML unescaping off for the segment that has a `<` and every one after it.
    let mut unescape_html = true;
    for segment in segments(text) {
        if segment.contains('<') {
            unescape_html = false;
        }
        let fixed = fix_segment(segment, unescape_html);
        out.push_str(&fixed.text);
        mojibake |= fixed.mojibake;
    }
    Fixed {
        text: out,
        mojibake,
    }
}

/// The text cut after each `\n`, and after a million code points without one.
fn segments(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut end = rest.len();
        for (count, (i, c)) in rest.char_indices().enumerate() {
            if count == MAX_SEGMENT {
                end = i;
                break;
            }
            if c == '\n' {
                end = i + 1;
                break;
            }
        }
        let (segment, tail) = rest.split_at(end);
        rest = tail;
        Some(segment)
    })
}

/// ftfy's `fix_and_explain` on one segment: the passes until the text stops changing.
fn fix_segment(segment: &str, unescape_html: bool) -> Fixed {
    let mut text = segment.to_string();
    let mut mojibake = false;
    loop {
        let before = text.clone();
        if unescape_html {
            text = ftfy_unescape(&text);
        }
        // Where ftfy's `fix_encoding` runs.
        mojibake |= looks_like_mojibake(&text);
        text = map_chars(&text, c1_control);
        text = map_chars(&text, latin_ligature);
        text = map_chars(&text, standard_width);
        text = map_chars(&text, straight_quote);
        text = fix_line_breaks(&text);
        text = remove_terminal_escapes(&text);
        text.retain(|c| CONTROL_CHARS.binary_search(&c).is_err());
        text = text.nfc().collect();
        if text == before {
            return Fixed { text, mojibake };
        }
    }
}

/// Replaces each character that `map` maps, as Python's `str.translate` does.
fn map_chars(text: &str, map: impl Fn(char) -> Option<Replacement>) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match map(c) {
            Some(Replacement::Char(r)) => out.push(r),
            Some(Replacement::Str(r)) => out.push_str(r),
            None => out.push(c),
        }
    }
    out
}

enum Replacement {
    Char(char),
    Str(&'static str),
}

/// `fix_c1_controls`: U+0080 to U+009F as the Windows-1252 byte of the same value.
fn c1_control(c: char) -> Option<Replacement> {
    let offset = (c as u32).checked_sub(0x80)?;
    C1_WINDOWS_1252
        .get(offset as usize)
        .map(|&r| Replacement::Char(r))
}

/// `fix_latin_ligatures`.
fn latin_ligature(c: char) -> Option<Replacement> {
    lookup(&LIGATURES, c).map(Replacement::Str)
}

/// `fix_character_width`: the ideographic space and the halfwidth and fullwidth forms.
fn standard_width(c: char) -> Option<Replacement> {
    lookup(&WIDTH_MAP, c).map(Replacement::Str)
}

/// `uncurl_quotes`: U+02BC and U+2018 to U+201B become `'`, U+201C to U+201F `"`.
fn straight_quote(c: char) -> Option<Replacement> {
    match c {
        '\u{2bc}' | '\u{2018}'..='\u{201b}' => Some(Replacement::Char('\'')),
        '\u{201c}'..='\u{201f}' => Some(Replacement::Char('"')),
        _ => None,
    }
}

fn lookup(table: &[(char, &'static str)], c: char) -> Option<&'static str> {
    table
        .binary_search_by_key(&c, |&(k, _)| k)
        .ok()
        .map(|i| table[i].1)
}

/// `fix_line_breaks`: CRLF, CR, U+2028, U+2029 and U+0085 become `\n`.
fn fix_line_breaks(text: &str) -> String {
    text.replace("\r\n", "\n")
        .replace(['\r', '\u{2028}', '\u{2029}', '\u{85}'], "\n")
}

/// `remove_terminal_escapes`: every `ESC [`, then decimal digits (Python's `\d`: any Nd) and
/// `;`, then an ASCII letter, is removed.
fn remove_terminal_escapes(text: &str) -> String {
    if !text.contains('\x1b') {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("\x1b[") {
        let params = &rest[at + 2..];
        let digits_end = params
            .char_indices()
            .find(|&(_, c)| !(c == ';' || is_py_decimal(c)))
            .map_or(params.len(), |(i, _)| i);
        match params[digits_end..].chars().next() {
            Some(c) if c.is_ascii_alphabetic() => {
                out.push_str(&rest[..at]);
                rest = &params[digits_end + 1..];
            }
            _ => {
                out.push_str(&rest[..at + 1]);
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn is_py_decimal(c: char) -> bool {
    PY_DECIMAL
        .binary_search_by(|&(first, last)| {
            if c < first {
                std::cmp::Ordering::Greater
            } else if c > last {
                std::cmp::Ordering::Less
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// Whether `text` has a character sequence that is UTF-8 read as Latin-1 or Windows-1252 (`Ã©`
/// for `é`): the plain cases of the mojibake that ftfy's `fix_encoding` repairs and [`fix_text`]
/// leaves as it is. Besides whole sequences, two damaged forms ftfy also repairs count: a
/// replacement character where a continuation byte was lost (`É�`), and `Ã` or `Â` with a space
/// where its no-break space became one (at the start or after a lowercase letter, as ftfy's
/// heuristic asks). ftfy repairs a sequence only when its heuristic also finds the text unlikely;
/// this looks at the sequence alone, so it can flag text that ftfy leaves alone.
pub fn looks_like_mojibake(text: &str) -> bool {
    if text.is_ascii() {
        return false;
    }
    let chars: Vec<char> = text.chars().collect();
    let encodings: [fn(char) -> Option<u8>; 2] = [latin1_byte, windows_1252_byte];
    encodings.iter().any(|encode| {
        (0..chars.len()).any(|i| utf8_at(&chars, i, *encode) || lost_no_break_space(&chars, i))
    })
}

/// Whether the characters from `i` on encode to one UTF-8 sequence, a replacement character
/// standing for any continuation byte.
fn utf8_at(chars: &[char], i: usize, encode: fn(char) -> Option<u8>) -> bool {
    let width = match encode(chars[i]) {
        Some(0xc2..=0xdf) => 2,
        Some(0xe0..=0xef) => 3,
        Some(0xf0..=0xf4) => 4,
        _ => return false,
    };
    let Some(sequence) = chars.get(i..i + width) else {
        return false;
    };
    let bytes: Option<Vec<u8>> = sequence
        .iter()
        .enumerate()
        .map(|(k, &c)| match c {
            '\u{fffd}' if k > 0 => Some(0xa0),
            _ => encode(c),
        })
        .collect();
    bytes.is_some_and(|b| std::str::from_utf8(&b).is_ok())
}

/// `Ã ` or `Â ` at the start of the text or after a lowercase ASCII letter (and at most one
/// whitespace character).
fn lost_no_break_space(chars: &[char], i: usize) -> bool {
    if !matches!(chars[i], '\u{c3}' | '\u{c2}') || chars.get(i + 1) != Some(&' ') {
        return false;
    }
    let before = &chars[..i];
    match before {
        [] => true,
        [.., c] if c.is_ascii_lowercase() => true,
        [.., c, s] => c.is_ascii_lowercase() && super::tables::is_py_space(*s),
        [_] => false,
    }
}

fn latin1_byte(c: char) -> Option<u8> {
    u8::try_from(c).ok()
}

/// The byte that ftfy's sloppy Windows-1252 encodes `c` as, if any.
fn windows_1252_byte(c: char) -> Option<u8> {
    match c as u32 {
        0..=0x7f | 0xa0..=0xff => Some(c as u8),
        _ => C1_WINDOWS_1252
            .iter()
            .position(|&r| r == c)
            .map(|i| 0x80 + i as u8),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ftfy 6.3.1's `fix_text` on each input (values taken from the interpreter).
    #[test]
    fn fix_text_follows_ftfy() {
        let cases = [
            ("plain text", "plain text"),
            ("\u{fb02}u\u{fb03}e\u{fb06}", "fluffiest"),
            ("\u{ff2c}\u{ff2f}\u{ff35}\u{ff24}\u{3000}\u{ff2e}", "LOUD N"),
            (
                "\u{ff35}\u{ff80}\u{ff70}\u{ff9d}",
                "U\u{30bf}\u{30fc}\u{30f3}",
            ),
            ("\u{201c}here\u{2019}s\u{201d}", "\"here's\""),
            ("a\r\nb\rc\u{2028}d\u{2029}e", "a\nb\nc\nd\ne"),
            ("x\u{85}y", "x\u{2026}y"),
            ("\x1b[36;44mblue\x1b[0m", "blue"),
            ("\x1b[36", "[36"),
            (
                "a\x00b\x07c\x0bd\x7fe\u{feff}f\u{206a}g\u{fffc}h",
                "abcdefgh",
            ),
            ("tab\tand\x0cform", "tab\tand\x0cform"),
            ("e\u{301}", "\u{e9}"),
            ("&amp;amp;", "&"),
            ("&lt;b&gt;", "<b>"),
            ("<b>&amp;</b>", "<b>&amp;</b>"),
            ("&#x1F600;", "\u{1f600}"),
            ("&#0;", "\u{fffd}"),
            ("\u{80}", "\u{20ac}"),
        ];
        for (input, expected) in cases {
            assert_eq!(fix_text(input).text, expected, "{input:?}");
        }
    }

    /// HTML unescaping stops at the first segment with a `<` and stays off after it.
    #[test]
    fn a_less_than_sign_turns_html_unescaping_off_from_its_line_on() {
        assert_eq!(fix_text("&amp;\n<&amp;\n&amp;").text, "&\n<&amp;\n&amp;");
    }

    #[test]
    fn segments_end_after_newlines() {
        let parts: Vec<&str> = segments("a\nb\n\nc").collect();
        assert_eq!(parts, ["a\n", "b\n", "\n", "c"]);
    }

    #[test]
    fn utf8_read_as_latin1_or_windows_1252_is_noticed() {
        for (text, mojibake) in [
            ("caf\u{c3}\u{a9}", true),
            ("\u{e2}\u{20ac}\u{153}quoted\u{e2}\u{20ac}\u{9d}", true),
            ("caf\u{c3}\u{a9} \u{fb01}ne", true),
            ("&Atilde;&copy;", false),
            ("\u{c9}\u{fffd} lost", true),
            ("voil\u{c3} la", true),
            ("IRM\u{c3} E", false),
            ("caf\u{e9}", false),
            ("na\u{ef}ve Gr\u{f6}\u{df}e", false),
            ("plain", false),
            ("\u{65e5}\u{672c}", false),
        ] {
            assert_eq!(looks_like_mojibake(text), mojibake, "{text:?}");
        }
        assert!(
            fix_text("&Atilde;&copy;").mojibake,
            "after the HTML unescaping"
        );
    }
}

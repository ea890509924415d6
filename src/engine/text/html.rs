//! HTML character references as the reference pipeline decodes them: Python's `html.unescape`
//! (the whole HTML5 table, numeric references with the HTML5 rules for invalid code points,
//! legacy names without `;` and the longest-prefix rule) and ftfy's stricter `unescape_html`
//! (only `&name;` forms of at most 24 letters or digits, and the upper-case names ftfy adds).

use super::tables::html_entities::{FTFY_ENTITIES, HTML5, INVALID_CHARREFS, INVALID_CODEPOINTS};

/// Python's `html.unescape(s)`.
///
/// Python matches `&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)` left to right and
/// replaces each match; an `&` where nothing matches stays.
pub fn unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        match reference(after) {
            Some((consumed, text)) => {
                out.push_str(&text);
                rest = &after[consumed..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The reference that starts `after` (the text after an `&`): how many bytes it takes and what
/// it stands for, or `None` when Python's pattern does not match there.
fn reference(after: &str) -> Option<(usize, String)> {
    let bytes = after.as_bytes();
    if bytes.first() == Some(&b'#') {
        let decimal = run_len(&bytes[1..], |b| b.is_ascii_digit());
        if decimal > 0 {
            let end = 1 + decimal;
            let number = parse_saturating(&after[1..end], 10);
            return Some((end + semicolon(bytes, end), numeric(number)));
        }
        if matches!(bytes.get(1), Some(b'x' | b'X')) {
            let hex = run_len(&bytes[2..], |b| b.is_ascii_hexdigit());
            if hex > 0 {
                let end = 2 + hex;
                let number = parse_saturating(&after[2..end], 16);
                return Some((end + semicolon(bytes, end), numeric(number)));
            }
        }
        // The named form cannot start with `#`.
        return None;
    }
    let mut chars = 0;
    let mut end = 0;
    for (i, c) in after.char_indices() {
        if chars == 32 || matches!(c, '\t' | '\n' | '\x0c' | ' ' | '<' | '&' | '#' | ';') {
            break;
        }
        chars += 1;
        end = i + c.len_utf8();
    }
    if chars == 0 {
        return None;
    }
    let end = end + semicolon(bytes, end);
    Some((end, named(&after[..end])))
}

/// 1 when a `;` follows at `at` (the optional `;` of each form), else 0.
fn semicolon(bytes: &[u8], at: usize) -> usize {
    usize::from(bytes.get(at) == Some(&b';'))
}

fn run_len(bytes: &[u8], accept: impl Fn(u8) -> bool) -> usize {
    bytes.iter().take_while(|&&b| accept(b)).count()
}

/// The value of ASCII digits in `radix`; any value past the last code point stands for all of
/// them, since they are treated alike. (Python's `int()` refuses more than 4,300 decimal digits,
/// so the reference fails on such a reference where this gives U+FFFD.)
fn parse_saturating(digits: &str, radix: u32) -> u32 {
    digits.chars().fold(0u32, |n, d| {
        let d = d.to_digit(radix).expect("matched digits");
        n.saturating_mul(radix)
            .saturating_add(d)
            .min(char::MAX as u32 + 1)
    })
}

/// A numeric reference: HTML5's replacements for the C1 range, NUL and CR, U+FFFD for surrogates
/// and values past U+10FFFF, nothing for the other invalid code points.
fn numeric(number: u32) -> String {
    if let Ok(i) = INVALID_CHARREFS.binary_search_by_key(&number, |&(n, _)| n) {
        return INVALID_CHARREFS[i].1.to_string();
    }
    if (0xD800..=0xDFFF).contains(&number) || number > 0x10FFFF {
        return '\u{FFFD}'.to_string();
    }
    if INVALID_CODEPOINTS.binary_search(&number).is_ok() {
        return String::new();
    }
    char::from_u32(number).map(String::from).unwrap_or_default()
}

/// A named reference (`name` is the match without its `&`, with its `;` if any): the entity, or
/// the longest entity name of at least two characters that starts it, followed by the rest, or
/// the text as it was.
fn named(name: &str) -> String {
    if let Some(text) = html5(name) {
        return text.to_string();
    }
    // Prefixes of len - 1 down to 2 characters, as Python's `range(len(s) - 1, 1, -1)`.
    let ends: Vec<usize> = name.char_indices().map(|(i, _)| i).skip(2).collect();
    for &end in ends.iter().rev() {
        if let Some(text) = html5(&name[..end]) {
            return format!("{text}{}", &name[end..]);
        }
    }
    format!("&{name}")
}

fn html5(name: &str) -> Option<&'static str> {
    HTML5
        .binary_search_by(|&(k, _)| k.cmp(name))
        .ok()
        .map(|i| HTML5[i].1)
}

/// ftfy's `unescape_html(text)`: each match of `&#?[0-9A-Za-z]{1,24};` that is one of ftfy's
/// entities becomes its text; a numeric one becomes what `html.unescape` makes of it when that
/// consumed the `;`; anything else stays.
pub fn ftfy_unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut at = 0;
    while let Some(found) = text[at..].find('&') {
        let start = at + found;
        let mut end = start + 1;
        if bytes.get(end) == Some(&b'#') {
            end += 1;
        }
        let alnum = run_len(&bytes[end..], |b| b.is_ascii_alphanumeric());
        if (1..=24).contains(&alnum) && bytes.get(end + alnum) == Some(&b';') {
            end += alnum + 1;
            let entity = &text[start..end];
            out.push_str(&text[copied..start]);
            out.push_str(&ftfy_entity(entity));
            copied = end;
            at = end;
        } else {
            at = start + 1;
        }
    }
    out.push_str(&text[copied..]);
    out
}

fn ftfy_entity(entity: &str) -> String {
    if let Ok(i) = FTFY_ENTITIES.binary_search_by(|&(k, _)| k.cmp(entity)) {
        return FTFY_ENTITIES[i].1.to_string();
    }
    if entity.starts_with("&#") {
        let decoded = unescape(entity);
        // A reference `html.unescape` decoded only in part (`&#12a;`) is left as it was.
        if !decoded.contains(';') {
            return decoded;
        }
    }
    entity.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python 3.11's `html.unescape` on each input (values taken from the interpreter).
    #[test]
    fn unescape_follows_python() {
        let cases = [
            ("no references", "no references"),
            ("&amp;amp;", "&amp;"),
            ("&#39;", "'"),
            ("&nbsp;x", "\u{a0}x"),
            ("&notit;", "\u{ac}it;"),
            ("&notin;", "\u{2209}"),
            ("&ampxyz", "&xyz"),
            ("&amp", "&"),
            ("&#x1F600;", "\u{1f600}"),
            ("&#X1f600", "\u{1f600}"),
            ("&#0;", "\u{fffd}"),
            ("&#13;", "\r"),
            ("&#128;", "\u{20ac}"),
            ("&#129;", "\u{81}"),
            ("&#1;", ""),
            ("&#11;", ""),
            ("&#12;", "\x0c"),
            ("&#xD800;", "\u{fffd}"),
            ("&#1114112;", "\u{fffd}"),
            ("&#99999999999999999999999;", "\u{fffd}"),
            ("&#xFFFF;", ""),
            ("&#65", "A"),
            ("&#;", "&#;"),
            ("&#x;", "&#x;"),
            ("& amp;", "& amp;"),
            ("&;", "&;"),
            ("&&amp;", "&&"),
            ("&zzzz;", "&zzzz;"),
            ("&éamp;", "&éamp;"),
            ("&lt;b&gt;", "<b>"),
            ("&Eacute;", "\u{c9}"),
            ("&EACUTE;", "&EACUTE;"),
        ];
        for (input, expected) in cases {
            assert_eq!(unescape(input), expected, "{input:?}");
        }
    }

    /// The 32-character limit of a name: a longer run is cut there, and the first 32 characters
    /// are looked up (legacy prefixes included).
    #[test]
    fn names_are_read_up_to_32_characters() {
        let long = format!("amp{}", "x".repeat(40));
        assert_eq!(unescape(&format!("&{long}")), format!("&{}", &long[3..]));
    }

    /// ftfy 6.3.1's `unescape_html` on each input (values taken from the interpreter).
    #[test]
    fn ftfy_unescape_follows_ftfy() {
        let cases = [
            ("&amp;amp;", "&amp;"),
            ("&amp", "&amp"),
            ("this&not that", "this&not that"),
            ("&notit;", "&notit;"),
            ("&NTILDE; &nTILDE;", "\u{d1} &nTILDE;"),
            ("BUNDESSTRA&SZLIG;E", "BUNDESSTRASSE"),
            ("&#39;", "'"),
            ("&#x1F600;", "\u{1f600}"),
            ("&#0;", "\u{fffd}"),
            ("&#12a;", "&#12a;"),
            ("&#abc;", "&#abc;"),
            ("&#1;", ""),
            (
                "&abcdefghijklmnopqrstuvwxyz;",
                "&abcdefghijklmnopqrstuvwxyz;",
            ),
            ("&&lt;", "&<"),
        ];
        for (input, expected) in cases {
            assert_eq!(ftfy_unescape(input), expected, "{input:?}");
        }
    }
}

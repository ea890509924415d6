//! One manifest file, parsed twice from the same text: into values, and into the spans of every
//! key and value, so that any setting can be traced back to `file:line:col`.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use toml::de::{DeTable, DeValue};

use super::diagnostic::{Diagnostic, Excerpt, Origin};

/// A manifest file's text, values and spans.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// The path as the user gave it, joined onto the including file's folder.
    pub path: PathBuf,
    pub text: String,
    /// Leaf settings by dotted key path, in file order of their spans.
    pub leaves: BTreeMap<String, Leaf>,
    /// The byte offset of each line's start, so that a location costs a search, not a scan of
    /// the text before it (many errors in one large file stay linear).
    line_starts: Vec<usize>,
}

/// One leaf value of a manifest (tables are not leaves; arrays are).
#[derive(Debug, Clone)]
pub struct Leaf {
    pub value: toml::Value,
    pub key_span: Range<usize>,
    pub value_span: Range<usize>,
    /// For an array, the span of each element (a `[sweep]` list's errors point at its value).
    pub item_spans: Vec<Range<usize>>,
}

impl SourceFile {
    /// Parses `text`; a TOML syntax error is reported at its location.
    // A diagnostic (location, excerpt, help) is made once per failed load: its size costs nothing
    // on the success path, and the callers collect them unboxed.
    #[allow(clippy::result_large_err)]
    pub fn parse(path: PathBuf, text: String) -> Result<SourceFile, Diagnostic> {
        let spanned = DeTable::parse(&text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            let message = e.message().trim().trim_end_matches('.').to_lowercase();
            syntax_error(&path, &text, span, &message)
        })?;
        let mut leaves = BTreeMap::new();
        collect(&text, "", spanned.get_ref(), &mut leaves)
            .map_err(|(span, e)| syntax_error(&path, &text, span, &e.to_string()))?;
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Ok(SourceFile {
            path,
            text,
            leaves,
            line_starts,
        })
    }

    /// The folder that relative paths in this file are resolved against.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// The origin of a span of this file.
    pub fn origin(&self, span: &Range<usize>) -> Origin {
        let offset = span.start.min(self.text.len());
        // The last line starting at or before the offset.
        let line = self.line_starts.partition_point(|&s| s <= offset);
        let col = self.text[self.line_starts[line - 1]..offset]
            .chars()
            .count()
            + 1;
        Origin::File {
            path: self.path.clone(),
            line,
            col,
        }
    }

    /// The line under a span, with the span marked.
    pub fn excerpt(&self, span: &Range<usize>) -> Excerpt {
        excerpt(&self.text, span)
    }
}

fn syntax_error(path: &Path, text: &str, span: Range<usize>, message: &str) -> Diagnostic {
    let (line, col) = line_col(text, span.start);
    Diagnostic::new(format!("invalid TOML: {message}"))
        .at(Origin::File {
            path: path.to_path_buf(),
            line,
            col,
        })
        .excerpt(Some(excerpt(text, &span)))
        .hint("fix the syntax; see https://toml.io for the format")
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = text[line_start..offset].chars().count() + 1;
    (line, col)
}

fn excerpt(text: &str, span: &Range<usize>) -> Excerpt {
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line_text = text[line_start..line_end]
        .trim_end_matches('\r')
        .to_string();
    let col = text[line_start..start].chars().count() + 1;
    let end = span.end.clamp(start, line_end);
    let len = text[start..end].chars().count().max(1);
    Excerpt {
        line_text,
        col,
        len,
    }
}

fn collect(
    text: &str,
    prefix: &str,
    table: &DeTable<'_>,
    out: &mut BTreeMap<String, Leaf>,
) -> Result<(), (Range<usize>, TomlValueError)> {
    for (key, value) in table.iter() {
        let path = if prefix.is_empty() {
            key.get_ref().to_string()
        } else {
            format!("{prefix}.{}", key.get_ref())
        };
        match value.get_ref() {
            DeValue::Table(inner) => collect(text, &path, inner, out)?,
            _ => {
                let value_span = value.span();
                let converted =
                    to_value(value.get_ref()).map_err(|msg| (value_span.clone(), msg))?;
                let item_spans = match value.get_ref() {
                    DeValue::Array(items) => items.iter().map(|i| i.span()).collect(),
                    _ => Vec::new(),
                };
                out.insert(
                    path,
                    Leaf {
                        value: converted,
                        key_span: key.span(),
                        value_span,
                        item_spans,
                    },
                );
            }
        }
    }
    let _ = text;
    Ok(())
}

/// Why a parsed TOML value has no plain TOML value; the message reads after "invalid TOML: ".
#[derive(Debug, thiserror::Error)]
enum TomlValueError {
    /// An integer, as written, outside `i64`.
    #[error("integer `{0}` does not fit in 64 bits")]
    IntegerRange(String),
    /// A float, as written without `_`, that does not parse.
    #[error("`{0}` is not a float")]
    NotFloat(String),
}

/// Converts a spanned parse value into a plain TOML value.
fn to_value(v: &DeValue<'_>) -> Result<toml::Value, TomlValueError> {
    Ok(match v {
        DeValue::String(s) => toml::Value::String(s.to_string()),
        DeValue::Integer(i) => {
            let digits = i.as_str().replace('_', "");
            let n = i64::from_str_radix(
                digits
                    .trim_start_matches("0x")
                    .trim_start_matches("0o")
                    .trim_start_matches("0b"),
                i.radix(),
            )
            .map_err(|_| TomlValueError::IntegerRange(i.as_str().to_string()))?;
            toml::Value::Integer(n)
        }
        DeValue::Float(f) => {
            let s = f.as_str().replace('_', "");
            let n = match s.as_str() {
                "inf" | "+inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                "nan" | "+nan" | "-nan" => f64::NAN,
                _ => s.parse().map_err(|_| TomlValueError::NotFloat(s.clone()))?,
            };
            toml::Value::Float(n)
        }
        DeValue::Boolean(b) => toml::Value::Boolean(*b),
        DeValue::Datetime(d) => toml::Value::Datetime(*d),
        DeValue::Array(a) => toml::Value::Array(
            a.iter()
                .map(|e| to_value(e.get_ref()))
                .collect::<Result<_, _>>()?,
        ),
        DeValue::Table(t) => {
            let mut m = toml::Table::new();
            for (k, v) in t.iter() {
                m.insert(k.get_ref().to_string(), to_value(v.get_ref())?);
            }
            toml::Value::Table(m)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_point_at_values() {
        let text = "kind = \"probe\"\n\n[method]\nclean_sigma = 0.01\n";
        let f = SourceFile::parse("m.toml".into(), text.into()).unwrap();
        let leaf = &f.leaves["method.clean_sigma"];
        assert_eq!(leaf.value, toml::Value::Float(0.01));
        assert_eq!(line_col(text, leaf.value_span.start), (4, 15));
        assert_eq!(line_col(text, leaf.key_span.start), (4, 1));
    }

    /// The origin's line search agrees with the scan, on the first and last line, after a
    /// blank line and past multi-byte characters.
    #[test]
    fn origins_agree_with_line_col() {
        let text = "kind = \"probe\"\n\n[method]\nname = \"é€\"; clean_sigma = 1\nx = 1";
        let text = text.replace("; ", "\n");
        let f = SourceFile::parse("m.toml".into(), text.clone()).unwrap();
        for offset in 0..=text.len() {
            if !text.is_char_boundary(offset) {
                continue;
            }
            let (line, col) = line_col(&text, offset);
            let expected = Origin::File {
                path: "m.toml".into(),
                line,
                col,
            };
            assert_eq!(f.origin(&(offset..offset)), expected, "offset {offset}");
        }
    }

    #[test]
    fn dotted_and_inline_tables_are_flattened() {
        let text = "method.emit = \"denoised\"\ncache = { scope = \"shard\" }\n";
        let f = SourceFile::parse("m.toml".into(), text.into()).unwrap();
        assert!(f.leaves.contains_key("method.emit"));
        assert!(f.leaves.contains_key("cache.scope"));
    }

    #[test]
    fn syntax_errors_have_locations() {
        let text = "kind = \"probe\"\nname = \n";
        let err = SourceFile::parse("m.toml".into(), text.into()).unwrap_err();
        match err.origin {
            Some(Origin::File { line, .. }) => assert_eq!(line, 2),
            other => panic!("{other:?}"),
        }
    }
}

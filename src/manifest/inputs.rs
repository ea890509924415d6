//! The text files a run reads, bounded and checked before they are parsed: manifests and prompt
//! files must be regular files of at most a set size (a manifest's `extends` naming `/dev/zero`,
//! a FIFO or a huge file fails at once) and UTF-8; a prompt file has one prompt per line.

use std::io::Read;
use std::path::Path;

/// The largest manifest read.
pub const MANIFEST_LIMIT: u64 = 1 << 20;
/// The largest prompt file read (the 946 VBench prompts take about 0.3 MiB).
pub const PROMPTS_LIMIT: u64 = 64 << 20;

/// Why a text file cannot be read; the message reads after the file's name.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TextFileError {
    #[error("does not exist")]
    Missing,
    #[error("cannot be read: {0}")]
    Io(String),
    #[error("is not a regular file ({0}); give the path of a file")]
    NotAFile(&'static str),
    #[error("is {size} bytes, more than the {limit} bytes a {what} may have")]
    TooLarge {
        size: u64,
        limit: u64,
        what: &'static str,
    },
    #[error("is not UTF-8 text (line {line}, byte {offset}); save it as UTF-8")]
    NotUtf8 { line: usize, offset: usize },
}

/// Reads a regular file of at most `limit` bytes as UTF-8; `what` names the kind of file in the
/// size error.
pub fn read_text_file(
    path: &Path,
    limit: u64,
    what: &'static str,
) -> Result<String, TextFileError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(TextFileError::Missing),
        Err(e) => return Err(TextFileError::Io(e.to_string())),
    };
    if !meta.is_file() {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        let kind = if t.is_dir() {
            "a directory"
        } else if t.is_fifo() {
            "a named pipe"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else if t.is_socket() {
            "a socket"
        } else {
            "not a plain file"
        };
        return Err(TextFileError::NotAFile(kind));
    }
    if meta.len() > limit {
        return Err(TextFileError::TooLarge {
            size: meta.len(),
            limit,
            what,
        });
    }
    let file = std::fs::File::open(path).map_err(|e| TextFileError::Io(e.to_string()))?;
    // A file that grows while it is read stops at the limit too.
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| TextFileError::Io(e.to_string()))?;
    if bytes.len() as u64 > limit {
        return Err(TextFileError::TooLarge {
            size: bytes.len() as u64,
            limit,
            what,
        });
    }
    String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..offset]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        TextFileError::NotUtf8 { line, offset }
    })
}

/// Why a prompt file gives no prompts; the message reads after the file's name.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PromptFileError {
    #[error(transparent)]
    Read(#[from] TextFileError),
    #[error("has no prompts; write one prompt per line")]
    NoPrompts,
    /// A blank line, by its 1-based number.
    #[error(
        "line {0} is blank; every line is one prompt (its index is its line number minus one), so \
         remove the blank line"
    )]
    BlankLine(usize),
}

/// The prompts of a prompt file's text: one a line, a prompt's index its zero-based line number.
/// Lines may end in `\n` or `\r\n`, and a UTF-8 byte-order mark at the start is not part of the
/// first prompt. A blank line is an error naming it: dropping it would shift every later
/// prompt's index, and so its noise.
pub fn parse_prompt_file(text: &str) -> Result<Vec<String>, PromptFileError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let body = text.strip_suffix('\n').unwrap_or(text);
    if body.is_empty() {
        return Err(PromptFileError::NoPrompts);
    }
    body.split('\n')
        .enumerate()
        .map(|(i, line)| {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.trim().is_empty() {
                Err(PromptFileError::BlankLine(i + 1))
            } else {
                Ok(line.to_string())
            }
        })
        .collect()
}

/// Reads and parses a prompt file; the error reads after the file's name.
pub fn read_prompt_file(path: &Path) -> Result<Vec<String>, PromptFileError> {
    let text = read_text_file(path, PROMPTS_LIMIT, "prompt file")?;
    parse_prompt_file(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_files_are_lines_with_crlf_and_a_bom_allowed() {
        let ok = [
            ("a\nb\n", vec!["a", "b"]),
            ("a\r\nb\r\n", vec!["a", "b"]),
            ("\u{feff}a\nb", vec!["a", "b"]),
            ("  spaced  \n", vec!["  spaced  "]),
        ];
        for (text, want) in ok {
            assert_eq!(parse_prompt_file(text).unwrap(), want, "{text:?}");
        }
        let bad = [
            ("a\n\nb\n", "line 2 is blank"),
            ("a\n \r\nb", "line 2 is blank"),
            ("\n", "no prompts"),
            ("", "no prompts"),
            ("a\n\n", "line 2 is blank"),
        ];
        for (text, want) in bad {
            let e = parse_prompt_file(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn reading_is_bounded_to_regular_utf8_files() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.txt");
        assert_eq!(
            read_text_file(&missing, 10, "x"),
            Err(TextFileError::Missing)
        );
        assert_eq!(
            read_text_file(dir.path(), 10, "x"),
            Err(TextFileError::NotAFile("a directory"))
        );
        assert_eq!(
            read_text_file(Path::new("/dev/zero"), 10, "x"),
            Err(TextFileError::NotAFile("a device"))
        );
        let fifo = dir.path().join("fifo");
        crate::os::make_fifo(&fifo).unwrap();
        assert_eq!(
            read_text_file(&fifo, 10, "x"),
            Err(TextFileError::NotAFile("a named pipe"))
        );
        let big = dir.path().join("big.txt");
        std::fs::write(&big, "x".repeat(11)).unwrap();
        assert!(matches!(
            read_text_file(&big, 10, "manifest"),
            Err(TextFileError::TooLarge {
                size: 11,
                limit: 10,
                ..
            })
        ));
        let latin1 = dir.path().join("latin1.txt");
        std::fs::write(&latin1, b"ok\ncaf\xe9\n").unwrap();
        assert_eq!(
            read_text_file(&latin1, 100, "x"),
            Err(TextFileError::NotUtf8 { line: 2, offset: 6 })
        );
    }
}

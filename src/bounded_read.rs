//! Reading a file of a run (a record, a video, scores) that something else may have replaced:
//! only a regular file of at most a given size is read, so that a FIFO or a device put in its
//! place fails at once instead of blocking the reader, and a huge file is refused instead of
//! filling memory. Below every pass: it uses no other module.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// A file that could not be read, or is not one to read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    /// The path names something that is not a regular file (a FIFO, a device, a folder), or a
    /// file larger than the limit.
    #[error("cannot read {}: {reason}", path.display())]
    NotRegular { path: PathBuf, reason: String },
}

/// Opens the file at `path` for reading, which must be a regular file (a symbolic link to one
/// is followed) of at most `limit` bytes; gives it with its length. Every reader of a run's
/// records and outputs opens them here, so that one replaced by a FIFO or a device fails at
/// once instead of blocking the reader, and a huge one is refused instead of filling memory.
///
/// The type is checked before the file is opened, and again on the opened file: the open is
/// non-blocking, so a FIFO swapped in between the two does not block it either.
pub fn open_regular(path: &Path, limit: u64) -> Result<(File, u64), ReadError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let read_err = |source| ReadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let check = |meta: &fs::Metadata| -> Result<u64, ReadError> {
        let t = meta.file_type();
        let kind = if t.is_file() {
            None
        } else if t.is_dir() {
            Some("a folder")
        } else if t.is_fifo() {
            Some("a named pipe")
        } else if t.is_char_device() || t.is_block_device() {
            Some("a device")
        } else if t.is_socket() {
            Some("a socket")
        } else {
            Some("not a plain file")
        };
        if let Some(kind) = kind {
            return Err(ReadError::NotRegular {
                path: path.to_path_buf(),
                reason: format!("it is {kind}, not a regular file"),
            });
        }
        if meta.len() > limit {
            return Err(ReadError::NotRegular {
                path: path.to_path_buf(),
                reason: format!(
                    "it holds {} bytes, more than the {limit} a file of a run may have",
                    meta.len()
                ),
            });
        }
        Ok(meta.len())
    };
    check(&fs::metadata(path).map_err(read_err)?)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(read_err)?;
    let len = check(&file.metadata().map_err(read_err)?)?;
    Ok((file, len))
}

/// Reads a whole file opened by [`open_regular`].
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let (file, len) = open_regular(path, limit)?;
    // A file that grows while it is read stops at the limit too.
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| ReadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::NotRegular {
            path: path.to_path_buf(),
            reason: format!("it grew past {limit} bytes while it was read"),
        });
    }
    Ok(bytes)
}

/// [`read_bounded`] of a UTF-8 text file.
pub fn read_bounded_text(path: &Path, limit: u64) -> Result<String, ReadError> {
    String::from_utf8(read_bounded(path, limit)?).map_err(|e| ReadError::NotRegular {
        path: path.to_path_buf(),
        reason: format!(
            "it is not UTF-8 text (byte {})",
            e.utf8_error().valid_up_to()
        ),
    })
}

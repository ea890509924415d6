//! Bundles given as a `.zip` archive: unpacked into a folder of their own, refusing an entry whose
//! path would leave it and an archive without `bundle.toml` at its top.

use std::path::{Path, PathBuf};

use super::{BUNDLE_TOML, BundleError};

/// Unpacks a `.zip` bundle into `unpack_dir/<zip stem>` and returns that folder, which holds the
/// bundle's `bundle.toml` ([`extract_bundle_zip`]).
pub(super) fn unpack_zip(path: &Path, unpack_dir: &Path) -> Result<PathBuf, BundleError> {
    let stem = path
        .file_stem()
        .map(|s| s.to_os_string())
        .unwrap_or_else(|| "bundle".into());
    let target = unpack_dir.join(stem);
    extract_bundle_zip(path, &target).map_err(|e| BundleError::Zip {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(target)
}

/// Why a bundle archive cannot be extracted, said as the reason beside the archive's path.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BundleZipError {
    #[error(transparent)]
    Open(std::io::Error),
    #[error(transparent)]
    Archive(#[from] zip::result::ZipError),
    #[error("an entry has an unsafe path")]
    UnsafePath,
    #[error("no {BUNDLE_TOML} at the archive's root or in its single top-level folder")]
    NoManifest,
    #[error("create {}: {source}", .path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The archive at `archive`, opened, and its entries' paths, each of which stays inside the
/// folder it is unpacked into (an entry that would leave it, absolute or through `..`, refuses
/// the archive).
fn open_zip(
    archive: &Path,
) -> Result<(zip::ZipArchive<std::fs::File>, Vec<PathBuf>), BundleZipError> {
    let file = std::fs::File::open(archive).map_err(BundleZipError::Open)?;
    let mut zip = zip::ZipArchive::new(file)?;
    let names: Vec<PathBuf> = (0..zip.len())
        .filter_map(|i| zip.by_index(i).ok().and_then(|f| f.enclosed_name()))
        .collect();
    if names.len() != zip.len() {
        return Err(BundleZipError::UnsafePath);
    }
    Ok((zip, names))
}

/// Extracts the bundle archive `archive` into `dst`. An archive whose files all sit under one top
/// folder (a zipped bundle directory) is unwrapped, so `bundle.toml` ends up at `dst`'s top
/// either way; an archive without it there, or with an entry whose path would leave `dst`, is
/// refused. The error is the reason, for the caller to put beside the archive's path.
pub(crate) fn extract_bundle_zip(archive: &Path, dst: &Path) -> Result<(), BundleZipError> {
    let (mut zip, names) = open_zip(archive)?;
    let strip = top_folder(&names)?;
    let create = |dir: &Path| {
        std::fs::create_dir_all(dir).map_err(|source| BundleZipError::Create {
            path: dir.to_path_buf(),
            source,
        })
    };
    create(dst)?;
    for (i, name) in names.iter().enumerate() {
        let mut entry = zip.by_index(i)?;
        let rel = match &strip {
            Some(top) => name.strip_prefix(top).unwrap_or(name),
            None => name,
        };
        let target = dst.join(rel);
        if entry.is_dir() {
            create(&target)?;
            continue;
        }
        if let Some(parent) = target.parent() {
            create(parent)?;
        }
        let mut out = std::fs::File::create(&target).map_err(|source| BundleZipError::Create {
            path: target.clone(),
            source,
        })?;
        std::io::copy(&mut entry, &mut out).map_err(|source| BundleZipError::Write {
            path: target.clone(),
            source,
        })?;
    }
    Ok(())
}

/// The folder every entry of an archive sits under (a zipped bundle directory), `None` when
/// `bundle.toml` is at its root; an archive with `bundle.toml` in neither place is refused.
fn top_folder(names: &[PathBuf]) -> Result<Option<PathBuf>, BundleZipError> {
    let strip = if names.iter().any(|n| n == Path::new(BUNDLE_TOML)) {
        None
    } else {
        names
            .first()
            .and_then(|n| n.components().next())
            .map(|c| PathBuf::from(c.as_os_str()))
            .filter(|top| names.iter().all(|n| n.starts_with(top)))
    };
    let top = match &strip {
        Some(top) => top.join(BUNDLE_TOML),
        None => PathBuf::from(BUNDLE_TOML),
    };
    if !names.contains(&top) {
        return Err(BundleZipError::NoManifest);
    }
    Ok(strip)
}

/// The text of a `.zip` bundle's `bundle.toml`, read from the archive without unpacking it.
pub(super) fn zip_manifest_text(archive: &Path) -> Result<String, BundleError> {
    let read = || -> Result<String, BundleZipError> {
        let (mut zip, names) = open_zip(archive)?;
        let name = match top_folder(&names)? {
            Some(top) => top.join(BUNDLE_TOML),
            None => PathBuf::from(BUNDLE_TOML),
        };
        let i = names
            .iter()
            .position(|n| *n == name)
            .expect("top_folder found it");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut zip.by_index(i)?, &mut text).map_err(|source| {
            BundleZipError::Write {
                path: name.clone(),
                source,
            }
        })?;
        Ok(text)
    };
    read().map_err(|e| BundleError::Zip {
        path: archive.to_path_buf(),
        message: e.to_string(),
    })
}

//! The staging area: a run executes from a snapshot in its work root — the resolved manifest,
//! the manifest files, the prompt file, the asset bundle and the runner binary — with an audit
//! (the sha256 of every staged file). Workers read only from the snapshot, so editing the
//! checkout or re-exporting a bundle mid-run cannot change a run.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// The audit file of a staging folder.
pub const AUDIT_FILE: &str = "audit.json";

#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    #[error(
        "work directory {} already exists; pass --reuse-workdir to reuse it (its audit is checked), or remove it",
        .0.display()
    )]
    Exists(PathBuf),
    #[error("work directory {} cannot be reused: {reason}; remove it and apply again", .dir.display())]
    AuditMismatch { dir: PathBuf, reason: String },
    #[error(
        "source directory {} is a symbolic link; point to the real directory (without linked subdirectories) or a .zip of it",
        .0.display()
    )]
    Symlink(PathBuf),
    #[error("cannot read the bundle archive {}: {reason}", .path.display())]
    Zip { path: PathBuf, reason: String },
    #[error("cannot stage {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A copy names both ends: a full disk is the destination's, a vanished file the source's.
    #[error("cannot copy {} to {}: {source}", .from.display(), .to.display())]
    Copy {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StagingError + '_ {
    move |source| StagingError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What goes into a snapshot.
#[derive(Debug, Clone)]
pub struct StageRequest {
    /// `<work_root>/<run>`.
    pub dir: PathBuf,
    pub bundle: PathBuf,
    pub prompts_file: PathBuf,
    pub manifests: Vec<PathBuf>,
    /// The resolved manifest, as TOML.
    pub resolved_manifest: String,
    pub runner: PathBuf,
    pub reuse: bool,
}

/// The audit of a snapshot: sha256 of every staged file, by path relative to the stage.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Audit {
    pub files: BTreeMap<String, String>,
}

/// A staged snapshot.
#[derive(Debug, Clone)]
pub struct Stage {
    pub dir: PathBuf,
    pub bundle: PathBuf,
    pub prompts_file: PathBuf,
    pub runner: PathBuf,
    pub audit: Audit,
    /// True when an existing, matching snapshot was reused.
    pub reused: bool,
    /// Seconds the snapshot took: the copy and its audit, or the audit of a reused one.
    pub seconds: f64,
}

impl Stage {
    /// Removes the snapshot (after a successful run).
    pub fn remove(&self) -> std::io::Result<()> {
        fs::remove_dir_all(&self.dir)
    }
}

/// Refuses symbolic links among a source directory and its subdirectories.
pub fn check_no_symlinked_dirs(dir: &Path) -> Result<(), StagingError> {
    let meta = fs::symlink_metadata(dir).map_err(io(dir))?;
    if meta.file_type().is_symlink() {
        return Err(StagingError::Symlink(dir.to_path_buf()));
    }
    if meta.is_dir() {
        for entry in fs::read_dir(dir).map_err(io(dir))? {
            let entry = entry.map_err(io(dir))?;
            let path = entry.path();
            let ft = entry.file_type().map_err(io(&path))?;
            if ft.is_symlink() && path.is_dir() {
                return Err(StagingError::Symlink(path));
            }
            if ft.is_dir() {
                check_no_symlinked_dirs(&path)?;
            }
        }
    }
    Ok(())
}

/// Creates the snapshot, or reuses an existing one whose audit matches what would be staged.
pub fn stage(req: &StageRequest) -> Result<Stage, StagingError> {
    let started = std::time::Instant::now();
    check_no_symlinked_dirs(&req.bundle)?;
    if req.dir.exists() {
        if !req.reuse {
            return Err(StagingError::Exists(req.dir.clone()));
        }
        return reuse(req, started);
    }
    let tmp = req.dir.with_extension("staging");
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let result = fill(req, &tmp);
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    let audit = result?;
    // The snapshot appears under its name only once complete.
    fs::rename(&tmp, &req.dir).map_err(io(&req.dir))?;
    Ok(done(req, audit, false, started))
}

fn done(req: &StageRequest, audit: Audit, reused: bool, started: std::time::Instant) -> Stage {
    Stage {
        bundle: req.dir.join("bundle"),
        prompts_file: req.dir.join("prompts.txt"),
        runner: req.dir.join("bin/runner"),
        dir: req.dir.clone(),
        audit,
        reused,
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn fill(req: &StageRequest, dir: &Path) -> Result<Audit, StagingError> {
    copy_file(&req.runner, &dir.join("bin/runner"))?;
    copy_file(&req.prompts_file, &dir.join("prompts.txt"))?;
    for (i, m) in req.manifests.iter().enumerate() {
        let name = m
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        copy_file(m, &dir.join("manifests").join(format!("{i}-{name}")))?;
    }
    let resolved = dir.join("manifest.resolved.toml");
    fs::write(&resolved, &req.resolved_manifest).map_err(io(&resolved))?;
    let bundle = dir.join("bundle");
    if is_zip(&req.bundle) {
        unzip(&req.bundle, &bundle)?;
    } else {
        copy_dir(&req.bundle, &bundle)?;
    }
    let audit = audit(dir)?;
    let path = dir.join(AUDIT_FILE);
    let text = serde_json::to_string_pretty(&audit).expect("audits serialise");
    fs::write(&path, text).map_err(io(&path))?;
    Ok(audit)
}

fn reuse(req: &StageRequest, started: std::time::Instant) -> Result<Stage, StagingError> {
    let mismatch = |reason: String| StagingError::AuditMismatch {
        dir: req.dir.clone(),
        reason,
    };
    let path = req.dir.join(AUDIT_FILE);
    let recorded: Audit = fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| mismatch(format!("{AUDIT_FILE} is missing or unreadable")))?;
    let actual = audit(&req.dir)?;
    if actual != recorded {
        let changed = first_difference(&recorded, &actual);
        return Err(mismatch(format!("{changed} changed since it was staged")));
    }
    // The snapshot must also be what would be staged now.
    let sources = [
        ("bin/runner", &req.runner),
        ("prompts.txt", &req.prompts_file),
    ];
    for (rel, src) in sources {
        if recorded.files.get(rel) != Some(&sha256_file(src)?) {
            return Err(mismatch(format!("{rel} differs from {}", src.display())));
        }
    }
    if !is_zip(&req.bundle) {
        let fresh = audit(&req.bundle)?;
        for (rel, hash) in &fresh.files {
            if recorded.files.get(&format!("bundle/{rel}")) != Some(hash) {
                return Err(mismatch(format!(
                    "bundle/{rel} differs from the source bundle"
                )));
            }
        }
    }
    let resolved = fs::read_to_string(req.dir.join("manifest.resolved.toml")).unwrap_or_default();
    if resolved != req.resolved_manifest {
        return Err(mismatch("the resolved manifest differs".into()));
    }
    Ok(done(req, recorded, true, started))
}

fn first_difference(a: &Audit, b: &Audit) -> String {
    for (k, v) in &a.files {
        if b.files.get(k) != Some(v) {
            return k.clone();
        }
    }
    b.files
        .keys()
        .find(|k| !a.files.contains_key(*k))
        .cloned()
        .unwrap_or_else(|| "a file".into())
}

fn is_zip(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("zip"))
}

fn copy_file(src: &Path, dst: &Path) -> Result<(), StagingError> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent).map_err(io(parent))?;
    }
    fs::copy(src, dst).map_err(|source| StagingError::Copy {
        from: src.to_path_buf(),
        to: dst.to_path_buf(),
        source,
    })?;
    Ok(())
}

fn copy_dir(src: &Path, dst: &Path) -> Result<(), StagingError> {
    fs::create_dir_all(dst).map_err(io(dst))?;
    for entry in fs::read_dir(src).map_err(io(src))? {
        let entry = entry.map_err(io(src))?;
        let path = entry.path();
        let target = dst.join(entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &target)?;
        } else {
            copy_file(&path, &target)?;
        }
    }
    Ok(())
}

/// Extracts a bundle archive, as the engine does ([`crate::engine::bundle::extract_bundle_zip`]).
fn unzip(archive: &Path, dst: &Path) -> Result<(), StagingError> {
    crate::engine::bundle::extract_bundle_zip(archive, dst).map_err(|reason| StagingError::Zip {
        path: archive.to_path_buf(),
        reason,
    })
}

/// The sha256 of every file below `dir` except the audit itself, the files hashed side by side
/// (a bundle is a few large files, and one core hashes about 1.4 GB/s).
pub fn audit(dir: &Path) -> Result<Audit, StagingError> {
    let mut found = Vec::new();
    fn walk(
        base: &Path,
        dir: &Path,
        files: &mut Vec<(String, PathBuf)>,
    ) -> Result<(), StagingError> {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .map_err(io(dir))?
            .collect::<Result<_, _>>()
            .map_err(io(dir))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            if path.is_dir() {
                walk(base, &path, files)?;
            } else {
                let rel = path.strip_prefix(base).expect("below base");
                let rel = rel.to_string_lossy().into_owned();
                // The owner mark is written after the audit, by the apply that uses the snapshot.
                if rel != AUDIT_FILE && rel != crate::results::owner::OWNER_FILE {
                    files.push((rel, path));
                }
            }
        }
        Ok(())
    }
    walk(dir, dir, &mut found)?;
    // In the walk's order, so that the first unreadable file is the error whatever finishes first.
    let hashes: Vec<Result<String, StagingError>> = found
        .par_iter()
        .map(|(_, path)| sha256_file(path))
        .collect();
    let mut files = BTreeMap::new();
    for ((rel, _), hash) in found.into_iter().zip(hashes) {
        files.insert(rel, hash?);
    }
    Ok(Audit { files })
}

/// The sha256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String, StagingError> {
    crate::engine::bundle::sha256_file(path).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy onto a full device (`/dev/full`, as a full disk) names the destination as well as
    /// the source, and the reason.
    #[test]
    fn a_failed_copy_names_both_ends() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("weights.onnx");
        std::fs::write(&src, vec![7u8; 1 << 16]).unwrap();
        let error = copy_file(&src, Path::new("/dev/full"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("weights.onnx") && error.contains("to /dev/full"),
            "{error}"
        );
        assert!(error.contains("No space left"), "{error}");
    }

    fn request(root: &Path, reuse: bool) -> StageRequest {
        let src = root.join("src");
        fs::create_dir_all(src.join("bundle/sub")).unwrap();
        fs::write(src.join("bundle/bundle.toml"), "format = 1\n").unwrap();
        fs::write(src.join("bundle/sub/graph.onnx"), b"graph").unwrap();
        fs::write(src.join("prompts.txt"), "a fox\n").unwrap();
        fs::write(src.join("runner"), b"binary").unwrap();
        fs::write(src.join("m.toml"), "kind = \"probe\"\n").unwrap();
        StageRequest {
            dir: root.join("work/run"),
            bundle: src.join("bundle"),
            prompts_file: src.join("prompts.txt"),
            manifests: vec![src.join("m.toml")],
            resolved_manifest: "kind = \"probe\"\n".into(),
            runner: src.join("runner"),
            reuse,
        }
    }

    #[test]
    fn stages_with_an_audit_and_refuses_an_existing_folder_unless_reused_and_matching() {
        let root = tempfile::tempdir().unwrap();
        let req = request(root.path(), false);
        let stage = stage(&req).unwrap();
        assert!(stage.bundle.join("sub/graph.onnx").is_file());
        assert!(stage.audit.files.contains_key("bundle/bundle.toml"));
        assert!(matches!(super::stage(&req), Err(StagingError::Exists(_))));

        let reuse = request(root.path(), true);
        assert!(super::stage(&reuse).unwrap().reused);

        // Tampering with the snapshot breaks the audit, and nothing is deleted.
        fs::write(stage.bundle.join("sub/graph.onnx"), b"other").unwrap();
        let err = super::stage(&reuse).unwrap_err();
        assert!(err.to_string().contains("bundle/sub/graph.onnx"), "{err}");
        assert!(stage.bundle.join("sub/graph.onnx").is_file());
    }

    #[test]
    fn symlinked_source_directories_are_rejected() {
        let root = tempfile::tempdir().unwrap();
        let mut req = request(root.path(), false);
        let link = root.path().join("linked");
        std::os::unix::fs::symlink(&req.bundle, &link).unwrap();
        req.bundle = link;
        assert!(matches!(stage(&req), Err(StagingError::Symlink(_))));
        assert!(!req.dir.exists(), "nothing staged");
    }

    #[test]
    fn a_zipped_bundle_directory_is_unwrapped() {
        let root = tempfile::tempdir().unwrap();
        let mut req = request(root.path(), false);
        let archive = root.path().join("bundle.zip");
        {
            let mut w = zip::ZipWriter::new(fs::File::create(&archive).unwrap());
            let opts = zip::write::SimpleFileOptions::default();
            w.start_file("tiny/bundle.toml", opts).unwrap();
            std::io::Write::write_all(&mut w, b"format = 1\n").unwrap();
            w.start_file("tiny/dit.onnx", opts).unwrap();
            std::io::Write::write_all(&mut w, b"dit").unwrap();
            w.finish().unwrap();
        }
        req.bundle = archive;
        let stage = stage(&req).unwrap();
        assert_eq!(fs::read(stage.bundle.join("dit.onnx")).unwrap(), b"dit");
        assert!(stage.bundle.join("bundle.toml").is_file());
    }
}

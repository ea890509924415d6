//! The staging area: a run executes from a snapshot in its work root — the resolved manifest,
//! the manifest files, the prompt file, the asset bundle and the runner binary — with an audit
//! (the sha256 of every staged file). How files are placed and what a snapshot will write are in
//! `staging/place.rs`; how a placed file is proved unchanged, in `staging/stamps.rs`. Workers read only from the snapshot, so editing the
//! checkout or re-exporting a bundle mid-run cannot change a run unnoticed.
//!
//! The bundle's files and the runner are large (a released bundle is 27 GB), so they are placed
//! without a second copy where the file system allows: a reflink (a copy-on-write clone, as
//! independent as a copy), else a hard link (the same file under a second name), and a copy only
//! across file systems. A hard-linked file changes when its source is rewritten in place, so each
//! placed file's size, modification and status-change times are kept with its audited hash
//! ([`FileStamp`]), and every worker compares them before it trusts the audit's hashes: a
//! rewrite can set the modification time back (`touch -r`, `rsync --inplace -t`), but not the
//! status-change time, and a file whose times moved is hashed again. Before anything is staged, [`space_needed`] tells
//! what will really be copied, and `runner apply` refuses when the work root's file system has
//! less free.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

mod place;
mod stamps;

use place::{FileError, copy_file, count, dir_size, io, is_zip, place_dir, place_file, walk_files};
pub use place::{SpaceNeeded, space_needed};
pub use stamps::{FileStamp, changed_since_staged};

use crate::file_identity::FileIdentity;
pub use crate::results::records::Placements;

/// The audit file of a staging folder.
pub const AUDIT_FILE: &str = "audit.json";

/// Written into a snapshot that its apply keeps, for diagnosis, after the run failed: the next
/// apply reuses it only with `--reuse-workdir`. A snapshot of the run without it was left by an
/// apply that was killed (or stopped before its workers ran), and the next apply of the run
/// reuses it, its audit checked.
pub const KEPT_FILE: &str = ".unstep-kept";

/// Whether the snapshot `dir` was left by an apply of the run `run` (results folder `run_dir`,
/// record `record`) that was killed: its record still says running, or the snapshot is the run's
/// by its owner mark and was not kept after a failure (the record may say otherwise: another
/// shard's apply may have ended it since).
pub fn left_by_killed_apply(
    dir: &Path,
    run: &str,
    run_dir: &Path,
    record: Option<&crate::results::records::RunRecord>,
) -> bool {
    dir.is_dir()
        && (record.is_some_and(|r| r.status == crate::results::records::RunStatus::Running)
            || (!dir.join(KEPT_FILE).exists()
                && crate::results::owner::check(dir, run, run_dir).is_ok()))
}

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
    #[error(transparent)]
    File(#[from] FileError),
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
    /// Seconds the snapshot took: the placing and its audit, or the audit of a reused one.
    pub seconds: f64,
    /// How the large files were placed (empty for a reused snapshot).
    pub placements: Placements,
    /// Each bundle file's stamp, by its path relative to the bundle, taken before the audit
    /// hashed it.
    pub bundle_stamps: BTreeMap<String, FileStamp>,
}

impl Stage {
    /// Removes the snapshot (after a successful run).
    pub fn remove(&self) -> std::io::Result<()> {
        fs::remove_dir_all(&self.dir)
    }

    /// Keeps the snapshot of a failed run for diagnosis ([`KEPT_FILE`]).
    pub fn keep_for_diagnosis(&self) -> std::io::Result<()> {
        fs::write(
            self.dir.join(KEPT_FILE),
            "kept after the run failed; apply with --reuse-workdir to reuse it\n",
        )
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
    let (audit, placements, bundle_stamps) = result?;
    // The snapshot appears under its name only once complete.
    fs::rename(&tmp, &req.dir).map_err(io(&req.dir))?;
    Ok(done(req, audit, placements, bundle_stamps, false, started))
}

fn done(
    req: &StageRequest,
    audit: Audit,
    placements: Placements,
    bundle_stamps: BTreeMap<String, FileStamp>,
    reused: bool,
    started: std::time::Instant,
) -> Stage {
    Stage {
        bundle: req.dir.join("bundle"),
        prompts_file: req.dir.join("prompts.txt"),
        runner: req.dir.join("bin/runner"),
        dir: req.dir.clone(),
        audit,
        reused,
        seconds: started.elapsed().as_secs_f64(),
        placements,
        bundle_stamps,
    }
}

type Filled = (Audit, Placements, BTreeMap<String, FileStamp>);

fn fill(req: &StageRequest, dir: &Path) -> Result<Filled, StagingError> {
    let mut placements = Placements::default();
    let runner_len = fs::metadata(&req.runner).map_err(io(&req.runner))?.len();
    count(
        &mut placements,
        place_file(&req.runner, &dir.join("bin/runner"))?,
        runner_len,
    );
    let small = |p: &Path| fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    copy_file(&req.prompts_file, &dir.join("prompts.txt"))?;
    placements.copied_bytes += small(&req.prompts_file);
    for (i, m) in req.manifests.iter().enumerate() {
        let name = m
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        copy_file(m, &dir.join("manifests").join(format!("{i}-{name}")))?;
        placements.copied_bytes += small(m);
    }
    let resolved = dir.join("manifest.resolved.toml");
    fs::write(&resolved, &req.resolved_manifest).map_err(io(&resolved))?;
    placements.copied_bytes += req.resolved_manifest.len() as u64;
    let bundle = dir.join("bundle");
    if is_zip(&req.bundle) {
        unzip(&req.bundle, &bundle)?;
        placements.unzipped = true;
        placements.copied_bytes += dir_size(&bundle);
    } else {
        place_dir(&req.bundle, &bundle, &mut placements)?;
    }
    // Times before hashes: a rewrite of a linked file during the audit moves its times, so the
    // worker hashes it again.
    let times = times(&bundle)?;
    let audit = audit(dir)?;
    let path = dir.join(AUDIT_FILE);
    let text = serde_json::to_string_pretty(&audit).expect("audits serialise");
    fs::write(&path, text).map_err(io(&path))?;
    let stamps = stamps(times, &audit);
    Ok((audit, placements, stamps))
}

/// The size and times of every file below a staged bundle, by path relative to it.
fn times(bundle: &Path) -> Result<BTreeMap<String, FileIdentity>, StagingError> {
    let mut files = Vec::new();
    walk_files(bundle, bundle, &mut files)?;
    files
        .into_iter()
        .map(|(rel, path)| Ok((rel, FileIdentity::of(&path).map_err(io(&path))?)))
        .collect()
}

/// Each bundle file's times with its audited hash (the audit names it `bundle/<path>`).
fn stamps(times: BTreeMap<String, FileIdentity>, audit: &Audit) -> BTreeMap<String, FileStamp> {
    times
        .into_iter()
        .map(|(rel, t)| {
            let sha256 = audit
                .files
                .get(&format!("bundle/{rel}"))
                .cloned()
                .unwrap_or_default();
            (rel, FileStamp::new(t, sha256))
        })
        .collect()
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
    // Times before hashes, as when staging.
    let times = times(&req.dir.join("bundle"))?;
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
    let stamps = stamps(times, &recorded);
    // Reused, it is this apply's: kept again only if this run fails too.
    let kept = req.dir.join(KEPT_FILE);
    if kept.exists() {
        fs::remove_file(&kept).map_err(io(&kept))?;
    }
    Ok(done(
        req,
        recorded,
        Placements::default(),
        stamps,
        true,
        started,
    ))
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

/// Extracts a bundle archive, as the engine does ([`crate::engine::bundle::extract_bundle_zip`]).
fn unzip(archive: &Path, dst: &Path) -> Result<(), StagingError> {
    crate::engine::bundle::extract_bundle_zip(archive, dst).map_err(|reason| StagingError::Zip {
        path: archive.to_path_buf(),
        reason: reason.to_string(),
    })
}

/// The sha256 of every file below `dir` except the audit itself, the files hashed side by side
/// (a bundle is a few large files, and one core hashes about 1.4 GB/s).
pub fn audit(dir: &Path) -> Result<Audit, StagingError> {
    let mut found = Vec::new();
    walk_files(dir, dir, &mut found)?;
    // The owner mark is written after the audit, by the apply that uses the snapshot.
    // So is the mark of a snapshot kept after a failure.
    found.retain(|(rel, _)| {
        rel != AUDIT_FILE && rel != crate::results::owner::OWNER_FILE && rel != KEPT_FILE
    });
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
    Ok(crate::engine::bundle::sha256_file(path).map_err(io(path))?)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// On one file system the bundle's files and the runner are placed without a second copy:
    /// the snapshot's bundle file is the source's inode (or a reflink of it), and only the small
    /// files are written. A rewrite of the source in place shows in the stamps.
    #[test]
    fn bundle_files_on_the_same_file_system_are_linked_not_copied() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let req = request(root.path(), false);
        let stage = stage(&req).unwrap();
        let p = &stage.placements;
        assert_eq!(p.copied, 0, "{p:?}");
        assert_eq!(
            p.hard_linked + p.reflinked,
            3,
            "two bundle files and the runner: {p:?}"
        );
        let src = fs::metadata(req.bundle.join("sub/graph.onnx")).unwrap();
        let staged = fs::metadata(stage.bundle.join("sub/graph.onnx")).unwrap();
        if p.hard_linked == 3 {
            assert_eq!(src.ino(), staged.ino(), "the same file, not a copy");
        }
        let small = "a fox\n".len() + "kind = \"probe\"\n".len() * 2;
        assert_eq!(
            p.copied_bytes, small as u64,
            "only the small files are written"
        );
        let mut stamps = stage.bundle_stamps.clone();
        assert!(changed_since_staged(&stage.bundle, &mut stamps).is_empty());

        // Rewritten in place through the source (another size here): the stamp tells.
        fs::write(req.bundle.join("sub/graph.onnx"), b"a longer graph").unwrap();
        if p.hard_linked == 3 {
            assert_eq!(
                changed_since_staged(&stage.bundle, &mut stamps),
                vec!["sub/graph.onnx".to_string()]
            );
        }
    }

    /// Rewrites `path` in place (the same inode, the same size) with `bytes`, and sets its
    /// modification time back to what it was, as `rsync --inplace -t` or `touch -r` leave it.
    fn rewrite_keeping_mtime(path: &Path, bytes: &[u8]) {
        use std::io::Write;
        let before = fs::metadata(path).unwrap();
        assert_eq!(before.len(), bytes.len() as u64, "the same size");
        let mut f = fs::OpenOptions::new().write(true).open(path).unwrap();
        f.write_all(bytes).unwrap();
        f.set_modified(before.modified().unwrap()).unwrap();
        drop(f);
        let after = fs::metadata(path).unwrap();
        assert_eq!(
            (after.len(), after.modified().unwrap()),
            (before.len(), before.modified().unwrap())
        );
    }

    /// A hard-linked file rewritten through its source with its size and modification time kept
    /// is found changed: its status-change time moved, and its bytes are not the audited ones.
    /// A change of its metadata alone (another link to it) moves that time too, but the bytes are
    /// the audited ones, so it is not.
    #[test]
    fn a_rewrite_in_place_that_restores_the_mtime_is_found() {
        let root = tempfile::tempdir().unwrap();
        let req = request(root.path(), false);
        let stage = stage(&req).unwrap();
        if stage.placements.hard_linked != 3 {
            eprintln!(
                "note: this file system reflinks; the staged files do not share the source's"
            );
            return;
        }
        let source = req.bundle.join("sub/graph.onnx");
        let mut stamps = stage.bundle_stamps.clone();
        fs::hard_link(&source, root.path().join("another-link")).unwrap();
        assert!(changed_since_staged(&stage.bundle, &mut stamps).is_empty());

        rewrite_keeping_mtime(&source, b"GRAPH");
        assert_eq!(
            changed_since_staged(&stage.bundle, &mut stamps),
            vec!["sub/graph.onnx".to_string()]
        );
        // Written back as it was, it is the audited file again.
        rewrite_keeping_mtime(&source, b"graph");
        assert!(changed_since_staged(&stage.bundle, &mut stamps).is_empty());
    }

    /// What staging will write is counted by file system: nothing of the bundle on its own file
    /// system; every byte of it when the work root is elsewhere (here `/dev/shm`, a tmpfs, when
    /// it is another file system than the test's folder).
    #[test]
    fn space_needed_counts_only_what_will_be_copied() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let req = request(root.path(), false);
        let small = [req.prompts_file.as_path()];
        let same = space_needed(&req.dir, &req.bundle, &req.runner, &small).unwrap();
        assert_eq!(same.needed, "a fox\n".len() as u64);
        assert!(same.available > 0);
        let shm = Path::new("/dev/shm");
        let other_fs = shm.is_dir()
            && fs::metadata(shm).unwrap().dev() != fs::metadata(root.path()).unwrap().dev();
        if other_fs {
            let there = space_needed(
                &shm.join("unstep-test/work"),
                &req.bundle,
                &req.runner,
                &small,
            )
            .unwrap();
            let bundle_and_runner = ("format = 1\n".len() + "graph".len() + "binary".len()) as u64;
            assert_eq!(there.needed, bundle_and_runner + "a fox\n".len() as u64);
        }
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

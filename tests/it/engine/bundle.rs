//! Bundles the engine refuses before any work (a missing or changed file, a graph against the
//! contract, export settings that differ), the known-hashes shortcut, and a zipped bundle.

use std::path::{Path, PathBuf};

use unstep::engine::{Bundle, BundleError};

use super::{stderr, tiny_bundle, worker_on};

/// A copy of the tiny bundle in a temp dir, for breaking it.
pub(super) fn bundle_copy(dir: &Path) -> PathBuf {
    let copy = dir.join("bundle");
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(tiny_bundle()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
        }
    }
    copy
}

fn edit_toml(bundle: &Path, from: &str, to: &str) {
    let path = bundle.join("bundle.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "bundle.toml has no `{from}`");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

/// Runs the worker on a broken bundle and checks it fails as a usage error, before generating.
fn assert_refused(bundle: &Path, dir: &Path, extra: &[&str], fragments: &[&str]) {
    let timings = dir.join("refused.jsonl");
    let mut args = vec!["--indices", "0", "--timings", timings.to_str().unwrap()];
    args.extend_from_slice(extra);
    let output = worker_on(bundle, dir, &args);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(unstep::exit::USAGE), "{err}");
    for fragment in fragments {
        assert!(err.contains(fragment), "stderr lacks `{fragment}`:\n{err}");
    }
    assert!(
        !timings.exists(),
        "nothing may be generated from a refused bundle"
    );
}

#[test]
fn a_bundle_with_a_missing_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_copy(dir.path());
    std::fs::remove_file(bundle.join("vae_step.onnx")).unwrap();
    assert_refused(&bundle, dir.path(), &[], &["vae_step.onnx", "is missing"]);
}

#[test]
fn a_bundle_file_with_a_wrong_checksum_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_copy(dir.path());
    let graph = bundle.join("text_encoder.onnx");
    let mut bytes = std::fs::read(&graph).unwrap();
    bytes.push(0);
    std::fs::write(&graph, bytes).unwrap();
    assert_refused(
        &bundle,
        dir.path(),
        &[],
        &["text_encoder.onnx has sha256", "bundle.toml says"],
    );
}

/// Hashes taken by the staging audit stand in for reading the files: a wrong one is refused like
/// a damaged file, and files they name are not read again (a file damaged after the audit is not
/// seen), while files they leave out still are.
#[test]
fn known_hashes_replace_reading_the_files_they_name() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_copy(dir.path());
    let unpack = dir.path().join("unpack");
    let manifest = unstep::engine::Bundle::open(&bundle, &unpack)
        .unwrap()
        .manifest;
    let mut known = manifest.files.clone();

    let graph = bundle.join("text_encoder.onnx");
    let mut bytes = std::fs::read(&graph).unwrap();
    bytes.push(0);
    std::fs::write(&graph, bytes).unwrap();
    unstep::engine::Bundle::open_with_known_hashes(&bundle, &unpack, &known)
        .expect("the audit's hashes stand for the files");

    known.remove("text_encoder.onnx");
    let err = unstep::engine::Bundle::open_with_known_hashes(&bundle, &unpack, &known)
        .unwrap_err()
        .to_string();
    assert!(err.contains("text_encoder.onnx has sha256"), "{err}");

    let mut wrong = manifest.files.clone();
    wrong.insert("dit.onnx".into(), "0".repeat(64));
    let err = unstep::engine::Bundle::open_with_known_hashes(&bundle, &unpack, &wrong)
        .unwrap_err()
        .to_string();
    assert!(err.contains("dit.onnx has sha256 0000"), "{err}");
}

#[test]
fn a_dit_graph_without_the_contract_inputs_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_copy(dir.path());
    edit_toml(&bundle, "dit = \"dit.onnx\"", "dit = \"vae_first.onnx\"");
    assert_refused(
        &bundle,
        dir.path(),
        &[],
        &["graph `dit` (vae_first.onnx)", "missing input x"],
    );
}

/// A fused DiT that takes the context's keys and values (`ctx_k.{i}`) needs the `dit_context`
/// graph that computes them: without it the worker refuses the bundle before generating.
#[test]
fn a_fused_dit_without_its_context_graph_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_copy(dir.path());
    edit_toml(&bundle, "dit_context = \"dit_context.onnx\"\n", "");
    assert_refused(
        &bundle,
        dir.path(),
        &["--dit-kernels", "unstep"],
        &[
            "graph `dit` (dit_fused.onnx)",
            "ctx_k.0",
            "no dit_context graph",
        ],
    );
}

#[test]
fn a_dit_graph_for_fewer_layers_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_copy(dir.path());
    // The graphs have two layers; a manifest that claims three lacks past_k.2.
    edit_toml(&bundle, "layers = 2", "layers = 3");
    assert_refused(&bundle, dir.path(), &[], &["missing input past_k.2"]);
}

#[test]
fn an_unknown_bundle_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_copy(dir.path());
    edit_toml(&bundle, "format = 1", "format = 2");
    assert_refused(
        &bundle,
        dir.path(),
        &[],
        &["bundle format 2 is not supported"],
    );
}

#[test]
fn export_settings_that_differ_from_the_bundle_are_refused_with_the_export_command() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle();
    assert_refused(
        &bundle,
        dir.path(),
        &["--frames-per-block", "4"],
        &[
            "export setting frames_per_block is 3 in the bundle but 4 was asked for",
            "unstep_export export --preset",
        ],
    );
    assert_refused(
        &bundle,
        dir.path(),
        &["--precision", "fp16"],
        &[
            "export setting precision is fp32 in the bundle but fp16 was asked for",
            "python -m unstep_export export --preset tiny --precision fp16",
        ],
    );
    assert_refused(
        &bundle,
        dir.path(),
        &["--svd-rank", "8"],
        &["svd_rank is none", "--svd-rank 8"],
    );
    // Matching values are accepted by the library check.
    let opened = Bundle::open(&bundle, dir.path()).unwrap();
    let same = unstep::engine::ExportSettings {
        frames_per_block: Some(3),
        latent_frames: Some(21),
        height: Some(64),
        width: Some(112),
        precision: Some(unstep::engine::Precision::Fp32),
        svd_rank: Some(unstep::engine::SvdRank::None),
    };
    opened.check_export(&same).unwrap();
}

#[test]
fn a_zip_bundle_opens_like_a_directory() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let zip_path = dir.path().join("tiny.zip");
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&zip_path).unwrap());
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for entry in std::fs::read_dir(tiny_bundle()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            zip.start_file(
                format!("tiny/{}", path.file_name().unwrap().to_str().unwrap()),
                options,
            )
            .unwrap();
            zip.write_all(&std::fs::read(&path).unwrap()).unwrap();
        }
    }
    zip.finish().unwrap();
    let unpack = dir.path().join("unpacked");
    let bundle = Bundle::open(&zip_path, &unpack).expect("open the zip bundle");
    assert!(bundle.dir.starts_with(&unpack));
    assert_eq!(bundle.manifest.preset, "tiny");

    // A damaged zip is a clear error, not a panic.
    std::fs::write(&zip_path, b"PK garbage").unwrap();
    let error = Bundle::open(&zip_path, &unpack).unwrap_err();
    assert!(matches!(error, BundleError::Zip { .. }), "{error}");
}

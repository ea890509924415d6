//! Asset bundles: `bundle.toml`, its checks, and unpacking `.zip` bundles (`docs/bundle.md`).
//!
//! Everything here runs before a session is created, so that a damaged or mismatched bundle is
//! reported before any generation (or any GPU) is touched.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The only bundle format this runner reads.
pub const BUNDLE_FORMAT: u32 = 1;
pub const BUNDLE_TOML: &str = "bundle.toml";

/// The dtype of every float tensor the graphs take or give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Fp16,
    Bf16,
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fp32" => Ok(Precision::Fp32),
            "fp16" => Ok(Precision::Fp16),
            "bf16" => Ok(Precision::Bf16),
            other => Err(format!(
                "unknown precision `{other}`; expected fp32, fp16 or bf16"
            )),
        }
    }
}

/// Low-rank factorisation of the DiT's linear layers at export time: `"none"` or a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SvdRank {
    None,
    Rank(u32),
}

impl fmt::Display for SvdRank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SvdRank::None => f.write_str("none"),
            SvdRank::Rank(rank) => write!(f, "{rank}"),
        }
    }
}

impl std::str::FromStr for SvdRank {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "none" {
            return Ok(SvdRank::None);
        }
        s.parse::<u32>()
            .ok()
            .filter(|&rank| rank > 0)
            .map(SvdRank::Rank)
            .ok_or_else(|| format!("svd_rank must be \"none\" or a positive integer, not `{s}`"))
    }
}

impl<'de> Deserialize<'de> for SvdRank {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = SvdRank;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"none\" or a positive integer")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SvdRank, E> {
                v.parse().map_err(E::custom)
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<SvdRank, E> {
                u32::try_from(v)
                    .ok()
                    .filter(|&rank| rank > 0)
                    .map(SvdRank::Rank)
                    .ok_or_else(|| E::custom(format!("svd_rank {v} must be positive")))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Architecture {
    pub dim: usize,
    pub ffn_dim: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub layers: usize,
    pub text_len: usize,
    pub text_dim: usize,
    pub latent_channels: usize,
    pub patch: [usize; 3],
    pub vae_stride: [usize; 3],
    pub tokens_per_frame: usize,
}

/// The export-time method settings a bundle was made with (SPEC §3, class "export").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportSection {
    pub frames_per_block: usize,
    pub latent_frames: usize,
    pub height: usize,
    pub width: usize,
    pub svd_rank: SvdRank,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatentStats {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    /// UTF-8 bytes + 1, 0 = padding, truncated to `text_len`.
    Bytes,
    /// A UMT5 `tokenizer.json` beside the graphs; not supported by this runner yet.
    Umt5,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerSection {
    pub kind: TokenizerKind,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Graphs {
    pub text_encoder: String,
    pub dit: String,
    /// The DiT with the runner's own fused operators (`ai.unstep`, exporter 0.4.0 and later):
    /// same inputs and outputs as `dit` up to exporter 0.8.0, loadable only by the runner
    /// (docs/bundle.md); from 0.9.0 it takes the context's keys and values (`dit_context`'s
    /// outputs) instead of the context.
    #[serde(default)]
    pub dit_fused: Option<String>,
    /// The text context → every layer's cross-attention keys and values, once per prompt, for a
    /// `dit_fused` that takes them (exporter 0.9.0 and later).
    #[serde(default)]
    pub dit_context: Option<String>,
    pub vae_first: String,
    pub vae_step: String,
    /// The VAE decoder's graphs with the runner's fused operators (exporter 0.5.0 and later):
    /// same inputs and outputs as `vae_first` and `vae_step`.
    #[serde(default)]
    pub vae_first_fused: Option<String>,
    #[serde(default)]
    pub vae_step_fused: Option<String>,
}

/// `bundle.toml`, as written by the exporter.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleManifest {
    pub format: u32,
    pub exporter_version: String,
    pub preset: String,
    pub precision: Precision,
    pub architecture: Architecture,
    pub export: ExportSection,
    pub latent: LatentStats,
    pub tokenizer: TokenizerSection,
    pub graphs: Graphs,
    /// sha256 (lowercase hex) of every file of the bundle but `bundle.toml`.
    pub files: BTreeMap<String, String>,
}

impl BundleManifest {
    /// Whether `dit_fused` runs its self-attention with the runner's `ai.unstep` `Attention`
    /// (exporter 0.10.0 and later) rather than ONNX Runtime's `MultiHeadAttention`. A version that
    /// does not read as `major.minor.patch` counts as new.
    pub fn fused_dit_has_runner_attention(&self) -> bool {
        let parts: Option<Vec<u64>> = self
            .exporter_version
            .split('.')
            .map(|p| p.parse().ok())
            .collect();
        match parts.as_deref() {
            Some([major, minor, _]) => (*major, *minor) >= (0, 10),
            _ => true,
        }
    }
}

/// Export settings a run asks for; `None` takes the bundle's value. A value that differs from the
/// bundle's is refused, because it can only be changed by exporting again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExportSettings {
    pub frames_per_block: Option<usize>,
    pub latent_frames: Option<usize>,
    pub height: Option<usize>,
    pub width: Option<usize>,
    pub precision: Option<Precision>,
    pub svd_rank: Option<SvdRank>,
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a bundle directory or a .zip bundle")]
    NotABundle { path: PathBuf },
    #[error("unpack {path}: {message}")]
    Zip { path: PathBuf, message: String },
    #[error("parse {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error(
        "bundle format {found} is not supported (this runner reads format {BUNDLE_FORMAT}); export the bundle again with this checkout's exporter"
    )]
    Format { found: u32 },
    #[error("bundle file name `{name}` is not a plain relative path inside the bundle")]
    UnsafeName { name: String },
    #[error(
        "bundle file {name} listed in [files] is missing from {dir}; copy the whole bundle or export it again"
    )]
    MissingFile { name: String, dir: PathBuf },
    #[error(
        "bundle file {name} has sha256 {actual} but bundle.toml says {expected}; the file was changed or damaged: export or copy the bundle again"
    )]
    Checksum {
        name: String,
        expected: String,
        actual: String,
    },
    #[error(
        "graph `{role}` = {name} is not listed in [files], so it cannot be checked; export the bundle again"
    )]
    GraphNotListed { role: &'static str, name: String },
    #[error("bundle.toml is inconsistent: {0}; export the bundle again")]
    Inconsistent(String),
    #[error(
        "tokenizer kind `{0}` is not supported by this runner yet; export a bundle with the `bytes` tokenizer"
    )]
    UnsupportedTokenizer(String),
    #[error(
        "precision {0} is not supported by this engine yet; export an fp32 bundle (`--precision fp32`)"
    )]
    UnsupportedPrecision(Precision),
    #[error(
        "export setting {setting} is {bundle} in the bundle but {requested} was asked for; {hint}"
    )]
    ExportMismatch {
        setting: &'static str,
        bundle: String,
        requested: String,
        hint: String,
    },
    #[error(
        "graph `{role}` ({name}) does not match the bundle contract: {problem}; export the bundle again"
    )]
    GraphContract {
        role: &'static str,
        name: String,
        problem: String,
    },
}

/// An opened, checked bundle: its folder and its manifest. Opening verifies every checksum.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub dir: PathBuf,
    pub manifest: BundleManifest,
}

impl Bundle {
    /// Opens a bundle directory, or unpacks a `.zip` bundle into `unpack_dir` first, then checks
    /// it: format, consistency, every file's presence and sha256.
    pub fn open(path: &Path, unpack_dir: &Path) -> Result<Self, BundleError> {
        Self::open_with_known_hashes(path, unpack_dir, &BTreeMap::new())
    }

    /// The bundle directory's manifest alone, without checking its files (for checks before a
    /// run; [`Bundle::open`] checks them all).
    pub fn peek(dir: &Path) -> Result<Self, BundleError> {
        Ok(Self {
            dir: dir.to_path_buf(),
            manifest: read_manifest(dir)?,
        })
    }

    /// [`Bundle::open`], then refuses export settings that differ from the bundle's.
    pub fn open_for(
        path: &Path,
        unpack_dir: &Path,
        export: &ExportSettings,
    ) -> Result<Self, BundleError> {
        let bundle = Self::open(path, unpack_dir)?;
        bundle.check_export(export)?;
        Ok(bundle)
    }

    /// [`Bundle::open`], taking the sha256 of the files named in `known` (by their name in
    /// `bundle.toml`) as already read: `runner apply` hashes the staged bundle once for its audit,
    /// and its workers compare those hashes with `bundle.toml` instead of reading gigabytes again.
    /// Files `known` does not name are read and hashed.
    pub fn open_with_known_hashes(
        path: &Path,
        unpack_dir: &Path,
        known: &BTreeMap<String, String>,
    ) -> Result<Self, BundleError> {
        let dir = if path.is_dir() {
            path.to_path_buf()
        } else if path.is_file()
            && path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("zip"))
        {
            unpack_zip(path, unpack_dir)?
        } else {
            return Err(BundleError::NotABundle {
                path: path.to_path_buf(),
            });
        };
        let manifest = read_manifest(&dir)?;
        let bundle = Bundle { dir, manifest };
        bundle.check_consistency()?;
        bundle.verify_files(known)?;
        Ok(bundle)
    }

    pub fn graph_path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Latent height and width (`height / 8`, `width / 8` for Wan's VAE).
    pub fn latent_hw(&self) -> (usize, usize) {
        let stride = self.manifest.architecture.vae_stride;
        (
            self.manifest.export.height / stride[1],
            self.manifest.export.width / stride[2],
        )
    }

    /// Refuses requested export settings that differ from the bundle's.
    pub fn check_export(&self, requested: &ExportSettings) -> Result<(), BundleError> {
        let m = &self.manifest;
        let e = &m.export;
        let checks: [(&'static str, Option<String>, String); 6] = [
            (
                "frames_per_block",
                requested.frames_per_block.map(|v| v.to_string()),
                e.frames_per_block.to_string(),
            ),
            (
                "latent_frames",
                requested.latent_frames.map(|v| v.to_string()),
                e.latent_frames.to_string(),
            ),
            (
                "height",
                requested.height.map(|v| v.to_string()),
                e.height.to_string(),
            ),
            (
                "width",
                requested.width.map(|v| v.to_string()),
                e.width.to_string(),
            ),
            (
                "precision",
                requested.precision.map(|v| v.to_string()),
                m.precision.to_string(),
            ),
            (
                "svd_rank",
                requested.svd_rank.map(|v| v.to_string()),
                e.svd_rank.to_string(),
            ),
        ];
        for (setting, wanted, actual) in checks {
            if let Some(wanted) = wanted
                && wanted != actual
            {
                return Err(BundleError::ExportMismatch {
                    setting,
                    bundle: actual,
                    requested: wanted,
                    hint: export_hint(m, requested),
                });
            }
        }
        Ok(())
    }

    fn check_consistency(&self) -> Result<(), BundleError> {
        let m = &self.manifest;
        if m.format != BUNDLE_FORMAT {
            return Err(BundleError::Format { found: m.format });
        }
        let a = &m.architecture;
        let e = &m.export;
        let bad = |message: String| Err(BundleError::Inconsistent(message));
        if a.heads * a.head_dim != a.dim {
            return bad(format!(
                "heads {} x head_dim {} != dim {}",
                a.heads, a.head_dim, a.dim
            ));
        }
        if a.layers == 0 || a.text_len == 0 || e.frames_per_block == 0 {
            return bad("layers, text_len and frames_per_block must be positive".into());
        }
        if !e.latent_frames.is_multiple_of(e.frames_per_block) {
            return bad(format!(
                "latent_frames {} is not a multiple of frames_per_block {}",
                e.latent_frames, e.frames_per_block
            ));
        }
        let pixel_patch_h = a.vae_stride[1] * a.patch[1];
        let pixel_patch_w = a.vae_stride[2] * a.patch[2];
        if pixel_patch_h == 0
            || pixel_patch_w == 0
            || !e.height.is_multiple_of(pixel_patch_h)
            || !e.width.is_multiple_of(pixel_patch_w)
        {
            return bad(format!(
                "{}x{} pixels is not a multiple of the {}x{} pixel patch",
                e.height, e.width, pixel_patch_h, pixel_patch_w
            ));
        }
        let tokens = (e.height / pixel_patch_h) * (e.width / pixel_patch_w);
        if tokens != a.tokens_per_frame {
            return bad(format!(
                "tokens_per_frame {} but {}x{} pixels give {tokens}",
                a.tokens_per_frame, e.height, e.width
            ));
        }
        if m.latent.mean.len() != a.latent_channels || m.latent.std.len() != a.latent_channels {
            return bad(format!(
                "latent mean/std have {}/{} entries for {} latent channels",
                m.latent.mean.len(),
                m.latent.std.len(),
                a.latent_channels
            ));
        }
        if m.tokenizer.kind != TokenizerKind::Bytes {
            return Err(BundleError::UnsupportedTokenizer("umt5".into()));
        }
        let graphs = [
            ("text_encoder", Some(&m.graphs.text_encoder)),
            ("dit", Some(&m.graphs.dit)),
            ("dit_fused", m.graphs.dit_fused.as_ref()),
            ("dit_context", m.graphs.dit_context.as_ref()),
            ("vae_first", Some(&m.graphs.vae_first)),
            ("vae_step", Some(&m.graphs.vae_step)),
            ("vae_first_fused", m.graphs.vae_first_fused.as_ref()),
            ("vae_step_fused", m.graphs.vae_step_fused.as_ref()),
        ];
        for (role, name) in graphs.into_iter().filter_map(|(r, n)| Some((r, n?))) {
            if !m.files.contains_key(name.as_str()) {
                return Err(BundleError::GraphNotListed {
                    role,
                    name: name.clone(),
                });
            }
        }
        Ok(())
    }

    fn verify_files(&self, known: &BTreeMap<String, String>) -> Result<(), BundleError> {
        for (name, expected) in &self.manifest.files {
            if !is_safe_relative(name) {
                return Err(BundleError::UnsafeName { name: name.clone() });
            }
            let path = self.dir.join(name);
            if !path.is_file() {
                return Err(BundleError::MissingFile {
                    name: name.clone(),
                    dir: self.dir.clone(),
                });
            }
            let actual = match known.get(name) {
                Some(hash) => hash.clone(),
                None => sha256_file(&path).map_err(|source| BundleError::Read {
                    path: path.clone(),
                    source,
                })?,
            };
            if !actual.eq_ignore_ascii_case(expected) {
                return Err(BundleError::Checksum {
                    name: name.clone(),
                    expected: expected.clone(),
                    actual,
                });
            }
        }
        Ok(())
    }
}

/// What to run to get a bundle with the requested export settings: the exporter command line
/// (`assets/export/README.md`) with the bundle's preset and the requested precision and SVD
/// rank. Frame counts and sizes have no exporter flag (the preset fixes them), so for those the
/// hint says which preset values the bundle has and leaves the preset to choose.
pub fn export_hint(m: &BundleManifest, requested: &ExportSettings) -> String {
    let precision = requested.precision.unwrap_or(m.precision);
    let svd = match requested.svd_rank.unwrap_or(m.export.svd_rank) {
        SvdRank::None => String::new(),
        SvdRank::Rank(rank) => format!(" --svd-rank {rank}"),
    };
    let e = &m.export;
    let preset_fixed = requested
        .frames_per_block
        .is_some_and(|v| v != e.frames_per_block)
        || requested
            .latent_frames
            .is_some_and(|v| v != e.latent_frames)
        || requested.height.is_some_and(|v| v != e.height)
        || requested.width.is_some_and(|v| v != e.width);
    let command = |preset: &str| {
        format!(
            "PYTHONPATH=assets/export python -m unstep_export export --preset {preset} --precision {precision}{svd} --out BUNDLE_DIR"
        )
    };
    if preset_fixed {
        format!(
            "frame counts and sizes come from the exporter's preset (`{}` has {}x{} pixels, {} latent frames in blocks of {}): export with a preset that has the requested values, `{}`",
            m.preset,
            e.height,
            e.width,
            e.latent_frames,
            e.frames_per_block,
            command("PRESET")
        )
    } else {
        format!(
            "it is fixed at export time: `{}` exports a matching bundle",
            command(&m.preset)
        )
    }
}

fn read_manifest(dir: &Path) -> Result<BundleManifest, BundleError> {
    let path = dir.join(BUNDLE_TOML);
    let text = std::fs::read_to_string(&path).map_err(|source| BundleError::Read {
        path: path.clone(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| BundleError::Parse {
        path,
        message: e.to_string().trim_end().to_string(),
    })
}

/// Only plain relative names: a bundle must not make the runner read outside its folder.
fn is_safe_relative(name: &str) -> bool {
    let path = Path::new(name);
    !name.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)))
}

/// The sha256 of a file, lowercase hex, read in 1 MiB pieces (also used by `runner apply`'s
/// staging audit).
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Unpacks a `.zip` bundle into `unpack_dir/<zip stem>` and returns the folder that holds its
/// `bundle.toml` (the archive's root, or its single top-level folder).
fn unpack_zip(path: &Path, unpack_dir: &Path) -> Result<PathBuf, BundleError> {
    let zip_error = |message: String| BundleError::Zip {
        path: path.to_path_buf(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|source| BundleError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| zip_error(e.to_string()))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_os_string())
        .unwrap_or_else(|| "bundle".into());
    let target = unpack_dir.join(stem);
    std::fs::create_dir_all(&target)
        .map_err(|e| zip_error(format!("create {}: {e}", target.display())))?;
    // `extract` refuses entries that would land outside `target`.
    archive
        .extract(&target)
        .map_err(|e| zip_error(e.to_string()))?;
    if target.join(BUNDLE_TOML).is_file() {
        return Ok(target);
    }
    let entries: Vec<PathBuf> = std::fs::read_dir(&target)
        .map_err(|e| zip_error(e.to_string()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    match entries.as_slice() {
        [only] if only.join(BUNDLE_TOML).is_file() => Ok(only.clone()),
        _ => Err(zip_error(format!(
            "no {BUNDLE_TOML} at the archive's root or in its single top-level folder"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runner_attention_comes_with_exporter_0_10_0() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/tiny");
        let mut manifest = Bundle::peek(&dir).unwrap().manifest;
        assert!(
            manifest.fused_dit_has_runner_attention(),
            "the tiny bundle is 0.10.0 or later"
        );
        for (version, runner) in [
            ("0.9.0", false),
            ("0.4.2", false),
            ("0.10.0", true),
            ("0.11.3", true),
            ("1.0.0", true),
            ("dev", true),
        ] {
            manifest.exporter_version = version.into();
            assert_eq!(
                manifest.fused_dit_has_runner_attention(),
                runner,
                "{version}"
            );
        }
    }

    #[test]
    fn svd_rank_reads_none_or_positive_integers() {
        #[derive(Deserialize)]
        struct Wrapper {
            svd_rank: SvdRank,
        }
        let parse = |text: &str| toml::from_str::<Wrapper>(text).map(|w| w.svd_rank);
        assert_eq!(parse("svd_rank = \"none\"").unwrap(), SvdRank::None);
        assert_eq!(parse("svd_rank = 64").unwrap(), SvdRank::Rank(64));
        assert!(parse("svd_rank = 0").is_err());
        assert!(parse("svd_rank = \"full\"").is_err());
    }

    #[test]
    fn unsafe_file_names_are_recognised() {
        let cases = [
            ("dit.onnx", true),
            ("golden/golden.json", true),
            ("../etc/passwd", false),
            ("/etc/passwd", false),
            ("./dit.onnx", false),
            ("", false),
        ];
        for (name, safe) in cases {
            assert_eq!(is_safe_relative(name), safe, "{name}");
        }
    }
}

//! Asset bundles: `bundle.toml`, its checks, and unpacking `.zip` bundles (`docs/bundle.md`).
//!
//! Everything here runs before a session is created, so that a damaged or mismatched bundle is
//! reported before any generation (or any GPU) is touched.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use rayon::prelude::*;
use serde::Deserialize;
use sha2::{Digest, Sha256};

pub use super::settings::{Precision, SvdRank};
use super::text::tokenizer::BYTES_VOCAB;
use super::text::{PromptTokenizer, TokenizerError, Umt5Tokenizer};

mod archive;
pub(crate) use archive::extract_bundle_zip;
use archive::unpack_zip;
mod provenance;
use provenance::check_weights;
pub use provenance::{
    PartWeights, PromptCleaning, TextEncoderSection, TokenizerKind, TokenizerSection,
    TokenizerSource, TokenizerWeights, WeightSource, WeightsSection, WeightsSummary,
};

/// The only bundle format this runner reads.
pub const BUNDLE_FORMAT: u32 = 1;
pub const BUNDLE_TOML: &str = "bundle.toml";

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

/// The export-time method settings a bundle was made with (the "export" class).
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
    #[serde(default)]
    pub text_encoder: Option<TextEncoderSection>,
    #[serde(default)]
    pub weights: Option<WeightsSection>,
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
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, Deserialize)]
pub struct ExportSettings {
    pub frames_per_block: Option<usize>,
    pub latent_frames: Option<usize>,
    pub height: Option<usize>,
    pub width: Option<usize>,
    pub precision: Option<Precision>,
    pub svd_rank: Option<SvdRank>,
}

impl ExportSettings {
    /// What a manifest's method table asks of a bundle: every export setting.
    pub fn of(method: &crate::vocab::Method) -> Self {
        Self::asked(&crate::vocab::MethodFlags::all(method))
    }

    /// What the given method flags ask of a bundle: the export settings among them.
    pub fn asked(flags: &crate::vocab::MethodFlags) -> Self {
        let size = |v: Option<u64>| v.map(|v| v as usize);
        ExportSettings {
            frames_per_block: size(flags.frames_per_block.map(|b| b.0)),
            latent_frames: size(flags.latent_frames.map(|b| b.0)),
            height: size(flags.height.map(|b| b.0)),
            width: size(flags.width.map(|b| b.0)),
            precision: flags.precision,
            svd_rank: flags.svd_rank,
        }
    }
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
        "tokenizer file {name} is not listed in [files], so it cannot be checked; export the bundle again"
    )]
    TokenizerNotListed { name: String },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// A bundle the CPU provider cannot run: it runs fp32 bundles only.
    #[error("{}", cpu_precision_refusal(.0))]
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

/// An opened, checked bundle: its folder, its manifest and its prompt tokenizer. Opening
/// verifies every checksum and reads the tokenizer.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub dir: PathBuf,
    pub manifest: BundleManifest,
    /// Read when the bundle was opened; `None` for a peeked one.
    tokenizer: Option<Arc<PromptTokenizer>>,
    /// Seconds its opening took: the unpacking, the manifest and every file's check (0 for a
    /// peeked bundle); a process's start records it as its bundle check.
    pub opened_in_s: f64,
}

impl Bundle {
    /// Opens a bundle directory, or unpacks a `.zip` bundle into `unpack_dir` first, then checks
    /// it: format, consistency, every file's presence and sha256.
    pub fn open(path: &Path, unpack_dir: &Path) -> Result<Self, BundleError> {
        Self::open_with_known_hashes(path, unpack_dir, &BTreeMap::new())
    }

    /// The bundle directory's manifest alone, without checking its files (for checks before a
    /// run; [`Bundle::open`] checks them all). [`Bundle::tokenizer`] still reads and checks the
    /// tokenizer.
    pub fn peek(dir: &Path) -> Result<Self, BundleError> {
        Ok(Self {
            dir: dir.to_path_buf(),
            manifest: read_manifest(dir)?,
            tokenizer: None,
            opened_in_s: 0.0,
        })
    }

    /// The manifest of a bundle in either form, a directory or a `.zip` (read from the archive,
    /// nothing unpacked), without checking its files: what checks before a run read of a bundle
    /// they must not skip for its form.
    pub fn peek_manifest(path: &Path) -> Result<BundleManifest, BundleError> {
        if path.is_file()
            && path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("zip"))
        {
            let text = archive::zip_manifest_text(path)?;
            return parse_manifest(&text, path.join(BUNDLE_TOML));
        }
        read_manifest(path)
    }

    /// A bundle in either form with the checks that read no file's bytes, for checks before a
    /// run: `bundle.toml`'s format and consistency, every graph and the tokenizer listed in
    /// `[files]`, every listed name a plain relative name (nothing outside the bundle's folder)
    /// and, for a directory, every listed file there. [`Bundle::open`] makes the same checks in
    /// the same order, then every file's sha256 (a `.zip`'s entries are checked as it unpacks).
    pub fn peek_checked(path: &Path) -> Result<Self, BundleError> {
        let bundle = Self {
            dir: path.to_path_buf(),
            manifest: Self::peek_manifest(path)?,
            tokenizer: None,
            opened_in_s: 0.0,
        };
        bundle.check_names(path.is_dir())?;
        bundle.check_consistency()?;
        Ok(bundle)
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
        let started = std::time::Instant::now();
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
        let mut bundle = Bundle {
            dir,
            manifest,
            tokenizer: None,
            opened_in_s: 0.0,
        };
        bundle.check_names(true)?;
        bundle.check_consistency()?;
        bundle.verify_hashes(known)?;
        // The checksums above include the tokenizer file's.
        bundle.tokenizer = Some(Arc::new(bundle.read_tokenizer(false)?));
        bundle.opened_in_s = started.elapsed().as_secs_f64();
        Ok(bundle)
    }

    /// The bundle's prompt tokenizer: the one read when the bundle was opened, or for a peeked
    /// bundle, read and checked now (the tokenizer file's sha256 included).
    pub fn tokenizer(&self) -> Result<Arc<PromptTokenizer>, BundleError> {
        match &self.tokenizer {
            Some(tokenizer) => Ok(Arc::clone(tokenizer)),
            None => Ok(Arc::new(self.read_tokenizer(true)?)),
        }
    }

    /// Reads and checks the tokenizer `[tokenizer]` names (and its sha256 when `verify`).
    fn read_tokenizer(&self, verify: bool) -> Result<PromptTokenizer, BundleError> {
        self.check_tokenizer_section()?;
        let m = &self.manifest;
        let text_len = m.architecture.text_len;
        let name = match (m.tokenizer.kind, &m.tokenizer.file) {
            (TokenizerKind::Umt5, Some(name)) => name,
            _ => return Ok(PromptTokenizer::Bytes { text_len }),
        };
        let path = self.dir.join(name);
        let bytes = std::fs::read(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => BundleError::MissingFile {
                name: name.clone(),
                dir: self.dir.clone(),
            },
            _ => BundleError::Read {
                path: path.clone(),
                source,
            },
        })?;
        if verify {
            let expected = &m.files[name.as_str()];
            let actual = sha256_hex(&bytes);
            if !actual.eq_ignore_ascii_case(expected) {
                return Err(BundleError::Checksum {
                    name: name.clone(),
                    expected: expected.clone(),
                    actual,
                });
            }
        }
        let json = String::from_utf8(bytes).map_err(|e| TokenizerError::Parse {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let vocab = m.text_encoder.as_ref().map(|t| t.vocab);
        let tokenizer = Umt5Tokenizer::from_json(&path, &json, text_len, vocab)?;
        Ok(PromptTokenizer::Umt5(Box::new(tokenizer)))
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
        self.check_tokenizer_section()?;
        if let Some(te) = &m.text_encoder
            && (te.layers == 0 || te.vocab == 0)
        {
            return bad("[text_encoder] layers and vocab must be positive".into());
        }
        if let Some(weights) = &m.weights {
            check_weights(weights, m.tokenizer.kind)
                .map_err(|e| BundleError::Inconsistent(e.to_string()))?;
        }
        if m.precision == Precision::Fp8 && m.graphs.dit_fused.is_none() {
            return bad(
                "precision = \"fp8\" but no `dit_fused` graph: an fp8 bundle's 8-bit matrix \
                 multiplies are in `dit_fused` alone"
                    .into(),
            );
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

    /// `[tokenizer]` as its kind needs it: `bytes` alone, `umt5` with a file listed in
    /// `[files]` and its cleaning; and ids the text encoder's `vocab` has rows for (a umt5
    /// tokenizer's vocabulary is checked when it is read).
    fn check_tokenizer_section(&self) -> Result<(), BundleError> {
        let m = &self.manifest;
        let t = &m.tokenizer;
        let bad = |message: &str| Err(BundleError::Inconsistent(message.into()));
        match t.kind {
            TokenizerKind::Bytes => {
                if t.file.is_some() || t.clean.is_some() {
                    return bad("[tokenizer] kind = \"bytes\" takes no file or clean");
                }
                if let Some(te) = &m.text_encoder
                    && te.vocab < BYTES_VOCAB
                {
                    return Err(BundleError::Inconsistent(format!(
                        "the bytes tokenizer gives ids up to {} but [text_encoder] vocab is {}",
                        BYTES_VOCAB - 1,
                        te.vocab
                    )));
                }
            }
            TokenizerKind::Umt5 => {
                let Some(name) = &t.file else {
                    return bad(
                        "[tokenizer] kind = \"umt5\" needs its file (file = \"tokenizer.json\")",
                    );
                };
                if t.clean.is_none() {
                    return bad(
                        "[tokenizer] kind = \"umt5\" needs its cleaning (clean = \"whitespace\")",
                    );
                }
                if !is_safe_relative(name) {
                    return Err(BundleError::UnsafeName { name: name.clone() });
                }
                if !m.files.contains_key(name.as_str()) {
                    return Err(BundleError::TokenizerNotListed { name: name.clone() });
                }
            }
        }
        Ok(())
    }

    /// Every name in `[files]` is a plain relative name and, with `present`, a file in the
    /// bundle's folder.
    fn check_names(&self, present: bool) -> Result<(), BundleError> {
        for name in self.manifest.files.keys() {
            if !is_safe_relative(name) {
                return Err(BundleError::UnsafeName { name: name.clone() });
            }
            if present && !self.dir.join(name).is_file() {
                return Err(BundleError::MissingFile {
                    name: name.clone(),
                    dir: self.dir.clone(),
                });
            }
        }
        Ok(())
    }

    /// Every listed file's sha256 against `bundle.toml` (after [`Self::check_names`]).
    fn verify_hashes(&self, known: &BTreeMap<String, String>) -> Result<(), BundleError> {
        // The files not already checked are hashed side by side: a bundle is a few large files,
        // and one core hashes about 1.4 GB/s. The first file in name order that fails is the
        // error, whatever the order they finish in.
        let files: Vec<(&String, &String)> = self.manifest.files.iter().collect();
        let hashes: Vec<Result<String, BundleError>> = files
            .par_iter()
            .map(|(name, _)| match known.get(*name) {
                Some(hash) => Ok(hash.clone()),
                None => {
                    let path = self.dir.join(name);
                    sha256_file(&path).map_err(|source| BundleError::Read { path, source })
                }
            })
            .collect();
        for ((name, expected), actual) in files.into_iter().zip(hashes) {
            let actual = actual?;
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

/// Why the CPU provider refuses a bundle of this precision, and what to do.
fn cpu_precision_refusal(precision: &Precision) -> String {
    let gpu = match precision {
        Precision::Fp8 => {
            "an fp8 bundle runs only on a GPU, with the CUDA provider (runtime.provider = \"cuda\", \
             `--provider cuda`) and the runner's fused DiT"
        }
        Precision::Fp32 | Precision::Fp16 | Precision::Bf16 => {
            "run it on a GPU (runtime.provider = \"cuda\", `--provider cuda`)"
        }
    };
    format!(
        "precision {precision} does not run on the CPU provider, which runs fp32 bundles only: \
         {gpu}, or export an fp32 bundle (`--precision fp32`) for the CPU"
    )
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
    // An fp8 bundle is not exported directly: the exporter quantizes an fp16 export of the same
    // weights, so the command to run is the fp16 export that it is made from.
    let exported = match precision {
        Precision::Fp8 => Precision::Fp16,
        Precision::Fp32 | Precision::Fp16 | Precision::Bf16 => precision,
    };
    let quantize = if precision == Precision::Fp8 {
        ", then the exporter's `quantize` of it makes the fp8 bundle (assets/export/README.md)"
    } else {
        ""
    };
    let command = |preset: &str| {
        format!(
            "PYTHONPATH=assets/export python -m unstep_export export --preset {preset} --precision {exported}{svd} --out BUNDLE_DIR"
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
        ) + quantize
    } else if precision == Precision::Fp8 {
        format!(
            "it is fixed at export time: `{}` exports the fp16 bundle{quantize}",
            command(&m.preset)
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
    parse_manifest(&text, path)
}

/// `bundle.toml`'s text, read from `path` (for its errors).
fn parse_manifest(text: &str, path: PathBuf) -> Result<BundleManifest, BundleError> {
    toml::from_str(text).map_err(|e| BundleError::Parse {
        path,
        message: e.to_string().trim_end().to_string(),
    })
}

/// Only plain relative names: a bundle must not make the runner read outside its folder.
fn is_safe_relative(name: &str) -> bool {
    let path = Path::new(name);
    !name.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)))
}

pub use crate::file_identity::sha256_file;

/// The sha256 of bytes in memory, lowercase hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;

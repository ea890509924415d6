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

/// The tiny bundle's manifest with `tables` in place of its `[tokenizer]`.
fn with_tables(tables: &str) -> Result<BundleManifest, toml::de::Error> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/tiny");
    let text = std::fs::read_to_string(dir.join(BUNDLE_TOML)).unwrap();
    let start = text.find("[tokenizer]").unwrap();
    let end = text.find("[graphs]").unwrap();
    toml::from_str(&format!("{}{tables}\n{}", &text[..start], &text[end..]))
}

const RELEASED: &str = r#"
[tokenizer]
kind = "umt5"
file = "tokenizer.json"
clean = "whitespace"

[text_encoder]
layers = 24
vocab = 256384
precision = "fp32"

[weights]
[weights.dit]
source = "released"
file = "self_forcing_dmd.pt"
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
entry = "generator_ema"
[weights.vae]
source = "random"
seed = 2
[weights.text_encoder]
source = "released"
file = "models_t5_umt5-xxl-enc-bf16.pth"
sha256 = "1111111111111111111111111111111111111111111111111111111111111111"
[weights.tokenizer]
source = "released"
file = "google/umt5-xxl/tokenizer.json"
sha256 = "2222222222222222222222222222222222222222222222222222222222222222"
"#;

/// Exporter 0.13.0's tables read as written, and say where the weights come from.
#[test]
fn tokenizer_text_encoder_and_weights_tables_are_read() {
    let m = with_tables(RELEASED).unwrap();
    assert_eq!(m.tokenizer.kind, TokenizerKind::Umt5);
    assert_eq!(m.tokenizer.file.as_deref(), Some("tokenizer.json"));
    assert_eq!(m.tokenizer.clean, Some(PromptCleaning::Whitespace));
    let te = m.text_encoder.as_ref().unwrap();
    assert_eq!(
        (te.layers, te.vocab, te.precision),
        (24, 256384, Precision::Fp32)
    );
    let weights = m.weights.as_ref().unwrap();
    assert_eq!(weights.summary(), WeightsSummary::Mixed);
    assert_eq!(
        weights.sources().map(|(_, s)| s),
        [
            WeightSource::Released,
            WeightSource::Random,
            WeightSource::Released
        ]
    );
    assert_eq!(
        weights.dit.as_ref().unwrap().entry.as_deref(),
        Some("generator_ema")
    );
    assert_eq!(
        weights.tokenizer.as_ref().unwrap().source,
        TokenizerSource::Released
    );
    assert_eq!(check_weights(weights, TokenizerKind::Umt5), Ok(()));
    // Older bundles: `bytes` alone, no text encoder or weights tables (seeded random).
    let old = with_tables("[tokenizer]\nkind = \"bytes\"\n").unwrap();
    assert_eq!((old.text_encoder, old.weights), (None, None));
    assert_eq!(WeightsSection::default().summary(), WeightsSummary::Random);
    assert!(with_tables("[tokenizer]\nkind = \"umt5\"\nfiles = \"t.json\"\n").is_err());
    assert!(with_tables("[tokenizer]\nkind = \"umt5\"\nclean = \"lower\"\n").is_err());
}

#[test]
fn weights_tables_must_fit_their_source() {
    let released = |extra: &str| {
        format!(
            "[tokenizer]\nkind = \"umt5\"\nfile = \"t.json\"\nclean = \"whitespace\"\n\
             [weights.vae]\n{extra}\n"
        )
    };
    let cases = [
        ("source = \"released\"\nsha256 = \"00\"", "needs its file"),
        (
            "source = \"released\"\nfile = \"v.pth\"",
            "needs the file's sha256",
        ),
        ("source = \"random\"\nfile = \"v.pth\"", "takes no file"),
        (
            "source = \"random\"\nseed = 2\nentry = \"g\"",
            "takes no file, sha256 or entry",
        ),
    ];
    for (table, problem) in cases {
        let m = with_tables(&released(table)).unwrap();
        let err = check_weights(m.weights.as_ref().unwrap(), TokenizerKind::Umt5)
            .unwrap_err()
            .to_string();
        assert!(err.contains(problem), "{table}: {err}");
    }
    let m = with_tables(RELEASED).unwrap();
    let err = check_weights(m.weights.as_ref().unwrap(), TokenizerKind::Bytes)
        .unwrap_err()
        .to_string();
    assert!(err.contains("[weights.tokenizer]"), "{err}");
}

/// The bytes tokenizer's ids run to 256: a text encoder with fewer rows is refused.
#[test]
fn a_bytes_tokenizer_needs_257_embedding_rows() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/tiny");
    let mut bundle = Bundle::peek(&dir).unwrap();
    bundle.manifest.tokenizer = TokenizerSection {
        kind: TokenizerKind::Bytes,
        file: None,
        clean: None,
    };
    if let Some(weights) = bundle.manifest.weights.as_mut() {
        weights.tokenizer = None;
    }
    for (vocab, ok) in [(256, false), (257, true)] {
        bundle.manifest.text_encoder = Some(TextEncoderSection {
            layers: 2,
            vocab,
            precision: Precision::Fp32,
        });
        let result = bundle.check_consistency();
        assert_eq!(result.is_ok(), ok, "{vocab}: {result:?}");
    }
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

/// An fp8 bundle's 8-bit matrix multiplies are in `dit_fused` alone: one without it is refused.
#[test]
fn an_fp8_bundle_needs_its_fused_dit() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/tiny");
    let mut bundle = Bundle::peek(&dir).unwrap();
    bundle.manifest.precision = Precision::Fp8;
    assert!(bundle.check_consistency().is_ok());
    bundle.manifest.graphs.dit_fused = None;
    let err = bundle.check_consistency().unwrap_err();
    assert!(
        matches!(&err, BundleError::Inconsistent(m) if m.contains("no `dit_fused` graph")),
        "{err}"
    );
    // Without fp8, the fused DiT is optional.
    bundle.manifest.precision = Precision::Fp16;
    assert!(bundle.check_consistency().is_ok());
}

/// The CPU provider's refusal says where the bundle runs and that the CPU runs fp32 bundles.
#[test]
fn the_cpu_refusal_says_where_a_bundle_runs() {
    let fp8 = BundleError::UnsupportedPrecision(Precision::Fp8).to_string();
    assert!(
        fp8.starts_with("precision fp8 does not run on the CPU provider")
            && fp8.contains("runs fp32 bundles only")
            && fp8.contains("only on a GPU, with the CUDA provider"),
        "{fp8}"
    );
    let fp16 = BundleError::UnsupportedPrecision(Precision::Fp16).to_string();
    assert!(
        fp16.contains("run it on a GPU") && !fp16.contains("fp8"),
        "{fp16}"
    );
}

/// An fp8 bundle is quantized from an fp16 export: the hint exports that and names the step.
#[test]
fn the_export_hint_for_fp8_exports_fp16_to_quantize() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/tiny");
    let bundle = Bundle::peek(&dir).unwrap();
    let requested = ExportSettings {
        precision: Some(Precision::Fp8),
        ..ExportSettings::default()
    };
    let err = bundle.check_export(&requested).unwrap_err().to_string();
    assert!(
        err.contains("is fp32 in the bundle but fp8 was asked for")
            && err.contains("--preset tiny --precision fp16 --out BUNDLE_DIR")
            && err.contains("`quantize`"),
        "{err}"
    );
    let fp16 = ExportSettings {
        precision: Some(Precision::Fp16),
        ..ExportSettings::default()
    };
    let err = bundle.check_export(&fp16).unwrap_err().to_string();
    assert!(
        err.contains("--precision fp16") && !err.contains("quantize"),
        "{err}"
    );
}

/// With several damaged files, the error names the first in name order (the files are hashed
/// side by side, so the order they finish in must not decide it); a hash the caller already
/// checked is taken as it is, and a damaged file whose hash it passes is not read.
#[test]
fn of_several_damaged_files_the_first_by_name_is_reported() {
    let tiny = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/tiny");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&tiny).unwrap().flatten() {
        if entry.path().is_file() {
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    let manifest = Bundle::peek(dir.path()).unwrap().manifest;
    let names: Vec<&String> = manifest.files.keys().collect();
    assert!(names.len() >= 3, "{names:?}");
    // Damage the last file and the second: the second is reported.
    for name in [names[names.len() - 1], names[1]] {
        let mut bytes = std::fs::read(dir.path().join(name)).unwrap();
        bytes[0] ^= 0xff;
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let unpack = tempfile::tempdir().unwrap();
    match Bundle::open(dir.path(), unpack.path()) {
        Err(BundleError::Checksum { name, .. }) => assert_eq!(&name, names[1]),
        other => panic!("expected a checksum error, got {other:?}"),
    }
    // The second's recorded hash passed as checked already: the last one is reported.
    let known: BTreeMap<String, String> =
        [(names[1].clone(), manifest.files[names[1]].clone())].into();
    match Bundle::open_with_known_hashes(dir.path(), unpack.path(), &known) {
        Err(BundleError::Checksum { name, .. }) => assert_eq!(&name, names[names.len() - 1]),
        other => panic!("expected a checksum error, got {other:?}"),
    }
}

//! The umt5 prompt tokenizer: token for token the reference pipeline's (the exporter's Python,
//! `unstep_export.tokenizer`), `runner prompts`, and the bundle checks of its tokenizer.json.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use unstep::engine::Bundle;

use crate::support::{
    Test, bytes_bundle, filtered, python, repo, sha256_hex, test_tokenizer_json, umt5_bundle,
};

/// Prompts for the comparison: long ones, scripts and emoji, HTML references, quotes, ligatures,
/// every kind of whitespace, control characters, and special tokens spelled out. None holds a
/// `\n` (a prompt file's line cannot).
fn prompts() -> Vec<String> {
    let long = "word ".repeat(200);
    [
    "a red fox running through snow",
    "a sailboat drifting on a calm blue sea at sunset, with seagulls circling above the mast and \
     a lighthouse blinking on the far shore while the waves roll gently toward the sandy beach",
    long.as_str(),
    "café crème brûlée, naïve façade, Größe, señor, Ångström",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "emoji 😀🎉👍🏽 and a family 👨‍👩‍👧 and a flag 🏴󠁧󠁢󠁷󠁬󠁳󠁿",
    "combining e\u{301} a\u{308} o\u{302}\u{323} and precomposed é",
    "ＦＵＬＬＷＩＤＴＨ　ｔｅｘｔ and ｶﾀｶﾅ and ﾞ marks",
    "&amp;amp; &#39;quoted&#39; &nbsp;space &notit; &#x1F600; &#0; end",
    "&lt;tag&gt; &EACUTE;clair &Eacute;clair &amp &ampxyz &#65 &#x41; &#128; &#xD800;",
    "<b>bold &amp;amp; kept</b> &notin;",
    "\u{201c}double\u{201d} \u{2018}single\u{2019} \u{2bc}modifier \u{201e}low\u{201f}",
    "\u{fb01}sh \u{fb02}ower o\u{fb03}ce \u{132}ssel \u{1c6} \u{fb06}op",
    "tab\there\u{3000}ideographic\u{a0}nbsp\u{2028}line\u{2029}para\u{b}vertical\u{c}form\u{85}nel end",
    "   spaces around   ",
    "\u{3000} \t ",
    "bell\u{7} esc\u{1b}[31mred\u{1b}[0m del\u{7f} bom\u{feff} nul\u{0} sep\u{1c}x \u{206a}y \u{fffc}z",
    "c1 controls \u{80} \u{91}quoted\u{92} \u{9d}",
    "<unk> </s> <pad> and <extra_id_0>",
    "ancient 𓀀 glyphs and ☃ snowmen",
    "",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect()
}

/// The reference's tokens for `prompts` (one JSON object per prompt: ids, mask, truncated).
fn reference(tokenizer: &Path, text_len: usize, prompts: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompts.txt");
    std::fs::write(&file, prompts.join("\n") + "\n").unwrap();
    let out = Command::new(python())
        .args(["-m", "unstep_export.tokenizer", "encode", "--tokenizer"])
        .arg(tokenizer)
        .args(["--text-len", &text_len.to_string(), "--prompts"])
        .arg(&file)
        .env("PYTHONPATH", repo().join("assets/export"))
        .current_dir(repo())
        .output()
        .expect("the reference tokenizer runs");
    assert!(
        out.status.success(),
        "the reference tokenizer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), prompts.len(), "one line per prompt");
    lines
}

fn ids(value: &Value) -> Vec<i64> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect()
}

/// Every prompt, padded ids, mask and truncation, equal to the reference's for a short, a medium
/// and the reference pipeline's `text_len`.
#[test]
fn umt5_tokens_equal_the_reference_pipelines_token_for_token() {
    let t = Test::new();
    let prompts = prompts();
    let prompts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    for text_len in [16, 32, 512] {
        let dir = t.path().join(format!("b{text_len}"));
        let bundle = umt5_bundle(&dir, &test_tokenizer_json(), text_len, 1000);
        let tokenizer = Bundle::open(&bundle, t.path())
            .unwrap()
            .tokenizer()
            .unwrap();
        let expected = reference(&bundle.join("tokenizer.json"), text_len, &prompts);
        let mut truncated = 0;
        for (prompt, want) in prompts.iter().zip(&expected) {
            let got = tokenizer.encode(prompt).unwrap();
            assert_eq!(
                got.ids,
                ids(&want["ids"]),
                "ids of {prompt:?} at {text_len}"
            );
            assert_eq!(
                got.mask,
                ids(&want["mask"]),
                "mask of {prompt:?} at {text_len}"
            );
            assert_eq!(
                Value::Bool(got.truncated),
                want["truncated"],
                "truncation of {prompt:?} at {text_len}"
            );
            assert!(!got.mojibake, "{prompt:?}");
            truncated += usize::from(got.truncated);
        }
        assert!(truncated > 0, "some prompts are cut at {text_len}");
    }
}

/// `runner prompts --json` gives each prompt's own ids (the reference's without the padding),
/// count and truncation.
#[test]
fn runner_prompts_json_equals_the_reference() {
    let t = Test::new();
    let bundle = umt5_bundle(&t.path().join("tb"), &test_tokenizer_json(), 32, 1000);
    // A prompt file's blank lines are not prompts.
    let all = prompts();
    let prompts: Vec<&str> = all
        .iter()
        .map(String::as_str)
        .filter(|p| !p.trim().is_empty())
        .collect();
    std::fs::write(t.path().join("p.txt"), prompts.join("\n") + "\n").unwrap();
    let out = t.cmd().args(["prompts", "tb", "p.txt", "--json"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    let expected = reference(&bundle.join("tokenizer.json"), 32, &prompts);
    let entries = report["prompts"].as_array().unwrap();
    assert_eq!(entries.len(), prompts.len());
    for (i, (got, want)) in entries.iter().zip(&expected).enumerate() {
        let mask = ids(&want["mask"]);
        let len = mask.iter().filter(|&&m| m == 1).count();
        assert_eq!(got["index"], i, "{got}");
        assert_eq!(got["tokens"], len, "{:?}", prompts[i]);
        assert_eq!(
            ids(&got["ids"]),
            ids(&want["ids"])[..len],
            "{:?}",
            prompts[i]
        );
        assert_eq!(got["truncated"], want["truncated"], "{:?}", prompts[i]);
    }
    let cut = expected.iter().filter(|e| e["truncated"] == true).count();
    assert_eq!(report["truncated"], cut);
    assert_eq!(report["tokenizer"], "umt5");
    assert_eq!(report["text_len"], 32);
}

/// Mojibake (UTF-8 read as Windows-1252) is what ftfy repairs and this cleaning does not: the
/// tokens differ from the reference's, and `runner prompts` warns about the prompt.
#[test]
fn mojibake_is_reported_rather_than_repaired() {
    let t = Test::new();
    let bundle = umt5_bundle(&t.path().join("tb"), &test_tokenizer_json(), 32, 1000);
    let prompts = ["a clean prompt", "caf\u{c3}\u{a9} cr\u{c3}\u{a8}me"];
    std::fs::write(t.path().join("p.txt"), prompts.join("\n")).unwrap();
    let out = t.cmd().args(["prompts", "tb", "p.txt", "--json"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["mojibake"], serde_json::json!([1]));
    assert!(
        out.stderr.contains("warning: prompt 1 looks like mojibake"),
        "{}",
        out.stderr
    );
    let expected = reference(&bundle.join("tokenizer.json"), 32, &prompts);
    let mask = ids(&expected[1]["mask"]);
    let len = mask.iter().filter(|&&m| m == 1).count();
    assert_ne!(
        ids(&report["prompts"][1]["ids"]),
        ids(&expected[1]["ids"])[..len],
        "the reference repairs the mojibake"
    );
}

const SHOWN_PROMPTS: &str = "a cat on a mat\n\
    a sailboat drifting on a calm blue sea at sunset with seagulls\n\
    Tom &amp;amp; Jerry\u{2019}s \u{fb01}ne show\n";

#[test]
fn runner_prompts_shows_each_prompts_tokens_and_the_truncated_count() {
    let t = Test::new().file("p.txt", SHOWN_PROMPTS);
    umt5_bundle(&t.path().join("tb"), &test_tokenizer_json(), 16, 1000);
    let out = t.cmd().args(["prompts", "tb", "p.txt"]).run();
    assert_eq!(out.code, 0, "{}", out.render());
    let json = t.cmd().args(["prompts", "tb", "p.txt", "--json"]).run();
    assert_eq!(json.code, 0, "{}", json.render());
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    filtered(t.path(), || {
        insta::assert_snapshot!("prompts_plain", out.render());
        insta::assert_json_snapshot!("prompts_json", value);
    });
}

/// The bytes tokenizer of older bundles: one id per UTF-8 byte, no `</s>`.
#[test]
fn runner_prompts_reads_a_bytes_bundle() {
    let t = Test::new().file("p.txt", "ab\nh\u{e9}\n");
    let bundle = bytes_bundle(&t.path().join("bytes"));
    let out = t
        .cmd()
        .args(["prompts", bundle.to_str().unwrap(), "p.txt", "--json"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let value: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(value["tokenizer"], "bytes");
    assert_eq!(value["prompts"][0]["ids"], serde_json::json!([98, 99]));
    assert_eq!(
        value["prompts"][1]["ids"],
        serde_json::json!([105, 0xc4, 0xaa])
    );
}

/// A tokenizers tokenizer.json of the given model type, with `<pad>` and `</s>`.
fn other_model(model: &str) -> String {
    let vocab = r#"{"<pad>": 0, "</s>": 1, "<unk>": 2, "a": 3}"#;
    let model = match model {
        "BPE" => format!(
            r#"{{"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": {vocab}, "merges": []}}"#
        ),
        _ => format!(r#"{{"type": "WordLevel", "vocab": {vocab}, "unk_token": "<unk>"}}"#),
    };
    format!(
        r#"{{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null, "model": {model}}}"#
    )
}

/// Runs `runner prompts` on a broken bundle: exit status 2, nothing on stdout, and the message.
fn refused(t: &Test, bundle: &str) -> String {
    let out = t.cmd().args(["prompts", bundle, "p.txt"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(out.stdout.is_empty(), "{}", out.render());
    out.render()
}

fn edit(path: &Path, f: impl Fn(String) -> String) {
    let text = std::fs::read_to_string(path).unwrap();
    std::fs::write(path, f(text)).unwrap();
}

#[test]
fn broken_tokenizers_are_refused_with_what_to_do() {
    let t = Test::new().file("p.txt", "a cat\n");
    let mut cases: Vec<(&str, PathBuf)> = Vec::new();
    for model in ["BPE", "WordLevel"] {
        let dir = t.path().join(model);
        umt5_bundle(&dir, other_model(model).as_bytes(), 16, 1000);
        cases.push((model, dir));
    }
    // The file listed, but not there.
    let missing = umt5_bundle(&t.path().join("missing"), &test_tokenizer_json(), 16, 1000);
    std::fs::remove_file(missing.join("tokenizer.json")).unwrap();
    cases.push(("missing", missing));
    // There, but not listed in [files].
    let unlisted = umt5_bundle(&t.path().join("unlisted"), &test_tokenizer_json(), 16, 1000);
    edit(&unlisted.join("bundle.toml"), |s| {
        s.lines()
            .filter(|l| !l.starts_with("\"tokenizer.json\""))
            .map(|l| format!("{l}\n"))
            .collect()
    });
    cases.push(("unlisted", unlisted));
    // Changed after the export.
    let changed = umt5_bundle(&t.path().join("changed"), &test_tokenizer_json(), 16, 1000);
    let mut json = test_tokenizer_json();
    json.push(b'\n');
    std::fs::write(changed.join("tokenizer.json"), &json).unwrap();
    cases.push(("checksum", changed));
    // Ids the text encoder has no embedding rows for.
    cases.push((
        "vocab",
        umt5_bundle(&t.path().join("vocab"), &test_tokenizer_json(), 16, 500),
    ));
    // No `<pad>` to pad with.
    let json = String::from_utf8(test_tokenizer_json())
        .unwrap()
        .replace("\"<pad>\"", "\"<nopad>\"");
    cases.push((
        "no_pad",
        umt5_bundle(&t.path().join("no_pad"), json.as_bytes(), 16, 1000),
    ));
    // umt5 without the file it needs.
    let no_file = umt5_bundle(&t.path().join("no_file"), &test_tokenizer_json(), 16, 1000);
    edit(&no_file.join("bundle.toml"), |s| {
        s.replace("file = \"tokenizer.json\"\nclean", "clean")
    });
    cases.push(("no_file", no_file));
    let mut text = String::new();
    for (name, dir) in &cases {
        let bundle = dir.file_name().unwrap().to_str().unwrap();
        text.push_str(&format!("## {name}\n{}\n", refused(&t, bundle)));
    }
    filtered(t.path(), || {
        insta::assert_snapshot!("prompts_broken_tokenizers", text)
    });
}

#[test]
fn a_missing_prompt_file_or_bundle_is_a_usage_error() {
    let t = Test::new();
    umt5_bundle(&t.path().join("tb"), &test_tokenizer_json(), 16, 1000);
    let out = t.cmd().args(["prompts", "tb", "absent.txt"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(out.stderr.contains("absent.txt"), "{}", out.render());
    std::fs::write(t.path().join("p.txt"), "a\n").unwrap();
    let out = t.cmd().args(["prompts", "nowhere", "p.txt"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(out.stderr.contains("nowhere"), "{}", out.render());
}

/// A CPU probe manifest `m.toml` over `bundle` and `prompts` (a file), prompts `indices`.
fn probe_manifest(t: &Test, bundle: &Path, prompts: &Path, indices: &str) {
    let root = t.path().display().to_string();
    let manifest = format!(
        "kind = \"probe\"\n\
         [prompts]\nfile = \"{prompts}\"\nindices = \"{indices}\"\n\
         [runtime]\nprovider = \"cpu\"\ncpu_threads_per_process = 1\n\
         [method]\nheight = 64\nwidth = 112\nprecision = \"fp32\"\n\
         [outputs]\ndir = \"{root}/results\"\n\
         [staging]\nwork_root = \"{root}/work\"\n\
         [assets]\nbundle = \"{bundle}\"\n",
        prompts = prompts.display(),
        bundle = bundle.display(),
    );
    std::fs::write(t.path().join("m.toml"), manifest).unwrap();
}

/// `runner apply` refuses a bundle whose tokenizer gives ids its text encoder has no rows for
/// (the tiny graphs' embedding has 257) before anything is written.
#[test]
fn apply_refuses_a_tokenizer_beyond_the_text_encoders_vocabulary() {
    let t = Test::new();
    let bundle = umt5_bundle(&t.path().join("tb"), &test_tokenizer_json(), 32, 257);
    probe_manifest(&t, &bundle, &repo().join("assets/prompts/tiny.txt"), "0");
    let out = t.cmd().args(["apply", "--quiet", "m.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr.contains("gives token ids up to 999")
            && out.stderr.contains("257 embedding rows"),
        "{}",
        out.stderr
    );
    assert!(!t.path().join("results").exists() && !t.path().join("work").exists());
}

/// `run.json` records a umt5 run's tokenizer, its truncated prompts and the weights' sources, and
/// `runner apply` warns about the truncated prompts. The tiny graphs cannot run the tokenizer's
/// ids (their embedding has 257 rows; this bundle.toml claims 1000), so the workers fail after
/// the record is written.
#[test]
fn apply_records_the_tokenizer_and_warns_about_truncated_prompts() {
    let t = Test::new().file(
        "p.txt",
        "a cat\na sailboat drifting on a calm blue sea at sunset with seagulls above\na dog\n",
    );
    let bundle = umt5_bundle(&t.path().join("tb"), &test_tokenizer_json(), 16, 1000);
    probe_manifest(&t, &bundle, &t.path().join("p.txt"), "0-2");
    let out = t.cmd().args(["apply", "m.toml"]).run();
    assert_ne!(out.code, 0, "{}", out.render());
    assert!(
        out.stderr.contains(
            "warning: 1 of 3 prompts have more than text_len 16 tokens and are cut there (prompts 1)"
        ),
        "{}",
        out.stderr
    );
    let run: Value = serde_json::from_str(
        &std::fs::read_to_string(t.path().join("results/m/run.json")).unwrap(),
    )
    .unwrap();
    let tokenizer = &run["tokenizer"];
    assert_eq!(tokenizer["kind"], "umt5", "{run}");
    assert_eq!(tokenizer["text_len"], 16, "{run}");
    assert_eq!(tokenizer["prompts"], 3, "{run}");
    assert_eq!(tokenizer["truncated"], 1, "{run}");
    assert_eq!(
        tokenizer["truncated_prompts"],
        serde_json::json!([1]),
        "{run}"
    );
    assert_eq!(
        run["weights"],
        serde_json::json!({
            "source": "random", "dit": "random", "vae": "random",
            "text_encoder": "random", "tokenizer": "file"
        }),
        "{run}"
    );
}

/// The character tables of the cleaning are what the reference's Python gives.
#[test]
fn the_cleaning_tables_match_python() {
    let out = Command::new(python())
        .arg(repo().join("src/engine/text/gen_tables.py"))
        .arg("--check")
        .arg(repo().join("src/engine/text/tables"))
        .output()
        .expect("the generator runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The sha256 helper agrees with the bundle's checks (a mismatch would read as a checksum
/// error in every test above).
#[test]
fn the_test_bundles_list_their_tokenizer() {
    let t = Test::new();
    let bundle = umt5_bundle(&t.path().join("tb"), &test_tokenizer_json(), 16, 1000);
    let toml = std::fs::read_to_string(bundle.join("bundle.toml")).unwrap();
    assert!(toml.contains(&sha256_hex(&test_tokenizer_json())));
    let opened = Bundle::open(&bundle, t.path()).unwrap();
    assert_eq!(opened.tokenizer().unwrap().kind(), "umt5");
}

//! Text contexts encoded once per run: a generation's warmup encodes and keeps the contexts of
//! the prompts its slot's shards will generate, and the shards read them rather than load the
//! text encoder, within what the cache mode allows.

use std::path::Path;

use serde_json::{Value, json};

use super::{manifest, read_json, records, videos};
use crate::support::Test;

/// Prompts 0–3 in two shards on one CPU slot: a warmup (prompt 0), then shard 0 (0, 1) and
/// shard 1 (2, 3), one after another with the slot's cache folder; `cache` is the `[cache]`
/// table.
fn one_slot_two_shards(t: &Test, name: &str, cache: &str) {
    let text = manifest(t, "generation", &format!("[shards]\ncount = 2\n{cache}"))
        .replace("[prompts]\n", "[prompts]\nindices = \"0-3\"\n")
        .replace("[runtime]\n", "[runtime]\ncpu_slots = 1\n");
    std::fs::write(t.path().join(format!("{name}.toml")), text).unwrap();
}

/// Each process's `text_contexts` (from its first record), by role, in plan order.
type Starts = Vec<(String, Value)>;
/// Every record's `text_context`, by role and prompt.
type Prompts = Vec<(String, u64, Value)>;

/// A run's [`Starts`] and [`Prompts`].
fn contexts(run_dir: &Path) -> (Starts, Prompts) {
    let mut starts = Vec::new();
    let mut prompts = Vec::new();
    let mut records = records(run_dir);
    records.sort_by_key(|r| (r["process"].as_u64(), r["prompt"].as_u64()));
    for r in records {
        let role = r["role"].as_str().unwrap().to_string();
        if !r["process_start"].is_null() {
            starts.push((role.clone(), r["process_start"]["text_contexts"].clone()));
        }
        prompts.push((
            role,
            r["prompt"].as_u64().unwrap(),
            r["text_context"].clone(),
        ));
    }
    (starts, prompts)
}

fn counts(encoded: u32, read: u32, for_later: u32) -> Value {
    json!({"encoded": encoded, "read": read, "for_later": for_later})
}

fn apply(t: &Test, manifest: &str, sets: &[&str]) {
    let mut args = vec!["apply", "--quiet", manifest];
    for set in sets {
        args.extend(["--set", set]);
    }
    let out = t.cmd().args(args).run();
    assert_eq!(out.code, 0, "{}", out.render());
}

/// The warmup encodes all four contexts (three for the shards after it) and keeps them in the
/// slot's cache folder; both shards read theirs and never load the text encoder, and the records
/// and the report say so. A second run with isolated caches finds nothing of the first's: its
/// warmup encodes every context again. Both make the same videos, byte for byte.
#[test]
fn a_generations_shards_read_the_contexts_their_warmup_kept_and_a_fresh_run_encodes_its_own() {
    let t = Test::new();
    one_slot_two_shards(&t, "ctx", "");
    apply(&t, "ctx.toml", &[]);
    let run_dir = t.path().join("results/ctx");
    let expected_starts = vec![
        ("warmup".to_string(), counts(4, 0, 3)),
        ("shard".to_string(), counts(0, 2, 0)),
        ("shard".to_string(), counts(0, 2, 0)),
    ];
    let expected_prompts: Prompts = [
        ("warmup", 0, "encoded"),
        ("shard", 0, "read"),
        ("shard", 1, "read"),
        ("shard", 2, "read"),
        ("shard", 3, "read"),
    ]
    .into_iter()
    .map(|(role, prompt, how)| (role.to_string(), prompt, json!(how)))
    .collect();
    assert_eq!(
        contexts(&run_dir),
        (expected_starts.clone(), expected_prompts.clone())
    );
    let kept = run_dir.join("runtime_state/cpu0/text_contexts");
    assert_eq!(
        std::fs::read_dir(&kept).unwrap().count(),
        4,
        "one file per prompt"
    );
    let report = t.cmd().args(["report", "ctx"]).run();
    assert!(
        report.stdout.contains("(shard, cpu0): ready in ",)
            && report.stdout.contains("2 text contexts read ")
            && report
                .stdout
                .contains(", text encoder not loaded, DiT sessions")
            && report
                .stdout
                .contains("4 contexts encoded, 3 of them for later processes)"),
        "{}",
        report.stdout
    );

    // The apply's wall time is on record, and the report prints it with the slot's three
    // process starts in it.
    let wall = read_json(&run_dir.join("run.json"))["wall"]["seconds"]
        .as_f64()
        .unwrap();
    assert!(wall > 0.0);
    assert!(
        report
            .stdout
            .contains(&format!("wall time {wall:.2} s (the apply started "))
            && report.stdout.contains("  cpu0  3 processes ready in "),
        "{}",
        report.stdout
    );

    // Another run of the same prompts with fresh isolated caches encodes its own.
    apply(&t, "ctx.toml", &["name=fresh"]);
    let fresh_dir = t.path().join("results/fresh");
    assert_eq!(contexts(&fresh_dir), (expected_starts, expected_prompts));
    assert_eq!(
        read_json(&fresh_dir.join("run.json"))["cache"]["label"],
        "fresh"
    );
    assert_eq!(videos(&fresh_dir), videos(&run_dir));
    assert_eq!(videos(&run_dir).len(), 4);
}

/// Shared caches keep contexts across runs, as they keep the rest of their state: a shard whose
/// warmup the marker skipped encodes what its folder lacks itself, the next run's shards read
/// what it kept, and every run makes the same videos, byte for byte.
#[test]
fn shared_caches_reuse_kept_contexts_across_runs_and_a_shard_encodes_what_is_missing() {
    let t = Test::new();
    let shared = t.path().join("shared");
    one_slot_two_shards(
        &t,
        "s",
        &format!(
            "[cache]\nmode = \"shared\"\nshared_state_dir = \"{}\"\n",
            shared.display()
        ),
    );
    apply(&t, "s.toml", &["name=s1"]);
    let shard = |encoded: &str| {
        [0, 1, 2, 3]
            .map(|p| ("shard".to_string(), p, json!(encoded)))
            .to_vec()
    };
    // Shared scope: a warmup per shard, each encoding its shard's other prompt for it.
    let (starts, prompts) = contexts(&t.path().join("results/s1"));
    assert_eq!(
        starts,
        [
            ("warmup", counts(2, 0, 1)),
            ("shard", counts(0, 2, 0)),
            ("warmup", counts(2, 0, 1)),
            ("shard", counts(0, 2, 0)),
        ]
        .map(|(r, c)| (r.to_string(), c))
        .to_vec()
    );
    assert_eq!(
        prompts
            .into_iter()
            .filter(|(role, ..)| role == "shard")
            .collect::<Vec<_>>(),
        shard("read")
    );

    for folder in ["shard0", "shard1"] {
        std::fs::remove_dir_all(shared.join(folder).join("text_contexts")).unwrap();
    }
    apply(&t, "s.toml", &["name=s2"]);
    let only_shards = vec![
        ("shard".to_string(), counts(2, 0, 0)),
        ("shard".to_string(), counts(2, 0, 0)),
    ];
    assert_eq!(
        contexts(&t.path().join("results/s2")),
        (only_shards, shard("encoded")),
        "the markers skipped the warmups: the shards encode their own"
    );

    apply(&t, "s.toml", &["name=s3"]);
    let read = vec![
        ("shard".to_string(), counts(0, 2, 0)),
        ("shard".to_string(), counts(0, 2, 0)),
    ];
    assert_eq!(
        contexts(&t.path().join("results/s3")),
        (read, shard("read"))
    );

    let first = videos(&t.path().join("results/s1"));
    assert_eq!(first.len(), 4);
    for run in ["s2", "s3"] {
        assert_eq!(videos(&t.path().join("results").join(run)), first, "{run}");
    }
}

//! What an apply of some shards leaves in the run's folders: each apply's own files of a warmup
//! that other shards' applies run too, and nothing at all from an apply that is refused.

use std::time::{Duration, Instant};

use crate::apply::{generation, manifest, shard_prompts, spawn_apply};
use crate::support::{Test, repo, tree};

/// A generation of prompts 0-7 in four shards over two CPU slots: shards 0 and 2 on slot cpu0
/// share its warmup, as shards 1 and 3 share cpu1's.
fn four_shards(t: &Test) {
    let text = manifest(t, "generation", "[shards]\ncount = 4\n")
        .replace("[prompts]\n", "[prompts]\nindices = \"0-7\"\n")
        .replace("[runtime]\n", "[runtime]\ncpu_slots = 2\n");
    std::fs::write(t.path().join("gen.toml"), text).unwrap();
}

/// `apply --shard 0`, then `apply --shard 2`: both run slot cpu0's warmup (process 0). Each
/// apply's warmup log, job spec and records are kept, named by its shards; the shards' own are
/// the run's as always.
#[test]
fn each_shard_apply_keeps_its_own_log_of_a_warmup_other_shards_share() {
    let t = Test::new();
    four_shards(&t);
    let plan = t.cmd().args(["plan", "gen.toml"]).run();
    assert!(
        plan.stdout.contains("0  slot cpu0 warmup 1") && plan.stdout.contains("slot cpu0 shard 2"),
        "{}",
        plan.render()
    );
    for shard in ["0", "2"] {
        let out = t
            .cmd()
            .args(["apply", "--quiet", "gen.toml", "--shard", shard])
            .run();
        assert_eq!(out.code, 0, "--shard {shard}: {}", out.render());
    }
    let dir = t.path().join("results/gen");
    assert_eq!(shard_prompts(&dir), vec![0, 1, 4, 5]);
    let logs = tree(&dir.join("logs"));
    for shard in ["0", "2"] {
        let log = dir.join(format!("logs/00-warmup1-slot0.shard-{shard}.log"));
        let text = std::fs::read_to_string(&log)
            .unwrap_or_else(|e| panic!("{}: {e}; logs: {logs:?}", log.display()));
        assert!(text.contains("worker: onnx runtime"), "{text}");
        let spec = dir.join(format!("specs/000.shard-{shard}.json"));
        assert!(spec.is_file(), "{}: {:?}", spec.display(), tree(&dir));
        // The warmup (on prompt 0) encodes the contexts of its apply's shards only: shard 0's
        // prompt 1, or shard 2's prompts 4 and 5.
        let later = crate::apply::read_json(&spec)["contexts_for_later"].clone();
        let prompts: Vec<String> = std::fs::read_to_string(repo().join("assets/prompts/tiny.txt"))
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        let expected = if shard == "0" { vec![1] } else { vec![4, 5] };
        let expected: Vec<&str> = expected.iter().map(|&i| prompts[i].as_str()).collect();
        assert_eq!(later, serde_json::json!(expected), "--shard {shard}");
    }
    assert!(
        !dir.join("logs/00-warmup1-slot0.log").exists(),
        "no log of the whole run's warmup: {logs:?}"
    );
    // The shards' logs are named as in an apply of the whole run.
    assert!(dir.join("logs/01-shard0.log").is_file(), "{logs:?}");
    assert!(dir.join("logs/02-shard2.log").is_file(), "{logs:?}");
}

/// An apply of some shards refused while a whole-run apply holds the run (after it has taken
/// its own work root's lock): it leaves nothing behind, neither its work root nor its shards'
/// lock folders in the run's results; the whole-run apply finishes.
#[test]
fn a_refused_shard_apply_leaves_no_work_root_or_lock_behind() {
    let t = Test::new();
    generation(&t, "gen", "0-5");
    let dir = t.path().join("results/gen");
    let first = spawn_apply(&t, "gen.toml");
    let deadline = Instant::now() + Duration::from_secs(240);
    while std::fs::read_to_string(dir.join(".unstep.lock")).map_or(0, |t| t.lines().count()) < 1 {
        assert!(
            Instant::now() < deadline,
            "the whole-run apply never took the run"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let other = t.path().join("work-other");
    let set = format!("staging.work_root={}", other.display());
    let refused = t
        .cmd()
        .args([
            "apply", "--quiet", "gen.toml", "--shard", "1", "--set", &set,
        ])
        .run();
    assert_eq!(refused.code, 2, "{}", refused.render());
    assert!(
        refused.stderr.contains("is in use by run `gen`"),
        "{}",
        refused.render()
    );
    assert!(!other.exists(), "left behind: {:?}", tree(&other));
    assert!(
        !dir.join("shards").exists(),
        "left behind: {:?}",
        tree(&dir)
    );
    let first = first.wait_with_output().unwrap();
    crate::support::assert_exit_0(&first);
    assert_eq!(shard_prompts(&dir), vec![0, 1, 2, 3, 4, 5]);
}

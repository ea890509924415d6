//! Soak: applies of one run on a shared root (racing each other) and on a separate root, with
//! orchestrators and workers killed at random moments, round after round; then each run is
//! applied to the end and must hold the videos of an uninterrupted run, each prompt once.

use std::time::Duration;

use crate::apply::{generation, shard_prompts, spawn_apply, videos};
use crate::support::{Test, processes_with};

/// A small deterministic generator (64-bit LCG, high bits), so that a failing soak fails again.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Applies `manifest` until it succeeds (a failed run keeps its staging for diagnosis, so the
/// next try reuses it); at most three tries.
fn finish(t: &Test, manifest: &str) {
    let mut last = String::new();
    for _ in 0..3 {
        let out = t
            .cmd()
            .args(["apply", "--quiet", "--reuse-workdir", manifest])
            .run();
        if out.code == 0 {
            return;
        }
        assert!(
            [1, 2].contains(&out.code),
            "a failed apply exits 1 or 2: {}",
            out.render()
        );
        last = out.render();
    }
    panic!("the run never finished: {last}");
}

#[test]
fn applies_killed_at_random_end_with_the_videos_of_an_uninterrupted_run() {
    let reference = Test::new();
    generation(&reference, "soak", "0-3");
    let out = reference
        .cmd()
        .args(["apply", "--quiet", "soak.toml"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let expected = videos(&reference.path().join("results/soak"));
    assert_eq!(expected.len(), 4);

    // `shared`: two applies of one run at once (one root); `separate`: its own root.
    let shared = Test::new();
    generation(&shared, "soak", "0-3");
    let separate = Test::new();
    generation(&separate, "soak", "0-3");
    let mut rng = Lcg(0x5eed);
    for round in 0..4 {
        let mut children = [
            spawn_apply(&shared, "soak.toml"),
            spawn_apply(&shared, "soak.toml"),
            spawn_apply(&separate, "soak.toml"),
        ];
        std::thread::sleep(Duration::from_millis(200 + rng.below(2500)));
        // Every runner process of either project: orchestrators and their workers.
        let mut victims: Vec<i32> = [&shared, &separate]
            .iter()
            .flat_map(|t| processes_with(&t.path().display().to_string()))
            .collect();
        victims.sort();
        for _ in 0..1 + rng.below(2) {
            if victims.is_empty() {
                break;
            }
            let pid = victims.remove(rng.below(victims.len() as u64) as usize);
            // SAFETY: sending a signal to a pid has no memory effects.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for child in children.iter_mut() {
            let status = child.wait().unwrap();
            let stderr = {
                use std::io::Read;
                let mut s = String::new();
                child.stderr.take().unwrap().read_to_string(&mut s).unwrap();
                s
            };
            // Done (0), failed with a killed worker (1), refused by the run's lock (2), or
            // killed itself (no code): never a panic or another status.
            assert!(
                matches!(status.code(), None | Some(0..=2)),
                "round {round}: {status}: {stderr}"
            );
            assert!(!stderr.contains("panicked"), "round {round}: {stderr}");
        }
    }
    for t in [&shared, &separate] {
        finish(t, "soak.toml");
        let run_dir = t.path().join("results/soak");
        assert_eq!(
            shard_prompts(&run_dir),
            vec![0, 1, 2, 3],
            "each prompt once"
        );
        assert_eq!(videos(&run_dir), expected);
    }
}

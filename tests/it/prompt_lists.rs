//! The shipped VBench prompt lists (assets/prompts/vbench_*.txt): the published files byte for
//! byte, line-aligned, and the committed experiments that read them plan as committed.

use crate::support::{Test, repo, sha256_hex};

/// The sha256 of each list as published (assets/prompts/README.md names the sources).
const LISTS: [(&str, &str); 2] = [
    (
        "assets/prompts/vbench_extended.txt",
        "c78f1ad32974503efaa8cc935347ace88f3a8b571adde6687bc8425bbf417cf3",
    ),
    (
        "assets/prompts/vbench_standard.txt",
        "f9b50654f81ab732b9235d5bb91f0c3a4d152fac19249ce3a3a9185b2d80d8c3",
    ),
];

fn lines(rel: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo().join(rel)).unwrap();
    assert!(text.ends_with('\n'), "{rel} ends with a newline");
    text.lines().map(str::to_owned).collect()
}

#[test]
fn the_shipped_lists_are_the_published_files() {
    for (rel, sha) in LISTS {
        let bytes = std::fs::read(repo().join(rel)).unwrap();
        assert_eq!(
            sha256_hex(&bytes),
            sha,
            "{rel} differs from the published list"
        );
        let readme = std::fs::read_to_string(repo().join("assets/prompts/README.md")).unwrap();
        assert!(
            readme.contains(sha),
            "assets/prompts/README.md names the sha256 of {rel}"
        );
    }
}

#[test]
fn the_lists_are_line_aligned_with_two_repeated_standard_prompts() {
    let extended = lines(LISTS[0].0);
    let standard = lines(LISTS[1].0);
    assert_eq!(extended.len(), 946);
    assert_eq!(
        standard.len(),
        946,
        "one standard prompt per extended prompt"
    );
    for (i, (e, s)) in extended.iter().zip(&standard).enumerate() {
        assert!(
            !e.trim().is_empty() && !s.trim().is_empty(),
            "line {i} is blank"
        );
        // An extended prompt rewrites its standard prompt longer.
        assert!(
            e.len() > s.len(),
            "line {i}: the extended prompt is not longer"
        );
    }
    let mut repeated: Vec<(usize, usize)> = Vec::new();
    for i in 0..standard.len() {
        for j in i + 1..standard.len() {
            if standard[i] == standard[j] {
                repeated.push((i, j));
            }
        }
    }
    assert_eq!(repeated, vec![(495, 748), (503, 746)]);
    for (i, j) in repeated {
        assert_ne!(
            extended[i], extended[j],
            "lines {i} and {j} extend differently"
        );
    }
}

/// `unstep_speed`, `full946` and `sigma001` read the shipped lists as committed: their plans
/// have 20, 946 and 946 prompts, and the generations name videos from the standard list.
#[test]
fn the_committed_experiments_plan_from_the_shipped_lists() {
    let t = Test::new();
    for (name, count) in [("unstep_speed", 20), ("full946", 946), ("sigma001", 946)] {
        let manifest = repo().join(format!("experiments/{name}.toml"));
        let out = t
            .cmd()
            .args(["plan", "--json", manifest.to_str().unwrap()])
            .run();
        assert_eq!(out.code, 0, "{name}: {}", out.render());
        assert!(
            !out.stderr.contains("names_file") && !out.stderr.contains("not found"),
            "{name}: {}",
            out.stderr
        );
        let plan: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(plan["prompt_count"], 946, "{name}: the whole list is read");
        let selected: usize = plan["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["prompts"].as_array().unwrap().len())
            .sum();
        assert_eq!(selected, count, "{name}");
    }
}

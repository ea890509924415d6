//! Clauses of the benchmark guide, each against real `runner` processes on the tiny bundle.

use std::path::Path;

use crate::support::{Test, repo, tree};

/// A manifest of `kind` over the tiny bundle, with its results and work root inside the test.
fn manifest(t: &Test, kind: &str, extra: &str) -> String {
    format!(
        "kind = \"{kind}\"\n\
         [prompts]\nfile = \"{prompts}\"\nindices = \"0\"\n\
         [runtime]\nprovider = \"cpu\"\ncpu_threads_per_process = 1\n\
         [method]\nheight = 64\nwidth = 112\nprecision = \"fp32\"\n\
         [outputs]\ndir = \"{root}/results\"\n\
         [staging]\nwork_root = \"{root}/work\"\n\
         [assets]\nbundle = \"{bundle}\"\n\
         {extra}",
        prompts = repo().join("assets/prompts/tiny.txt").display(),
        bundle = repo().join("assets/tiny").display(),
        root = t.path().display(),
    )
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A folder that overlaps the checkout the command runs in names the checkout's path (not an
/// empty name, which is what the current folder is relative to itself).
#[test]
fn an_overlap_with_the_checkout_one_stands_in_names_its_path() {
    let t = Test::new().file("project/.git/HEAD", "ref: refs/heads/main\n");
    let project = t.path().join("project");
    let text = manifest(&t, "probe", "").replace(
        &format!("work_root = \"{}/work\"", t.path().display()),
        "work_root = \"../tmp/unstep_smoke_stage\"",
    );
    write(&project.join("experiments/smoke.toml"), &text);
    let t = t.cwd(&project);
    for command in ["plan", "apply"] {
        let out = t.cmd().args([command, "experiments/smoke.toml"]).run();
        assert_eq!(out.code, 2, "{}", out.render());
        let line = out
            .stderr
            .lines()
            .find(|l| l.contains("overlaps the source checkout"))
            .unwrap_or_else(|| panic!("{}", out.render()));
        let named = line
            .split("overlaps the source checkout ")
            .nth(1)
            .unwrap_or_default();
        assert!(
            [project.clone(), project.canonicalize().unwrap()]
                .iter()
                .any(|p| named == p.display().to_string()),
            "{command}: the checkout is named by its path: {line}"
        );
    }
    assert!(!project.join("tmp").exists() && !t.path().join("results").exists());
}

/// A bundle folder that is a symbolic link is refused before anything is written: no results
/// folder, no work root.
#[test]
fn a_symlinked_bundle_folder_is_refused_before_anything_is_written() {
    let t = Test::new();
    std::os::unix::fs::symlink(repo().join("assets/tiny"), t.path().join("linked")).unwrap();
    let text = manifest(&t, "probe", "").replace(
        &format!("bundle = \"{}\"", repo().join("assets/tiny").display()),
        &format!("bundle = \"{}/linked\"", t.path().display()),
    );
    write(&t.path().join("m.toml"), &text);
    let out = t.cmd().args(["apply", "--quiet", "m.toml"]).run();
    assert_eq!(out.code, 2, "{}", out.render());
    assert!(
        out.stderr
            .contains("is a symbolic link; point to the real directory"),
        "{}",
        out.render()
    );
    assert!(!t.path().join("results").exists(), "{:?}", tree(t.path()));
    assert!(!t.path().join("work").exists(), "{:?}", tree(t.path()));
}

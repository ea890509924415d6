//! A small fluent helper for running the real `runner` binary in a scratch folder with a clean
//! environment: `Test::new().file("m.toml", "...").args(["plan", "m.toml"]).run()`.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Test {
    pub dir: tempfile::TempDir,
    cwd: Option<PathBuf>,
}

/// One invocation of the binary inside a [`Test`].
pub struct Run<'a> {
    test: &'a Test,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// Exit status, stdout and stderr together, as a snapshot shows them.
    pub fn render(&self) -> String {
        format!(
            "exit: {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// The repository root (where `experiments/` lives).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

impl Test {
    pub fn new() -> Test {
        Test {
            dir: tempfile::tempdir().expect("tempdir"),
            cwd: None,
        }
    }

    /// Writes a file relative to the scratch folder.
    pub fn file(self, rel: &str, text: &str) -> Test {
        let path = self.dir.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        self
    }

    /// Runs in `dir` instead of the scratch folder.
    pub fn cwd(mut self, dir: &Path) -> Test {
        self.cwd = Some(dir.to_path_buf());
        self
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Starts an invocation; add arguments and variables, then `run`.
    pub fn cmd(&self) -> Run<'_> {
        Run {
            test: self,
            args: Vec::new(),
            env: Vec::new(),
        }
    }
}

impl Run<'_> {
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn run(&self) -> Output {
        let t = self.test;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_runner"));
        cmd.args(&self.args)
            .current_dir(t.cwd.as_deref().unwrap_or(t.dir.path()))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", t.dir.path());
        for var in ["ORT_DYLIB_PATH", "UNSTEP_ORT_CACHE_DIR"] {
            if let Ok(v) = std::env::var(var) {
                cmd.env(var, v);
            }
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("runner starts");
        Output {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// Lists every file below `dir`, relative, sorted (to show that nothing was written).
pub fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

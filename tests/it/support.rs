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

    /// `program` (the runner, or a shell that starts it) in the test's folder, with PATH and
    /// ONNX Runtime's location its only environment: no setting of this machine's reaches it.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(self.cwd.as_deref().unwrap_or(self.dir.path()))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        for var in ["ORT_DYLIB_PATH", "UNSTEP_ORT_CACHE_DIR"] {
            if let Ok(v) = std::env::var(var) {
                cmd.env(var, v);
            }
        }
        cmd
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
        let mut cmd = t.command(env!("CARGO_BIN_EXE_runner"));
        cmd.args(&self.args).env("HOME", t.dir.path());
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

/// The Python that runs the exporter's reference code: `UNSTEP_TEST_PYTHON`, or the virtual
/// environment scripts/test creates. Tests that compare with the reference fail without it.
pub fn python() -> PathBuf {
    let python = std::env::var_os("UNSTEP_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".cache/pyenv/bin/python"));
    assert!(
        python.is_file(),
        "no Python at {} for the reference tokenizer: run scripts/test, which creates \
         .cache/pyenv, or set UNSTEP_TEST_PYTHON",
        python.display()
    );
    python
}

/// sha256 of bytes, lowercase hex, as bundle.toml lists files.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A copy of the tiny bundle's files (not its golden folder) at `dir`.
pub fn copy_tiny_bundle(dir: &Path) {
    copy_tiny(dir);
}

/// Copies the tiny bundle's files (not its golden folder) to `dir`; returns the tiny bundle's path.
fn copy_tiny(dir: &Path) -> PathBuf {
    let tiny = repo().join("assets/tiny");
    std::fs::create_dir_all(dir).unwrap();
    for entry in std::fs::read_dir(&tiny).unwrap().flatten() {
        if entry.path().is_file() {
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
    }
    tiny
}

/// A copy of the tiny bundle at `dir` with the umt5 tokenizer `tokenizer_json` (listed in
/// `[files]`), `text_len` tokens and a text encoder of `vocab` embedding rows in its bundle.toml,
/// as exporter 0.13.0 writes them. The graphs stay the tiny bundle's, whose text encoder takes
/// byte ids: enough for everything but running it on the tokenizer's ids.
pub fn umt5_bundle(dir: &Path, tokenizer_json: &[u8], text_len: usize, vocab: usize) -> PathBuf {
    let tiny = copy_tiny(dir);
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json).unwrap();
    let sha = sha256_hex(tokenizer_json);
    let toml = std::fs::read_to_string(tiny.join("bundle.toml")).unwrap();
    let sections = format!(
        "[tokenizer]\nkind = \"umt5\"\nfile = \"tokenizer.json\"\nclean = \"whitespace\"\n\n\
         [text_encoder]\nlayers = 2\nvocab = {vocab}\nprecision = \"fp32\"\n\n\
         [weights]\n[weights.dit]\nsource = \"random\"\nseed = 0\n\
         [weights.vae]\nsource = \"random\"\nseed = 2\n\
         [weights.text_encoder]\nsource = \"random\"\nseed = 1\n\
         [weights.tokenizer]\nsource = \"file\"\nfile = \"tokenizer.json\"\nsha256 = \"{sha}\"\n\n"
    );
    // The tiny bundle's own tokenizer, text encoder and weights tables give way to these.
    let mut out = String::new();
    let mut skipping = false;
    for line in toml.lines() {
        if line.starts_with('[') {
            let table = line.trim_matches(['[', ']']);
            skipping = ["tokenizer", "text_encoder", "weights"]
                .iter()
                .any(|t| table == *t || table.starts_with(&format!("{t}.")));
            if table == "graphs" {
                out.push_str(&sections);
            }
        }
        if skipping || line.starts_with("\"tokenizer.json\"") {
            continue;
        }
        if line.starts_with("text_len = ") {
            out.push_str(&format!("text_len = {text_len}\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
        if line == "[files]" {
            out.push_str(&format!("\"tokenizer.json\" = \"{sha}\"\n"));
        }
    }
    let toml = out;
    std::fs::write(dir.join("bundle.toml"), toml).unwrap();
    dir.to_path_buf()
}

/// A copy of the tiny bundle at `dir` with the `bytes` tokenizer of bundles before exporter
/// 0.13.0 (`[tokenizer] kind = "bytes"`, no tokenizer.json); the text encoder's 1000 embedding
/// rows take its ids.
pub fn bytes_bundle(dir: &Path) -> PathBuf {
    let tiny = copy_tiny(dir);
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let toml = std::fs::read_to_string(tiny.join("bundle.toml")).unwrap();
    let mut out = String::new();
    let mut skipping = false;
    for line in toml.lines() {
        if line.starts_with('[') {
            let table = line.trim_matches(['[', ']']);
            skipping = table == "tokenizer" || table == "weights.tokenizer";
            if table == "tokenizer" {
                out.push_str("[tokenizer]\nkind = \"bytes\"\n\n");
            }
        }
        if skipping || line.starts_with("\"tokenizer.json\"") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    std::fs::write(dir.join("bundle.toml"), out).unwrap();
    dir.to_path_buf()
}

/// Replaces the scratch folder's path and full hashes so snapshots read the same everywhere.
pub fn filtered<F: FnOnce()>(dir: &Path, f: F) {
    let mut settings = insta::Settings::clone_current();
    for p in [dir.to_path_buf(), dir.canonicalize().unwrap()] {
        settings.add_filter(&regex::escape(&p.display().to_string()), "[TMP]");
    }
    settings.add_filter(r"[0-9a-f]{64}", "[SHA256]");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(f);
}

/// The committed UMT5-type test tokenizer.
pub fn test_tokenizer_json() -> Vec<u8> {
    std::fs::read(repo().join("assets/tokenizer/tokenizer.json")).unwrap()
}

/// Every live process whose command line contains `needle`.
pub fn processes_with(needle: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_string_lossy().parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(needle).then_some(pid)
        })
        .collect()
}

/// A folder holding an `nvidia-smi` that answers as the driver would: `gpus` is its CSV answer
/// to the runner's `--query-gpu` (one line a GPU), or `None` for the answer of a machine whose driver is not loaded. Put
/// first on PATH, it stands in for the machine's own, so that the GPU checks read the same on
/// every test machine.
pub fn fake_nvidia_smi(t: &Test, gpus: Option<&str>) -> String {
    use std::os::unix::fs::PermissionsExt;
    let dir = t.path().join("driver");
    std::fs::create_dir_all(&dir).unwrap();
    let script = match gpus {
        Some(csv) => format!("#!/bin/sh\nprintf '%s\\n' '{csv}'\n"),
        None => "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with \
                 the NVIDIA driver.\" >&2\nexit 9\n"
            .to_string(),
    };
    let path = dir.join("nvidia-smi");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Asserts that a finished process exited 0, showing its stderr when it did not.
#[track_caller]
pub fn assert_exit_0(out: &std::process::Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

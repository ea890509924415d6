//! Paths of a run: expansion of `${VAR:-default}` and `~`, lexical normalisation, and the safety
//! rules of the run layout (what output, cache and work directories may not overlap).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

/// Why a path's `${VAR}` or `~` cannot be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathExpandError {
    #[error("`~` is used but HOME is not set; write the full path")]
    NoHome,
    /// A `${` without its `}`, in the path as written.
    #[error("unclosed `${{` in `{0}`")]
    Unclosed(String),
    /// A variable without a default that is unset or empty, by its name.
    #[error("`${{{0}}}` is not set; set it or write the path")]
    Unset(String),
}

/// Expands `${VAR}`, `${VAR:-default}` and a leading `~/` from `env`; an unset variable without
/// a default is an error naming it.
pub fn expand(text: &str, env: &BTreeMap<String, String>) -> Result<String, PathExpandError> {
    let mut out = String::new();
    let mut rest = text;
    if let Some(tail) = rest.strip_prefix("~/") {
        let home = env.get("HOME").ok_or(PathExpandError::NoHome)?;
        out.push_str(home);
        out.push('/');
        rest = tail;
    }
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| PathExpandError::Unclosed(text.to_string()))?;
        let inner = &after[..end];
        let (var, default) = match inner.split_once(":-") {
            Some((v, d)) => (v, Some(d)),
            None => (inner, None),
        };
        match env.get(var).filter(|v| !v.is_empty()) {
            Some(v) => out.push_str(v),
            None => match default {
                Some(d) => out.push_str(d),
                None => return Err(PathExpandError::Unset(var.to_string())),
            },
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Joins `path` onto `base` unless it is absolute, and removes `.` and `..` lexically (the
/// path need not exist yet).
/// The path of a file with its folder's symbolic links resolved, so that the `..` of paths
/// relative to it mean what the file system says (`link/..` is the link target's parent); the
/// path itself when its folder does not exist.
pub fn through_links(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        })
        .map(|dir| dir.join(name))
        .unwrap_or_else(|_| path.to_path_buf()),
        _ => path.to_path_buf(),
    }
}

pub fn resolve(base: &Path, path: &str) -> PathBuf {
    normalize(&base.join(path))
}

pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// True when one path is the other or lies inside it.
pub fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Folders a run may never write into or over: the filesystem's broad roots and system
/// installations. `$HOME`, `$TMPDIR` and `/tmp` themselves are broad too, but their
/// subfolders are fine.
pub fn broad_roots(env: &BTreeMap<String, String>) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = [
        "/", "/tmp", "/var/tmp", "/home", "/root", "/mnt", "/media", "/srv",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    for var in ["HOME", "TMPDIR"] {
        if let Some(v) = env.get(var).filter(|v| !v.is_empty()) {
            roots.push(normalize(Path::new(v)));
        }
    }
    roots
}

/// Installations whose insides a run may never write: system folders, and the Python and CUDA
/// installations named by the usual variables.
pub fn installations(env: &BTreeMap<String, String>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = [
        "/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/boot", "/dev", "/proc", "/sys",
        "/opt", "/var/lib",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    for var in [
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "PYTHONHOME",
        "PYENV_ROOT",
        "CUDA_HOME",
        "CUDA_PATH",
    ] {
        if let Some(v) = env.get(var).filter(|v| !v.is_empty()) {
            out.push(normalize(Path::new(v)));
        }
    }
    // A user's own installs of Python and its tools, at the places their installers use.
    if let Some(home) = env.get("HOME").filter(|v| !v.is_empty()) {
        let home = normalize(Path::new(home));
        for dir in USER_INSTALLATIONS {
            out.push(home.join(dir));
        }
    }
    out
}

/// Folders under `$HOME` where installers put Python and its tools (pyenv, pip `--user`, conda
/// and its variants, Rust's toolchains).
const USER_INSTALLATIONS: &[&str] = &[
    ".pyenv",
    ".local/lib",
    ".local/bin",
    ".conda",
    "miniconda3",
    "anaconda3",
    "miniforge3",
    "mambaforge",
    ".cargo",
    ".rustup",
];

/// Folders of a source checkout that a run may never write into: its git store, its sources,
/// and its `.cache/` (the ONNX Runtime and Python environments the project's scripts install).
/// Elsewhere below a checkout (its git-ignored `results/`, a folder of the user's) is fine.
pub const CHECKOUT_OWN_DIRS: &[&str] = &[".git", "src", ".cache"];

/// The user-level compiler caches that `cache.clear_global` purges: CUDA's JIT cache at its
/// default place, `$HOME/.nv/ComputeCache`, and the folder `CUDA_CACHE_PATH` names when it is set
/// (a relative one against `cwd`). Nothing else is global in this stack: ONNX Runtime's
/// optimised models, TensorRT's engines and the runner's own kernels live in each process's cache
/// folder, and workers get a `CUDA_CACHE_PATH` of their own.
pub fn global_compiler_caches(env: &BTreeMap<String, String>, cwd: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(home) = env.get("HOME").filter(|v| !v.is_empty()) {
        out.push(normalize(&Path::new(home).join(".nv/ComputeCache")));
    }
    if let Some(dir) = env.get("CUDA_CACHE_PATH").filter(|v| !v.is_empty()) {
        let dir = resolve(cwd, dir);
        if !out.contains(&dir) {
            out.push(dir);
        }
    }
    out
}

/// The checkout a path belongs to: the nearest folder above it with a `.git`.
pub fn checkout_root(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .find(|dir| dir.join(".git").exists())
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion() {
        let env: BTreeMap<String, String> = [
            ("TMPDIR".to_string(), "/scratch".to_string()),
            ("HOME".into(), "/h".into()),
        ]
        .into();
        let empty = BTreeMap::new();
        assert_eq!(expand("${TMPDIR:-/tmp}/x", &env).unwrap(), "/scratch/x");
        assert_eq!(expand("${TMPDIR:-/tmp}/x", &empty).unwrap(), "/tmp/x");
        assert_eq!(expand("~/a", &env).unwrap(), "/h/a");
        assert!(
            expand("${NOPE}/x", &empty)
                .unwrap_err()
                .to_string()
                .contains("NOPE")
        );
        assert!(expand("${NOPE", &empty).is_err());
    }

    #[test]
    fn global_compiler_caches_are_cudas_jit_caches() {
        let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let cwd = Path::new("/w");
        for (vars, want) in [
            (&[][..], &[][..]),
            (&[("HOME", "/h")][..], &["/h/.nv/ComputeCache"][..]),
            (
                &[("HOME", "/h"), ("CUDA_CACHE_PATH", "jit")][..],
                &["/h/.nv/ComputeCache", "/w/jit"][..],
            ),
            (
                &[("HOME", "/h"), ("CUDA_CACHE_PATH", "/h/.nv/ComputeCache/")][..],
                &["/h/.nv/ComputeCache"][..],
            ),
            (&[("HOME", ""), ("CUDA_CACHE_PATH", "")][..], &[][..]),
        ] {
            let want: Vec<PathBuf> = want.iter().map(PathBuf::from).collect();
            assert_eq!(global_compiler_caches(&env(vars), cwd), want, "{vars:?}");
        }
    }

    #[test]
    fn normalisation_and_overlap() {
        assert_eq!(
            resolve(Path::new("/a/b"), "../c/./d"),
            PathBuf::from("/a/c/d")
        );
        assert_eq!(resolve(Path::new("/a/b"), "/x"), PathBuf::from("/x"));
        assert!(overlaps(Path::new("/a/b"), Path::new("/a")));
        assert!(overlaps(Path::new("/a"), Path::new("/a/b")));
        assert!(!overlaps(Path::new("/a/bc"), Path::new("/a/b")));
    }
}

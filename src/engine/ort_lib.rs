//! Finding and loading the ONNX Runtime shared library, once per process.
//!
//! The runner links ONNX Runtime dynamically so that one binary works with the CPU build, the
//! pip `onnxruntime-gpu` wheel or a user's own build. Where the library comes from is reported,
//! because a speed result is meaningless without knowing which runtime produced it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The ONNX Runtime release `scripts/fetch-onnxruntime` installs.
pub const PINNED_ORT_VERSION: &str = "1.31.1";
/// The oldest ONNX Runtime minor version (1.x) the engine accepts. `com.microsoft.MultiHeadAttention`
/// with the cache layouts the exporter writes, and the provider options the engine sets, are all
/// present from 1.22 on; the engine reads arena statistics (`AllocatorGetStats`, C API 23).
pub const MIN_ORT_MINOR: u32 = 23;

/// Where the library was found, in the order the search tries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrtSource {
    /// A path given by the caller (`runtime.ort_library`, `--ort-library`).
    Explicit,
    /// The `ORT_DYLIB_PATH` environment variable.
    EnvVar,
    /// The `onnxruntime` Python package of the `python3` on PATH.
    PythonPackage,
    /// The `onnxruntime-gpu` Python package of the `python3` on PATH.
    PythonGpuPackage,
    /// `$UNSTEP_ORT_CACHE_DIR/<version>/`, where `scripts/fetch-onnxruntime` puts it.
    FetchCache,
}

impl fmt::Display for OrtSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OrtSource::Explicit => "explicit path",
            OrtSource::EnvVar => "ORT_DYLIB_PATH",
            OrtSource::PythonPackage => "python package onnxruntime",
            OrtSource::PythonGpuPackage => "python package onnxruntime-gpu",
            OrtSource::FetchCache => "UNSTEP_ORT_CACHE_DIR",
        })
    }
}

/// A located library, before it is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrtLocation {
    pub path: PathBuf,
    pub source: OrtSource,
    /// CUDA, cuDNN and cuBLAS library folders shipped as `nvidia-*` wheels beside an
    /// `onnxruntime-gpu` package; the CUDA provider needs them on the loader's search path.
    pub cuda_library_dirs: Vec<PathBuf>,
}

/// The loaded runtime: where it came from, its version and the environment sessions are made in.
pub struct OrtRuntime {
    pub location: OrtLocation,
    pub version: String,
    pub(crate) environment: ort::environment::Environment,
}

impl fmt::Debug for OrtRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OrtRuntime")
            .field("location", &self.location)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

const FIX_HINT: &str = "run `scripts/fetch-onnxruntime` (and set UNSTEP_ORT_CACHE_DIR), or set ORT_DYLIB_PATH to a libonnxruntime.so";

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum OrtLoadError {
    #[error("find ONNX Runtime: no library at {path} (from {from}); {hint}", hint = FIX_HINT)]
    Missing { path: PathBuf, from: OrtSource },
    #[error("find ONNX Runtime: not given explicitly, ORT_DYLIB_PATH unset, no onnxruntime Python package, no UNSTEP_ORT_CACHE_DIR; {hint}", hint = FIX_HINT)]
    NotFound,
    #[error("load ONNX Runtime from {path}: {reason}; {hint}", hint = FIX_HINT)]
    Load { path: PathBuf, reason: String },
    #[error(
        "ONNX Runtime {version} at {path} is too old (need 1.{min}.0 or newer, {PINNED_ORT_VERSION} is tested); {hint}",
        min = MIN_ORT_MINOR,
        hint = FIX_HINT
    )]
    TooOld { path: PathBuf, version: String },
    #[error("start the ONNX Runtime environment: {0}")]
    Environment(String),
}

/// Finds the library without loading it, trying the sources in order. An explicit path or
/// `ORT_DYLIB_PATH` that points nowhere is an error rather than a reason to look elsewhere: the
/// user asked for that library.
pub fn locate(explicit: Option<&Path>) -> Result<OrtLocation, OrtLoadError> {
    let at = |path: PathBuf, source| OrtLocation {
        path,
        source,
        cuda_library_dirs: Vec::new(),
    };
    if let Some(path) = explicit {
        return existing(at(path.to_path_buf(), OrtSource::Explicit));
    }
    if let Some(path) =
        std::env::var_os(crate::env_vars::EnvVars::ORT_DYLIB_PATH).filter(|p| !p.is_empty())
    {
        return existing(at(PathBuf::from(path), OrtSource::EnvVar));
    }
    if let Some(location) = python_package() {
        return Ok(location);
    }
    if let Some(dir) =
        std::env::var_os(crate::env_vars::EnvVars::UNSTEP_ORT_CACHE_DIR).filter(|p| !p.is_empty())
    {
        let path = PathBuf::from(dir)
            .join(PINNED_ORT_VERSION)
            .join(format!("libonnxruntime.so.{PINNED_ORT_VERSION}"));
        return existing(at(path, OrtSource::FetchCache));
    }
    Err(OrtLoadError::NotFound)
}

fn existing(location: OrtLocation) -> Result<OrtLocation, OrtLoadError> {
    if location.path.is_file() {
        Ok(location)
    } else {
        Err(OrtLoadError::Missing {
            path: location.path,
            from: location.source,
        })
    }
}

/// Asks the `python3` on PATH where its `onnxruntime` package lives, without importing it
/// (importing would load the library into Python and take a second).
fn python_package() -> Option<OrtLocation> {
    let script = "import importlib.util as u\n\
                  s = u.find_spec('onnxruntime')\n\
                  print(s.origin if s and s.origin else '')";
    let output = Command::new("python3").args(["-c", script]).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let origin = String::from_utf8(output.stdout).ok()?;
    let package_dir = Path::new(origin.trim()).parent()?.to_path_buf();
    let capi = package_dir.join("capi");
    let mut libraries: Vec<PathBuf> = std::fs::read_dir(&capi)
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so"))
        })
        .collect();
    // Prefer the fully versioned file name; the unversioned one is usually a link to it.
    libraries.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    let path = libraries.into_iter().next()?;
    let gpu = capi.join("libonnxruntime_providers_cuda.so").is_file();
    let cuda_library_dirs = if gpu {
        nvidia_library_dirs(package_dir.parent()?)
    } else {
        Vec::new()
    };
    Some(OrtLocation {
        path,
        source: if gpu {
            OrtSource::PythonGpuPackage
        } else {
            OrtSource::PythonPackage
        },
        cuda_library_dirs,
    })
}

/// `site-packages/nvidia/*/lib` folders of the CUDA wheels.
fn nvidia_library_dirs(site_packages: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(site_packages.join("nvidia")) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path().join("lib")))
        .filter(|lib| lib.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Reads the library's version string through `OrtGetApiBase` without handing it to `ort`, so a
/// too-old library is refused with our message instead of a panic deep inside `ort`.
fn library_version(path: &Path) -> Result<String, OrtLoadError> {
    let load_error = |reason: String| OrtLoadError::Load {
        path: path.to_path_buf(),
        reason,
    };
    // SAFETY: loading ONNX Runtime runs only its static initialisers, which have no
    // preconditions; the library stays loaded for the life of the process.
    let library = unsafe { libloading::Library::new(path) }
        .map_err(|e| load_error(super::loader_message(&e)))?;
    type GetApiBase = unsafe extern "C" fn() -> *const ort::sys::OrtApiBase;
    // SAFETY: `OrtGetApiBase` has this signature in every ONNX Runtime release.
    let get_api_base = unsafe { library.get::<GetApiBase>(b"OrtGetApiBase") }.map_err(|_| {
        load_error("the library does not export OrtGetApiBase; is it ONNX Runtime?".into())
    })?;
    // SAFETY: the call has no arguments; the returned struct and string are static in the library.
    let version = unsafe {
        let base = get_api_base();
        if base.is_null() {
            return Err(load_error("OrtGetApiBase returned null".into()));
        }
        let raw = ((*base).GetVersionString)();
        std::ffi::CStr::from_ptr(raw).to_string_lossy().into_owned()
    };
    // Keep the library mapped: `ort` opens the same file and unloading in between is wasted work.
    std::mem::forget(library);
    Ok(version)
}

fn minor_version(version: &str) -> Option<u32> {
    let mut parts = version.split('.');
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    (major == 1).then_some(minor)
}

static RUNTIME: OnceLock<Result<OrtRuntime, OrtLoadError>> = OnceLock::new();

/// Loads ONNX Runtime for this process, or returns the runtime an earlier call loaded (whatever
/// path that call was given: a process holds one runtime).
pub fn runtime(explicit: Option<&Path>) -> Result<&'static OrtRuntime, OrtLoadError> {
    RUNTIME
        .get_or_init(|| load(explicit))
        .as_ref()
        .map_err(Clone::clone)
}

fn load(explicit: Option<&Path>) -> Result<OrtRuntime, OrtLoadError> {
    let location = locate(explicit)?;
    let version = library_version(&location.path)?;
    match minor_version(&version) {
        Some(minor) if minor >= MIN_ORT_MINOR => {}
        _ => {
            return Err(OrtLoadError::TooOld {
                path: location.path,
                version,
            });
        }
    }
    let builder = ort::init_from(&location.path).map_err(|e| OrtLoadError::Load {
        path: location.path.clone(),
        reason: e.to_string(),
    })?;
    let environment = builder
        .with_name("unstep")
        .with_telemetry(false)
        .build()
        .map_err(|e| OrtLoadError::Environment(e.to_string()))?;
    Ok(OrtRuntime {
        location,
        version,
        environment,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_versions_parse() {
        let cases = [
            ("1.31.1", Some(31)),
            ("1.22.0", Some(22)),
            ("2.0.0", None),
            ("garbage", None),
            ("1.x", None),
        ];
        for (version, expected) in cases {
            assert_eq!(minor_version(version), expected, "{version}");
        }
    }

    #[test]
    fn explicit_missing_path_is_an_error_not_a_fallback() {
        let err = locate(Some(Path::new("/nonexistent/libonnxruntime.so"))).unwrap_err();
        assert!(matches!(
            err,
            OrtLoadError::Missing {
                from: OrtSource::Explicit,
                ..
            }
        ));
        assert!(
            err.to_string().contains("scripts/fetch-onnxruntime"),
            "{err}"
        );
    }

    #[test]
    fn a_file_that_is_not_onnx_runtime_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("libonnxruntime.so");
        std::fs::write(&fake, b"not a library").unwrap();
        let err = library_version(&fake).unwrap_err();
        assert!(matches!(err, OrtLoadError::Load { .. }), "{err}");
    }
}

//! What `runner doctor` shows about the engine's environment: the ONNX Runtime library and the
//! execution providers it was built with.

use std::path::Path;

use super::ort_lib;
use super::session::available_providers;

/// One line of the doctor's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    /// What was found (a path, a version) or what went wrong.
    pub detail: String,
    /// What to do when `ok` is false.
    pub fix: Option<String>,
}

/// Loads ONNX Runtime (from `explicit` or the usual search) and lists what it offers. Never
/// fails: problems are checks with `ok = false`.
pub fn probe_environment(explicit: Option<&Path>) -> Vec<Check> {
    let runtime = match ort_lib::runtime(explicit) {
        Ok(runtime) => runtime,
        Err(error) => {
            return vec![Check {
                name: "onnx runtime".into(),
                ok: false,
                detail: error.to_string(),
                fix: Some(
                    "run `scripts/fetch-onnxruntime` and set UNSTEP_ORT_CACHE_DIR, or set ORT_DYLIB_PATH".into(),
                ),
            }];
        }
    };
    let location = &runtime.location;
    let mut checks = vec![Check {
        name: "onnx runtime".into(),
        ok: true,
        detail: format!(
            "{} from {} ({})",
            runtime.version,
            location.path.display(),
            location.source
        ),
        fix: None,
    }];
    if !location.cuda_library_dirs.is_empty() {
        let dirs: Vec<String> = location
            .cuda_library_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        checks.push(Check {
            name: "cuda libraries (python wheels)".into(),
            ok: true,
            detail: dirs.join(":"),
            fix: None,
        });
    }
    for (provider, available) in available_providers() {
        let (ok, detail, fix) = match available {
            Ok(true) => (true, "compiled in".to_string(), None),
            Ok(false) => (
                false,
                "not in this ONNX Runtime build".to_string(),
                (provider != "cpu").then(|| {
                    "use an ONNX Runtime GPU build (e.g. `pip install onnxruntime-gpu`, or ORT_DYLIB_PATH)".to_string()
                }),
            ),
            Err(error) => (false, error.to_string(), None),
        };
        checks.push(Check {
            name: format!("execution provider {provider}"),
            ok,
            detail,
            fix,
        });
    }
    checks
}

/// Whether the runner's fused CUDA kernels (`runtime.dit_kernels`, `runtime.vae_kernels`) can be
/// built: NVRTC, cuBLASLt and cuDNN must load. Not needed on the CPU provider, or with both set
/// to `onnxruntime`.
pub fn fused_kernels_check() -> Check {
    let name = "nvrtc, cublasLt and cudnn (fused kernels)".to_string();
    match super::kernels::cuda_libraries_available() {
        Ok(()) => Check {
            name,
            ok: true,
            detail: "libnvrtc, libcublasLt and libcudnn load: the fused kernels build on CUDA"
                .into(),
            fix: None,
        },
        Err(error) => Check {
            name,
            ok: false,
            detail: error.to_string(),
            fix: Some(
                "needed on CUDA with bundles that have fused graphs (or set runtime.dit_kernels and runtime.vae_kernels to \"onnxruntime\")".into(),
            ),
        },
    }
}

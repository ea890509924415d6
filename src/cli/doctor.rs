//! `runner doctor`: what a user checks before a long run. Each line says what was found and,
//! when something is missing, how to fix it.

use std::path::PathBuf;
use std::process::Command;

use clap::Args;

use crate::engine::{self, Check};
use crate::exit;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Asset bundles to verify (default: every folder under assets/ with a bundle.toml).
    #[arg(long = "bundle", value_name = "DIR")]
    pub bundles: Vec<PathBuf>,
    /// libonnxruntime to load instead of the usual search.
    #[arg(long, value_name = "PATH")]
    pub ort_library: Option<PathBuf>,
}

/// GPUs as the driver reports them, one check per GPU.
pub fn gpu_checks() -> Vec<Check> {
    match crate::execute::device::gpus() {
        Ok(gpus) if !gpus.is_empty() => gpus
            .into_iter()
            .map(|g| Check {
                name: format!("gpu {}", g.index),
                ok: true,
                detail: format!(
                    "{}, {} GiB, driver {}",
                    g.name,
                    g.memory_bytes.map_or("?".into(), |b| (b >> 30).to_string()),
                    g.driver
                ),
                fix: None,
            })
            .collect(),
        other => vec![Check {
            name: "gpus".into(),
            ok: false,
            detail: match other {
                Err(e) => e,
                Ok(_) => "the driver lists no GPU".into(),
            },
            fix: Some(
                "install the NVIDIA driver, or run CPU manifests (runtime.provider = \"cpu\")"
                    .into(),
            ),
        }],
    }
}

/// CUDA and cuDNN libraries the dynamic loader can find.
fn cuda_library_checks() -> Vec<Check> {
    ["libcudart.so", "libcublas.so", "libcudnn.so"]
        .iter()
        .map(|lib| {
            let found = find_library(lib);
            Check {
                name: format!("library {lib}"),
                ok: found.is_some(),
                detail: found.unwrap_or_else(|| "not found by the dynamic loader".into()),
                fix: Some(
                    "for the CUDA provider: `pip install onnxruntime-gpu` brings matching CUDA and cuDNN wheels, or add their folders to LD_LIBRARY_PATH".into(),
                ),
            }
        })
        .map(|mut c| {
            if c.ok {
                c.fix = None;
            }
            c
        })
        .collect()
}

fn find_library(stem: &str) -> Option<String> {
    let out = Command::new("ldconfig").arg("-p").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let from_cache = text
        .lines()
        .find(|l| l.trim_start().starts_with(stem))
        .and_then(|l| l.split("=>").nth(1))
        .map(|p| p.trim().to_string());
    from_cache.or_else(|| {
        std::env::var("LD_LIBRARY_PATH").ok().and_then(|paths| {
            paths.split(':').find_map(|dir| {
                std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with(stem)
                        .then(|| e.path().display().to_string())
                })
            })
        })
    })
}

fn bundle_checks(bundles: &[PathBuf]) -> Vec<Check> {
    let found: Vec<PathBuf> = if bundles.is_empty() {
        std::fs::read_dir("assets")
            .map(|d| {
                let mut v: Vec<PathBuf> = d
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.join("bundle.toml").is_file())
                    .collect();
                v.sort();
                v
            })
            .unwrap_or_default()
    } else {
        bundles.to_vec()
    };
    if found.is_empty() {
        return vec![Check {
            name: "asset bundles".into(),
            ok: false,
            detail: "none under assets/".into(),
            fix: Some("export one with the exporter (see assets/export/README.md)".into()),
        }];
    }
    found
        .iter()
        .map(|dir| {
            let scratch = std::env::temp_dir().join("unstep-doctor-unpack");
            match engine::Bundle::open(dir, &scratch) {
                Ok(b) => Check {
                    name: format!("bundle {}", dir.display()),
                    ok: true,
                    detail: format!(
                        "preset {}, {}, every file matches its sha256",
                        b.manifest.preset,
                        b.manifest.precision.as_str()
                    ),
                    fix: None,
                },
                Err(e) => Check {
                    name: format!("bundle {}", dir.display()),
                    ok: false,
                    detail: e.to_string(),
                    fix: Some("re-export the bundle (see assets/export/README.md)".into()),
                },
            }
        })
        .collect()
}

pub fn run(args: &DoctorArgs) -> i32 {
    let mut checks = engine::probe_environment(args.ort_library.as_deref());
    checks.extend(gpu_checks());
    checks.extend(cuda_library_checks());
    checks.push(engine::probe::fused_kernels_check());
    checks.extend(bundle_checks(&args.bundles));
    let mut text = String::new();
    for c in &checks {
        text.push_str(&format!(
            "{} {:<34} {}\n",
            if c.ok { "ok  " } else { "MISS" },
            c.name,
            c.detail
        ));
        if let Some(fix) = &c.fix {
            text.push_str(&format!("     {:<34} fix: {fix}\n", ""));
        }
    }
    let code = super::out(&text);
    // Only what every run needs decides the status: ONNX Runtime and the CPU provider.
    let essential_ok = checks
        .iter()
        .filter(|c| c.name == "onnx runtime" || c.name == "execution provider cpu")
        .all(|c| c.ok);
    if code != exit::OK {
        code
    } else if essential_ok {
        exit::OK
    } else {
        exit::FAILURE
    }
}

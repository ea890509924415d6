//! `runner doctor`: what a user checks before a long run. Each line says what was found and,
//! when something is missing, how to fix it.

use std::path::PathBuf;

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
                    "{}, {} GiB, driver {}{}",
                    g.name,
                    g.memory_bytes.map_or("?".into(), |b| (b >> 30).to_string()),
                    g.driver,
                    match (g.compute_capability, g.runs_fp8()) {
                        (Some((major, minor)), Some(fp8)) => format!(
                            ", compute capability {major}.{minor} (fp8 bundles: {})",
                            if fp8 {
                                "yes"
                            } else {
                                "no, 9.0 or later needed"
                            }
                        ),
                        _ => String::new(),
                    }
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

/// The CUDA libraries ONNX Runtime's CUDA provider loads, by the sonames it asks for (CUDA 13 or
/// 12, cuDNN 9), each loaded here as the provider would load it: the check names the file the
/// dynamic loader picks (LD_LIBRARY_PATH first, then its cache), which is the one a run gets.
const CUDA_LIBRARIES: [(&str, &[&str]); 3] = [
    ("CUDA runtime", &["libcudart.so.13", "libcudart.so.12"]),
    ("cuBLAS", &["libcublas.so.13", "libcublas.so.12"]),
    ("cuDNN", &["libcudnn.so.9"]),
];

fn cuda_library_checks() -> Vec<Check> {
    CUDA_LIBRARIES
        .iter()
        .map(|(what, sonames)| {
            // The first soname that loads; else every soname's reason.
            let mut reasons = Vec::new();
            let found = sonames.iter().find_map(|soname| {
                load_library(soname)
                    .map_err(|reason| reasons.push(reason))
                    .ok()
            });
            Check {
                name: format!("library {what} ({})", sonames.join(" or ")),
                ok: found.is_some(),
                fix: found.is_none().then(|| {
                    "for the CUDA provider: `pip install onnxruntime-gpu` brings matching CUDA \
                     and cuDNN wheels, or add their folders to LD_LIBRARY_PATH"
                        .into()
                }),
                detail: found.unwrap_or_else(|| reasons.join("; ")),
            }
        })
        .collect()
}

/// Loads `soname` as the dynamic loader resolves it and returns the path of the file it mapped
/// ([`engine::mapped_library`]), or the loader's message. The library stays loaded (the doctor
/// is a short process).
fn load_library(soname: &str) -> Result<String, String> {
    // SAFETY: loading runs the library's initialisers; the CUDA and cuDNN libraries have no
    // initialisers with preconditions, and nothing of the library is called here.
    let library =
        unsafe { libloading::Library::new(soname) }.map_err(|e| engine::loader_message(&e))?;
    std::mem::forget(library);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    Ok(engine::mapped_library(&maps, soname)
        .unwrap_or(soname)
        .to_string())
}

/// The diagnostic switches set in this environment (docs/settings.md): a run started from it
/// records them, as its times are not the product's; a misspelt one stops the run.
fn diagnostics_check() -> Check {
    let name = "diagnostics".to_string();
    if let Err(e) = engine::check_diagnostics_env() {
        return Check {
            name,
            ok: false,
            detail: e,
            fix: None,
        };
    }
    let on = engine::Diagnostics::from_env().in_effect();
    Check {
        name,
        ok: true,
        detail: if on.is_empty() {
            "none set".into()
        } else {
            format!(
                "{} (runs record them: their times are not comparable with runs without)",
                on.join(", ")
            )
        },
        fix: None,
    }
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
                        b.manifest.precision.name()
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

/// The width of the checks' name column.
const NAME_WIDTH: usize = 34;

/// One line per check, `ok  ` or `MISS`, its name and what was found, and its fix on the next
/// line. A name wider than its column puts what was found on a line of its own, in the column
/// where the others start, so that the details stay in one column.
fn render(checks: &[Check]) -> String {
    let mut text = String::new();
    let indent = " ".repeat(5 + NAME_WIDTH + 1);
    for c in checks {
        let status = if c.ok { "ok  " } else { "MISS" };
        if c.name.chars().count() > NAME_WIDTH {
            text.push_str(&format!("{status} {}\n{indent}{}\n", c.name, c.detail));
        } else {
            text.push_str(&format!("{status} {:<NAME_WIDTH$} {}\n", c.name, c.detail));
        }
        if let Some(fix) = &c.fix {
            text.push_str(&format!("{indent}fix: {fix}\n"));
        }
    }
    text
}

pub fn run(args: &DoctorArgs) -> i32 {
    let mut checks = engine::probe_environment(args.ort_library.as_deref());
    checks.extend(gpu_checks());
    checks.extend(cuda_library_checks());
    checks.push(engine::probe::fused_kernels_check());
    checks.push(diagnostics_check());
    checks.extend(bundle_checks(&args.bundles));
    let code = super::out(&render(&checks));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every detail and fix starts in one column, also after a name wider than its own.
    #[test]
    fn details_and_fixes_share_one_column() {
        let check = |name: &str, ok, fix: Option<&str>| Check {
            name: name.into(),
            ok,
            detail: format!("detail of {name}"),
            fix: fix.map(Into::into),
        };
        let long = "library CUDA runtime (libcudart.so.13 or libcudart.so.12)";
        let text = render(&[
            check("onnx runtime", true, None),
            check(long, false, Some("install it")),
            check("gpus", false, Some("add one")),
        ]);
        let column = 5 + NAME_WIDTH + 1;
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6, "{text}");
        assert_eq!(lines[1], format!("MISS {long}"));
        for (line, rest) in [
            (lines[0], "detail of onnx runtime"),
            (lines[2], &format!("detail of {long}")),
            (lines[3], "fix: install it"),
            (lines[4], "detail of gpus"),
            (lines[5], "fix: add one"),
        ] {
            assert_eq!(line.get(column..), Some(rest), "{text}");
        }
        assert!(lines[0].starts_with("ok   onnx runtime") && lines[4].starts_with("MISS gpus"));
    }

    /// A library is loaded as a run would load it and named by the file mapped; a missing one
    /// gives the loader's message, which names it.
    #[test]
    fn libraries_are_loaded_and_named_by_their_file() {
        let libc = load_library("libc.so.6").unwrap();
        assert!(
            libc.starts_with('/') && libc.rsplit('/').next().unwrap().starts_with("libc"),
            "{libc}"
        );
        let missing = load_library("libunstep_absent.so.1").unwrap_err();
        assert!(missing.contains("libunstep_absent.so.1"), "{missing}");
    }
}

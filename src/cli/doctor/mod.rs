//! `runner doctor`: what a user checks before a long run. Each line says what was found and,
//! when something is missing, how to fix it. The checks that the run in question needs (from a
//! manifest, or `--provider`) decide the exit status; the others are shown for information.

use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use crate::engine::{self, Check, FusedKernels, OrtRuntime, OrtSource, Precision, ProviderKind};
use crate::exit;
use crate::manifest::Resolved;
use crate::manifest::diagnostic::display_path;

/// The oldest NVIDIA driver that runs CUDA 13 (the one CUDA 13.0 shipped with); any CUDA 13.x
/// library runs on it through CUDA's minor version compatibility. The runner's own kernels are
/// compiled to the GPU's machine code (a cubin), not PTX, so a driver older than the NVRTC does
/// not have to JIT-compile them.
pub const MIN_DRIVER: (u32, u32, u32) = (580, 65, 6);

/// The fix for CUDA libraries that do not load.
const SETUP_FIX: &str = "run `scripts/setup-gpu` (it installs onnxruntime-gpu and the CUDA 13 \
                         libraries into .cache/gpuenv) and start the runner with `scripts/runner`, \
                         which puts them on LD_LIBRARY_PATH (docs/gpu.md)";

const REQUIRED_HELP: &str = "\
Which checks decide the exit status:
  MANIFEST      what its run needs: ONNX Runtime and its CPU provider, the diagnostic
                switches and the manifest's bundle; with runtime.provider \"cuda\" or
                \"tensorrt\" also a GPU with a driver of 580.65.06 or newer, the provider in
                ONNX Runtime, its library and the CUDA libraries it loads; with \"cuda\" and
                runtime.dit_kernels or vae_kernels \"auto\" or \"unstep\" on a bundle with the
                fused graphs (an fp8 bundle always), NVRTC, cuBLASLt and cuDNN
  --provider P  the same for a run on provider P on a bundle with the fused graphs, with no
                bundle required
  neither       ONNX Runtime and its CPU provider only; the other checks are information
A required check that fails prints FAIL and the status is 1; a failed check that is not
required prints MISS. A manifest that does not load is status 2.";

#[derive(Debug, Args)]
#[command(after_long_help = REQUIRED_HELP)]
pub struct DoctorArgs {
    /// A manifest, e.g. experiments/unstep_speed.toml: what its run needs decides the status.
    #[arg(value_name = "MANIFEST")]
    pub manifest: Option<PathBuf>,
    /// Override a setting of the manifest: table.key=value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE", requires = "manifest")]
    pub set: Vec<String>,
    /// Without a manifest: what a run on this provider needs decides the status.
    #[arg(long, value_name = "PROVIDER", conflicts_with = "manifest")]
    pub provider: Option<ProviderKind>,
    /// Asset bundles to verify besides the manifest's (default without a manifest: every folder
    /// under assets/ with a bundle.toml). Information only.
    #[arg(long = "bundle", value_name = "DIR")]
    pub bundles: Vec<PathBuf>,
    /// libonnxruntime to load instead of the manifest's runtime.ort_library or the usual search.
    #[arg(long, value_name = "PATH")]
    pub ort_library: Option<PathBuf>,
    /// Print the checks as JSON: {ready, provider, manifest, checks: [{name, ok, required,
    /// detail, fix}]}.
    #[arg(long)]
    pub json: bool,
}

/// What the checks are asked about: what a run needs, from a manifest (every point of a sweep),
/// `--provider`, or neither.
#[derive(Debug, Default)]
struct Needs {
    /// The providers of the runs; empty when neither a manifest nor `--provider` was given.
    providers: Vec<ProviderKind>,
    /// NVRTC, cuBLASLt and cuDNN, for the runner's fused kernels.
    fused_kernels: bool,
    /// The manifest's bundles (one per bundle the runs use).
    bundles: Vec<PathBuf>,
    /// The manifest's `runtime.ort_library`.
    ort_library: Option<PathBuf>,
    /// The manifest, as given.
    manifest: Option<PathBuf>,
}

impl Needs {
    /// Loads the manifest as `runner plan` does (a bad one is reported, exit status 2).
    fn of(args: &DoctorArgs) -> Result<Needs, i32> {
        let Some(manifest) = &args.manifest else {
            return Ok(match args.provider {
                None => Needs::default(),
                Some(provider) => Needs {
                    providers: vec![provider],
                    fused_kernels: provider == ProviderKind::Cuda,
                    ..Needs::default()
                },
            });
        };
        let manifest_args = super::ManifestArgs {
            manifest: manifest.clone(),
            set: args.set.clone(),
            extra_args: Vec::new(),
        };
        let runs = manifest_args.load_plans(None, &[])?;
        let mut needs = Needs {
            manifest: Some(manifest.clone()),
            ort_library: runs[0].0.paths.ort_library.clone(),
            ..Needs::default()
        };
        for (resolved, _) in &runs {
            let provider = resolved.manifest.runtime.provider;
            if !needs.providers.contains(&provider) {
                needs.providers.push(provider);
            }
            needs.fused_kernels |= needs_fused_kernels(resolved);
            if !needs.bundles.contains(&resolved.paths.bundle) {
                needs.bundles.push(resolved.paths.bundle.clone());
            }
        }
        Ok(needs)
    }

    fn gpu(&self) -> bool {
        self.providers.iter().any(|p| *p != ProviderKind::Cpu)
    }

    fn tensorrt(&self) -> bool {
        self.providers.contains(&ProviderKind::Tensorrt)
    }

    /// A manifest or `--provider` was given: the run's own needs are asked about.
    fn named(&self) -> bool {
        !self.providers.is_empty()
    }

    /// The provider the summary names: the GPU one when runs differ.
    fn provider(&self) -> Option<ProviderKind> {
        self.providers
            .iter()
            .copied()
            .max_by_key(|p| *p != ProviderKind::Cpu)
    }
}

/// Whether the run builds the runner's fused kernels: on CUDA, with `auto` or `unstep` kernels
/// for a part whose fused graphs the bundle has, and always for an fp8 bundle (its DiT runs only
/// on them). A bundle that cannot be read (its own check fails) counts as having them, as every
/// bundle the exporter writes now does.
fn needs_fused_kernels(r: &Resolved) -> bool {
    let runtime = &r.manifest.runtime;
    if runtime.provider != ProviderKind::Cuda {
        return false;
    }
    let asks = |kernels: FusedKernels| kernels != FusedKernels::Onnxruntime;
    let Ok(bundle) = engine::Bundle::peek(&r.paths.bundle) else {
        return asks(runtime.dit_kernels) || asks(runtime.vae_kernels);
    };
    let m = &bundle.manifest;
    let graphs = &m.graphs;
    m.precision == Precision::Fp8
        || (asks(runtime.dit_kernels) && graphs.dit_fused.is_some())
        || (asks(runtime.vae_kernels)
            && graphs.vae_first_fused.is_some()
            && graphs.vae_step_fused.is_some())
}

/// One check as the doctor reports it: whether the run in question needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Row {
    name: String,
    ok: bool,
    required: bool,
    detail: String,
    fix: Option<String>,
}

impl Row {
    fn of(check: Check, required: bool) -> Row {
        Row {
            name: check.name,
            ok: check.ok,
            required,
            detail: check.detail,
            fix: check.fix,
        }
    }

    fn failed(&self) -> bool {
        self.required && !self.ok
    }
}

/// The driver's version as numbers ("580.65.06" → (580, 65, 6)); missing parts are 0.
fn driver_version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.trim().split('.').map(|p| p.parse::<u32>());
    let major = parts.next()?.ok()?;
    let minor = parts.next().unwrap_or(Ok(0)).ok()?;
    let patch = parts.next().unwrap_or(Ok(0)).ok()?;
    Some((major, minor, patch))
}

fn min_driver_text() -> String {
    let (major, minor, patch) = MIN_DRIVER;
    format!("{major}.{minor}.{patch:02}")
}

/// GPUs as the driver reports them, one check per GPU; a GPU whose driver is older than CUDA 13
/// needs ([`MIN_DRIVER`]) fails its check, and so does each line of the driver's answer that
/// names no GPU (one it could not query).
pub fn gpu_checks() -> Vec<Check> {
    match crate::execute::device::query() {
        Ok(q) if !q.gpus.is_empty() => q
            .gpus
            .into_iter()
            .map(|g| {
                let driver_ok = driver_version(&g.driver).is_some_and(|v| v >= MIN_DRIVER);
                Check {
                    name: format!("gpu {}", g.index),
                    ok: driver_ok,
                    detail: format!(
                        "{}, {} GiB, driver {}{}{}",
                        g.name,
                        g.memory_bytes.map_or("?".into(), |b| (b >> 30).to_string()),
                        g.driver,
                        if driver_ok {
                            String::new()
                        } else {
                            format!(" (CUDA 13 needs {} or newer)", min_driver_text())
                        },
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
                    fix: (!driver_ok).then(|| {
                        format!(
                            "upgrade the NVIDIA driver to {} or newer (docs/gpu.md)",
                            min_driver_text()
                        )
                    }),
                }
            })
            .chain(q.unreadable.into_iter().map(unreadable_check))
            .collect(),
        other => vec![Check {
            name: "gpus".into(),
            ok: false,
            detail: match other {
                Err(e) => e.to_string(),
                Ok(q) if q.unreadable.is_empty() => "the driver lists no GPU".into(),
                Ok(q) => format!("the driver lists no GPU: {}", q.unreadable.join("; ")),
            },
            fix: Some(format!(
                "install the NVIDIA driver ({} or newer) so that `nvidia-smi` lists the GPUs, or \
                 run CPU manifests (runtime.provider = \"cpu\")",
                min_driver_text()
            )),
        }],
    }
}

/// A line of `nvidia-smi`'s answer that names no GPU: a GPU it could not query, as it said.
fn unreadable_check(line: String) -> Check {
    Check {
        name: "gpu ?".into(),
        ok: false,
        detail: format!("nvidia-smi: {line}"),
        fix: Some(
            "see `nvidia-smi -q` for the GPU it could not query; set CUDA_VISIBLE_DEVICES to \
             the GPUs it lists"
                .into(),
        ),
    }
}

/// The CUDA libraries ONNX Runtime's CUDA provider loads, by the sonames it asks for (CUDA 13 or
/// 12, cuDNN 9): those its library links (the runtime, cuBLAS, cuBLASLt, cuRAND) and cuDNN, which
/// it opens at run time. Each is loaded here as the provider would load it: the check names
/// the file the dynamic loader picks (LD_LIBRARY_PATH first, then its cache), which is the one a
/// run gets.
const CUDA_LIBRARIES: [(&str, &[&str]); 5] = [
    ("CUDA runtime", &["libcudart.so.13", "libcudart.so.12"]),
    ("cuBLAS", &["libcublas.so.13", "libcublas.so.12"]),
    ("cuBLASLt", &["libcublasLt.so.13", "libcublasLt.so.12"]),
    ("cuRAND", &["libcurand.so.10"]),
    ("cuDNN", &["libcudnn.so.9"]),
];

/// The fix for a CUDA library that does not load. When ONNX Runtime came from a Python package
/// whose `nvidia-*` wheels hold the libraries, their folders are what LD_LIBRARY_PATH lacks.
fn library_fix(cuda_library_dirs: &[PathBuf]) -> String {
    if cuda_library_dirs.is_empty() {
        return SETUP_FIX.to_string();
    }
    let dirs: Vec<String> = cuda_library_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    format!(
        "put the CUDA wheels' folders on LD_LIBRARY_PATH ({}), or {SETUP_FIX}",
        dirs.join(":")
    )
}

fn cuda_library_checks(cuda_library_dirs: &[PathBuf]) -> Vec<Check> {
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
                fix: found.is_none().then(|| library_fix(cuda_library_dirs)),
                detail: found.unwrap_or_else(|| reasons.join("; ")),
            }
        })
        .collect()
}

/// The provider libraries beside ONNX Runtime (`libonnxruntime_providers_cuda.so`, `…_tensorrt.so`),
/// each with every library it links, as the dynamic loader resolves them when ONNX Runtime loads
/// it: a missing driver (`libcuda.so.1`), CUDA library or TensorRT shows here, by name. A build
/// without the file (a CPU build) has no check: its execution provider line says so.
fn provider_library_checks(ort: &OrtRuntime) -> Vec<(ProviderKind, Check)> {
    let Some(dir) = ort.location.path.parent() else {
        return Vec::new();
    };
    [ProviderKind::Cuda, ProviderKind::Tensorrt]
        .into_iter()
        .filter_map(|provider| {
            let file = dir.join(format!("libonnxruntime_providers_{}.so", provider.name()));
            if !file.is_file() {
                return None;
            }
            let name = format!("{} provider library", provider.name());
            let shown = file.display().to_string();
            let check = match missing_links(&file) {
                Ok(missing) if missing.is_empty() => Check {
                    name,
                    ok: true,
                    detail: format!("{shown} and the libraries it links are found"),
                    fix: None,
                },
                Ok(missing) => {
                    let reason = format!("{shown} links {}, not found", missing.join(", "));
                    Check {
                        name,
                        fix: Some(provider_library_fix(
                            provider,
                            &reason,
                            &ort.location.cuda_library_dirs,
                        )),
                        ok: false,
                        detail: reason,
                    }
                }
                // Nothing tells what it links: the file is there, and the session says the rest.
                Err(why) => Check {
                    name,
                    ok: true,
                    detail: format!(
                        "{shown} is present; the libraries it links were not checked ({why})"
                    ),
                    fix: None,
                },
            };
            Some((provider, check))
        })
        .collect()
}

/// The libraries `file` links, directly or through others, that the dynamic loader does not
/// find, as `ldd` lists them (the loader's trace mode: nothing of them runs). Loading a provider
/// library itself would run its initialisers, which take ONNX Runtime's provider host and crash
/// the process without it.
fn missing_links(file: &Path) -> Result<Vec<String>, String> {
    let out = std::process::Command::new("ldd")
        .arg(file)
        .output()
        .map_err(|e| format!("ldd could not be started: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ldd failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(parse_missing_links(&String::from_utf8_lossy(&out.stdout)))
}

/// The sonames `ldd` reports as `not found`.
fn parse_missing_links(ldd: &str) -> Vec<String> {
    ldd.lines()
        .filter_map(|line| {
            let (soname, target) = line.split_once("=>")?;
            (target.trim() == "not found").then(|| soname.trim().to_string())
        })
        .collect()
}

/// What to do when a provider library does not load, by the library the loader did not find.
fn provider_library_fix(
    provider: ProviderKind,
    reason: &str,
    cuda_library_dirs: &[PathBuf],
) -> String {
    if reason.contains("libcuda.so") {
        format!(
            "libcuda.so.1 is the NVIDIA driver's: install the driver, {} or newer (docs/gpu.md)",
            min_driver_text()
        )
    } else if reason.contains("libnvinfer") || reason.contains("libnvonnxparser") {
        "put TensorRT 10's libraries (libnvinfer.so.10, libnvonnxparser.so.10, for CUDA 13) on \
         LD_LIBRARY_PATH: `scripts/setup-gpu` does not install TensorRT (docs/gpu.md), or use \
         runtime.provider = \"cuda\""
            .to_string()
    } else if provider == ProviderKind::Cuda {
        library_fix(cuda_library_dirs)
    } else {
        SETUP_FIX.to_string()
    }
}

/// Loads `name` and says which file the loader mapped ([`engine::load_library_kept`]).
fn load_library(name: &str) -> Result<String, String> {
    engine::load_library_kept(name)
}
/// The diagnostic switches set in this environment (docs/settings.md): a run started from it
/// records them, as its times are not the product's; a misspelt one stops the run.
fn diagnostics_check() -> Check {
    let name = "diagnostics".to_string();
    if let Err(e) = engine::check_diagnostics_env() {
        return Check {
            name,
            ok: false,
            detail: e.to_string(),
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

/// Every folder under assets/ with a bundle.toml, sorted.
fn bundles_under_assets() -> Vec<PathBuf> {
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
}

/// Opens the bundle as a worker would, checking every file against its sha256.
fn bundle_check(dir: &Path) -> Check {
    let name = format!("bundle {}", display_path(dir));
    let scratch = std::env::temp_dir().join("unstep-doctor-unpack");
    match engine::Bundle::open(dir, &scratch) {
        Ok(b) => Check {
            name,
            ok: true,
            detail: format!(
                "preset {}, {}, every file matches its sha256",
                b.manifest.preset,
                b.manifest.precision.name()
            ),
            fix: None,
        },
        Err(e) => Check {
            name,
            ok: false,
            detail: e.to_string(),
            fix: Some(if dir.exists() {
                "re-export the bundle (see assets/export/README.md)".into()
            } else {
                "export it on a GPU machine (see assets/export/README.md), or set assets.bundle \
                 to a bundle that exists"
                    .into()
            }),
        },
    }
}

/// The manifest's bundles (required), then the others asked for with `--bundle` or, with
/// neither, those under assets/ (information).
fn bundle_rows(needs: &Needs, asked: &[PathBuf]) -> Vec<Row> {
    let others = if asked.is_empty() && needs.manifest.is_none() {
        let found = bundles_under_assets();
        if found.is_empty() {
            let none = Check {
                name: "asset bundles".into(),
                ok: false,
                detail: "none under assets/".into(),
                fix: Some("export one with the exporter (see assets/export/README.md)".into()),
            };
            return vec![Row::of(none, false)];
        }
        found
    } else {
        asked.to_vec()
    };
    let required = needs.bundles.iter().map(|dir| (dir, true));
    let others = others
        .iter()
        .filter(|dir| !needs.bundles.contains(dir))
        .map(|dir| (dir, false));
    required
        .chain(others)
        .map(|(dir, required)| Row::of(bundle_check(dir), required))
        .collect()
}

/// The fix for a GPU provider missing from the ONNX Runtime that was loaded, by where that
/// library came from: a path the user gave is the likely mistake.
fn provider_missing_fix(ort: &OrtRuntime) -> String {
    provider_missing_fix_on(ort, std::env::consts::ARCH)
}

/// [`provider_missing_fix`] on a machine of architecture `arch`: onnxruntime-gpu has no aarch64
/// wheel, so there the fix is a CUDA build of ONNX Runtime the user makes or has.
fn provider_missing_fix_on(ort: &OrtRuntime, arch: &str) -> String {
    if arch == "aarch64" {
        return format!(
            "onnxruntime-gpu has no aarch64 build: build ONNX Runtime {} with CUDA (the steps \
             `scripts/setup-gpu` prints; docs/gpu.md, \"GB200 (Grace + Blackwell)\") or take the \
             one your container ships, then run `ORT_DYLIB_PATH=<its libonnxruntime.so.{}> \
             scripts/setup-gpu` and start the runner with `scripts/runner`",
            engine::ort_lib::PINNED_ORT_VERSION,
            engine::ort_lib::PINNED_ORT_VERSION
        );
    }
    let setup = "run `scripts/setup-gpu` and start the runner with `scripts/runner` (docs/gpu.md)";
    match ort.location.source {
        OrtSource::EnvVar => format!(
            "ORT_DYLIB_PATH chooses this ONNX Runtime, a build without the provider: unset it, \
             or point it at onnxruntime-gpu's libonnxruntime.so.{}; or {setup}",
            engine::ort_lib::PINNED_ORT_VERSION
        ),
        OrtSource::Explicit => format!(
            "runtime.ort_library (or --ort-library) chooses this ONNX Runtime, a build without \
             the provider: point it at onnxruntime-gpu's libonnxruntime.so.{}, or leave it unset \
             and {setup}",
            engine::ort_lib::PINNED_ORT_VERSION
        ),
        _ => setup.to_string(),
    }
}

/// Every check, each marked with whether the run in question needs it.
fn checks(args: &DoctorArgs, needs: &Needs) -> Vec<Row> {
    let explicit = args.ort_library.as_deref().or(needs.ort_library.as_deref());
    let (gpu, tensorrt) = (needs.gpu(), needs.tensorrt());
    let ort = engine::ort_lib::runtime(explicit).ok();
    let mut rows: Vec<Row> = engine::probe_environment(explicit)
        .into_iter()
        .map(|check| {
            let required = match check.name.as_str() {
                "onnx runtime" | "execution provider cpu" => true,
                "execution provider cuda" => gpu,
                "execution provider tensorrt" => tensorrt,
                _ => false,
            };
            let mut row = Row::of(check, required);
            if row.failed()
                && row.name.starts_with("execution provider ")
                && let Some(ort) = ort
            {
                row.fix = Some(provider_missing_fix(ort));
            }
            row
        })
        .collect();
    rows.extend(gpu_checks().into_iter().map(|c| Row::of(c, gpu)));
    let cuda_library_dirs = ort.map_or(&[][..], |o| &o.location.cuda_library_dirs);
    rows.extend(
        cuda_library_checks(cuda_library_dirs)
            .into_iter()
            .map(|c| Row::of(c, gpu)),
    );
    if let Some(ort) = ort {
        rows.extend(
            provider_library_checks(ort)
                .into_iter()
                .map(|(provider, c)| {
                    let required = match provider {
                        ProviderKind::Tensorrt => tensorrt,
                        _ => gpu,
                    };
                    Row::of(c, required)
                }),
        );
    }
    let mut fused = Row::of(engine::probe::fused_kernels_check(), needs.fused_kernels);
    if fused.failed() {
        fused.fix = Some(format!(
            "{SETUP_FIX}; or set runtime.dit_kernels and runtime.vae_kernels to \"onnxruntime\" \
             (ONNX Runtime's slower kernels; not for an fp8 bundle)"
        ));
    }
    rows.push(fused);
    rows.push(Row::of(diagnostics_check(), needs.named()));
    rows.extend(bundle_rows(needs, &args.bundles));
    rows
}

/// The width of the checks' name column.
const NAME_WIDTH: usize = 34;

/// One line per check, `ok  `, `FAIL` (required) or `MISS` (information), its name and what was
/// found, and its fix on the next line. A name wider than its column puts what was found on a
/// line of its own, in the column where the others start, so that the details stay in one
/// column.
fn render(rows: &[Row]) -> String {
    let mut text = String::new();
    let indent = " ".repeat(5 + NAME_WIDTH + 1);
    for c in rows {
        let status = match (c.ok, c.required) {
            (true, _) => "ok  ",
            (false, true) => "FAIL",
            (false, false) => "MISS",
        };
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

/// The last lines: what was asked about, and whether every check it needs passed.
fn summary(needs: &Needs, rows: &[Row]) -> String {
    let asked = match (&needs.manifest, needs.provider()) {
        (Some(manifest), Some(provider)) => format!(
            "a run of {} (provider {})",
            display_path(manifest),
            provider.name()
        ),
        (None, Some(provider)) => format!("a run on provider {}", provider.name()),
        _ => "ONNX Runtime on the CPU".to_string(),
    };
    let failed = rows.iter().filter(|r| r.failed()).count();
    let mut text = match failed {
        0 => format!("\nready for {asked}: every required check passed\n"),
        1 => format!("\nnot ready for {asked}: 1 required check failed (FAIL above)\n"),
        n => format!("\nnot ready for {asked}: {n} required checks failed (FAIL above)\n"),
    };
    if failed > 0 && needs.gpu() {
        text.push_str("docs/gpu.md tells what each failure means and how to fix it\n");
    }
    if !needs.named() {
        text.push_str(
            "the GPU checks are information here: name a manifest (runner doctor MANIFEST) or \
             --provider cuda to require them\n",
        );
    }
    text
}

/// The report as JSON, with the fields in a fixed order.
#[derive(Serialize)]
struct Report<'a> {
    ready: bool,
    provider: Option<&'static str>,
    manifest: Option<String>,
    checks: &'a [Row],
}

pub fn run(args: &DoctorArgs) -> i32 {
    let needs = match Needs::of(args) {
        Ok(needs) => needs,
        Err(code) => return code,
    };
    let rows = checks(args, &needs);
    let ready = !rows.iter().any(Row::failed);
    let text = if args.json {
        let report = Report {
            ready,
            provider: needs.provider().map(|p| p.name()),
            manifest: needs.manifest.as_deref().map(display_path),
            checks: &rows,
        };
        let mut text = serde_json::to_string_pretty(&report).expect("the report serialises");
        text.push('\n');
        text
    } else {
        render(&rows) + &summary(&needs, &rows)
    };
    let code = super::out(&text);
    if code != exit::OK {
        code
    } else if ready {
        exit::OK
    } else {
        exit::FAILURE
    }
}

#[cfg(test)]
mod tests;

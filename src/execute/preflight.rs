//! Checks that need the real world (the bundle, the prompt file, existing state), run by
//! `runner apply` before anything is written, and the facts about the staged bundle a run's
//! record keeps.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use super::config::RunConfig;
use super::outcome::ApplyError;
use crate::engine::{self, AttentionBackend, ProviderKind};
use crate::manifest::diagnostic::display_path;
use crate::manifest::{ExecutorKind, Kind, Resolved, VideoNaming};
use crate::plan::Plan;
use crate::results::names::VideoNames;
use crate::results::records::{TokenizerRecord, WeightsRecord};

/// The refusals an apply of a run makes before it writes anything that can be told before any
/// run of a sweep starts: [`preflight`], the Slurm executor's own, and a staging folder left by
/// an apply of the run that failed (kept for diagnosis) without `--reuse-workdir`. A sweep checks
/// every point with it before its first run, and `runner plan` shows what it finds.
pub fn before_work(r: &Resolved, plan: &Plan, reuse_workdir: bool) -> Result<(), ApplyError> {
    preflight(r, &RunConfig::resolve(r))?;
    if r.manifest.executor.kind == ExecutorKind::Slurm {
        super::slurm::preflight(r, plan)?;
    }
    let stage = plan.work_root.join(&plan.run);
    // The staging of an apply that was killed (its record still says running, or the snapshot
    // is the run's and was not kept after a failure) is reused.
    let record = crate::results::files::read_json::<crate::results::records::RunRecord>(
        &plan.run_dir.join(crate::results::files::RUN_JSON),
    )
    .ok();
    if !reuse_workdir
        && stage.exists()
        && !super::staging::left_by_killed_apply(&stage, &plan.run, &plan.run_dir, record.as_ref())
    {
        return Err(super::staging::StagingError::Exists(stage).into());
    }
    Ok(())
}

/// Checks that need the real world (files present, no conflicting state) — before any write.
pub(super) fn preflight(r: &Resolved, config: &RunConfig) -> Result<(), ApplyError> {
    let p = &r.paths;
    if r.prompts.is_none() {
        return Err(ApplyError::refused(
            format!(
                "prompt file {} does not exist",
                display_path(&p.prompts_file)
            ),
            "put one prompt per line there (see assets/prompts/README.md), or set prompts.file",
        ));
    }
    if !p.bundle.exists() {
        return Err(ApplyError::refused(
            format!("asset bundle {} does not exist", display_path(&p.bundle)),
            RELEASED_BUNDLE_HINT,
        ));
    }
    // Staging refuses a symbolic link among the bundle's folders too, but only once the run's
    // locks have made its folders; a refusal writes nothing.
    super::staging::check_no_symlinked_dirs(&p.bundle)?;
    let m = &r.manifest;
    if m.runtime.provider == ProviderKind::Cpu
        && !matches!(
            m.method.attention_backend,
            AttentionBackend::Auto | AttentionBackend::Math
        )
    {
        return Err(ApplyError::refused(
            format!(
                "attention backend `{}` is not available on the CPU provider",
                m.method.attention_backend
            ),
            "use `auto` or `math` on the CPU, or runtime.provider = \"cuda\"",
        ));
    }
    bundle_preflight(r, config)?;
    random_weights_preflight(r)?;
    cpu_precision_preflight(r, config)?;
    fp8_gpu_preflight(r)?;
    attention_precision_preflight(r)?;
    fused_kernels_preflight(r, config)?;
    video_names_preflight(r, config)?;
    tokenizer_preflight(r)?;
    probe_state_preflight(r)?;
    results_preflight(r)?;
    space_preflight(r)?;
    provider_preflight(config)
}

/// The work root's file system must have room for what staging will really copy: the bundle's
/// files are linked where they share its file system, copied (or unpacked, for a `.zip`)
/// otherwise. A snapshot that already exists is reused or refused by staging, not copied.
fn space_preflight(r: &Resolved) -> Result<(), ApplyError> {
    let work_root = &r.paths.work_root;
    if work_root.join(r.name.as_str()).exists() {
        return Ok(());
    }
    let Ok(runner) = std::env::current_exe() else {
        return Ok(());
    };
    let small: Vec<&Path> = std::iter::once(r.paths.prompts_file.as_path())
        .chain(r.files.iter().map(|f| f.path.as_path()))
        .collect();
    let Some(space) = super::staging::space_needed(work_root, &r.paths.bundle, &runner, &small)
    else {
        return Ok(());
    };
    if space.needed <= space.available {
        return Ok(());
    }
    Err(ApplyError::refused(
        format!(
            "staging needs {} under {} and its file system has {} free",
            bytes(space.needed),
            display_path(work_root),
            bytes(space.available)
        ),
        "free that much space, or set staging.work_root (UNSTEP_WORK_ROOT) to a folder on the \
         bundle's file system, where its files are linked instead of copied",
    ))
}

/// A byte count for a message: exact, and in GiB or MiB to read at a glance.
fn bytes(n: u64) -> String {
    let gib = n as f64 / f64::from(1u32 << 30);
    if gib >= 1.0 {
        format!("{n} bytes ({gib:.1} GiB)")
    } else {
        format!("{n} bytes ({:.1} MiB)", n as f64 / f64::from(1u32 << 20))
    }
}

/// How to make the released bundle: download the released weights, then export them on a GPU
/// machine (docs/gpu.md).
pub(crate) const RELEASED_BUNDLE_HINT: &str = "download the released weights with \
    `PYTHONPATH=assets/export python -m unstep_export download --out weights`, then export them \
    on a GPU machine with `PYTHONPATH=assets/export python -m unstep_export export --released \
    weights --device cuda --out assets/wan-1.3b` (docs/gpu.md), or set assets.bundle";

/// A generation whose `[evaluation]` scores its videos must be of released weights: seeded random
/// weights make videos that score like real ones and mean nothing. Refused at `assets.bundle`
/// unless `assets.allow_random_weights = true`. Both forms of a bundle are read, a directory and
/// a `.zip`; one whose `bundle.toml` cannot be read is left to the worker, which refuses it.
fn random_weights_preflight(r: &Resolved) -> Result<(), ApplyError> {
    let m = &r.manifest;
    if m.kind != Kind::Generation || m.evaluation.command.is_none() || m.assets.allow_random_weights
    {
        return Ok(());
    }
    let Ok(manifest) = engine::Bundle::peek_manifest(&r.paths.bundle) else {
        return Ok(());
    };
    let weights = manifest.weights.clone().unwrap_or_default();
    let random: Vec<&str> = weights
        .sources()
        .iter()
        .filter(|(_, source)| *source != engine::bundle::WeightSource::Released)
        .map(|(part, _)| *part)
        .collect();
    if random.is_empty() {
        return Ok(());
    }
    let origin = origin_of(r, "assets.bundle");
    Err(ApplyError::refused(
        format!(
            "{origin}: asset bundle {} has seeded random weights ({}), and the manifest's \
             [evaluation] would score its videos as if they were the model's",
            display_path(&r.paths.bundle),
            random.join(", ")
        ),
        format!(
            "{RELEASED_BUNDLE_HINT}; to score this bundle anyway, set \
             assets.allow_random_weights = true"
        ),
    ))
}

/// A bundle, a directory or a `.zip`, must have a readable and consistent `bundle.toml` whose
/// names stay inside the bundle (a directory's listed files all there) and whose export settings
/// are the run's (they can only change by exporting again): refused here, before staging writes
/// anything, rather than by the workers. The files' sha256 are the staging audit's and the
/// workers' to check.
fn bundle_preflight(r: &Resolved, config: &RunConfig) -> Result<(), ApplyError> {
    let dir = &r.paths.bundle;
    if !dir.is_dir() && !dir.is_file() {
        return Ok(());
    }
    let bundle = engine::Bundle::peek_checked(dir).map_err(|e| {
        ApplyError::refused(
            format!("asset bundle {}: {e}", display_path(dir)),
            "point assets.bundle at a bundle the exporter wrote (assets/export/README.md)",
        )
    })?;
    bundle.check_export(&config.export).map_err(|e| {
        ApplyError::refused(
            format!("asset bundle {}: {e}", display_path(dir)),
            "change the manifest's method settings to the bundle's, or export the bundle again",
        )
    })
}

/// The results folder and the work root must be creatable: neither a file, and the nearest
/// existing folder on the way writable (a read-only file system is refused here, not after
/// staging or at the lock).
fn results_preflight(r: &Resolved) -> Result<(), ApplyError> {
    writable_preflight(
        &r.paths.run_dir,
        "results",
        "set outputs.dir to a folder this user can write",
    )?;
    writable_preflight(
        &r.paths.work_root,
        "the staging",
        "set staging.work_root to a folder this user can write",
    )
}

fn writable_preflight(target: &Path, what: &str, hint: &str) -> Result<(), ApplyError> {
    let mut at = target;
    loop {
        if at.exists() {
            if !at.is_dir() {
                return Err(ApplyError::refused(
                    format!("{} is a file, not a folder", display_path(at)),
                    format!("move the file away, or {hint}"),
                ));
            }
            if let Err(e) = crate::os::check_writable(at) {
                return Err(ApplyError::refused(
                    format!("cannot write {what} under {}: {}", display_path(at), e),
                    hint,
                ));
            }
            return Ok(());
        }
        match at.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => at = parent,
            _ => return Ok(()),
        }
    }
}

/// ONNX Runtime must be found for every provider, and a GPU provider must be in the build the
/// workers will load: asked here, before anything is written, rather than when the first worker
/// builds its sessions (a run failing there has staged a snapshot that blocks the next apply).
///
/// A process holds one ONNX Runtime. The first run checked loads its library here; a later run
/// whose library is another one (a sweep over `runtime.ort_library`) is checked by a process of
/// its own (`runner check-runtime`), as its workers will load it.
fn provider_preflight(config: &RunConfig) -> Result<(), ApplyError> {
    static LOADED: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    let explicit = config.engine.ort_library.clone();
    let kind = config.engine.provider.kind();
    let loaded = LOADED.get_or_init(|| explicit.clone());
    if *loaded != explicit {
        return check_runtime_in_child(explicit.as_deref(), kind);
    }
    check_runtime(explicit.as_deref(), kind)
}

/// Loads ONNX Runtime from `explicit` (or where it is looked for) in this process and checks
/// that it has the provider `kind`: [`provider_preflight`]'s check, and `runner check-runtime`'s.
pub fn check_runtime(explicit: Option<&Path>, kind: ProviderKind) -> Result<(), ApplyError> {
    let ort = engine::ort_lib::runtime(explicit).map_err(|e| {
        ApplyError::refused(
            e.to_string(),
            "see `runner doctor` for where ONNX Runtime is looked for",
        )
    })?;
    if kind == ProviderKind::Cpu {
        return Ok(());
    }
    let available = engine::session::available_providers()
        .into_iter()
        .find(|(name, _)| *name == kind.name())
        .is_some_and(|(_, ok)| matches!(ok, Ok(true)));
    if available {
        return Ok(());
    }
    Err(ApplyError::refused(
        format!(
            "the {} execution provider is not in ONNX Runtime {} at {}",
            kind.name(),
            ort.version,
            display_path(&ort.location.path)
        ),
        "install onnxruntime-gpu 1.31.1 (CUDA 13) or point runtime.ort_library at its library; \
         `runner doctor` checks it",
    ))
}

/// [`check_runtime`] in a process of its own (`runner check-runtime`, this same program): its
/// refusal, as it printed it, is this run's.
fn check_runtime_in_child(explicit: Option<&Path>, kind: ProviderKind) -> Result<(), ApplyError> {
    let program = std::env::current_exe().map_err(|e| {
        ApplyError::Io(format!(
            "cannot find this program to check ONNX Runtime: {e}"
        ))
    })?;
    let mut command = std::process::Command::new(program);
    command.args(["check-runtime", "--provider", kind.name()]);
    if let Some(path) = explicit {
        command.arg("--ort-library").arg(path);
    }
    let out = command
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| ApplyError::Io(format!("cannot check ONNX Runtime in a process: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    let mut lines = said.lines().map(str::trim).filter(|l| !l.is_empty());
    let message = lines
        .next()
        .map(|l| l.trim_start_matches("error: ").to_string())
        .unwrap_or_else(|| format!("checking ONNX Runtime failed ({})", out.status));
    let hint = lines
        .find_map(|l| l.strip_prefix("= hint: "))
        .unwrap_or("see `runner doctor` for where ONNX Runtime is looked for")
        .to_string();
    Err(ApplyError::refused(message, hint))
}

/// A generation's videos are named after their prompts: two selected prompts that would share a
/// file are refused (one would overwrite the other), naming them; a names file must exist.
fn video_names_preflight(r: &Resolved, config: &RunConfig) -> Result<(), ApplyError> {
    let m = &r.manifest;
    if m.kind != Kind::Generation || !m.outputs.save_videos {
        return Ok(());
    }
    if let Some(path) = &r.paths.names_file
        && r.names.is_none()
        && config.video_naming == VideoNaming::Vbench
    {
        return Err(ApplyError::refused(
            format!("names file {} does not exist", display_path(path)),
            "put the standard prompts there, line-aligned with the prompt file (docs/vbench.md), \
             or set prompts.names_file",
        ));
    }
    let count = r.prompts.as_deref().unwrap_or_default().len() as u32;
    let selected = m.prompts.indices.resolve(count);
    match VideoNames::of(r).shared(selected) {
        None => Ok(()),
        Some(shared) => Err(ApplyError::refused(
            format!(
                "two prompts of {} would share one video: {shared}",
                display_path(&r.paths.prompts_file)
            ),
            "make the prompts differ (videos are named after their text), set \
             prompts.names_file, or set outputs.video_naming = \"indexed\"",
        )),
    }
}

/// The bundle's prompt tokenizer must read and check (a umt5 tokenizer.json of the right model,
/// its sha256, ids within the text encoder's vocabulary) before anything runs. A bundle that is
/// not a readable directory is left to the worker.
fn tokenizer_preflight(r: &Resolved) -> Result<(), ApplyError> {
    let Ok(bundle) = engine::Bundle::peek(&r.paths.bundle) else {
        return Ok(());
    };
    bundle
        .tokenizer()
        .map(drop)
        .map_err(|e| ApplyError::Refused {
            message: format!("asset bundle {}: {e}", display_path(&r.paths.bundle)),
            hint: None,
        })
}

/// The staged bundle's tokenizer over every prompt of the plan, and the sources of its weights.
pub(super) fn bundle_facts(
    bundle_dir: &Path,
    plan: &Plan,
    prompts: &[String],
) -> Result<(TokenizerRecord, WeightsRecord), engine::BundleError> {
    let bundle = engine::Bundle::peek(bundle_dir)?;
    let tokenizer = bundle.tokenizer()?;
    let indices: BTreeSet<u32> = plan
        .processes
        .iter()
        .flat_map(|p| p.prompts.iter().copied())
        .collect();
    let mut truncated = Vec::new();
    let mut mojibake = Vec::new();
    for &index in &indices {
        let Some(text) = prompts.get(index as usize) else {
            continue;
        };
        let tokens = tokenizer.encode(text)?;
        if tokens.truncated {
            truncated.push(index);
        }
        if tokens.mojibake {
            mojibake.push(index);
        }
    }
    let tokenizer = TokenizerRecord {
        kind: tokenizer.kind().to_string(),
        text_len: tokenizer.text_len(),
        prompts: indices.len(),
        truncated: truncated.len(),
        truncated_prompts: truncated,
        mojibake_prompts: mojibake,
    };
    let m = &bundle.manifest;
    let weights = m.weights.clone().unwrap_or_default();
    let [dit, vae, text_encoder] = weights.sources().map(|(_, s)| s.as_str().to_string());
    let weights = WeightsRecord {
        source: weights.summary().as_str().to_string(),
        dit,
        vae,
        text_encoder,
        tokenizer: weights.tokenizer.map(|t| t.source.as_str().to_string()),
    };
    Ok((tokenizer, weights))
}

/// Warnings about the prompts a umt5 tokenizer cut or may read differently from the reference.
/// The bytes tokenizer of bundles before exporter 0.13.0 cuts most prompts by design and is not
/// warned about.
pub(super) fn tokenizer_warnings(t: &TokenizerRecord, r: &Resolved) -> Vec<String> {
    if t.kind != "umt5" {
        return Vec::new();
    }
    let command = format!(
        "`runner prompts {} {}`",
        display_path(&r.paths.bundle),
        display_path(&r.paths.prompts_file)
    );
    let mut warnings = Vec::new();
    if t.truncated > 0 {
        warnings.push(format!(
            "{} of {} prompts have more than text_len {} tokens and are cut there (prompts {}); {command} shows their tokens",
            t.truncated,
            t.prompts,
            t.text_len,
            short_list(&t.truncated_prompts)
        ));
    }
    if !t.mojibake_prompts.is_empty() {
        warnings.push(format!(
            "prompts {} look like mojibake (UTF-8 read as Latin-1 or Windows-1252), which the reference pipeline's ftfy repairs before tokenizing and the runner does not: their tokens may differ; {command} lists them",
            short_list(&t.mojibake_prompts)
        ));
    }
    warnings
}

/// Prompt indices for a message: the first ten, then `…`.
pub(super) fn short_list(indices: &[u32]) -> String {
    let shown: Vec<String> = indices.iter().take(10).map(u32::to_string).collect();
    let more = if indices.len() > 10 { ", …" } else { "" };
    format!("{}{more}", shown.join(", "))
}

/// A probe measures with fresh compiler caches: runtime state left by an earlier apply of the
/// same run is refused unless the manifest asks to reuse it.
pub(super) fn probe_state_preflight(r: &Resolved) -> Result<(), ApplyError> {
    let m = &r.manifest;
    if m.kind == Kind::Probe {
        let state = &r.paths.run_state_root;
        let has_state = fs::read_dir(state)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        if has_state && !m.cache.reuse_runtime_state {
            return Err(ApplyError::refused(
                format!("runtime state already exists at {}", display_path(state)),
                "use a new run name for fresh results, or set cache.reuse_runtime_state = true (UNSTEP_REUSE_RUNTIME_STATE=1) to reuse it",
            ));
        }
    }
    Ok(())
}

/// The CPU provider runs fp32 bundles only: another bundle is refused here, at the provider's
/// setting, instead of by every worker. A bundle that is not a readable directory is left to the
/// worker.
fn cpu_precision_preflight(r: &Resolved, config: &RunConfig) -> Result<(), ApplyError> {
    let Ok(bundle) = engine::Bundle::peek(&r.paths.bundle) else {
        return Ok(());
    };
    let precision = bundle.manifest.precision;
    if config.engine.provider != engine::Provider::Cpu || precision == engine::Precision::Fp32 {
        return Ok(());
    }
    let origin = origin_of(r, "runtime.provider");
    Err(ApplyError::refused(
        format!(
            "{origin}: asset bundle {}: {}",
            display_path(&r.paths.bundle),
            engine::BundleError::UnsupportedPrecision(precision)
        ),
        "set runtime.provider = \"cuda\" there, or point assets.bundle at an fp32 bundle",
    ))
}

/// An fp8 bundle run by the local executor on a GPU of this machine that cannot run its float8
/// matmuls (compute capability below 9.0, as `nvidia-smi` reports it) is refused at
/// `method.precision`. A Slurm run's GPUs are its nodes', and a GPU the driver does not describe
/// is left to the worker, whose session build says the same.
fn fp8_gpu_preflight(r: &Resolved) -> Result<(), ApplyError> {
    let m = &r.manifest;
    if m.method.precision != engine::Precision::Fp8
        || m.runtime.provider == ProviderKind::Cpu
        || m.executor.kind != ExecutorKind::Local
    {
        return Ok(());
    }
    let Ok(gpus) = super::device::gpus() else {
        return Ok(());
    };
    let Some(problem) = super::device::fp8_unable(&gpus, &crate::plan::visible_devices(r)) else {
        return Ok(());
    };
    let origin = origin_of(r, "method.precision");
    Err(ApplyError::refused(
        format!("{origin}: {problem}"),
        "run the fp16 bundle of the same weights on this GPU (method.precision = \"fp16\"), or \
         set runtime.visible_devices to Hopper GPUs",
    ))
}

/// Where the setting `key` was set (`file:line:col`, the variable or the flag), or the key itself
/// when no layer set it.
fn origin_of(r: &Resolved, key: &str) -> String {
    r.settings
        .get(key)
        .map(|s| s.origin.to_string())
        .unwrap_or_else(|| key.to_string())
}

/// The 8-bit attention where it cannot run: with settings that do not run the runner's own
/// attention (TensorRT, ONNX Runtime's DiT kernels, another attention backend), or on GPUs that
/// are not Hopper GPUs; refused with the setting's location before any work.
fn attention_precision_preflight(r: &Resolved) -> Result<(), ApplyError> {
    let m = &r.manifest;
    if m.method.attention_precision != engine::AttentionPrecision::Int8 {
        return Ok(());
    }
    let origin = origin_of(r, "method.attention_precision");
    let hint = "set the settings it names, or run with method.attention_precision = \"fp16\"";
    if let Some(reason) = engine::int8_attention_refusal(
        m.runtime.provider,
        m.runtime.dit_kernels,
        m.method.attention_backend,
    ) {
        return Err(ApplyError::refused(format!("{origin}: {reason}"), hint));
    }
    if m.runtime.provider == ProviderKind::Cpu || m.executor.kind != ExecutorKind::Local {
        return Ok(());
    }
    let Ok(gpus) = super::device::gpus() else {
        return Ok(());
    };
    match super::device::int8_attention_unable(&gpus, &crate::plan::visible_devices(r)) {
        Some(problem) => Err(ApplyError::refused(
            format!("{origin}: {problem}"),
            "run with method.attention_precision = \"fp16\" on this GPU, or set \
             runtime.visible_devices to Hopper GPUs",
        )),
        None => Ok(()),
    }
}

/// The runner's fused kernels asked for by name (`runtime.dit_kernels` / `runtime.vae_kernels` =
/// "unstep") that the provider or the bundle cannot run (TensorRT, a bundle without the fused
/// graphs or in bf16, a fused DiT whose self-attention is the runner's with an fp32 bundle on
/// CUDA), and any DiT kernels an fp8 bundle cannot run with (it has no others than
/// the runner's): refused here, with the setting's location, instead of when the first worker
/// builds its sessions. A bundle that is not a readable directory is left to the worker.
fn fused_kernels_preflight(r: &Resolved, config: &RunConfig) -> Result<(), ApplyError> {
    let Ok(bundle) = engine::Bundle::peek(&r.paths.bundle) else {
        return Ok(());
    };
    let runtime = &config.engine;
    let parts = [
        (
            engine::FusedPart::Dit,
            runtime.dit_kernels,
            "runtime.dit_kernels",
        ),
        (
            engine::FusedPart::Vae,
            runtime.vae_kernels,
            "runtime.vae_kernels",
        ),
    ];
    let fp8 = bundle.manifest.precision == engine::Precision::Fp8;
    for (part, kernels, key) in parts {
        let kernels = match kernels {
            // The DiT of an fp8 bundle has no fall-back: `auto` is checked as `unstep` is (which
            // leaves the CUDA libraries to the workers, as resolving `auto` would load them here).
            engine::FusedKernels::Auto if fp8 && part == engine::FusedPart::Dit => {
                engine::FusedKernels::Unstep
            }
            // `auto` falls back instead of failing (and would load the CUDA libraries here).
            engine::FusedKernels::Auto => continue,
            engine::FusedKernels::Onnxruntime if !(fp8 && part == engine::FusedPart::Dit) => {
                continue;
            }
            kernels => kernels,
        };
        if let Err(e) = kernels.resolve(part, &runtime.provider, &bundle) {
            let origin = origin_of(r, key);
            return Err(ApplyError::refused(
                format!("{origin}: {e}"),
                "change the setting there, or export the bundle the setting needs",
            ));
        }
    }
    Ok(())
}

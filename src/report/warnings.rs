//! What makes two runs' times or scores not comparable as equals: the warnings `runner compare`
//! prints (warm caches, failed runs, and every difference in what ran: GPU, provider, attention
//! kernel, kernel sets, library versions, bundle, weights, precision, attention precision, timed
//! region, diagnostics).

use super::load::LoadedRun;
use super::words::{name_of, opt, weights_of};
use crate::results::{CacheLabel, RunRecord, RunStatus};

/// The attention kernel a run's workers chose, with the one asked for.
fn attention_of(r: &RunRecord) -> String {
    format!(
        "{} (requested {})",
        opt(r.attention_backend.resolved.as_deref()),
        name_of(&r.attention_backend.requested)
    )
}

/// The kernel sets a run ran: the DiT's and the VAE's, and whether the DiT ran as CUDA graphs.
fn kernels_of(r: &RunRecord) -> String {
    let graphs = r
        .settings
        .get("runtime.cuda_graphs")
        .is_some_and(|s| s.value == serde_json::Value::Bool(true));
    format!(
        "dit {}, vae {}, CUDA graphs {}",
        opt(r.dit_kernels.as_deref()),
        opt(r.vae_kernels.as_deref()),
        if graphs { "on" } else { "off" }
    )
}

/// The libraries a run loaded, and the GPU driver.
fn versions_of(r: &RunRecord) -> String {
    format!(
        "onnxruntime {}, cuda {}, cudnn {}, driver {}",
        opt(r.versions.onnxruntime.as_deref()),
        opt(r.versions.cuda.as_deref()),
        opt(r.versions.cudnn.as_deref()),
        opt(r.device.driver_version.as_deref())
    )
}

/// Whether two runs ran other bundles: by contents where both records have them (the same
/// bundle may lie in two places), else by path.
fn bundle_differs(a: &RunRecord, b: &RunRecord) -> bool {
    match (&a.bundle, &b.bundle) {
        (Some(x), Some(y)) => match (&x.bundle_toml_sha256, &y.bundle_toml_sha256) {
            (Some(p), Some(q)) => p != q,
            _ => x.path != y.path,
        },
        (None, None) => false,
        _ => true,
    }
}

/// A bundle by its contents where the record has them (the sha256 of its bundle.toml), else by
/// its path.
fn bundle_of(r: &RunRecord) -> String {
    match &r.bundle {
        None => "n/a".into(),
        Some(b) => match &b.bundle_toml_sha256 {
            Some(sha) => format!(
                "{} (bundle.toml sha256 {})",
                b.path,
                sha.get(..12).unwrap_or(sha)
            ),
            None => b.path.clone(),
        },
    }
}

/// A run's diagnostic switches as a comparison names them.
fn switches(on: &[String]) -> String {
    if on.is_empty() {
        "none".into()
    } else {
        on.join(", ")
    }
}

/// A "differs" line of two runs' precisions, with what the reduced one of them computes and that
/// its figures are not those of the other as equals (`what` the mode is, `exact` whose figures
/// they are not comparable to); the line as it is when neither side or both are reduced.
fn reduced_line(
    line: String,
    sides: [(String, Option<&'static str>); 2],
    what: &str,
    exact: &str,
) -> String {
    match sides {
        [(name, Some(note)), (_, None)] | [(_, None), (name, Some(note))] => format!(
            "{line}; {name} is {what} ({note}): its times and scores are not comparable to \
             {exact} as equals"
        ),
        _ => line,
    }
}

/// Differences between two runs that make their times not directly comparable.
pub(super) fn comparison_warnings(a: &LoadedRun, b: &LoadedRun) -> Vec<String> {
    let mut w = Vec::new();
    for run in [a, b] {
        if run.record.cache.label == CacheLabel::WarmCache {
            w.push(format!(
                "run `{}` is warm-cache: its compiler caches may hold earlier runs' state, so its \
                 times are not those of a fresh start",
                run.name
            ));
        }
        if run.record.status != RunStatus::Succeeded {
            w.push(format!(
                "run `{}` did not succeed (status {})",
                run.name,
                run.record.status.as_str()
            ));
        }
    }
    let (ra, rb) = (&a.record, &b.record);
    let differs = |what: &str, x: String, y: String| {
        // "weights differ", "precision differs".
        let verb = if what.ends_with('s') {
            "differ"
        } else {
            "differs"
        };
        (x != y).then(|| format!("{what} {verb}: `{}` has {x}, `{}` has {y}", a.name, b.name))
    };
    // One side in a reduced precision (an fp8 bundle, the 8-bit attention) answers another
    // question than the other side: the warning says so rather than only naming the two.
    let precision =
        differs("precision", name_of(&ra.precision), name_of(&rb.precision)).map(|line| {
            reduced_line(
                line,
                [ra.precision, rb.precision].map(|p| (p.to_string(), p.reduced())),
                "the reduced-precision mode",
                "full precision's",
            )
        });
    let attention_precision = differs(
        "attention precision",
        name_of(&ra.attention_precision),
        name_of(&rb.attention_precision),
    )
    .map(|line| {
        reduced_line(
            line,
            [ra.attention_precision, rb.attention_precision].map(|p| (p.to_string(), p.reduced())),
            "the 8-bit attention",
            "fp16's",
        )
    });
    // Profiling, logging and left-out optimizers change the times they were measured with.
    let diagnostics = (ra.diagnostics != rb.diagnostics).then(|| {
        format!(
            "diagnostics differ: `{}` ran with {}, `{}` with {}; ONNX Runtime's profiler and log \
             slow a run, and left-out optimizers change its graphs",
            a.name,
            switches(&ra.diagnostics),
            b.name,
            switches(&rb.diagnostics)
        )
    });
    w.extend(
        [
            differs(
                "GPU model",
                opt(ra.device.gpu_model.as_deref()).to_string(),
                opt(rb.device.gpu_model.as_deref()).to_string(),
            ),
            differs("provider", name_of(&ra.provider), name_of(&rb.provider)),
            differs("attention backend", attention_of(ra), attention_of(rb)),
            differs("kernels", kernels_of(ra), kernels_of(rb)),
            differs("library versions", versions_of(ra), versions_of(rb)),
            bundle_differs(ra, rb).then(|| {
                format!(
                    "bundle differs: `{}` has {}, `{}` has {}",
                    a.name,
                    bundle_of(ra),
                    b.name,
                    bundle_of(rb)
                )
            }),
            differs(
                "weights",
                ra.weights.as_ref().map_or("n/a".into(), weights_of),
                rb.weights.as_ref().map_or("n/a".into(), weights_of),
            ),
            precision,
            attention_precision,
            differs(
                "timed region end",
                ra.timed_region_ends.to_string(),
                rb.timed_region_ends.to_string(),
            ),
            diagnostics,
        ]
        .into_iter()
        .flatten(),
    );
    w
}

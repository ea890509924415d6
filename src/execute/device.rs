//! GPUs as the driver reports them, for provenance and `runner doctor`. Read with `nvidia-smi`
//! in the orchestrator, so that no CUDA context is created outside the workers.

use std::io;
use std::process::Command;
use std::sync::Arc;

/// Why `nvidia-smi` listed no GPUs; Clone, as [`gpus`] keeps one answer for the process.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuQueryError {
    #[error("nvidia-smi could not be started ({0})")]
    Start(Arc<io::Error>),
    /// It failed: what it wrote on its standard error, trimmed.
    #[error("nvidia-smi failed: {0}")]
    Failed(String),
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// The driver's index (as in `CUDA_VISIBLE_DEVICES`).
    pub index: String,
    pub name: String,
    pub memory_bytes: Option<u64>,
    pub driver: String,
    /// Compute capability (major, minor), as `nvidia-smi` reports `compute_cap` ("9.0").
    pub compute_capability: Option<(u32, u32)>,
}

impl GpuInfo {
    /// Whether it runs fp8 bundles: cuBLASLt's float8 matmuls with per-channel scales need
    /// compute capability 9.0 (Hopper) or later. `None` when the driver did not say.
    pub fn runs_fp8(&self) -> Option<bool> {
        self.compute_capability.map(|(major, _)| major >= 9)
    }
}

/// The first of the GPUs named by `devices` (indices as in `CUDA_VISIBLE_DEVICES`) that cannot
/// run an fp8 bundle, described; GPUs the list does not have and those of unknown capability are
/// left to the workers.
pub fn fp8_unable(gpus: &[GpuInfo], devices: &[String]) -> Option<String> {
    gpus.iter()
        .filter(|g| devices.contains(&g.index))
        .find(|g| g.runs_fp8() == Some(false))
        .map(|g| {
            let (major, minor) = g.compute_capability.unwrap_or_default();
            format!(
                "GPU {} ({}) has compute capability {major}.{minor}; precision fp8 needs 9.0 or \
                 later (Hopper)",
                g.index, g.name
            )
        })
}

/// The first of the GPUs named by `devices` that cannot run the 8-bit attention (a Hopper GPU,
/// compute capability 9.0, alone: its kernel is built on Hopper's own instructions), described;
/// GPUs the list does not have and those of unknown capability are left to the workers.
pub fn int8_attention_unable(gpus: &[GpuInfo], devices: &[String]) -> Option<String> {
    gpus.iter()
        .filter(|g| devices.contains(&g.index))
        .find(|g| g.compute_capability.is_some_and(|cc| cc != (9, 0)))
        .map(|g| {
            let (major, minor) = g.compute_capability.unwrap_or_default();
            format!(
                "GPU {} ({}) has compute capability {major}.{minor}; the 8-bit attention runs on \
                 Hopper GPUs (9.0) alone",
                g.index, g.name
            )
        })
}

/// The indices of the GPUs the driver lists, for a run whose GPUs they decide: a generation run
/// by local processes on a GPU provider with `CUDA_VISIBLE_DEVICES` unset. `None` for any other
/// run, and when `nvidia-smi` cannot list them.
pub fn driver_gpus_for(r: &crate::manifest::Resolved) -> Option<Vec<String>> {
    let m = &r.manifest;
    let decides = m.kind == crate::manifest::Kind::Generation
        && m.runtime.provider != crate::engine::ProviderKind::Cpu
        && m.executor.kind == crate::manifest::ExecutorKind::Local
        && m.runtime
            .visible_devices
            .as_deref()
            .is_none_or(|d| d.trim().is_empty());
    if !decides {
        return None;
    }
    gpus()
        .ok()
        .map(|gpus| gpus.into_iter().map(|g| g.index).collect())
}

/// Every GPU the driver sees, or why none could be listed. Asked once per process: the plan's
/// visible devices, the preflight's checks and the run's record all read the same answer.
pub fn gpus() -> Result<Vec<GpuInfo>, GpuQueryError> {
    static GPUS: std::sync::OnceLock<Result<Vec<GpuInfo>, GpuQueryError>> =
        std::sync::OnceLock::new();
    GPUS.get_or_init(query_gpus).clone()
}

fn query_gpus() -> Result<Vec<GpuInfo>, GpuQueryError> {
    let out = Command::new("nvidia-smi")
        .args([
            "--query-gpu=index,name,memory.total,driver_version,compute_cap",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .map_err(|e| GpuQueryError::Start(Arc::new(e)))?;
    if !out.status.success() {
        return Err(GpuQueryError::Failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(parse(&String::from_utf8_lossy(&out.stdout)))
}

fn parse(text: &str) -> Vec<GpuInfo> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            let field = |i: usize| f.get(i).copied().unwrap_or("").to_string();
            GpuInfo {
                index: field(0),
                name: field(1),
                // memory.total is in MiB with `nounits`.
                memory_bytes: f
                    .get(2)
                    .and_then(|m| m.parse::<u64>().ok())
                    .map(|mib| mib << 20),
                driver: field(3),
                compute_capability: f.get(4).and_then(|c| {
                    let (major, minor) = c.split_once('.')?;
                    Some((major.parse().ok()?, minor.parse().ok()?))
                }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_query_output() {
        let gpus = parse(
            "0, NVIDIA H200, 143771, 580.95.05, 9.0\n1, NVIDIA A100-SXM4-80GB, 81920, 580.95.05, \
             8.0\n2, NVIDIA H200, 143771, 580.95.05, [N/A]\n",
        );
        assert_eq!(gpus.len(), 3);
        assert_eq!(gpus[1].index, "1");
        assert_eq!(gpus[0].name, "NVIDIA H200");
        assert_eq!(gpus[0].memory_bytes, Some(143771 << 20));
        assert_eq!(gpus[0].driver, "580.95.05");
        assert_eq!(gpus[0].compute_capability, Some((9, 0)));
        assert_eq!(gpus[1].compute_capability, Some((8, 0)));
        assert_eq!(gpus[2].compute_capability, None);
        assert_eq!(
            gpus.iter().map(GpuInfo::runs_fp8).collect::<Vec<_>>(),
            [Some(true), Some(false), None]
        );
    }

    /// Only the run's GPUs count, and only a known capability below 9.0 refuses.
    #[test]
    fn fp8_is_refused_on_a_listed_gpu_below_hopper() {
        let gpus = parse(
            "0, NVIDIA H200, 143771, 580.95.05, 9.0\n1, NVIDIA A100, 81920, 580.95.05, 8.0\n\
             2, NVIDIA H200, 143771, 580.95.05, [N/A]\n",
        );
        let devices = |list: &[&str]| list.iter().map(|d| d.to_string()).collect::<Vec<_>>();
        assert_eq!(fp8_unable(&gpus, &devices(&["0", "2"])), None);
        assert_eq!(fp8_unable(&gpus, &devices(&["7"])), None);
        assert_eq!(
            fp8_unable(&gpus, &devices(&["0", "1"])).as_deref(),
            Some(
                "GPU 1 (NVIDIA A100) has compute capability 8.0; precision fp8 needs 9.0 or later \
                 (Hopper)"
            )
        );
    }
}

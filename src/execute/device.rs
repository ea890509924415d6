//! GPUs as the driver reports them, for provenance and `runner doctor`. Read with `nvidia-smi`
//! in the orchestrator, so that no CUDA context is created outside the workers.

use std::sync::Arc;
use std::time::Duration;

/// Why `nvidia-smi` listed no GPUs; Clone, as [`gpus`] keeps one answer for the process.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuQueryError {
    /// It could not start, or did not answer within [`QUERY_TIMEOUT`].
    #[error("{0}")]
    Run(Arc<crate::bounded_command::CommandError>),
    /// It failed and listed no GPU: what it said (its standard error, else its output, else
    /// its exit status).
    #[error("nvidia-smi failed: {0}")]
    Failed(String),
}

/// How long `nvidia-smi` may take: a driver that hangs (a GPU falling off the bus) must not hang
/// `doctor`, `plan` or `apply`.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

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

/// Sets `r.driver_gpus` to the indices of the GPUs the driver lists, for a run whose GPUs they
/// decide: a generation run by local processes on a GPU provider with `CUDA_VISIBLE_DEVICES`
/// unset; `None` for any other run, and when `nvidia-smi` cannot list them. What made a GPU
/// unlisted (a line that names no GPU, a failure other than a machine without `nvidia-smi`) is
/// added to `r.warnings`.
pub fn read_driver_gpus(r: &mut crate::manifest::Resolved) {
    let m = &r.manifest;
    let decides = m.kind == crate::manifest::Kind::Generation
        && m.runtime.provider != crate::engine::ProviderKind::Cpu
        && m.executor.kind == crate::manifest::ExecutorKind::Local
        && m.runtime
            .visible_devices
            .as_deref()
            .is_none_or(|d| d.trim().is_empty());
    if !decides {
        r.driver_gpus = None;
        return;
    }
    match query() {
        Ok(q) => {
            r.warnings.extend(q.unreadable.iter().map(|line| {
                format!("nvidia-smi listed a line that names no GPU, left out of the run: {line}")
            }));
            r.driver_gpus = Some(q.gpus.into_iter().map(|g| g.index).collect());
        }
        Err(e) => {
            let absent = matches!(&e, GpuQueryError::Run(run) if matches!(&**run,
                crate::bounded_command::CommandError::Start { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound));
            if !absent {
                r.warnings
                    .push(format!("the driver's GPUs could not be listed: {e}"));
            }
            r.driver_gpus = None;
        }
    }
}

/// What `nvidia-smi` answered: the GPUs of the lines that read as the queried fields, and every
/// other line it wrote (a GPU it could not query, a warning), which names no GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuQuery {
    pub gpus: Vec<GpuInfo>,
    pub unreadable: Vec<String>,
}

/// Every GPU the driver sees, or why none could be listed. Asked once per process: the plan's
/// visible devices, the preflight's checks and the run's record all read the same answer.
pub fn gpus() -> Result<Vec<GpuInfo>, GpuQueryError> {
    query().map(|q| q.gpus)
}

/// The one answer of the process (see [`gpus`]).
pub fn query() -> Result<GpuQuery, GpuQueryError> {
    static GPUS: std::sync::OnceLock<Result<GpuQuery, GpuQueryError>> = std::sync::OnceLock::new();
    GPUS.get_or_init(query_gpus).clone()
}

fn query_gpus() -> Result<GpuQuery, GpuQueryError> {
    let answer = crate::bounded_command::run(
        "nvidia-smi",
        &[
            "--query-gpu=index,name,memory.total,driver_version,compute_cap",
            "--format=csv,noheader,nounits",
        ],
        QUERY_TIMEOUT,
    )
    .map_err(|e| GpuQueryError::Run(Arc::new(e)))?;
    let mut query = parse(&answer.stdout);
    if answer.status.success() {
        return Ok(query);
    }
    // A driver that fails for one GPU still lists the others: those are used, and its message
    // is reported with the lines it could not read.
    if query.gpus.is_empty() {
        return Err(GpuQueryError::Failed(answer.failure_text()));
    }
    query.unreadable.extend(
        answer
            .stderr
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from),
    );
    Ok(query)
}

/// The GPUs of `text`, one a line as `index, name, memory.total, driver_version, compute_cap`;
/// a line that does not read as those five fields (a message, `[Unknown Error]` in place of a
/// value) names no GPU and is kept as it is in [`GpuQuery::unreadable`].
fn parse(text: &str) -> GpuQuery {
    let mut query = GpuQuery::default();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match parse_line(line) {
            Some(gpu) => query.gpus.push(gpu),
            None => query.unreadable.push(line.to_string()),
        }
    }
    query
}

fn parse_line(line: &str) -> Option<GpuInfo> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    let [index, name, memory, driver, cap] = f[..] else {
        return None;
    };
    // "[N/A]" is the driver's word for a value it does not have; any other bracketed word
    // ("[Unknown Error]", "[GPU requires reset]") is a GPU it could not query.
    let optional = |v: &str| v == "[N/A]";
    let is_version = |v: &str| {
        !v.is_empty()
            && v.split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    if index.is_empty()
        || !index.bytes().all(|b| b.is_ascii_digit())
        || name.is_empty()
        || name.starts_with('[')
        || !(optional(memory) || memory.parse::<u64>().is_ok())
        || !is_version(driver)
        || !(optional(cap) || (is_version(cap) && cap.split('.').count() == 2))
    {
        return None;
    }
    Some(GpuInfo {
        index: index.to_string(),
        name: name.to_string(),
        // memory.total is in MiB with `nounits`.
        memory_bytes: memory.parse::<u64>().ok().map(|mib| mib << 20),
        driver: driver.to_string(),
        compute_capability: cap
            .split_once('.')
            .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_query_output() {
        let gpus = parse(
            "0, NVIDIA H200, 143771, 580.95.05, 9.0\n1, NVIDIA A100-SXM4-80GB, 81920, 580.95.05, \
             8.0\n2, NVIDIA H200, 143771, 580.95.05, [N/A]\n",
        )
        .gpus;
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
        )
        .gpus;
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

    /// Only a line of the five queried fields is a GPU: a message, or a GPU the driver could not
    /// query, is kept as said and never becomes a device index.
    #[test]
    fn lines_that_are_not_the_queried_fields_name_no_gpu() {
        let q = parse(
            "0, NVIDIA H200, 143771, 580.95.05, 9.0\n\
             Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n\
             2, [Unknown Error], [Unknown Error], 580.95.05, [Unknown Error]\n\
             3, NVIDIA H200, 143771, 580.95.05\n\
             No devices were found\n\
             5, NVIDIA H200, [N/A], 580.95.05, [N/A]\n",
        );
        let indices: Vec<&str> = q.gpus.iter().map(|g| g.index.as_str()).collect();
        assert_eq!(indices, ["0", "5"]);
        assert_eq!(
            q.unreadable,
            [
                "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error",
                "2, [Unknown Error], [Unknown Error], 580.95.05, [Unknown Error]",
                "3, NVIDIA H200, 143771, 580.95.05",
                "No devices were found",
            ]
        );
    }
}

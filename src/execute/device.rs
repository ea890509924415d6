//! GPUs as the driver reports them, for provenance and `runner doctor`. Read with `nvidia-smi`
//! in the orchestrator, so that no CUDA context is created outside the workers.

use std::process::Command;

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// The driver's index (as in `CUDA_VISIBLE_DEVICES`).
    pub index: String,
    pub name: String,
    pub memory_bytes: Option<u64>,
    pub driver: String,
}

/// Every GPU the driver sees, or why none could be listed.
pub fn gpus() -> Result<Vec<GpuInfo>, String> {
    let out = Command::new("nvidia-smi")
        .args([
            "--query-gpu=index,name,memory.total,driver_version",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .map_err(|e| format!("nvidia-smi could not be started ({e})"))?;
    if !out.status.success() {
        return Err(format!(
            "nvidia-smi failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
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
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_query_output() {
        let gpus = parse("0, NVIDIA H200, 143771, 580.95.05\n1, NVIDIA H200, 143771, 580.95.05\n");
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[1].index, "1");
        assert_eq!(gpus[0].name, "NVIDIA H200");
        assert_eq!(gpus[0].memory_bytes, Some(143771 << 20));
        assert_eq!(gpus[0].driver, "580.95.05");
    }
}

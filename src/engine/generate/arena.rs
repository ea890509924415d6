//! The device arenas' statistics, logged after each prompt on GPUs.

use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::Session;

use super::buffers::status_result;
use crate::engine::session::GraphSessions;

/// One log line with every bundle session's arena (on GPUs, after each prompt).
pub(super) fn log_arenas(sessions: &GraphSessions, mem: &MemoryInfo<'static>) {
    let arenas: Vec<String> = [
        ("text encoder", sessions.text_encoder.as_ref()),
        ("dit", Some(&sessions.dit)),
        ("vae_first", Some(&sessions.vae_first)),
        ("vae_step", Some(&sessions.vae_step)),
    ]
    .into_iter()
    .filter_map(|(name, s)| arena_summary(s?, mem).map(|a| format!("{name} {a}")))
    .collect();
    if !arenas.is_empty() {
        eprintln!(
            "device arenas (in use / max in use / reserved): {}",
            arenas.join(", ")
        );
    }
}

/// ONNX Runtime's statistics of `session`'s device arena (`AllocatorGetStats`): bytes in use,
/// the most ever in use, and what the arena holds from CUDA, as "in use / max / reserved" GiB.
fn arena_summary(session: &Session, mem: &MemoryInfo<'static>) -> Option<String> {
    use ort::AsPointer;
    let arena = MemoryInfo::new(
        AllocationDevice::CUDA,
        mem.device_id(),
        AllocatorType::Arena,
        MemoryType::Default,
    )
    .ok()?;
    let allocator = ort::memory::Allocator::new(session, arena).ok()?;
    let mut kvps: *mut ort::sys::OrtKeyValuePairs = std::ptr::null_mut();
    // SAFETY: the allocator is alive for the call; on success `kvps` is a new key/value list that
    // is read and released below.
    let status = unsafe { (ort::api().AllocatorGetStats)(allocator.ptr(), &mut kvps) };
    status_result(status).ok()?;
    if kvps.is_null() {
        return None;
    }
    let mut stats = std::collections::HashMap::new();
    // SAFETY: `kvps` is valid until released; keys and values are NUL-terminated strings it owns.
    unsafe {
        let (mut keys, mut values, mut n) = (std::ptr::null(), std::ptr::null(), 0usize);
        (ort::api().GetKeyValuePairs)(kvps, &mut keys, &mut values, &mut n);
        for i in 0..n {
            let k = std::ffi::CStr::from_ptr(*keys.add(i))
                .to_string_lossy()
                .into_owned();
            let v = std::ffi::CStr::from_ptr(*values.add(i))
                .to_string_lossy()
                .into_owned();
            stats.insert(k, v);
        }
        (ort::api().ReleaseKeyValuePairs)(kvps);
    }
    let gib = |key: &str| {
        stats
            .get(key)
            .and_then(|v| v.parse::<f64>().ok())
            .map_or("?".to_string(), |b| {
                format!("{:.2}", b / (1u64 << 30) as f64)
            })
    };
    Some(format!(
        "{} / {} / {} GiB",
        gib("InUse"),
        gib("MaxInUse"),
        gib("TotalAllocated")
    ))
}

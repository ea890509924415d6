//! `Attention` on CUDA: cuDNN's fused flash attention (its SDPA forward operation, built through
//! cuDNN's backend API), with the last, partial wave of a call split over the keys.
//!
//! - cuDNN is loaded at run time by its soname `libcudnn.so.9`, so that the process has the one
//!   ONNX Runtime's CUDA provider loaded (a second cuDNN of another version, found under the
//!   unversioned name `libcudnn.so` of a system install, fails to load its sub-libraries beside
//!   the first); a missing library, or one older than 9.13.1 (the first with the SDPA operation),
//!   is an error when a session creates the kernel. The kernel runs float16 only (cuDNN's flash
//!   attention has no float32 kernel).
//! - Q, K, V and O are `[B, S, D]` / `[B, L, D]` rows of `num_heads` heads of hd = D / num_heads
//!   (BSHD): cuDNN reads and writes them in place through strides, no transpose.
//! - **The last wave.** On an H200 (sm_90) cuDNN runs 64 query rows of one head per thread block,
//!   two blocks per SM. wan-1.3b's block of 4,680 rows × 12 heads is 888 thread blocks, 3.36 waves
//!   of 264 in four: the last wave is a third full and takes as long as a full one
//!   (`benches/attention_waves.py`). [`split`] runs the rows of the full waves in one call (4,224
//!   rows, three waves) and the remaining rows in a second call whose batch is `parts` runs of
//!   the keys (the rows repeated with a batch stride of 0), which also returns each run's
//!   log-sum-exp; a small kernel (`unstep_attention_merge_f16` of `kernels.cu`) merges the runs
//!   into the output: `O = Σ_p e^(lse_p − m) O_p / Σ_p e^(lse_p − m)` with m the largest lse_p.
//!   The split call and the merge cost less than the partial wave they replace (the times are in
//!   `benches/README.md`, from `cuda_attention_matches_the_cpu_kernel`). Other devices
//!   ([`WaveShaping`]: the tile and occupancy were measured on sm_90 alone) and head sizes,
//!   batches above 1, and calls whose last wave no split shortens by a fifth run as one call.
//!   A run's records name the shaping of each kind of device the process used
//!   ([`wave_shaping_used`]).
//! - One cuDNN handle and one scratch buffer (cuDNN's workspace, the runs' outputs and
//!   log-sum-exps) per device and stream, made on first use and kept for the process: a captured
//!   CUDA graph keeps pointing at them. The execution plans of a call shape are built on its first
//!   call (a process's plain passes come before any capture) and shared by every node of the
//!   process on that stream: the 30 layers' attentions make the same calls, so each shape's
//!   plans are built once, not once per node (each node keeps the ones it ran, so that its calls
//!   take no lock). With a kernel cache folder each plan is also kept under its
//!   `cudnn_attention/` (cuDNN's serialised form, by GPU kind, cuDNN version and the call's sizes
//!   and strides), and a later process restores it instead of building it.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::cudnn::sys as dnn;
use cudarc::driver::{result as driver, sys};
use ort::value::TensorElementType;

use super::DOMAIN;
pub(crate) use super::attention_call::{AttentionError, AttentionSizes};
use super::attention8::Attention8;
use super::cuda::{CurrentContext, Handle, device_function, device_info, primary_context};
use super::cudnn::{
    Attr, CudnnError, Desc, Kind, check_aligned, check_cudnn, deserialize_plan, device_kind,
    engine_configs, execute_plan, execution_plan, handle, scratch, serialize_plan,
};
use crate::engine::one_time::{self, Work};
use crate::vocab::AttentionPrecision;

/// Query rows of one cuDNN thread block on sm_90 (its kernel `knob_7_64x128x128`).
pub(crate) const TILE_ROWS: usize = 64;
/// cuDNN's thread blocks per SM on sm_90 at hd = 128.
pub(crate) const BLOCKS_PER_SM: usize = 2;
/// The most runs of the keys the tail is split into (`MERGE_MAX_PARTS` of `kernels.cu`).
pub(crate) const MAX_PARTS: usize = 8;
/// The largest share of a wave the split tail may take, in waves: less than this saves enough
/// of the wave to pay for the second call and the merge.
const MAX_TAIL_WAVES: f64 = 0.8;
/// The merge kernel's threads per block (one warp per row and head; `MERGE_THREADS` of
/// `kernels.cu`).
pub(crate) const MERGE_THREADS: u32 = 256;

/// The tensors of a cuDNN call, by unique id.
const UID_Q: i64 = 1;
const UID_K: i64 = 2;
const UID_V: i64 = 3;
const UID_O: i64 = 4;
const UID_STATS: i64 = 5;
const UID_SCALE: i64 = 6;

/// How a call's query rows run: the first `main_rows` in one call over all keys, the rest in one
/// call over `parts` runs of the keys, merged (`parts` = 1: one call, nothing split).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Split {
    pub(crate) main_rows: usize,
    pub(crate) parts: usize,
}

/// How the attention fits a call's thread blocks to a device's waves, chosen by its compute
/// capability: the tile and occupancy behind [`split`] ([`TILE_ROWS`], [`BLOCKS_PER_SM`]) were
/// measured on sm_90 alone, so only sm_90 splits a partial last wave, over its own SM count; any
/// other device runs every call whole (cuDNN's tile and occupancy there were never measured, and
/// a split shaped on wrong ones could lengthen the call it meant to shorten).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaveShaping {
    /// Compute capability 9.0 with `sms` SMs: waves of `sms` × [`BLOCKS_PER_SM`] thread blocks.
    Sm90 { sms: usize },
    /// Any other device: one call per attention, nothing split.
    Neutral { major: i32, minor: i32, sms: usize },
}

impl WaveShaping {
    /// The shaping for a device of compute capability `major`.`minor` with `sms` SMs (as the
    /// driver reports them; a negative count is taken as none).
    pub(crate) fn of(major: i32, minor: i32, sms: i32) -> Self {
        let sms = usize::try_from(sms).unwrap_or(0);
        match (major, minor) {
            (9, 0) => WaveShaping::Sm90 { sms },
            _ => WaveShaping::Neutral { major, minor, sms },
        }
    }

    /// Thread blocks of one wave at hd = 128, where the shaping splits; `None` where it does not.
    fn blocks_per_wave(self) -> Option<usize> {
        match self {
            WaveShaping::Sm90 { sms } => Some(sms * BLOCKS_PER_SM).filter(|&n| n > 0),
            WaveShaping::Neutral { .. } => None,
        }
    }

    /// What a run's records say of it, after the attention kernel's name.
    pub(crate) fn describe(self) -> String {
        match self {
            WaveShaping::Sm90 { sms } => format!(
                "last wave split over the keys (tuned for sm_90: {TILE_ROWS}-row tiles, \
                 {BLOCKS_PER_SM} blocks per SM, {sms} SMs)"
            ),
            WaveShaping::Neutral { major, minor, sms } => format!(
                "one call per attention (sm_{major}{minor}, {sms} SMs: the wave shaping is tuned \
                 for sm_90 alone)"
            ),
        }
    }
}

/// The wave shaping of every device this process made a cuDNN attention kernel on, each once,
/// in the order first made: what the run's records say was used ([`wave_shaping_used`]).
static SHAPINGS_USED: Mutex<Vec<WaveShaping>> = Mutex::new(Vec::new());

/// The wave shaping of the cuDNN attention kernels this process has made, for a run's records:
/// `None` before any was made (the CPU, ONNX Runtime's attention, the 8-bit attention).
pub(crate) fn wave_shaping_used() -> Option<String> {
    let used = SHAPINGS_USED.lock().unwrap_or_else(PoisonError::into_inner);
    describe_shapings(&used)
}

/// `used`, described and joined (a process whose GPUs differ has one per kind).
pub(crate) fn describe_shapings(used: &[WaveShaping]) -> Option<String> {
    let described: Vec<String> = used.iter().map(|s| s.describe()).collect();
    (!described.is_empty()).then(|| described.join("; "))
}

/// The split of a call of `batch` × `rows` query rows of `heads` heads over `keys` keys on a
/// device of wave shaping `shaping` (only [`WaveShaping::Sm90`] splits). The rows of the full
/// waves run as one call; the remaining rows run over p runs of the keys (2 ≤ p ≤ `max_parts`,
/// p dividing the keys, each run a tile of keys or more): p times the tail's thread blocks, each
/// 1/p as long, in ⌈p · blocks / wave⌉ waves, so the tail takes ⌈p · blocks / wave⌉ / p of a
/// full wave's time. The p that takes least (the fewest runs among equals) when that is under
/// [`MAX_TAIL_WAVES`]; otherwise one call.
pub(crate) fn split(
    batch: usize,
    rows: usize,
    keys: usize,
    heads: usize,
    shaping: WaveShaping,
    max_parts: usize,
) -> Split {
    let whole = Split {
        main_rows: rows,
        parts: 1,
    };
    let Some(per_wave) = shaping.blocks_per_wave() else {
        return whole;
    };
    if batch != 1 || heads == 0 {
        return whole;
    }
    let blocks = rows.div_ceil(TILE_ROWS) * heads;
    let full_waves = blocks / per_wave;
    if full_waves == 0 || blocks.is_multiple_of(per_wave) {
        return whole;
    }
    let main_rows = full_waves * per_wave / heads * TILE_ROWS;
    if main_rows == 0 || main_rows >= rows {
        return whole;
    }
    let tail_blocks = (rows - main_rows).div_ceil(TILE_ROWS) * heads;
    let waves = |p: usize| (p * tail_blocks).div_ceil(per_wave) as f64 / p as f64;
    let best = (2..=max_parts.min(MAX_PARTS))
        .filter(|&p| keys.is_multiple_of(p) && keys / p >= TILE_ROWS)
        .fold(None, |best: Option<usize>, p| match best {
            Some(b) if waves(b) <= waves(p) => Some(b),
            _ => Some(p),
        });
    match best {
        Some(parts) if waves(parts) < MAX_TAIL_WAVES => Split { main_rows, parts },
        _ => whole,
    }
}

/// One cuDNN SDPA forward call, ready to execute: its execution plan (and what it was built
/// from) and the bytes of workspace it needs.
struct Sdpa {
    plan: Desc,
    workspace: usize,
    with_stats: bool,
    /// The descriptors the plan was built from, kept alive with it.
    _parts: Vec<Desc>,
}

/// Q `[b, h, s, hd]` at `q_strides`, K and V `[b, h, l, hd]` at `kv_strides`, O at `o_strides`,
/// and with `stats` the log-sum-exp `[b, h, s, 1]` (float32, packed).
#[derive(Debug)]
struct SdpaShape {
    dims_q: [i64; 4],
    q_strides: [i64; 4],
    dims_kv: [i64; 4],
    kv_strides: [i64; 4],
    o_strides: [i64; 4],
    stats: bool,
}

/// The file under the kernel cache folder that keeps the plan of `shape` on a device of `kind`
/// (`sm90-132sms-cudnn91900`): named by a hash of the shape's sizes and strides.
fn plan_file(cache_dir: &Path, kind: &str, shape: &SdpaShape) -> PathBuf {
    let key = crate::engine::bundle::sha256_hex(format!("{shape:?}").as_bytes());
    cache_dir
        .join("cudnn_attention")
        .join(format!("{kind}-sdpa-{}.json", &key[..16]))
}

impl Sdpa {
    /// The plan of `shape`: the one kept in `kept` (a file of [`plan_file`]) when it restores on
    /// this handle, else built from cuDNN's heuristics and, when cuDNN can serialise it, kept
    /// there for the next process.
    fn get(
        handle: dnn::cudnnHandle_t,
        shape: &SdpaShape,
        kept: Option<&Path>,
    ) -> Result<Self, AttentionError> {
        let restored = kept
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|json| deserialize_plan(handle, &json).ok());
        if let Some((plan, workspace)) = restored {
            return Ok(Self {
                plan,
                workspace,
                with_stats: shape.stats,
                _parts: Vec::new(),
            });
        }
        let built = Self::build(handle, shape)?;
        if let Some(file) = kept {
            match serialize_plan(&built.plan) {
                Ok(json) => super::keep(file, &json, "builds the attention's plans"),
                Err(e) => {
                    static WARNED: std::sync::Once = std::sync::Once::new();
                    WARNED.call_once(|| {
                        eprintln!(
                            "note: {DOMAIN} Attention: cuDNN cannot serialise its attention plans \
                             ({e}); every process builds them again"
                        )
                    });
                }
            }
        }
        Ok(built)
    }

    fn build(handle: dnn::cudnnHandle_t, shape: &SdpaShape) -> Result<Self, AttentionError> {
        use dnn::cudnnDataType_t::{CUDNN_DATA_FLOAT as F32, CUDNN_DATA_HALF as F16};
        let q = Desc::tensor(UID_Q, F16, &shape.dims_q, &shape.q_strides, false)?;
        let k = Desc::tensor(UID_K, F16, &shape.dims_kv, &shape.kv_strides, false)?;
        let v = Desc::tensor(UID_V, F16, &shape.dims_kv, &shape.kv_strides, false)?;
        let o = Desc::tensor(UID_O, F16, &shape.dims_q, &shape.o_strides, false)?;
        let scale = Desc::tensor(UID_SCALE, F32, &[1; 4], &[1; 4], true)?;
        let [b, h, s, _] = shape.dims_q;
        let stats = if shape.stats {
            Some(Desc::tensor(
                UID_STATS,
                F32,
                &[b, h, s, 1],
                &[h * s, s, 1, 1],
                false,
            )?)
        } else {
            None
        };
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR)?;
        op.set_desc(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, &q)?;
        op.set_desc(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, &k)?;
        op.set_desc(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, &v)?;
        op.set_desc(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, &o)?;
        if let Some(stats) = &stats {
            op.set_desc(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, stats)?;
        }
        op.set_desc(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, &scale)?;
        let op = op.finalize("SDPA forward operation")?;
        let graph = Desc::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
        graph.set_handle(Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle)?;
        graph.set_desc(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, &op)?;
        let graph = graph.finalize("operation graph")?;
        let (heur, configs) =
            engine_configs(&graph, dnn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A)?;
        let got = configs.len();
        let mut reasons = Vec::new();
        for config in configs {
            match execution_plan(handle, &config) {
                Ok((plan, workspace)) => {
                    let mut parts = vec![q, k, v, o, scale, op, graph, heur, config];
                    parts.extend(stats);
                    return Ok(Self {
                        plan,
                        workspace,
                        with_stats: shape.stats,
                        _parts: parts,
                    });
                }
                Err(e) => reasons.push(e),
            }
        }
        Err(AttentionError::NoEngine {
            dims_q: shape.dims_q,
            dims_kv: shape.dims_kv,
            tried: got,
            reasons,
        })
    }

    /// Queues the call on the handle's stream: `[q, k, v, o, stats]` device addresses (stats
    /// unused without them), its workspace, and the scores' scale.
    fn execute(
        &self,
        handle: dnn::cudnnHandle_t,
        [q, k, v, o, stats]: [u64; 5],
        workspace: u64,
        scale: &f32,
    ) -> Result<(), CudnnError> {
        let mut uids = vec![UID_Q, UID_K, UID_V, UID_O, UID_SCALE];
        let mut pointers: Vec<*mut c_void> = vec![
            q as _,
            k as _,
            v as _,
            o as _,
            (scale as *const f32).cast_mut().cast(),
        ];
        if self.with_stats {
            uids.push(UID_STATS);
            pointers.push(stats as _);
        }
        // SAFETY: one device pointer per id (the scale a host pointer, as a by-value tensor's
        // is) holding the plan's tensors, and a workspace of the plan's bytes (the caller's).
        unsafe { execute_plan(handle, &self.plan, &uids, &pointers, workspace) }
    }
}

/// The plans of every call shape prepared in this process, with the handle (device and stream)
/// they were made on: the attentions of the DiT's 30 layers make the same calls, so each shape's
/// plans are built once for all of them.
static PREPARED: Mutex<Vec<(usize, Arc<Prepared>)>> = Mutex::new(Vec::new());

/// The cuDNN calls of one call shape.
struct Prepared {
    /// (B, S, L, D).
    key: (usize, usize, usize, usize),
    split: Split,
    main: Sdpa,
    tail: Option<Sdpa>,
    /// Scratch bytes: the workspace, then the tail's runs (half floats), then their log-sum-exps.
    scratch_bytes: usize,
    runs_offset: usize,
    stats_offset: usize,
}

/// An `Attention` node's CUDA kernel.
pub(crate) struct AttentionKernel {
    ordinal: i32,
    context: Handle<sys::CUcontext>,
    /// How calls fit this device's waves ([`WaveShaping::of`] its compute capability).
    shaping: WaveShaping,
    merge: Handle<sys::CUfunction>,
    /// The GPU kind and cuDNN version, for the names of kept plans.
    kind: String,
    /// The call shapes this node has run, from [`PREPARED`].
    prepared: Vec<Arc<Prepared>>,
    /// Whether a partial last wave is split ([`split`]); off only to measure against.
    pub(crate) split_enabled: bool,
    /// The 8-bit attention, which runs every call instead of cuDNN's when the process's
    /// `attention_precision` is int8 ([`super::KernelSettings`]).
    int8: Option<Attention8>,
    /// The most runs of the keys a split may use ([`MAX_PARTS`]; fewer only to measure against).
    pub(crate) max_parts: usize,
}

impl AttentionKernel {
    /// The kernel of element type `ty` on device `ordinal`: float16 only; in 8 bits when the
    /// process's kernels are set so.
    pub(crate) fn new(ty: TensorElementType, ordinal: i32) -> Result<Self, AttentionError> {
        if ty != TensorElementType::Float16 {
            return Err(AttentionError::ElementType(ty));
        }
        let int8 = match super::settings().attention_precision {
            AttentionPrecision::Int8 => Some(Attention8::new(ordinal)?),
            AttentionPrecision::Fp16 => None,
        };
        check_cudnn()?;
        let context = primary_context(ordinal)?;
        let (module_context, merge) = device_function(ordinal, "unstep_attention_merge_f16")?;
        debug_assert_eq!(module_context.0, context.0);
        let info = device_info(ordinal)?;
        let shaping = WaveShaping::of(info.major, info.minor, info.sms);
        // The 8-bit attention runs every call of this kernel: no cuDNN call is shaped.
        if int8.is_none() {
            let mut used = SHAPINGS_USED.lock().unwrap_or_else(PoisonError::into_inner);
            if !used.contains(&shaping) {
                used.push(shaping);
            }
        }
        Ok(Self {
            ordinal,
            context,
            shaping,
            merge,
            kind: device_kind(ordinal)?,
            prepared: Vec::new(),
            split_enabled: true,
            max_parts: MAX_PARTS,
            int8,
        })
    }

    /// The split this kernel uses for a call of these sizes.
    pub(crate) fn split_of(&self, sizes: &AttentionSizes) -> Split {
        let heads = sizes.d / (2 * sizes.half_hd);
        // The tile and occupancy of `split` are those of hd = 128 on sm_90.
        if !self.split_enabled || 2 * sizes.half_hd != 128 {
            return Split {
                main_rows: sizes.block_rows,
                parts: 1,
            };
        }
        split(
            sizes.rows / sizes.block_rows,
            sizes.block_rows,
            sizes.cache_rows,
            heads,
            self.shaping,
            self.max_parts,
        )
    }

    /// Queues `O = attention(Q, K, V)` on `stream` over `pointers` (Q, K, V, O: device addresses
    /// of this device) with `sizes` (checked against the contract).
    pub(crate) fn launch_attention(
        &mut self,
        sizes: &AttentionSizes,
        pointers: &[u64],
        stream: sys::CUstream,
    ) -> Result<(), AttentionError> {
        let [q, k, v, o] = pointers[..] else {
            return Err(AttentionError::Pointers(pointers.len()));
        };
        if sizes.rows == 0 {
            return Ok(());
        }
        check_aligned(&[("Q", q), ("K", k), ("V", v), ("O", o)])?;
        if let Some(int8) = &self.int8 {
            return int8.launch(sizes, [q, k, v, o], stream);
        }
        let hd = 2 * sizes.half_hd;
        if !hd.is_multiple_of(8) || hd > 256 {
            return Err(AttentionError::HeadSize(hd));
        }
        let _current = CurrentContext::push(self.context)?;
        let handle = handle(self.ordinal, stream)?;
        let (s, l, d) = (sizes.block_rows, sizes.cache_rows, sizes.d);
        let key = (sizes.rows / s, s, l, d);
        let split = self.split_of(sizes);
        let index = match self
            .prepared
            .iter()
            .position(|p| p.key == key && p.split == split)
        {
            Some(index) => index,
            None => {
                let prepared = self.shared(handle.0, sizes, split)?;
                self.prepared.push(prepared);
                self.prepared.len() - 1
            }
        };
        let prepared = &self.prepared[index];
        let scratch = scratch(self.ordinal, stream, prepared.scratch_bytes)?;
        let scale = 1.0 / (hd as f32).sqrt();
        prepared
            .main
            .execute(handle.0, [q, k, v, o, 0], scratch, &scale)?;
        let Some(tail) = &prepared.tail else {
            return Ok(());
        };
        let split = prepared.split;
        let runs = scratch + prepared.runs_offset as u64;
        let stats = scratch + prepared.stats_offset as u64;
        let tail_q = q + (split.main_rows * d * 2) as u64;
        tail.execute(handle.0, [tail_q, k, v, runs, stats], scratch, &scale)?;
        // The merge kernel's arguments, in the order of its signature in kernels.cu.
        let tail_rows = s - split.main_rows;
        let (mut runs, mut stats, mut out) = (runs, stats, o + (split.main_rows * d * 2) as u64);
        let (mut parts, mut rows) = (split.parts as i32, tail_rows as i64);
        let (mut heads, mut head_size) = ((d / hd) as i32, hd as i32);
        let warps = tail_rows * d / hd;
        let blocks = warps.div_ceil((MERGE_THREADS / 32) as usize) as u32;
        let mut params: Vec<*mut c_void> = vec![
            (&mut runs as *mut u64).cast(),
            (&mut stats as *mut u64).cast(),
            (&mut out as *mut u64).cast(),
            (&mut parts as *mut i32).cast(),
            (&mut rows as *mut i64).cast(),
            (&mut heads as *mut i32).cast(),
            (&mut head_size as *mut i32).cast(),
        ];
        // SAFETY: the merge kernel of kernels.cu, loaded into the current context; one value per
        // parameter, of its type; the runs and log-sum-exps were written by the tail call on the
        // same stream, and O's last rows are the output's.
        unsafe {
            driver::launch_kernel(
                self.merge.0,
                (blocks, 1, 1),
                (MERGE_THREADS, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .map_err(AttentionError::Merge)
    }

    /// The plans of a call of these sizes on `handle`, split as `split`: the ones another node
    /// of the process prepared, or prepared now (built, or restored from the kernel cache
    /// folder) and shared.
    fn shared(
        &self,
        handle: dnn::cudnnHandle_t,
        sizes: &AttentionSizes,
        split: Split,
    ) -> Result<Arc<Prepared>, AttentionError> {
        let mut all = PREPARED.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (
            sizes.rows / sizes.block_rows,
            sizes.block_rows,
            sizes.cache_rows,
            sizes.d,
        );
        if let Some((_, prepared)) = all
            .iter()
            .find(|(h, p)| *h == handle as usize && p.key == key && p.split == split)
        {
            return Ok(Arc::clone(prepared));
        }
        let prepared = Arc::new(one_time::timed(Work::AttentionPlans, || {
            self.prepare(handle, sizes, split)
        })?);
        all.push((handle as usize, Arc::clone(&prepared)));
        Ok(prepared)
    }

    /// The cuDNN plans of a call of these sizes, split as `split`.
    fn prepare(
        &self,
        handle: dnn::cudnnHandle_t,
        sizes: &AttentionSizes,
        split: Split,
    ) -> Result<Prepared, AttentionError> {
        let (s, l, d) = (sizes.block_rows, sizes.cache_rows, sizes.d);
        let batch = sizes.rows / s;
        let hd = 2 * sizes.half_hd;
        let heads = d / hd;
        let (b, h, s64, l64, d64, hd64) = (
            batch as i64,
            heads as i64,
            s as i64,
            l as i64,
            d as i64,
            hd as i64,
        );
        let cache_dir = super::settings().cache_dir;
        let kept = |shape: &SdpaShape| {
            cache_dir
                .as_deref()
                .map(|dir| plan_file(dir, &self.kind, shape))
        };
        // BSHD rows: head h of row r at r·D + h·hd.
        let main_shape = SdpaShape {
            dims_q: [b, h, split.main_rows as i64, hd64],
            q_strides: [s64 * d64, hd64, d64, 1],
            dims_kv: [b, h, l64, hd64],
            kv_strides: [l64 * d64, hd64, d64, 1],
            o_strides: [s64 * d64, hd64, d64, 1],
            stats: false,
        };
        let main = Sdpa::get(handle, &main_shape, kept(&main_shape).as_deref())
            .map_err(|e| AttentionError::FullWaves(Box::new(e)))?;
        let align = |n: usize| n.div_ceil(256) * 256;
        if split.parts == 1 {
            return Ok(Prepared {
                key: (batch, s, l, d),
                split,
                scratch_bytes: main.workspace,
                runs_offset: 0,
                stats_offset: 0,
                main,
                tail: None,
            });
        }
        let (parts, tail_rows) = (split.parts as i64, (s - split.main_rows) as i64);
        let run_keys = l64 / parts;
        let tail_shape = SdpaShape {
            dims_q: [parts, h, tail_rows, hd64],
            // The same rows for every run of the keys.
            q_strides: [0, hd64, d64, 1],
            dims_kv: [parts, h, run_keys, hd64],
            kv_strides: [run_keys * d64, hd64, d64, 1],
            o_strides: [tail_rows * d64, hd64, d64, 1],
            stats: true,
        };
        let tail = Sdpa::get(handle, &tail_shape, kept(&tail_shape).as_deref()).map_err(|e| {
            AttentionError::LastRows {
                parts,
                source: Box::new(e),
            }
        })?;
        let runs_offset = align(main.workspace.max(tail.workspace));
        let stats_offset = runs_offset + align(split.parts * (s - split.main_rows) * d * 2);
        let scratch_bytes = stats_offset + split.parts * heads * (s - split.main_rows) * 4;
        Ok(Prepared {
            key: (batch, s, l, d),
            split,
            main,
            tail: Some(tail),
            scratch_bytes,
            runs_offset,
            stats_offset,
        })
    }
}

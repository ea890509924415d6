//! `Attention` in its 8-bit mode on CUDA (`method.attention_precision = "int8"`): the host side of
//! `attention8.cu`, whose header says what each of its kernels does.
//!
//! - Hopper only (compute capability 9.0): the attention is built on wgmma and the bulk tensor
//!   copy engine (`sm_90a`); another GPU is an error when the kernel is created. Head size 128
//!   (wan-1.3b's), float16 tensors.
//! - A call quantises Q, K and V into scratch of the runner's own (one buffer per device and
//!   stream, kept for the process, as cuDNN's workspace is, so that a captured CUDA graph keeps
//!   pointing at it), then runs the attention over it. The tensor maps of the bulk copies are
//!   encoded on the host at every call (no device work) and passed by value, so a captured call
//!   carries its own.
//! - Nothing is chosen or compiled per call shape: the module is compiled once per device (kept
//!   in the kernel cache folder's `nvrtc/` like `kernels.cu`'s).

use std::ffi::c_void;

use cudarc::driver::{result as driver, sys};

use super::attention_call::{AttentionError, AttentionSizes};
use super::cuda::{
    CurrentContext, Handle, KernelSource, device_info, primary_context, source_function,
};
use super::cudnn::scratch;

/// The CUDA C source of the 8-bit attention.
pub(crate) const SOURCE: &str = include_str!("attention8.cu");

/// The entry points of `attention8.cu`, in the order the kernel keeps them.
pub(crate) const ENTRY_POINTS: [&str; 6] = [
    "unstep_att8_stats_f16",
    "unstep_att8_stats_reduce",
    "unstep_att8_quant_q_f16",
    "unstep_att8_quant_k_f16",
    "unstep_att8_quant_v_f16",
    "unstep_att8_fwd",
];

/// `attention8.cu`: the 8-bit attention, for Hopper's `sm_90a` (wgmma and bulk tensor copies),
/// whatever the device (attention8.rs refuses other devices before asking for it).
pub(crate) static ATTENTION8: KernelSource = KernelSource {
    file: "attention8.cu",
    compiling: "compile attention8.cu",
    text: SOURCE,
    arch: |_, _| "sm_90a".to_string(),
    entry_points: || ENTRY_POINTS.iter().map(|name| name.to_string()).collect(),
};

/// The head size the kernels take (`HD` of attention8.cu).
pub(crate) const HEAD_SIZE: usize = 128;
/// Keys per tile of the attention kernel (`KEY_TILE`); L is padded to a multiple of it.
pub(crate) const KEY_TILE: usize = 128;
/// Query rows per thread block of the attention kernel (2 warpgroups of 64); S is padded to a
/// multiple of it.
pub(crate) const ROW_TILE: usize = 128;
/// Query rows per scale of Q (`Q_GROUP`).
pub(crate) const Q_GROUP: usize = 16;
/// Keys per scale of K (`K_GROUP`).
pub(crate) const K_GROUP: usize = 64;
/// Rows of Q, K or V per block of the quantising kernels (`QUANT_ROWS`).
const QUANT_ROWS: usize = 64;
/// Threads per block of the statistics and quantising kernels.
const THREADS: u32 = 256;
/// Threads per block of the attention: two consumer warpgroups and the producer's.
const FWD_THREADS: u32 = 384;
/// Slots of K and Vᵀ tiles in shared memory (`ATT_STAGES`).
const STAGES: usize = 4;
/// The attention's dynamic shared memory: alignment slack, Q's two 64-row tiles, the K and Vᵀ
/// slots and the mbarriers.
const FWD_SMEM: usize = 1024 + 2 * 64 * HEAD_SIZE + STAGES * 2 * KEY_TILE * HEAD_SIZE + 8 * 9;
// The attention's shared memory fits a Hopper SM's 227 KiB.
const _: () = assert!(FWD_SMEM <= 227 * 1024);

/// The most splits of the keys the statistics kernel runs over (blocks per head).
const MAX_SPLITS: usize = 64;

/// Where a call's quantised tensors lie in its scratch (byte offsets), and the padded sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    splits: usize,
    rows_per_split: usize,
    spad: usize,
    lpad: usize,
    ksum: usize,
    vmax: usize,
    kmean: usize,
    vscale: usize,
    qq: usize,
    qscale: usize,
    kq: usize,
    kscale: usize,
    vt: usize,
    bytes: usize,
}

impl Layout {
    /// The layout of a call of `batch` entries of S query rows over L keys, D = heads · 128.
    fn of(batch: usize, s: usize, l: usize, d: usize) -> Layout {
        let bh = batch * d / HEAD_SIZE;
        let spad = s.div_ceil(ROW_TILE) * ROW_TILE;
        let lpad = l.div_ceil(KEY_TILE) * KEY_TILE;
        // About 512 keys a split, each a multiple of 16 keys (the statistics kernel's rows).
        let splits = l.div_ceil(512).clamp(1, MAX_SPLITS);
        let rows_per_split = l.div_ceil(splits).div_ceil(16) * 16;
        let mut at = 0;
        let mut take = |bytes: usize| {
            let offset = at;
            at = (at + bytes).div_ceil(256) * 256;
            offset
        };
        let ksum = take(batch * splits * d * 4);
        let vmax = take(batch * splits * d * 4);
        let kmean = take(batch * d * 4);
        let vscale = take(batch * d * 4);
        let qq = take(bh * spad * HEAD_SIZE);
        let qscale = take(bh * (spad / Q_GROUP) * 4);
        let kq = take(bh * lpad * HEAD_SIZE);
        let kscale = take(bh * (lpad / K_GROUP) * 4);
        let vt = take(bh * HEAD_SIZE * lpad);
        Layout {
            splits,
            rows_per_split,
            spad,
            lpad,
            ksum,
            vmax,
            kmean,
            vscale,
            qq,
            qscale,
            kq,
            kscale,
            vt,
            bytes: at,
        }
    }
}

/// The 8-bit attention's kernels on one device.
pub(crate) struct Attention8 {
    ordinal: i32,
    context: Handle<sys::CUcontext>,
    /// The functions of [`ENTRY_POINTS`], in its order.
    functions: Vec<Handle<sys::CUfunction>>,
}

impl Attention8 {
    /// The kernels on device `ordinal`, which must be a Hopper GPU.
    pub(crate) fn new(ordinal: i32) -> Result<Self, AttentionError> {
        let info = device_info(ordinal)?;
        if (info.major, info.minor) != (9, 0) {
            return Err(AttentionError::Int8Device {
                major: info.major,
                minor: info.minor,
            });
        }
        let context = primary_context(ordinal)?;
        let mut functions = Vec::new();
        for name in ENTRY_POINTS {
            let (module_context, function) = source_function(&ATTENTION8, ordinal, name)?;
            debug_assert_eq!(module_context.0, context.0);
            functions.push(function);
        }
        let fwd = functions[5].0;
        // SAFETY: a function of the loaded module; the attribute is a plain integer.
        unsafe {
            sys::cuFuncSetAttribute(
                fwd,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                FWD_SMEM as i32,
            )
        }
        .result()
        .map_err(|source| AttentionError::Int8Launch {
            kernel: "cuFuncSetAttribute (unstep_att8_fwd's shared memory)",
            source,
        })?;
        Ok(Self {
            ordinal,
            context,
            functions,
        })
    }

    /// Queues `O = attention(Q, K, V)` in 8 bits on `stream` (device addresses of float16
    /// tensors, checked by the caller against the contract and for alignment).
    pub(crate) fn launch(
        &self,
        sizes: &AttentionSizes,
        [q, k, v, o]: [u64; 4],
        stream: sys::CUstream,
    ) -> Result<(), AttentionError> {
        let hd = 2 * sizes.half_hd;
        if hd != HEAD_SIZE {
            return Err(AttentionError::Int8HeadSize(hd));
        }
        let (s, l, d) = (sizes.block_rows, sizes.cache_rows, sizes.d);
        let batch = sizes.rows / s;
        let heads = d / HEAD_SIZE;
        let layout = Layout::of(batch, s, l, d);
        let _current = CurrentContext::push(self.context)?;
        let base = scratch(self.ordinal, stream, layout.bytes)?;
        let at = |offset: usize| base + offset as u64;
        let (ksum, vmax, kmean, vscale) = (
            at(layout.ksum),
            at(layout.vmax),
            at(layout.kmean),
            at(layout.vscale),
        );
        let (qq, qscale, kq, kscale, vt) = (
            at(layout.qq),
            at(layout.qscale),
            at(layout.kq),
            at(layout.kscale),
            at(layout.vt),
        );
        let (l_i, d_i, s_i) = (l as i32, d as i32, s as i32);
        let (spad_i, lpad_i) = (layout.spad as i32, layout.lpad as i32);
        let (kv_stride, q_stride) = ((l * d) as i64, (s * d) as i64);
        let (b, h) = (batch as u32, heads as u32);

        let mut a = Args::default();
        a.ptr(k)
            .ptr(v)
            .ptr(ksum)
            .ptr(vmax)
            .int(l_i)
            .int(d_i)
            .long(kv_stride);
        a.int(layout.rows_per_split as i32);
        self.run(0, (h, layout.splits as u32, b), THREADS, 0, stream, a)?;

        let mut a = Args::default();
        a.ptr(ksum)
            .ptr(vmax)
            .ptr(kmean)
            .ptr(vscale)
            .int(layout.splits as i32)
            .int(l_i);
        a.int(d_i).int(batch as i32);
        let blocks = (batch * d).div_ceil(THREADS as usize) as u32;
        self.run(1, (blocks, 1, 1), THREADS, 0, stream, a)?;

        let mut a = Args::default();
        a.ptr(q)
            .ptr(qq)
            .ptr(qscale)
            .int(s_i)
            .int(spad_i)
            .int(d_i)
            .long(q_stride);
        self.run(
            2,
            ((layout.spad / QUANT_ROWS) as u32, h, b),
            THREADS,
            0,
            stream,
            a,
        )?;

        let quant_blocks = (layout.lpad / QUANT_ROWS) as u32;
        let mut a = Args::default();
        a.ptr(k)
            .ptr(kmean)
            .ptr(kq)
            .ptr(kscale)
            .int(l_i)
            .int(lpad_i)
            .int(d_i);
        a.long(kv_stride);
        self.run(3, (quant_blocks, h, b), THREADS, 0, stream, a)?;

        let mut a = Args::default();
        a.ptr(v)
            .ptr(vscale)
            .ptr(vt)
            .int(l_i)
            .int(lpad_i)
            .int(d_i)
            .long(kv_stride);
        self.run(4, (quant_blocks, h, b), THREADS, 0, stream, a)?;

        let bh = (batch * heads) as u64;
        let (spad, lpad) = (layout.spad as u64, layout.lpad as u64);
        let rows = HEAD_SIZE as u64;
        let map_q = tensor_map(qq, rows, bh * spad, rows, 64)?;
        let map_k = tensor_map(kq, rows, bh * lpad, rows, KEY_TILE as u32)?;
        let map_v = tensor_map(vt, lpad, bh * rows, lpad, HEAD_SIZE as u32)?;
        let qk_log2 = std::f32::consts::LOG2_E / (HEAD_SIZE as f32).sqrt();
        let mut a = Args::default();
        a.map(map_q).map(map_k).map(map_v);
        a.ptr(qscale).ptr(kscale).ptr(vscale).ptr(o);
        a.int(s_i)
            .int(spad_i)
            .int(l_i)
            .int(lpad_i)
            .int(d_i)
            .long(q_stride);
        a.float(qk_log2);
        let grid = ((layout.spad / ROW_TILE) as u32, h, b);
        self.run(5, grid, FWD_THREADS, FWD_SMEM as u32, stream, a)
    }

    /// Launches function `index` of [`ENTRY_POINTS`] with `args`.
    fn run(
        &self,
        index: usize,
        grid: (u32, u32, u32),
        threads: u32,
        shared: u32,
        stream: sys::CUstream,
        mut args: Args,
    ) -> Result<(), AttentionError> {
        let mut params = args.params();
        // SAFETY: a function of attention8.cu loaded into the current context; `params` holds one
        // value per parameter of its signature, of its type, in its order (the calls above
        // follow the signatures in attention8.cu); every pointer addresses device memory of the
        // sizes the layout gives, on this stream.
        unsafe {
            driver::launch_kernel(
                self.functions[index].0,
                grid,
                (threads, 1, 1),
                shared,
                stream,
                &mut params,
            )
        }
        .map_err(|source| AttentionError::Int8Launch {
            kernel: ENTRY_POINTS[index],
            source,
        })
    }
}

/// A kernel's arguments, kept where `params` points until the launch.
#[derive(Default)]
struct Args {
    values: Vec<Value>,
}

/// One argument's value.
enum Value {
    U64(u64),
    I32(i32),
    I64(i64),
    F32(f32),
    Map(Box<sys::CUtensorMap>),
}

impl Args {
    fn ptr(&mut self, p: u64) -> &mut Self {
        self.values.push(Value::U64(p));
        self
    }
    fn int(&mut self, v: i32) -> &mut Self {
        self.values.push(Value::I32(v));
        self
    }
    fn long(&mut self, v: i64) -> &mut Self {
        self.values.push(Value::I64(v));
        self
    }
    fn float(&mut self, v: f32) -> &mut Self {
        self.values.push(Value::F32(v));
        self
    }
    fn map(&mut self, m: sys::CUtensorMap) -> &mut Self {
        self.values.push(Value::Map(Box::new(m)));
        self
    }

    /// A pointer to each value, as cuLaunchKernel takes them.
    fn params(&mut self) -> Vec<*mut c_void> {
        self.values
            .iter_mut()
            .map(|v| match v {
                Value::U64(x) => (x as *mut u64).cast(),
                Value::I32(x) => (x as *mut i32).cast(),
                Value::I64(x) => (x as *mut i64).cast(),
                Value::F32(x) => (x as *mut f32).cast(),
                Value::Map(x) => (&mut **x as *mut sys::CUtensorMap).cast(),
            })
            .collect()
    }
}

/// The tensor map of a 2-D uint8 tensor at `ptr` of `outer` rows of `inner` bytes (row stride
/// `stride` bytes), copied in boxes of `box_rows` rows × 128 bytes in the 128-byte swizzle.
fn tensor_map(
    ptr: u64,
    inner: u64,
    outer: u64,
    stride: u64,
    box_rows: u32,
) -> Result<sys::CUtensorMap, AttentionError> {
    use sys::{
        CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8 as UINT8,
        CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE as NO_FILL,
        CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE as NO_INTERLEAVE,
        CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B as L2_128B,
        CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B as SWIZZLE_128B,
    };
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let dims = [inner, outer];
    let strides = [stride];
    let boxes = [128u32, box_rows];
    let steps = [1u32, 1];
    // SAFETY: every array has the rank's (2) entries (strides one fewer); `ptr` is a device
    // address of `outer` rows of `stride` bytes (256-byte aligned, strides multiples of 16).
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            UINT8,
            2,
            ptr as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            NO_INTERLEAVE,
            SWIZZLE_128B,
            L2_128B,
            NO_FILL,
        )
    }
    .result()
    .map_err(AttentionError::TensorMap)?;
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout pads S and L to whole tiles, keeps every buffer 256-byte aligned and apart,
    /// and cuts the keys into splits of whole 16-key steps that cover them.
    #[test]
    fn the_layout_pads_aligns_and_covers() {
        for (batch, s, l) in [(1, 4680, 4680), (1, 4680, 32760), (2, 130, 257), (1, 1, 1)] {
            let d = 2 * HEAD_SIZE;
            let t = Layout::of(batch, s, l, d);
            assert!(t.spad >= s && t.spad.is_multiple_of(ROW_TILE) && t.spad - s < ROW_TILE);
            assert!(t.lpad >= l && t.lpad.is_multiple_of(KEY_TILE) && t.lpad - l < KEY_TILE);
            assert!(t.rows_per_split.is_multiple_of(16) && t.splits * t.rows_per_split >= l);
            assert!(t.splits <= MAX_SPLITS);
            let bh = batch * 2;
            let buffers = [
                (t.ksum, batch * t.splits * d * 4),
                (t.vmax, batch * t.splits * d * 4),
                (t.kmean, batch * d * 4),
                (t.vscale, batch * d * 4),
                (t.qq, bh * t.spad * HEAD_SIZE),
                (t.qscale, bh * t.spad / Q_GROUP * 4),
                (t.kq, bh * t.lpad * HEAD_SIZE),
                (t.kscale, bh * t.lpad / K_GROUP * 4),
                (t.vt, bh * HEAD_SIZE * t.lpad),
            ];
            for pair in buffers.windows(2) {
                let ((a, size), (b, _)) = (pair[0], pair[1]);
                assert!(a % 256 == 0 && a + size <= b, "{t:?}");
            }
            let (last, size) = buffers[buffers.len() - 1];
            assert!(last + size <= t.bytes);
        }
    }
}

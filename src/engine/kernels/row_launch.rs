//! The launch of the row operators' kernels of `kernels.cu` ([`RowKernel`]): the row layouts, the
//! choice among them, and the kernel arguments each operator adds ([`RowOp`]).
//!
//! - Each operator and element type has three kernels, one per row layout ([`Layout`]); each
//!   launch picks one from D and the tensors' alignment: a group of up to 32 threads per row,
//!   with up to four 16-byte accesses each, for D ≤ [`GROUP_MAX_D`] (the VAE's channels-last
//!   rows, D = 96 to 384, a million rows and more), otherwise one block of [`THREADS`] threads
//!   per row with 4-element accesses (the DiT's D = 1536) or pairs. The elementwise `BiasGelu`
//!   takes only a layout's access width ([`Layout::choose_elementwise`]), over a grid-stride loop.

//! - Each launch reads the device pointers of the call's inputs and outputs and launches one
//!   kernel on ONNX Runtime's stream with `cuLaunchKernel` (`PrefixBiasRmsNorm` too: its kernel
//!   copies the prefix rows and writes the tail beside the normalised rows). Nothing
//!   synchronises: ONNX Runtime orders the stream.

use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::{result as driver, sys};
use ort::value::TensorElementType;

use super::DOMAIN;
use super::cuda::{CudaError, CurrentContext, Handle, device_function};
use super::operator::{CudaKernel, UnstepOp, elem_bytes};

/// `WARP` of `kernels.cu`.
const WARP: u32 = 32;
/// `THREADS` of `kernels.cu`: the block layout's threads per row (one block per row).
pub(crate) const THREADS: u32 = 128;
/// `GROUP_THREADS` of `kernels.cu`: the group layout's threads per block.
pub(crate) const GROUP_THREADS: u32 = 256;
/// `ROW_FLOATS` of `kernels.cu`: the floats of its row a thread holds at most.
pub(crate) const ROW_FLOATS: usize = 16;
/// The largest D the kernels keep in registers (the block layout's).
pub(crate) const MAX_D: usize = THREADS as usize * ROW_FLOATS;
/// The largest D of the group layout (a group is at most one warp).
pub(crate) const GROUP_MAX_D: usize = WARP as usize * ROW_FLOATS;
/// The group layout's unit: the bytes one thread loads or stores in one access.
pub(crate) const UNIT_BYTES: usize = 16;
/// `GROUP_UNITS` of `kernels.cu`: the units of its row a thread of the group layout holds at
/// most, and is given where the row has that many per lane.
pub(crate) const GROUP_UNITS: usize = 4;

/// An error of a row operator's CUDA kernel, in the words a user reads.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum RowError {
    /// An element type with no kernels.
    #[error("{DOMAIN} {op}: element type {ty:?} is not supported (float32 and float16 are)")]
    ElementType {
        op: &'static str,
        ty: TensorElementType,
    },
    /// An odd D for the elementwise kernel.
    #[error("D = {0}: the CUDA kernel needs an even D")]
    OddD(usize),
    /// A D the row kernels cannot keep in registers: odd, or more than [`MAX_D`].
    #[error("D = {0}: the CUDA kernels need an even D of at most {MAX_D}")]
    RowD(usize),
    #[error("{0} rows are too many for one launch")]
    TooManyRows(usize),
    #[error("cuLaunchKernel: {0}")]
    Launch(driver::DriverError),
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// How a kernel lays a row on the threads (`BlockRow` and `GroupRow` of `kernels.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// One block of [`THREADS`] threads per row, pairs of elements: D even, up to [`MAX_D`].
    Block,
    /// One block of [`THREADS`] threads per row, 4 elements per access: D a multiple of 4, up to
    /// [`MAX_D`], every tensor aligned to 4 elements (wan-1.3b's D = 1536: 3 accesses per
    /// thread instead of 6).
    BlockQuad,
    /// `lanes` threads of a warp per row (a power of two up to 32), [`UNIT_BYTES`] per access,
    /// up to [`GROUP_UNITS`] accesses per thread: D a multiple of a unit, up to [`GROUP_MAX_D`],
    /// and every tensor aligned to a unit. Against a block of 128 threads, which would leave most
    /// of them idle on a short row, and one warp of pairs, which keeps few bytes in flight.
    Group { lanes: u32 },
}

impl Layout {
    /// The entry point kinds, one per layout.
    pub(crate) const KINDS: [Layout; 3] = [
        Layout::Block,
        Layout::BlockQuad,
        Layout::Group { lanes: WARP },
    ];

    /// The layout of rows of D elements of `elem_bytes` bytes whose tensors are all aligned to
    /// `alignment` bytes: the group layout where it can take the row, with the fewest lanes that
    /// hold at most [`GROUP_UNITS`] units each (a power of two, up to a warp); else blocks of
    /// 4-element accesses where D and the alignment allow; else blocks of pairs.
    pub(crate) fn choose(d: usize, elem_bytes: usize, alignment: usize) -> Layout {
        let unit = UNIT_BYTES / elem_bytes;
        if alignment.is_multiple_of(UNIT_BYTES) && d.is_multiple_of(unit) && d <= GROUP_MAX_D {
            let lanes = (d / unit)
                .div_ceil(GROUP_UNITS)
                .next_power_of_two()
                .min(WARP as usize);
            Layout::Group {
                lanes: lanes as u32,
            }
        } else if alignment.is_multiple_of(4 * elem_bytes) && d.is_multiple_of(4) {
            Layout::BlockQuad
        } else {
            Layout::Block
        }
    }

    /// The layout of an elementwise operator ([`RowOp::ELEMENTWISE`]) over rows of D: only its unit
    /// matters (16 bytes, 4 elements or a pair, as D and the alignment allow).
    pub(crate) fn choose_elementwise(d: usize, elem_bytes: usize, alignment: usize) -> Layout {
        let group = Layout::Group { lanes: WARP };
        [group, Layout::BlockQuad]
            .into_iter()
            .find(|layout| {
                let unit = layout.unit(elem_bytes);
                alignment.is_multiple_of(unit * elem_bytes) && d.is_multiple_of(unit)
            })
            .unwrap_or(Layout::Block)
    }

    /// The elements one thread loads or stores in one access (`V` of `kernels.cu`).
    pub(crate) fn unit(self, elem_bytes: usize) -> usize {
        match self {
            Layout::Block => 2,
            Layout::BlockQuad => 4,
            Layout::Group { .. } => UNIT_BYTES / elem_bytes,
        }
    }

    /// The threads of a block: the `__launch_bounds__` of the layout's entry points.
    fn threads(self) -> u32 {
        match self {
            Layout::Block | Layout::BlockQuad => THREADS,
            Layout::Group { .. } => GROUP_THREADS,
        }
    }

    /// The grid and block sizes of an elementwise launch over `n` elements of `elem_bytes`:
    /// one access per thread up to a grid-stride cap.
    pub(crate) fn elementwise_dims(self, n: usize, elem_bytes: usize) -> (u32, u32) {
        const MAX_BLOCKS: usize = 1 << 14;
        let threads = self.threads();
        let accesses = n / self.unit(elem_bytes);
        let blocks = accesses.div_ceil(threads as usize).clamp(1, MAX_BLOCKS);
        (blocks as u32, threads)
    }

    /// The grid and block sizes of a launch over `rows` rows, or why there are too many.
    fn launch_dims(self, rows: usize) -> Result<(u32, u32), RowError> {
        let blocks = match self {
            Layout::Block | Layout::BlockQuad => rows,
            Layout::Group { lanes } => rows.div_ceil((GROUP_THREADS / lanes) as usize),
        };
        let threads = self.threads();
        // The largest grid x dimension CUDA allows.
        match u32::try_from(blocks) {
            Ok(blocks) if blocks <= i32::MAX as u32 => Ok((blocks, threads)),
            _ => Err(RowError::TooManyRows(rows)),
        }
    }
}

/// Refuses a row length the kernels cannot take: they load element pairs (D even), and those of
/// the row operators (not `elementwise`) keep a row in registers (D at most [`MAX_D`]).
pub(crate) fn check_d(elementwise: bool, d: usize) -> Result<(), RowError> {
    if elementwise {
        if !d.is_multiple_of(2) {
            return Err(RowError::OddD(d));
        }
    } else if !d.is_multiple_of(2) || d > MAX_D {
        return Err(RowError::RowD(d));
    }
    Ok(())
}

/// The kernel entry point of a row operator (`base`, its [`OpInfo::row_kernel`]), element type
/// and row layout, e.g. `unstep_bias_rms_norm_f16` (block layout) and
/// `unstep_bias_rms_norm_f16_g` (group layout).
///
/// [`OpInfo::row_kernel`]: super::operator::OpInfo::row_kernel
pub(crate) fn entry_point(base: &str, ty: TensorElementType, layout: Layout) -> Option<String> {
    let ty = match ty {
        TensorElementType::Float32 => "f32",
        TensorElementType::Float16 => "f16",
        _ => return None,
    };
    let layout = match layout {
        Layout::Block => "",
        Layout::BlockQuad => "_q",
        Layout::Group { .. } => "_g",
    };
    Some(format!("unstep_{base}_{ty}{layout}"))
}

/// One argument of a row kernel after the common ones, of the type of its parameter in
/// `kernels.cu` (`int` or `long long`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arg {
    Int(i32),
    Long(i64),
}

/// A row kernel's arguments: after the input and output pointers, `rows` (`long long`), `d`
/// (`int`) and `epsilon` (`float`), then the operator's `extra` ones, then the group layout's
/// lanes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RowArgs {
    pub(crate) rows: usize,
    pub(crate) d: usize,
    pub(crate) epsilon: f32,
    /// The rows the launch covers (Y's: `PrefixBiasRmsNorm` adds the prefix's).
    pub(crate) launch_rows: usize,
    pub(crate) extra: Vec<Arg>,
}

/// A row operator: one kernel of `kernels.cu` per element type and layout.
pub(crate) trait RowOp: UnstepOp {
    /// Whether the operator works element by element (no row in registers, any even D).
    const ELEMENTWISE: bool = false;
    /// The grid's y dimension: `QkvNormRopeCache` launches its Q, K and V rows in one.
    const GRID_Y: u32 = 1;

    /// The kernel's arguments for a call.
    fn args(attrs: &Self::Attrs, sizes: &Self::Sizes) -> RowArgs;
}

/// A row operator's CUDA kernel: its entry points of one element type, per layout.
pub(crate) struct RowKernel<O> {
    ty: TensorElementType,
    context: Handle<sys::CUcontext>,
    block: Handle<sys::CUfunction>,
    block_quad: Handle<sys::CUfunction>,
    group: Handle<sys::CUfunction>,
    op: PhantomData<fn() -> O>,
}

impl<O: RowOp> CudaKernel<O> for RowKernel<O> {
    type Error = RowError;

    /// Compiles and loads the kernels for device `ordinal` if this process has not yet.
    fn new(ty: TensorElementType, ordinal: i32) -> Result<Self, RowError> {
        let base = O::INFO.row_kernel.expect("a row operator names its kernel");
        let names = Layout::KINDS.map(|layout| entry_point(base, ty, layout));
        let [Some(block), Some(block_quad), Some(group)] = names else {
            return Err(RowError::ElementType {
                op: O::INFO.name,
                ty,
            });
        };
        let (context, block) = device_function(ordinal, &block)?;
        let function = |name: &str| device_function(ordinal, name).map(|(_, f)| f);
        let (block_quad, group) = (function(&block_quad)?, function(&group)?);
        Ok(Self {
            ty,
            context,
            block,
            block_quad,
            group,
            op: PhantomData,
        })
    }

    /// Launches the kernel of the call's layout ([`Layout::choose`]) on `stream` over `pointers`
    /// with the sizes of `sizes`; refuses a D the kernels cannot take ([`check_d`]).
    fn launch(
        &mut self,
        attrs: &O::Attrs,
        sizes: &O::Sizes,
        pointers: &[u64],
        stream: sys::CUstream,
    ) -> Result<(), RowError> {
        assert_eq!(pointers.len(), O::INFO.inputs.len() + O::INFO.outputs.len());
        let args = O::args(attrs, sizes);
        // The kernels load element pairs: an odd D would read misaligned pairs.
        check_d(O::ELEMENTWISE, args.d)?;
        if args.launch_rows == 0 {
            return Ok(());
        }
        let _current = CurrentContext::push(self.context)?;
        let elem_bytes = elem_bytes(self.ty);
        // The largest power of two (up to a unit) every pointer is aligned to.
        let alignment = pointers
            .iter()
            .map(|&p| 1usize << p.trailing_zeros().min(UNIT_BYTES.trailing_zeros()))
            .min()
            .unwrap_or(UNIT_BYTES);
        let (layout, (blocks, threads)) = if O::ELEMENTWISE {
            let layout = Layout::choose_elementwise(args.d, elem_bytes, alignment);
            (
                layout,
                layout.elementwise_dims(args.rows * args.d, elem_bytes),
            )
        } else {
            let layout = Layout::choose(args.d, elem_bytes, alignment);
            (layout, layout.launch_dims(args.launch_rows)?)
        };
        let (function, lanes) = match layout {
            Layout::Block => (self.block, 0i32),
            Layout::BlockQuad => (self.block_quad, 0i32),
            Layout::Group { lanes } => (self.group, lanes as i32),
        };
        // SAFETY: the function was loaded from kernels.cu into the current context; the caller
        // gives device memory of this device, sized by `sizes` (checked against the contract)
        // and aligned to element pairs, and a stream of the same (primary) context.
        unsafe {
            launch_row_kernel(
                function,
                (blocks, O::GRID_Y, threads),
                pointers,
                &args,
                lanes,
                stream,
            )
        }
    }
}

/// Launches `function` with `pointers`, then `args`' values, then `lanes`, in the order of its
/// signature in `kernels.cu`.
///
/// # Safety
///
/// `function` is loaded in the current context and takes exactly these arguments; the pointers
/// are device memory the kernel may read and write as the call's sizes say, on `stream`.
unsafe fn launch_row_kernel(
    function: Handle<sys::CUfunction>,
    (blocks, grid_y, threads): (u32, u32, u32),
    pointers: &[u64],
    args: &RowArgs,
    mut lanes: i32,
    stream: sys::CUstream,
) -> Result<(), RowError> {
    let mut pointers = pointers.to_vec();
    let mut rows = args.rows as i64;
    let mut d = args.d as i32;
    let mut epsilon = args.epsilon;
    let mut extra = args.extra.clone();
    let mut params: Vec<*mut c_void> = pointers
        .iter_mut()
        .map(|p| (p as *mut u64).cast::<c_void>())
        .collect();
    params.push((&mut rows as *mut i64).cast());
    params.push((&mut d as *mut i32).cast());
    params.push((&mut epsilon as *mut f32).cast());
    for arg in extra.iter_mut() {
        params.push(match arg {
            Arg::Int(v) => (v as *mut i32).cast(),
            Arg::Long(v) => (v as *mut i64).cast(),
        });
    }
    params.push((&mut lanes as *mut i32).cast());
    // SAFETY: `params` points at one value per kernel parameter, of the parameter's type (device
    // pointers as u64, `long long` as i64, `int` as i32, `float` as f32), alive for the call,
    // which copies them; the rest is the caller's promise.
    unsafe {
        driver::launch_kernel(
            function.0,
            (blocks, grid_y, 1),
            (threads, 1, 1),
            0,
            stream,
            &mut params,
        )
    }
    .map_err(RowError::Launch)
}

#[cfg(test)]
mod tests;

//! What an operator of the domain is ([`UnstepOp`]: its static description, attributes, shape
//! check, output shapes, CPU kernel and CUDA kernel) and the one adapter that turns any of them
//! into ONNX Runtime's custom operator and kernel ([`Registered`], [`NodeKernel`]), so that the
//! reading of inputs, the allocation of outputs and the dispatch to CPU or CUDA are written once.
//!
//! On CUDA, [`prepare`] checks a call of any operator against the contract and its CUDA needs
//! (element types, tensors on the kernel's device, shapes, alignment to element pairs), allocates
//! its outputs, and reads the device pointers of its inputs and outputs (`Tensor::data_ptr`: ONNX
//! Runtime allocates them on the device, as the operators are registered for
//! `CUDAExecutionProvider`) and the provider's `cudaStream_t`
//! (`KernelContext_GetGPUComputeStream`, [`ComputeContext::stream`]); the operator's
//! [`CudaKernel`] then queues its work on that stream. Nothing synchronises: ONNX Runtime orders
//! the stream.

use std::marker::PhantomData;
use std::ops::RangeInclusive;

use cudarc::driver::sys::CUstream;
use ort::memory::{AllocationDevice, MemoryType};
use ort::operator::{
    ComputeContext, Kernel, KernelContext, Operator, OperatorDomain, OperatorInput, OperatorOutput,
    ShapeInferenceContext,
};
use ort::value::{DynTensorValueType, PrimitiveTensorElementType, TensorElementType, ValueType};

use super::DOMAIN;

/// An element type of the operators: float32 or float16.
pub(crate) trait Element:
    PrimitiveTensorElementType + Copy + PartialEq + std::fmt::Debug + Send + Sync + 'static
{
    fn to_f32(self) -> f32;
    /// Rounds to nearest, ties to even (as `cvt.rn.f16.f32` on the GPU).
    fn from_f32(v: f32) -> Self;
    /// The values as float32: borrowed when they are float32 already.
    fn widen(values: &[Self]) -> std::borrow::Cow<'_, [f32]> {
        values.iter().map(|v| v.to_f32()).collect()
    }
}

impl Element for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn widen(values: &[Self]) -> std::borrow::Cow<'_, [f32]> {
        std::borrow::Cow::Borrowed(values)
    }
}

impl Element for half::f16 {
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
}

/// The static description of an operator: its ONNX name, its inputs' and outputs' names (in
/// order), which input is X (the tensor whose last axis is D), which inputs it writes in place,
/// which inputs have an element type of their own, and, for the row operators, the base name of
/// its entry points in `kernels.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpInfo {
    pub(crate) name: &'static str,
    pub(crate) inputs: &'static [&'static str],
    pub(crate) outputs: &'static [&'static str],
    pub(crate) x_index: usize,
    pub(crate) in_place: &'static [usize],
    /// The inputs whose element type is fixed rather than T (`MatMulFp8`'s 8-bit weight and
    /// float32 scales), with that type; every other input and every output is T. The CPU kernel
    /// reads them from [`CpuIo::fixed`].
    pub(crate) fixed: &'static [(usize, TensorElementType)],
    /// `bias_rms_norm` for `unstep_bias_rms_norm_f16` and its layouts; `None` for the operators
    /// that run on cuBLASLt or cuDNN.
    pub(crate) row_kernel: Option<&'static str>,
}

/// One operator of the `ai.unstep` domain. Each is a unit struct in its own file of `ops/`; the
/// registry (`mod.rs`) lists them.
pub(crate) trait UnstepOp: Send + Sync + Sized + 'static {
    const INFO: OpInfo;
    /// The node's attributes, read once when the session creates the kernel.
    type Attrs: Copy + std::fmt::Debug + Send + Sync + 'static;
    /// The sizes of one call, checked against the contract.
    type Sizes: Copy + std::fmt::Debug + PartialEq;
    /// The node's CUDA kernel.
    type Cuda: CudaKernel<Self>;

    /// Reads the node's attributes; a missing or invalid one is an error naming the node.
    fn attrs(node: &NodeAttrs<'_, '_>) -> ort::Result<Self::Attrs>;

    /// Checks the inputs' shapes (in the operator's input order, as many as it has inputs, X's
    /// last axis at least one element: [`ShapeCheck`] has checked that) against the contract.
    fn check(attrs: &Self::Attrs, shapes: &ShapeCheck<'_>) -> Result<Self::Sizes, ContractError>;

    /// Output `idx`'s shape from the inputs' (in the operator's input order); X's by default.
    fn output_shape(shapes: &[&[i64]], idx: usize) -> Vec<i64> {
        let _ = idx;
        shapes[Self::INFO.x_index].to_vec()
    }

    /// The input shapes [`Self::output_shape`] reads at shape inference, from X's and the fully
    /// known shapes of the others (`known(i)`); `None` when an input it needs is not known well
    /// enough, which leaves the inference to ONNX Runtime. By default every input is taken as X.
    fn inference_shapes<'a>(
        x: &'a [i64],
        known: impl Fn(usize) -> Option<&'a [i64]>,
    ) -> Option<Vec<&'a [i64]>> {
        let _ = known;
        Some(vec![x; Self::INFO.inputs.len()])
    }

    /// Whether a call of these sizes writes nothing (no launch on CUDA).
    fn is_empty(sizes: &Self::Sizes) -> bool;

    /// The CPU kernel over one call's tensors.
    fn cpu<T: Element>(attrs: &Self::Attrs, sizes: &Self::Sizes, io: CpuIo<'_, T>);
}

/// An operator's CUDA kernel: created when the session creates the node's kernel, launched on
/// ONNX Runtime's stream with the call's checked sizes.
pub(crate) trait CudaKernel<O: UnstepOp>: Sized + Send {
    /// The backend's error, in the words a user reads.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Loads what the kernel needs on device `ordinal`; an element type it cannot run is an error.
    fn new(ty: TensorElementType, ordinal: i32) -> Result<Self, Self::Error>;

    /// Queues the call on `stream` over `pointers` (device addresses of the inputs, then the
    /// outputs, in the operator's order) with `sizes` (checked against the contract).
    fn launch(
        &mut self,
        attrs: &O::Attrs,
        sizes: &O::Sizes,
        pointers: &[u64],
        stream: CUstream,
    ) -> Result<(), Self::Error>;
}

/// A failed call of an operator's CUDA kernel: the operator and the backend's error.
#[derive(Debug, thiserror::Error)]
#[error("{DOMAIN} {op}: (CUDA) {source}")]
pub(crate) struct CudaCallError<E: std::error::Error + 'static> {
    pub(crate) op: &'static str,
    pub(crate) source: E,
}

/// One CPU call's tensors: the inputs in the operator's order (an empty slice for those written
/// in place and those of a fixed type), the inputs of a fixed type ([`OpInfo::fixed`], in that
/// order), the inputs written in place (in order) and the outputs.
pub(crate) struct CpuIo<'a, T> {
    pub(crate) inputs: Vec<&'a [T]>,
    pub(crate) fixed: Vec<Fixed<'a>>,
    pub(crate) written: Vec<&'a mut [T]>,
    pub(crate) outputs: Vec<&'a mut [T]>,
}

/// The data of an input of a fixed element type.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fixed<'a> {
    U8(&'a [u8]),
    F32(&'a [f32]),
}

impl<'a> Fixed<'a> {
    /// The bytes of a uint8 input.
    pub(crate) fn u8(self) -> &'a [u8] {
        match self {
            Fixed::U8(data) => data,
            Fixed::F32(_) => panic!("a float32 input read as uint8"),
        }
    }

    /// The values of a float32 input.
    pub(crate) fn f32(self) -> &'a [f32] {
        match self {
            Fixed::F32(data) => data,
            Fixed::U8(_) => panic!("a uint8 input read as float32"),
        }
    }
}

/// An error of one operator, naming it.
pub(crate) fn op_error(info: &OpInfo, message: impl std::fmt::Display) -> ort::Error {
    ort::Error::new(format!("{DOMAIN} {}: {message}", info.name))
}

/// The elements of a shape (negative axes count as empty).
pub(crate) fn numel(shape: &[i64]) -> usize {
    shape.iter().map(|&n| n.max(0) as usize).product()
}

/// The bytes of one element of `ty` (float16 or float32).
pub(crate) fn elem_bytes(ty: TensorElementType) -> usize {
    match ty {
        TensorElementType::Float16 => 2,
        _ => 4,
    }
}

/// The node's attributes as the kernel context gives them, with the errors of the contract.
pub(crate) struct NodeAttrs<'k, 'attr> {
    info: &'static OpInfo,
    kctx: &'k KernelContext<'attr>,
    node: String,
}

impl NodeAttrs<'_, '_> {
    fn missing(&self, name: &str, ty: &str) -> ort::Error {
        op_error(
            self.info,
            format!(
                "node '{}' has no attribute {name} ({ty}); the exporter writes it",
                self.node
            ),
        )
    }

    /// The float attribute `epsilon`.
    pub(crate) fn epsilon(&self) -> ort::Result<f32> {
        self.kctx
            .get::<f32>("epsilon")
            .ok_or_else(|| self.missing("epsilon", "float"))
    }

    /// The int attribute `num_heads`, at least 1.
    pub(crate) fn num_heads(&self) -> ort::Result<usize> {
        let heads = self
            .kctx
            .get::<i64>("num_heads")
            .ok_or_else(|| self.missing("num_heads", "int"))?;
        usize::try_from(heads)
            .ok()
            .filter(|&h| h > 0)
            .ok_or_else(|| {
                op_error(
                    self.info,
                    format!(
                        "node '{}' has num_heads = {heads}; it must be ≥ 1",
                        self.node
                    ),
                )
            })
    }

    /// The optional int attribute `silu`: 0 (the default) or 1.
    pub(crate) fn silu(&self) -> ort::Result<bool> {
        self.flag("silu")
    }

    /// The optional int attribute `gelu`: 0 (the default) or 1.
    pub(crate) fn gelu(&self) -> ort::Result<bool> {
        self.flag("gelu")
    }

    /// An optional int attribute that is 0 (the default) or 1.
    fn flag(&self, name: &str) -> ort::Result<bool> {
        match self.kctx.get::<i64>(name) {
            None | Some(0) => Ok(false),
            Some(1) => Ok(true),
            Some(other) => Err(op_error(
                self.info,
                format!(
                    "node '{}' has {name} = {other}; it must be 0 or 1",
                    self.node
                ),
            )),
        }
    }
}

/// A call outside an operator's contract: the operator and what is wrong, with the inputs' names
/// and shapes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{DOMAIN} {op}: {message}")]
pub(crate) struct ContractError {
    pub(crate) op: &'static str,
    pub(crate) message: String,
}

impl From<ContractError> for ort::Error {
    fn from(e: ContractError) -> Self {
        ort::Error::new(e.to_string())
    }
}

/// The inputs' shapes of one call, with what every operator checks first: as many shapes as
/// inputs, and X with a last axis of at least one element.
pub(crate) struct ShapeCheck<'a> {
    pub(crate) info: &'static OpInfo,
    pub(crate) shapes: &'a [&'a [i64]],
    /// X's shape.
    pub(crate) x: &'a [i64],
    /// X's last axis.
    pub(crate) last: usize,
    /// numel(X) / last.
    pub(crate) rows: usize,
}

impl<'a> ShapeCheck<'a> {
    pub(crate) fn new(
        info: &'static OpInfo,
        shapes: &'a [&'a [i64]],
    ) -> Result<Self, ContractError> {
        let names = info.inputs;
        let fail = |message: String| ContractError {
            op: info.name,
            message,
        };
        if shapes.len() != names.len() {
            return Err(fail(format!(
                "{} inputs, expected {} ({})",
                shapes.len(),
                names.len(),
                names.join(", ")
            )));
        }
        let x = shapes[info.x_index];
        let x_name = names[info.x_index];
        let last = match x.last() {
            Some(&n) if n > 0 => n as usize,
            _ => {
                return Err(fail(format!(
                    "{x_name} has shape {x:?}; it needs a last axis of at least one element"
                )));
            }
        };
        Ok(Self {
            info,
            shapes,
            x,
            last,
            rows: numel(x) / last,
        })
    }

    /// A contract error of the operator.
    pub(crate) fn fail(&self, message: String) -> ContractError {
        ContractError {
            op: self.info.name,
            message,
        }
    }

    /// Input `i`'s shape.
    pub(crate) fn shape(&self, i: usize) -> &'a [i64] {
        self.shapes[i]
    }

    /// Input `i`'s name.
    pub(crate) fn name(&self, i: usize) -> &'static str {
        self.info.inputs[i]
    }
}

/// Checks an operator's shapes: [`ShapeCheck::new`], then its own [`UnstepOp::check`].
pub(crate) fn check<O: UnstepOp>(
    attrs: &O::Attrs,
    shapes: &[&[i64]],
) -> Result<O::Sizes, ContractError> {
    O::check(attrs, &ShapeCheck::new(&O::INFO, shapes)?)
}

/// One operator of the registry: its description and what adds it to a domain.
pub(crate) struct Registration {
    pub(crate) info: &'static OpInfo,
    add: fn(OperatorDomain, bool) -> ort::Result<OperatorDomain>,
}

impl Registration {
    /// Adds the operator, both element types, to `domain`, with CUDA kernels when `cuda` is true.
    pub(crate) fn add(&self, domain: OperatorDomain, cuda: bool) -> ort::Result<OperatorDomain> {
        (self.add)(domain, cuda)
    }
}

impl OpInfo {
    /// Input `i`'s element type in the node of element type `ty`.
    pub(crate) fn input_type(&self, i: usize, ty: TensorElementType) -> TensorElementType {
        self.fixed
            .iter()
            .find(|(index, _)| *index == i)
            .map_or(ty, |(_, fixed)| *fixed)
    }
}

/// The registry's entry of operator `O`.
pub(crate) const fn entry<O: UnstepOp>() -> Registration {
    Registration {
        info: &O::INFO,
        add: add::<O>,
    }
}

/// Adds both element types of operator `O` to `domain`, with CUDA kernels when `cuda` is true.
pub(crate) fn add<O: UnstepOp>(
    mut domain: OperatorDomain,
    cuda: bool,
) -> ort::Result<OperatorDomain> {
    for ty in [TensorElementType::Float32, TensorElementType::Float16] {
        domain = domain.add(Registered::<O> {
            ty,
            cuda,
            op: PhantomData,
        })?;
    }
    Ok(domain)
}

/// Operator `O` for one element type, on the CPU or on CUDA.
pub(crate) struct Registered<O> {
    ty: TensorElementType,
    cuda: bool,
    op: PhantomData<fn() -> O>,
}

impl<O: UnstepOp> Operator for Registered<O> {
    type Kernel<'attr> = NodeKernel<O>;

    fn name(&self) -> &str {
        O::INFO.name
    }

    fn versions(&self) -> RangeInclusive<u32> {
        1..=1
    }

    fn execution_provider_type(&self) -> Option<&str> {
        self.cuda.then_some("CUDAExecutionProvider")
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        (0..O::INFO.inputs.len()).map(|i| OperatorInput::required(O::INFO.input_type(i, self.ty)))
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        O::INFO
            .outputs
            .iter()
            .map(|_| OperatorOutput::required(self.ty))
    }

    fn create_kernel<'attr>(&self, kctx: &KernelContext<'attr>) -> ort::Result<NodeKernel<O>> {
        let node = NodeAttrs {
            info: &O::INFO,
            kctx,
            node: kctx.node_name().unwrap_or_default(),
        };
        let attrs = O::attrs(&node)?;
        // The device of the node's CUDA provider; compute checks that the tensors are there.
        let ordinal = if self.cuda {
            kctx.allocator(MemoryType::Default)
                .ok()
                .and_then(|allocator| {
                    let memory = allocator.memory_info();
                    (memory.allocation_device() == AllocationDevice::CUDA)
                        .then(|| memory.device_id())
                })
                .unwrap_or(0)
        } else {
            0
        };
        let cuda = if self.cuda {
            let started = std::time::Instant::now();
            let kernel = O::Cuda::new(self.ty, ordinal).map_err(ort::Error::wrap)?;
            if super::settings().creation_log {
                eprintln!(
                    "[unstep] {} kernel of node {}: created in {:.3} ms",
                    O::INFO.name,
                    node.node,
                    started.elapsed().as_secs_f64() * 1e3
                );
            }
            Some(kernel)
        } else {
            None
        };
        Ok(NodeKernel {
            ty: self.ty,
            ordinal,
            attrs,
            cuda,
        })
    }

    /// Every output's shape is [`UnstepOp::output_shape`] of the inputs'. Left to ONNX Runtime
    /// when a shape it takes is not fully known (no rank, or an unnamed unknown axis, or what
    /// [`UnstepOp::inference_shapes`] refuses), which ONNX Runtime would otherwise read as a
    /// scalar or an axis of -1.
    fn infer_shape(&self, ctx: &mut ShapeInferenceContext) -> ort::Result<()> {
        let inputs = ctx.inputs();
        fn known(value: Option<&ValueType>) -> Option<&[i64]> {
            match value {
                Some(ValueType::Tensor {
                    shape,
                    dimension_symbols,
                    ..
                }) => {
                    let full = !shape.is_empty()
                        && shape
                            .iter()
                            .zip(dimension_symbols.iter())
                            .all(|(&n, symbol)| n >= 0 || !symbol.is_empty());
                    full.then_some(&shape[..])
                }
                _ => None,
            }
        }
        let x_index = O::INFO.x_index;
        let Some(x) = known(inputs.get(x_index)) else {
            return Ok(());
        };
        let Some(shapes) = O::inference_shapes(x, |i| known(inputs.get(i))) else {
            return Ok(());
        };
        for idx in 0..O::INFO.outputs.len() {
            let mut out = inputs[x_index].clone();
            if let ValueType::Tensor { shape, .. } = &mut out {
                *shape = O::output_shape(&shapes, idx).into();
            }
            ctx.set_output(idx, &out)?;
        }
        Ok(())
    }
}

/// A node's kernel: its attributes, and its CUDA kernel when it runs on CUDA.
pub(crate) struct NodeKernel<O: UnstepOp> {
    ty: TensorElementType,
    /// The CUDA device the kernel runs on (0 on the CPU).
    ordinal: i32,
    attrs: O::Attrs,
    cuda: Option<O::Cuda>,
}

impl<O: UnstepOp> Kernel for NodeKernel<O> {
    fn compute(&mut self, ctx: &ComputeContext) -> ort::Result<()> {
        if let Some(kernel) = &mut self.cuda {
            let Some(call) = prepare::<O>(self.ty, self.ordinal, &self.attrs, ctx)? else {
                return Ok(());
            };
            return kernel
                .launch(&self.attrs, &call.sizes, &call.pointers, call.stream)
                .map_err(|source| {
                    ort::Error::wrap(CudaCallError {
                        op: O::INFO.name,
                        source,
                    })
                });
        }
        match self.ty {
            TensorElementType::Float32 => compute_cpu::<O, f32>(&self.attrs, ctx),
            TensorElementType::Float16 => compute_cpu::<O, half::f16>(&self.attrs, ctx),
            other => Err(op_error(
                &O::INFO,
                format!("element type {other:?} is not supported (float32 and float16 are)"),
            )),
        }
    }
}

/// A checked call of an operator on CUDA, ready to launch.
pub(crate) struct Call<S> {
    pub(crate) sizes: S,
    /// Device addresses of the inputs, then the outputs, in the operator's order.
    pub(crate) pointers: Vec<u64>,
    /// ONNX Runtime's compute stream.
    pub(crate) stream: CUstream,
}

/// Checks a call of `O` on CUDA device `ordinal` with element type `ty` against the contract
/// (types, devices, shapes, alignment to element pairs) and allocates its outputs; `None` when
/// the outputs are empty (nothing to launch).
fn prepare<O: UnstepOp>(
    ty: TensorElementType,
    ordinal: i32,
    attrs: &O::Attrs,
    ctx: &ComputeContext,
) -> ort::Result<Option<Call<O::Sizes>>> {
    let info = &O::INFO;
    let fail = |message: String| op_error(info, format!("(CUDA) {message}"));
    let elem_bytes = elem_bytes(ty);
    // `kind` and `name` are formatted only when the check fails: this runs on every call.
    let on_device = |kind: &str, name: &str, mem: &ort::memory::MemoryInfo<'_>| {
        if mem.allocation_device() == AllocationDevice::CUDA && mem.device_id() == ordinal {
            Ok(())
        } else {
            Err(fail(format!(
                "{kind} {name} is in {} memory of device {}; the kernel runs on CUDA device {}",
                mem.allocation_device().as_str(),
                mem.device_id(),
                ordinal
            )))
        }
    };
    let names = info.inputs;
    let mut inputs = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let tensor = ctx
            .input(i)?
            .ok_or_else(|| fail(format!("input {name} is missing")))?
            .downcast::<DynTensorValueType>()?;
        let expected = info.input_type(i, ty);
        if *tensor.data_type() != expected {
            return Err(fail(format!(
                "input {name} is {:?}, it must be {expected:?} (the node's type is {ty:?})",
                tensor.data_type(),
            )));
        }
        on_device("input", name, tensor.memory_info())?;
        inputs.push(tensor);
    }
    let shapes: Vec<&[i64]> = inputs.iter().map(|t| &**t.shape()).collect();
    let sizes = check::<O>(attrs, &shapes)?;
    let mut pointers: Vec<u64> = inputs.iter().map(|t| t.data_ptr() as u64).collect();
    for (idx, name) in info.outputs.iter().enumerate() {
        let tensor = ctx
            .output(idx, O::output_shape(&shapes, idx))?
            .ok_or_else(|| fail(format!("ONNX Runtime gave no output {name}")))?
            .downcast::<DynTensorValueType>()?;
        on_device("output", name, tensor.memory_info())?;
        // `data_ptr` is ONNX Runtime's GetTensorMutableData: the output's writable memory,
        // which stays ONNX Runtime's; the kernel writes it on the stream.
        pointers.push(tensor.data_ptr() as u64);
    }
    if O::is_empty(&sizes) {
        return Ok(None);
    }
    // Every layout loads and stores at least a pair of elements in one access (the block
    // layout's unit; the group layout's is checked in the launch, which falls back to blocks).
    let all_names = names.iter().chain(info.outputs);
    for (&pointer, name) in pointers.iter().zip(all_names) {
        if pointer % (2 * elem_bytes as u64) != 0 {
            return Err(fail(format!(
                "{name} at {pointer:#x} is not aligned to {} bytes",
                2 * elem_bytes
            )));
        }
    }
    let stream = ctx
        .stream()?
        .ok_or_else(|| fail("ONNX Runtime gave no CUDA compute stream".to_string()))?
        .as_ptr() as CUstream;
    Ok(Some(Call {
        sizes,
        pointers,
        stream,
    }))
}

/// One call of `O` on the CPU provider: reads the inputs, checks them against the contract,
/// allocates the outputs ([`UnstepOp::output_shape`]) and runs the kernel.
fn compute_cpu<O: UnstepOp, T: Element>(attrs: &O::Attrs, ctx: &ComputeContext) -> ort::Result<()> {
    let info = &O::INFO;
    let names = info.inputs;
    let input = |i: usize| {
        ctx.input(i)?
            .ok_or_else(|| op_error(info, format!("input {} is missing", names[i])))
    };
    // The inputs the operator writes (K and V of QkvNormRopeCache) are not borrowed as slices:
    // they are written through ONNX Runtime's pointer below.
    let mut values = Vec::with_capacity(names.len());
    let mut written = Vec::with_capacity(info.in_place.len());
    for i in 0..names.len() {
        if info.in_place.contains(&i) {
            written.push(input(i)?.downcast::<DynTensorValueType>()?);
            values.push(None);
        } else {
            values.push(Some(input(i)?));
        }
    }
    let mut written_shapes = written.iter().map(|tensor| &**tensor.shape());
    let mut inputs: Vec<(&[i64], &[T])> = Vec::with_capacity(names.len());
    let mut fixed = Vec::with_capacity(info.fixed.len());
    for (i, (value, name)) in values.iter().zip(names).enumerate() {
        let Some(value) = value else {
            let shape = written_shapes
                .next()
                .expect("one written tensor per in-place input");
            inputs.push((shape, &[]));
            continue;
        };
        let failed = |e: ort::Error| op_error(info, format!("input {name}: {e}"));
        if let Some((_, ty)) = info.fixed.iter().find(|(index, _)| *index == i) {
            let shape = match ty {
                TensorElementType::Uint8 => {
                    let (shape, data) = value.try_extract_tensor::<u8>().map_err(failed)?;
                    fixed.push(Fixed::U8(data));
                    shape
                }
                TensorElementType::Float32 => {
                    let (shape, data) = value.try_extract_tensor::<f32>().map_err(failed)?;
                    fixed.push(Fixed::F32(data));
                    shape
                }
                other => unreachable!("no operator has a fixed input of type {other:?}"),
            };
            inputs.push((shape, &[]));
            continue;
        }
        let (shape, data) = value.try_extract_tensor::<T>().map_err(failed)?;
        inputs.push((shape, data));
    }
    let shapes: Vec<&[i64]> = inputs.iter().map(|(shape, _)| *shape).collect();
    let sizes = check::<O>(attrs, &shapes)?;
    let mut outputs = Vec::with_capacity(info.outputs.len());
    for idx in 0..info.outputs.len() {
        outputs.push(
            ctx.output(idx, O::output_shape(&shapes, idx))?
                .ok_or_else(|| op_error(info, format!("ONNX Runtime gave no output {idx}")))?,
        );
    }
    let mut output_slices = Vec::with_capacity(outputs.len());
    for output in outputs.iter_mut() {
        output_slices.push(output.try_extract_tensor_mut::<T>()?.1);
    }
    let written = written
        .iter()
        .map(|tensor| {
            let len = numel(tensor.shape());
            // SAFETY: ONNX Runtime's writable pointer (GetTensorMutableData) to the tensor's `len`
            // elements of T (its type was checked with the others' by the kernel's registration
            // and its shape by `check`), host memory on the CPU provider. No slice of it is alive
            // (see `values` above), and the inputs written in place are distinct inputs: the
            // graph's contract gives the node buffers that nothing reads before it has run.
            unsafe { std::slice::from_raw_parts_mut(tensor.data_ptr().cast::<T>().cast_mut(), len) }
        })
        .collect();
    let io = CpuIo {
        inputs: inputs.iter().map(|(_, data)| *data).collect(),
        fixed,
        written,
        outputs: output_slices,
    };
    O::cpu(attrs, &sizes, io);
    Ok(())
}

//! Buffers the loop allocates once and the views and bindings through which the sessions read
//! and write them.
//!
//! A [`Buf`] is one allocation where the provider computes (device memory on a GPU, host memory
//! on the CPU), from an ONNX Runtime allocator or, for memory no arena may keep, the runner's own
//! device memory ([`Buf::own_device`]); a [`View`] is a typed tensor over part of it, bound to a session's input or
//! output by a [`Bound`] IoBinding. [`Buf::upload`] and [`Buf::download`] copy between host and
//! buffer through the runner's identity graph, outside the timed region.

use std::ffi::c_void;

use ort::AsPointer;
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, Session};
use ort::value::{
    DynTensor, DynTensorRefMut, DynTensorValueType, Tensor, TensorElementType, TensorRefMut,
};

use super::{GenerateError, run_error};

pub(super) type View = DynTensorRefMut<'static>;

fn elem_size(ty: TensorElementType) -> usize {
    match ty {
        TensorElementType::Float32 => 4,
        TensorElementType::Float16 | TensorElementType::Bfloat16 => 2,
        TensorElementType::Int64 => 8,
        TensorElementType::Uint8 => 1,
        other => unreachable!("the loop uses no {other:?} buffers"),
    }
}

/// One allocation on the device, and typed views into it.
pub(super) struct Buf {
    memory: Memory,
    ty: TensorElementType,
    /// Elements, as asked for (the allocation holds at least one).
    pub(super) len: usize,
}

/// Where a [`Buf`]'s elements are, and what frees them.
enum Memory {
    /// From an ONNX Runtime allocator (an arena on a GPU, which keeps what it once held).
    Tensor(DynTensor),
    /// The runner's own device memory, freed when the buffer is dropped.
    Device(crate::engine::kernels::DeviceMemory),
}

impl Buf {
    pub(super) fn new(alloc: &Allocator, ty: TensorElementType, len: usize) -> ort::Result<Self> {
        // A zero-length allocation has no pointer; keep every buffer at least one element long.
        let tensor = DynTensor::new(alloc, ty, [len.max(1)])?;
        Ok(Self {
            memory: Memory::Tensor(tensor),
            ty,
            len,
        })
    }

    /// A buffer of the runner's own on CUDA device `ordinal`, outside ONNX Runtime's arenas and
    /// freed when dropped: for memory needed once (the decoder's causal caches of its run at
    /// start), which an arena would keep for the whole process.
    pub(super) fn own_device(
        ordinal: i32,
        ty: TensorElementType,
        len: usize,
    ) -> Result<Self, GenerateError> {
        let memory = crate::engine::kernels::DeviceMemory::new(ordinal, len.max(1) * elem_size(ty))
            .map_err(|e| run_error("device setup")(ort::Error::wrap(e)))?;
        Ok(Self {
            memory: Memory::Device(memory),
            ty,
            len,
        })
    }

    /// [`Buf::new`] for the loop's setup, its error a [`GenerateError`].
    pub(super) fn alloc(
        alloc: &Allocator,
        ty: TensorElementType,
        len: usize,
    ) -> Result<Self, GenerateError> {
        Self::new(alloc, ty, len).map_err(run_error("device setup"))
    }

    /// A tensor over `shape` starting `offset` elements into the buffer.
    pub(super) fn view(
        &self,
        mem: &MemoryInfo<'static>,
        offset: usize,
        shape: &[i64],
    ) -> ort::Result<View> {
        let count: i64 = shape.iter().product();
        assert!(
            offset + count as usize <= self.len.max(1),
            "view {offset}+{count} past a buffer of {}",
            self.len
        );
        let base = match &self.memory {
            Memory::Tensor(tensor) => tensor.data_ptr().cast::<u8>().cast_mut(),
            Memory::Device(memory) => memory.ptr().cast::<u8>(),
        };
        // SAFETY: the view lies inside the allocation (checked above), the allocation is owned by
        // its user (the device loop, the decoder's run at start) and outlives every binding made
        // from it (bindings are cleared or dropped first), and views are only handed to ONNX
        // Runtime.
        unsafe {
            let ptr = base.add(offset * elem_size(self.ty)).cast::<c_void>();
            raw_view(mem, ptr, self.ty, shape)
        }
    }

    /// Copies host data into the start of the buffer (outside the timed region), through the
    /// runner's identity graph: ONNX Runtime copies a host input to the device itself (ort's
    /// `copy_into` hangs on its shared identity sessions).
    pub(super) fn upload<
        T: ort::value::PrimitiveTensorElementType + Clone + std::fmt::Debug + 'static,
    >(
        &self,
        identity: &mut Session,
        mem: &MemoryInfo<'static>,
        data: &[T],
    ) -> ort::Result<()> {
        let host = Tensor::from_array(([data.len()], data.to_vec().into_boxed_slice()))?;
        let mut binding = Bound::new(identity.create_binding()?);
        binding.binding.bind_input("x", &host)?;
        binding.output("y", self.view(mem, 0, &[data.len() as i64])?)?;
        identity.run_binding(&binding.binding)?;
        Ok(())
    }

    /// Copies the first `len` elements to the host (outside the timed region).
    pub(super) fn download<
        T: ort::value::PrimitiveTensorElementType + Clone + std::fmt::Debug + 'static,
    >(
        &self,
        identity: &mut Session,
        mem: &MemoryInfo<'static>,
        len: usize,
    ) -> ort::Result<Vec<T>> {
        let mut host = DynTensor::new(&Allocator::default(), self.ty, [len])?;
        let mut binding = Bound::new(identity.create_binding()?);
        binding.input("x", self.view(mem, 0, &[len as i64])?)?;
        binding.binding.bind_output("y", &mut host)?;
        identity.run_binding(&binding.binding)?;
        drop(binding);
        let (_, data) = host.try_extract_tensor::<T>()?;
        Ok(data.to_vec())
    }
}

/// A tensor of `ty` over `shape` at `ptr`, in `mem`'s memory.
///
/// # Safety
/// `ptr` must point to `shape`'s elements of `ty` in `mem`'s memory, valid for as long as the
/// view (or a binding of it) is used.
unsafe fn raw_view(
    mem: &MemoryInfo<'static>,
    ptr: *mut c_void,
    ty: TensorElementType,
    shape: &[i64],
) -> ort::Result<View> {
    let shape = ort::value::Shape::new(shape.iter().copied());
    // SAFETY: as the caller promises.
    unsafe {
        Ok(match ty {
            TensorElementType::Float32 => {
                TensorRefMut::<f32>::from_raw(mem.clone(), ptr.cast(), shape)?
                    .into_dyn()
                    .downcast::<DynTensorValueType>()?
            }
            TensorElementType::Float16 => {
                TensorRefMut::<half::f16>::from_raw(mem.clone(), ptr.cast(), shape)?
                    .into_dyn()
                    .downcast::<DynTensorValueType>()?
            }
            TensorElementType::Bfloat16 => {
                TensorRefMut::<half::bf16>::from_raw(mem.clone(), ptr.cast(), shape)?
                    .into_dyn()
                    .downcast::<DynTensorValueType>()?
            }
            TensorElementType::Int64 => {
                TensorRefMut::<i64>::from_raw(mem.clone(), ptr.cast(), shape)?
                    .into_dyn()
                    .downcast::<DynTensorValueType>()?
            }
            TensorElementType::Uint8 => {
                TensorRefMut::<u8>::from_raw(mem.clone(), ptr.cast(), shape)?
                    .into_dyn()
                    .downcast::<DynTensorValueType>()?
            }
            other => unreachable!("no {other:?} views"),
        })
    }
}

/// An IoBinding and the views bound to it, kept alive as long as the binding may use them.
///
/// Inputs are bound through the C API rather than `IoBinding::bind_input`: ort deep-copies a
/// borrowed tensor there (through an identity session) to rule out aliasing, which for the device
/// loop would copy the KV cache on every bind. Here the loop owns every buffer and no output of a
/// run overlaps one of its inputs.
pub(super) struct Bound {
    pub(super) binding: IoBinding,
    held: Vec<View>,
}

impl Bound {
    pub(super) fn new(binding: IoBinding) -> Self {
        Self {
            binding,
            held: Vec::new(),
        }
    }

    pub(super) fn input(&mut self, name: &str, value: View) -> ort::Result<()> {
        let name = std::ffi::CString::new(name).expect("graph names have no NUL");
        // SAFETY: both pointers are valid; the value is kept in `held` for the binding's life.
        let status =
            unsafe { (ort::api().BindInput)(self.binding.ptr_mut(), name.as_ptr(), value.ptr()) };
        self.held.push(value);
        status_result(status)
    }

    pub(super) fn output(&mut self, name: &str, value: View) -> ort::Result<()> {
        self.binding.bind_output(name, value)
    }
}

pub(super) fn status_result(status: ort::sys::OrtStatusPtr) -> ort::Result<()> {
    if status.0.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null status is a valid OrtStatus that we own and release once.
    let message = unsafe {
        let text = std::ffi::CStr::from_ptr((ort::api().GetErrorMessage)(status.0))
            .to_string_lossy()
            .into_owned();
        (ort::api().ReleaseStatus)(status.0);
        text
    };
    Err(ort::Error::new(message))
}

/// Where the loop's buffers live: the CUDA device, or host memory for the CPU provider.
pub(super) fn device_memory_info(device: Option<i32>) -> ort::Result<MemoryInfo<'static>> {
    match device {
        Some(id) => MemoryInfo::new(
            AllocationDevice::CUDA,
            id,
            AllocatorType::Device,
            MemoryType::Default,
        ),
        None => MemoryInfo::new(
            AllocationDevice::CPU,
            0,
            AllocatorType::Device,
            MemoryType::Default,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::onnx_graph;
    use crate::engine::session::{RuntimeOptions, build_small_session};

    /// Text contexts reach the loop through `Buf::upload` on the bundle's float type; in
    /// half precision the values must come back bit for bit (CPU provider, real ONNX Runtime).
    #[test]
    fn a_half_precision_buffer_round_trips_through_the_identity_graph() {
        let options = RuntimeOptions {
            intra_op_threads: Some(1),
            ..RuntimeOptions::default()
        };
        let graph = onnx_graph::identity(TensorElementType::Float16);
        let mut identity = build_small_session("identity_f16", &graph, &options).unwrap();
        let mem = device_memory_info(None).unwrap();
        let alloc = Allocator::new(&identity, mem.clone()).unwrap();
        let buf = Buf::new(&alloc, TensorElementType::Float16, 6).unwrap();
        let data: Vec<half::f16> = [0.5, -1.25, 3.0, 65504.0, 1e-3, -0.0]
            .map(half::f16::from_f32)
            .to_vec();
        buf.upload(&mut identity, &mem, &data).unwrap();
        let back: Vec<half::f16> = buf.download(&mut identity, &mem, data.len()).unwrap();
        assert_eq!(
            back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            data.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}

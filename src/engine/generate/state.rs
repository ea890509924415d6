//! The loop's state: the buffers it allocates once per `Generator` where the provider computes,
//! the runner's small graphs (scheduler arithmetic and copies), and the bundle's constants
//! uploaded into them.

use ort::memory::{Allocator, MemoryInfo};
use ort::session::Session;
use ort::value::TensorElementType;

use super::buffers::{Buf, View, device_memory_info};
use super::capture::{GraphCapture, GraphIds};
use super::decode::VaeParts;
use super::dims::Dims;
use super::{GenerateError, PhaseTimes, TimedRegionEnd, run_error};
use crate::engine::bundle::Bundle;
use crate::engine::cuda_memory::MemoryProbe;
use crate::engine::onnx_graph;
use crate::engine::session::{
    ContextInterface, GraphSessions, KvInterface, KvNames, Provider, RuntimeOptions,
    build_small_session, context_names, float_type,
};

/// The runner's small graphs.
pub(super) struct SmallGraphs {
    /// `axpby` with `q` in float32 (noise, x0).
    pub(super) axpby_f32: Session,
    /// `axpby` with `q` in the bundle's float type (the DiT's flow).
    pub(super) axpby_model: Session,
    /// `Identity` per element type, for host ↔ device copies.
    pub(super) identity_f32: Session,
    pub(super) identity_i64: Session,
    pub(super) identity_u8: Session,
    /// `Identity` in the bundle's float type (text contexts).
    pub(super) identity_model: Session,
}

impl SmallGraphs {
    /// Builds the graphs for a bundle whose float type is `model`.
    fn new(runtime: &RuntimeOptions, model: TensorElementType) -> Result<Self, GenerateError> {
        let small = |name: &str, bytes: Vec<u8>| build_small_session(name, &bytes, runtime);
        Ok(Self {
            axpby_f32: small(
                "axpby_f32",
                onnx_graph::axpby(TensorElementType::Float32, model),
            )?,
            axpby_model: small("axpby_model", onnx_graph::axpby(model, model))?,
            identity_f32: small(
                "identity_f32",
                onnx_graph::identity(TensorElementType::Float32),
            )?,
            identity_i64: small(
                "identity_i64",
                onnx_graph::identity(TensorElementType::Int64),
            )?,
            identity_u8: small(
                "identity_u8",
                onnx_graph::identity(TensorElementType::Uint8),
            )?,
            identity_model: small("identity_model", onnx_graph::identity(model))?,
        })
    }
}

/// The device-resident state of a generator.
pub(super) struct DeviceLoop {
    pub(super) mem: MemoryInfo<'static>,
    pub(super) alloc: Allocator,
    pub(super) d: Dims,
    pub(super) graphs: SmallGraphs,
    pub(super) kv_k: Vec<Buf>,
    pub(super) kv_v: Vec<Buf>,
    /// Where the last block's passes write their keys and values (`[keys, values]`).
    pub(super) kv_scratch: [Buf; 2],
    pub(super) context: Buf,
    /// With [`ContextInterface::KeysValues`], every layer's cross-attention keys and values of
    /// the prompt (`[ctx_k.{i}, ctx_v.{i}]`, `dit_context`'s outputs, once per prompt); empty
    /// when the DiT takes `context` itself.
    pub(super) context_kv: Vec<[Buf; 2]>,
    pub(super) context_names: Vec<[String; 2]>,
    /// Latents of the block being denoised, float32, and the same in the bundle's type.
    pub(super) x: Buf,
    pub(super) x_model: Buf,
    pub(super) x0: Buf,
    pub(super) flow: Buf,
    /// Outputs nobody reads (the `y_model` of updates whose result stays float32).
    pub(super) scratch: Buf,
    /// Every noise draw of a prompt, `[blocks][draws per block][block]`.
    pub(super) noise: Buf,
    /// The schedule's `axpby` coefficients (see [`super::dit::Plan`]).
    pub(super) coefficients: Buf,
    /// The timestep of each level of the schedule, `frames_per_block` values each.
    pub(super) timesteps: Buf,
    /// Each block's frame offset.
    pub(super) offsets: Buf,
    /// The decoder's sessions and buffers; taken out of the loop while a prompt runs, so that a
    /// decoder thread can hold them while the DiT runs on the caller's thread.
    pub(super) vae: Option<VaeParts>,
    /// Decode each block while the DiT generates the next.
    pub(super) overlap_vae: bool,
    /// CUDA graphs of the DiT's session, one per block shape (`runtime.cuda_graphs`).
    pub(super) capture: Option<GraphCapture>,
    pub(super) names: KvNames,
    /// Peak device memory reader (CUDA runtime), when the provider is on a GPU.
    pub(super) memory: Option<MemoryProbe>,
    /// DiT passes run so far.
    pub(super) dit_passes: usize,
    /// Run the last block's clean-cache pass also where nothing reads it (`emit = "denoised"`):
    /// only for tests, which check that skipping it changes no output.
    pub(super) run_unread_clean_pass: bool,
}

/// Results of one prompt, copied to the host.
pub(super) struct DeviceOutput {
    pub(super) latents: Vec<f32>,
    pub(super) frames: Vec<u8>,
    pub(super) times: PhaseTimes,
    pub(super) end: TimedRegionEnd,
    pub(super) peak_device_memory: Option<u64>,
}

/// The KV cache, one buffer per layer and kind, and the two scratch buffers of the last block.
type KvBuffers = (Vec<Buf>, Vec<Buf>, [Buf; 2]);

impl DeviceLoop {
    pub(super) fn new(
        bundle: &Bundle,
        sessions: &GraphSessions,
        runtime: &RuntimeOptions,
    ) -> Result<Self, GenerateError> {
        let m = &bundle.manifest;
        let d = Dims::of(bundle);
        let model = float_type(m.precision);
        let setup = run_error("device setup");
        let on_gpu = !matches!(runtime.provider, Provider::Cpu);
        let device_id = match &runtime.provider {
            Provider::Cuda(c) => Some(c.device_id),
            Provider::TensorRt(t) => Some(t.device_id),
            Provider::Cpu => None,
        };
        let (mem, alloc) = if on_gpu {
            let mem = device_memory_info(device_id).map_err(setup)?;
            let alloc = Allocator::new(&sessions.dit, mem.clone()).map_err(setup)?;
            (mem, alloc)
        } else {
            let mem = device_memory_info(None).map_err(setup)?;
            (mem, Allocator::default())
        };

        let graphs = SmallGraphs::new(runtime, model)?;
        let f32_ = TensorElementType::Float32;
        let buf = |ty, len| Buf::alloc(&alloc, ty, len);
        let (kv_k, kv_v, kv_scratch) = kv_buffers(&alloc, d, model, sessions.kv_interface)?;
        let block = d.block_elems();
        // Sized for the default schedule (4 steps + the clean pass); `grow_tables` grows them.
        let draws_per_block = 5;
        let context_kv = match sessions.context_interface() {
            ContextInterface::Text => Vec::new(),
            ContextInterface::KeysValues => (0..d.layers)
                .map(|_| {
                    Ok([
                        buf(model, d.text_len * d.dim)?,
                        buf(model, d.text_len * d.dim)?,
                    ])
                })
                .collect::<Result<_, GenerateError>>()?,
        };
        let mut this = Self {
            kv_k,
            kv_v,
            kv_scratch,
            context: buf(model, d.text_len * d.text_dim)?,
            context_kv,
            context_names: context_names(d.layers),
            x: buf(f32_, block)?,
            x_model: buf(model, block)?,
            x0: buf(f32_, block)?,
            flow: buf(model, block)?,
            scratch: buf(model, block)?,
            noise: buf(f32_, d.blocks() * draws_per_block * block)?,
            coefficients: buf(f32_, 64)?,
            timesteps: buf(f32_, 16 * d.frames_per_block)?,
            offsets: buf(TensorElementType::Int64, d.blocks())?,
            vae: Some(VaeParts::new(
                sessions, runtime, &alloc, d, model, device_id,
            )?),
            overlap_vae: runtime.overlap_vae,
            capture: if runtime.cuda_graphs() {
                Some(GraphCapture {
                    ids: GraphIds::default(),
                    timestep: buf(f32_, d.frames_per_block)?,
                })
            } else {
                None
            },
            names: KvNames::new(sessions.kv_interface, d.layers),
            memory: if on_gpu { MemoryProbe::open() } else { None },
            dit_passes: 0,
            run_unread_clean_pass: false,
            graphs,
            mem,
            alloc,
            d,
        };
        this.upload_constants(bundle)?;
        if let Some(bytes) = this.memory.as_ref().and_then(|m| m.in_use()) {
            eprintln!(
                "device memory in use after loading the graphs and the loop's buffers: {:.2} GiB",
                bytes as f64 / (1u64 << 30) as f64
            );
        }
        Ok(this)
    }

    /// Constants of the bundle: block offsets, frame indices, latent statistics.
    fn upload_constants(&mut self, bundle: &Bundle) -> Result<(), GenerateError> {
        let setup = run_error("device setup");
        let d = self.d;
        let offsets: Vec<i64> = (0..d.blocks())
            .map(|b| (b * d.frames_per_block) as i64)
            .collect();
        let g = &mut self.graphs;
        self.offsets
            .upload(&mut g.identity_i64, &self.mem, &offsets)
            .map_err(setup)?;
        let vae = &self.vae.as_ref().expect("just built").bufs;
        vae.upload_constants(
            &mut g.identity_i64,
            &mut g.identity_f32,
            &self.mem,
            &bundle.manifest.latent,
        )
        .map_err(setup)
    }

    pub(super) fn view(
        &self,
        b: &Buf,
        offset: usize,
        shape: &[i64],
    ) -> Result<View, GenerateError> {
        b.view(&self.mem, offset, shape)
            .map_err(run_error("device view"))
    }
}

/// The KV cache's buffers.
///
/// No later block reads the last block's keys and values: with a graph that outputs them
/// (`KvInterface::PastAndNew`) the cache holds the blocks before it, and the last block's passes
/// write theirs into two scratch buffers shared by all layers (a layer's new keys are read by its
/// own attention before the next layer writes; keys and values have one scratch each). A graph
/// that writes them in place reads them from the cache, straight after the earlier blocks': the
/// cache holds every block.
fn kv_buffers(
    alloc: &Allocator,
    d: Dims,
    model: TensorElementType,
    interface: KvInterface,
) -> Result<KvBuffers, GenerateError> {
    let buf = |ty, len| Buf::alloc(alloc, ty, len);
    let in_place = interface == KvInterface::InPlace;
    let cached_blocks = if in_place { d.blocks() } else { d.blocks() - 1 };
    let cache_len = cached_blocks * d.block_tokens() * d.dim;
    let scratch_len = if in_place {
        1
    } else {
        d.block_tokens() * d.dim
    };
    let mut kv_k = Vec::with_capacity(d.layers);
    let mut kv_v = Vec::with_capacity(d.layers);
    for _ in 0..d.layers {
        kv_k.push(buf(model, cache_len.max(1))?);
        kv_v.push(buf(model, cache_len.max(1))?);
    }
    let kv_scratch = [buf(model, scratch_len)?, buf(model, scratch_len)?];
    Ok((kv_k, kv_v, kv_scratch))
}

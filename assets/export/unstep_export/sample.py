"""The generation loop of docs/generation.md, over either the PyTorch reference modules or the
exported ONNX graphs (Python onnxruntime).  Both backends share this one loop, so a parity
difference can only come from the graphs themselves.

Numeric conventions (the runner follows the same ones):
- sigma is computed in float64 from the step and cast to float32 once; the DiT timestep is
  float32(1000 * sigma) computed in float64; every update between DiT passes is float32.
- uint8 = round-half-away-from-zero((clamp(x, -1, 1) + 1) * 127.5) in float32 (Rust's f32::round).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field, asdict

import numpy as np
import torch

from . import noise as noise_mod
from .config import Config
from .text import tokenize_bytes

_TOKENIZERS = {}


def tokenize(cfg: Config, prompt: str):
    """(input_ids, attention_mask), int64 [1, text_len]: with the config's tokenizer.json (the
    umt5 kind, tokenizer.py) when it has one, else the bytes tokenizer."""
    if not cfg.tokenizer:
        return tokenize_bytes(prompt, cfg.text_len)
    key = (cfg.tokenizer, cfg.text_len)
    if key not in _TOKENIZERS:
        from .tokenizer import Tokenizer

        _TOKENIZERS[key] = Tokenizer(cfg.tokenizer, cfg.text_len)
    return _TOKENIZERS[key](prompt)


@dataclass
class Settings:
    denoising_steps: list = field(default_factory=lambda: [1000, 750, 500, 250])
    warp_denoising_steps: bool = True
    timestep_shift: float = 5.0
    clean_sigma: float = 0.02
    emit: str = "cache_pass"  # cache_pass | denoised
    attention_window: int = -1
    seed: int = 0

    def to_dict(self):
        return asdict(self)


def sigma_of(step: float, s: Settings) -> float:
    u = step / 1000.0
    if not s.warp_denoising_steps:
        return u
    return s.timestep_shift * u / (1.0 + (s.timestep_shift - 1.0) * u)


def to_uint8(frames: torch.Tensor) -> torch.Tensor:
    """[1,3,N,H,W] float -> [N,H,W,3] uint8, rounding half away from zero (values are >= 0)."""
    v = (frames.float().clamp(-1.0, 1.0) + 1.0) * 127.5
    fl = torch.floor(v)
    v = fl + ((v - fl) >= 0.5).float()
    return v.to(torch.uint8)[0].permute(1, 2, 3, 0).contiguous()


class Timer:
    """Per-phase wall time; CUDA events on GPU so asynchronous kernels are counted."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.totals = {}
        self._events = []

    def phase(self, name):
        timer = self

        class _P:
            def __enter__(self_):
                if timer.cuda:
                    self_.a = torch.cuda.Event(enable_timing=True)
                    self_.a.record()
                else:
                    self_.t = time.perf_counter()

            def __exit__(self_, *exc):
                if timer.cuda:
                    b = torch.cuda.Event(enable_timing=True)
                    b.record()
                    timer._events.append((name, self_.a, b))
                else:
                    timer.totals[name] = timer.totals.get(name, 0.0) + time.perf_counter() - self_.t

        return _P()

    def result(self):
        if self.cuda:
            torch.cuda.synchronize()
            for name, a, b in self._events:
                self.totals[name] = self.totals.get(name, 0.0) + a.elapsed_time(b) / 1000.0
            self._events = []
        return dict(self.totals)


class TorchBackend:
    def __init__(self, dit, te, vae, device="cpu", dtype=torch.float32, sdpa=None):
        self.device = torch.device(device)
        self.dtype = dtype
        self.dit = dit.to(self.device, dtype)
        # The text encoder stays float32, as in the bundles (UMT5 overflows float16); its context
        # is cast to `dtype` where the DiT takes it.
        self.te = te.to(self.device, torch.float32)
        self.vae = vae.to(self.device, dtype)
        self.sdpa = sdpa  # None | flash | efficient | cudnn | math

    def _sdpa_ctx(self):
        if not self.sdpa:
            return nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        table = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
        return sdpa_kernel([table[self.sdpa]])

    @torch.no_grad()
    def text(self, ids: np.ndarray, mask: np.ndarray) -> torch.Tensor:
        return self.te(torch.from_numpy(ids).to(self.device), torch.from_numpy(mask).to(self.device)).float()

    @torch.no_grad()
    def dit_pass(self, x, t, ctx, offset, past_k, past_v):
        with self._sdpa_ctx():
            ts = torch.full((1, x.shape[2]), t, dtype=torch.float32, device=self.device)
            off = torch.tensor([offset], dtype=torch.int64, device=self.device)
            flow, nk, nv = self.dit(x.to(self.dtype), ts, ctx.to(self.dtype), off,
                                    [p.to(self.dtype) for p in past_k], [p.to(self.dtype) for p in past_v])
        return flow.float(), nk, nv

    @torch.no_grad()
    def vae_frame(self, z, caches):
        out, new = self.vae.decode_frame(z.to(self.dtype), caches)
        return out, new

    def empty_kv(self):
        return torch.zeros(1, 0, self.dit.cfg.dim, dtype=self.dtype, device=self.device)

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()


class OrtBackend:
    """The exported bundle in Python onnxruntime (CPU unless providers say otherwise)."""

    def __init__(self, bundle_dir, cfg: Config, threads=2, providers=None):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        providers = providers or ["CPUExecutionProvider"]
        mk = lambda name: ort.InferenceSession(f"{bundle_dir}/{name}", so, providers=providers)  # noqa: E731
        self.text_s = mk("text_encoder.onnx")
        self.dit_s = mk("dit.onnx")
        self.first_s = mk("vae_first.onnx")
        self.step_s = mk("vae_step.onnx")
        self.cfg = cfg
        self.device = torch.device("cpu")
        self.layers = cfg.layers
        self.n_cache = sum(1 for o in self.first_s.get_outputs() if o.name.startswith("cache_out."))
        self.np_dtype = np.float16 if self.dit_s.get_inputs()[0].type == "tensor(float16)" else np.float32

    def text(self, ids, mask):
        return torch.from_numpy(self.text_s.run(["context"], {"input_ids": ids, "attention_mask": mask})[0]).float()

    def dit_pass(self, x, t, ctx, offset, past_k, past_v):
        feeds = {
            "x": x.numpy().astype(self.np_dtype),
            "timestep": np.full((1, x.shape[2]), t, dtype=np.float32),
            "context": ctx.numpy().astype(self.np_dtype),
            "frame_offset": np.array([offset], dtype=np.int64),
        }
        names = ["flow"]
        for i in range(self.layers):
            feeds[f"past_k.{i}"] = past_k[i].numpy()
            feeds[f"past_v.{i}"] = past_v[i].numpy()
            names += [f"new_k.{i}", f"new_v.{i}"]
        out = self.dit_s.run(names, feeds)
        return (torch.from_numpy(out[0]).float(), [torch.from_numpy(a) for a in out[1::2]],
                [torch.from_numpy(a) for a in out[2::2]])

    def vae_frame(self, z, caches):
        names = ["frames"] + [f"cache_out.{j}" for j in range(self.n_cache)]
        if caches is None:
            out = self.first_s.run(names, {"z": z.numpy().astype(self.np_dtype)})
        else:
            feeds = {"z": z.numpy().astype(self.np_dtype)}
            feeds.update({f"cache_in.{j}": c for j, c in enumerate(caches)})
            out = self.step_s.run(names, feeds)
        return torch.from_numpy(out[0]).float(), out[1:]

    def empty_kv(self):
        return torch.zeros(1, 0, self.cfg.dim, dtype=torch.float16 if self.np_dtype == np.float16 else torch.float32)

    def sync(self):
        pass


def generate(backend, cfg: Config, prompt: str, prompt_index: int, s: Settings):
    """One prompt through the whole loop.  Returns a dict of tensors (CPU) and per-phase seconds."""
    dev = backend.device
    ids, mask = tokenize(cfg, prompt)
    ctx = backend.text(ids, mask)
    backend.sync()

    F, h, w = cfg.frames_per_block, cfg.lat_h, cfg.lat_w
    shape = (1, cfg.latent_channels, F, h, w)
    S = len(s.denoising_steps)
    sig64 = [sigma_of(st, s) for st in s.denoising_steps]
    sig = [np.float32(x) for x in sig64]
    ts = [np.float32(1000.0 * x) for x in sig64]
    sc = np.float32(s.clean_sigma)
    tc = np.float32(1000.0 * float(s.clean_sigma))
    tpf = cfg.tokens_per_frame

    # Every draw is made before the timed region: host-side Philox is not what a GPU timing of
    # the reference should measure (the runner draws its noise on the device).
    nblocks = cfg.latent_frames // F
    draws = {
        (b, k): torch.from_numpy(noise_mod.noise(s.seed, prompt_index, b * (S + 1) + k, shape)).to(dev)
        for b in range(nblocks)
        for k in range(S + 1)
    }

    def draw(b, k):
        return draws[(b, k)]

    backend.sync()
    timer = Timer(dev)
    cache_k = [[] for _ in range(cfg.layers)]
    cache_v = [[] for _ in range(cfg.layers)]
    latents, first_noise = [], None
    ctx_dev = ctx.to(dev)
    with timer.phase("dit"):
        for b in range(nblocks):
            past_k, past_v = [], []
            for i in range(cfg.layers):
                pk = torch.cat(cache_k[i], dim=1) if cache_k[i] else backend.empty_kv()
                pv = torch.cat(cache_v[i], dim=1) if cache_v[i] else backend.empty_kv()
                if s.attention_window >= 0:
                    keep_n = s.attention_window * tpf
                    pk, pv = pk[:, pk.shape[1] - min(keep_n, pk.shape[1]):], pv[:, pv.shape[1] - min(keep_n, pv.shape[1]):]
                past_k.append(pk)
                past_v.append(pv)
            x = draw(b, 0)
            if b == 0:
                first_noise = x.cpu().clone()
            x0 = None
            for j in range(S):
                v, _, _ = backend.dit_pass(x, float(ts[j]), ctx_dev, b * F, past_k, past_v)
                x0 = x - float(sig[j]) * v
                if j < S - 1:
                    nxt = float(sig[j + 1])
                    x = float(np.float32(1.0) - sig[j + 1]) * x0 + nxt * draw(b, j + 1)
            xc = float(np.float32(1.0) - sc) * x0 + float(sc) * draw(b, S)
            vc, nk, nv = backend.dit_pass(xc, float(tc), ctx_dev, b * F, past_k, past_v)
            for i in range(cfg.layers):
                cache_k[i].append(nk[i])
                cache_v[i].append(nv[i])
            latents.append(xc - float(sc) * vc if s.emit == "cache_pass" else x0)
    lat = torch.cat(latents, dim=2)

    mean = torch.tensor(cfg.latent_mean, dtype=torch.float32, device=dev).view(1, -1, 1, 1, 1)
    std = torch.tensor(cfg.latent_std, dtype=torch.float32, device=dev).view(1, -1, 1, 1, 1)
    with timer.phase("vae"):
        z = lat * std + mean
        outs, caches = [], None
        for i in range(z.shape[2]):
            o, caches = backend.vae_frame(z[:, :, i : i + 1], caches)
            outs.append(o.float())
        video = to_uint8(torch.cat(outs, dim=2))
    backend.sync()
    return {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(mask),
        "context": ctx.cpu(),
        "noise_d0": first_noise,
        "latents": lat.cpu(),
        "frames": video.cpu(),
    }, timer.result()

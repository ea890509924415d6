"""Write an asset bundle (docs/bundle.md): three ONNX graphs + text encoder + bundle.toml, and
optionally `dit_fused.onnx`, `vae_first_fused.onnx` and `vae_step_fused.onnx` (the DiT and the
VAE decoder with the runner's own `ai.unstep` operators)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

import onnx
import torch
import torch.nn as nn

from . import EXPORTER_VERSION
from . import fused
from .config import Config

OPSET = 17
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
CUSTOM_OPSETS = {"com.microsoft": 1}
# dit_fused.onnx also uses the runner's own operators (fused.py); their kernels do fp32 and fp16.
FUSED_CUSTOM_OPSETS = {"com.microsoft": 1, fused.UNSTEP_DOMAIN: 1}
# The VAE graphs use no com.microsoft op.
FUSED_VAE_CUSTOM_OPSETS = {fused.UNSTEP_DOMAIN: 1}
FUSED_PRECISIONS = ("fp32", "fp16")


class DitGraph(nn.Module):
    """Flattens the DiT's list arguments into named graph inputs/outputs: (x, timestep, context,
    frame_offset, past_k.0, past_v.0, ...) -> (flow, new_k.0, new_v.0, ...).  With `cache_inputs`
    (dit_fused.onnx) the inputs are (x, timestep, frame_offset, kv_k.0, kv_v.0, ..., ctx_k.0,
    ctx_v.0, ...): the KV cache buffers [1, P + T, D] that the graph fills in place, then the
    cross-attentions' keys and values of the context (dit_context.onnx); `flow` is the only
    output."""

    def __init__(self, dit, cache_inputs: bool = False):
        super().__init__()
        self.dit = dit
        self.layers = len(dit.blocks)
        self.cache_inputs = cache_inputs

    def forward(self, x, timestep, *rest):
        if self.cache_inputs:
            frame_offset, rest = rest[0], rest[1:]
            past, ctx = rest[: 2 * self.layers], rest[2 * self.layers:]
            context = [(k, v) for k, v in zip(ctx[0::2], ctx[1::2])]
        else:
            context, frame_offset, past = rest[0], rest[1], rest[2:]
        past_k = list(past[0::2])
        past_v = list(past[1::2])
        flow, nk, nv = self.dit(x, timestep, context, frame_offset, past_k, past_v)
        out = [flow.to(x.dtype)]
        if self.cache_inputs:
            return out[0]
        for k, v in zip(nk, nv):
            out += [k, v]
        return tuple(out)


class ContextGraph(nn.Module):
    """dit_context.onnx: the text context [1, text_len, text_dim] -> per layer the
    cross-attention's keys and values [1, text_len, D] (`ctx_k.{i}`, `ctx_v.{i}`), which
    dit_fused.onnx takes as inputs: computed once per prompt instead of in every DiT pass."""

    def __init__(self, dit):
        super().__init__()
        self.dit = dit

    def forward(self, context):
        return tuple(t for kv in self.dit.context_kv(context) for t in kv)


class VaeGraph(nn.Module):
    def __init__(self, vae, first: bool):
        super().__init__()
        self.vae = vae
        self.first = first

    def forward(self, z, *caches):
        frames, new = self.vae.decode_frame(z, None if self.first else list(caches))
        return (frames, *new)


class TextGraph(nn.Module):
    """The text encoder in its own dtype, its output cast to the bundle's (`dtype`)."""

    def __init__(self, te, dtype):
        super().__init__()
        self.te = te
        self.dtype = dtype

    def forward(self, input_ids, attention_mask):
        return self.te(input_ids, attention_mask).to(self.dtype)


def _export(module, args, path: Path, input_names, output_names, output_shapes, dynamic_axes=None,
            custom_opsets=None):
    """TorchScript exporter (dynamo=False): it honours autograd.Function.symbolic, which is how
    attention becomes com.microsoft.MultiHeadAttention.  Traced into a temporary directory beside
    `path` (same file system: a graph over 2 GB comes out as one file per tensor there), then
    saved as `path`, with one external data file `<name>.data` for graphs over 2 GB."""
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.stem}.") as tmp:
        tmp_path = Path(tmp) / path.name
        with torch.no_grad():
            torch.onnx.export(
                module, args, str(tmp_path), input_names=input_names, output_names=output_names,
                dynamic_axes=dynamic_axes or {}, opset_version=OPSET, do_constant_folding=True,
                custom_opsets=custom_opsets or CUSTOM_OPSETS, dynamo=False,
            )
        # The graph alone: tensors the exporter wrote beside it stay on disk until _save moves them.
        model = onnx.load(str(tmp_path), load_external_data=False)
        # The TorchScript exporter's shape inference leaves some outputs with made-up symbolic dims
        # (e.g. vae_first's cache_out); the runner reads output shapes from the graph, so write the
        # real, static ones.  No output of any graph depends on the dynamic P axis.
        # (Shapes are known in advance: running a 1.3B model again only to read them is slow on CPU.)
        assert len(output_shapes) == len(model.graph.output)
        for out, shape in zip(model.graph.output, output_shapes):
            dims = out.type.tensor_type.shape.dim
            del dims[:]
            for n in shape:
                dims.add().dim_value = int(n)
        _save(model, path, Path(tmp))
    for f in (path, path.with_name(path.name + ".data")):
        if f.exists():
            os.chmod(f, 0o644)  # the external-data writer creates its file 0600


def _all_tensors(graph):
    """Every TensorProto of a graph: initializers and node attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _all_tensors(a.g)
            for g in a.graphs:
                yield from _all_tensors(g)


EXTERNAL_ALIGN = 4096  # offsets of the tensors in `<name>.data`: page-aligned, for memory mapping


def copy_bytes(src, info, dst) -> int:
    """Appends to `dst` the bytes of external tensor data: `info`'s "offset" and "length" (to the
    end of the file when there is none) in the file `src`, streamed in 16 MiB chunks.  Returns how
    many bytes the file lacked (0 when it held them all)."""
    length = int(info["length"]) if "length" in info else None
    with open(src, "rb") as f:
        f.seek(int(info.get("offset", 0)))
        while length is None or length > 0:
            chunk = f.read(1 << 24 if length is None else min(1 << 24, length))
            if not chunk:
                break
            dst.write(chunk)
            if length is not None:
                length -= len(chunk)
    return length or 0


def _save(model, path: Path, src_dir: Path):
    """Saves `model` as `path` (unlinked first: a hard-linked copy of another bundle keeps that
    bundle's file).  Tensors that the exporter wrote as external files in `src_dir` are streamed,
    one at a time, into `<name>.data` and each source file is deleted once copied, so a 23 GB
    text encoder needs neither its size in memory nor twice its size on disk.  A graph held in
    memory whose tensors are over 1.8 GB (protobuf's limit is 2 GB for the whole file) is saved
    with its tensors in `<name>.data` too."""
    data = path.with_name(path.name + ".data")
    for f in (path, data):
        f.unlink(missing_ok=True)
    tensors = list(_all_tensors(model.graph))
    external = [t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        info = [{e.key: e.value for e in t.external_data} for t in external]
        left = {}
        for i in info:
            left[i["location"]] = left.get(i["location"], 0) + 1
        with open(data, "wb") as dst:
            for t, i in zip(external, info):
                src = src_dir / i["location"]
                dst.write(b"\0" * (-dst.tell() % EXTERNAL_ALIGN))
                start = dst.tell()
                length = copy_bytes(src, i, dst)
                if length:
                    raise OSError(f"{src}: the exporter's external data ends {length} bytes early")
                del t.external_data[:]
                for key, value in (("location", data.name), ("offset", str(start)), ("length", str(dst.tell() - start))):
                    entry = t.external_data.add()
                    entry.key, entry.value = key, value
                left[i["location"]] -= 1
                if not left[i["location"]]:
                    src.unlink()
        onnx.save_model(model, str(path))
        return
    weights = sum(t.ByteSize() for t in tensors)
    if weights > 1_800_000_000:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name)
    else:
        onnx.save_model(model, str(path))


def vae_cache_shapes(vae, cfg: Config, dtype, device="cpu"):
    with torch.no_grad():
        z = torch.zeros(1, cfg.latent_channels, 1, cfg.lat_h, cfg.lat_w, dtype=dtype, device=device)
        _, caches = vae.decode_frame(z, None)
    # Eager decoding keeps Wan's [1, C, T, H, W]; exported graphs keep caches channels-last.
    return [(b, t, h, w, c) for b, c, t, h, w in (tuple(x.shape) for x in caches)]


def export_dit(dit, cfg: Config, out: Path, dtype, device="cpu", fused_ops: bool = False):
    """`dit.onnx`, or with fused_ops `dit_fused.onnx`: the per-row elementwise work in the
    runner's `ai.unstep` operators (fused.py), and instead of `past_*` inputs and `new_*` outputs
    the cache inputs `kv_k.{i}`, `kv_v.{i}` [1, P + T, D] whose last T rows the graph fills in place
    (output `flow` only)."""
    F, T, D, L = cfg.frames_per_block, cfg.frames_per_block * cfg.tokens_per_frame, cfg.dim, cfg.layers
    P = T  # trace with a non-empty past; the P axis is dynamic (0 works at run time)
    x = torch.randn(1, cfg.latent_channels, F, cfg.lat_h, cfg.lat_w, dtype=dtype, device=device)
    ts = torch.full((1, F), 500.0, dtype=torch.float32, device=device)
    ctx = torch.randn(1, cfg.text_len, cfg.text_dim, dtype=dtype, device=device)
    off = torch.tensor([F], dtype=torch.int64, device=device)
    past, in_names, out_names, dyn = [], ["x", "timestep", "context", "frame_offset"], ["flow"], {}
    for i in range(L):
        past += [torch.randn(1, P, D, dtype=dtype, device=device), torch.randn(1, P, D, dtype=dtype, device=device)]
        if fused_ops:
            # The same random past (the standard graph's trace inputs are unchanged), then T rows.
            past[-2:] = [torch.cat([p, torch.zeros(1, T, D, dtype=dtype, device=device)], dim=1) for p in past[-2:]]
            names = [f"kv_k.{i}", f"kv_v.{i}"]
        else:
            names = [f"past_k.{i}", f"past_v.{i}"]
            out_names += [f"new_k.{i}", f"new_v.{i}"]
        in_names += names
        for name in names:
            dyn[name] = {1: "P"}  # dit_fused: the axis is P + T
    shapes = [tuple(x.shape)] + ([] if fused_ops else [(1, T, D)] * (2 * L))
    name, opsets = ("dit_fused.onnx", FUSED_CUSTOM_OPSETS) if fused_ops else ("dit.onnx", None)
    args = (x, ts, ctx, off, *past)
    if fused_ops:
        # The context's keys and values instead of the context: dit_context.onnx computes them
        # once per prompt.
        ctx_names = [n for i in range(L) for n in (f"ctx_k.{i}", f"ctx_v.{i}")]
        ctx_kv = [torch.randn(1, cfg.text_len, D, dtype=dtype, device=device) for _ in ctx_names]
        in_names = [n for n in in_names if n != "context"] + ctx_names
        args = (x, ts, off, *past, *ctx_kv)
        _export(ContextGraph(dit), (ctx,), out / "dit_context.onnx", ["context"], ctx_names,
                [(1, cfg.text_len, D)] * (2 * L))
    with fused.fused_dit() if fused_ops else contextlib.nullcontext():
        _export(DitGraph(dit, cache_inputs=fused_ops), args, out / name, in_names, out_names, shapes, dyn,
                custom_opsets=opsets)


def export_vae(vae, cfg: Config, out: Path, dtype, device="cpu", fused_ops: bool = False):
    """`vae_first.onnx` and `vae_step.onnx`, or with fused_ops `vae_first_fused.onnx` and
    `vae_step_fused.onnx`: the same inputs and outputs, each RMS norm + SiLU as one
    `ai.unstep::BiasRmsNorm` (silu = 1; vae.py, fused.py).  The fused form needs the channels-last
    norm (vae.RMSNorm.export_mode "transpose")."""
    from .vae import RMSNorm

    if fused_ops and RMSNorm.export_mode != "transpose":
        raise ValueError("the fused VAE graphs need --vae-norm transpose")
    suffix = "_fused" if fused_ops else ""
    opsets = FUSED_VAE_CUSTOM_OPSETS if fused_ops else None
    z = torch.randn(1, cfg.latent_channels, 1, cfg.lat_h, cfg.lat_w, dtype=dtype, device=device)
    shapes = vae_cache_shapes(vae, cfg, dtype, device)
    n = len(shapes)
    outs = ["frames"] + [f"cache_out.{j}" for j in range(n)]
    frames = lambda k: (1, 3, k, cfg.height, cfg.width)  # noqa: E731
    with fused.fused_vae() if fused_ops else contextlib.nullcontext():
        _export(VaeGraph(vae, True), (z,), out / f"vae_first{suffix}.onnx", ["z"], outs, [frames(1)] + shapes,
                custom_opsets=opsets)
        caches = [torch.randn(s, dtype=dtype, device=device) for s in shapes]
        _export(VaeGraph(vae, False), (z, *caches), out / f"vae_step{suffix}.onnx",
                ["z"] + [f"cache_in.{j}" for j in range(n)], outs, [frames(4)] + shapes, custom_opsets=opsets)
    return n


def export_text(te, cfg: Config, out: Path, dtype, device="cpu"):
    """`text_encoder.onnx`: the encoder in its own (float32) arithmetic, whatever the bundle's
    precision (UMT5's activations overflow float16; the encoder runs once per prompt, outside the
    timed region), and `context` cast to the bundle's precision at the end of the graph."""
    ids = torch.ones(1, cfg.text_len, dtype=torch.int64, device=device)
    mask = torch.ones(1, cfg.text_len, dtype=torch.int64, device=device)
    _export(TextGraph(te, dtype), (ids, mask), out / "text_encoder.onnx", ["input_ids", "attention_mask"], ["context"],
            [(1, cfg.text_len, cfg.text_dim)])


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _floats(xs):
    return "[" + ", ".join(repr(float(x)) for x in xs) + "]"


TOKENIZER_FILE = "tokenizer.json"  # the tokenizer's name in a bundle, whatever it was called


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return json.dumps(str(v), ensure_ascii=False)  # a TOML basic string: JSON's escapes are TOML's


def tokenizer_table(cfg: Config) -> dict:
    """bundle.toml's [tokenizer]: `umt5` (tokenizer.json in the bundle, Wan's whitespace cleaning;
    tokenizer.py) when the config has a tokenizer, else `bytes`."""
    if cfg.tokenizer:
        return {"kind": "umt5", "file": TOKENIZER_FILE, "clean": "whitespace"}
    return {"kind": "bytes"}


def text_encoder_table(cfg: Config) -> dict:
    """bundle.toml's [text_encoder]: its size and the precision of its arithmetic (always fp32;
    `context` leaves the graph in the bundle's precision)."""
    return {"layers": cfg.text.layers, "vocab": cfg.text.vocab, "precision": "fp32"}


def random_weights() -> dict:
    from .checkpoints import SEED_DIT, SEED_TEXT, SEED_VAE

    return {"dit": {"source": "random", "seed": SEED_DIT}, "vae": {"source": "random", "seed": SEED_VAE},
            "text_encoder": {"source": "random", "seed": SEED_TEXT}}


def write_toml(cfg: Config, out: Path, precision: str, svd_rank, notes: str = "", tokenizer: dict | None = None,
               text_encoder: dict | None = None, weights: dict | None = None, exporter_version: str | None = None):
    """bundle.toml (docs/bundle.md).  `tokenizer`, `text_encoder` and `weights` are its tables of
    those names (defaults: from `cfg`, seeded random weights); [files] lists every other file of
    `out`.  `exporter_version` is this exporter's unless given (quantize keeps the version of the
    exporter that wrote the graphs)."""
    tokenizer = tokenizer or tokenizer_table(cfg)
    text_encoder = text_encoder or text_encoder_table(cfg)
    weights = weights or random_weights()
    files = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != "bundle.toml")
    lines = [
        "# Written by the unstep exporter (assets/export); do not edit by hand.",
    ]
    if notes:
        lines += [f"# {line}" for line in notes.splitlines()]
    lines += [
        "format = 1",
        f'exporter_version = "{exporter_version or EXPORTER_VERSION}"',
        f'preset = "{cfg.preset}"',
        f'precision = "{precision}"',
        "",
        "[architecture]",
        f"dim = {cfg.dim}",
        f"ffn_dim = {cfg.ffn_dim}",
        f"heads = {cfg.heads}",
        f"head_dim = {cfg.head_dim}",
        f"layers = {cfg.layers}",
        f"text_len = {cfg.text_len}",
        f"text_dim = {cfg.text_dim}",
        f"latent_channels = {cfg.latent_channels}",
        f"patch = [{', '.join(map(str, cfg.patch))}]",
        "vae_stride = [4, 8, 8]",
        f"tokens_per_frame = {cfg.tokens_per_frame}",
        "",
        "[export]",
        f"frames_per_block = {cfg.frames_per_block}",
        f"latent_frames = {cfg.latent_frames}",
        f"height = {cfg.height}",
        f"width = {cfg.width}",
        f"svd_rank = {svd_rank if isinstance(svd_rank, int) else chr(34) + 'none' + chr(34)}",
        "",
        "[latent]",
        f"mean = {_floats(cfg.latent_mean)}",
        f"std = {_floats(cfg.latent_std)}",
        "",
        "[tokenizer]",
        *(f"{k} = {_toml_value(v)}" for k, v in tokenizer.items()),
        "",
        "[text_encoder]",
        *(f"{k} = {_toml_value(v)}" for k, v in text_encoder.items()),
        "",
        "[weights]",
    ]
    for part in ("dit", "vae", "text_encoder", "tokenizer"):
        if part in weights:
            lines.append(f"[weights.{part}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in weights[part].items()]
    lines += [
        "",
        "[graphs]",
        'text_encoder = "text_encoder.onnx"',
        'dit = "dit.onnx"',
    ]
    if (out / "dit_fused.onnx").is_file():
        lines.append('dit_fused = "dit_fused.onnx"')
    if (out / "dit_context.onnx").is_file():
        lines.append('dit_context = "dit_context.onnx"')
    lines += [
        'vae_first = "vae_first.onnx"',
        'vae_step = "vae_step.onnx"',
    ]
    for role in ("vae_first_fused", "vae_step_fused"):
        if (out / f"{role}.onnx").is_file():
            lines.append(f'{role} = "{role}.onnx"')
    lines += [
        "",
        "[files]",
    ]
    lines += [f'"{name}" = "{sha256(out / name)}"' for name in files]
    (out / "bundle.toml").write_text("\n".join(lines) + "\n")

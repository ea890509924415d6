"""Seeded random weights in the released files' formats and names (`release-files`), in the layout
of layout.py (what `download` fetches and `export --released` reads), so that the whole
released-weights path (download, checkpoints.py, export, parity) runs without the real files:

    DIR/checkpoints/self_forcing_dmd.pt                       {"generator": {"model." + name: tensor},
                                                               "generator_ema": {...}}, bf16
    DIR/Wan2.1-T2V-1.3B/Wan2.1_VAE.pth                        encoder.*, conv1.*, conv2.*, decoder.*, fp32
    DIR/Wan2.1-T2V-1.3B/models_t5_umt5-xxl-enc-bf16.pth       the T5 encoder, bf16
    DIR/Wan2.1-T2V-1.3B/google/umt5-xxl/tokenizer.json        a copy of the given tokenizer.json

The two DiT entries are one seeded base with two different seeded perturbations, so a bundle of
the wrong entry differs from the right one; biases are non-zero and norm scales away from 1 (the
exporter's own random weights leave them at 0 and 1), so that a loader that drops or mixes up a
tensor shows.  Every tensor has its own generator (seeded from the part's seed and the tensor's
name) and is made, cast and stored one at a time: at full size (wan-1.3b, 24 text layers,
vocabulary 256384: 11.5 GB of bf16 text encoder) the peak is one part's file plus one float32
tensor.  The scales follow the modules' init_random, so activations stay O(1).
"""

from __future__ import annotations

import gc
import math
import shutil
import zlib
from pathlib import Path

import torch

from .checkpoints import EMA_ENTRY, DEFAULT_ENTRY, check_tokenizer
from .config import Config
from .layout import released_paths

UMT5_VOCAB = 256384  # rows of the released UMT5-XXL token embedding (the tokenizer has fewer)
DEFAULT_TOKENIZER = Path(__file__).resolve().parents[2] / "tokenizer" / "tokenizer.json"
# Seeds of the released-format files; unlike the exporter's own (0, 1, 2), so that a bundle made
# from them cannot pass for one with seeded random weights.
SEED_DIT, SEED_DIT_GENERATOR, SEED_DIT_EMA, SEED_TEXT, SEED_VAE = 100, 101, 102, 103, 104


def _randn(shape, seed: int, name: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=g)


def _shapes(make) -> dict:
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in make().state_dict().items()}


def dit_base(name: str, shape) -> torch.Tensor:
    """CausalDiT.init_random's scales, with non-zero biases and norm scales off 1."""
    if name.endswith("modulation"):
        return _randn(shape, SEED_DIT, name) / shape[-1] ** 0.5
    if len(shape) >= 2:
        if name.startswith(("text_embedding", "time_embedding")):
            return _randn(shape, SEED_DIT, name) * 0.02
        fan_out, fan_in = shape[0], math.prod(shape[1:])
        return _randn(shape, SEED_DIT, name) * math.sqrt(2.0 / (fan_in + fan_out))
    if "norm" in name and name.endswith("weight"):
        return 1.0 + 0.1 * _randn(shape, SEED_DIT, name)
    return 0.02 * _randn(shape, SEED_DIT, name)


def text_tensor(name: str, shape, dim: int, heads: int) -> torch.Tensor:
    """TextEncoder.init_random's scales (attention unscaled: q gets (d * hd)^-1/2)."""
    r = _randn(shape, SEED_TEXT, name)
    if name.endswith(("norm1.weight", "norm2.weight")) or name == "norm.weight":
        return 1.0 + 0.1 * r
    if name == "token_embedding.weight":
        return r
    if name.endswith("attn.q.weight"):
        return r * (dim * (dim // heads)) ** -0.5
    if name.endswith("pos_embedding.embedding.weight"):
        return r * 0.5
    return r * shape[1] ** -0.5


def vae_tensor(name: str, shape) -> torch.Tensor:
    """VaeDecoder.init_random's scales (the encoder likewise), biases non-zero, gammas off 1."""
    r = _randn(shape, SEED_VAE, name)
    if name.endswith("gamma"):
        return 1.0 + 0.1 * r
    if len(shape) >= 2:
        return r * (1.0 / math.prod(shape[1:])) ** 0.5
    return 0.02 * r


def write_dit(cfg: Config, path: Path):
    from .model import CausalDiT

    entries = {DEFAULT_ENTRY: {}, EMA_ENTRY: {}}
    for name, shape in _shapes(lambda: CausalDiT(cfg)).items():
        base = dit_base(name, shape)
        scale = 0.05 * float(base.pow(2).mean().sqrt())
        for entry, seed in ((DEFAULT_ENTRY, SEED_DIT_GENERATOR), (EMA_ENTRY, SEED_DIT_EMA)):
            entries[entry]["model." + name] = (base + scale * _randn(shape, seed, name)).to(torch.bfloat16)
        del base
    torch.save(entries, path)


def write_text(cfg: Config, path: Path):
    from .text import TextEncoder

    sd = {name: text_tensor(name, shape, cfg.text.dim, cfg.text.heads).to(torch.bfloat16)
          for name, shape in _shapes(lambda: TextEncoder(cfg.text, cfg.text_len)).items()}
    torch.save(sd, path)


def write_vae(cfg: Config, path: Path):
    from .vae import VaeDecoder
    from .vae_encoder import VaeEncoderHalf

    shapes = {**_shapes(lambda: VaeEncoderHalf(cfg.vae)), **_shapes(lambda: VaeDecoder(cfg.vae))}
    torch.save({name: vae_tensor(name, shape) for name, shape in shapes.items()}, path)


def release_files(cfg: Config, out, text_layers: int | None = None, text_vocab: int | None = None,
                  tokenizer=None, dit_layers: int | None = None) -> dict:
    """Writes the four files under `out` (see the module's docstring) for the preset `cfg`: a DiT
    of `dit_layers` (default the preset's) layers, a text encoder of `text_layers` (default the
    released count: 24 on wan-1.3b) and `text_vocab` rows (default 256384 on wan-1.3b, the
    tokenizer's size otherwise).  Returns {part: path}."""
    tokenizer = Path(tokenizer or DEFAULT_TOKENIZER)
    tok_vocab = check_tokenizer(tokenizer)
    if dit_layers is not None:
        cfg.layers = dit_layers
    cfg.text.layers = text_layers if text_layers is not None else cfg.text.released_layers
    cfg.text.vocab = text_vocab if text_vocab is not None else (UMT5_VOCAB if cfg.preset == "wan-1.3b" else tok_vocab)
    if cfg.text.vocab < tok_vocab:
        raise SystemExit(f"--text-vocab {cfg.text.vocab}: {tokenizer} has {tok_vocab} tokens; the embedding needs a row each")
    paths = released_paths(out)
    for p in paths.values():
        p.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer, paths["tokenizer"])
    for part, write in (("dit", write_dit), ("vae", write_vae), ("text", write_text)):
        write(cfg, paths[part])
        gc.collect()
        print(f"wrote {paths[part]} ({paths[part].stat().st_size / 1e6:.1f} MB)")
    print(f"wrote {paths['tokenizer']} (copy of {tokenizer}, {tok_vocab} tokens)")
    return paths

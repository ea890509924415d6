"""Build the three PyTorch modules of a preset: seeded random weights or a checkpoint."""

from __future__ import annotations

import torch

from .config import Config
from .model import CausalDiT
from .text import TextEncoder
from .vae import VaeDecoder

# Fixed seeds: the tiny bundle and its golden files must be reproducible.
SEED_DIT, SEED_TEXT, SEED_VAE = 0, 1, 2


def _load_state(path: str):
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    sd = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "generator_ema", "generator"):
        if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
            sd = sd[key]
    return sd


def _strip(sd: dict, prefixes=("model.", "module.", "_orig_mod.")):
    out = {}
    for k, v in sd.items():
        changed = True
        while changed:
            changed = False
            for p in prefixes:
                if k.startswith(p):
                    k, changed = k[len(p):], True
        out[k] = v
    return out


def build(cfg: Config, dit_ckpt=None, text_ckpt=None, vae_ckpt=None):
    dit = CausalDiT(cfg).init_random(SEED_DIT)
    te = TextEncoder(cfg.text, cfg.text_len).init_random(SEED_TEXT)
    vae = VaeDecoder(cfg.vae).init_random(SEED_VAE)
    if dit_ckpt:
        dit.load_state_dict(_strip(_load_state(dit_ckpt)), strict=True)
    if text_ckpt:
        te.load_state_dict(_strip(_load_state(text_ckpt)), strict=True)
    if vae_ckpt:
        # A whole WanVAE_ state dict holds the encoder too; keep the decoder side.
        sd = {k: v for k, v in _strip(_load_state(vae_ckpt)).items() if k.startswith(("decoder.", "conv2."))}
        vae.load_state_dict(sd, strict=True)
    return dit.eval(), te.eval(), vae.eval()

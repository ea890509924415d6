"""Build the three PyTorch modules of a preset: seeded random weights or checked checkpoints
(checkpoints.py)."""

from __future__ import annotations

from . import checkpoints
from .checkpoints import SEED_DIT, SEED_TEXT, SEED_VAE  # noqa: F401  (re-exported: the fixed seeds)
from .config import Config


def build(cfg: Config, dit_ckpt=None, text_ckpt=None, vae_ckpt=None):
    """(dit, text encoder, vae decoder).  Each argument is None (seeded random weights), a path
    or a `checkpoints.Part` (a file and its entry, the layer count asked for, the text encoder's
    tokenizer).  `cfg` is fitted in place to what is asked for and what the files hold (the
    DiT's layers, the text encoder's layers and vocabulary, the tokenizer), so that the caller's
    config describes the modules it gets.  Every file is read and checked strictly before any
    module is built; a problem raises checkpoints.CheckpointError."""
    prep = checkpoints.prepare(cfg, checkpoints.as_part(dit_ckpt), checkpoints.as_part(text_ckpt),
                               checkpoints.as_part(vae_ckpt))
    for note in prep.notes:
        print(f"note: {note}")
    return checkpoints.modules(prep)

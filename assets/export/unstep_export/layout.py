"""Where the released files are: in their repositories on the model hub, and in a released folder,
the directory `download --out DIR` fills, `export --released DIR` reads and `release-files --out
DIR` writes seeded stand-ins into:

    DIR/checkpoints/self_forcing_dmd.pt                       gdhe17/Self-Forcing
    DIR/Wan2.1-T2V-1.3B/Wan2.1_VAE.pth                        Wan-AI/Wan2.1-T2V-1.3B
    DIR/Wan2.1-T2V-1.3B/models_t5_umt5-xxl-enc-bf16.pth       Wan-AI/Wan2.1-T2V-1.3B
    DIR/Wan2.1-T2V-1.3B/google/umt5-xxl/tokenizer.json        Wan-AI/Wan2.1-T2V-1.3B

Each repository's files keep their paths in it under one folder of DIR (Self-Forcing's under DIR
itself, Wan2.1's under DIR/Wan2.1-T2V-1.3B), so that huggingface_hub downloads each in place and
its bookkeeping there (resuming, skipping a complete file) holds.  Standard library only: the
download path must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SELF_FORCING_REPO = "gdhe17/Self-Forcing"
WAN_REPO = "Wan-AI/Wan2.1-T2V-1.3B"
# The Self-Forcing checkpoint's path in its repository and in a released folder.
SELF_FORCING_PATH = "checkpoints/self_forcing_dmd.pt"
SELF_FORCING_FILE = "self_forcing_dmd.pt"
# The Wan2.1-T2V-1.3B folder (--wan-dir) in a released folder, and the files of it the exporter
# reads, by part (the tokenizer folder's other files are not read: tokenizer.py).
WAN_DIR = "Wan2.1-T2V-1.3B"
WAN_FILES = {
    "vae": "Wan2.1_VAE.pth",
    "text": "models_t5_umt5-xxl-enc-bf16.pth",
    "tokenizer": "google/umt5-xxl/tokenizer.json",
}


@dataclass(frozen=True)
class ReleasedFile:
    """One file the exporter reads: `repo`'s `path`, which lands at DIR/`folder`/`path`."""
    part: str  # dit, vae, text, tokenizer
    repo: str
    path: str
    folder: str  # under DIR: where `repo`'s paths start

    def local(self, root) -> Path:
        return Path(root) / self.folder / self.path

    def relative(self) -> str:
        return f"{self.folder}/{self.path}" if self.folder else self.path


RELEASED = (
    ReleasedFile("dit", SELF_FORCING_REPO, SELF_FORCING_PATH, ""),
    *(ReleasedFile(part, WAN_REPO, f, WAN_DIR) for part, f in WAN_FILES.items()),
)


def released_paths(root) -> dict:
    """{part: path} of a released folder's files (dit, vae, text, tokenizer)."""
    return {f.part: f.local(root) for f in RELEASED}

"""Presets of the model family (SPEC §6) and the shapes derived from them."""

from __future__ import annotations

from dataclasses import dataclass, field, asdict

# Wan2.1 VAE per-channel latent statistics (as published with Wan2.1): decoded = latent*std + mean.
WAN_LATENT_MEAN = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
]
WAN_LATENT_STD = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
]


@dataclass
class TextConfig:
    """UMT5-style encoder (RMSNorm, relative position bias, gated GELU FFN).  `vocab` and
    `layers` are the preset's defaults for seeded random weights over the bytes tokenizer; a
    checkpoint sets both, a tokenizer sets `vocab` (checkpoints.prepare)."""
    vocab: int = 257            # bytes tokenizer: UTF-8 byte + 1, 0 = padding
    dim: int = 64               # == text_dim
    ffn_dim: int = 128
    heads: int = 2
    layers: int = 2
    num_buckets: int = 32
    max_distance: int = 128
    # The released encoder's layer count (UMT5-XXL: 24): the default of random-weight exports
    # that are given a tokenizer, which are on their way to the released weights.
    released_layers: int = 2


@dataclass
class VaeConfig:
    """Wan2.1 causal VAE decoder."""
    dim: int = 96
    z_dim: int = 16
    dim_mult: tuple = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temporal_upsample: tuple = (True, True, False)


@dataclass
class Config:
    preset: str = "tiny"
    dim: int = 64
    ffn_dim: int = 128
    heads: int = 2
    layers: int = 2
    text_len: int = 32
    text_dim: int = 64
    latent_channels: int = 16
    patch: tuple = (1, 2, 2)
    freq_dim: int = 256
    height: int = 64
    width: int = 112
    latent_frames: int = 21
    frames_per_block: int = 3
    eps: float = 1e-6
    text: TextConfig = field(default_factory=TextConfig)
    vae: VaeConfig = field(default_factory=VaeConfig)
    # tokenizer.json of the umt5 kind (tokenizer.Tokenizer); None: the bytes tokenizer.
    tokenizer: str | None = None
    latent_mean: list = field(default_factory=lambda: list(WAN_LATENT_MEAN))
    latent_std: list = field(default_factory=lambda: list(WAN_LATENT_STD))

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def lat_h(self) -> int:
        return self.height // 8

    @property
    def lat_w(self) -> int:
        return self.width // 8

    @property
    def tokens_per_frame(self) -> int:
        return (self.lat_h // self.patch[1]) * (self.lat_w // self.patch[2])

    @property
    def num_frames(self) -> int:
        return 1 + 4 * (self.latent_frames - 1)

    def to_dict(self):
        return asdict(self)


def preset(name: str) -> Config:
    if name == "tiny":
        return Config(
            preset="tiny", dim=64, ffn_dim=128, heads=2, layers=2, text_len=32, text_dim=64,
            height=64, width=112,
            text=TextConfig(dim=64, ffn_dim=128, heads=2, layers=2),
            vae=VaeConfig(dim=8),
        )
    if name == "wan-1.3b":
        # The text encoder keeps UMT5-XXL's width (4096) and heads (64) but only 2 of its 24
        # layers, so random-weight exports over the bytes tokenizer stay small; the released
        # checkpoint brings its 24 layers and its vocabulary (256384) with it.
        return Config(
            preset="wan-1.3b", dim=1536, ffn_dim=8960, heads=12, layers=30, text_len=512,
            text_dim=4096, height=480, width=832,
            text=TextConfig(vocab=257, dim=4096, ffn_dim=10240, heads=64, layers=2, released_layers=24),
            vae=VaeConfig(dim=96),
        )
    raise SystemExit(f"unknown preset {name!r} (tiny | wan-1.3b)")

"""The parameter skeleton of the Wan2.1 VAE's encoder half: `encoder.*` (Encoder3d) and the
top-level `conv1` of WanVAE_, with Wan's names and shapes.

No graph uses the encoder (text-to-video only decodes), but `Wan2.1_VAE.pth` holds the whole
WanVAE_ state dict, and strict loading checks every tensor of a file: with this skeleton and
vae.py's decoder, the names and shapes of the whole file are known (checkpoints.expected_vae).
release.py also writes random weights for it, so that the released-format VAE file is complete.
The modules have no forward.

Structure (WanVAE_ with dim = VaeConfig.dim, z_dim = 16, dim_mult (1, 2, 4, 4), two residual
blocks per stage, no attention scales, temporal downsampling (False, True, True): the decoder's
temporal upsampling reversed):
- encoder.conv1: causal Conv3d(3, dim, 3);
- encoder.downsamples: per stage i (widths dim * (1, 1, 2, 4, 4)[i] -> [i + 1]) two
  ResidualBlocks, then, except after the last stage, a Resample: `downsample2d` (ZeroPad2d then
  Conv2d(C, C, 3, stride 2), `resample.1`) or `downsample3d` (the same, plus `time_conv`, a causal
  Conv3d(C, C, (3, 1, 1)) with stride 2 in time);
- encoder.middle: ResidualBlock, AttentionBlock (RMS norm, 1x1 Conv2d to q, k, v and back),
  ResidualBlock;
- encoder.head: RMS norm, SiLU, causal Conv3d(4 dim, 2 z_dim, 3) (mean and log-variance);
- conv1: causal Conv3d(2 z_dim, 2 z_dim, 1).
A ResidualBlock is `residual` = (RMS norm, SiLU, Conv3d(cin, cout, 3), RMS norm, SiLU, Dropout,
Conv3d(cout, cout, 3)) and a 1x1x1 Conv3d `shortcut` where cin != cout; an RMS norm has only
`gamma` ([C, 1, 1, 1] on video, [C, 1, 1] on images: Wan's RMS_norm without bias).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .config import VaeConfig


class RmsNorm(nn.Module):
    def __init__(self, dim: int, images: bool = True):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones((dim, 1, 1) if images else (dim, 1, 1, 1)))


class ResidualBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.residual = nn.Sequential(
            RmsNorm(cin, images=False), nn.SiLU(), nn.Conv3d(cin, cout, 3),
            RmsNorm(cout, images=False), nn.SiLU(), nn.Dropout(0.0), nn.Conv3d(cout, cout, 3),
        )
        self.shortcut = nn.Conv3d(cin, cout, 1) if cin != cout else nn.Identity()


class AttentionBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = RmsNorm(dim, images=True)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)


class Downsample(nn.Module):
    def __init__(self, dim: int, temporal: bool):
        super().__init__()
        self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=(2, 2)))
        if temporal:
            self.time_conv = nn.Conv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1))


class Encoder3d(nn.Module):
    def __init__(self, cfg: VaeConfig):
        super().__init__()
        dims = [cfg.dim * u for u in (1,) + tuple(cfg.dim_mult)]
        temporal = tuple(cfg.temporal_upsample)[::-1]
        self.conv1 = nn.Conv3d(3, dims[0], 3)
        layers = []
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            for _ in range(cfg.num_res_blocks):
                layers.append(ResidualBlock(cin, cout))
                cin = cout
            if i != len(cfg.dim_mult) - 1:
                layers.append(Downsample(cout, temporal[i]))
        self.downsamples = nn.Sequential(*layers)
        self.middle = nn.Sequential(ResidualBlock(dims[-1], dims[-1]), AttentionBlock(dims[-1]),
                                    ResidualBlock(dims[-1], dims[-1]))
        self.head = nn.Sequential(RmsNorm(dims[-1], images=False), nn.SiLU(), nn.Conv3d(dims[-1], 2 * cfg.z_dim, 3))


class VaeEncoderHalf(nn.Module):
    """`encoder.*` and `conv1.*` of WanVAE_ (vae.py's VaeDecoder has `conv2.*` and `decoder.*`)."""

    def __init__(self, cfg: VaeConfig):
        super().__init__()
        self.encoder = Encoder3d(cfg)
        self.conv1 = nn.Conv3d(2 * cfg.z_dim, 2 * cfg.z_dim, 1)

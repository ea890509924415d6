"""Wan2.1 causal VAE decoder, decoded one latent frame at a time with an explicit cache.

Parameter names follow Wan2.1's `WanVAE_` (`conv2.*`, `decoder.*`).  Wan keeps, for every
causal convolution, the last two input frames (`feat_cache`); the first call pads with zeros
instead.  Here that cache is a list of tensors, always two frames long (zeros stand for frames
that do not exist yet, which is exactly what Wan's zero padding computes), so the decoder can be
exported as two graphs: `vae_first` (no cache in) and `vae_step` (cache in -> cache out).

Inside `with fused.fused_vae():` the decoder takes the structure of `vae_first_fused` /
`vae_step_fused` (exporter 0.5.0): every RMS norm followed by SiLU is one `ai.unstep::BiasRmsNorm`
with `silu = 1`, and in each ResidualBlock the bias of `conv1` goes into the next such op
(`ResidualBlock.forward_fused`).  From exporter 0.8.0 the upsampling stages also carry the biases
of the convolutions that write their residual stream (`conv2`, the shortcut, the sub-pixel
convolution) instead of adding them: the stored activation lacks a per-channel vector, which the
next `BiasRmsNorm` adds and the stage's last convolution before a `Resample` adds back
(`Decoder3d.forward_carried`), and in `vae_step` each norm + SiLU before a causal convolution is
one `PrefixBiasRmsNorm` that writes the cache frames and the new ones into the convolution's
input, without a Concat (`norm_silu_conv`).  From exporter 0.12.0 every causal convolution
without a bias there is one `ai.unstep::CausalConv3d` on the channels-last layout
(`CausalConv3d._runner_conv`).  Outside it, nothing changes.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import fused
from .config import VaeConfig

CACHE_T = 2


class CacheCtx:
    """Walks the causal convolutions in execution order (Wan's feat_idx order)."""

    def __init__(self, inputs=None):
        self.inputs = inputs  # None on the first latent frame
        self.i = 0
        self.outputs = []

    def take(self):
        old = None if self.inputs is None else self.inputs[self.i]
        self.i += 1
        return old

    def push(self, x, old):
        """Cache for the next call: the last two frames of (old, x), in the cache layout."""
        t = cache_time_axis()
        xc = to_cache_layout(x)
        if x.shape[2] >= CACHE_T:
            new = xc.narrow(t, x.shape[2] - CACHE_T, CACHE_T)
        elif old is None and torch.onnx.is_in_onnx_export():
            # A zero frame in front by concatenation: ONNX Runtime's CUDA Pad is a slow generic
            # kernel (vae_first's 60 Pads took 0.21 s per wan-1.3b video on an H200).
            new = torch.cat([xc * 0.0, xc], dim=t)
        elif old is None:
            new = F.pad(x, (0, 0, 0, 0, 1, 0))
        else:
            new = torch.cat([old.narrow(t, old.shape[t] - 1, 1), xc], dim=t)
        self.outputs.append(new)


# The layout of the cache tensors. Exported graphs keep them channels-last, [1, T, H, W, C]: the
# concatenation with a cache then happens channels-last, where ONNX Runtime's NHWC convolutions
# (the runner's decoder sessions on CUDA) read their input, so its transpose optimizer can drop
# the layout conversions around each cached convolution. Eager PyTorch keeps Wan's [1, C, T, H, W].
# The runner treats the caches as opaque tensors of the shapes `vae_first` declares.
def to_cache_layout(x):
    return x.permute(0, 2, 3, 4, 1) if torch.onnx.is_in_onnx_export() else x


def from_cache_layout(x):
    return x.permute(0, 4, 1, 2, 3) if torch.onnx.is_in_onnx_export() else x


def cache_time_axis() -> int:
    return 1 if torch.onnx.is_in_onnx_export() else 2


class CausalConv3d(nn.Conv3d):
    def __init__(self, cin, cout, kernel, padding=0):
        kernel = (kernel,) * 3 if isinstance(kernel, int) else tuple(kernel)
        padding = (padding,) * 3 if isinstance(padding, int) else tuple(padding)
        super().__init__(cin, cout, kernel, padding=(0, padding[1], padding[2]))
        self.tpad = 2 * padding[0]  # all temporal padding goes in front: causal

    def forward(self, x, cache=None, bias=True):
        """bias=False leaves the bias out (the fused VAE graphs add it in the next op); a tensor
        [cout] is added instead of the convolution's own bias."""
        if self.tpad and cache is None and x.shape[2] == 1 and torch.onnx.is_in_onnx_export():
            # One frame after all-zero padding: only the last temporal tap sees data, so the
            # exported graph convolves with that tap alone (no Pad, a third of the work).
            t = self.kernel_size[0]
            if self.tpad == t - 1:
                if self._runner_conv(bias):
                    return fused.causal_conv3d(x, self.weight[:, :, t - 1 :])
                return F.conv3d(x, self.weight[:, :, t - 1 :], self._bias(bias), padding=self.padding)
        if self.tpad and cache is not None:
            x = from_cache_layout(torch.cat([cache, to_cache_layout(x)], dim=cache_time_axis()))
        elif self.tpad:
            x = F.pad(x, (0, 0, 0, 0, self.tpad, 0))
        return self.convolve_padded(x, bias)

    def _bias(self, bias):
        return bias if torch.is_tensor(bias) else self.bias if bias else None

    def convolve_padded(self, x, bias=True):
        """The convolution of an input that already has its temporal padding (or cache) in front."""
        if self._runner_conv(bias):
            return fused.causal_conv3d(x, self.weight)
        return self._conv_forward(x, self.weight, self._bias(bias))

    def _runner_conv(self, bias) -> bool:
        """Whether the fused graphs write this convolution as `ai.unstep::CausalConv3d` (exporter
        0.12.0): bias-free, stride 1, spatial padding of half the kernel (all of this decoder's)."""
        k = self.kernel_size
        return (
            fused.fused_vae_active()
            and torch.onnx.is_in_onnx_export()
            and self._bias(bias) is None
            and self.stride == (1, 1, 1)
            and self.dilation == (1, 1, 1)
            and tuple(self.padding[1:]) == (k[1] // 2, k[2] // 2)
        )

    def cached(self, x, ctx: CacheCtx, bias=True):
        old = ctx.take()
        ctx.push(x, old)
        return self(x, old, bias=bias)


class RMSNorm(nn.Module):
    """Wan's RMS_norm: L2-normalise over channels, times sqrt(C) and gamma."""

    def __init__(self, dim: int, images: bool = True):
        super().__init__()
        shape = (dim, 1, 1) if images else (dim, 1, 1, 1)
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(shape))

    # How exported graphs normalise (the exporter's --vae-norm): "transpose" puts channels last
    # and uses ONNX Runtime's fused SimplifiedLayerNormalization (x / rms(x) * gamma, equal to
    # F.normalize(x) * sqrt(C) * gamma, float32 inside); "reduce" keeps channels first with a
    # ReduceL2, a division and a multiply.
    export_mode = "transpose"
    # The epsilon of the channels-last forms (SimplifiedLayerNormalization, fused BiasRmsNorm).
    eps = 1e-12

    def forward(self, x, bias=None, silu: bool = False):
        if silu:
            return self.forward_silu(x, bias)
        if torch.onnx.is_in_onnx_export() and self.export_mode == "transpose":
            # A plain channels-last permutation (no reshape between it and the norm), so that
            # with ONNX Runtime's NHWC convolutions (CUDA `prefer_nhwc`) its transpose optimizer
            # cancels these permutations against the ones it wraps around every convolution.
            last = (0,) + tuple(range(2, x.dim())) + (1,)
            first = (0, x.dim() - 1) + tuple(range(1, x.dim() - 1))
            y = fused.rms_norm_op(x.permute(last), self.gamma.reshape(-1).to(x.dtype), self.eps)
            return y.permute(first)
        if torch.onnx.is_in_onnx_export():
            # One reduction and two broadcasts in the graph's precision: ONNX Runtime's ReduceL2
            # accumulates half inputs in float32, and dividing by the norm (not normalising a
            # float32 copy and expanding it) moves the activation once.  The clamp is the
            # smallest normal number of the type (F.normalize's 1e-12 is zero in fp16).
            eps = max(1e-12, torch.finfo(x.dtype).tiny)
            n = torch.linalg.vector_norm(x, 2, dim=1, keepdim=True).clamp_min(eps)
            return x / n * (self.gamma * self.scale).to(x.dtype)
        # float32: a sum of C squares overflows fp16 easily.
        return F.normalize(x.float(), dim=1).type_as(x) * self.scale * self.gamma

    def forward_silu(self, x, bias=None):
        """SiLU(norm(x + bias)) over channels (the fused VAE graphs): one `BiasRmsNorm` with
        `silu = 1` on the channels-last permutation, exactly where the "transpose" form puts its
        SimplifiedLayerNormalization, so the same permutations surround it; `bias` [C] (the bias
        of the convolution before, left out of it) or zeros.  Eager: the op's reference arithmetic."""
        if torch.onnx.is_in_onnx_export() and self.export_mode != "transpose":
            raise ValueError("the fused VAE graphs need the channels-last norm (--vae-norm transpose)")
        c = self.gamma.numel()
        if bias is None:
            bias = torch.zeros(c, dtype=x.dtype, device=x.device)
        last = (0,) + tuple(range(2, x.dim())) + (1,)
        first = (0, x.dim() - 1) + tuple(range(1, x.dim() - 1))
        y = fused.bias_rms_norm_silu(x.permute(last), bias.to(x.dtype), self.gamma.reshape(-1).to(x.dtype), self.eps)
        return y.permute(first)

    def forward_silu_prefixed(self, x, bias, prefix):
        """(cat(prefix, SiLU(norm(x + bias))) along time, its last P frames), channels-last
        ([1, P + T, ..., C] and [1, P, ..., C]): one `PrefixBiasRmsNorm` on the permutation
        `forward_silu` uses; `prefix` is a cache in the cache layout."""
        c = self.gamma.numel()
        if bias is None:
            bias = torch.zeros(c, dtype=x.dtype, device=x.device)
        last = (0,) + tuple(range(2, x.dim())) + (1,)
        p = prefix if torch.onnx.is_in_onnx_export() else prefix.permute(last)
        return fused.prefix_bias_rms_norm_silu(x.permute(last), bias.to(x.dtype), self.gamma.reshape(-1).to(x.dtype),
                                               p, self.eps)


def norm_silu_conv(norm: RMSNorm, conv: CausalConv3d, x, ctx: CacheCtx, norm_bias=None, conv_bias=True):
    """conv.cached(SiLU(norm(x + norm_bias)), ctx, conv_bias) in the fused graphs.  With a cache
    (vae_step), one `PrefixBiasRmsNorm` writes the cache frames and the normed new frames into the
    convolution's input, where a Concat copied both, and the new cache, that input's last two
    frames (as `CacheCtx.push` takes them), as its second output: a Slice of the input would keep
    the whole input alive to the end of the graph, where ONNX Runtime puts the graph's outputs."""
    old = ctx.take()
    if old is None or not conv.tpad:
        y = norm(x, bias=norm_bias, silu=True)
        ctx.push(y, old)
        return conv(y, old, bias=conv_bias)
    y, tail = norm.forward_silu_prefixed(x, norm_bias, old)  # channels-last [1, CACHE_T + T, h, w, C]
    first = (0, y.dim() - 1) + tuple(range(1, y.dim() - 1))
    ctx.outputs.append(tail if torch.onnx.is_in_onnx_export() else tail.permute(first))
    return conv.convolve_padded(y.permute(first), conv_bias)


class ResidualBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.residual = nn.Sequential(
            RMSNorm(cin, images=False), nn.SiLU(), CausalConv3d(cin, cout, 3, padding=1),
            RMSNorm(cout, images=False), nn.SiLU(), nn.Dropout(0.0), CausalConv3d(cout, cout, 3, padding=1),
        )
        self.shortcut = CausalConv3d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, ctx):
        if fused.fused_vae_active():
            return self.forward_fused(x, ctx)
        h = self.shortcut(x)
        for layer in self.residual:
            x = layer.cached(x, ctx) if isinstance(layer, CausalConv3d) else layer(x)
        return x + h

    def forward_fused(self, x, ctx):
        """The same function with both norm + SiLU pairs as one op each; conv1's output only feeds
        norm2, so conv1 goes without its bias and norm2's op adds it."""
        return self.forward_carried(x, ctx, None, materialize=True)[0]

    def forward_carried(self, x, ctx, carry, materialize: bool):
        """`forward_fused` on a stored input that lacks the per-channel vector `carry` [cin] (the
        true input is x + carry; None: nothing missing).  Returns (y, carry'): with
        `materialize`, y is the true output and carry' None; otherwise conv2 and the shortcut go
        without their biases and carry' [cout] is what y lacks.  Exact: norm1 adds `carry` to its
        input, and a 1x1x1 shortcut maps a constant vector to W·carry + b."""
        norm1, _, conv1, norm2, _, _, conv2 = self.residual  # the Dropout(0) is the identity
        if isinstance(self.shortcut, CausalConv3d):
            h = self.shortcut(x, bias=False)
            w = self.shortcut.weight.reshape(self.shortcut.weight.shape[0], -1)
            h_carry = self.shortcut.bias if carry is None else w @ carry + self.shortcut.bias
        else:
            h, h_carry = x, carry
        y = norm_silu_conv(norm1, conv1, x, ctx, norm_bias=carry, conv_bias=False)
        # Weights only: one constant of the exported graph, not a product and sums on every call.
        out_carry = conv2.bias if h_carry is None else fused.frozen(conv2.bias + h_carry)
        if materialize:
            return norm_silu_conv(norm2, conv2, y, ctx, norm_bias=conv1.bias, conv_bias=out_carry) + h, None
        return norm_silu_conv(norm2, conv2, y, ctx, norm_bias=conv1.bias, conv_bias=False) + h, out_carry


class AttentionBlock(nn.Module):
    """Single-head spatial self-attention per frame (plain ops: not a runner-controlled op)."""

    def __init__(self, dim):
        super().__init__()
        self.norm = RMSNorm(dim, images=True)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x, ctx=None):
        identity = x
        b, c, t, h, w = x.shape
        y = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        y = self.norm(y)
        q, k, v = self.to_qkv(y).reshape(b * t, c * 3, h * w).transpose(1, 2).chunk(3, dim=-1)
        attn = torch.softmax((q.float() @ k.float().transpose(1, 2)) * c**-0.5, dim=-1)
        y = (attn @ v.float()).type_as(x).transpose(1, 2).reshape(b * t, c, h, w)
        y = self.proj(y)
        y = y.reshape(b, t, c, h, w).permute(0, 2, 1, 3, 4)
        return y + identity


class Resample(nn.Module):
    """Spatial x2 (nearest + conv halving channels); `upsample3d` also doubles the frames with a
    causal time convolution, skipped on the first latent frame (Wan's 'Rep' cache state)."""

    def __init__(self, dim, mode):
        super().__init__()
        self.mode = mode
        self.resample = nn.Sequential(nn.Upsample(scale_factor=(2.0, 2.0), mode="nearest"), nn.Conv2d(dim, dim // 2, 3, padding=1))
        if mode == "upsample3d":
            self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))

    def forward(self, x, ctx, bias: bool = True):
        """bias=False leaves the bias of the spatial convolution out (Decoder3d.forward_carried
        carries it)."""
        b, c, t, h, w = x.shape
        export = torch.onnx.is_in_onnx_export()
        # Exported graphs work channels-last from here on ([b, t, h, w, c]): the permutation of the
        # input cancels against the one ONNX Runtime's NHWC layout puts after the convolution that
        # wrote it, and the two interleaves (of the time convolution's two frames and of the four
        # sub-pixel phases) each move channel vectors of whole pixels, one Transpose with an
        # unchanged innermost axis, where the channels-first forms made ONNX Runtime transpose
        # every element around them.
        xc = x.permute(0, 2, 3, 4, 1) if export else None
        if self.mode == "upsample3d":
            old = ctx.take()
            if old is None:
                # First latent frame: no time conv, and the next call sees an all-zero cache
                # (Wan: 'Rep' then zero padding).  x * 0 keeps it a computed, not stored, tensor.
                xc0, ta = to_cache_layout(x), cache_time_axis()
                ctx.outputs.append(torch.cat([xc0, xc0], dim=ta).narrow(ta, 2 * t - CACHE_T, CACHE_T) * 0.0)
            else:
                ctx.push(x, old)
                y = self.time_conv(x, old)  # [b, 2c, t, h, w]: channel k * c + i is frame 2t + k
                if export:
                    yc = y.permute(0, 2, 3, 4, 1).reshape(b, t, h, w, 2, c)
                    xc = yc.permute(0, 1, 4, 2, 3, 5).reshape(b, t * 2, h, w, c)
                else:
                    y = y.reshape(b, 2, c, t, h, w)
                    x = torch.stack((y[:, 0], y[:, 1]), dim=3).reshape(b, c, t * 2, h, w)
                t = t * 2
        conv = self.resample[1]
        if export:
            y = subpixel_upsample_conv(conv, xc.reshape(b * t, h, w, c), bias)  # [b t, 2h, 2w, c / 2]
            return y.reshape(b, t, 2 * h, 2 * w, c // 2).permute(0, 4, 1, 2, 3)
        y = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        y = F.conv2d(self.resample[0](y), conv.weight, conv.bias if bias else None, padding=conv.padding)
        return y.reshape(b, t, c // 2, 2 * h, 2 * w).permute(0, 2, 1, 3, 4)


def subpixel_upsample_conv(conv: nn.Conv2d, y: torch.Tensor, bias: bool = True) -> torch.Tensor:
    """conv(nearest_upsample_x2(y)) computed on the low-resolution input, channels-last
    ([n, h, w, ci] -> [n, 2h, 2w, co]): output pixel (2i + p, 2j + q) only ever reads input
    pixels i + (p + d) // 2 for taps d in -1..1, so each of the four output phases (p, q) is a 3x3
    convolution of y with the taps of `conv` summed into the input pixel they land on.  One
    convolution writes the phases as channel blocks p, q (each `co` channels) and a Transpose of
    whole channel vectors interleaves them.  Same result, no upsampled copy of the input and a
    quarter of the pixels to pad and read."""
    w = conv.weight  # [co, ci, 3, 3]
    co = w.shape[0]
    n, h, wd, _ = y.shape
    # fold[p][a][d] = 1 when tap d (0..2 = -1..1) of output phase p reads input offset a (0..2 = -1..1)
    fold = [[[1.0 if (p + d - 1) // 2 + 1 == a else 0.0 for d in range(3)] for a in range(3)] for p in range(2)]
    fold = torch.tensor(fold, dtype=w.dtype, device=w.device)
    # k[p, q, o, i, a, b] = sum_{dy, dx} fold[p, a, dy] * fold[q, b, dx] * w[o, i, dy, dx]
    k = fused.frozen(torch.einsum("pay,qbx,oiyx->pqoiab", fold, fold, w).reshape(4 * co, w.shape[1], 3, 3))
    b = None if conv.bias is None or not bias else fused.frozen(conv.bias.repeat(4))
    phases = F.conv2d(y.permute(0, 3, 1, 2), k, b, padding=1).permute(0, 2, 3, 1)  # [n, h, w, (p, q, co)]
    return phases.reshape(n, h, wd, 2, 2, co).permute(0, 1, 3, 2, 4, 5).reshape(n, 2 * h, 2 * wd, co)


class Decoder3d(nn.Module):
    def __init__(self, cfg: VaeConfig):
        super().__init__()
        dims = [cfg.dim * u for u in [cfg.dim_mult[-1]] + list(cfg.dim_mult[::-1])]
        self.conv1 = CausalConv3d(cfg.z_dim, dims[0], 3, padding=1)
        self.middle = nn.Sequential(ResidualBlock(dims[0], dims[0]), AttentionBlock(dims[0]), ResidualBlock(dims[0], dims[0]))
        ups = []
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            if i in (1, 2, 3):
                cin = cin // 2  # the previous Resample halved the channels
            for _ in range(cfg.num_res_blocks + 1):
                ups.append(ResidualBlock(cin, cout))
                cin = cout
            if i != len(cfg.dim_mult) - 1:
                ups.append(Resample(cout, "upsample3d" if cfg.temporal_upsample[i] else "upsample2d"))
        self.upsamples = nn.Sequential(*ups)
        self.head = nn.Sequential(RMSNorm(dims[-1], images=False), nn.SiLU(), CausalConv3d(dims[-1], 3, 3, padding=1))

    def forward(self, x, ctx: CacheCtx):
        x = self.conv1.cached(x, ctx)
        for layer in self.middle:
            x = layer(x, ctx)
        if fused.fused_vae_active():
            return self.forward_carried(x, ctx)
        for layer in self.upsamples:
            x = layer(x, ctx)
        x = self.head[1](self.head[0](x))
        return self.head[2].cached(x, ctx)

    def forward_carried(self, x, ctx: CacheCtx):
        """The upsampling stages and the head of the fused graphs.  Each stage's residual stream
        is stored without the biases of the convolutions that wrote it; `carry` [C] is what it
        lacks.  The next BiasRmsNorm adds it; the stage's last block before a Resample adds it to
        its conv2's bias (the Resample's convolutions pad with zeros, so a constant does not pass
        through them); the Resample's spatial convolution starts the next stage's carry; the
        head's norm takes the last.  On wan-1.3b this leaves out 13 of the 25 bias adds a
        `vae_step` had (its 39 convolutions less the 14 whose bias a norm already added): every
        one at full resolution but the 3-channel head's, and all but one at half resolution."""
        carry = None
        layers = list(self.upsamples)
        for i, layer in enumerate(layers):
            if isinstance(layer, ResidualBlock):
                before_resample = i + 1 < len(layers) and isinstance(layers[i + 1], Resample)
                x, carry = layer.forward_carried(x, ctx, carry, materialize=before_resample)
            else:
                x, carry = layer(x, ctx, bias=False), layer.resample[1].bias
        return norm_silu_conv(self.head[0], self.head[2], x, ctx, norm_bias=carry)


def carried_bias_convs(vae: nn.Module) -> int:
    """How many convolutions the fused graphs export without a bias because
    `Decoder3d.forward_carried` carries it: every upsampling block's shortcut, every conv2 but
    that of a block followed by a Resample, every Resample's spatial convolution."""
    n = 0
    for dec in (m for m in vae.modules() if isinstance(m, Decoder3d)):
        layers = list(dec.upsamples)
        for i, layer in enumerate(layers):
            if isinstance(layer, Resample):
                n += 1
            else:
                n += isinstance(layer.shortcut, CausalConv3d)
                n += not (i + 1 < len(layers) and isinstance(layers[i + 1], Resample))
    return n


def norm_silu_pairs(vae: nn.Module):
    """(pairs, conv_fed): how many RMS norms are followed by SiLU (each one fused op in the fused
    graphs), and how many of those take their input straight from a causal convolution (whose
    bias the op then adds)."""
    pairs = conv_fed = 0
    for seq in vae.modules():
        if isinstance(seq, nn.Sequential):
            layers = list(seq)
            for i in range(len(layers) - 1):
                if isinstance(layers[i], RMSNorm) and isinstance(layers[i + 1], nn.SiLU):
                    pairs += 1
                    conv_fed += i > 0 and isinstance(layers[i - 1], CausalConv3d)
    return pairs, conv_fed


class VaeDecoder(nn.Module):
    """`conv2` (1x1x1 on the latent) + Decoder3d, as in WanVAE_.decode."""

    def __init__(self, cfg: VaeConfig):
        super().__init__()
        self.cfg = cfg
        self.conv2 = CausalConv3d(cfg.z_dim, cfg.z_dim, 1)
        self.decoder = Decoder3d(cfg)

    def init_random(self, seed: int) -> "VaeDecoder":
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("gamma"):
                p.data = torch.ones_like(p)
            elif p.dim() >= 2:
                fan_in = p[0].numel()
                p.data = torch.randn(p.shape, generator=g) * (1.0 / fan_in) ** 0.5
            else:
                p.data = torch.zeros_like(p)
        return self

    def decode_frame(self, z, caches=None):
        """z [1,16,1,h,w] (de-normalised).  Returns frames [1,3,n,H,W] and the new cache list."""
        ctx = CacheCtx(caches)
        out = self.decoder(self.conv2(z), ctx)
        return out, ctx.outputs

    def decode(self, z):
        """Whole clip [1,16,T,h,w] -> [1,3,1+4(T-1),H,W], frame by frame like the runner."""
        outs, caches = [], None
        for i in range(z.shape[2]):
            o, caches = self.decode_frame(z[:, :, i : i + 1], caches)
            outs.append(o)
        return torch.cat(outs, dim=2)

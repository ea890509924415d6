"""Reference causal DiT of the Wan2.1 / Self-Forcing family (one block-causal pass).

Parameter names follow Wan2.1's `WanModel` state dict so real checkpoints load unchanged.
The block-causal part (per-frame modulation, RoPE time offset, KV cache as explicit tensors)
follows Self-Forcing's CausalWanModel, reshaped so that the runner owns the cache buffers:
a pass takes the keys/values of earlier blocks (`past_k/v`, already RMS-normed and rotated)
and returns its own (`new_k/v`).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import fused
from .attention import attention
from .config import Config


class RMSNorm(nn.Module):
    """WanRMSNorm: normalise in float32 (fp16 squares overflow), then scale."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return fused.rms_norm(x, self.weight, self.eps)


class LayerNorm(nn.LayerNorm):
    """WanLayerNorm: LayerNorm evaluated in float32.  Exported graphs apply LayerNormalization to
    the half-precision input directly: ONNX Runtime accumulates in float32 (`stash_type` 1)."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = False):
        super().__init__(dim, eps=eps, elementwise_affine=elementwise_affine)

    def forward(self, x):
        if fused.exporting():
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        w = self.weight.float() if self.weight is not None else None
        b = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).type_as(x)


def sinusoidal_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Wan's sinusoidal_embedding_1d: [cos | sin] of t * 10000^(-i/half)."""
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float32, device=t.device) / half)
    s = t.float().unsqueeze(-1) * freqs
    return torch.cat([torch.cos(s), torch.sin(s)], dim=-1)


def rope_split(head_dim: int):
    """Head-dim split of Wan's 3D RoPE into (time, height, width): 44/42/42 for 128."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def inv_freqs(axis_dim: int) -> torch.Tensor:
    return 1.0 / torch.pow(10000.0, torch.arange(0, axis_dim, 2, dtype=torch.float64) / axis_dim)


class AttentionProjections(nn.Module):
    """q/k/v/o projections and the q/k RMS norms of one attention (Wan's parameter names)."""

    def __init__(self, dim: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, eps)
        self.norm_k = RMSNorm(dim, eps)


class SelfAttention(AttentionProjections):
    def forward(self, x, cos, sin, past_k, past_v):
        if fused.fused_dit_active():
            return self.forward_fused(x, cos, sin, past_k, past_v)
        q = fused.rope(self.norm_q(self.q(x)), cos, sin, self.heads)
        k = fused.rope(self.norm_k(self.k(x)), cos, sin, self.heads)
        value, output = fused.value_and_output(self.v, self.o)
        v = value(x)
        # No mask: the block sees every earlier block (past) and all of itself.
        kk = torch.cat([past_k, k], dim=1)
        vv = torch.cat([past_v, v], dim=1)
        return output(attention(q, kk, vv, self.heads)), k, v

    def forward_fused(self, x, cos, sin, past_k, past_v):
        """dit_fused: q, k, v as one bias-free projection QKV = x [Wq | Wk | Wv]^T, then one
        QkvNormRopeCache (q/k bias + RMS norm + RoPE; k and v written into the cache).  Exporting,
        past_k/past_v are the graph's cache inputs [1, P + T, D] and the attention reads them as
        they are (the op fills their last T rows); eager, they are the past [1, P, D] and the
        attention reads concat(past, new) as in `forward`.  Returns the bias-free output projection,
        its (folded) bias for the next GatedResidualLayerNorm, and the block's k, v (None when
        exporting: they are the last T rows of the cache inputs)."""
        if self.norm_q.eps != self.norm_k.eps:
            raise ValueError(f"QkvNormRopeCache has one epsilon: norm_q {self.norm_q.eps}, norm_k {self.norm_k.eps}")
        qkv_lin, q_bias, k_bias, output, o_bias = fused.qkv_parts(self.q, self.k, self.v, self.o)
        q, kk, vv, k, v = fused.qkv_norm_rope_cache(qkv_lin(x), q_bias, k_bias, self.norm_q.weight, self.norm_k.weight,
                                                    cos, sin, past_k, past_v, self.norm_q.eps, self.heads)
        return output(fused.self_attention(q, kk, vv, self.heads)), o_bias, k, v


class CrossAttention(AttentionProjections):
    def forward(self, x, context):
        """context: the embedded text context; in the structure of dit_fused (`fused.fused_dit()`,
        where `Block.forward_fused` calls it) its (keys, values) from `context_kv`."""
        if fused.fused_dit_active():
            return self.forward_fused(x, context)
        q = self.norm_q(self.q(x))
        k = self.norm_k(self.k(context))
        value, output = fused.value_and_output(self.v, self.o)
        return output(attention(q, k, value(context), self.heads))

    def context_kv(self, context):
        """The keys and values of the (embedded) text context: k = norm_k(context W_k + b_k) and
        the values without the bias `value_and_output_parts` folds into the output's.  They depend
        on the prompt alone, so dit_fused takes them as inputs (`ctx_k.{i}`, `ctx_v.{i}`) and
        dit_context.onnx computes them once per prompt."""
        value, _, _ = fused.value_and_output_parts(self.v, self.o)
        return self.norm_k(self.k(context)), value(context)

    def forward_fused(self, x, context_kv):
        """dit_fused: q as one BiasRmsNorm after a bias-free projection, against the context's
        keys and values (`context_kv`).  Returns the bias-free output projection and its (folded)
        bias."""
        q_lin, q_bias = fused.linear_parts(self.q)
        q = fused.bias_rms_norm(q_lin(x), q_bias, self.norm_q.weight, self.norm_q.eps)
        k, v = context_kv
        _, output, o_bias = fused.value_and_output_parts(self.v, self.o)
        return output(attention(q, k, v, self.heads)), o_bias


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        dim = cfg.dim
        self.norm1 = LayerNorm(dim, cfg.eps)
        self.self_attn = SelfAttention(dim, cfg.heads, cfg.eps)
        self.norm3 = LayerNorm(dim, cfg.eps, elementwise_affine=True)
        self.cross_attn = CrossAttention(dim, cfg.heads, cfg.eps)
        self.norm2 = LayerNorm(dim, cfg.eps)
        self.ffn = nn.Sequential(nn.Linear(dim, cfg.ffn_dim), fused.GeluTanh(), nn.Linear(cfg.ffn_dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(self, x, e0, context, cos, sin, past_k, past_v, frames: int, fused_args=None):
        if fused_args is not None:  # dit_fused (CausalDiT._blocks_fused); e0 is then unused
            return self.forward_fused(x, *fused_args, context, cos, sin, past_k, past_v, frames)
        # e0: [1, F, 6, D]; every token of frame f gets frame f's shift/scale/gate.
        e = self.modulation_chunks(e0)

        def per_frame(y):
            return y.unflatten(1, (frames, -1))

        def modulated(norm, y, scale, shift):
            return fused.modulated_layer_norm(per_frame(y), 1 + scale, shift, norm.eps, norm).flatten(1, 2)

        y = self.input_norm(x, e, frames)
        y, k, v = self.self_attn(y, cos, sin, past_k, past_v)
        x = x + (per_frame(y) * e[2]).flatten(1, 2)
        x = x + self.cross_attn(self.norm3(x), context)
        y = fused.ffn(self.ffn, modulated(self.norm2, x, e[4], e[3]))
        x = x + (per_frame(y) * e[5]).flatten(1, 2)
        return x, k, v

    def modulation_chunks(self, e0):
        """(shift, scale, gate, shift, scale, gate) of norm1/self-attn and norm2/FFN, [1, F, 1, D] each."""
        return (self.modulation.unsqueeze(1) + e0).chunk(6, dim=2)

    def input_norm(self, x, e, frames: int):
        """norm1(x) * (1 + scale) + shift: one LayerNormalization (layer 0 of dit_fused only; every
        later input norm is the second output of the previous layer's last GatedResidualLayerNorm)."""
        y = fused.modulated_layer_norm(x.unflatten(1, (frames, -1)), 1 + e[1], e[0], self.norm1.eps, self.norm1)
        return y.flatten(1, 2)

    def forward_fused(self, x, y, e, next_scale, next_shift, next_eps: float, context_kv, cos, sin, past_k, past_v,
                      frames: int):
        """The structure of dit_fused.onnx.  x: residual stream; y: this layer's modulated input
        norm, computed by the previous layer's last op (None for layer 0: one LayerNormalization
        here); e: this layer's modulation chunks; next_*: the scale, shift and eps of the norm that
        follows this layer (the next layer's norm1, or the head's); context_kv: the cross-attention's
        keys and values of the text context.
        Returns (residual, the next modulated input norm, new k, new v); exporting, past_k/past_v
        are the cache inputs [1, P + T, D] that the graph fills, and new k, v are None."""
        if y is None:
            y = self.input_norm(x, e, frames)
        o, o_bias, k, v = self.self_attn(y, cos, sin, past_k, past_v)
        # x + (o + b_o) * gate, and norm3 (affine) of that for the cross-attention
        x, y = fused.gated_residual_layer_norm(x, o, o_bias, e[2], self.norm3.weight, self.norm3.bias, self.norm3.eps)
        o, o_bias = self.cross_attn(y, context_kv)
        ones = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)  # the cross-attention is not gated
        x, y = fused.gated_residual_layer_norm(x, o, o_bias, ones, 1 + e[4], e[3], self.norm2.eps)
        second, b2 = fused.linear_parts(self.ffn[2])
        f = second(fused.ffn_hidden(self.ffn, y))
        x, y = fused.gated_residual_layer_norm(x, f, b2, e[5], next_scale, next_shift, next_eps)
        return x, y, k, v


class Head(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        dim = cfg.dim
        self.norm = LayerNorm(dim, cfg.eps)
        self.head = nn.Linear(dim, cfg.latent_channels * math.prod(cfg.patch))
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)

    def forward(self, x, e, frames: int):
        # e: [1, F, D] -> [1, F, 2, D]
        m = self.modulation_chunks(e)
        y = self.norm(x).unflatten(1, (frames, -1)) * (1 + m[1]) + m[0]
        return self.head(y.flatten(1, 2))

    def modulation_chunks(self, e):
        """(shift, scale) of the head's norm, [1, F, 1, D] each."""
        return (self.modulation.unsqueeze(1) + e.unsqueeze(2)).chunk(2, dim=2)


class CausalDiT(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        dim = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.latent_channels, dim, kernel_size=cfg.patch, stride=cfg.patch)
        self.text_embedding = nn.Sequential(nn.Linear(cfg.text_dim, dim), fused.GeluTanh(), nn.Linear(dim, dim))
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.head = Head(cfg)

        # RoPE tables.  Height/width angles are fixed by the export shape; the time angles depend
        # on frame_offset, which is a graph input, so only their inverse frequencies are stored.
        ct, ch, cw = rope_split(cfg.head_dim)
        hp, wp = cfg.lat_h // cfg.patch[1], cfg.lat_w // cfg.patch[2]
        self.register_buffer("rope_inv_t", inv_freqs(ct).float(), persistent=False)
        ah = torch.arange(hp, dtype=torch.float64)[:, None] * inv_freqs(ch)
        aw = torch.arange(wp, dtype=torch.float64)[:, None] * inv_freqs(cw)
        hw = torch.cat([ah[:, None, :].expand(hp, wp, -1), aw[None, :, :].expand(hp, wp, -1)], dim=-1)
        self.register_buffer("rope_hw", hw.reshape(hp * wp, -1).float(), persistent=False)

    def init_random(self, seed: int) -> "CausalDiT":
        """Seeded random weights with bounded activations (Wan's init, but a non-zero head so the
        flow prediction is not trivially zero)."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("modulation"):
                p.data = torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
            elif p.dim() >= 2:
                fan_out, fan_in = p.shape[0], p[0].numel()
                bound = math.sqrt(6.0 / (fan_in + fan_out))  # xavier uniform
                if name.startswith(("text_embedding", "time_embedding")):
                    p.data = torch.randn(p.shape, generator=g) * 0.02
                else:
                    p.data = (torch.rand(p.shape, generator=g) * 2 - 1) * bound
            elif "norm" in name and name.endswith("weight"):
                p.data = torch.ones_like(p)
            else:
                p.data = torch.zeros_like(p)
        return self

    def rope(self, frame_offset: torch.Tensor, frames: int):
        tpf = self.rope_hw.shape[0]
        pos_t = frame_offset.float().reshape(1) + torch.arange(frames, dtype=torch.float32, device=frame_offset.device)
        at = pos_t[:, None] * self.rope_inv_t  # [F, ct/2]
        at = at[:, None, :].expand(frames, tpf, at.shape[-1])
        hw = self.rope_hw[None].expand(frames, tpf, self.rope_hw.shape[-1])
        ang = torch.cat([at, hw], dim=-1).reshape(frames * tpf, -1)
        return torch.cos(ang), torch.sin(ang)

    def context_kv(self, context):
        """[(k, v)] per layer: the cross-attentions' keys and values of the text context
        [1, text_len, text_dim] (`CrossAttention.context_kv`), each [1, text_len, D]."""
        ctx = self.text_embedding(context.to(self.patch_embedding.weight.dtype))
        return [blk.cross_attn.context_kv(ctx) for blk in self.blocks]

    def forward(self, x, timestep, context, frame_offset, past_k, past_v):
        """x [1,16,F,h,w]; timestep float32 [1,F]; context [1,text_len,text_dim], or in the
        structure of dit_fused (`fused.fused_dit()`) optionally its `context_kv` list;
        frame_offset int64 [1]; past_k/past_v: lists of [1,P,D].  Returns flow and new k/v lists."""
        cfg = self.cfg
        frames = x.shape[2]
        hp, wp = x.shape[3] // cfg.patch[1], x.shape[4] // cfg.patch[2]
        dtype = self.patch_embedding.weight.dtype

        h = self.patch_embedding(x.to(dtype)).flatten(2).transpose(1, 2)  # [1, F*hp*wp, D]
        e = self.time_embedding(sinusoidal_embedding(timestep, cfg.freq_dim).to(dtype))  # [1,F,D]
        e0 = self.time_projection(e).unflatten(2, (6, cfg.dim))  # [1,F,6,D]
        cos, sin = self.rope(frame_offset, frames)

        new_k, new_v = [], []
        if fused.fused_dit_active():
            ctx_kv = context if isinstance(context, (list, tuple)) else self.context_kv(context)
            out, new_k, new_v = self._blocks_fused(h, e, e0, ctx_kv, cos, sin, past_k, past_v, frames)
        else:
            ctx = self.text_embedding(context.to(dtype))
            for i, blk in enumerate(self.blocks):
                h, k, v = blk(h, e0, ctx, cos, sin, past_k[i], past_v[i], frames)
                new_k.append(k)
                new_v.append(v)

            out = self.head(h, e, frames)  # [1, F*hp*wp, 16*pt*ph*pw]
        pt, ph, pw = cfg.patch
        c = cfg.latent_channels
        out = out.view(1, frames, hp, wp, pt, ph, pw, c)
        out = out.permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(1, c, frames * pt, hp * ph, wp * pw)
        return out, new_k, new_v

    def _blocks_fused(self, h, e, e0, ctx_kv, cos, sin, past_k, past_v, frames: int):
        """The blocks and head in the structure of dit_fused.onnx (fused.fused_dit): each norm
        after layer 0's input norm is computed by the GatedResidualLayerNorm of the residual before
        it, the last one with the head's modulation and eps; layer i's cross-attention reads the
        context's keys and values ctx_kv[i]."""
        chunks = [blk.modulation_chunks(e0) for blk in self.blocks]
        head = self.head.modulation_chunks(e)
        y = None  # layer 0 computes its own input norm
        new_k, new_v = [], []
        for i, blk in enumerate(self.blocks):
            if i + 1 < len(self.blocks):
                nxt = chunks[i + 1]
                scale, shift, eps = 1 + nxt[1], nxt[0], self.blocks[i + 1].norm1.eps
            else:
                scale, shift, eps = 1 + head[1], head[0], self.head.norm.eps
            # Called as a module, so that the graph's node names keep the /dit/blocks.{i}/ scope.
            h, y, k, v = blk(h, e0, ctx_kv[i], cos, sin, past_k[i], past_v[i], frames,
                             fused_args=(y, chunks[i], scale, shift, eps))
            new_k.append(k)
            new_v.append(v)
        return self.head.head(y), new_k, new_v


class LowRankLinear(nn.Module):
    """W ≈ B·A with rank r (the `--svd-rank` export option)."""

    def __init__(self, lin: nn.Linear, rank: int):
        super().__init__()
        w = lin.weight.data.float()
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        r = min(rank, s.shape[0])
        sq = s[:r].sqrt()
        self.a = nn.Linear(w.shape[1], r, bias=False)
        self.b = nn.Linear(r, w.shape[0], bias=lin.bias is not None)
        self.a.weight.data = (vh[:r] * sq[:, None]).to(lin.weight.dtype)
        self.b.weight.data = (u[:, :r] * sq[None, :]).to(lin.weight.dtype)
        if lin.bias is not None:
            self.b.bias.data = lin.bias.data.clone()

    def forward(self, x):
        return self.b(self.a(x))


def factorise(model: CausalDiT, rank: int) -> int:
    """Replace the linear layers inside the DiT blocks by rank-`rank` factors where that is smaller."""
    count = 0
    for blk in model.blocks:
        for parent in (blk.self_attn, blk.cross_attn, blk.ffn):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear) and rank * (child.in_features + child.out_features) < child.in_features * child.out_features:
                    setattr(parent, name, LowRankLinear(child, rank))
                    count += 1
    return count

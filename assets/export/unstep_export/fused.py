"""Fused ONNX Runtime ops for the exported graphs.

Eager PyTorch (the reference) keeps Wan's arithmetic: norms and RoPE in float32 with casts
around them.  Exported graphs instead carry one fused op per step, in the graph's own precision,
so that the runner moves each activation once per step instead of five to ten times:

- RMS norm of q/k    -> `SimplifiedLayerNormalization` (ONNX Runtime, default domain; it
                        accumulates in float32 for fp16 inputs, `stash_type` 1);
- 3D RoPE            -> `com.microsoft.RotaryEmbedding` (interleaved pairs, like Wan's complex
                        multiply; the per-token angles are the cos/sin cache, positions start at 0);
- GELU (tanh form)   -> `com.microsoft.FastGelu` (the same tanh formula).

Each function's eager forward is the reference arithmetic, so a model behaves the same whether
or not it is being exported; only the graph differs.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def exporting() -> bool:
    return torch.onnx.is_in_onnx_export()


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return y.type_as(x) * weight


class _RmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps: float):  # noqa: D401 - torch.autograd API
        return rms_norm_reference(x, weight, eps)

    @staticmethod
    def symbolic(g, x, weight, eps: float):
        out = g.op("SimplifiedLayerNormalization", x, weight, axis_i=-1, epsilon_f=float(eps), stash_type_i=1)
        out.setType(x.type())
        return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if exporting():
        return _RmsNorm.apply(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm over the last axis as one SimplifiedLayerNormalization (export only)."""
    return _RmsNorm.apply(x, weight, eps)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """Rotate consecutive pairs (x[2i], x[2i+1]) like Wan's complex multiply; cos/sin are [T, hd/2]."""
    b, t, d = x.shape
    xf = x.float().view(b, t, heads, d // heads // 2, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    c = cos.float().unsqueeze(1)
    s = sin.float().unsqueeze(1)
    out = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1)
    return out.reshape(b, t, d).type_as(x)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, heads: int):  # noqa: D401 - torch.autograd API
        return rope_reference(x, cos, sin, heads)

    @staticmethod
    def symbolic(g, x, cos, sin, heads: int):
        # position_ids of shape [1] is the first position; token i uses row i of the caches.
        start = g.op("Constant", value_t=torch.tensor([0], dtype=torch.int64))
        out = g.op("com.microsoft::RotaryEmbedding", x, start, cos, sin, interleaved_i=1, num_heads_i=int(heads))
        out.setType(x.type())
        return out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    if exporting():
        return _Rope.apply(x, cos.to(x.dtype), sin.to(x.dtype), heads)
    return rope_reference(x, cos, sin, heads)


class _FastGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # noqa: D401 - torch.autograd API
        return F.gelu(x, approximate="tanh")

    @staticmethod
    def symbolic(g, x):
        out = g.op("com.microsoft::FastGelu", x)
        out.setType(x.type())
        return out


class GeluTanh(nn.Module):
    """`nn.GELU(approximate="tanh")`, exported as one FastGelu op (no parameters, so state-dict
    names around it are unchanged)."""

    def forward(self, x):
        if exporting():
            return _FastGelu.apply(x)
        return F.gelu(x, approximate="tanh")


class _FastGeluBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias):  # noqa: D401 - torch.autograd API
        return F.gelu(x + bias, approximate="tanh")

    @staticmethod
    def symbolic(g, x, bias):
        out = g.op("com.microsoft::FastGelu", x, bias)
        out.setType(x.type())
        return out


def ffn(seq: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """Linear -> GELU(tanh) -> Linear; exported graphs add the first bias inside FastGelu instead
    of as a separate pass over the [tokens, ffn_dim] activation."""
    first, _, last = seq
    if exporting() and isinstance(first, nn.Linear) and first.bias is not None:
        return last(_FastGeluBias.apply(F.linear(x, first.weight), first.bias))
    return seq(x)


def value_and_output(v: nn.Module, o: nn.Module):
    """The value and output projections of an attention.  Exported graphs drop the value bias b_v
    and add W_o·b_v to the output bias: every attention row is a convex combination of values
    (softmax weights sum to 1), so attention(q, k, v + b_v) = attention(q, k, v) + b_v exactly.
    The keys/values a graph returns for the KV cache are then bias-free too, consistently."""
    if exporting() and isinstance(v, nn.Linear) and isinstance(o, nn.Linear) and v.bias is not None:
        bias = F.linear(v.bias, o.weight) + (o.bias if o.bias is not None else 0)
        return (lambda x: F.linear(x, v.weight)), (lambda y: F.linear(y, o.weight, bias))
    return v, o


class _ModulatedLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, shift, eps: float):  # noqa: D401 - torch.autograd API
        y = F.layer_norm(x.float(), x.shape[-1:], eps=eps).type_as(x)
        return y * scale + shift

    @staticmethod
    def symbolic(g, x, scale, shift, eps: float):
        out = g.op("LayerNormalization", x, scale, shift, axis_i=-1, epsilon_f=float(eps))
        out.setType(x.type())
        return out


def modulated_layer_norm(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float, norm) -> torch.Tensor:
    """norm(x) * scale + shift with per-frame scale/shift: x [1, F, T, D], scale/shift
    [1, F, 1, D].  Exported graphs make it one LayerNormalization whose scale and bias broadcast
    over the frame's tokens (ONNX Runtime accepts broadcastable scale/bias), instead of a norm,
    a multiply and an add over the whole activation."""
    if exporting() and norm.weight is None:
        return _ModulatedLayerNorm.apply(x, scale, shift, eps)
    return norm(x) * scale + shift

"""Fused ONNX Runtime ops for the exported graphs.

Eager PyTorch (the reference) keeps Wan's arithmetic: norms and RoPE in float32 with casts
around them.  Exported graphs instead carry one fused op per step, in the graph's own precision,
so that the runner moves each activation once per step instead of five to ten times:

- RMS norm of q/k    -> `SimplifiedLayerNormalization` (ONNX Runtime, default domain; it
                        accumulates in float32 for fp16 inputs, `stash_type` 1);
- 3D RoPE            -> `com.microsoft.RotaryEmbedding` (interleaved pairs, like Wan's complex
                        multiply; the per-token angles are the cos/sin cache, positions start at 0);
- GELU (tanh form)   -> `com.microsoft.FastGelu` (the same tanh formula; `dit_fused.onnx` writes
                        the FFN's as `ai.unstep::BiasGelu`, below).

Each function's eager forward is the reference arithmetic, so a model behaves the same whether
or not it is being exported; only the graph differs.

A second DiT graph, `dit_fused.onnx` (exporter 0.4.0; 0.6.0 for its KV-cache interface, 0.7.0
for `BiasGelu`), goes further with the runner's own operators of the domain `ai.unstep` (opset 1),
implemented by the Rust runner and not by ONNX Runtime (docs/bundle.md, "Operators of the fused
graphs"):

- `QkvNormRopeCache(QKV, q_bias, k_bias, q_weight, k_weight, cos, sin, K, V) -> Q`
                                                  self-attention: q/k bias + RMS norm + 3D RoPE of
                                                  one q|k|v projection, with k and v written in
                                                  place into the cache buffers K, V the attention
                                                  reads (no concatenation of the cache);
- `BiasRmsNormRope(X, bias, weight, cos, sin)`   q/k: linear bias + RMS norm + 3D RoPE (in the
                                                  graphs of exporter 0.4.0 and 0.5.0);
- `BiasRmsNorm(X, bias, weight)`                  cross-attention q: linear bias + RMS norm;
- `GatedResidualLayerNorm(R, X, bias, gate, scale, shift) -> (S, Y)`
                                                  residual + gated (biased) branch, and the next
                                                  modulated LayerNorm of the new residual;
- `BiasGelu(X, bias) -> Y`                        FFN: first linear bias + GELU (tanh form), in
                                                  place of `com.microsoft.FastGelu(X, bias)`
                                                  (exporter 0.7.0 and 0.8.0; from 0.9.0 only after
                                                  `--svd-rank` factors);
- `MatMulBiasGelu(X, W, bias) -> Y`               FFN: its whole first linear layer (W the
                                                  layer's [out, in] weight) + GELU (exporter
                                                  0.9.0): one cuBLASLt matmul with a bias-GELU
                                                  epilogue in the runner;
- `Attention(Q, K, V) -> O`                       self-attention over the cache (exporter 0.10.0;
                                                  `com.microsoft.MultiHeadAttention` before): the
                                                  runner's kernel, cuDNN's flash attention with
                                                  a partial last wave split over the keys.
- `CausalConv3d(X, W) -> Y`                      the VAE's bias-free causal convolutions,
                                                  channels-last (exporter 0.12.0; ONNX `Conv`
                                                  before): cuDNN's convolution with the engine
                                                  the runner picks by timing.

That structure (model.py, `Block.forward_fused`) is only taken inside `with fused_dit():`;
eager PyTorch and `dit.onnx` never see it.

Two VAE graphs, `vae_first_fused.onnx` and `vae_step_fused.onnx` (exporter 0.5.0), use
`BiasRmsNorm` with the attribute `silu = 1` for every VAE RMS norm that is followed by SiLU
(vae.py, `ResidualBlock.forward_fused` and the head), with the bias of a causal convolution that
feeds the norm directly moved into the op.  From exporter 0.12.0 every causal convolution
without a bias in them is one `CausalConv3d`.  Only taken inside `with fused_vae():`.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import attention


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
    return seq[2](ffn_hidden(seq, x))


def frozen(t: torch.Tensor) -> torch.Tensor:
    """`t`, computed from weights only, as a constant of the exported graph: without this the
    graph recomputes it from the weights on every run (ONNX Runtime folds constants on the CPU,
    which has no float16 MatMul or Einsum, so a float16 graph kept them: 62 small GEMMs per DiT
    pass, the upsampling convolutions' folded kernels on every decoder call).  The value is the
    eager one, computed once at export; outside an export `t` itself."""
    if not exporting():
        return t
    with torch.no_grad(), warnings.catch_warnings():
        # Leaving the trace is the point here: the tracer's warning about it is not news.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        data = t.detach().to("cpu", torch.float32).numpy().copy()
        return torch.from_numpy(data).to(device=t.device, dtype=t.dtype)


def value_and_output(v: nn.Module, o: nn.Module):
    """The value and output projections of an attention.  Exported graphs drop the value bias b_v
    and add W_o·b_v to the output bias: every attention row is a convex combination of values
    (softmax weights sum to 1), so attention(q, k, v + b_v) = attention(q, k, v) + b_v exactly.
    The keys/values a graph returns for the KV cache are then bias-free too, consistently."""
    if exporting() and isinstance(v, nn.Linear) and isinstance(o, nn.Linear) and v.bias is not None:
        bias = frozen(F.linear(v.bias, o.weight) + (o.bias if o.bias is not None else 0))
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


# ---------------------------------------------------------------------------------------------
# dit_fused.onnx: the runner's own operators (domain ai.unstep, opset 1)
# ---------------------------------------------------------------------------------------------

UNSTEP_DOMAIN = "ai.unstep"
_FUSED_DIT = False


def fused_dit_active() -> bool:
    """True inside `with fused_dit():` - the DiT then takes the fused structure (model.py)."""
    return _FUSED_DIT


@contextlib.contextmanager
def fused_dit():
    """Switch the DiT to the structure of `dit_fused.onnx` (exporting it, or running its eager
    reference arithmetic for the checks)."""
    global _FUSED_DIT
    prev, _FUSED_DIT = _FUSED_DIT, True
    try:
        yield
    finally:
        _FUSED_DIT = prev


_FUSED_VAE = False


def fused_vae_active() -> bool:
    """True inside `with fused_vae():` - the VAE decoder then takes the structure of
    `vae_first_fused.onnx` / `vae_step_fused.onnx` (vae.py)."""
    return _FUSED_VAE


@contextlib.contextmanager
def fused_vae():
    """Switch the VAE decoder to the fused structure: each RMS norm followed by SiLU as one
    `BiasRmsNorm` (silu = 1), with the bias of a causal convolution that feeds it moved into the
    op (exporting it, or running its eager reference arithmetic for the checks)."""
    global _FUSED_VAE
    prev, _FUSED_VAE = _FUSED_VAE, True
    try:
        yield
    finally:
        _FUSED_VAE = prev


def _row_param(p: torch.Tensor, n: int, d: int) -> torch.Tensor:
    """A row parameter (numel F*D, N % F == 0) as float32 [N, D]: row r uses row r // (N/F)."""
    f = p.numel() // d
    if not torch.jit.is_tracing() and (f * d != p.numel() or f == 0 or n % f):
        raise ValueError(f"row parameter of {p.numel()} elements for {n} rows of {d}")
    return p.float().reshape(f, 1, d).expand(f, n // f, d).reshape(n, d)


def _rms(v: torch.Tensor, eps: float) -> torch.Tensor:
    return v / torch.sqrt(v.pow(2).mean(dim=-1, keepdim=True) + eps)


def bias_rms_norm_rope_reference(x, bias, weight, cos, sin, eps: float, heads: int):
    """ai.unstep::BiasRmsNormRope: u = rms_norm(x + bias) * weight, then rotate the interleaved
    pairs (2i, 2i+1) by row (r % Tc), column (i mod hd/2) of the cos/sin tables [Tc, hd/2]."""
    d = x.shape[-1]
    n = x.numel() // d
    hd = d // heads
    u = _rms(x.float().reshape(n, d) + bias.float(), eps) * weight.float()
    t = torch.arange(n, device=x.device) % cos.shape[0]
    c = cos.float()[t].unsqueeze(1)  # [N, 1, hd/2], the same for every head
    s = sin.float()[t].unsqueeze(1)
    u = u.view(n, heads, hd // 2, 2)
    u0, u1 = u[..., 0], u[..., 1]
    y = torch.stack([u0 * c - u1 * s, u0 * s + u1 * c], dim=-1)
    return y.reshape(x.shape).to(x.dtype)


def qkv_norm_rope_cache_reference(qkv, q_bias, k_bias, q_weight, k_weight, cos, sin, k_cache, v_cache,
                                  eps: float, heads: int):
    """ai.unstep::QkvNormRopeCache: QKV [..., T, 3D] holds the bias-free q | k | v projections of
    each row.  Returns Q = BiasRmsNormRope(q; q_bias, q_weight) [..., T, D], and writes IN PLACE
    into K and V ([..., L, D], L >= T, B = numel(QKV) / (T * 3D) batches): for batch b and t < T,
    K[b, L-T+t] = BiasRmsNormRope(k; k_bias, k_weight) and V[b, L-T+t] = v (copied, no bias).
    Rows of K/V before L - T are left as they are."""
    d3 = qkv.shape[-1]
    d, t = d3 // 3, qkv.shape[-2]
    n = qkv.numel() // d3
    b = n // t
    big = k_cache.shape[-2]
    if not torch.jit.is_tracing():
        for name, c in (("K", k_cache), ("V", v_cache)):
            if d * 3 != d3 or c.shape[-1] != d or big < t or c.numel() != b * big * d or c.shape != k_cache.shape:
                raise ValueError(f"QkvNormRopeCache: QKV {tuple(qkv.shape)}, {name} {tuple(c.shape)}")
    rows = qkv.reshape(n, d3)
    q = bias_rms_norm_rope_reference(rows[:, :d], q_bias, q_weight, cos, sin, eps, heads)
    k = bias_rms_norm_rope_reference(rows[:, d:2 * d], k_bias, k_weight, cos, sin, eps, heads)
    k_cache.view(b, big, d)[:, big - t:] = k.view(b, t, d).to(k_cache.dtype)
    v_cache.view(b, big, d)[:, big - t:] = rows[:, 2 * d:].reshape(b, t, d).to(v_cache.dtype)
    return q.reshape(*qkv.shape[:-1], d)


def bias_rms_norm_reference(x, bias, weight, eps: float, silu: bool = False):
    """ai.unstep::BiasRmsNorm: n = rms_norm(x + bias) * weight; with silu, n * sigmoid(n)."""
    d = x.shape[-1]
    y = _rms(x.float().reshape(-1, d) + bias.float(), eps) * weight.float()
    if silu:
        y = y * torch.sigmoid(y)
    return y.reshape(x.shape).to(x.dtype)


def prefix_bias_rms_norm_reference(x, bias, weight, prefix, eps: float):
    """ai.unstep::PrefixBiasRmsNorm with silu = 1: Y = cat(prefix, BiasRmsNorm(x)) along axis 1
    (x of rank >= 2 with axis 0 of size 1; prefix x's shape but on axis 1), and tail = Y's last
    prefix.shape[1] entries along axis 1.  Returns (Y, tail)."""
    if not torch.jit.is_tracing():
        same = prefix.dim() == x.dim() and all(i == 1 or p == q for i, (p, q) in enumerate(zip(prefix.shape, x.shape)))
        if x.dim() < 2 or x.shape[0] != 1 or not same:
            raise ValueError(f"PrefixBiasRmsNorm: prefix {tuple(prefix.shape)}, X {tuple(x.shape)}")
    y = torch.cat([prefix.to(x.dtype), bias_rms_norm_reference(x, bias, weight, eps, silu=True)], dim=1)
    return y, y.narrow(1, y.shape[1] - prefix.shape[1], prefix.shape[1])


_GELU_C = math.sqrt(2.0 / math.pi)


def _gelu_tanh(v):
    """0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))), in v's (float32) arithmetic."""
    return 0.5 * v * (1.0 + torch.tanh(_GELU_C * (v + 0.044715 * v * v * v)))


def bias_gelu_reference(x, bias):
    """ai.unstep::BiasGelu: with v = x + bias (bias [D] per column of the last axis),
    0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))) in float32, rounded to x's type once."""
    d = x.shape[-1]
    v = x.float().reshape(-1, d) + bias.float().reshape(d)
    return _gelu_tanh(v).reshape(x.shape).to(x.dtype)


def matmul_bias_gelu_reference(x, weight, bias):
    """ai.unstep::MatMulBiasGelu: v = x W^T + bias (W [N, K], the linear layer's weight; bias
    [N]), then BiasGelu's GELU, all in float32 and rounded to x's type once."""
    return _gelu_tanh(F.linear(x.float(), weight.float(), bias.float())).to(x.dtype)


def gated_residual_layer_norm_reference(r, x, bias, gate, scale, shift, eps: float):
    """ai.unstep::GatedResidualLayerNorm: S = round_T(R + (X + bias) * gate);
    Y = LayerNorm(S, no affine) * scale + shift, normalising the stored (rounded) S."""
    d = x.shape[-1]
    n = x.numel() // d
    s = r.float().reshape(n, d) + (x.float().reshape(n, d) + bias.float()) * _row_param(gate, n, d)
    s = s.to(r.dtype)
    y = F.layer_norm(s.float(), (d,), eps=eps) * _row_param(scale, n, d) + _row_param(shift, n, d)
    return s.reshape(r.shape), y.reshape(r.shape).to(r.dtype)


class _BiasRmsNormRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, weight, cos, sin, eps: float, heads: int):  # noqa: D401 - torch.autograd API
        return bias_rms_norm_rope_reference(x, bias, weight, cos, sin, eps, heads)

    @staticmethod
    def symbolic(g, x, bias, weight, cos, sin, eps: float, heads: int):
        out = g.op(f"{UNSTEP_DOMAIN}::BiasRmsNormRope", x, bias, weight, cos, sin,
                   epsilon_f=float(eps), num_heads_i=int(heads))
        out.setType(x.type())
        return out


class _QkvNormRopeCache(torch.autograd.Function):
    """Only used while exporting.  The node's output Q is [..., T, D]; K and V are written in
    place, so the graph must read them only downstream of Q (the attention that takes Q)."""

    @staticmethod
    def forward(ctx, qkv, q_bias, k_bias, q_weight, k_weight, cos, sin, k_cache, v_cache, eps: float,
                heads: int):  # noqa: D401 - torch.autograd API
        return qkv_norm_rope_cache_reference(qkv, q_bias, k_bias, q_weight, k_weight, cos, sin, k_cache, v_cache,
                                             eps, heads)

    @staticmethod
    def symbolic(g, qkv, q_bias, k_bias, q_weight, k_weight, cos, sin, k_cache, v_cache, eps: float, heads: int):
        out = g.op(f"{UNSTEP_DOMAIN}::QkvNormRopeCache", qkv, q_bias, k_bias, q_weight, k_weight, cos, sin,
                   k_cache, v_cache, epsilon_f=float(eps), num_heads_i=int(heads))
        sizes = qkv.type().varyingSizes()
        if sizes and sizes[-1] is not None:
            out.setType(qkv.type().with_sizes(sizes[:-1] + [sizes[-1] // 3]))
        else:  # the element type only
            out.setType(qkv.type().with_sizes([None] * len(sizes)) if sizes else qkv.type())
        return out


class _BiasRmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, weight, eps: float, silu: bool = False):  # noqa: D401 - torch.autograd API
        return bias_rms_norm_reference(x, bias, weight, eps, silu)

    @staticmethod
    def symbolic(g, x, bias, weight, eps: float, silu: bool = False):
        # `silu` is written only when set (the VAE graphs): dit_fused's nodes keep `epsilon` alone.
        extra = {"silu_i": 1} if silu else {}
        out = g.op(f"{UNSTEP_DOMAIN}::BiasRmsNorm", x, bias, weight, epsilon_f=float(eps), **extra)
        out.setType(x.type())
        return out


class _PrefixBiasRmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, weight, prefix, eps: float):  # noqa: D401 - torch.autograd API
        return prefix_bias_rms_norm_reference(x, bias, weight, prefix, eps)

    @staticmethod
    def symbolic(g, x, bias, weight, prefix, eps: float):
        y, tail = g.op(f"{UNSTEP_DOMAIN}::PrefixBiasRmsNorm", x, bias, weight, prefix, epsilon_f=float(eps), silu_i=1,
                       outputs=2)
        sizes = x.type().sizes()
        sizes[1] += prefix.type().sizes()[1]
        y.setType(x.type().with_sizes(sizes))
        tail.setType(prefix.type())
        return y, tail


class _BiasGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias):  # noqa: D401 - torch.autograd API
        return bias_gelu_reference(x, bias)

    @staticmethod
    def symbolic(g, x, bias):
        out = g.op(f"{UNSTEP_DOMAIN}::BiasGelu", x, bias)
        out.setType(x.type())
        return out


class _MatMulBiasGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):  # noqa: D401 - torch.autograd API
        return matmul_bias_gelu_reference(x, weight, bias)

    @staticmethod
    def symbolic(g, x, weight, bias):
        out = g.op(f"{UNSTEP_DOMAIN}::MatMulBiasGelu", x, weight, bias)
        sizes = x.type().sizes()
        sizes[-1] = weight.type().sizes()[0]
        out.setType(x.type().with_sizes(sizes))
        return out


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, heads: int):  # noqa: D401 - torch.autograd API
        return attention(q, k, v, heads)

    @staticmethod
    def symbolic(g, q, k, v, heads: int):
        out = g.op(f"{UNSTEP_DOMAIN}::Attention", q, k, v, num_heads_i=int(heads))
        out.setType(q.type())
        return out


class _GatedResidualLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, r, x, bias, gate, scale, shift, eps: float):  # noqa: D401 - torch.autograd API
        return gated_residual_layer_norm_reference(r, x, bias, gate, scale, shift, eps)

    @staticmethod
    def symbolic(g, r, x, bias, gate, scale, shift, eps: float):
        s, y = g.op(f"{UNSTEP_DOMAIN}::GatedResidualLayerNorm", r, x, bias, gate, scale, shift,
                    epsilon_f=float(eps), outputs=2)
        s.setType(r.type())
        y.setType(r.type())
        return s, y


def bias_rms_norm_rope(x, bias, weight, cos, sin, eps: float, heads: int):
    # The angle tables in the activations' precision, as the standard graph feeds RotaryEmbedding.
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if exporting():
        return _BiasRmsNormRope.apply(x, bias, weight, cos, sin, eps, heads)
    return bias_rms_norm_rope_reference(x, bias, weight, cos, sin, eps, heads)


def qkv_norm_rope_cache(qkv, q_bias, k_bias, q_weight, k_weight, cos, sin, past_k, past_v, eps: float,
                        heads: int):
    """Self-attention's q, and the keys and values the attention reads, from QKV [1, T, 3D].

    Exporting: one `QkvNormRopeCache` node; `past_k`/`past_v` are then the graph's cache inputs
    [1, P + T, D] (the past followed by T rows for this block), written in place by the node and
    read by the attention as they are.  Returns (q, past_k, past_v, None, None).
    Eager: `past_k`/`past_v` are the past [1, P, D]; the reference arithmetic writes this block's
    keys/values into concat(past, zeros[T]), which is today's concatenation of past and new.
    Returns (q, keys, values, new k, new v)."""
    cos, sin = cos.to(qkv.dtype), sin.to(qkv.dtype)
    if exporting():
        q = _QkvNormRopeCache.apply(qkv, q_bias, k_bias, q_weight, k_weight, cos, sin, past_k, past_v, eps, heads)
        return q, past_k, past_v, None, None
    t, d = qkv.shape[-2], qkv.shape[-1] // 3
    new = qkv.new_zeros(*qkv.shape[:-2], t, d)
    kk = torch.cat([past_k.to(qkv.dtype), new], dim=-2)
    vv = torch.cat([past_v.to(qkv.dtype), new], dim=-2)
    q = qkv_norm_rope_cache_reference(qkv, q_bias, k_bias, q_weight, k_weight, cos, sin, kk, vv, eps, heads)
    return q, kk, vv, kk[..., -t:, :], vv[..., -t:, :]


def bias_rms_norm(x, bias, weight, eps: float):
    if exporting():
        return _BiasRmsNorm.apply(x, bias, weight, eps)
    return bias_rms_norm_reference(x, bias, weight, eps)


def bias_rms_norm_silu(x, bias, weight, eps: float):
    """SiLU(rms_norm(x + bias) * weight) over the last axis: one `BiasRmsNorm` with `silu = 1`
    when exporting (the fused VAE graphs), the reference arithmetic otherwise."""
    if exporting():
        return _BiasRmsNorm.apply(x, bias, weight, eps, True)
    return bias_rms_norm_reference(x, bias, weight, eps, silu=True)


def prefix_bias_rms_norm_silu(x, bias, weight, prefix, eps: float):
    """(Y, tail): Y = cat(prefix, SiLU(rms_norm(x + bias) * weight)) along axis 1 and tail its
    last prefix.shape[1] entries there; one `PrefixBiasRmsNorm` (silu = 1) when exporting (the
    fused VAE graphs: a causal convolution's cache frames in front of its new frames, and the next
    cache), the reference arithmetic otherwise."""
    if exporting():
        return _PrefixBiasRmsNorm.apply(x, bias, weight, prefix, eps)
    return prefix_bias_rms_norm_reference(x, bias, weight, prefix, eps)


def bias_gelu(x, bias):
    """GELU(tanh)(x + bias) over the last axis: one `BiasGelu` when exporting (dit_fused.onnx),
    the reference arithmetic otherwise."""
    if exporting():
        return _BiasGelu.apply(x, bias)
    return bias_gelu_reference(x, bias)


def causal_conv3d_reference(x, weight):
    """ai.unstep::CausalConv3d: X [N, T, H, W, C] and W [K, kT, kH, kW, C] channels-last, kH and
    kW odd; Y [N, T - kT + 1, H, W, K], zero padding of kH // 2 and kW // 2 in space, none in time
    (a causal convolution's cache or padding is already in front of X), no bias."""
    kh, kw = weight.shape[2], weight.shape[3]
    y = F.conv3d(x.permute(0, 4, 1, 2, 3), weight.permute(0, 4, 1, 2, 3), padding=(0, kh // 2, kw // 2))
    return y.permute(0, 2, 3, 4, 1)


class _CausalConv3d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):  # noqa: D401 - torch.autograd API
        return causal_conv3d_reference(x, weight)

    @staticmethod
    def symbolic(g, x, weight):
        out = g.op(f"{UNSTEP_DOMAIN}::CausalConv3d", x, weight)
        sizes = x.type().sizes()
        w = weight.type().sizes()
        if sizes is not None and w is not None:
            sizes = [sizes[0], sizes[1] - w[1] + 1, sizes[2], sizes[3], w[0]]
            out.setType(x.type().with_sizes(sizes))
        else:
            out.setType(x.type())
        return out


def causal_conv3d(x, weight):
    """A bias-free convolution of a causal 3D convolution's padded input x [N, C, T, H, W] with
    weight [K, C, kT, kH, kW] (spatial padding kH // 2, kW // 2; none in time): one
    `ai.unstep::CausalConv3d` on the channels-last layout when exporting (vae_*_fused.onnx, whose
    convolution the runner owns: cuDNN with the engine picked by timing), between permutations
    that cancel against the channels-last norms around it; F.conv3d otherwise."""
    if not exporting():
        return F.conv3d(x, weight, padding=(0, weight.shape[3] // 2, weight.shape[4] // 2))
    w = frozen(weight.permute(0, 2, 3, 4, 1).contiguous())
    return _CausalConv3d.apply(x.permute(0, 2, 3, 4, 1), w).permute(0, 4, 1, 2, 3)


def matmul_bias_gelu(x, weight, bias):
    """GELU(tanh)(x W^T + bias): one `MatMulBiasGelu` when exporting (dit_fused.onnx), the
    reference arithmetic otherwise."""
    if exporting():
        return _MatMulBiasGelu.apply(x, weight, bias)
    return matmul_bias_gelu_reference(x, weight, bias)


def self_attention(q, k, v, heads: int):
    """Softmax attention of q [B, S, D] over k, v [B, L, D] (heads of D / heads, no mask): one
    `ai.unstep::Attention` when exporting (dit_fused.onnx's self-attention, whose kernel the runner
    owns), `attention.attention` (PyTorch's SDPA) otherwise."""
    if exporting():
        return _Attention.apply(q, k, v, heads)
    return attention(q, k, v, heads)


def gated_residual_layer_norm(r, x, bias, gate, scale, shift, eps: float):
    """(S, Y) = (R + (X + bias) * gate, LayerNorm(S) * scale + shift); gate/scale/shift are row
    parameters ([D], or [1, F, 1, D] per frame of the [1, F*tokens, D] activations)."""
    if exporting():
        return _GatedResidualLayerNorm.apply(r, x, bias, gate, scale, shift, eps)
    return gated_residual_layer_norm_reference(r, x, bias, gate, scale, shift, eps)


def linear_parts(lin: nn.Module):
    """A linear layer as (x -> x W^T without its bias, bias [out]): the fused graph exports the
    product as a bare MatMul and adds the bias inside the next fused op.  A missing bias is zeros;
    `--svd-rank` factors (model.LowRankLinear: b(a(x))) keep their bias on `b`."""
    if isinstance(lin, nn.Linear):
        weight, bias = lin.weight, lin.bias
        fn = lambda x: F.linear(x, weight)  # noqa: E731
    elif hasattr(lin, "a") and hasattr(lin, "b"):
        weight, bias = lin.b.weight, lin.b.bias
        fn = lambda x: F.linear(lin.a(x), weight)  # noqa: E731
    else:
        raise TypeError(f"not a linear layer: {type(lin).__name__}")
    if bias is None:
        bias = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
    return fn, bias


def value_and_output_parts(v: nn.Module, o: nn.Module):
    """(value, output without bias, output bias) with the value bias folded into the output bias
    exactly where `value_and_output` folds it, so `new_v` means the same in both DiT graphs."""
    out, bias = linear_parts(o)
    if isinstance(v, nn.Linear) and isinstance(o, nn.Linear) and v.bias is not None:
        return (lambda x: F.linear(x, v.weight)), out, frozen(out(v.bias) + bias)
    return v, out, bias


def qkv_parts(q: nn.Module, k: nn.Module, v: nn.Module, o: nn.Module):
    """(x -> QKV = [x Wq | x Wk | value(x)], q bias, k bias, output without bias, output bias) of
    a self-attention: plain linear layers give one bias-free MatMul by the concatenated weights
    [3D, D]; `--svd-rank` factors are computed apart and concatenated.  The value bias is folded
    into the output bias as in `value_and_output_parts`."""
    q_lin, q_bias = linear_parts(q)
    k_lin, k_bias = linear_parts(k)
    value, output, o_bias = value_and_output_parts(v, o)
    # value(x) is x Wv exactly when v is a plain linear layer whose bias was folded (value is then
    # not v itself) or that has none.
    if all(isinstance(m, nn.Linear) for m in (q, k, v)) and (value is not v or v.bias is None):
        weight = torch.cat([q.weight, k.weight, v.weight], dim=0)
        fn = lambda x: F.linear(x, weight)  # noqa: E731
    else:
        fn = lambda x: torch.cat([q_lin(x), k_lin(x), value(x)], dim=-1)  # noqa: E731
    return fn, q_bias, k_bias, output, o_bias


def ffn_hidden(seq: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """The FFN up to its second linear layer: GELU(tanh)(x W1^T + b1).  Exported, the bias goes
    inside FastGelu (as `ffn`); in the structure of dit_fused (`fused_dit()`) the layer and its GELU
    are one `MatMulBiasGelu`, or, for `--svd-rank` factors, a bare MatMul and the bias and GELU one
    `BiasGelu` (eager: their reference arithmetic)."""
    first, act, _ = seq
    if fused_dit_active():
        product, bias = linear_parts(first)
        if isinstance(first, nn.Linear):
            return matmul_bias_gelu(x, first.weight, bias)
        return bias_gelu(product(x), bias)
    if exporting() and isinstance(first, nn.Linear) and first.bias is not None:
        return _FastGeluBias.apply(F.linear(x, first.weight), first.bias)
    return act(first(x))

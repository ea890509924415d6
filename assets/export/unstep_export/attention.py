"""Multi-head attention that exports as ONNX Runtime's `com.microsoft.MultiHeadAttention`.

The runner owns the attention kernel (SPEC §6: the op decides the speed), so the DiT graph must
carry attention as one op, not as MatMul/Softmax.  Layout used (ORT contrib op, 3-D inputs):
  query [B, S, D], key [B, Skv, D], value [B, Skv, D], attribute num_heads; output [B, S, D];
  scale defaults to 1/sqrt(D/num_heads); no bias, no mask, no past inputs.
In eager PyTorch the same function runs F.scaled_dot_product_attention, so the SDPA backend can
be chosen with torch.nn.attention.sdpa_kernel for GPU reference timings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int) -> torch.Tensor:
    b, s, d = q.shape
    hd = d // num_heads
    q = q.view(b, s, num_heads, hd).transpose(1, 2)
    k = k.view(b, k.shape[1], num_heads, hd).transpose(1, 2)
    v = v.view(b, v.shape[1], num_heads, hd).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v)
    return o.transpose(1, 2).reshape(b, s, d)


class _MultiHeadAttention(torch.autograd.Function):
    """Only used while exporting: `symbolic` tells the TorchScript exporter which op to write."""

    @staticmethod
    def forward(ctx, q, k, v, num_heads: int):  # noqa: D401 - torch.autograd API
        return _sdpa(q, k, v, num_heads)

    @staticmethod
    def symbolic(g, q, k, v, num_heads: int):
        out = g.op("com.microsoft::MultiHeadAttention", q, k, v, num_heads_i=int(num_heads))
        out.setType(q.type())
        return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int) -> torch.Tensor:
    if torch.onnx.is_in_onnx_export():
        return _MultiHeadAttention.apply(q, k, v, num_heads)
    return _sdpa(q, k, v, num_heads)

"""The DiT's matrix multiplies at a block's rows and around them, on one GPU (PyTorch, cuBLAS).

wan-1.3b's DiT multiplies 4,680 tokens (a block of 3 latent frames) by its QKV projection
(1536 -> 4608), the attention output and cross-attention projections (1536 -> 1536) and the FFN
(1536 -> 8960 -> 1536), fp16 with fp32 accumulation. This times each at 4,680 rows and at 4,224,
4,480, 5,280 and 9,360, printing µs per call and TFLOP/s: where a GEMM's rate at 4,680 rows is
that of its neighbours, a block's row count costs it no partial last wave of thread blocks (the
attention's does: benches/attention_waves.py). A few calls per point, so the GPU runs at its boost
clock (benches/attention_clock.py).

    python3 benches/gemm_shapes.py
"""

import torch

from cuda_events import micros

SHAPES = {"qkv": (1536, 4608), "o": (1536, 1536), "ffn1": (1536, 8960), "ffn2": (8960, 1536)}
ROWS = (4224, 4480, 4680, 5280, 9360)


def main():
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    for name, (k, n) in SHAPES.items():
        w = torch.randn(k, n, device="cuda", dtype=torch.float16) * 0.02
        cells = []
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            out = torch.empty(m, n, device="cuda", dtype=torch.float16)
            us = micros(lambda: torch.mm(x, w, out=out), reps=30, warmup=5)
            cells.append(f"M={m}: {us:7.1f} µs {2 * m * k * n / us / 1e6:4.0f} TFLOP/s")
        print(f"{name:5} K={k:5} N={n:5} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()

"""Where the DiT's self-attention time goes on one GPU, in PyTorch (no bundle, no runner).

    python3 benches/attention_waves.py

Prints, for wan-1.3b's attention (12 heads of 128, float16, no mask):
1. time per call against the query rows per call at 18,720 keys (the mean key count of a video's
   self-attention calls): cuDNN's fused attention (the kernel `attention_backend = auto` picks on
   an H200) runs its grid in waves, and a block's 4,680 query rows take one more wave than 4,224;
2. the backends at the video's key counts, and the self-attention of one video (34 passes of 30
   layers, keys growing by a block of 4,680 rows) as isolated cuDNN calls;
3. whether a second stream fills the device beside the DiT: a DiT-like stream (attention and the
   layer's matrix multiplies) and a decoder-like one (the VAE's two largest convolutions), alone
   and together, at equal and unequal stream priorities;
4. the last wave split over the keys: the first 4,224 rows in one call (three full waves), the
   remaining 456 rows with their keys cut in parts run as one batched call that also returns each
   part's log-sum-exp, then merged; against one call of all 4,680 rows, with the error of the
   merged result.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cuda_events import micros

HEADS, HEAD_DIM, BLOCK_ROWS, BLOCKS, LAYERS = 12, 128, 4680, 7, 30
DEV, HALF = "cuda", torch.float16


def rows(n: int) -> torch.Tensor:
    """[1, heads, n, head_dim] with the runner's layout ([1, n, heads, head_dim] in memory)."""
    return torch.randn(1, n, HEADS, HEAD_DIM, device=DEV, dtype=HALF).transpose(1, 2)


def per_call_us(fn, iters: int = 20) -> float:
    return micros(fn, reps=iters, warmup=3)


def tflops(q_rows: int, keys: int, us: float) -> float:
    return 4 * q_rows * keys * HEADS * HEAD_DIM / us / 1e6


def waves() -> None:
    keys = 18720
    k, v = rows(keys), rows(keys)
    print(f"1. cuDNN attention, {keys} keys, query rows per call:")
    for q_rows in (4224, 4480, BLOCK_ROWS, 5280):
        q = rows(q_rows)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            us = per_call_us(lambda: F.scaled_dot_product_attention(q, k, v))
        print(f"   {q_rows:5d} rows: {us:7.1f} us per call, {tflops(q_rows, keys, us):5.1f} TFLOP/s")


def backends() -> None:
    print("2. backends (block of 4680 query rows):")
    q = rows(BLOCK_ROWS)
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        cells = []
        for keys in (512, BLOCK_ROWS, 18720, BLOCKS * BLOCK_ROWS):
            k, v = rows(keys), rows(keys)
            with sdpa_kernel([backend]):
                us = per_call_us(lambda: F.scaled_dot_product_attention(q, k, v))
            cells.append(f"{keys}: {us:.1f} us ({tflops(BLOCK_ROWS, keys, us):.0f})")
        print(f"   {backend.name:20s} " + ", ".join(cells))
    total = 0.0
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        for b in range(BLOCKS):
            keys = (b + 1) * BLOCK_ROWS
            k, v = rows(keys), rows(keys)
            passes = 5 if b < BLOCKS - 1 else 4  # the last block's clean-cache pass is skipped
            total += passes * LAYERS * per_call_us(lambda: F.scaled_dot_product_attention(q, k, v), 10)
    print(f"   one video's self-attention as isolated cuDNN calls: {total / 1000:.1f} ms")


def streams() -> None:
    q = rows(BLOCK_ROWS)
    caches = [rows((b + 1) * BLOCK_ROWS) for b in range(BLOCKS)]
    x = torch.randn(BLOCK_ROWS, 1536, device=DEV, dtype=HALF)
    w_qkv, w_o = (torch.randn(1536, n, device=DEV, dtype=HALF) for n in (4608, 1536))
    w_up, w_down = torch.randn(1536, 8960, device=DEV, dtype=HALF), torch.randn(8960, 1536, device=DEV, dtype=HALF)

    def dit():
        for k in caches:
            for _ in range(LAYERS):
                x @ w_qkv
                F.scaled_dot_product_attention(q, k, k)
                for _ in range(3):
                    x @ w_o
                (x @ w_up) @ w_down

    big = torch.randn(1, 96, 6, 480, 832, device=DEV, dtype=HALF).to(memory_format=torch.channels_last_3d)
    w_big = torch.randn(96, 96, 3, 3, 3, device=DEV, dtype=HALF).to(memory_format=torch.channels_last_3d)
    mid = torch.randn(1, 192, 6, 240, 416, device=DEV, dtype=HALF).to(memory_format=torch.channels_last_3d)
    w_mid = torch.randn(192, 192, 3, 3, 3, device=DEV, dtype=HALF).to(memory_format=torch.channels_last_3d)

    def decoder():
        for _ in range(40):
            F.conv3d(big, w_big, None, padding=(0, 1, 1))
            F.conv3d(mid, w_mid, None, padding=(0, 1, 1))

    def wall_ms(fn) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1000

    print("3. a DiT-like stream and a decoder-like stream (ms):")
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        dit()
        decoder()
        for _ in range(2):
            alone = {"DiT": wall_ms(dit), "decoder": wall_ms(decoder)}
            cells = [f"{name} alone {ms:.1f}" for name, ms in alone.items()]
            cells.append(f"sum {sum(alone.values()):.1f}")
            for name, (p_dit, p_dec) in {"together": (0, 0), "DiT first": (-5, 0), "decoder first": (0, -5)}.items():
                s_dit, s_dec = torch.cuda.Stream(priority=p_dit), torch.cuda.Stream(priority=p_dec)

                def both():
                    with torch.cuda.stream(s_dec):
                        decoder()
                    with torch.cuda.stream(s_dit):
                        dit()

                cells.append(f"{name} {wall_ms(both):.1f}")
            print("   " + ", ".join(cells))


def cudnn_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False)
    return out[0], out[1]


def split_tail() -> None:
    keys, main_rows = 18720, 4224
    q, k, v = rows(BLOCK_ROWS), rows(keys), rows(keys)
    tail = BLOCK_ROWS - main_rows
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        reference = F.scaled_dot_product_attention(q, k, v)
        one = per_call_us(lambda: F.scaled_dot_product_attention(q, k, v))
        head = per_call_us(lambda: F.scaled_dot_product_attention(q[:, :, :main_rows], k, v))
    print(f"4. {keys} keys: one call of {BLOCK_ROWS} rows {one:.1f} us; the first {main_rows} rows {head:.1f} us")
    for parts in (2, 3, 4):
        # the tail's rows once per part (batch), each part a contiguous run of keys
        qt = q[:, :, main_rows:].expand(parts, -1, -1, -1).contiguous()
        kt = k.reshape(HEADS, parts, keys // parts, HEAD_DIM).transpose(0, 1)
        vt = v.reshape(HEADS, parts, keys // parts, HEAD_DIM).transpose(0, 1)
        kt, vt = kt.contiguous(), vt.contiguous()
        o, lse = cudnn_with_lse(qt, kt, vt)
        us = per_call_us(lambda: cudnn_with_lse(qt, kt, vt))
        lse = lse.reshape(parts, HEADS, tail, 1).float()
        weight = torch.softmax(lse, dim=0)
        merged = (weight * o.float()).sum(0, keepdim=True).to(HALF)
        err = (merged - reference[:, :, main_rows:]).abs().max().item()
        print(
            f"   tail of {tail} rows in {parts} key parts: {us:.1f} us (with LSE), head + tail {head + us:.1f} us "
            f"against {one:.1f}; merged max abs error {err:.2e}"
        )
    o, lse = cudnn_with_lse(q, k, v)
    print(f"   all {BLOCK_ROWS} rows with LSE: {per_call_us(lambda: cudnn_with_lse(q, k, v)):.1f} us, max abs diff to "
          f"the plain call {(o - reference).abs().max().item():.2e}")


def main() -> None:
    torch.backends.cudnn.benchmark = True
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    waves()
    backends()
    streams()
    split_tail()


if __name__ == "__main__":
    main()

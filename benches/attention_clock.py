"""Burst against sustained speed of the DiT's largest attention on one GPU (PyTorch, cuDNN SDPA).

The last block of wan-1.3b attends 4680 queries over 32760 keys (12 heads of 128, fp16). This
times it for a few calls (the GPU at its boost clock) and then in twelve rounds of 400
back-to-back calls (a few seconds, as in a generation), printing TFLOP/s per round with the SM
clock and power `nvidia-smi` reads meanwhile, and the sustained rate as a share of the burst one.
Layouts BNSH and BSNH of q, k and v are timed too (the runner's graphs give BSNH).

    python3 benches/attention_clock.py
"""

import subprocess
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

H, S, L, HD = 12, 4680, 32760, 128
FLOP = 4 * S * L * HD * H


def timed(fn, n):
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1e3  # microseconds


def tensors(s, bnsh):
    shape = (1, H, s, HD) if bnsh else (1, s, H, HD)
    t = torch.randn(shape, device="cuda", dtype=torch.float16)
    return t if bnsh else t.transpose(1, 2)


def main():
    readings, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip()
            readings.append(out)
            time.sleep(0.5)

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for bnsh in (True, False):
            q, k, v = tensors(S, bnsh), tensors(L, bnsh), tensors(L, bnsh)
            timed(lambda: F.scaled_dot_product_attention(q, k, v), 3)
            burst = timed(lambda: F.scaled_dot_product_attention(q, k, v), 10)
            print(f"{'BNSH' if bnsh else 'BSNH'} burst of 10 calls: {burst:.0f} us, {FLOP / burst / 1e6:.0f} TFLOP/s")
        time.sleep(2)  # let the clock recover before the sustained rounds
        q, k, v = tensors(S, True), tensors(L, True), tensors(L, True)
        burst = timed(lambda: F.scaled_dot_product_attention(q, k, v), 10)
        thread = threading.Thread(target=poll)
        thread.start()
        rounds = [timed(lambda: F.scaled_dot_product_attention(q, k, v), 400) for _ in range(12)]
        stop.set()
        thread.join()
    for i, us in enumerate(rounds):
        print(f"round {i}: {us:.0f} us, {FLOP / us / 1e6:.0f} TFLOP/s")
    print("clock, power:", "; ".join(readings))
    steady = sum(rounds[2:]) / len(rounds[2:])
    print(f"sustained / burst speed: {burst / steady:.3f} ({FLOP / burst / 1e6:.0f} -> {FLOP / steady / 1e6:.0f} TFLOP/s)")


if __name__ == "__main__":
    main()

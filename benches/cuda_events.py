"""Timing helper shared by the benches' PyTorch scripts."""

import torch


def micros(fn, reps: int, warmup: int) -> float:
    """Mean µs of one of `reps` back-to-back calls of `fn`, from CUDA events, after `warmup`
    unmeasured calls (cuDNN's or cuBLAS's first-call work among them)."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1000

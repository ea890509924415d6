"""The VAE decoder's convolutions, and padded variants of them, on one GPU (PyTorch, cuDNN).

wan-1.3b's `vae_step` decodes one latent frame into 4 frames: causal 3x3x3 convolutions of 96
channels at 480x832, 192 at 240x416 and 384 at 120x208 (2 frames there), the upsampling stages'
sub-pixel convolutions (3x3 on the low-resolution input, four phases as output channels) and time
convolutions (3x1x1), and the 3-channel head. This times each, channels-last fp16 with cuDNN's
benchmark mode (it tries cuDNN's engines and keeps the fastest, as ONNX Runtime's exhaustive
search does), also with the output channels padded where a wider output might get a better
kernel, and prints µs per call, TFLOP/s (padded channels counted) and the kernels cuDNN ran.
Inputs have the causal cache's two frames in front, as the decoder's do.

    python3 benches/conv_shapes.py

`CUDNN_LIMIT=0` makes the benchmark mode try every engine configuration cuDNN's heuristics offer
(PyTorch tries the first 10 by default); `ONLY=text` keeps the cases whose name holds `text`;
`DTYPE=bfloat16` times bf16.
"""

import os

import torch
import torch.nn.functional as F

from cuda_events import micros

# (what, in channels, out channels, output frames, height, width, kernel)
CASES = [
    ("3x3x3 96 -> 96, full resolution", 96, 96, 4, 480, 832, (3, 3, 3)),
    ("  the same, 96 -> 112", 96, 112, 4, 480, 832, (3, 3, 3)),
    ("  the same, 96 -> 128", 96, 128, 4, 480, 832, (3, 3, 3)),
    ("  the same, 96 -> 144", 96, 144, 4, 480, 832, (3, 3, 3)),
    ("  the same, 128 -> 128", 128, 128, 4, 480, 832, (3, 3, 3)),
    ("  the same, 2 frames", 96, 96, 2, 480, 832, (3, 3, 3)),
    ("  the same, 8 frames", 96, 96, 8, 480, 832, (3, 3, 3)),
    ("3x3x3 192 -> 192, half resolution", 192, 192, 4, 240, 416, (3, 3, 3)),
    ("  the same, 192 -> 224", 192, 224, 4, 240, 416, (3, 3, 3)),
    ("  the same, 192 -> 256", 192, 256, 4, 240, 416, (3, 3, 3)),
    ("3x3x3 192 -> 384, quarter resolution", 192, 384, 2, 120, 208, (3, 3, 3)),
    ("3x3x3 384 -> 384, quarter resolution", 384, 384, 2, 120, 208, (3, 3, 3)),
    ("sub-pixel 3x3 192 -> 4 x 96, half resolution", 192, 384, 4, 240, 416, (1, 3, 3)),
    ("  the same, 4 x 128 (padded)", 192, 512, 4, 240, 416, (1, 3, 3)),
    ("sub-pixel 3x3 384 -> 4 x 192, quarter resolution", 384, 768, 4, 120, 208, (1, 3, 3)),
    ("time 3x1x1 384 -> 2 x 384, quarter resolution", 384, 768, 2, 120, 208, (3, 1, 1)),
    ("head 3x3x3 96 -> 3, full resolution", 96, 3, 4, 480, 832, (3, 3, 3)),
    ("  the same, 96 -> 4", 96, 4, 4, 480, 832, (3, 3, 3)),
    ("  the same, 96 -> 8", 96, 8, 4, 480, 832, (3, 3, 3)),
    ("  the same, 96 -> 16", 96, 16, 4, 480, 832, (3, 3, 3)),
    ("  the same, 96 -> 32", 96, 32, 4, 480, 832, (3, 3, 3)),
]


def kernels(fn):
    """The names of the CUDA kernels one call runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    return sorted(n[:72] for n in names if not n.startswith("Memset"))


def main():
    torch.backends.cudnn.benchmark = True
    if "CUDNN_LIMIT" in os.environ:
        torch.backends.cudnn.benchmark_limit = int(os.environ["CUDNN_LIMIT"])
    dtype = getattr(torch, os.environ.get("DTYPE", "float16"))
    only = os.environ.get("ONLY", "")
    print(f"cuDNN {torch.backends.cudnn.version()}, benchmark limit {torch.backends.cudnn.benchmark_limit}, {dtype}")
    cl = torch.channels_last_3d
    for what, cin, cout, frames, h, w, kernel in CASES:
        if only not in what:
            continue
        x = torch.randn(1, cin, frames + kernel[0] - 1, h, w, device="cuda", dtype=dtype).to(memory_format=cl)
        wt = (torch.randn(cout, cin, *kernel, device="cuda", dtype=dtype) * 0.05).to(memory_format=cl)
        pad = (0, kernel[1] // 2, kernel[2] // 2)

        def call():
            return F.conv3d(x, wt, padding=pad)

        us = micros(call, reps=10, warmup=3)  # cuDNN's search in the first call
        flop = 2 * cin * cout * kernel[0] * kernel[1] * kernel[2] * frames * h * w
        print(f"{what:50s} {us:9.1f} µs  {flop / us / 1e6:5.0f} TFLOP/s  {', '.join(kernels(call))}")


if __name__ == "__main__":
    main()

"""cuDNN's float8 attention against its float16 one at the DiT's self-attention shapes, on one
GPU: the question under `precision = "fp8"`'s target (8-bit attention), measured before any of
it is built into the runner.

For each key length (a block's 4,680 query rows of 12 heads of 128, BSHD, no mask):
- float16: PyTorch's cuDNN attention (the kernel the runner's `Attention` runs), µs per call;
- float8 E4M3: cuDNN's FP8 SDPA graph (per-tensor descales of Q, K, V, the probabilities
  scaled into E4M3, float16 output where cuDNN takes it, else E4M3 with its own scale), µs per
  call, the quantisation of Q (per call in a product: Q is new at every pass) timed apart;
- its error against the float16 output: relative L2 and largest absolute difference, with K as
  it is and with K smoothed (its mean over the keys taken out per head and channel: the same
  softmax, as a query's product with the mean is one constant over its row, and a narrower range
  for the 8-bit codes).

The inputs are synthetic (seeded normal Q, K, V, K with a per-channel offset of standard
deviation `--k-offset` shared by every key, the pattern that 8-bit attention methods smooth
away): their errors are the arithmetic's on such data, not a trained model's; the speeds are
the kernels'.

    python3 benches/attention_fp8.py [--keys 4680,9360,18720,32760] [--rows 4680] [--iters 20]
                                     [--k-offset 2.0]

Needs PyTorch with CUDA and cuDNN's Python frontend (`pip install nvidia-cudnn-frontend==1.14.1`),
loading the same cuDNN as PyTorch; compute capability 9.0 or later.
"""

import argparse
import math
import sys

import torch

E4M3_MAX = 448.0


def timed_us(fn, iters):
    """Mean µs per call of `fn` over `iters` back-to-back calls after three untimed ones."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def quantise(x):
    """Per-tensor E4M3 codes of `x` and the descale that restores it (amax / 448)."""
    amax = x.abs().max().float().clamp(min=1e-12)
    codes = (x.float() * (E4M3_MAX / amax)).to(torch.float8_e4m3fn)
    return codes, (amax / E4M3_MAX).reshape(1, 1, 1, 1)


def bhsd(x):
    """A BSHD tensor (1, S, H, D) seen as BHSD, the strides cuDNN reads rows in place by."""
    return x.permute(0, 2, 1, 3)


class Fp8Attention:
    """One cuDNN FP8 SDPA graph for `rows` queries against `keys` keys, output `out` (HALF or
    FP8_E4M3)."""

    def __init__(self, cudnn, handle, rows, keys, heads, dim, out):
        self.cudnn = cudnn
        self.handle = handle
        self.out_type = out
        f8 = cudnn.data_type.FP8_E4M3
        g = cudnn.pygraph(
            io_data_type=f8,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=handle,
        )
        dev = "cuda"
        self.q = torch.empty(1, rows, heads, dim, dtype=torch.uint8, device=dev)
        self.k = torch.empty(1, keys, heads, dim, dtype=torch.uint8, device=dev)
        self.v = torch.empty(1, keys, heads, dim, dtype=torch.uint8, device=dev)
        half = out == cudnn.data_type.HALF
        self.o = torch.empty(1, rows, heads, dim, dtype=torch.float16 if half else torch.uint8, device=dev)
        scalar = lambda: torch.ones(1, 1, 1, 1, dtype=torch.float32, device=dev)  # noqa: E731
        self.scalars = {n: scalar() for n in ["dq", "dk", "dv", "ds", "ss", "so", "amax_s", "amax_o"]}
        t = {}
        for name, buf in [("q", self.q), ("k", self.k), ("v", self.v)]:
            t[name] = g.tensor_like(bhsd(buf)).set_data_type(f8)
        for name in ["dq", "dk", "dv", "ds", "ss", "so"]:
            t[name] = g.tensor_like(self.scalars[name])
        o, _stats, amax_s, amax_o = g.sdpa_fp8(
            q=t["q"], k=t["k"], v=t["v"],
            descale_q=t["dq"], descale_k=t["dk"], descale_v=t["dv"],
            descale_s=t["ds"], scale_s=t["ss"], scale_o=t["so"],
            generate_stats=False, attn_scale=1.0 / math.sqrt(dim), use_causal_mask=False,
        )
        view = bhsd(self.o)
        o.set_output(True).set_dim(list(view.size())).set_stride(list(view.stride())).set_data_type(out)
        for tensor, buf in [(amax_s, self.scalars["amax_s"]), (amax_o, self.scalars["amax_o"])]:
            tensor.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(
                cudnn.data_type.FLOAT
            )
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        self.graph = g
        self.pack = {
            t["q"]: self.q, t["k"]: self.k, t["v"]: self.v, o: self.o,
            t["dq"]: self.scalars["dq"], t["dk"]: self.scalars["dk"], t["dv"]: self.scalars["dv"],
            t["ds"]: self.scalars["ds"], t["ss"]: self.scalars["ss"], t["so"]: self.scalars["so"],
            amax_s: self.scalars["amax_s"], amax_o: self.scalars["amax_o"],
        }
        self.workspace = torch.empty(max(g.get_workspace_size(), 1), dtype=torch.uint8, device=dev)

    def load(self, q, k, v, o_amax):
        """Quantises q, k, v (float16, BSHD) into the graph's inputs; `o_amax` sizes an E4M3
        output's scale."""
        for codes_buf, name, x in [(self.q, "dq", q), (self.k, "dk", k), (self.v, "dv", v)]:
            codes, descale = quantise(x)
            codes_buf.copy_(codes.view(torch.uint8))
            self.scalars[name].copy_(descale)
        # The probabilities lie in [0, 1]: their E4M3 codes use the whole range.
        self.scalars["ss"].fill_(E4M3_MAX)
        self.scalars["ds"].fill_(1.0 / E4M3_MAX)
        self.scalars["so"].fill_(1.0 if self.out_type == self.cudnn.data_type.HALF else E4M3_MAX / o_amax)

    def run(self):
        self.graph.execute(self.pack, self.workspace, handle=self.handle)

    def output(self, o_amax):
        """The output as float32, BSHD."""
        if self.out_type == self.cudnn.data_type.HALF:
            return self.o.float()
        return self.o.view(torch.float8_e4m3fn).float() * (o_amax / E4M3_MAX)


def errors(got, want):
    diff = (got - want).float()
    return (diff.norm() / want.float().norm()).item(), diff.abs().max().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", default="4680,9360,18720,32760")
    parser.add_argument("--rows", type=int, default=4680)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--k-offset", type=float, default=2.0)
    args = parser.parse_args()
    try:
        import cudnn
    except ImportError as e:
        sys.exit(f"cuDNN's Python frontend is not installed ({e}): pip install nvidia-cudnn-frontend==1.14.1")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    major, minor = torch.cuda.get_device_capability()
    print(f"{torch.cuda.get_device_name()}, compute capability {major}.{minor}, "
          f"cuDNN {cudnn.backend_version_string()} (frontend {getattr(cudnn, '__version__', '?')}), "
          f"torch {torch.__version__}")
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    gen = torch.Generator(device="cuda").manual_seed(0)
    h, d, rows = args.heads, args.dim, args.rows
    print("| keys | fp16 µs | TFLOP/s | fp8 µs | TFLOP/s | fp8 / fp16 | Q quantisation µs | output "
          "| rel. L2 (K as is) | max abs | rel. L2 (K smoothed) | max abs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for keys in [int(k) for k in args.keys.split(",")]:
        flops = 4.0 * rows * keys * d * h
        q = torch.randn(1, rows, h, d, generator=gen, device="cuda").half()
        offset = torch.randn(1, 1, h, d, generator=gen, device="cuda") * args.k_offset
        k = (torch.randn(1, keys, h, d, generator=gen, device="cuda") + offset).half()
        v = torch.randn(1, keys, h, d, generator=gen, device="cuda").half()

        def fp16():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(bhsd(q), bhsd(k), bhsd(v))

        want = bhsd(fp16()).float()
        o_amax = want.abs().max().item()
        t16 = timed_us(fp16, args.iters)

        attention = None
        for out in [cudnn.data_type.HALF, cudnn.data_type.FP8_E4M3]:
            try:
                attention = Fp8Attention(cudnn, handle, rows, keys, h, d, out)
                break
            except Exception as e:  # cuDNN says why a graph is not supported
                print(f"  fp8 graph with {out} output not built: {e}", file=sys.stderr)
        if attention is None:
            print(f"| {keys} | {t16:.1f} | {flops / t16 * 1e-6:.0f} | not supported | | | | | | | | |")
            continue
        attention.load(q, k, v, o_amax)
        t8 = timed_us(attention.run, args.iters)
        tq = timed_us(lambda: quantise(q), args.iters)
        plain = errors(attention.output(o_amax), want)
        smoothed_k = (k.float() - k.float().mean(dim=1, keepdim=True)).half()
        attention.load(q, smoothed_k, v, o_amax)
        attention.run()
        torch.cuda.synchronize()
        smoothed = errors(attention.output(o_amax), want)
        name = "fp16" if attention.out_type == cudnn.data_type.HALF else "e4m3"
        print(f"| {keys} | {t16:.1f} | {flops / t16 * 1e-6:.0f} | {t8:.1f} | {flops / t8 * 1e-6:.0f} "
              f"| {t8 / t16:.3f} | {tq:.1f} | {name} | {plain[0]:.2e} | {plain[1]:.3f} "
              f"| {smoothed[0]:.2e} | {smoothed[1]:.3f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

"""8-bit attention (`src/engine/kernels/attention8.cu`) on the GPU, alone: correctness against a
float64 reference and the float16 attention, and time per call against PyTorch's cuDNN SDPA at
the DiT's shapes (4,680 query rows, 4,680 to 32,760 keys, 12 heads of 128), in one process.

    python3 benches/attention8.py OUT_DIR [CUBIN]

Compiles the source with NVRTC for sm_90a (CUDA 13's NVRTC from the `nvidia` Python packages)
unless CUBIN is given, loads it with CuPy, and writes `attention8.json` and a table to OUT_DIR as
it goes; `ATT8_VARIANTS="name=path.cu,..."` times other sources of `unstep_att8_fwd` beside it.
Needs PyTorch and CuPy with CUDA, on a Hopper GPU.
"""

import ctypes
import glob
import json
import math
import os
import sys
import time

import numpy as np
import cupy as cp
import torch

HD = 128
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "engine", "kernels",
                   "attention8.cu")


def nvrtc_compile(path=SRC, arch="sm_90a"):
    import nvidia
    libdir = os.path.join(nvidia.__path__[0], "cu13", "lib")
    lib = [p for p in glob.glob(os.path.join(libdir, "libnvrtc.so*")) if "builtins" not in p][0]
    n = ctypes.CDLL(lib)
    prog = ctypes.c_void_p()
    src = open(path, "rb").read()
    assert n.nvrtcCreateProgram(ctypes.byref(prog), src, b"attention8.cu", 0, None, None) == 0
    opts = [f"--gpu-architecture={arch}".encode(), b"--fmad=false", b"--std=c++17"]
    rc = n.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    n.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    n.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        raise SystemExit("nvrtc: " + log.value.decode())
    n.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    n.nvrtcGetCUBIN(prog, buf)
    return buf.raw


CUDA = None


def cuda():
    global CUDA
    if CUDA is None:
        CUDA = ctypes.CDLL("libcuda.so.1")
    return CUDA


class TensorMap:
    """A CUtensorMap of a 2-D uint8 tensor [outer, inner] (row stride `stride` bytes), boxes of
    `box_rows` × 128 bytes in the 128-byte swizzle, in 64-byte aligned host memory."""

    def __init__(self, ptr, inner, outer, stride, box_rows):
        self._buf = ctypes.create_string_buffer(128 + 64)
        addr = (ctypes.addressof(self._buf) + 63) // 64 * 64
        self.map = (ctypes.c_uint8 * 128).from_address(addr)
        dims = (ctypes.c_uint64 * 2)(inner, outer)
        strides = (ctypes.c_uint64 * 1)(stride)
        box = (ctypes.c_uint32 * 2)(128, box_rows)
        estr = (ctypes.c_uint32 * 2)(1, 1)
        rc = cuda().cuTensorMapEncodeTiled(ctypes.c_void_p(addr), 0, 2, ctypes.c_void_p(ptr), dims,
                                           strides, box, estr, 0, 3, 2, 0)
        if rc != 0:
            raise RuntimeError(f"cuTensorMapEncodeTiled: {rc}")


def launch(fn, grid, block, smem, args):
    """cuLaunchKernel on the legacy default stream; args are ctypes objects."""
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    g = [int(x) for x in grid] + [1] * (3 - len(grid))
    ptr = fn.ptr if hasattr(fn, "ptr") else fn.kernel.ptr
    rc = cuda().cuLaunchKernel(ctypes.c_void_p(ptr), g[0], g[1], g[2], block, 1, 1, smem,
                               None, params, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernel: {rc}")


class Att8:
    """The host side of a call, as the runner's operator does it."""

    def __init__(self, cubin_path):
        self.mod = cp.RawModule(path=cubin_path)
        f = self.mod.get_function
        self.stats = f("unstep_att8_stats_f16")
        self.reduce = f("unstep_att8_stats_reduce")
        self.qq = f("unstep_att8_quant_q_f16")
        self.kq = f("unstep_att8_quant_k_f16")
        self.vq = f("unstep_att8_quant_v_f16")
        self.kernels = {}

    PIPE_SMEM = 1024 + 2 * 8192 + 4 * 2 * 128 * 128 + 8 * 9

    def add_kernel(self, name, cubin_path):
        mod = cp.RawModule(path=cubin_path)
        fn = mod.get_function("unstep_att8_fwd")
        fn.max_dynamic_shared_size_bytes = self.PIPE_SMEM
        self.kernels[name] = (mod, fn)

    def attend(self, t, o, name):
        if "maps" not in t:
            BH = t["B"] * t["H"]
            t["maps"] = (
                TensorMap(t["qq"].data.ptr, 128, BH * t["Spad"], 128, 64),
                TensorMap(t["kq"].data.ptr, 128, BH * t["Lpad"], 128, 128),
                TensorMap(t["vt"].data.ptr, t["Lpad"], BH * 128, t["Lpad"], 128),
            )
        mq, mk, mv = t["maps"]
        c = ctypes
        args = [mq.map, mk.map, mv.map,
                c.c_uint64(t["qscale"].data.ptr), c.c_uint64(t["kscale"].data.ptr),
                c.c_uint64(t["vscale"].data.ptr), c.c_uint64(o.data.ptr),
                c.c_int32(t["S"]), c.c_int32(t["Spad"]), c.c_int32(t["L"]), c.c_int32(t["Lpad"]),
                c.c_int32(t["D"]), c.c_int64(t["S"] * t["D"]),
                c.c_float(math.log2(math.e) / math.sqrt(HD))]
        launch(self.kernels[name][1], (t["Spad"] // 128, t["H"], t["B"]), 384, self.PIPE_SMEM,
               args)

    def prepare(self, q, k, v, splits=32):
        """q [B, S, D], k and v [B, L, D] cupy float16 → the quantised tensors."""
        B, S, D = q.shape
        L = k.shape[1]
        H = D // HD
        Spad = -(-S // 128) * 128
        Lpad = -(-L // 128) * 128
        per = (-(-L // splits) + 15) // 16 * 16  # a multiple of 16 (the stats kernel's rows)
        t = dict(B=B, S=S, L=L, D=D, H=H, Spad=Spad, Lpad=Lpad)
        t["ksum"] = cp.empty((B, splits, D), cp.float32)
        t["vmax"] = cp.empty((B, splits, D), cp.float32)
        t["kmean"] = cp.empty((B, D), cp.float32)
        t["vscale"] = cp.empty((B, D), cp.float32)
        t["qq"] = cp.empty((B, H, Spad, HD), cp.int8)
        t["qscale"] = cp.empty((B, H, Spad // 16), cp.float32)
        t["kq"] = cp.empty((B, H, Lpad, HD), cp.int8)
        t["kscale"] = cp.empty((B, H, Lpad // 64), cp.float32)
        t["vt"] = cp.empty((B, H, HD, Lpad), cp.uint8)
        t["splits"] = splits
        t["per"] = per
        return t

    def quantise(self, t, q, k, v):
        B, S, L, D, H = t["B"], t["S"], t["L"], t["D"], t["H"]
        i32, i64 = np.int32, np.int64
        self.stats((H, t["splits"], B), (256,), (k, v, t["ksum"], t["vmax"], i32(L), i32(D),
                                                 i64(L * D), i32(t["per"])))
        self.reduce((-(-B * D // 256),), (256,), (t["ksum"], t["vmax"], t["kmean"], t["vscale"],
                                                 i32(t["splits"]), i32(L), i32(D), i32(B)))
        self.qq((t["Spad"] // 64, H, B), (256,), (q, t["qq"], t["qscale"], i32(S), i32(t["Spad"]),
                                                 i32(D), i64(S * D)))
        self.kq((t["Lpad"] // 64, H, B), (256,), (k, t["kmean"], t["kq"], t["kscale"], i32(L),
                                                 i32(t["Lpad"]), i32(D), i64(L * D)))
        self.vq((t["Lpad"] // 64, H, B), (256,), (v, t["vscale"], t["vt"], i32(L), i32(t["Lpad"]),
                                                 i32(D), i64(L * D)))


def perm16():
    p = np.arange(16)
    return np.where(p % 4 < 2, 2 * (p // 4) + p % 4, 8 + 2 * (p // 4) + p % 4 - 2)


def reference(q, k, v):
    """float64 attention of [B, S, D] float arrays (numpy)."""
    B, S, D = q.shape
    H = D // HD
    out = np.empty((B, S, D))
    for b in range(B):
        for h in range(H):
            sl = slice(h * HD, (h + 1) * HD)
            s = q[b, :, sl] @ k[b, :, sl].T / math.sqrt(HD)
            s -= s.max(axis=1, keepdims=True)
            p = np.exp(s)
            out[b, :, sl] = (p / p.sum(axis=1, keepdims=True)) @ v[b, :, sl]
    return out


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def checks(att, log):
    """Small cases with padding on both sides; returns True when all pass."""
    ok = True
    rng = np.random.default_rng(0)
    for (B, S, L, name, how) in [
        (1, 200, 300, "random", "random"),
        (2, 130, 257, "random, batch 2", "random"),
        (1, 200, 300, "V constant per channel", "vconst"),
        (1, 200, 300, "Q zero: uniform weights", "qzero"),
        (1, 333, 1000, "K with a large mean", "kmean"),
    ]:
        D = 2 * HD
        qn = rng.standard_normal((B, S, D)).astype(np.float16)
        kn = rng.standard_normal((B, L, D)).astype(np.float16)
        vn = rng.standard_normal((B, L, D)).astype(np.float16)
        if how == "vconst":
            vn[:] = rng.standard_normal((B, 1, D)).astype(np.float16)
        if how == "qzero":
            qn[:] = 0
        if how == "kmean":
            kn = (kn.astype(np.float32) + 8 * rng.standard_normal((B, 1, D))).astype(np.float16)
        q, k, v = cp.asarray(qn), cp.asarray(kn), cp.asarray(vn)
        row = {"case": name, "B": B, "S": S, "L": L}
        ref = reference(qn.astype(np.float64), kn.astype(np.float64), vn.astype(np.float64))
        t = att.prepare(q, k, v)
        att.quantise(t, q, k, v)
        for name in variants(att):
            o = cp.full(q.shape, cp.nan, cp.float16)
            run(att, t, o, name)
            cp.cuda.Device().synchronize()
            on = cp.asnumpy(o).astype(np.float64)
            row[f"rel_err_{name}"] = rel(on, ref)
            row[f"nan_{name}"] = int(np.isnan(on).sum())
        # The quantised tensors against numpy's quantisation of the same inputs.
        kmean = kn.astype(np.float32)[:, ::8].mean(axis=1)
        row["kmean_max_abs_diff"] = float(np.abs(cp.asnumpy(t["kmean"]) - kmean).max())
        qs = cp.asnumpy(t["qscale"])
        qq = cp.asnumpy(t["qq"]).astype(np.float64)
        deq = (qq * np.repeat(qs, 16, axis=2)[..., None])[:, :, :S]  # [B, H, S, HD]
        qback = deq.transpose(0, 2, 1, 3).reshape(B, S, D)
        row["q_dequant_rel"] = rel(qback, qn.astype(np.float64))
        ks = cp.asnumpy(t["kscale"])
        kq = cp.asnumpy(t["kq"]).astype(np.float64)
        kdeq = (kq * np.repeat(ks, 64, axis=2)[..., None])[:, :, :L].transpose(0, 2, 1, 3)
        row["k_dequant_rel"] = rel(kdeq.reshape(B, L, D) + kmean[:, None, :],
                                   kn.astype(np.float64))
        vt = cp.asnumpy(t["vt"])
        vals = cp.asnumpy(cp.asarray(vt).view(cp.uint8))
        table = e4m3_table()
        vdeq = table[vals] * cp.asnumpy(t["vscale"]).reshape(B, t["H"], HD)[..., None]
        # undo the permutation: position p of each 16 holds key PERM16(p)
        Lp = t["Lpad"]
        idx = (np.arange(Lp) // 16) * 16 + perm16()[np.arange(Lp) % 16]
        vkeys = np.empty_like(vdeq)
        vkeys[..., idx] = vdeq
        vback = vkeys[..., :L].transpose(0, 3, 1, 2).reshape(B, L, D)
        row["v_dequant_rel"] = rel(vback, vn.astype(np.float64))
        limit = 0.01 if how == "vconst" else 0.06
        passed = all(row[f"rel_err_{n}"] < limit and row[f"nan_{n}"] == 0 for n in variants(att))
        row["pass"] = passed
        ok &= passed
        log(row)
    return ok


def variants(att):
    return list(att.kernels)


def run(att, t, o, name):
    att.attend(t, o, name)


def e4m3_table():
    codes = np.arange(256)
    s = np.where(codes & 0x80, -1.0, 1.0)
    e = (codes >> 3) & 0xF
    m = codes & 7
    val = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
    val = np.where((e == 15) & (m == 7), np.nan, val)
    return s * val


def bench_ms(fn, reps=30, warm=5):
    for _ in range(warm):
        fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    return float(np.median(times))


def speed(att, log):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    S, H = 4680, 12
    D = H * HD
    g = torch.Generator(device="cuda").manual_seed(0)
    for blocks in range(1, 8):
        L = 4680 * blocks
        qt = torch.randn(1, S, D, device="cuda", dtype=torch.float16, generator=g)
        kt = torch.randn(1, L, D, device="cuda", dtype=torch.float16, generator=g)
        # a per-channel offset in K, as trained projections have
        kt += 2 * torch.randn(1, 1, D, device="cuda", dtype=torch.float16, generator=g)
        vt = torch.randn(1, L, D, device="cuda", dtype=torch.float16, generator=g)
        q, k, v = cp.from_dlpack(qt), cp.from_dlpack(kt), cp.from_dlpack(vt)

        backend = [SDPBackend.CUDNN_ATTENTION]

        def sdpa():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    qt.view(1, S, H, HD).transpose(1, 2), kt.view(1, L, H, HD).transpose(1, 2),
                    vt.view(1, L, H, HD).transpose(1, 2))

        try:
            ref16 = sdpa().transpose(1, 2).reshape(1, S, D)
        except RuntimeError:
            backend[:] = [SDPBackend.FLASH_ATTENTION]
            ref16 = sdpa().transpose(1, 2).reshape(1, S, D)
        ref32 = torch.nn.functional.scaled_dot_product_attention(
            qt.float().view(1, S, H, HD).transpose(1, 2), kt.float().view(1, L, H, HD).transpose(1, 2),
            vt.float().view(1, L, H, HD).transpose(1, 2)).transpose(1, 2).reshape(1, S, D)
        t = att.prepare(q, k, v)
        o = cp.empty_like(q)
        row = {"L": L, "fp16_backend": str(backend[0])}
        flop = 4.0 * S * L * D
        row["fp16_sdpa_us"] = 1e3 * bench_ms(sdpa)
        row["quantise_us"] = 1e3 * bench_ms(lambda: att.quantise(t, q, k, v))
        att.quantise(t, q, k, v)
        for name in variants(att):
            run(att, t, o, name)
            cp.cuda.Device().synchronize()
            o8 = torch.from_dlpack(o).float()
            row[f"rel_err_{name}_vs_fp32"] = float((o8 - ref32).norm() / ref32.norm())
            row[f"attend_{name}_us"] = 1e3 * bench_ms(lambda: run(att, t, o, name))
            row[f"tflops_{name}"] = flop / (row[f"attend_{name}_us"] * 1e-6) / 1e12
        row["rel_err_fp16_vs_fp32"] = float((ref16.float() - ref32).norm() / ref32.norm())
        row["fp16_tflops"] = flop / (row["fp16_sdpa_us"] * 1e-6) / 1e12
        best = min(row[f"attend_{n}_us"] for n in variants(att))
        row["int8_total_over_fp16"] = (best + row["quantise_us"]) / row["fp16_sdpa_us"]
        rows.append(row)
        log(row)
    return rows


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    results = {"device": torch.cuda.get_device_name(), "rows": []}
    path = os.path.join(out, "attention8.json")

    def log(row):
        print(json.dumps(row), flush=True)
        results["rows"].append(row)
        with open(path, "w") as f:
            json.dump(results, f, indent=1)

    cubin = sys.argv[2] if len(sys.argv) > 2 else None
    if cubin is None:
        t0 = time.time()
        image = nvrtc_compile()
        cubin = os.path.join(out, "attention8.cubin")
        open(cubin, "wb").write(image)
        log({"nvrtc_compile_s": time.time() - t0})
    att = Att8(cubin)
    # More sources of unstep_att8_fwd to compare: ATT8_VARIANTS="name=path.cu,..."
    for spec in filter(None, os.environ.get("ATT8_VARIANTS", "").split(",")):
        name, path = spec.split("=")
        image = nvrtc_compile(path)
        vpath = os.path.join(out, f"{name}.cubin")
        open(vpath, "wb").write(image)
        att.add_kernel(name, vpath)
    att.add_kernel("attention8", cubin)
    ok = checks(att, log)
    log({"checks_pass": ok})
    rows = speed(att, log)
    print()
    names = variants(att)
    print("| keys | fp16 cuDNN µs | quantise µs | " + " | ".join(f"{n} µs" for n in names) +
          " | TFLOP/s fp16 / best | (best + quantise) / fp16 | rel err best / fp16 vs fp32 |")
    print("|" + " --- |" * (6 + len(names)))
    for r in rows:
        bn = min(names, key=lambda n: r[f"attend_{n}_us"])
        print(f"| {r['L']} | {r['fp16_sdpa_us']:.1f} | {r['quantise_us']:.1f} | " +
              " | ".join(f"{r[f'attend_{n}_us']:.1f}" for n in names) +
              f" | {r['fp16_tflops']:.0f} / {r[f'tflops_{bn}']:.0f} ({bn}) | "
              f"{r['int8_total_over_fp16']:.3f} | {r[f'rel_err_{bn}_vs_fp32']:.2e} / "
              f"{r['rel_err_fp16_vs_fp32']:.2e} |")


if __name__ == "__main__":
    main()

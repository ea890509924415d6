"""PyTorch reference side of scripts/bench-gpu, and the comparison table.

`reference`: the exporter's PyTorch reference (eager, same preset and seeded weights as the bundle,
same prompts and noise) timed per phase with CUDA events, as `unstep_export sample` does; saves
prompt 0's latents and frames for parity. With `--compile`, the same with the DiT and the
decoder under `torch.compile` (default mode), the strongest PyTorch a user would run: the warmup
generation compiles every block's shape and the decoder's first and later frames, and its time
beyond the steady mean is recorded as `compile_s`, apart from the per-video figures.
`table`: reads the runner's timing JSONL files and the reference's, prints the table (each
system's time over the compiled reference's), eager and compiled PyTorch side by side, each
runner variant's speed-up over both, and the parity.

DiT FLOPs per video (stated formula): per pass, 2·N_lin·T for the linear layers (N_lin = the
DiT's linear-layer parameters per token: 30 layers × (4·D² self-attn + 2·D² cross q/o +
2·D·D cross k/v over text + 2·D·F FFN), with cross-attention K/V over 512 text tokens counted
once per pass) plus attention 4·T·(P+T)·D per layer (QKᵀ and PV) for self-attention and
4·T·512·D for cross-attention, T = 4680 tokens, P = past tokens of the block.
"""
import json
import sys
import time
from pathlib import Path

import numpy as np


def dit_flops(blocks=7, passes=5, layers=30, D=1536, F=8960, T=4680, text=512):
    total = 0.0
    for b in range(blocks):
        P = b * T
        lin = layers * (2 * T * (4 * D * D + 2 * D * D + 2 * D * F) + 2 * text * 2 * D * D)
        attn = layers * (4 * T * (P + T) * D + 4 * T * text * D)
        total += passes * (lin + attn)
    return total


def reference(args):
    import torch
    sys.path.insert(0, args.export)
    from unstep_export.__main__ import _models  # noqa: F401  (weights exactly as `sample`)
    from unstep_export.config import preset
    from unstep_export.sample import Settings, TorchBackend, generate
    import argparse

    cfg = preset("wan-1.3b")
    ns = argparse.Namespace(preset="wan-1.3b", checkpoint=None, text_checkpoint=None,
                            vae_checkpoint=None, threads=8, svd_rank=None)
    dit, te, vae = _models(ns, cfg)
    prompts = Path(args.prompts).read_text().splitlines()
    s = Settings()
    out = []
    mode = "compile" if args.compile else "eager"
    for sdpa in args.sdpa:
        backend = TorchBackend(dit, te, vae, "cuda", torch.float16, sdpa)
        if args.compile:
            # Recompiles once per block shape (the past grows each block): raise the limit so
            # that every shape is compiled rather than falling back to eager.
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            backend.dit = torch.compile(backend.dit)
            # The decoder runs frame by frame through `decode_frame` (the first frame without
            # causal caches, the others with them), not through `forward`: compile that method,
            # taken from the class so that a second SDPA backend does not compile it twice.
            vae = backend.vae
            vae.decode_frame = torch.compile(type(vae).decode_frame.__get__(vae))
        recs = []
        for i, idx in enumerate([args.indices[0]] + args.indices):
            torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            res, tm = generate(backend, cfg, prompts[idx], idx, s)
            rec = {"side": "pytorch", "mode": mode, "sdpa": sdpa, "prompt": idx, "warmup": i == 0,
                   "compiled": ["dit", "vae"] if args.compile else [],
                   "dit_s": tm["dit"], "vae_s": tm["vae"], "timed_total_s": tm["dit"] + tm["vae"],
                   "wall_s": time.perf_counter() - start,
                   "peak_bytes": torch.cuda.max_memory_allocated()}
            print(json.dumps(rec), flush=True)
            recs.append(rec)
            if i == 1 and sdpa == args.sdpa[0] and not args.compile:
                np.save(f"{args.dump}/ref_latents_{idx}.npy", res["latents"].numpy())
                np.save(f"{args.dump}/ref_frames_{idx}.npy", res["frames"].numpy())
        steady = np.mean([r["wall_s"] for r in recs[1:]])
        recs[0]["compile_s"] = recs[0]["wall_s"] - steady if args.compile else 0.0
        out.extend(recs)
        del backend
        torch.cuda.empty_cache()
    Path(args.out).write_text("\n".join(json.dumps(r) for r in out) + "\n")


def table(args):
    flops = dit_flops()
    rows = []
    for path in args.runner:
        recs = [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]
        name = Path(path).stem
        rows.append((f"runner {name}", recs))
    ref = []
    for path in args.ref:
        ref += [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]
    compile_times = []
    means = {}  # (mode, sdpa) -> the reference's mean s/video
    for mode, sdpa in dict.fromkeys((r.get("mode", "eager"), r["sdpa"]) for r in ref):
        recs = [r for r in ref if r.get("mode", "eager") == mode and r["sdpa"] == sdpa]
        label = "torch.compile (DiT+VAE)" if mode == "compile" else "eager"
        measured = [r for r in recs if not r["warmup"]]
        rows.append((f"pytorch {label} fp16 sdpa={sdpa}", measured))
        if measured:
            means[(mode, sdpa)] = np.mean([r["timed_total_s"] for r in measured])
        if mode == "compile":
            compile_times += [(sdpa, r["compile_s"]) for r in recs if r["warmup"]]
    compiled = min((t for (mode, _), t in means.items() if mode == "compile"), default=None)
    print(f"DiT FLOPs per video (formula in benches/gpu_reference.py): {flops / 1e15:.3f} PFLOP")
    print(f"{'system':48} {'n':>2} {'s/video':>8} {'DiT s':>7} {'VAE s':>7} {'÷compiled':>9} {'DiT TFLOP/s':>11} {'%790':>5} {'peak GiB':>8}")
    speedups = []
    for name, recs in rows:
        if not recs:
            continue
        tot = np.mean([r["timed_total_s"] for r in recs])
        dit = np.mean([r["dit_s"] for r in recs])
        vae = np.mean([r["vae_s"] + r.get("layout_s", 0.0) for r in recs])
        peaks = [r.get("peak_bytes") or r.get("peak_device_memory_bytes") for r in recs]
        peaks = [p for p in peaks if p]
        peak = f"{max(peaks) / 2**30:.1f}" if peaks else "n/a"
        tf = flops / dit / 1e12
        ratio = f"{tot / compiled:9.3f}" if compiled else f"{'n/a':>9}"
        print(f"{name:48} {len(recs):>2} {tot:8.3f} {dit:7.3f} {vae:7.3f} {ratio} {tf:11.0f} {100 * tf / 790:5.1f} {peak:>8}")
        if name.startswith("runner"):
            speedups.append((name, tot))
    # Eager and compiled PyTorch side by side, per SDPA backend measured both ways.
    for (mode, sdpa), e in means.items():
        if mode == "eager" and ("compile", sdpa) in means:
            c = means[("compile", sdpa)]
            print(f"pytorch sdpa={sdpa}: eager {e:.3f} s/video, torch.compile (DiT+VAE) {c:.3f} s/video "
                  f"({e / c:.2f}x eager)")
    eager = min((t for (mode, _), t in means.items() if mode == "eager"), default=None)
    for name, tot in speedups:
        against = [f"{compiled / tot:.2f}x PyTorch torch.compile (DiT+VAE)" if compiled else
                   "no torch.compile reference"]
        if eager:
            against.append(f"{eager / tot:.2f}x PyTorch eager")
        print(f"{name}: {', '.join(against)}")
    for sdpa, seconds in compile_times:
        print(f"torch.compile sdpa={sdpa}: compiling took {seconds:.1f} s (warmup generation beyond the steady time)")
    # Parity: the runner's prompt against the reference on the same weights and noise.
    idx = args.parity_index
    lat_r = np.fromfile(f"{args.dump}/latents_{idx}.f32", dtype=np.float32)
    lat_p = np.load(f"{args.dump}/ref_latents_{idx}.npy").astype(np.float32).ravel()
    fr_r = np.fromfile(f"{args.dump}/frames_{idx}.u8", dtype=np.uint8).astype(np.int32)
    fr_p = np.load(f"{args.dump}/ref_frames_{idx}.npy").astype(np.int32).ravel()
    rel = np.linalg.norm(lat_r - lat_p) / np.linalg.norm(lat_p)
    d = np.abs(fr_r - fr_p)
    mse = float(np.mean(d.astype(np.float64) ** 2))
    psnr = f"{10 * np.log10(255.0**2 / mse):.1f} dB" if mse > 0 else "inf (identical)"
    print(f"parity prompt {idx} ({Path(args.runner[0]).stem} against eager PyTorch fp16): latents relative "
          f"L2 error {rel:.3e}, max abs {np.abs(lat_r - lat_p).max():.3e}; frames max abs diff {d.max()}, "
          f"mean {d.mean():.3f}, share > 8: {(d > 8).mean():.4f}, PSNR {psnr}")


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    r.add_argument("--export", required=True)
    r.add_argument("--prompts", required=True)
    r.add_argument("--indices", type=int, nargs="+", required=True)
    r.add_argument("--sdpa", nargs="+", default=["cudnn", "flash"])
    r.add_argument("--dump", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--compile", action="store_true",
                   help="the DiT and the decoder under torch.compile (default mode)")
    t = sub.add_parser("table")
    t.add_argument("--runner", nargs="+", required=True)
    t.add_argument("--ref", nargs="+", required=True)
    t.add_argument("--dump", required=True)
    t.add_argument("--parity-index", type=int, default=0)
    a = p.parse_args()
    {"reference": reference, "table": table}[a.cmd](a)

"""CLI: python -m unstep_export {export,golden,parity,fused-check,sample,selftest} (run with PYTHONPATH=assets/export)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .config import preset


def _threads(n):
    if n:
        torch.set_num_threads(n)


def _models(args, cfg):
    from .build import build

    return build(cfg, args.checkpoint, args.text_checkpoint, args.vae_checkpoint)


def _check_vae_only(args, out: Path, precision: str):
    """--only vae writes into an existing bundle of the same preset, precision and SVD rank."""
    import tomllib

    toml = out / "bundle.toml"
    if not toml.is_file():
        raise SystemExit(f"--only vae: {toml} not found; it replaces the VAE graphs of an existing bundle "
                         "(export the whole bundle first)")
    meta = tomllib.loads(toml.read_text(encoding="utf-8"))
    have = (meta.get("preset"), meta.get("precision"), meta.get("export", {}).get("svd_rank"))
    want = (args.preset, precision, args.svd_rank or "none")
    if have != want:
        raise SystemExit(f"--only vae: {toml} is preset {have[0]}, {have[1]}, svd rank {have[2]}; this export is "
                         f"{want[0]}, {want[1]}, svd rank {want[2]}")
    return meta


def cmd_export(args):
    from . import export as ex
    from .model import factorise

    cfg = preset(args.preset)
    precision = args.precision or ("fp32" if args.preset == "tiny" else "fp16")
    dtype = ex.DTYPES[precision]
    out = Path(args.out)
    only_vae = args.only == "vae"
    if only_vae:
        _check_vae_only(args, out, precision)
    dit, te, vae = _models(args, cfg)
    from .vae import RMSNorm as VaeRmsNorm

    VaeRmsNorm.export_mode = args.vae_norm
    svd = args.svd_rank or None
    if svd and not only_vae:  # --only vae writes no DiT graph: nothing to factorise
        n = factorise(dit, svd)
        print(f"svd rank {svd}: factorised {n} linear layers")
    dev = torch.device(args.device)
    vae = vae.to(dev, dtype)
    if not only_vae:
        dit, te = dit.to(dev, dtype), te.to(dev, dtype)
    out.mkdir(parents=True, exist_ok=True)
    vae_graphs = ("vae_first", "vae_step", "vae_first_fused", "vae_step_fused")
    graphs = ("dit", "dit_fused", "text_encoder") + vae_graphs
    for graph in vae_graphs if only_vae else graphs:
        for stale in (f"{graph}.onnx", f"{graph}.onnx.data"):
            # A hard-linked copy of another bundle keeps that bundle's files: unlink, never overwrite.
            (out / stale).unlink(missing_ok=True)
    (out / "bundle.toml").unlink(missing_ok=True)
    t = time.time()
    if not only_vae:
        ex.export_text(te, cfg, out, dtype, dev)
        ex.export_dit(dit, cfg, out, dtype, dev)
    n = ex.export_vae(vae, cfg, out, dtype, dev)
    # Last, so that the graphs above are traced exactly as before (same random trace inputs).
    if not only_vae:
        if args.no_fused_dit:
            print("dit_fused.onnx: skipped (--no-fused-dit)")
        elif precision not in ex.FUSED_PRECISIONS:
            print(f"dit_fused.onnx: skipped ({precision}: the runner's ai.unstep kernels do fp32 and fp16)")
        else:
            ex.export_dit(dit, cfg, out, dtype, dev, fused_ops=True)
    if args.no_fused_vae:
        print("vae_first_fused.onnx, vae_step_fused.onnx: skipped (--no-fused-vae)")
    elif precision not in ex.FUSED_PRECISIONS:
        print(f"vae_*_fused.onnx: skipped ({precision}: the runner's ai.unstep kernels do fp32 and fp16)")
    elif args.vae_norm != "transpose":
        print(f"vae_*_fused.onnx: skipped (--vae-norm {args.vae_norm}: they fuse the channels-last norm)")
    else:
        ex.export_vae(vae, cfg, out, dtype, dev, fused_ops=True)
    notes = []
    if not args.checkpoint:
        notes.append("Seeded random weights (no checkpoint given).")
    if cfg.text.layers != 24 and args.preset == "wan-1.3b":
        notes.append(f"Text encoder: UMT5-style with {cfg.text.layers} layers (UMT5-XXL has 24) to keep the export small.")
    if precision == "bf16":
        notes.append("bf16: ORT's CUDA MultiHeadAttention has no bf16 kernel; prefer fp16.")
    ex.write_toml(cfg, out, precision, svd, "\n".join(notes))
    what = "the VAE graphs of " if only_vae else ""
    print(f"wrote {what}{out} ({n} VAE cache tensors) in {time.time() - t:.1f}s")


def _settings(args):
    from .sample import Settings

    s = Settings(seed=args.seed, clean_sigma=args.clean_sigma)
    if args.steps:
        s.denoising_steps = [int(x) for x in args.steps.split(",")]
    return s


def _schedule(s):
    """The float32 sigmas and timesteps the loop uses, for debugging a runner against them."""
    from .sample import sigma_of

    sig64 = [sigma_of(st, s) for st in s.denoising_steps]
    return {
        "sigmas_f32": [float(np.float32(x)) for x in sig64],
        "timesteps_f32": [float(np.float32(1000.0 * x)) for x in sig64],
        "clean_sigma_f32": float(np.float32(s.clean_sigma)),
        "clean_timestep_f32": float(np.float32(1000.0 * s.clean_sigma)),
        "draws_per_block": len(s.denoising_steps) + 1,
    }


def cmd_golden(args):
    """Reference outputs of the PyTorch model (fp32, CPU) for the Rust runner's parity tests."""
    from safetensors.torch import save_file

    from .sample import Settings, TorchBackend, generate

    cfg = preset(args.preset)
    dit, te, vae = _models(args, cfg)
    backend = TorchBackend(dit, te, vae, "cpu", torch.float32)
    prompts = Path(args.prompts).read_text(encoding="utf-8").splitlines()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tensors, entries = {}, []
    base = Settings(seed=args.seed)

    def add(name, t, meaning, idx, settings, extra=None):
        tensors[name] = t.contiguous()
        e = {"name": name, "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "meaning": meaning,
             "prompt_index": idx, "prompt": prompts[idx], "settings": settings.to_dict()}
        if extra:
            e.update(extra)
        entries.append(e)

    for idx in args.indices:
        r, tm = generate(backend, cfg, prompts[idx], idx, base)
        p = f"p{idx}"
        add(f"{p}.input_ids", r["input_ids"], "token ids (bytes tokenizer), int64 [1, text_len]", idx, base)
        add(f"{p}.attention_mask", r["attention_mask"], "attention mask, int64 [1, text_len]", idx, base)
        add(f"{p}.context", r["context"], "text encoder output [1, text_len, text_dim]", idx, base)
        add(f"{p}.noise_d0", r["noise_d0"], "Philox noise of draw d=0 (block 0 initial noise) [1,16,F,h,w]", idx, base)
        add(f"{p}.latents", r["latents"], "final latents before de-normalisation [1,16,latent_frames,h,w]", idx, base)
        frames = r["frames"]
        extra = None
        if idx != args.indices[0] and args.partial_frames:
            # Size budget: later prompts keep only their first frames (1 + 4k of them).
            frames = frames[: args.partial_frames]
            extra = {"note": f"first {args.partial_frames} of {r['frames'].shape[0]} frames only (size budget)"}
        add(f"{p}.frames", frames, "uint8 video [frames, height, width, 3] RGB", idx, base, extra)
        print(f"prompt {idx}: {tm}")
    if args.extra_clean_sigma is not None:
        idx = args.indices[0]
        s2 = Settings(seed=args.seed, clean_sigma=args.extra_clean_sigma)
        r, _ = generate(backend, cfg, prompts[idx], idx, s2)
        tag = str(args.extra_clean_sigma).replace(".", "p")
        add(f"p{idx}.clean_sigma_{tag}.latents", r["latents"], "final latents with a different clean_sigma", idx, s2)
    save_file(tensors, str(out / "golden.safetensors"))
    meta = {
        "description": "Reference outputs of the PyTorch implementation (fp32, CPU) for the tiny bundle; "
                       "see assets/export/README.md. Tolerances the exporter checks ONNX against: "
                       "latents 1e-3 abs, frames +-1.",
        "bundle": "..",
        "prompts_file": "assets/prompts/tiny.txt",
        "exporter_version": __import__("unstep_export").EXPORTER_VERSION,
        "conventions": {
            "sigma": "float64 from the step, cast once to float32; timestep = float32(1000*sigma64)",
            "uint8": "round half away from zero of (clamp(x,-1,1)+1)*127.5 in float32",
        },
        "schedule": _schedule(base),
        "tensors": entries,
    }
    (out / "golden.json").write_text(json.dumps(meta, indent=2) + "\n")
    size = (out / "golden.safetensors").stat().st_size
    print(f"wrote {out}/golden.safetensors ({size / 1e6:.2f} MB)")


def cmd_parity(args):
    from .parity import run_parity

    sys.exit(run_parity(args))


def cmd_fused_check(args):
    from .parity import run_fused_check

    sys.exit(run_fused_check(args))


def cmd_sample(args):
    from .sample import OrtBackend, TorchBackend, generate

    cfg = preset(args.preset)
    prompts = Path(args.prompts).read_text(encoding="utf-8").splitlines()
    s = _settings(args)
    if args.backend == "ort":
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if args.device == "cuda" else None
        backend = OrtBackend(args.bundle, cfg, threads=args.threads or 2, providers=providers)
    else:
        dit, te, vae = _models(args, cfg)
        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
        backend = TorchBackend(dit, te, vae, args.device, dtype, args.sdpa)
    for r in range(args.repeat):
        for idx in args.indices:
            t = time.perf_counter()
            res, tm = generate(backend, cfg, prompts[idx], idx, s)
            wall = time.perf_counter() - t
            print(json.dumps({"prompt_index": idx, "repeat": r, "wall_s": round(wall, 4),
                              **{f"{k}_s": round(v, 4) for k, v in tm.items()}}))
            if args.save:
                np.save(f"{args.save}_p{idx}.npy", res["frames"].numpy())


def cmd_selftest(args):
    from . import noise

    noise.selftest()
    print("philox4x32-10 known-answer vectors: ok")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m unstep_export")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("--preset", default="tiny", choices=["tiny", "wan-1.3b"])
        p.add_argument("--checkpoint", help="DiT state dict (.safetensors or torch); seeded random weights otherwise")
        p.add_argument("--text-checkpoint", help="text encoder state dict")
        p.add_argument("--vae-checkpoint", help="Wan VAE state dict (decoder side is used)")
        p.add_argument("--threads", type=int, default=2)

    p = sub.add_parser("export", help="write a bundle")
    common(p)
    p.add_argument("--out", required=True)
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], help="default fp32 for tiny, fp16 otherwise")
    p.add_argument("--svd-rank", type=int, default=None)
    p.add_argument("--device", default="cpu",
                   help="device the export traces on; use cuda for wan-1.3b fp16 (fp16 on CPU is very slow)")
    p.add_argument("--vae-norm", choices=["transpose", "reduce"], default="transpose",
                   help="VAE RMS norms as channels-last SimplifiedLayerNormalization (default) or ReduceL2 + divide")
    p.add_argument("--no-fused-dit", action="store_true",
                   help="do not write dit_fused.onnx (the DiT with the runner's ai.unstep operators; fp32/fp16 only)")
    p.add_argument("--only", choices=["all", "vae"], default="all",
                   help="vae: replace only the VAE graphs (standard and fused) of the bundle at --out, of the same "
                        "preset, precision and SVD rank, and rewrite its bundle.toml; for A/B runs of decoder changes "
                        "on a hard-linked copy of a bundle (cp -al), without exporting the DiT again")
    p.add_argument("--no-fused-vae", action="store_true",
                   help="do not write vae_first_fused.onnx / vae_step_fused.onnx (the VAE decoder with the runner's "
                        "BiasRmsNorm + SiLU op; fp32/fp16 with --vae-norm transpose only)")
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser("golden", help="write golden reference outputs")
    common(p)
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", default="assets/prompts/tiny.txt")
    p.add_argument("--indices", type=int, nargs="+", default=[0, 7])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--extra-clean-sigma", type=float, default=0.01)
    p.add_argument("--partial-frames", type=int, default=17, help="frames kept for prompts after the first (0 = all)")
    p.set_defaults(fn=cmd_golden)

    p = sub.add_parser("parity", help="exported ONNX (onnxruntime) vs the PyTorch reference")
    common(p)
    p.add_argument("--bundle", required=True)
    p.add_argument("--prompts", default="assets/prompts/tiny.txt")
    p.add_argument("--indices", type=int, nargs="+", default=[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--golden", help="also compare the golden directory against a fresh PyTorch run")
    p.add_argument("--latent-tol", type=float, default=1e-3)
    p.add_argument("--frame-tol", type=int, default=1)
    p.add_argument("--graph-tol", type=float, default=1e-3)
    p.add_argument("--svd-rank", type=int, default=None, help="the rank the bundle was exported with")
    p.set_defaults(fn=cmd_parity)

    p = sub.add_parser("sample", help="run the loop (PyTorch or ORT) with per-phase timings")
    common(p)
    p.add_argument("--backend", choices=["torch", "ort"], default="torch")
    p.add_argument("--bundle", help="bundle directory for --backend ort")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32")
    p.add_argument("--sdpa", choices=["flash", "efficient", "cudnn", "math"], help="SDPA backend (torch)")
    p.add_argument("--prompts", default="assets/prompts/tiny.txt")
    p.add_argument("--indices", type=int, nargs="+", default=[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", help="comma list, default 1000,750,500,250")
    p.add_argument("--clean-sigma", type=float, default=0.02)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--save", help="prefix for .npy frame dumps")
    p.set_defaults(fn=cmd_sample)

    p = sub.add_parser("fused-check",
                       help="exported fused ops vs eager PyTorch, every bias non-zero; dit_fused and vae_*_fused checks")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--bundle", help="also check this bundle's dit_fused.onnx and vae_*_fused.onnx (e.g. assets/tiny)")
    p.set_defaults(fn=cmd_fused_check, threads=None)

    p = sub.add_parser("selftest", help="Philox known-answer test")
    p.set_defaults(fn=cmd_selftest, threads=None)

    args = ap.parse_args(argv)
    _threads(getattr(args, "threads", None))
    args.fn(args)


if __name__ == "__main__":
    main()

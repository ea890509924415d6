"""Exported graphs (Python onnxruntime) vs the PyTorch reference: per graph on random inputs,
then the whole generation loop.  Exit status 1 when any figure is above tolerance."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .config import preset
from .sample import OrtBackend, Settings, TorchBackend, generate
from .text import tokenize_bytes


def _err(got, ref):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    a = float(np.abs(got - ref).max()) if ref.size else 0.0
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    return a, a / scale if scale else 0.0


def run_parity(args) -> int:
    from .build import build

    cfg = preset(args.preset)
    dit, te, vae = build(cfg, args.checkpoint, args.text_checkpoint, args.vae_checkpoint)
    if args.svd_rank:
        from .model import factorise

        factorise(dit, args.svd_rank)  # compare against the same factorised weights
    ort_b = OrtBackend(args.bundle, cfg, threads=args.threads or 2)
    if ort_b.np_dtype != np.float32:
        print("note: non-fp32 bundle; comparing against the fp32 reference, tolerances may need widening")
    failures = []

    def report(name, got, ref, tol):
        a, r = _err(got, ref)
        ok = a <= tol
        print(f"{'ok  ' if ok else 'FAIL'} {name:<38} max_abs {a:.3e}  max_rel {r:.3e}  (tol {tol:g})")
        if not ok:
            failures.append(name)

    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        # text encoder
        prompts = Path(args.prompts).read_text(encoding="utf-8").splitlines()
        ids, mask = tokenize_bytes(prompts[args.indices[0]], cfg.text_len)
        ref = te(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        report("text_encoder", ort_b.text(ids, mask).numpy(), ref, args.graph_tol)

        # DiT, first block (P = 0) and a later block (P = 2 blocks)
        F, T = cfg.frames_per_block, cfg.frames_per_block * cfg.tokens_per_frame
        ctx = torch.from_numpy(ref)
        for P in (0, 2 * T):
            x = torch.randn(1, cfg.latent_channels, F, cfg.lat_h, cfg.lat_w, generator=g)
            pk = [torch.randn(1, P, cfg.dim, generator=g) for _ in range(cfg.layers)]
            pv = [torch.randn(1, P, cfg.dim, generator=g) for _ in range(cfg.layers)]
            off = P // cfg.tokens_per_frame
            rf, rk, rv = dit(x, torch.full((1, F), 750.0), ctx, torch.tensor([off]), pk, pv)
            of, ok_, ov = ort_b.dit_pass(x, 750.0, ctx, off, pk, pv)
            report(f"dit P={P} flow", of.numpy(), rf.numpy(), args.graph_tol)
            report(f"dit P={P} new_k (all layers)", torch.cat(ok_, 1).numpy(), torch.cat(rk, 1).numpy(), args.graph_tol)
            report(f"dit P={P} new_v (all layers)", torch.cat(ov, 1).numpy(), torch.cat(rv, 1).numpy(), args.graph_tol)

        # VAE: first frame, then two steps fed with the reference's own caches
        caches = None
        for i in range(3):
            z = torch.randn(1, cfg.latent_channels, 1, cfg.lat_h, cfg.lat_w, generator=g) * 2
            rf, rc = vae.decode_frame(z, caches)
            # Exported graphs keep the caches channels-last ([1, T, H, W, C]); eager, [1, C, T, H, W].
            last = [c.permute(0, 2, 3, 4, 1).contiguous() for c in rc]
            feed = None if caches is None else [c.permute(0, 2, 3, 4, 1).contiguous().numpy() for c in caches]
            of, oc = ort_b.vae_frame(z, feed)
            name = "vae_first" if i == 0 else f"vae_step #{i}"
            report(f"{name} frames", of.numpy(), rf.numpy(), args.graph_tol)
            report(f"{name} cache_out (all)", np.concatenate([c.reshape(-1) for c in oc]),
                   torch.cat([c.reshape(-1) for c in last]).numpy(), args.graph_tol)
            caches = rc

    # Whole loop
    s = Settings(seed=args.seed)
    ref_b = TorchBackend(dit, te, vae, "cpu", torch.float32)
    figures = {}
    for idx in args.indices:
        r_ref, t_ref = generate(ref_b, cfg, prompts[idx], idx, s)
        r_ort, t_ort = generate(ort_b, cfg, prompts[idx], idx, s)
        print(f"prompt {idx}: torch {json.dumps({k: round(v, 3) for k, v in t_ref.items()})} s, "
              f"ort {json.dumps({k: round(v, 3) for k, v in t_ort.items()})} s")
        report(f"loop p{idx} noise_d0 (exact)", r_ort["noise_d0"].numpy(), r_ref["noise_d0"].numpy(), 0.0)
        report(f"loop p{idx} context", r_ort["context"].numpy(), r_ref["context"].numpy(), args.graph_tol)
        report(f"loop p{idx} latents", r_ort["latents"].numpy(), r_ref["latents"].numpy(), args.latent_tol)
        report(f"loop p{idx} frames (uint8)", r_ort["frames"].numpy(), r_ref["frames"].numpy(), args.frame_tol)
        figures[idx] = (r_ref, r_ort)

    if args.golden:
        from safetensors.numpy import load_file

        gold = load_file(str(Path(args.golden) / "golden.safetensors"))
        for idx, (r_ref, r_ort) in figures.items():
            for key in ("input_ids", "noise_d0", "context", "latents", "frames"):
                name = f"p{idx}.{key}"
                if name not in gold:
                    continue
                ref = gold[name]
                tol = {"input_ids": 0.0, "noise_d0": 0.0, "context": args.graph_tol, "latents": args.latent_tol,
                       "frames": args.frame_tol}[key]
                got = r_ort[key].numpy()[: ref.shape[0]] if key == "frames" else r_ort[key].numpy()
                report(f"golden {name} vs ort", got, ref, tol)

    print("PASS" if not failures else f"FAIL: {', '.join(failures)}")
    return 0 if not failures else 1


def run_fused_check(args) -> int:
    """The exported graphs' fused ops against eager PyTorch with every bias non-zero (seeded
    random weights leave biases at zero, which would hide a wrongly folded value bias or a
    FastGelu bias), for both VAE norm forms.  Exits 1 when a graph differs by more than 1e-4."""
    import tempfile

    import onnxruntime as ort

    from . import export as ex
    from .build import build
    from .vae import RMSNorm as VaeRmsNorm

    cfg = preset(args.preset)
    dit, _, vae = build(cfg)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for mod in (dit, vae):
            for name, p in mod.named_parameters():
                if p.dim() == 1 and not name.endswith("weight"):
                    p.add_(torch.randn(p.shape, generator=g) * 0.3)
    failed = 0

    def report(label, got, ref, tol=1e-4):
        nonlocal failed
        err = float(np.abs(got - ref).max())
        ok = err <= tol * max(1.0, float(np.abs(ref).max()))
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {label:<34} max_abs {err:.3e}")

    def session(path):
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        ex.export_dit(dit, cfg, out, torch.float32)
        f = cfg.frames_per_block
        past = 2 * f * cfg.tokens_per_frame
        x = torch.randn(1, cfg.latent_channels, f, cfg.lat_h, cfg.lat_w, generator=g)
        ts = torch.full((1, f), 700.0)
        ctx = torch.randn(1, cfg.text_len, cfg.text_dim, generator=g)
        off = torch.tensor([2 * f])
        pk = [torch.randn(1, past, cfg.dim, generator=g) for _ in range(cfg.layers)]
        pv = [torch.randn(1, past, cfg.dim, generator=g) for _ in range(cfg.layers)]
        with torch.no_grad():
            # The graph's value cache leaves out the value bias; the eager model's includes it.
            v_bias = [blk.self_attn.v.bias.detach() for blk in dit.blocks]
            flow, nk, nv = dit(x, ts, ctx, off, pk, [v + b for v, b in zip(pv, v_bias)])
        feed = {"x": x.numpy(), "timestep": ts.numpy(), "context": ctx.numpy(), "frame_offset": off.numpy()}
        for i in range(cfg.layers):
            feed[f"past_k.{i}"], feed[f"past_v.{i}"] = pk[i].numpy(), pv[i].numpy()
        res = session(out / "dit.onnx").run(None, feed)
        report("dit flow", res[0], flow.numpy())
        report("dit new_k.0", res[1], nk[0].numpy())
        report("dit new_v.0 + value bias", res[2] + v_bias[0].numpy(), nv[0].numpy())

        z = torch.randn(1, cfg.latent_channels, 1, cfg.lat_h, cfg.lat_w, generator=g)
        with torch.no_grad():
            f0, c0 = vae.decode_frame(z, None)
            f1, _ = vae.decode_frame(z * 0.5, c0)
        for mode in ("transpose", "reduce"):
            VaeRmsNorm.export_mode = mode
            ex.export_vae(vae, cfg, out, torch.float32)
            r0 = session(out / "vae_first.onnx").run(None, {"z": z.numpy()})
            feed = {"z": (z * 0.5).numpy(), **{f"cache_in.{j}": c for j, c in enumerate(r0[1:])}}
            r1 = session(out / "vae_step.onnx").run(None, feed)
            report(f"vae_first frames ({mode} norm)", r0[0], f0.numpy())
            report(f"vae_step frames ({mode} norm)", r1[0], f1.numpy())
        VaeRmsNorm.export_mode = "transpose"
    print("PASS" if not failed else f"FAIL ({failed})")
    return 1 if failed else 0

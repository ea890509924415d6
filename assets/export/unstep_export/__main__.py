"""CLI: python -m unstep_export {export,quantize,golden,parity,fused-check,sample,release-files,download,
selftest} (run with PYTHONPATH=assets/export).  A checkpoint or tokenizer that cannot be used as
given is an error (exit status 2) before anything is written."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import download
from .config import preset

# torch and numpy are imported by the commands that use them: `download` runs where neither is
# installed (a cluster's login node) and must not import them.


def _threads(n):
    if n:
        import torch

        torch.set_num_threads(n)


def _models(args, cfg):
    """The modules the options ask for (checkpoints.parts_from_args); fits `cfg` to them."""
    from . import checkpoints
    from .build import build

    return build(cfg, *checkpoints.parts_from_args(args))


def _bundle_meta(bundle: Path):
    import tomllib

    toml = Path(bundle) / "bundle.toml"
    return tomllib.loads(toml.read_text(encoding="utf-8")) if toml.is_file() else None


def _match_bundle(args, bundle: Path, meta: dict):
    """Fills in from a bundle's bundle.toml what the options leave out, so that the reference
    modules are the ones the bundle was exported from: its tokenizer (the bundle's own copy), the
    DiT's layers and a random-weight text encoder's layers.  Refuses options that contradict it:
    another tokenizer, a file for a part the bundle has seeded random weights for (or none for a
    released one), the other DiT entry."""
    from . import checkpoints
    from .checkpoints import EMA_ENTRY, CheckpointError, sha256

    problems, filled = [], []
    dit, text, vae = checkpoints.parts_from_args(args)
    tok = meta.get("tokenizer", {})
    if tok.get("kind") == "umt5":
        mine = bundle / tok.get("file", "tokenizer.json")
        if not text.tokenizer:
            args.tokenizer = str(mine)
            filled.append(f"--tokenizer {mine}")
        elif mine.is_file() and sha256(text.tokenizer) != sha256(mine):
            problems.append(f"{text.tokenizer} is not the bundle's tokenizer ({mine})")
    elif text.tokenizer:
        problems.append(f"the bundle has the bytes tokenizer; {text.tokenizer} was given")
    layers = meta.get("architecture", {}).get("layers")
    if getattr(args, "dit_layers", None) is None and layers is not None and layers != preset(args.preset).layers:
        args.dit_layers = layers
        filled.append(f"--dit-layers {layers}")
    weights = meta.get("weights", {})
    for part, table, name, flag in (
        (dit, "dit", "DiT", "--self-forcing or --checkpoint"),
        (text, "text_encoder", "text encoder", "--wan-dir or --text-checkpoint"),
        (vae, "vae", "VAE", "--wan-dir or --vae-checkpoint"),
    ):
        w = weights.get(table)
        if not w:
            continue
        if w.get("source") == "released":
            entry = f", entry {w['entry']}" if w.get("entry") else ""
            if not part.path:
                problems.append(f"the bundle's {name} is {w.get('file')}{entry}: give that file ({flag})")
            elif table == "dit" and w.get("entry") and (w["entry"] == EMA_ENTRY) != (part.entry == EMA_ENTRY):
                problems.append(f"the bundle's DiT is entry {w['entry']} of {w.get('file')}: "
                                + ("add --ema" if w["entry"] == EMA_ENTRY else "leave out --ema"))
            elif Path(part.path).name != w.get("file"):
                print(f"note: the bundle's {name} came from a file named {w.get('file')}; comparing with {part.path}")
        elif part.path:
            problems.append(f"the bundle's {name} has seeded random weights; {part.path} was given")
        elif table == "text_encoder" and getattr(args, "text_layers", None) is None:
            n = meta.get("text_encoder", {}).get("layers")
            if n is not None:
                args.text_layers = n
                filled.append(f"--text-layers {n}")
    if problems:
        raise CheckpointError(f"{bundle}/bundle.toml: " + "; ".join(problems))
    if filled:
        print(f"from {bundle}/bundle.toml: {' '.join(filled)}")


def _check_vae_only(args, out: Path, precision: str):
    """--only vae writes into an existing bundle of the same preset, precision and SVD rank."""
    toml = out / "bundle.toml"
    if not toml.is_file():
        raise SystemExit(f"--only vae: {toml} not found; it replaces the VAE graphs of an existing bundle "
                         "(export the whole bundle first)")
    meta = _bundle_meta(out)
    have = (meta.get("preset"), meta.get("precision"), meta.get("export", {}).get("svd_rank"))
    want = (args.preset, precision, args.svd_rank or "none")
    if have != want:
        raise SystemExit(f"--only vae: {toml} is preset {have[0]}, {have[1]}, svd rank {have[2]}; this export is "
                         f"{want[0]}, {want[1]}, svd rank {want[2]}")
    if "weights" not in meta or "text_encoder" not in meta:
        raise SystemExit(f"--only vae: {toml} was written by exporter {meta.get('exporter_version')}, whose bundle.toml "
                         "does not say where its weights come from; export the whole bundle")
    return meta


def _notes(preset_name: str, precision: str, weights: dict, text_encoder: dict) -> str:
    """bundle.toml's header comment: where the weights come from, and what is reduced."""
    names = {"dit": "DiT", "vae": "VAE", "text_encoder": "text encoder"}
    if all(weights[p]["source"] == "random" for p in names):
        notes = ["Seeded random weights (no checkpoint given)."]
    else:
        said = []
        for part, name in names.items():
            w = weights[part]
            if w["source"] == "random":
                said.append(f"{name} seeded random")
            else:
                said.append(f"{name} from {w['file']}" + (f" ({w['entry']})" if w.get("entry") else ""))
        notes = [f"Weights: {', '.join(said)} ([weights] below)."]
    if weights["text_encoder"]["source"] == "random" and preset_name == "wan-1.3b" and text_encoder["layers"] != 24:
        notes.append(f"Text encoder: UMT5-style with {text_encoder['layers']} layers (UMT5-XXL has 24) to keep the "
                     "export small.")
    if precision != "fp32":
        notes.append(f"Text encoder in fp32 (UMT5 overflows fp16); its context is cast to {precision} at the graph's end.")
    if precision == "bf16":
        notes.append("bf16: ORT's CUDA MultiHeadAttention has no bf16 kernel; prefer fp16.")
    return "\n".join(notes)


def cmd_export(args):
    import torch

    from . import checkpoints
    from . import export as ex
    from .model import factorise
    from .quantize import QuantizeError

    cfg = preset(args.preset)
    precision = args.precision or ("fp32" if args.preset == "tiny" else "fp16")
    # fp8: an fp16 export whose dit_fused.onnx is then rewritten in place (quantize.py).
    fp8 = precision == "fp8"
    graph_precision = "fp16" if fp8 else precision
    if fp8 and args.no_fused_dit and args.only != "vae":
        raise QuantizeError("--precision fp8 quantizes the linear layers of dit_fused.onnx: leave out --no-fused-dit")
    dtype = ex.DTYPES[graph_precision]
    out = Path(args.out)
    only_vae = args.only == "vae"
    old = _check_vae_only(args, out, precision) if only_vae else None
    # Everything is read and checked before the output directory is touched.
    dit_p, text_p, vae_p = checkpoints.parts_from_args(args)
    if only_vae:
        if checkpoints.given(dit_p) or text_p.tokenizer or getattr(args, "text_checkpoint", None):
            print("note: --only vae exports the VAE alone; the DiT, text encoder and tokenizer options are not used")
        cfg.layers = old["architecture"]["layers"]
    parts = ("vae",) if only_vae else ("dit", "text", "vae")
    prep = checkpoints.prepare(cfg, dit_p, text_p, vae_p, parts)
    for note in prep.notes:
        print(f"note: {note}")
    weights = prep.weights()
    if only_vae:
        weights = {**old["weights"], **weights}
        tokenizer, text_encoder = old["tokenizer"], old["text_encoder"]
    else:
        tokenizer, text_encoder = ex.tokenizer_table(cfg), ex.text_encoder_table(cfg)
    dit, te, vae = checkpoints.modules(prep)
    from .vae import RMSNorm as VaeRmsNorm

    VaeRmsNorm.export_mode = args.vae_norm
    svd = args.svd_rank or None
    if svd and not only_vae:  # --only vae writes no DiT graph: nothing to factorise
        n = factorise(dit, svd)
        print(f"svd rank {svd}: factorised {n} linear layers")
    dev = torch.device(args.device)
    vae = vae.to(dev, dtype)
    if not only_vae:
        # The text encoder stays float32 (export_text).
        dit, te = dit.to(dev, dtype), te.to(dev)
    out.mkdir(parents=True, exist_ok=True)
    vae_graphs = ("vae_first", "vae_step", "vae_first_fused", "vae_step_fused")
    graphs = ("dit", "dit_fused", "dit_context", "text_encoder") + vae_graphs
    for graph in vae_graphs if only_vae else graphs:
        for stale in (f"{graph}.onnx", f"{graph}.onnx.data"):
            # A hard-linked copy of another bundle keeps that bundle's files: unlink, never overwrite.
            (out / stale).unlink(missing_ok=True)
    if not only_vae:
        (out / ex.TOKENIZER_FILE).unlink(missing_ok=True)
    (out / "bundle.toml").unlink(missing_ok=True)
    t = time.time()
    if not only_vae:
        if prep.tokenizer:
            from .tokenizer import write_bundle_tokenizer

            write_bundle_tokenizer(prep.tokenizer, out / ex.TOKENIZER_FILE)
        ex.export_text(te, cfg, out, dtype, dev)
        ex.export_dit(dit, cfg, out, dtype, dev)
    n = ex.export_vae(vae, cfg, out, dtype, dev)
    # Last, so that the graphs above are traced exactly as before (same random trace inputs).
    if not only_vae:
        if args.no_fused_dit:
            print("dit_fused.onnx: skipped (--no-fused-dit)")
        elif graph_precision not in ex.FUSED_PRECISIONS:
            print(f"dit_fused.onnx: skipped ({precision}: the runner's ai.unstep kernels do fp32 and fp16)")
        else:
            ex.export_dit(dit, cfg, out, dtype, dev, fused_ops=True)
    if args.no_fused_vae:
        print("vae_first_fused.onnx, vae_step_fused.onnx: skipped (--no-fused-vae)")
    elif graph_precision not in ex.FUSED_PRECISIONS:
        print(f"vae_*_fused.onnx: skipped ({precision}: the runner's ai.unstep kernels do fp32 and fp16)")
    elif args.vae_norm != "transpose":
        print(f"vae_*_fused.onnx: skipped (--vae-norm {args.vae_norm}: they fuse the channels-last norm)")
    else:
        ex.export_vae(vae, cfg, out, dtype, dev, fused_ops=True)
    notes = _notes(args.preset, graph_precision, weights, text_encoder)
    if fp8 and only_vae:
        # The bundle's dit_fused.onnx stays the fp8 one; its bundle.toml keeps saying so.
        from .quantize import FP8_NOTE

        notes += "\n" + FP8_NOTE
    ex.write_toml(cfg, out, precision if only_vae else graph_precision, svd, notes, tokenizer=tokenizer,
                  text_encoder=text_encoder, weights=weights)
    what = "the VAE graphs of " if only_vae else ""
    print(f"wrote {what}{out} ({n} VAE cache tensors) in {time.time() - t:.1f}s")
    if fp8 and not only_vae:
        from .quantize import quantize_bundle

        quantize_bundle(out, out)


def cmd_quantize(args):
    from .quantize import quantize_bundle

    t = time.time()
    quantize_bundle(Path(args.source), Path(args.out))
    print(f"quantized in {time.time() - t:.1f}s")


def _settings(args):
    from .sample import Settings

    s = Settings(seed=args.seed, clean_sigma=args.clean_sigma)
    if args.steps:
        s.denoising_steps = [int(x) for x in args.steps.split(",")]
    return s


def _schedule(s):
    """The float32 sigmas and timesteps the loop uses, for debugging a runner against them."""
    import numpy as np

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
    import torch
    from safetensors.torch import save_file

    from .sample import Settings, TorchBackend, generate

    from .export import tokenizer_table

    cfg = preset(args.preset)
    out = Path(args.out)
    # The bundle these files are for (by default the directory above them): the same tokenizer
    # and text encoder as its graphs.
    bundle = Path(args.bundle) if args.bundle else out.parent
    meta = _bundle_meta(bundle)
    if meta is not None:
        _match_bundle(args, bundle, meta)
    elif args.bundle:
        raise SystemExit(f"--bundle {bundle}: no bundle.toml there")
    dit, te, vae = _models(args, cfg)
    backend = TorchBackend(dit, te, vae, "cpu", torch.float32)
    prompts = Path(args.prompts).read_text(encoding="utf-8").splitlines()
    tokens = "umt5 tokenizer, the bundle's tokenizer.json" if cfg.tokenizer else "bytes tokenizer"
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
        add(f"{p}.input_ids", r["input_ids"], f"token ids ({tokens}), int64 [1, text_len]", idx, base)
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
        "tokenizer": tokenizer_table(cfg),
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
    from . import checkpoints
    from .parity import run_parity

    meta = _bundle_meta(Path(args.bundle))
    if meta is None:
        raise SystemExit(f"--bundle {args.bundle}: no bundle.toml there")
    _match_bundle(args, Path(args.bundle), meta)
    # run_parity builds its reference modules with build(cfg, args.checkpoint, args.text_checkpoint,
    # args.vae_checkpoint): hand it the parts (files, DiT entry, layers, tokenizer) the options and
    # the bundle ask for, which build() also fits its config to.
    args.checkpoint, args.text_checkpoint, args.vae_checkpoint = checkpoints.parts_from_args(args)
    sys.exit(run_parity(args))


def cmd_fused_check(args):
    from .parity import run_fused_check

    sys.exit(run_fused_check(args))


def cmd_sample(args):
    import numpy as np
    import torch

    from .sample import OrtBackend, TorchBackend, generate

    cfg = preset(args.preset)
    prompts = Path(args.prompts).read_text(encoding="utf-8").splitlines()
    s = _settings(args)
    if args.bundle:
        meta = _bundle_meta(Path(args.bundle))
        if meta is None:
            raise SystemExit(f"--bundle {args.bundle}: no bundle.toml there")
        if args.backend == "ort":
            tok = meta.get("tokenizer", {})
            cfg.tokenizer = str(Path(args.bundle) / tok["file"]) if tok.get("kind") == "umt5" else None
            cfg.layers = meta.get("architecture", {}).get("layers", cfg.layers)
        else:
            _match_bundle(args, Path(args.bundle), meta)
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


def cmd_release_files(args):
    from .release import release_files

    t = time.time()
    release_files(preset(args.preset), args.out, args.text_layers, args.text_vocab, args.tokenizer, args.dit_layers)
    print(f"wrote {args.out} in {time.time() - t:.1f}s")


def cmd_selftest(args):
    from . import noise

    noise.selftest()
    print("philox4x32-10 known-answer vectors: ok")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m unstep_export")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("--preset", choices=["tiny", "wan-1.3b"], help="default: wan-1.3b with --released, else tiny")
        w = p.add_argument_group("weights (seeded random for every part not given; checked strictly, exit 2 if unusable)")
        w.add_argument("--released", metavar="DIR",
                       help="the released folder `download --out DIR` fills: the same as --self-forcing "
                            "DIR/checkpoints/self_forcing_dmd.pt --ema --wan-dir DIR/Wan2.1-T2V-1.3B, and given "
                            "alone (no other weight file or --tokenizer)")
        w.add_argument("--self-forcing", metavar="CKPT",
                       help="Self-Forcing's generator checkpoint (self_forcing_dmd.pt): the DiT, its 'generator' entry "
                            "(with --ema its 'generator_ema')")
        w.add_argument("--ema", action="store_true",
                       help="take the DiT from the checkpoint's 'generator_ema' entry, as Self-Forcing's inference.py "
                            "--use_ema (its README's command uses it); without it, 'generator'")
        w.add_argument("--wan-dir", metavar="DIR",
                       help="the Wan2.1-T2V-1.3B folder: the VAE (Wan2.1_VAE.pth), the text encoder "
                            "(models_t5_umt5-xxl-enc-bf16.pth) and the tokenizer (google/umt5-xxl/tokenizer.json)")
        w.add_argument("--checkpoint", help="the DiT's state dict (.safetensors or torch pickle; a Self-Forcing "
                                            "checkpoint as with --self-forcing)")
        w.add_argument("--text-checkpoint", help="the T5 text encoder's state dict (over --wan-dir's; needs a tokenizer)")
        w.add_argument("--vae-checkpoint", help="the whole Wan VAE state dict, encoder included (over --wan-dir's)")
        w.add_argument("--tokenizer", metavar="FILE",
                       help="a umt5 tokenizer.json (tokenizers, Unigram model; over --wan-dir's): copied into the bundle; "
                            "a random-weight text encoder gets its vocabulary size")
        w.add_argument("--text-layers", type=int, metavar="N",
                       help="layers of a random-weight text encoder (default: the preset's; 24 on wan-1.3b when a "
                            "tokenizer is given)")
        w.add_argument("--dit-layers", type=int, metavar="N",
                       help="layers of the DiT (default: the preset's; a DiT checkpoint must have as many)")
        p.add_argument("--threads", type=int, default=2)

    p = sub.add_parser("export", help="write a bundle")
    common(p)
    p.add_argument("--out", required=True)
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16", "fp8"],
                   help="default fp32 for tiny, fp16 otherwise; fp8: an fp16 bundle whose DiT blocks' linear layers in "
                        "dit_fused.onnx are float8 E4M3 (weights per output channel, activations per token; written by "
                        "exporting fp16, then `quantize` in place); every graph takes and gives fp16")
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

    p = sub.add_parser("quantize",
                       help="make an fp8 bundle from an fp16 one: dit_fused.onnx's block linear layers as float8 E4M3 "
                            "(ai.unstep::MatMulFp8), the other files hard-linked, bundle.toml precision fp8")
    p.add_argument("--from", dest="source", required=True, metavar="BUNDLE_DIR",
                   help="an fp16 bundle with dit_fused.onnx")
    p.add_argument("--out", required=True, metavar="OUT_DIR",
                   help="a new (or empty) directory, or BUNDLE_DIR itself to rewrite it in place")
    p.set_defaults(fn=cmd_quantize, threads=None)

    p = sub.add_parser("golden", help="write golden reference outputs")
    common(p)
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", default="assets/prompts/tiny.txt")
    p.add_argument("--indices", type=int, nargs="+", default=[0, 7])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--extra-clean-sigma", type=float, default=0.01)
    p.add_argument("--partial-frames", type=int, default=17, help="frames kept for prompts after the first (0 = all)")
    p.add_argument("--bundle", help="the bundle the golden files are for: its tokenizer and sizes are used, and options "
                                    "that contradict its bundle.toml refused (default: the directory above --out, when "
                                    "it has a bundle.toml)")
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

    p = sub.add_parser("release-files",
                       help="seeded random weights in the released files' formats and names (self_forcing_dmd.pt, "
                            "Wan2.1-T2V-1.3B/...), for tests of the released-weights path")
    p.add_argument("--preset", default="tiny", choices=["tiny", "wan-1.3b"])
    p.add_argument("--out", required=True)
    p.add_argument("--text-layers", type=int, help="default: the released count (24 on wan-1.3b)")
    p.add_argument("--text-vocab", type=int, help="token embedding rows (default: 256384 on wan-1.3b, else the tokenizer's)")
    p.add_argument("--tokenizer", help="tokenizer.json to copy (default: assets/tokenizer/tokenizer.json)")
    p.add_argument("--dit-layers", type=int, help="default: the preset's")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(fn=cmd_release_files)

    download.add_parser(sub)

    p = sub.add_parser("selftest", help="Philox known-answer test")
    p.set_defaults(fn=cmd_selftest, threads=None)

    args = ap.parse_args(argv)
    if args.fn is download.cmd_download:
        args.fn(args)  # huggingface_hub and the standard library only
        return
    from .checkpoints import CheckpointError
    from .quantize import QuantizeError

    if hasattr(args, "released") and args.preset is None:
        args.preset = "wan-1.3b" if args.released else "tiny"
    _threads(getattr(args, "threads", None))
    try:
        args.fn(args)
    except (CheckpointError, QuantizeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

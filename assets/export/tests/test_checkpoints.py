"""Strict loading of the released files (checkpoints.py), on tiny-sized files in their formats
(release.py): a released-format export end to end, then each kind of unusable file, which must be
a clear error (exit status 2, naming the file and the tensors) with nothing written."""

from __future__ import annotations

import argparse
import json
import shutil
import tomllib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from helpers import cli_fails
from unstep_export import checkpoints
from unstep_export.__main__ import _match_bundle, main
from unstep_export.build import build
from unstep_export.checkpoints import CheckpointError, Part
from unstep_export.config import preset
from unstep_export.release import release_files
from unstep_export.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[3]
TOKENIZER = ROOT / "assets" / "tokenizer" / "tokenizer.json"
PROMPT = "A red fox runs through fresh snow at dawn, cinematic lighting."


@pytest.fixture(scope="module")
def rel(tmp_path_factory):
    d = tmp_path_factory.mktemp("release")
    paths = release_files(preset("tiny"), d, tokenizer=TOKENIZER)
    return d, paths


def _wan(rel):
    return rel[0] / "Wan2.1-T2V-1.3B"


def _export(out, *extra):
    return ["export", "--preset", "tiny", "--out", str(out), "--no-fused-dit", "--no-fused-vae", *extra]


def _session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _sf(rel):
    return str(rel[1]["dit"])


# ---------------------------------------------------------------------------------------------
# The whole released-format path
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bundle(rel, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "b"
    main(_export(out, "--self-forcing", _sf(rel), "--ema", "--wan-dir", str(_wan(rel))))
    return out


def _modules(rel, entry):
    cfg = preset("tiny")
    dit, te, vae = build(cfg, Part(_sf(rel), entry=entry),
                         Part(str(rel[1]["text"]), tokenizer=str(rel[1]["tokenizer"])), str(rel[1]["vae"]))
    return cfg, dit, te, vae


def test_released_export_bundle_toml(rel, bundle):
    meta = tomllib.loads((bundle / "bundle.toml").read_text())
    assert meta["exporter_version"] == "0.13.0"
    assert meta["tokenizer"] == {"kind": "umt5", "file": "tokenizer.json", "clean": "whitespace"}
    assert meta["text_encoder"] == {"layers": 2, "vocab": 1000, "precision": "fp32"}
    w = meta["weights"]
    assert w["dit"] == {"source": "released", "file": "self_forcing_dmd.pt",
                        "sha256": checkpoints.sha256(rel[1]["dit"]), "entry": "generator_ema"}
    assert w["vae"] == {"source": "released", "file": "Wan2.1_VAE.pth", "sha256": checkpoints.sha256(rel[1]["vae"])}
    assert w["text_encoder"]["source"] == "released" and w["text_encoder"]["file"] == "models_t5_umt5-xxl-enc-bf16.pth"
    assert w["tokenizer"]["source"] == "released" and w["tokenizer"]["sha256"] == checkpoints.sha256(TOKENIZER)
    # The bundle's tokenizer.json is the source's model with the folder's special tokens written
    # in (so it is not the source's bytes); [files] lists the bundle's own file.
    source, written = (json.loads(p.read_text()) for p in (TOKENIZER, bundle / "tokenizer.json"))
    assert [p for p, _ in written["model"]["vocab"]] == [p for p, _ in source["model"]["vocab"]]
    assert [s for _, s in written["model"]["vocab"]] == pytest.approx([s for _, s in source["model"]["vocab"]], rel=1e-12)
    assert {t["content"] for t in written["added_tokens"] if t["special"]} >= {"<pad>", "</s>", "<unk>"}
    assert meta["files"]["tokenizer.json"] == checkpoints.sha256(bundle / "tokenizer.json")
    header = (bundle / "bundle.toml").read_text().split("format = 1")[0]
    assert "random" not in header and "self_forcing_dmd.pt (generator_ema)" in header


def test_released_export_matches_the_files(rel, bundle):
    """The bundle's graphs compute the modules loaded from the released-format files, with the
    generator_ema entry (the generator entry gives a different flow)."""
    cfg, dit, te, vae = _modules(rel, "generator_ema")
    assert cfg.tokenizer and cfg.text.vocab == 1000
    ids, mask = Tokenizer(bundle / "tokenizer.json", cfg.text_len)(PROMPT)
    assert mask.sum() > 5 and ids.max() < cfg.text.vocab
    with torch.no_grad():
        ref_ctx = te(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    (ctx,) = _session(bundle / "text_encoder.onnx").run(["context"], {"input_ids": ids, "attention_mask": mask})
    assert np.abs(ctx - ref_ctx).max() < 1e-4
    assert np.abs(ref_ctx).max() > 0.1

    g = torch.Generator().manual_seed(7)
    F, T, D = cfg.frames_per_block, cfg.frames_per_block * cfg.tokens_per_frame, cfg.dim
    x = torch.randn(1, cfg.latent_channels, F, cfg.lat_h, cfg.lat_w, generator=g)
    past = [torch.randn(1, T, D, generator=g) for _ in range(2 * cfg.layers)]
    c = torch.from_numpy(ctx)
    feeds = {"x": x.numpy(), "timestep": np.full((1, F), 750.0, np.float32), "context": ctx,
             "frame_offset": np.array([F], np.int64)}
    for i in range(cfg.layers):
        feeds[f"past_k.{i}"], feeds[f"past_v.{i}"] = past[2 * i].numpy(), past[2 * i + 1].numpy()
    flow, *kv = _session(bundle / "dit.onnx").run(None, feeds)

    def eager(model):
        # The graph's values leave out the value bias (docs/bundle.md), the module's include it.
        bv = [blk.self_attn.v.bias.detach() for blk in model.blocks]
        with torch.no_grad():
            f, k, v = model(x, torch.full((1, F), 750.0), c, torch.tensor([F]), past[0::2],
                            [p + b for p, b in zip(past[1::2], bv)])
        return f.numpy(), k, [a - b for a, b in zip(v, bv)]

    rf, rk, rv = eager(dit)
    assert np.abs(dit.blocks[0].self_attn.v.bias.detach().numpy()).max() > 1e-3  # a bias the graph must fold
    assert np.abs(flow - rf).max() < 1e-4
    for i in range(cfg.layers):
        assert np.abs(kv[2 * i] - rk[i].numpy()).max() < 1e-4 and np.abs(kv[2 * i + 1] - rv[i].numpy()).max() < 1e-4
    other = eager(_modules(rel, "generator")[1])[0]
    assert np.abs(flow - other).max() > 1e-3, "generator and generator_ema give the same flow"

    z = torch.randn(1, cfg.latent_channels, 1, cfg.lat_h, cfg.lat_w, generator=g)
    with torch.no_grad():
        rframes, _ = vae.decode_frame(z, None)
    frames = _session(bundle / "vae_first.onnx").run(["frames"], {"z": z.numpy()})[0]
    assert np.abs(frames - rframes.numpy()).max() < 1e-4


def test_random_weights_with_a_tokenizer(tmp_path):
    """Random weights over a tokenizer: the text encoder's vocabulary is the tokenizer's, the
    preset's layers (tiny: 2), and bundle.toml says the tokenizer was given as a file."""
    out = tmp_path / "b"
    main(_export(out, "--tokenizer", str(TOKENIZER)))
    meta = tomllib.loads((out / "bundle.toml").read_text())
    assert meta["text_encoder"] == {"layers": 2, "vocab": 1000, "precision": "fp32"}
    assert meta["tokenizer"]["kind"] == "umt5"
    assert meta["weights"]["tokenizer"]["source"] == "file"
    assert meta["weights"]["dit"] == {"source": "random", "seed": 0}
    assert "Seeded random weights" in (out / "bundle.toml").read_text().split("format = 1")[0]
    emb = onnx.load(str(out / "text_encoder.onnx"))
    assert any(list(t.dims) == [1000, 64] for t in emb.graph.initializer)


def test_bundle_defaults_and_conflicts(rel, bundle):
    """golden / parity take the bundle's tokenizer and refuse options that contradict it."""
    def ns(**kw):
        base = dict(preset="tiny", checkpoint=None, text_checkpoint=None, vae_checkpoint=None, self_forcing=None,
                    ema=False, wan_dir=None, tokenizer=None, text_layers=None, dit_layers=None)
        return argparse.Namespace(**{**base, **kw})

    args = ns(self_forcing=_sf(rel), ema=True, text_checkpoint=str(rel[1]["text"]), vae_checkpoint=str(rel[1]["vae"]))
    _match_bundle(args, bundle, tomllib.loads((bundle / "bundle.toml").read_text()))
    assert args.tokenizer == str(bundle / "tokenizer.json")
    meta = tomllib.loads((bundle / "bundle.toml").read_text())
    with pytest.raises(CheckpointError, match="add --ema"):
        _match_bundle(ns(self_forcing=_sf(rel), wan_dir=str(_wan(rel))), bundle, meta)
    with pytest.raises(CheckpointError, match="give that file"):
        _match_bundle(ns(wan_dir=str(_wan(rel))), bundle, meta)


# ---------------------------------------------------------------------------------------------
# Unusable files: exit 2, the file and the tensors named, nothing written
# ---------------------------------------------------------------------------------------------

def _edited_dit(rel, tmp_path, edit, name="sf.pt"):
    sd = torch.load(rel[1]["dit"], weights_only=True)
    edit(sd)
    path = tmp_path / name
    torch.save(sd, path)
    return str(path)


@pytest.mark.parametrize("case", ["missing", "extra", "shape"])
def test_dit_key_problems(rel, tmp_path, capsys, case):
    key = "model.blocks.1.ffn.2.weight"

    def edit(sd):
        for e in sd.values():
            if case == "missing":
                del e[key]
            elif case == "extra":
                e["model.blocks.1.ffn.3.weight"] = torch.zeros(3)
            else:
                e[key] = torch.zeros(64, 127)

    ckpt = _edited_dit(rel, tmp_path, edit)
    out = tmp_path / "out"
    want = {"missing": ("missing 1 tensor", key), "extra": ("1 extra tensor", "model.blocks.1.ffn.3.weight"),
            "shape": ("wrong shape", key, "[64, 127] in the file, [64, 128] expected")}[case]
    cli_fails(capsys, _export(out, "--self-forcing", ckpt, "--ema"), ckpt, "entry 'generator_ema'", *want)
    assert not out.exists()


def test_many_missing_keys_are_counted(rel, tmp_path, capsys):
    def edit(sd):
        for e in sd.values():
            for k in [k for k in e if ".cross_attn." in k]:
                del e[k]

    ckpt = _edited_dit(rel, tmp_path, edit)
    err = cli_fails(capsys, _export(tmp_path / "out", "--self-forcing", ckpt), ckpt, "missing", "more)")
    assert "missing 20 tensors: model.blocks.0.cross_attn.k.bias" in err


def test_ema_without_generator_ema(rel, tmp_path, capsys):
    ckpt = _edited_dit(rel, tmp_path, lambda sd: sd.pop("generator_ema"))
    out = tmp_path / "out"
    cli_fails(capsys, _export(out, "--self-forcing", ckpt, "--ema"), ckpt, "no entry 'generator_ema'", "--ema",
           "its entries: 'generator'")
    assert not out.exists()


def test_vae_file_given_as_the_dit(rel, tmp_path, capsys):
    out = tmp_path / "out"
    cli_fails(capsys, _export(out, "--self-forcing", str(rel[1]["vae"])), str(rel[1]["vae"]),
           "is a Wan VAE state dict", "not a DiT", "--vae-checkpoint")
    assert not out.exists()


def test_text_encoder_given_as_the_vae(rel, tmp_path, capsys):
    out = tmp_path / "out"
    cli_fails(capsys, _export(out, "--vae-checkpoint", str(rel[1]["text"])), str(rel[1]["text"]),
           "is a T5 text encoder state dict", "not a Wan VAE")
    assert not out.exists()


def test_wan_14b_shaped_dit(tmp_path, capsys):
    """Dims of Wan2.1-T2V-14B (dim 5120, 40 layers), tensors expanded from one element so that the
    file stays small."""
    one = torch.zeros(1)
    sd = {"model.patch_embedding.weight": one.expand(5120, 16, 1, 2, 2),
          **{f"model.blocks.{i}.modulation": one.expand(1, 6, 5120) for i in range(40)}}
    ckpt = tmp_path / "wan14b.pt"
    torch.save({"generator": sd, "generator_ema": sd}, ckpt)
    out = tmp_path / "out"
    argv = ["export", "--preset", "wan-1.3b", "--out", str(out), "--self-forcing", str(ckpt), "--ema"]
    cli_fails(capsys, argv, str(ckpt), "this is a DiT of dim 5120 and 40 layers; the preset wan-1.3b expects dim 1536, "
                                    "30 layers")
    assert not out.exists()


def test_truncated_file(rel, tmp_path, capsys):
    wan = tmp_path / "wan"
    shutil.copytree(_wan(rel), wan)
    vae = wan / "Wan2.1_VAE.pth"
    vae.write_bytes(vae.read_bytes()[: vae.stat().st_size // 2])
    out = tmp_path / "out"
    cli_fails(capsys, _export(out, "--wan-dir", str(wan)), f"cannot read {vae}", "(truncated or not a checkpoint?)")
    assert not out.exists()


def test_vae_encoder_half_is_checked(rel, tmp_path, capsys):
    sd = torch.load(rel[1]["vae"], weights_only=True)
    key = "encoder.downsamples.5.time_conv.weight"
    assert key in sd
    sd[key] = sd[key][:, :, :2]
    del sd["conv1.bias"]
    path = tmp_path / "Wan2.1_VAE.pth"
    torch.save(sd, path)
    cli_fails(capsys, _export(tmp_path / "out", "--vae-checkpoint", str(path)), str(path), "missing 1 tensor: conv1.bias",
           key, "[16, 16, 2, 1, 1] in the file, [16, 16, 3, 1, 1] expected")


def test_text_encoder_needs_its_tokenizer(rel, tmp_path, capsys):
    cli_fails(capsys, _export(tmp_path / "out", "--text-checkpoint", str(rel[1]["text"])), str(rel[1]["text"]),
           "needs its tokenizer")


def test_tokenizer_of_another_model_type(tmp_path, capsys):
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = HfTokenizer(WordLevel({"<pad>": 0, "</s>": 1, "<unk>": 2, "fox": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    path = tmp_path / "wordlevel.json"
    tok.save(str(path))
    out = tmp_path / "out"
    cli_fails(capsys, _export(out, "--tokenizer", str(path)), str(path), "model type 'WordLevel'", "'Unigram'")
    assert not out.exists()


def test_existing_output_left_untouched(rel, tmp_path, capsys):
    """A failing export into an existing bundle leaves every file of it as it was."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("bundle.toml", "dit.onnx", "text_encoder.onnx", "tokenizer.json"):
        (out / name).write_text(f"old {name}")
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    cli_fails(capsys, _export(out, "--self-forcing", str(rel[1]["vae"])), "not a DiT")
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before


def test_external_data_is_streamed_into_one_file(tmp_path):
    """export._save: tensors the exporter wrote as separate files (graphs over 2 GB) end up in one
    `<name>.data`, page-aligned, the source files deleted, and the graph runs."""
    from onnx import TensorProto, helper, numpy_helper

    from unstep_export.export import EXTERNAL_ALIGN, _save

    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    src = tmp_path / "src"
    src.mkdir()
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, str(src / "m.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=False, size_threshold=0)
    model = onnx.load(str(src / "m.onnx"), load_external_data=False)
    out = tmp_path / "out"
    out.mkdir()
    _save(model, out / "m.onnx", src)
    assert sorted(p.name for p in src.iterdir()) == ["m.onnx"]
    assert sorted(p.name for p in out.iterdir()) == ["m.onnx", "m.onnx.data"]
    saved = onnx.load(str(out / "m.onnx"), load_external_data=False)
    offsets = [int({e.key: e.value for e in t.external_data}["offset"]) for t in saved.graph.initializer]
    assert all(o % EXTERNAL_ALIGN == 0 for o in offsets)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    (y,) = _session(out / "m.onnx").run(None, {"x": x})
    assert np.abs(y - x @ w1 @ w2).max() < 1e-5


def test_only_vae_keeps_the_bundle_tables(rel, tmp_path):
    """--only vae rewrites bundle.toml with the new VAE's table and the old ones for the rest."""
    out = tmp_path / "b"
    main(_export(out, "--tokenizer", str(TOKENIZER)))
    main(_export(out, "--only", "vae", "--vae-checkpoint", str(rel[1]["vae"])))
    meta = tomllib.loads((out / "bundle.toml").read_text())
    assert meta["weights"]["vae"]["source"] == "released"
    assert meta["weights"]["dit"] == {"source": "random", "seed": 0}
    assert meta["weights"]["tokenizer"]["source"] == "file"
    assert meta["tokenizer"]["kind"] == "umt5" and meta["text_encoder"]["vocab"] == 1000
    assert "tokenizer.json" in meta["files"]


def test_self_forcing_checkpoint_given_as_the_vae(rel, tmp_path, capsys):
    out = tmp_path / "out"
    cli_fails(capsys, _export(out, "--vae-checkpoint", _sf(rel)), _sf(rel), "is a DiT state dict", "not a Wan VAE",
           "--self-forcing")
    assert not out.exists()

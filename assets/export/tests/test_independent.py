"""The exporter's PyTorch reference against an independent implementation of Wan2.1: DiffSynth-Studio
(PyPI `diffsynth`, pinned in requirements-test.txt).

Each of our modules (model.py `CausalDiT`, vae.py `VaeDecoder`, text.py `TextEncoder`) gets seeded
random weights, every parameter non-trivial (norm weights != 1, biases != 0, so a misplaced bias or
a missing norm weight shows), is saved in the format and under the names of the released file it
stands for, and that file is loaded into DiffSynth's model through DiffSynth's own loader
(`diffsynth.core.loader.load_model`) and the state-dict converter its model table
(`diffsynth.configs.MODEL_CONFIGS`) names for such a file:

- the DiT as Self-Forcing's generator checkpoint (`self_forcing_dmd.pt`: a dict whose `generator`
  entry is the state dict with names prefixed `model.`), into `wan_video_dit.WanModel` with
  `WanVideoDiTStateDictConverter` (it removes the `model.` prefix);
- the decoder as part of a whole `Wan2.1_VAE.pth` (a plain WanVAE_ state dict; the encoder half,
  which no graph of ours has, is zeros) into `wan_video_vae.WanVideoVAE` with
  `WanVideoVAEStateDictConverter`;
- the text encoder as `models_t5_umt5-xxl-enc-bf16.pth` (Wan's T5Encoder state dict in bf16) into
  `wan_video_text_encoder.WanTextEncoder`, Wan's names unchanged.

DiffSynth then runs its own forward code (the DiT through `pipelines.wan_video.model_fn_wan_video`,
the function its pipeline calls; the VAE through `VideoVAE_.decode` / `WanVideoVAE.decode`; the
prompt through `WanVideoUnit_PromptEmbedder.encode_prompt`).  All arithmetic is float32.

Measure: `rel_max` = max|ours - ref| / max|ref| and the relative L2 error ||ours - ref|| / ||ref||,
both asserted < 1e-5 (float32 agreement is about 1e-6; the bound asked for is 1e-4, but 1e-5 also
catches small deviations such as the exact GELU in place of Wan's tanh form, 3-4e-5 on the DiT).
Run with `-s` to see the values.

Also: the names and shapes of our full-size modules (30-layer DiT, 24-layer UMT5-XXL, the VAE)
hash, by DiffSynth's `hash_model_file` rule, to the hashes DiffSynth records for the released files
Wan2.1-T2V-1.3B `diffusion_pytorch_model.safetensors`, `models_t5_umt5-xxl-enc-bf16.pth` and
`Wan2.1_VAE.pth`: the state dicts have exactly the released tensors.
"""

from __future__ import annotations

import hashlib
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from diffsynth.configs import MODEL_CONFIGS
from diffsynth.core.loader import load_model
from diffsynth.core.loader.file import convert_keys_dict_to_single_str, convert_state_dict_to_keys_dict, hash_model_file
from diffsynth.models.wan_video_dit import WanModel
from diffsynth.models.wan_video_text_encoder import HuggingfaceTokenizer, WanTextEncoder
from diffsynth.models.wan_video_vae import VideoVAE_, WanVideoVAE
from diffsynth.pipelines.wan_video import WanVideoUnit_PromptEmbedder, model_fn_wan_video
from diffsynth.utils.state_dict_converters.wan_video_dit import WanVideoDiTStateDictConverter
from diffsynth.utils.state_dict_converters.wan_video_vae import WanVideoVAEStateDictConverter

from unstep_export.config import WAN_LATENT_MEAN, WAN_LATENT_STD, TextConfig, VaeConfig, preset
from unstep_export.model import CausalDiT
from unstep_export.text import TextEncoder, tokenize_bytes
from unstep_export.tokenizer import Tokenizer
from unstep_export.vae import VaeDecoder

REPO_ROOT = Path(__file__).resolve().parents[3]
TOL = 1e-5
TOKENIZER_JSON = REPO_ROOT / "assets" / "tokenizer" / "tokenizer.json"

# DiffSynth's model table: the hashes (names and shapes) of the released Wan2.1 files.
HASH_WAN21_T2V_1_3B_DIT = "9269f8db9040a9d860eaca435be61814"   # Wan2.1-T2V-1.3B diffusion_pytorch_model*.safetensors
HASH_WAN21_T5 = "9c8818c2cbea55eca56c7b447df170da"             # models_t5_umt5-xxl-enc-bf16.pth
HASH_WAN21_VAE = "ccc42284ea13e1ad04693284c7a09be6"            # Wan2.1_VAE.pth


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def compare(name: str, ours: torch.Tensor, ref: torch.Tensor):
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    ours, ref = ours.double(), ref.double()
    assert torch.isfinite(ours).all() and torch.isfinite(ref).all()
    d = ours - ref
    rel_max = (d.abs().max() / ref.abs().max()).item()
    rel_l2 = (d.norm() / ref.norm()).item()
    print(f"\n[independent] {name}: shape {tuple(ref.shape)}, rel_max {rel_max:.3e}, rel_l2 {rel_l2:.3e}, "
          f"max|ref| {ref.abs().max().item():.3g}")
    assert rel_max < TOL, f"{name}: max|ours - ref| / max|ref| = {rel_max:.3e}"
    assert rel_l2 < TOL, f"{name}: ||ours - ref|| / ||ref|| = {rel_l2:.3e}"
    return rel_max


def model_config(model_hash: str) -> dict:
    """The entry of DiffSynth's model table for a released file's hash."""
    for entry in MODEL_CONFIGS:
        if entry.get("model_hash") == model_hash:
            return entry
    raise AssertionError(f"diffsynth's MODEL_CONFIGS has no entry {model_hash}")


def keys_hash(sd: dict) -> str:
    """DiffSynth's hash_model_file of a state dict (names and shapes, sorted)."""
    return hashlib.md5(convert_keys_dict_to_single_str(convert_state_dict_to_keys_dict(sd)).encode("utf-8")).hexdigest()


def perturb_vectors(module: torch.nn.Module, seed: int, scale_names=("norm", "gamma")):
    """Non-trivial 1-D parameters on top of init_random: norm weights / gammas 1 + 0.2 N(0, 1),
    biases 0.1 N(0, 1), other vectors (T5 norms) likewise around 1."""
    g = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        if p.dim() == 1 or name.endswith("gamma"):
            noise = torch.randn(p.shape, generator=g)
            if any(s in name for s in scale_names) and (name.endswith("weight") or name.endswith("gamma")):
                p.data = 1 + 0.2 * noise
            else:
                p.data = 0.1 * noise


def _unlink(path: Path):
    try:
        path.unlink()
    except FileNotFoundError:
        pass


# ----------------------------------------------------------------------------------------------
# Names and shapes of the full-size modules = the released files' (DiffSynth's hashes)


def test_full_size_state_dicts_hash_to_released_files():
    cfg = preset("wan-1.3b")
    with torch.device("meta"):
        dit = CausalDiT(cfg)
        te = TextEncoder(TextConfig(vocab=256384, dim=4096, ffn_dim=10240, heads=64, layers=24), cfg.text_len)
        vae = VaeDecoder(cfg.vae)
        skeleton = VideoVAE_()  # DiffSynth's WanVAE_: its encoder half and conv1 (not ours)
    assert keys_hash(dit.state_dict()) == HASH_WAN21_T2V_1_3B_DIT
    assert model_config(HASH_WAN21_T2V_1_3B_DIT)["model_class"] == "diffsynth.models.wan_video_dit.WanModel"
    assert keys_hash(te.state_dict()) == HASH_WAN21_T5
    assert model_config(HASH_WAN21_T5)["model_class"].endswith("WanTextEncoder")
    full = {k: v for k, v in skeleton.state_dict().items() if k.startswith(("encoder.", "conv1."))}
    assert not set(full) & set(vae.state_dict())
    full.update(vae.state_dict())
    assert keys_hash(full) == HASH_WAN21_VAE
    assert model_config(HASH_WAN21_VAE)["model_class"].endswith("WanVideoVAE")


# ----------------------------------------------------------------------------------------------
# DiT


def dit_configs():
    # Full width (dim 1536, 12 heads, ffn 8960, text_dim 4096, freq_dim 256), 2 layers, 12x16 latents.
    wide = replace(preset("wan-1.3b"), layers=2, height=96, width=128)
    return {"wan-1.3b-2layers": wide, "tiny": preset("tiny")}


def diffsynth_dit_kwargs(cfg) -> dict:
    """DiffSynth's constructor arguments of Wan2.1-T2V-1.3B, with our config's sizes."""
    kw = dict(model_config(HASH_WAN21_T2V_1_3B_DIT)["extra_kwargs"])
    assert kw["dim"] == 1536 and kw["num_heads"] == 12 and kw["ffn_dim"] == 8960 and kw["text_dim"] == 4096
    assert kw["freq_dim"] == 256 and list(kw["patch_size"]) == [1, 2, 2] and kw["eps"] == 1e-6
    kw.update(dim=cfg.dim, num_heads=cfg.heads, ffn_dim=cfg.ffn_dim, text_dim=cfg.text_dim, freq_dim=cfg.freq_dim,
              num_layers=cfg.layers, in_dim=cfg.latent_channels, out_dim=cfg.latent_channels,
              patch_size=list(cfg.patch), eps=cfg.eps)
    return kw


def dit_pair(cfg, tmp_path: Path, seed: int = 0):
    """(ours, DiffSynth's WanModel) with the same weights, the latter loaded from a Self-Forcing
    generator checkpoint written from ours."""
    dit = CausalDiT(cfg).init_random(seed).eval()
    perturb_vectors(dit, seed + 100)
    path = tmp_path / "self_forcing_dmd.pt"
    try:
        torch.save({"generator": {"model." + k: v for k, v in dit.state_dict().items()}}, path)
        raw = torch.load(path, map_location="cpu", weights_only=True)["generator"]
        assert all(k.startswith("model.") for k in raw)
        ref = load_model(WanModel, str(path), diffsynth_dit_kwargs(cfg), torch.float32, "cpu",
                         WanVideoDiTStateDictConverter, state_dict=raw)  # load_state_dict(strict=True)
    finally:
        _unlink(path)
    return dit, ref


def no_past(cfg):
    return [torch.zeros(1, 0, cfg.dim) for _ in range(cfg.layers)]


def text_context(cfg, g, valid: int):
    """A text context as the DiT gets it: `valid` encoded tokens, then zeros to text_len."""
    ctx = torch.randn(1, cfg.text_len, cfg.text_dim, generator=g)
    ctx[:, valid:] = 0
    return ctx


@pytest.mark.parametrize("name", ["wan-1.3b-2layers", "tiny"])
def test_dit_first_block_matches_diffsynth(name, tmp_path):
    """One pass over the first block (3 latent frames, frame_offset 0, no past: block-causal
    attention is full attention there), every frame at the same timestep, as Wan2.1 T2V runs."""
    cfg = dit_configs()[name]
    dit, ref = dit_pair(cfg, tmp_path)
    g = torch.Generator().manual_seed(11)
    frames = cfg.frames_per_block
    x = torch.randn(1, cfg.latent_channels, frames, cfg.lat_h, cfg.lat_w, generator=g)
    ctx = text_context(cfg, g, valid=min(23, cfg.text_len))
    offset = torch.zeros(1, dtype=torch.int64)
    for t in (1000.0, 937.5, 20.0):  # first steps of the warped schedule; the clean-cache pass
        ours, new_k, new_v = dit(x, torch.full((1, frames), t), ctx, offset, no_past(cfg), no_past(cfg))
        theirs = model_fn_wan_video(dit=ref, latents=x, timestep=torch.tensor([t]), context=ctx)
        compare(f"dit {name} first block t={t}", ours, theirs)
        tokens = frames * cfg.tokens_per_frame
        assert len(new_k) == cfg.layers and all(k.shape == (1, tokens, cfg.dim) for k in new_k + new_v)


def test_dit_per_frame_timesteps_match_diffsynth(tmp_path):
    """Per-frame timesteps (Self-Forcing's [B, F] timestep; ours modulates each frame with its
    own): DiffSynth's per-token timestep path (`seperated_timestep` with
    `fuse_vae_embedding_in_latents`: frame 0 at t = 0, the others at t)."""
    cfg = dit_configs()["wan-1.3b-2layers"]
    dit, ref = dit_pair(cfg, tmp_path, seed=3)
    ref.seperated_timestep = True
    g = torch.Generator().manual_seed(12)
    x = torch.randn(1, cfg.latent_channels, 3, cfg.lat_h, cfg.lat_w, generator=g)
    ctx = text_context(cfg, g, valid=40)
    t = 750.0
    ours, _, _ = dit(x, torch.tensor([[0.0, t, t]]), ctx, torch.zeros(1, dtype=torch.int64), no_past(cfg), no_past(cfg))
    theirs = model_fn_wan_video(dit=ref, latents=x, timestep=torch.tensor([t]), context=ctx,
                                fuse_vae_embedding_in_latents=True)
    compare("dit per-frame timesteps [0, t, t]", ours, theirs)
    uniform, _, _ = dit(x, torch.full((1, 3), t), ctx, torch.zeros(1, dtype=torch.int64), no_past(cfg), no_past(cfg))
    assert (uniform - ours).abs().max() > 1e-2  # the per-frame timestep does change frame 0


def test_dit_second_block_matches_diffsynth_full_attention(tmp_path):
    """The second block (frame_offset 3, the first block's keys/values as past) of a 1-layer DiT
    equals DiffSynth's full-attention pass over all 6 frames at the second block's frames: with
    one layer the keys/values of frames 0-2 depend on those frames alone, so block-causal and full
    attention agree on the later block's queries.  Checks the RoPE time offset and the cache."""
    cfg = replace(dit_configs()["wan-1.3b-2layers"], layers=1)
    dit, ref = dit_pair(cfg, tmp_path, seed=5)
    g = torch.Generator().manual_seed(13)
    x = torch.randn(1, cfg.latent_channels, 6, cfg.lat_h, cfg.lat_w, generator=g)
    ctx = text_context(cfg, g, valid=31)
    t = 937.5
    ts = torch.full((1, 3), t)
    _, k1, v1 = dit(x[:, :, :3], ts, ctx, torch.tensor([0]), no_past(cfg), no_past(cfg))
    second, k2, v2 = dit(x[:, :, 3:], ts, ctx, torch.tensor([3]), k1, v1)
    theirs = model_fn_wan_video(dit=ref, latents=x, timestep=torch.tensor([t]), context=ctx)
    compare("dit second block (frame_offset 3, past = block 0)", second, theirs[:, :, 3:])
    wrong, _, _ = dit(x[:, :, 3:], ts, ctx, torch.tensor([0]), k1, v1)
    assert (wrong - second).abs().max() > 1e-3  # the frame offset matters


# ----------------------------------------------------------------------------------------------
# VAE decoder


def latent_stats():
    mean = torch.tensor(WAN_LATENT_MEAN).view(1, 16, 1, 1, 1)
    std = torch.tensor(WAN_LATENT_STD).view(1, 16, 1, 1, 1)
    return mean, std


def vae_file(vae: VaeDecoder, skeleton_kwargs: dict, path: Path):
    """A whole WanVAE_ state dict as Wan2.1_VAE.pth holds it: our conv2.* and decoder.*, zeros for
    the encoder half and conv1 (DiffSynth's skeleton gives their names and shapes)."""
    with torch.device("meta"):
        skeleton = VideoVAE_(**skeleton_kwargs)
    sd = {k: torch.zeros(v.shape) for k, v in skeleton.state_dict().items() if k.startswith(("encoder.", "conv1."))}
    sd.update(vae.state_dict())
    torch.save(sd, path)


def test_vae_decode_matches_diffsynth(tmp_path):
    """5 latent frames of 8x8 (-> 17 frames of 64x64) at full widths (dim 96: 384/384/192/96).
    Ours: the bundle de-normalises (latent * std + mean, docs/generation.md) and decodes one latent
    frame per call with the explicit cache; DiffSynth: `VideoVAE_.decode(z, [mean, 1/std])`
    de-normalises inside and decodes the clip with its own causal cache; `WanVideoVAE.decode` also
    clamps to [-1, 1], as the runner does before the uint8 conversion."""
    vae = VaeDecoder(VaeConfig(dim=96)).init_random(2).eval()
    perturb_vectors(vae, 102)
    path = tmp_path / "Wan2.1_VAE.pth"
    try:
        vae_file(vae, {}, path)
        assert hash_model_file(str(path)) == HASH_WAN21_VAE
        entry = model_config(HASH_WAN21_VAE)
        assert entry["state_dict_converter"].endswith("WanVideoVAEStateDictConverter")
        ref = load_model(WanVideoVAE, str(path), entry.get("extra_kwargs", {}), torch.float32, "cpu",
                         WanVideoVAEStateDictConverter)
    finally:
        _unlink(path)
    assert ref.model.dim == 96 and ref.model.temperal_upsample == [True, True, False]
    assert torch.allclose(ref.mean, torch.tensor(WAN_LATENT_MEAN)) and torch.allclose(ref.std, torch.tensor(WAN_LATENT_STD))

    g = torch.Generator().manual_seed(21)
    z = torch.randn(1, 16, 5, 8, 8, generator=g)
    mean, std = latent_stats()
    ours = vae.decode(z * std + mean)
    theirs = ref.model.decode(z, ref.scale)
    assert theirs.shape == (1, 3, 17, 64, 64)
    compare("vae decode 5x8x8 -> 17x64x64 (dim 96)", ours, theirs)
    clamped = ref.decode([z[0]], "cpu")  # WanVideoVAE.decode: the pipeline's, clamped to [-1, 1]
    compare("vae decode, clamped to [-1, 1]", ours.clamp(-1, 1), clamped)
    assert 0.05 < (theirs.abs() < 1).float().mean() < 0.999  # the clamp is exercised, not trivial


def test_vae_decode_tiny_matches_diffsynth(tmp_path):
    """The tiny preset's decoder (dim 8) against DiffSynth's VideoVAE_(dim=8)."""
    cfg = preset("tiny")
    vae = VaeDecoder(cfg.vae).init_random(2).eval()
    perturb_vectors(vae, 103)
    path = tmp_path / "Wan2.1_VAE_dim8.pth"
    try:
        vae_file(vae, {"dim": cfg.vae.dim}, path)
        ref = load_model(VideoVAE_, str(path), {"dim": cfg.vae.dim, "z_dim": cfg.vae.z_dim}, torch.float32, "cpu")
    finally:
        _unlink(path)
    g = torch.Generator().manual_seed(22)
    z = torch.randn(1, 16, 5, cfg.lat_h, cfg.lat_w, generator=g)
    mean, std = latent_stats()
    compare("vae tiny decode", vae.decode(z * std + mean), ref.decode(z, [mean.flatten(), 1.0 / std.flatten()]))


# ----------------------------------------------------------------------------------------------
# Text encoder


def t5_pair(tcfg: TextConfig, length: int, tmp_path: Path, seed: int = 1):
    """(ours, DiffSynth's WanTextEncoder): ours with bf16-representable weights, the latter loaded
    from them saved in bf16 as models_t5_umt5-xxl-enc-bf16.pth is."""
    te = TextEncoder(tcfg, length).init_random(seed).eval()
    perturb_vectors(te, seed + 100, scale_names=("norm",))
    for p in te.parameters():
        p.data = p.data.bfloat16().float()
    path = tmp_path / "models_t5_umt5-xxl-enc-bf16.pth"
    try:
        torch.save({k: v.bfloat16() for k, v in te.state_dict().items()}, path)
        kwargs = dict(model_config(HASH_WAN21_T5).get("extra_kwargs", {}))
        kwargs.update(vocab=tcfg.vocab, dim=tcfg.dim, dim_attn=tcfg.dim, dim_ffn=tcfg.ffn_dim, num_heads=tcfg.heads,
                      num_layers=tcfg.layers, num_buckets=tcfg.num_buckets)
        ref = load_model(WanTextEncoder, str(path), kwargs, torch.float32, "cpu")
    finally:
        _unlink(path)
    assert not ref.shared_pos  # umt5: a relative position bias per layer
    return te, ref


def tokenizer_dir(tmp_path: Path) -> Path:
    """A tokenizer folder as AutoTokenizer (T5Tokenizer) loads it: assets/tokenizer/tokenizer.json and
    the minimal config (no sentinel ids: the small test tokenizer has none)."""
    import json
    import shutil

    d = tmp_path / "umt5-tokenizer"
    d.mkdir()
    shutil.copy(TOKENIZER_JSON, d / "tokenizer.json")
    special = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    (d / "special_tokens_map.json").write_text(json.dumps(special))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "additional_special_tokens": [], "model_max_length": 512, **special}))
    return d


PROMPTS = [
    "A cat walks on the grass, realistic style.",
    "Ein Fuchs läuft durch den verschneiten Wald 🦊, 日本の桜 &amp;amp; “curly quotes” — ﬁne café",
    "\t  A   red\u3000car\u00a0drives\n\nalong a coastal road at sunset, cinematic lighting, 4k  ",
]


def test_text_encoder_matches_diffsynth_on_real_prompts(tmp_path):
    """Width 4096, 64 heads, ffn 10240, 32 buckets, 2 layers, vocab 1000 (assets/tokenizer).  Ours:
    unstep_export.tokenizer.Tokenizer + TextEncoder at text_len 512; DiffSynth: its pipeline's
    `encode_prompt` (HuggingfaceTokenizer(seq_len=512, clean='whitespace') over the tokenizer folder,
    WanTextEncoder, padded positions zeroed)."""
    length = 512
    tcfg = replace(preset("wan-1.3b").text, vocab=1000, layers=2)
    assert (tcfg.dim, tcfg.heads, tcfg.ffn_dim, tcfg.num_buckets) == (4096, 64, 10240, 32)
    te, ref = t5_pair(tcfg, length, tmp_path)
    tok = Tokenizer(str(TOKENIZER_JSON), length)
    pipe = types.SimpleNamespace(tokenizer=HuggingfaceTokenizer(str(tokenizer_dir(tmp_path)), seq_len=length, clean="whitespace"),
                                 text_encoder=ref, device="cpu")
    for i, prompt in enumerate(PROMPTS):
        ids, mask = tok(prompt)
        n = int(mask.sum())
        assert 4 < n < length
        ours = te(torch.from_numpy(ids), torch.from_numpy(mask))
        theirs = WanVideoUnit_PromptEmbedder().encode_prompt(pipe, prompt)
        assert theirs.shape == (1, length, tcfg.dim)
        compare(f"text encoder prompt {i} ({n} tokens)", ours[:, :n], theirs[:, :n])
        # Wan zeroes the padded positions after the encoder; ours does it inside.
        assert (ours[:, n:] == 0).all() and (theirs[:, n:] == 0).all()
        raw = ref(torch.from_numpy(ids), torch.from_numpy(mask))  # before the zeroing
        assert raw[:, n:].abs().max() > 0


def test_text_encoder_tiny_matches_diffsynth(tmp_path):
    """The tiny preset's encoder (dim 64, 2 heads, bytes vocabulary 257) on byte ids."""
    cfg = preset("tiny")
    te, ref = t5_pair(cfg.text, cfg.text_len, tmp_path, seed=7)
    for prompt in ("a tiny prompt", "ünïcødé ✓ " * 5):
        ids, mask = tokenize_bytes(prompt, cfg.text_len)
        n = int(mask.sum())
        ours = te(torch.from_numpy(ids), torch.from_numpy(mask))
        theirs = ref(torch.from_numpy(ids), torch.from_numpy(mask))
        if n < cfg.text_len:
            assert (ours[:, n:] == 0).all()
        compare(f"text encoder tiny ({n} bytes)", ours[:, :n], theirs[:, :n])

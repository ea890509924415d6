"""Strict loading of the released weights (and of the tokenizer that goes with them).

The files a user has:
- Self-Forcing's generator checkpoint `self_forcing_dmd.pt`: a torch pickle of a dict whose
  `generator` and `generator_ema` entries are the causal Wan2.1-T2V-1.3B DiT's state dict with
  names prefixed `model.` (the DiT's own names: model.py `CausalDiT`);
- the Wan2.1-T2V-1.3B folder: `Wan2.1_VAE.pth` (the whole WanVAE_ state dict: `encoder.*`,
  `conv1.*`, `conv2.*`, `decoder.*`), `models_t5_umt5-xxl-enc-bf16.pth` (Wan's T5Encoder, bf16,
  24 layers, vocabulary 256384) and `google/umt5-xxl/tokenizer.json`.

Strict means: every tensor of a file is consumed or, for the VAE's encoder half and `conv1`
(which no graph uses), checked against the parameter skeleton of vae_encoder.py; every name and
every shape is checked before anything is copied, and a missing, extra or misshapen tensor is a
`CheckpointError` naming the file and the tensors.  A file of another model, or of another part of
this one, is recognised by its names and said so.  Float tensors of any width are cast to the
module's dtype as they are copied.  The CLI turns the error into exit status 2 before it touches
the output directory (`prepare` does all reading and checking; `modules` only copies).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import Config
from .layout import RELEASED, SELF_FORCING_FILE, WAN_DIR, WAN_FILES

# The DiT entry of a Self-Forcing checkpoint without --ema, as its inference.py without --use_ema.
DEFAULT_ENTRY = "generator"
EMA_ENTRY = "generator_ema"
# Fixed seeds of the parts that get seeded random weights: the tiny bundle and its golden files
# must be reproducible.
SEED_DIT, SEED_TEXT, SEED_VAE = 0, 1, 2
# Wrappers around a state dict's names: Self-Forcing's WanDiffusionWrapper (`model.`), FSDP,
# DataParallel, torch.compile.  Removed only when every name of the file carries the same one.
WRAPPER_PREFIXES = ("model.", "_fsdp_wrapped_module.", "module.", "_orig_mod.")
SHOW = 5  # names listed per kind of problem
RELEASED_NAMES = tuple(f.relative() for f in RELEASED)


class CheckpointError(Exception):
    """A checkpoint or tokenizer that cannot be used as given.  The message names the file and
    the tensors; the CLI prints it and exits with status 2 before it writes anything."""


@dataclass
class Part:
    """What one part of the model is made of: a file (`path`) or seeded random weights (None).
    `entry`: the DiT's entry in a Self-Forcing checkpoint (None: `generator`, or the file's only
    one).  `layers`: the layer count asked for (None: the file's, or the preset's).  For the text
    encoder, `tokenizer` is its tokenizer.json (None: the bytes tokenizer) and `tokenizer_source`
    how bundle.toml names it (`released`: from a Wan folder; `file`: given on its own)."""
    path: str | None = None
    entry: str | None = None
    layers: int | None = None
    tokenizer: str | None = None
    tokenizer_source: str = "file"
    # Given on the command line as part of another flag (--self-forcing, --wan-dir), for messages.
    flag: str = ""


def as_part(x) -> Part | None:
    """build()'s arguments: None, a path, or a Part."""
    if x is None or isinstance(x, Part):
        return x
    return Part(path=str(x))


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _listing(names) -> str:
    names = sorted(names, key=_natural)
    shown = ", ".join(names[:SHOW])
    more = len(names) - SHOW
    return shown + (f" (and {more} more)" if more > 0 else "")


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


# ---------------------------------------------------------------------------------------------
# Reading files
# ---------------------------------------------------------------------------------------------

def _is_safetensors(path: Path) -> bool:
    if path.suffix == ".safetensors":
        return True
    with open(path, "rb") as f:
        head = f.read(9)
    # An 8-byte little-endian header length, then the JSON header.
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < (1 << 32)


def _cannot_read(path, e) -> CheckpointError:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return CheckpointError(f"cannot read {path}: {type(e).__name__}: {msg} (truncated or not a checkpoint?)")


def read_torch(path: Path):
    """A torch pickle, memory-mapped where the format allows (the zip format of torch.save), with
    weights_only=True: only tensors and plain containers, never arbitrary Python objects."""
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap can only be used" not in str(e):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)  # the legacy format
    except Exception as e:  # noqa: BLE001  (any loader failure is a file we cannot use)
        text = str(e)
        if "Weights only load failed" in text:
            m = re.search(r"WeightsUnpickler error: ([^\n]*?)(?: Please use|\n|$)", text)
            detail = m.group(1).strip() if m else text.splitlines()[0]
            raise CheckpointError(f"cannot read {path} with torch.load(weights_only=True): it holds Python objects "
                                  f"besides tensors and containers ({detail}); the exporter reads state dicts only") from e
        raise _cannot_read(path, e) from e


class StateDict:
    """The tensors of one state dict, by name with the wrapper prefix removed (`prefix` is how
    the file spells it).  Shapes and dtypes are known without reading the data: torch pickles are
    memory-mapped, safetensors files are read tensor by tensor."""

    def __init__(self, path: Path, tensors=None, handle=None, prefix: str = "", entry: str | None = None,
                 entries=()):
        self.path, self.prefix, self.entry, self.entries = path, prefix, entry, tuple(entries)
        self._tensors, self._handle = tensors, handle
        if handle is not None:
            self._names = {k[len(prefix):]: k for k in handle.keys()}
        else:
            self._names = {k[len(prefix):]: k for k in tensors}

    def keys(self):
        return self._names.keys()

    def file_name(self, key: str) -> str:
        """The name as the file spells it (for messages)."""
        return self._names[key]

    def shape(self, key: str) -> tuple:
        if self._handle is not None:
            return tuple(self._handle.get_slice(self._names[key]).get_shape())
        return tuple(self._tensors[self._names[key]].shape)

    def is_float(self, key: str) -> bool:
        if self._handle is not None:
            return self._handle.get_slice(self._names[key]).get_dtype() in ("F64", "F32", "F16", "BF16")
        return self._tensors[self._names[key]].is_floating_point()

    def get(self, key: str) -> torch.Tensor:
        if self._handle is not None:
            return self._handle.get_tensor(self._names[key])
        return self._tensors[self._names[key]]

    def __len__(self):
        return len(self._names)


def _strip_prefix(names) -> str:
    """The wrapper prefix every name carries (e.g. `model.` of Self-Forcing's generator)."""
    prefix = ""
    while names:
        for p in WRAPPER_PREFIXES:
            if all(n.startswith(prefix + p) for n in names):
                prefix += p
                break
        else:
            break
    return prefix


def _unprefixed(names):
    prefix = _strip_prefix(list(names))
    return [n[len(prefix):] for n in names]


def open_state_dict(path, entry: str | None = None, default_entry: str | None = None, entry_flag: str = "",
                    want: str | None = None) -> StateDict:
    """The state dict in `path`: the file itself when it is one, else its `entry` (a dict of
    state dicts such as Self-Forcing's `generator` / `generator_ema`; without `entry`,
    `default_entry` or the file's only state dict).  `entry_flag` names the option that asked for
    `entry`, for the message when there is none; `want` the part it should be (a file of another
    part given with an entry is said to be that part's)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    if _is_safetensors(path):
        if entry:
            raise CheckpointError(f"{path} has no entry {entry!r}{entry_flag}: it is a safetensors file, one bare state dict")
        try:
            from safetensors import safe_open

            handle = safe_open(str(path), framework="pt")
            names = list(handle.keys())
        except Exception as e:  # noqa: BLE001
            raise _cannot_read(path, e) from e
        return StateDict(path, handle=handle, prefix=_strip_prefix(names))
    obj = read_torch(path)
    if not isinstance(obj, dict) or not obj:
        raise CheckpointError(f"{path}: a torch pickle of {type(obj).__name__}{' (empty)' if obj == {} else ''}, not a state dict")
    tensors = {k: v for k, v in obj.items() if torch.is_tensor(v)}
    entries = [k for k, v in obj.items() if isinstance(v, dict)]
    if tensors and not entries:
        if entry:
            if want:
                _check_kind(StateDict(path, tensors=tensors, prefix=_strip_prefix(list(tensors))), want)
            raise CheckpointError(f"{path} has no entry {entry!r}{entry_flag}: it is a bare state dict "
                                  f"({_count(len(tensors), 'tensor')}: {_listing(tensors)})")
        others = [k for k in obj if k not in tensors]
        if others:
            raise CheckpointError(f"{path}: {_count(len(others), 'entry')} that are not tensors: {_listing(map(str, others))}")
        return StateDict(path, tensors=tensors, prefix=_strip_prefix(list(tensors)))
    described = ", ".join(f"{k!r}" + ("" if isinstance(obj[k], dict) else f" ({type(obj[k]).__name__})") for k in obj)
    if want:
        # A file of another part (a Self-Forcing checkpoint given as the VAE, say) is said to be one.
        for k in entries:
            inner = {n: v for n, v in obj[k].items() if torch.is_tensor(v)}
            if inner and kind_of(_unprefixed(inner)) not in (None, want):
                _check_kind(StateDict(path, tensors=inner, prefix=_strip_prefix(list(inner)), entry=k), want)
    if entry is not None:
        if entry not in entries:
            raise CheckpointError(f"{path} has no entry {entry!r}{entry_flag}; its entries: {described}")
        chosen = entry
    elif default_entry in entries:
        chosen = default_entry
    elif len(entries) == 1:
        chosen = entries[0]
    else:
        raise CheckpointError(f"{path} holds several state dicts ({described}); say which one")
    sd = obj[chosen]
    bad = [str(k) for k, v in sd.items() if not torch.is_tensor(v)]
    if bad:
        raise CheckpointError(f"{path}, entry {chosen!r}: {_count(len(bad), 'entry')} that are not tensors: {_listing(bad)}")
    return StateDict(path, tensors=sd, prefix=_strip_prefix(list(sd)), entry=chosen, entries=entries)


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# What a state dict is, and what the preset expects
# ---------------------------------------------------------------------------------------------

KINDS = {  # kind -> (what a state dict of it is, the part, where it goes)
    "dit": ("a DiT state dict (patch_embedding.*, blocks.N.self_attn.*)", "a DiT",
            f"--self-forcing ({SELF_FORCING_FILE}) or --checkpoint"),
    "vae": ("a Wan VAE state dict (encoder.*, decoder.*)", "a Wan VAE",
            f"--vae-checkpoint, or {WAN_FILES['vae']} of --wan-dir"),
    "text": ("a T5 text encoder state dict (token_embedding.weight, blocks.N.attn.*)", "a T5 text encoder",
             f"--text-checkpoint, or {WAN_FILES['text']} of --wan-dir"),
}


def kind_of(keys) -> str | None:
    keys = set(keys)
    if "patch_embedding.weight" in keys or any(k.startswith("blocks.") and ".self_attn." in k for k in keys):
        return "dit"
    if "token_embedding.weight" in keys or any(k.startswith("blocks.") and ".attn.q." in k for k in keys):
        return "text"
    if any(k.startswith(("encoder.", "decoder.")) for k in keys):
        return "vae"
    return None


def _check_kind(sd: StateDict, want: str):
    kind = kind_of(sd.keys())
    if kind is not None and kind != want:
        what, part, where = KINDS[kind]
        raise CheckpointError(f"{_where(sd)} is {what}, not {KINDS[want][1]}; {part} is given with {where}")


def block_count(keys, prefix: str = "blocks.") -> int:
    ids = {int(m.group(1)) for k in keys if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    return max(ids) + 1 if ids else 0


def _where(sd: StateDict) -> str:
    return f"{sd.path}" + (f", entry {sd.entry!r}" if sd.entry else "")


def check_strict(sd: StateDict, expected: dict, what: str, preset: str):
    """Every name of `expected` (name -> shape) in the file with that shape and a float dtype,
    and nothing else."""
    have, want = set(sd.keys()), set(expected)
    missing, extra = want - have, have - want
    wrong = [k for k in sorted(want & have, key=_natural) if sd.shape(k) != tuple(expected[k])]
    nonfloat = [k for k in sorted(want & have, key=_natural) if k not in wrong and not sd.is_float(k)]
    if not (missing or extra or wrong or nonfloat):
        return
    lines = [f"{_where(sd)}: not the {what} of the preset {preset} ({_count(len(have), 'tensor')} in the file, "
             f"{len(want)} expected):"]
    pre = sd.prefix
    if missing:
        lines.append(f"  missing {_count(len(missing), 'tensor')}: {_listing(pre + k for k in missing)}")
    if extra:
        lines.append(f"  {_count(len(extra), 'extra tensor')}: {_listing(sd.file_name(k) for k in extra)}")
    if wrong:
        shown = "; ".join(f"{sd.file_name(k)} is {list(sd.shape(k))} in the file, {list(expected[k])} expected"
                          for k in wrong[:SHOW])
        more = f" (and {len(wrong) - SHOW} more)" if len(wrong) > SHOW else ""
        lines.append(f"  {_count(len(wrong), 'tensor')} of the wrong shape: {shown}{more}")
    if nonfloat:
        lines.append(f"  {_count(len(nonfloat), 'tensor')} not of a float type: {_listing(sd.file_name(k) for k in nonfloat)}")
    raise CheckpointError("\n".join(lines))


def _shapes(module) -> dict:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def expected_dit(cfg: Config) -> dict:
    from .model import CausalDiT

    with torch.device("meta"):
        return _shapes(CausalDiT(cfg))


def expected_text(cfg: Config) -> dict:
    from .text import TextEncoder

    with torch.device("meta"):
        return _shapes(TextEncoder(cfg.text, cfg.text_len))


def expected_vae(cfg: Config) -> dict:
    """The whole WanVAE_ state dict: the decoder side the graphs use (vae.py) and the encoder
    side that is only checked (vae_encoder.py)."""
    from .vae import VaeDecoder
    from .vae_encoder import VaeEncoderHalf

    with torch.device("meta"):
        return {**_shapes(VaeEncoderHalf(cfg.vae)), **_shapes(VaeDecoder(cfg.vae))}


def check_dit(sd: StateDict, cfg: Config, layers_flag: bool):
    _check_kind(sd, "dit")
    keys = sd.keys()
    if "patch_embedding.weight" in keys:
        dim, layers = sd.shape("patch_embedding.weight")[0], block_count(keys)
        if (dim, layers) != (cfg.dim, cfg.layers):
            hint = " (--dit-layers)" if layers_flag else ""
            raise CheckpointError(f"{_where(sd)}: this is a DiT of dim {dim} and {_count(layers, 'layer')}; the preset "
                                  f"{cfg.preset} expects dim {cfg.dim}, {_count(cfg.layers, 'layer')}{hint}")
    check_strict(sd, expected_dit(cfg), "DiT", cfg.preset)


def text_dims(sd: StateDict):
    """(vocab, width, layers) of a T5 encoder state dict, None where its names do not say."""
    keys = sd.keys()
    vocab = width = None
    if "token_embedding.weight" in keys and len(sd.shape("token_embedding.weight")) == 2:
        vocab, width = sd.shape("token_embedding.weight")
    return vocab, width, block_count(keys)


def check_vae(sd: StateDict, cfg: Config):
    _check_kind(sd, "vae")
    name = "decoder.conv1.weight"
    if name in sd.keys() and len(sd.shape(name)) == 5:
        base = sd.shape(name)[0] // cfg.vae.dim_mult[-1]
        if base != cfg.vae.dim:
            raise CheckpointError(f"{_where(sd)}: this is a Wan VAE of base width {base} (decoder.conv1: "
                                  f"{list(sd.shape(name))}); the preset {cfg.preset} expects {cfg.vae.dim}")
    check_strict(sd, expected_vae(cfg), "Wan VAE", cfg.preset)


def check_tokenizer(path) -> int:
    """A `tokenizers` tokenizer.json of the umt5 kind: a Unigram model with `<pad>` and `</s>`.
    Returns its vocabulary size."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {path} as a tokenizers tokenizer.json: {e}") from e
    model = data.get("model") if isinstance(data, dict) else None
    kind = model.get("type") if isinstance(model, dict) else None
    if kind != "Unigram":
        raise CheckpointError(f"{path}: a tokenizer of model type {kind!r}; the umt5 tokenizer "
                              f"({WAN_FILES['tokenizer']}) is a 'Unigram' model")
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"cannot read {path} as a tokenizers tokenizer.json: {e}") from e
    missing = [t for t in ("<pad>", "</s>") if tok.token_to_id(t) is None]
    if missing:
        raise CheckpointError(f"{path}: no {' or '.join(missing)} token; the umt5 tokenizer pads with <pad> and ends "
                              "each prompt with </s>")
    return tok.get_vocab_size()


# ---------------------------------------------------------------------------------------------
# The whole model: fit the config, read and check every part
# ---------------------------------------------------------------------------------------------

@dataclass
class Prepared:
    """Every part checked against the fitted config: the state dicts to copy (None: seeded random
    weights) and what bundle.toml says of them."""
    cfg: Config
    dit: StateDict | None = None
    text: StateDict | None = None
    vae: StateDict | None = None
    tokenizer: str | None = None
    tokenizer_source: str = "file"
    parts: tuple = ("dit", "text", "vae")
    notes: list = field(default_factory=list)

    def weights(self, hashes: bool = True) -> dict:
        """bundle.toml's [weights.*] tables (the sha256 of released files when `hashes`)."""
        out = {}
        seeds = {"dit": SEED_DIT, "text": SEED_TEXT, "vae": SEED_VAE}
        for part, table in (("dit", "dit"), ("vae", "vae"), ("text", "text_encoder")):
            if part not in self.parts:
                continue
            sd = getattr(self, part)
            if sd is None:
                out[table] = {"source": "random", "seed": seeds[part]}
            else:
                t = {"source": "released", "file": sd.path.name}
                if hashes:
                    t["sha256"] = sha256(sd.path)
                if part == "dit" and sd.entry:
                    t["entry"] = sd.entry
                out[table] = t
        if self.tokenizer and "text" in self.parts:
            t = {"source": self.tokenizer_source, "file": Path(self.tokenizer).name}
            if hashes:
                t["sha256"] = sha256(self.tokenizer)
            out["tokenizer"] = t
        return out


def prepare(cfg: Config, dit: Part | None = None, text: Part | None = None, vae: Part | None = None,
            parts=("dit", "text", "vae")) -> Prepared:
    """Fits `cfg` in place (the DiT's layers, the text encoder's layers and vocabulary, the
    tokenizer) to what is asked for and what the files hold, then reads and checks every file of
    `parts`.  Raises CheckpointError; reads nothing but the given files."""
    dit, text, vae = dit or Part(), text or Part(), vae or Part()
    prep = Prepared(cfg, parts=tuple(parts))
    if "dit" in parts:
        if dit.layers is not None:
            cfg.layers = dit.layers
        if dit.path:
            sd = open_state_dict(dit.path, dit.entry, DEFAULT_ENTRY, want="dit",
                                 entry_flag=" (asked for by --ema)" if dit.entry == EMA_ENTRY else "")
            check_dit(sd, cfg, dit.layers is not None)
            prep.dit = sd
            if sd.entry == DEFAULT_ENTRY and EMA_ENTRY in sd.entries:
                prep.notes.append(f"DiT: entry {DEFAULT_ENTRY!r} of {sd.path.name}; its {EMA_ENTRY!r} (Self-Forcing's "
                                  "README runs --use_ema) is exported with --ema")
    if "text" in parts:
        vocab = None
        if text.tokenizer:
            vocab = check_tokenizer(text.tokenizer)
            cfg.tokenizer = str(text.tokenizer)
            prep.tokenizer, prep.tokenizer_source = str(text.tokenizer), text.tokenizer_source
        else:
            cfg.tokenizer = None
        if text.path:
            sd = open_state_dict(text.path, want="text")
            _check_kind(sd, "text")
            file_vocab, width, layers = text_dims(sd)
            if width is not None and width != cfg.text.dim:
                raise CheckpointError(f"{sd.path}: this is a T5 encoder of width {width} and {_count(layers, 'layer')}; the preset "
                                      f"{cfg.preset} expects width {cfg.text.dim}")
            if text.layers is not None and text.layers != layers:
                raise CheckpointError(f"{sd.path} has {_count(layers, 'layer')}; --text-layers asks for {text.layers} (leave it out "
                                      "with a checkpoint: the layers come from the file)")
            if file_vocab is None:
                raise CheckpointError(f"{sd.path}: no token_embedding.weight [vocab, {cfg.text.dim}]; not a T5 encoder "
                                      f"state dict ({_count(len(sd), 'tensor')}: {_listing(sd.keys())})")
            if not text.tokenizer:
                raise CheckpointError(f"{sd.path}: a released text encoder needs its tokenizer: give --wan-dir or "
                                      f"--tokenizer ({WAN_FILES['tokenizer']}); the bytes tokenizer's ids mean nothing to it")
            if vocab > file_vocab:
                raise CheckpointError(f"{text.tokenizer}: {vocab} tokens, but {sd.path} embeds only {file_vocab}")
            cfg.text.layers, cfg.text.vocab = layers, file_vocab
            check_strict(sd, expected_text(cfg), "text encoder", cfg.preset)
            prep.text = sd
        else:
            if text.layers is not None:
                cfg.text.layers = text.layers
            elif text.tokenizer:
                cfg.text.layers = cfg.text.released_layers
            if vocab is not None:
                cfg.text.vocab = vocab
    if "vae" in parts and vae.path:
        sd = open_state_dict(vae.path, want="vae")
        check_vae(sd, cfg)
        prep.vae = sd
    return prep


@contextlib.contextmanager
def no_init():
    """Module construction without the default initialisation of its parameters (uninitialised
    memory instead): every parameter is overwritten by a checked state dict, and initialising
    the 5.7 billion of the released text encoder first would only cost time."""
    names = ("uniform_", "normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_",
             "trunc_normal_", "zeros_", "ones_", "constant_")
    saved = {n: getattr(torch.nn.init, n) for n in names}
    for n in names:
        setattr(torch.nn.init, n, lambda t, *a, **k: t)
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)


def copy_into(module: torch.nn.Module, sd: StateDict, keys=None):
    """Copies the (checked) tensors into the module's parameters and persistent buffers, one at a
    time, casting floats to the module's dtype."""
    targets = module.state_dict(keep_vars=True)
    with torch.no_grad():
        for name in keys if keys is not None else targets:
            targets[name].data.copy_(sd.get(name))
    return module


def modules(prep: Prepared):
    """(dit, text encoder, vae decoder) for the parts of `prep` (None for a part not prepared):
    checked state dicts copied in, seeded random weights for the others."""
    from .model import CausalDiT
    from .text import TextEncoder
    from .vae import VaeDecoder

    cfg = prep.cfg
    out = []
    for part, make, seed in (("dit", lambda: CausalDiT(cfg), SEED_DIT),
                             ("text", lambda: TextEncoder(cfg.text, cfg.text_len), SEED_TEXT),
                             ("vae", lambda: VaeDecoder(cfg.vae), SEED_VAE)):
        if part not in prep.parts:
            out.append(None)
            continue
        sd = getattr(prep, part)
        if sd is None:
            m = make().init_random(seed)
        else:
            with no_init():
                m = make()
            # The VAE file's encoder half is checked (prepare) but not used.
            copy_into(m, sd)
        out.append(m.eval())
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Command-line options -> parts
# ---------------------------------------------------------------------------------------------

# The options that name a part's file, which --released names all at once.
FILE_OPTIONS = ("self_forcing", "wan_dir", "checkpoint", "text_checkpoint", "vae_checkpoint", "tokenizer")


def released_folder(root) -> tuple:
    """(self_forcing, wan_dir) of a released folder (layout.py), every file the exporter reads
    checked to be there."""
    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(f"--released {root}: no such directory; fetch the released weights with "
                              f"`python -m unstep_export download --out {root}`")
    missing = [f.relative() for f in RELEASED if not f.local(root).is_file()]
    if missing:
        raise CheckpointError(f"--released {root}: {', '.join(missing)} not found there; fetch "
                              f"{'it' if len(missing) == 1 else 'them'} with `python -m unstep_export download --out {root}` "
                              "(it skips the files already complete)")
    return str(RELEASED[0].local(root)), str(root / WAN_DIR)


def parts_from_args(args):
    """(dit, text, vae) Parts from the CLI options: --released DIR (alone: the same as
    --self-forcing DIR/checkpoints/self_forcing_dmd.pt --ema --wan-dir DIR/Wan2.1-T2V-1.3B),
    --self-forcing CKPT [--ema], --wan-dir DIR, --checkpoint / --text-checkpoint / --vae-checkpoint
    (a part's file; over --wan-dir's), --tokenizer FILE (over --wan-dir's), --text-layers N,
    --dit-layers N."""
    get = lambda name: getattr(args, name, None)  # noqa: E731  (callers with older Namespaces)
    if get("released"):
        others = [f"--{o.replace('_', '-')}" for o in FILE_OPTIONS if get(o)]
        if others:
            raise CheckpointError(f"--released {get('released')} names every file ({', '.join(RELEASED_NAMES)}); "
                                  f"{' and '.join(others)} would name {'another' if len(others) == 1 else 'others'}: "
                                  "give either --released or the files one by one")
        self_forcing, wan = released_folder(get("released"))
        ema, sf_flag, wan_flag = True, "--released", "--released"
    else:
        self_forcing, wan, ema = get("self_forcing"), get("wan_dir"), get("ema")
        sf_flag, wan_flag = "--self-forcing", "--wan-dir"
    dit = Part(layers=get("dit_layers"))
    if self_forcing and get("checkpoint"):
        raise CheckpointError("--self-forcing and --checkpoint both give the DiT; give one")
    if self_forcing:
        dit.path, dit.flag = self_forcing, sf_flag
    elif get("checkpoint"):
        dit.path, dit.flag = get("checkpoint"), "--checkpoint"
    if ema:
        if not dit.path:
            raise CheckpointError(f"--ema picks the {EMA_ENTRY!r} entry of a Self-Forcing checkpoint: give it with "
                                  f"--self-forcing {SELF_FORCING_FILE}")
        dit.entry = EMA_ENTRY
    text = Part(layers=get("text_layers"))
    vae = Part()
    if wan:
        wan = Path(wan)
        if not wan.is_dir():
            raise CheckpointError(f"--wan-dir {wan}: no such directory")
        missing = [f for part, f in WAN_FILES.items() if not (wan / f).is_file()]
        if missing:
            raise CheckpointError(f"--wan-dir {wan}: {', '.join(missing)} not found there (the Wan2.1-T2V-1.3B folder "
                                  f"holds {', '.join(WAN_FILES.values())})")
        vae.path, text.path = str(wan / WAN_FILES["vae"]), str(wan / WAN_FILES["text"])
        text.tokenizer, text.tokenizer_source = str(wan / WAN_FILES["tokenizer"]), "released"
        vae.flag = text.flag = wan_flag
    if get("vae_checkpoint"):
        vae.path, vae.flag = get("vae_checkpoint"), "--vae-checkpoint"
    if get("text_checkpoint"):
        text.path, text.flag = get("text_checkpoint"), "--text-checkpoint"
    if get("tokenizer"):
        text.tokenizer, text.tokenizer_source = get("tokenizer"), "file"
    return dit, text, vae


def given(part: Part | None) -> bool:
    return part is not None and bool(part.path)

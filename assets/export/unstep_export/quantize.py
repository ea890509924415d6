"""fp8 bundles (docs/bundle.md, precision "fp8"): float8 E4M3 weights for the linear layers of the
DiT's blocks in `dit_fused.onnx`, run by the runner's `ai.unstep::MatMulFp8`.

- `e4m3_encode` / `e4m3_decode`: OCP E4M3 ("e4m3fn": 1 sign bit, 4 exponent bits of bias 7,
  3 mantissa bits, no infinities, 0x7f / 0xff NaN, largest finite 448) in numpy: round to
  nearest, ties to even, saturating to +-448.
- `quantize_weight`: a float weight [N, K] -> (uint8 codes [N, K], float32 scale [N]), one scale
  per output channel.
- `matmul_fp8`: the numpy reference of `MatMulFp8` (per-row activation scales computed from the
  row itself, the product of the E4M3 values summed in float32, bias, optional tanh GELU, one
  rounding to the activations' type).
- `rewrite_dit_fused`: the graph rewrite (every block `MatMul` by a constant and every
  `MatMulBiasGelu` becomes a `MatMulFp8`), and `quantize_bundle`: an fp16 bundle -> an fp8 one
  (`python -m unstep_export quantize`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import tomllib
from pathlib import Path

import numpy as np

E4M3_MAX = 448.0
UNSTEP_DOMAIN = "ai.unstep"
MATMUL_FP8 = "MatMulFp8"
# The nodes the rewrite turns into MatMulFp8: the linear layers of the DiT's blocks.
BLOCK_SCOPE = "/dit/blocks."
# A tensor written into `<name>.data` rather than inline when the graph's other tensors are there
# too (ONNX's own default threshold for external data).
EXTERNAL_MIN_BYTES = 1024
FP8_NOTE = ("fp8: the linear layers of the DiT's blocks in dit_fused.onnx are float8 E4M3 (weights per "
            "output channel, activations per token, scaled at run time); every other graph and layer is "
            "as in the fp16 bundle it was made from.")


class QuantizeError(Exception):
    """A bundle (or option) the fp8 rewrite cannot use; the message says what to do."""


# ---------------------------------------------------------------------------------------------
# E4M3 and the reference arithmetic
# ---------------------------------------------------------------------------------------------

def _decode_table() -> np.ndarray:
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp, man = (codes >> 3) & 0xF, codes & 0x7
    value = np.where(exp == 0, man * 2.0 ** -9, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    value = sign * value
    value[(codes & 0x7F) == 0x7F] = np.nan
    return value.astype(np.float32)


E4M3_VALUES = _decode_table()  # code -> float32 value (exact: every E4M3 value is a float32)


def e4m3_decode(codes) -> np.ndarray:
    """uint8 E4M3 codes -> their float32 values (NaN for 0x7f / 0xff)."""
    return E4M3_VALUES[np.asarray(codes, np.uint8)]


def e4m3_encode(x) -> np.ndarray:
    """Float values -> uint8 E4M3 codes: round to nearest, ties to even, saturating (magnitudes
    above 448, infinities included, become +-448); NaN -> 0x7f with its sign bit; the sign of a
    zero (or of a value that rounds to zero) is kept."""
    x = np.asarray(x, np.float32)
    sign = (np.signbit(x).astype(np.uint8) << 7).astype(np.uint8)
    a = np.abs(x).astype(np.float64)  # exact; every step below is exact in float64
    finite = np.isfinite(a)
    a = np.where(finite, a, 0.0)
    _, e = np.frexp(a)  # a = f * 2**e with f in [0.5, 1): the binade's exponent is e - 1
    # Spacing of E4M3 values around a: 2**(exponent - 3); subnormals share the exponent -6.
    exponent = np.maximum(e - 1, -6)
    step = np.ldexp(1.0, exponent - 3)
    r = np.rint(a / step) * step  # np.rint: ties to even
    r = np.where(finite, np.minimum(r, E4M3_MAX), E4M3_MAX)
    _, e = np.frexp(r)
    e = e - 1
    normal = r >= 2.0 ** -6
    e_n = np.where(normal, e, 0)
    mantissa = np.where(normal, (r / np.ldexp(1.0, e_n) - 1.0) * 8.0, r / 2.0 ** -9)
    code = np.where(normal, ((e_n + 7) << 3), 0) + mantissa.astype(np.int64)
    code = code.astype(np.uint8) | sign
    return np.where(np.isnan(x), np.uint8(0x7F) | sign, code).astype(np.uint8)


def quantize_weight(w) -> tuple[np.ndarray, np.ndarray]:
    """A linear layer's weight [N, K] (out x in) -> (E4M3 codes uint8 [N, K], scale float32 [N]),
    in float32: per output channel n, scale[n] = max_k |w[n, k]| / 448 (1 for an all-zero row)
    and codes[n, k] = e4m3(clamp(w[n, k] / scale[n], -448, 448)), so that
    w[n, k] ~= scale[n] * value(codes[n, k])."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ValueError(f"a weight [N, K] was expected, not shape {list(w.shape)}")
    if not np.isfinite(w).all():
        raise ValueError("the weight has non-finite values")
    m = np.abs(w).max(axis=1) if w.shape[1] else np.zeros(w.shape[0], np.float32)
    scale = np.where(m > 0, m / np.float32(E4M3_MAX), np.float32(1.0)).astype(np.float32)
    q = np.clip(w / scale[:, None], -E4M3_MAX, E4M3_MAX).astype(np.float32)
    return e4m3_encode(q), scale


def quantize_rows(x) -> tuple[np.ndarray, np.ndarray]:
    """MatMulFp8's activation quantisation of X viewed as [M, K]: per row r, a = max_k |X[r, k]|
    (float32), and for a > 0 s_r = a / 448, q[r] = e4m3(X[r] * (448 / a)) (float32 divisions and
    product); a zero row gives codes 0 and s_r = 0.  Returns (codes uint8 [M, K], s float32 [M])."""
    x = np.asarray(x)
    k = x.shape[-1]
    rows = x.astype(np.float32).reshape(-1, k)
    a = np.abs(rows).max(axis=1) if k else np.zeros(rows.shape[0], np.float32)
    nonzero = a > 0
    safe = np.where(nonzero, a, np.float32(1.0)).astype(np.float32)
    inv = (np.float32(E4M3_MAX) / safe).astype(np.float32)
    s = np.where(nonzero, safe / np.float32(E4M3_MAX), np.float32(0.0)).astype(np.float32)
    q = e4m3_encode(rows * inv[:, None])
    q[~nonzero] = 0
    return q, s


def gelu_tanh(v):
    """GELU's tanh form in float32 (MatMulBiasGelu's and BiasGelu's)."""
    c = np.float32(np.sqrt(2.0 / np.pi))
    return np.float32(0.5) * v * (np.float32(1) + np.tanh(c * (v + np.float32(0.044715) * v * v * v)))


def matmul_fp8(x, w, w_scale, bias, gelu: int = 0) -> np.ndarray:
    """The reference of `ai.unstep::MatMulFp8(X, W, w_scale, bias)` (docs/bundle.md): X [..., K]
    of type T, W uint8 E4M3 [N, K], w_scale float32 [N], bias T [N].  Per row r of X,
    Y[r, n] = act(s_r * w_scale[n] * sum_k value(q[r, k]) * value(W[n, k]) + bias[n]) in float32
    (act: tanh GELU when gelu = 1, else the identity), rounded to T once; Y has X's shape with N
    last."""
    x = np.asarray(x)
    w = np.asarray(w)
    n, k = w.shape
    if w.dtype != np.uint8 or x.shape[-1] != k or np.shape(w_scale) != (n,) or np.shape(bias) != (n,):
        raise ValueError(f"MatMulFp8: X {list(x.shape)}, W {list(w.shape)} {w.dtype}, w_scale "
                         f"{list(np.shape(w_scale))}, bias {list(np.shape(bias))}: expected X [..., K], "
                         "W uint8 [N, K], w_scale [N], bias [N]")
    q, s = quantize_rows(x)
    acc = e4m3_decode(q) @ e4m3_decode(w).T  # float32 sums of exact float32 products
    v = (s[:, None] * np.asarray(w_scale, np.float32)[None, :]) * acc + np.asarray(bias, np.float32)[None, :]
    if gelu:
        v = gelu_tanh(v)
    return v.reshape(x.shape[:-1] + (n,)).astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# The rewrite of dit_fused.onnx
# ---------------------------------------------------------------------------------------------

def rewrite_dit_fused(model, base_dir) -> dict:
    """Rewrites `model` (a dit_fused.onnx loaded without its external data, which is read from
    `base_dir` as needed) in place: every `MatMul` named under `/dit/blocks.` whose second input is
    a 2-D constant [K, N] (an initializer, possibly through Identity nodes) becomes
    `MatMulFp8(X, W_q [N, K], w_scale [N], zeros [N])` with gelu = 0, and every
    `ai.unstep::MatMulBiasGelu(X, W [N, K], bias)` becomes `MatMulFp8(X, W_q, w_scale, bias)` with
    gelu = 1; node names and outputs are kept.  The weights they replace are removed where nothing
    else reads them.  Returns counts and byte sizes of what it did."""
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    names = set(inits) | {o for n in graph.node for o in n.output} | {v.name for v in graph.input}

    def source(v):
        while v in producer and producer[v].op_type == "Identity" and producer[v].domain in ("", "ai.onnx"):
            v = producer[v].input[0]
        return v

    def fresh(name):
        new, i = name, 1
        while new in names:
            new, i = f"{name}.{i}", i + 1
        names.add(new)
        return new

    quantised = {}  # (initializer name, transposed) -> (W_q name, w_scale name)
    zeros = {}  # (N, element type) -> name
    new_tensors = []
    stats = {"matmul": 0, "matmul_bias_gelu": 0, "weight_bytes_before": 0, "weight_bytes_after": 0,
             "left": []}
    replaced = set()
    for node in graph.node:
        plain = node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and node.name.startswith(BLOCK_SCOPE)
        fused = node.op_type == "MatMulBiasGelu" and node.domain == UNSTEP_DOMAIN
        if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and not plain:
            stats["left"].append(node.name)
        if not (plain or fused):
            continue
        src = source(node.input[1])
        t = inits.get(src)
        if t is None or len(t.dims) != 2:
            if fused:
                raise QuantizeError(f"{node.name}: its weight {node.input[1]} is not a 2-D constant "
                                    "(MatMulBiasGelu's W is the layer's [N, K] weight)")
            stats["left"].append(node.name)
            continue
        key = (src, plain)
        if key not in quantised:
            w = numpy_helper.to_array(t, base_dir=str(base_dir)).astype(np.float32)
            try:
                codes, scale = quantize_weight(w.T if plain else w)
            except ValueError as e:
                raise QuantizeError(f"{node.name}: weight {src}: {e}") from None
            wq = numpy_helper.from_array(np.ascontiguousarray(codes), fresh(f"{src}.e4m3"))
            ws = numpy_helper.from_array(scale, fresh(f"{src}.w_scale"))
            new_tensors += [wq, ws]
            quantised[key] = (wq.name, ws.name)
            stats["weight_bytes_before"] += w.size * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
            stats["weight_bytes_after"] += codes.nbytes + scale.nbytes
        wq_name, ws_name = quantised[key]
        n_out = int(t.dims[1] if plain else t.dims[0])
        if plain:
            zkey = (n_out, t.data_type)
            if zkey not in zeros:
                z = numpy_helper.from_array(np.zeros(n_out, helper.tensor_dtype_to_np_dtype(t.data_type)),
                                            fresh(f"fp8.zero_bias.{n_out}"))
                new_tensors.append(z)
                zeros[zkey] = z.name
            bias = zeros[zkey]
        else:
            bias = node.input[2]
        new = helper.make_node(MATMUL_FP8, [node.input[0], wq_name, ws_name, bias], list(node.output),
                               name=node.name, domain=UNSTEP_DOMAIN, gelu=0 if plain else 1)
        replaced.add(node.input[1])
        node.CopyFrom(new)
        stats["matmul" if plain else "matmul_bias_gelu"] += 1
    graph.initializer.extend(new_tensors)

    # The replaced weights (and Identity nodes that only passed them on) that nothing reads now.
    while True:
        read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node
                if n.op_type == "Identity" and n.output[0] in replaced and n.output[0] not in read]
        if not dead:
            break
        for n in dead:
            replaced.add(n.input[0])
            graph.node.remove(n)
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for t in [t for t in graph.initializer if t.name in replaced and t.name not in read]:
        graph.initializer.remove(t)
    for v in [v for v in graph.input if v.name in replaced and v.name not in read]:
        graph.input.remove(v)
    if not any(o.domain == UNSTEP_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(UNSTEP_DOMAIN, 1))
    return stats


def _external_info(t) -> dict:
    return {e.key: e.value for e in t.external_data}


def _has_external_data(model) -> bool:
    from onnx import TensorProto

    from .export import _all_tensors

    return any(t.data_location == TensorProto.EXTERNAL for t in _all_tensors(model.graph))


def save_graph(model, path: Path, src_dir: Path, external: bool):
    """Saves `model` as `path`.  With `external`, every tensor stored in a file of `src_dir` (the
    graph's original external data, read, never moved or changed) and every other initializer of
    at least EXTERNAL_MIN_BYTES is written, page-aligned, into one `<name>.data` beside it, as
    export._save lays it out (tensors of node attributes that are inline stay inline); otherwise
    the graph holds its tensors."""
    import onnx
    from onnx import TensorProto

    from .export import EXTERNAL_ALIGN, _all_tensors, copy_bytes

    data = path.with_name(path.name + ".data")
    for f in (path, data):
        f.unlink(missing_ok=True)
    if not external:
        assert not _has_external_data(model), "a graph with external tensors needs external=True"
        onnx.save_model(model, str(path))
        return
    # _all_tensors yields the graph's own initializers first, then the tensors of node attributes.
    n_init = len(model.graph.initializer)
    with open(data, "wb") as dst:
        for i, t in enumerate(_all_tensors(model.graph)):
            if t.data_location == TensorProto.EXTERNAL:
                info = _external_info(t)
                src = src_dir / info["location"]
                dst.write(b"\0" * (-dst.tell() % EXTERNAL_ALIGN))
                start = dst.tell()
                left = copy_bytes(src, info, dst)
                if left:
                    raise QuantizeError(f"{src}: ends {left} bytes before tensor {t.name}'s data does: the bundle "
                                        "is damaged; export it again")
            elif i < n_init and t.HasField("raw_data") and len(t.raw_data) >= EXTERNAL_MIN_BYTES:
                dst.write(b"\0" * (-dst.tell() % EXTERNAL_ALIGN))
                start = dst.tell()
                dst.write(t.raw_data)
                t.ClearField("raw_data")
            else:
                continue
            del t.external_data[:]
            for key, value in (("location", data.name), ("offset", str(start)), ("length", str(dst.tell() - start))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            t.data_location = TensorProto.EXTERNAL
    onnx.save_model(model, str(path))
    os.chmod(data, 0o644)


# ---------------------------------------------------------------------------------------------
# fp16 bundle -> fp8 bundle
# ---------------------------------------------------------------------------------------------

GRAPH = "dit_fused.onnx"
GRAPH_FILES = (GRAPH, GRAPH + ".data")


def _config_of(meta: dict, where: Path):
    """The Config whose bundle.toml tables are `meta`'s (for export.write_toml)."""
    from .config import preset

    if meta.get("preset") not in ("tiny", "wan-1.3b"):
        raise QuantizeError(f"{where}: preset {meta.get('preset')!r} is not one this exporter writes "
                            "(tiny | wan-1.3b)")
    cfg = preset(meta["preset"])
    arch, exp, lat = meta.get("architecture", {}), meta.get("export", {}), meta.get("latent", {})
    try:
        for key in ("dim", "ffn_dim", "heads", "layers", "text_len", "text_dim", "latent_channels"):
            setattr(cfg, key, int(arch[key]))
        cfg.patch = tuple(int(p) for p in arch["patch"])
        for key in ("frames_per_block", "latent_frames", "height", "width"):
            setattr(cfg, key, int(exp[key]))
        cfg.latent_mean, cfg.latent_std = [float(v) for v in lat["mean"]], [float(v) for v in lat["std"]]
    except (KeyError, TypeError, ValueError) as e:
        raise QuantizeError(f"{where}: [architecture], [export] or [latent] is incomplete ({e!r}): "
                            "export the bundle again") from None
    return cfg


def _header_notes(text: str) -> list:
    """The comment lines at the top of a bundle.toml after the first (the exporter's notes)."""
    lines = []
    for line in text.splitlines()[1:]:
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return lines


def _toml_args(meta: dict, toml: Path):
    """write_toml's arguments for `meta` (a bundle.toml of this exporter's format), checked by
    writing them once into an empty directory and comparing with `meta`."""
    from .export import write_toml

    missing = [t for t in ("tokenizer", "text_encoder", "weights") if t not in meta]
    if missing:
        raise QuantizeError(f"{toml}: no [{'], ['.join(missing)}] (written by exporter "
                            f"{meta.get('exporter_version')}): export the bundle again with this exporter")
    cfg = _config_of(meta, toml)
    svd = meta.get("export", {}).get("svd_rank")
    kwargs = dict(tokenizer=meta["tokenizer"], text_encoder=meta["text_encoder"], weights=meta["weights"],
                  exporter_version=meta.get("exporter_version"))
    with tempfile.TemporaryDirectory() as tmp:
        for name in meta.get("files", {}):
            (Path(tmp) / name).touch()
        write_toml(cfg, Path(tmp), meta.get("precision"), svd if isinstance(svd, int) else None, **kwargs)
        again = tomllib.loads((Path(tmp) / "bundle.toml").read_text(encoding="utf-8"))
    differ = sorted(k for k in set(meta) | set(again) if k != "files" and meta.get(k) != again.get(k))
    if differ or set(meta.get("files", {})) != set(again.get("files", {})):
        raise QuantizeError(f"{toml}: {', '.join(differ) or '[files]'} cannot be written again as they are "
                            "(a bundle.toml of another exporter version, or edited): export the bundle again")
    return cfg, (svd if isinstance(svd, int) else None), kwargs


def _size(paths) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


def quantize_bundle(src, out) -> dict:
    """Writes the fp8 bundle of the fp16 bundle `src` into `out` (which may be `src`: rewritten in
    place): dit_fused.onnx rewritten (rewrite_dit_fused), with its tensors in dit_fused.onnx.data
    when the source graph has external data; every other file of `src` hard-linked (copied where
    a link cannot be made; subdirectories such as golden/ are left out); bundle.toml written again
    with precision "fp8", the fp8 note and the new sha256s.  A file of `out` that is replaced is
    unlinked first, never written through (it may be a hard link of another bundle's file).
    Everything is read and checked before `out` is touched.  Returns what it did and prints it."""
    import onnx

    from .export import _all_tensors, sha256, write_toml

    src, out = Path(src), Path(out)
    toml = src / "bundle.toml"
    if not toml.is_file():
        raise QuantizeError(f"{src}: no bundle.toml there: --from takes a bundle directory")
    text = toml.read_text(encoding="utf-8")
    meta = tomllib.loads(text)
    precision = meta.get("precision")
    if precision == "fp8":
        raise QuantizeError(f"{toml}: the bundle is already fp8; quantize takes the fp16 bundle it was made from")
    if precision != "fp16":
        raise QuantizeError(f"{toml}: the bundle is {precision}; quantize takes an fp16 bundle (export one with "
                            "--precision fp16, or export with --precision fp8, which writes fp16 and quantizes it)")
    graph_path = src / GRAPH
    if meta.get("graphs", {}).get("dit_fused") != GRAPH or not graph_path.is_file():
        raise QuantizeError(f"{src}: no dit_fused.onnx (or not in [graphs]): the fp8 layers are in dit_fused.onnx; "
                            "export the bundle without --no-fused-dit")
    files = meta.get("files", {})
    for name in GRAPH_FILES:
        if (src / name).is_file() and files.get(name) != sha256(src / name):
            raise QuantizeError(f"{src / name} does not match its sha256 in bundle.toml: the bundle is damaged or "
                                "was changed by hand; export it again")
    cfg, svd, toml_kwargs = _toml_args(meta, toml)
    in_place = out.exists() and out.resolve() == src.resolve()
    if out.exists() and not in_place and (not out.is_dir() or any(out.iterdir())):
        raise QuantizeError(f"{out} exists and is not an empty directory: give a new directory for the fp8 bundle, "
                            "or the fp16 bundle itself to rewrite it in place")

    model = onnx.load(str(graph_path), load_external_data=False)
    external = _has_external_data(model)
    for location in sorted({_external_info(t).get("location", "") for t in _all_tensors(model.graph)
                            if t.data_location == onnx.TensorProto.EXTERNAL}):
        if not (src / location).is_file() or Path(location).name != location:
            raise QuantizeError(f"{graph_path}: its external data {location!r} is not a file beside it: the bundle is "
                                "incomplete; export it again")
    stats = rewrite_dit_fused(model, src)
    rewritten = stats["matmul"] + stats["matmul_bias_gelu"]
    if not rewritten:
        raise QuantizeError(f"{graph_path}: no MatMul by a constant under {BLOCK_SCOPE} and no MatMulBiasGelu: not "
                            "a dit_fused.onnx this rewrite knows; export the bundle again")
    before = _size(src / n for n in GRAPH_FILES)

    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=out, prefix=".dit_fused.fp8.") as tmp:
            save_graph(model, Path(tmp) / GRAPH, src, external)
            del model
            linked = copied = 0
            skipped = []
            if not in_place:
                for p in sorted(src.iterdir()):
                    if p.name in GRAPH_FILES or p.name == "bundle.toml":
                        continue
                    if not p.is_file():
                        skipped.append(p.name)
                        continue
                    try:
                        os.link(p, out / p.name)
                        linked += 1
                    except OSError:
                        shutil.copy2(p, out / p.name)
                        copied += 1
            for name in GRAPH_FILES + ("bundle.toml",):
                (out / name).unlink(missing_ok=True)
            for name in GRAPH_FILES:
                if (Path(tmp) / name).exists():
                    os.replace(Path(tmp) / name, out / name)
        after = _size(out / n for n in GRAPH_FILES)
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    notes = [n for n in _header_notes(text) if n != FP8_NOTE] + [FP8_NOTE]
    write_toml(cfg, out, "fp8", svd, "\n".join(notes), **toml_kwargs)

    left = stats["left"]
    scopes = sorted({name.rsplit("/", 1)[0] for name in left})
    print(f"{GRAPH}: {rewritten} linear layers of the DiT's blocks to float8 E4M3: {stats['matmul']} MatMul -> "
          f"MatMulFp8 (gelu 0), {stats['matmul_bias_gelu']} MatMulBiasGelu -> MatMulFp8 (gelu 1); "
          f"{len(left)} MatMul left as they are" + (f" ({', '.join(scopes)})" if scopes else ""))
    print(f"{GRAPH}: weights {_gb(stats['weight_bytes_before'])} -> {_gb(stats['weight_bytes_after'])} (codes and "
          f"scales); {' + '.join(n for n in GRAPH_FILES if (out / n).exists())} {_gb(before)} -> {_gb(after)}")
    if not in_place:
        print(f"{out}: {linked} other files hard-linked" + (f", {copied} copied (no link possible)" if copied else "")
              + (f"; not taken: {', '.join(skipped)} (directories)" if skipped else ""))
    print(f"wrote {out}/bundle.toml: precision = \"fp8\"")
    return {**stats, "rewritten": rewritten, "bytes_before": before, "bytes_after": after}

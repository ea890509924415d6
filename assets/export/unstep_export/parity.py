"""Exported graphs (Python onnxruntime) vs the PyTorch reference: per graph on random inputs,
then the whole generation loop.  Exit status 1 when any figure is above tolerance."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .config import preset
from .quantize import matmul_fp8
from .sample import OrtBackend, Settings, TorchBackend, generate, tokenize


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
        ids, mask = tokenize(cfg, prompts[args.indices[0]])
        ref = te(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        report("text_encoder", ort_b.text(ids, mask).numpy(), ref, args.graph_tol)

        # DiT, first block (P = 0) and a later block (P = 2 blocks)
        F, T = cfg.frames_per_block, cfg.frames_per_block * cfg.tokens_per_frame
        ctx = torch.from_numpy(ref)
        # dit.onnx keeps the values without the value projection's bias (docs/bundle.md): eager
        # PyTorch gets the same past with the bias added, and its new values lose it again.
        v_bias = [blk.self_attn.v.bias.detach() for blk in dit.blocks]
        for P in (0, 2 * T):
            x = torch.randn(1, cfg.latent_channels, F, cfg.lat_h, cfg.lat_w, generator=g)
            pk = [torch.randn(1, P, cfg.dim, generator=g) for _ in range(cfg.layers)]
            pv = [torch.randn(1, P, cfg.dim, generator=g) for _ in range(cfg.layers)]
            off = P // cfg.tokens_per_frame
            rf, rk, rv = dit(x, torch.full((1, F), 750.0), ctx, torch.tensor([off]), pk,
                             [v + b for v, b in zip(pv, v_bias)])
            rv = [v - b for v, b in zip(rv, v_bias)]
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


# ---------------------------------------------------------------------------------------------
# dit_fused.onnx (the runner's ai.unstep operators): structure, and a numpy run of the contract
# ---------------------------------------------------------------------------------------------

# The ai.unstep operators each fused graph may use: (inputs, outputs).
FUSED_DIT_OPS = {"BiasRmsNormRope": (5, 1), "BiasRmsNorm": (3, 1), "GatedResidualLayerNorm": (6, 2),
                 "QkvNormRopeCache": (9, 1), "BiasGelu": (2, 1), "MatMulBiasGelu": (3, 1), "Attention": (3, 1),
                 "MatMulFp8": (4, 1)}
FUSED_VAE_OPS = {"BiasRmsNorm": (3, 1), "PrefixBiasRmsNorm": (4, 2)}
# The fused VAE's bias-free causal convolutions (exporter 0.12.0): X, W -> Y, channels-last.
FUSED_VAE_CONV = "CausalConv3d"
# Nodes per layer in dit_fused.onnx (exporter 0.7.0): BiasRmsNormRope is no longer used there;
# the self-attention is the runner's Attention (exporter 0.10.0).
FUSED_DIT_PER_LAYER = {"QkvNormRopeCache": 1, "BiasRmsNormRope": 0, "BiasRmsNorm": 1, "GatedResidualLayerNorm": 3,
                       "Attention": 1}
# The FFN's first layer and GELU, one per layer: MatMulBiasGelu (exporter 0.9.0), or a MatMul and a
# BiasGelu where the layer is --svd-rank factors (and in the graphs of 0.7.0 and 0.8.0); in an fp8
# bundle's graph (quantize.py) a MatMulFp8 with gelu = 1 in place of MatMulBiasGelu.
FUSED_DIT_GELU_OPS = ("MatMulBiasGelu", "BiasGelu")
# fp8 (quantize.py): every linear layer of the blocks (a MatMul by a constant, a MatMulBiasGelu) is
# one MatMulFp8(X, W [N, K] uint8, w_scale [N] float32, bias [N]).
FP8_MATMUL = "MatMulFp8"


def _gelu_attr(node) -> int:
    """A MatMulFp8's `gelu` attribute (0 when absent)."""
    return next((a.i for a in node.attribute if a.name == "gelu"), 0)


def _is_gelu_node(node) -> bool:
    """The FFN's GELU: a BiasGelu, a MatMulBiasGelu or a MatMulFp8 with gelu = 1."""
    return node.op_type in FUSED_DIT_GELU_OPS or (node.op_type == FP8_MATMUL and _gelu_attr(node) == 1)


def _io_signature(values):
    return [(v.name, v.type.SerializeToString()) for v in values]


# Ops ONNX shape inference does not know whose (first) output has the type and shape of input 0,
# but for the last axis of QkvNormRopeCache's Q (QKV's divided by 3), MatMulBiasGelu's and
# MatMulFp8's Y (W's rows) and CausalConv3d's Y (frames and channels from W), which `_value_types`
# sets.
_SAME_AS_INPUT0 = {("ai.unstep", op) for op in FUSED_DIT_OPS} | {("ai.unstep", FUSED_VAE_CONV)} | {
    ("com.microsoft", "MultiHeadAttention"), ("com.microsoft", "FastGelu"), ("com.microsoft", "RotaryEmbedding"),
    ("", "SimplifiedLayerNormalization")}


def _dims_of(t):
    """The dimensions of a tensor type (None for an unknown one), or None without a type."""
    if t is None:
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in t.tensor_type.shape.dim]


def _value_types(model) -> dict:
    """name -> (elem_type, dims or None per axis) of every tensor of the graph: ONNX shape
    inference, with the outputs of the ops it does not know typed like their first input."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for _ in range(len(m.graph.node) + 1):
        m = onnx.shape_inference.infer_shapes(m)
        g = m.graph
        types = {v.name: v.type for v in list(g.input) + list(g.output) + list(g.value_info)
                 if v.type.tensor_type.elem_type}
        weights = {t.name: list(t.dims) for t in g.initializer}
        added = 0
        for n in g.node:
            if (n.domain, n.op_type) in _SAME_AS_INPUT0 and n.input[0] in types:
                for o in n.output:
                    if o not in types:
                        v = g.value_info.add()
                        v.name = o
                        v.type.CopyFrom(types[n.input[0]])
                        dims = v.type.tensor_type.shape.dim
                        if n.op_type == FUSED_VAE_CONV and len(dims) == 5:
                            w = weights.get(n.input[1]) or _dims_of(types.get(n.input[1]))
                            if w and len(w) == 5 and None not in w and dims[1].HasField("dim_value"):
                                dims[1].dim_value -= w[1] - 1
                                dims[4].dim_value = w[0]
                            else:
                                dims[1].Clear()
                                dims[4].Clear()
                        if n.op_type in ("QkvNormRopeCache", "MatMulBiasGelu", "MatMulFp8") and dims:
                            last, w = dims[-1], weights.get(n.input[1])
                            if n.op_type in ("MatMulBiasGelu", "MatMulFp8") and w:
                                last.dim_value = w[0]
                            elif n.op_type == "QkvNormRopeCache" and last.HasField("dim_value"):
                                last.dim_value //= 3
                            else:
                                last.Clear()
                        types[o] = v.type
                        added += 1
        if not added:
            break
    info = {}
    for name, t in types.items():
        t = t.tensor_type
        info[name] = (t.elem_type, [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim])
    for t in g.initializer:
        info[t.name] = (t.data_type, list(t.dims))
    return info


class _GraphIndex:
    """Who produces and who reads each value of a graph, and its constants."""

    def __init__(self, graph):
        import collections

        self.producer = {o: n for n in graph.node for o in n.output}
        # value -> [(node, input position)]
        self.consumers = collections.defaultdict(list)
        for n in graph.node:
            for j, i in enumerate(n.input):
                self.consumers[i].append((n, j))
        self.inits = {t.name: t for t in graph.initializer}

    def source(self, v):
        """`v` through Identity nodes (the exporter shares equal initializers that way)."""
        while v in self.producer and self.producer[v].op_type == "Identity":
            v = self.producer[v].input[0]
        return v

    def constant(self, v):
        """The value of an initializer or Constant node (through Identity), or None."""
        from onnx import numpy_helper

        v = self.source(v)
        if v in self.inits:
            return numpy_helper.to_array(self.inits[v])
        n = self.producer.get(v)
        if n is not None and n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
        return None

    def computed_from_constants(self, v, depth: int = 8) -> bool:
        """True when `v` is a constant or every input of the node that computes it is, within
        `depth` nodes (the sums of biases the fused VAE graphs carry: ONNX Runtime folds them
        when it creates the session)."""
        if self.constant(v) is not None:
            return True
        n = self.producer.get(self.source(v))
        if n is None or depth == 0 or not n.input:
            return False
        return all(self.computed_from_constants(i, depth - 1) for i in n.input if i)


def check_fused_structure(fused_path, dit_path, layers: int, heads: int) -> list:
    """dit_fused.onnx against the contract of docs/bundle.md (no ONNX Runtime): per layer one
    QkvNormRopeCache, one BiasRmsNorm, three GatedResidualLayerNorm, one MatMulBiasGelu or BiasGelu
    and no BiasRmsNormRope; no RotaryEmbedding, no SimplifiedLayerNormalization and no FastGelu
    (the context side, with the text embedding's GELU and the context keys' norms, is
    dit_context.onnx beside it); each BiasGelu takes a MatMul's output and its bias has that
    output's width; each MatMulBiasGelu takes a constant [N, D] weight and an [N] bias; exactly one
    LayerNormalization; every ai.unstep node's inputs and outputs of one float type; dit.onnx's x,
    timestep, frame_offset, then `kv_k.{i}`, `kv_v.{i}` typed like dit.onnx's `past_k.{i}`,
    `past_v.{i}` (axis 1 now P + T), then `ctx_k.{i}`, `ctx_v.{i}`, and dit.onnx's `flow` as the
    only output.  The cache inputs of layer i are read by that layer's
    QkvNormRopeCache (K, V, which it writes) and by the ai.unstep Attention that takes its Q, and by
    nothing else (so no Concat of the cache); its QKV is one MatMul by a [D, 3D] constant (or, with
    --svd-rank factors, a Concat of three products), so the graph has dit.onnx's MatMuls less two
    per such layer, one per MatMulBiasGelu and dit_context.onnx's.  An fp8 graph (quantize.py) has
    a MatMulFp8 in place of each of the blocks' MatMuls by a constant (gelu = 0) and of each
    MatMulBiasGelu (gelu = 1), none of either left in the blocks, and no MatMulFp8 outside them;
    W uint8 [N, K], w_scale float32 [N], bias [N]; the counts above hold with a MatMulFp8 counted as
    what it replaces.  Returns the problems (empty when it passes) and prints the node counts."""
    import collections
    import re

    import onnx

    from .fused import UNSTEP_DOMAIN

    problems = []
    std = onnx.load(str(dit_path), load_external_data=False)
    model = onnx.load(str(fused_path), load_external_data=False)
    graph = model.graph
    std_in = {v.name: v.type.SerializeToString() for v in std.graph.input}
    want_in = [(n, std_in.get(n)) for n in ("x", "timestep", "frame_offset")]
    for i in range(layers):
        want_in += [(f"kv_k.{i}", std_in.get(f"past_k.{i}")), (f"kv_v.{i}", std_in.get(f"past_v.{i}"))]
    ctx_names = [n for i in range(layers) for n in (f"ctx_k.{i}", f"ctx_v.{i}")]
    got_in = _io_signature(graph.input)
    if got_in[: len(want_in)] != want_in or [n for n, _ in got_in[len(want_in):]] != ctx_names:
        problems.append(f"inputs {[v.name for v in graph.input]}: expected {[n for n, _ in want_in] + ctx_names}, "
                        f"the first typed like dit.onnx's x, timestep, frame_offset, past_k.i, past_v.i")
    if _io_signature(graph.output) != _io_signature(std.graph.output)[:1]:
        problems.append(f"outputs {[v.name for v in graph.output]}: expected dit.onnx's flow only")
    opsets = {o.domain: o.version for o in model.opset_import}
    if opsets.get(UNSTEP_DOMAIN) != 1:
        problems.append(f"opset_import {UNSTEP_DOMAIN} is {opsets.get(UNSTEP_DOMAIN)}, not 1")

    counts = collections.Counter((n.domain or "ai.onnx", n.op_type) for n in graph.node)
    std_counts = collections.Counter((n.domain or "ai.onnx", n.op_type) for n in std.graph.node)
    print(f"{Path(fused_path).name} nodes: " + ", ".join(
        f"{d}::{t} {c}" for (d, t), c in sorted(counts.items()) if t not in ("Constant", "Identity")))
    for op, per_layer in FUSED_DIT_PER_LAYER.items():
        nodes = [n for n in graph.node if n.domain == UNSTEP_DOMAIN and n.op_type == op]
        if len(nodes) != per_layer * layers:
            problems.append(f"{op}: {len(nodes)} nodes, expected {per_layer} per layer x {layers}")
        by_layer = collections.Counter(m.group(1) for n in nodes if (m := re.search(r"/blocks\.(\d+)/", n.name)))
        if by_layer and any(by_layer.get(str(i), 0) != per_layer for i in range(layers)):
            problems.append(f"{op} per layer (by node scope): {dict(sorted(by_layer.items()))}, expected {per_layer}")
    gelu_by_layer = collections.Counter(
        m.group(1) for n in graph.node if n.domain == UNSTEP_DOMAIN and _is_gelu_node(n)
        and (m := re.search(r"/blocks\.(\d+)/", n.name)))
    if any(gelu_by_layer.get(str(i), 0) != 1 for i in range(layers)):
        problems.append(f"{' or '.join(FUSED_DIT_GELU_OPS)} (or {FP8_MATMUL} with gelu 1) per layer (by node scope): "
                        f"{dict(sorted(gelu_by_layer.items()))}, expected 1 in each of {layers} layers")
    others = {n.op_type for n in graph.node if n.domain == UNSTEP_DOMAIN} - set(FUSED_DIT_OPS)
    if others:
        problems.append(f"unknown {UNSTEP_DOMAIN} ops: {sorted(others)}")
    if counts[("com.microsoft", "RotaryEmbedding")]:
        problems.append("com.microsoft.RotaryEmbedding left in the graph")
    if counts[("ai.onnx", "LayerNormalization")] != 1:
        problems.append(f"{counts[('ai.onnx', 'LayerNormalization')]} LayerNormalization nodes, expected 1 (layer 0)")

    # dit.onnx's FastGelu are the FFNs' (BiasGelu or MatMulBiasGelu here) and the text embedding's
    # (in dit_context.onnx now): none is left.
    if counts[("com.microsoft", "FastGelu")]:
        problems.append(f"FastGelu: {counts[('com.microsoft', 'FastGelu')]} nodes, expected none (the FFNs' are "
                        f"MatMulBiasGelu or BiasGelu, the text embedding's is in dit_context.onnx)")
    for n in graph.node:
        if n.op_type == "SimplifiedLayerNormalization":
            problems.append(f"{n.name}: SimplifiedLayerNormalization left (the context keys' norms are in "
                            f"dit_context.onnx)")

    # The cache inputs: written by QkvNormRopeCache, then read by the attention that takes its Q.
    index = _GraphIndex(graph)
    producer, consumers = index.producer, index.consumers
    position = {id(n): j for j, n in enumerate(graph.node)}

    def const_shape(v):
        c = index.constant(v)
        return None if c is None else list(c.shape)

    plain_qkv = 0
    for i in range(layers):
        kv = (f"kv_k.{i}", f"kv_v.{i}")
        caches = [n for n in graph.node if n.domain == UNSTEP_DOMAIN and n.op_type == "QkvNormRopeCache"
                  and list(n.input[7:9]) == list(kv)]
        if len(caches) != 1:
            problems.append(f"layer {i}: {len(caches)} QkvNormRopeCache nodes write {kv[0]}, {kv[1]}, expected 1")
            continue
        node = caches[0]
        if not re.search(rf"/blocks\.{i}/", node.name):
            problems.append(f"{node.name} writes layer {i}'s cache")
        qkv = producer.get(node.input[0])
        if qkv is not None and qkv.op_type == "MatMul":
            w = const_shape(qkv.input[1])
            if w is None or len(w) != 2 or w[1] != 3 * w[0]:
                problems.append(f"{node.name}: QKV is a MatMul by {qkv.input[1]} of shape {w}, expected [D, 3D]")
            else:
                plain_qkv += 1
        elif qkv is not None and qkv.op_type == FP8_MATMUL:
            w = const_shape(qkv.input[1])
            if w is None or len(w) != 2 or w[0] != 3 * w[1]:
                problems.append(f"{node.name}: QKV is a {FP8_MATMUL} by {qkv.input[1]} of shape {w}, expected [3D, D]")
            else:
                plain_qkv += 1
        elif qkv is None or qkv.op_type != "Concat":
            problems.append(f"{node.name}: QKV comes from {qkv.op_type if qkv else 'no node'}, expected one MatMul")
        attn = [n for n, j in consumers[node.output[0]]
                if n.domain == UNSTEP_DOMAIN and n.op_type == "Attention" and j == 0]
        if len(attn) != 1 or list(attn[0].input[1:]) != list(kv):
            problems.append(f"{node.name}: Q does not go to one {UNSTEP_DOMAIN} Attention(Q, {kv[0]}, {kv[1]})")
            continue
        for j, name in enumerate(kv):
            readers = sorted((n.name, k) for n, k in consumers[name])
            want = sorted([(node.name, 7 + j), (attn[0].name, 1 + j)])
            if readers != want:
                problems.append(f"{name} is read by {readers}, expected only {want}")
        if position[id(attn[0])] < position[id(node)]:
            problems.append(f"{attn[0].name} comes before {node.name}")
    fp8 = [n for n in graph.node if n.domain == UNSTEP_DOMAIN and n.op_type == FP8_MATMUL]
    fp8_gelu = sum(_gelu_attr(n) == 1 for n in fp8)
    whole_ffn = counts[(UNSTEP_DOMAIN, "MatMulBiasGelu")] + fp8_gelu
    if fp8:
        # All of the blocks' linear layers or none: a MatMul by a constant or a MatMulBiasGelu left
        # in the blocks is a layer the rewrite missed.
        for n in graph.node:
            block = n.name.startswith("/dit/blocks.")
            if n.op_type == FP8_MATMUL and not block:
                problems.append(f"{n.name}: {FP8_MATMUL} outside the DiT's blocks")
            elif block and (n.op_type == "MatMulBiasGelu" or (n.op_type == "MatMul" and (
                    (c := const_shape(n.input[1])) is not None and len(c) == 2))):
                problems.append(f"{n.name}: {n.op_type} by a constant left in an fp8 graph (expected {FP8_MATMUL})")
    # The context side (the text embedding, each layer's context keys and values) is in
    # dit_context.onnx beside it.
    context_graph = onnx.load(str(Path(fused_path).with_name("dit_context.onnx")), load_external_data=False)
    context_mm = sum(1 for n in context_graph.graph.node if n.op_type == "MatMul")
    if context_mm < 2 * layers + 2:
        problems.append(f"dit_context.onnx: {context_mm} MatMul nodes, expected at least {2 * layers + 2} (the "
                        f"text embedding's 2, each layer's context keys and values; --svd-rank factors have two)")
    want_mm = std_counts[("ai.onnx", "MatMul")] - 2 * plain_qkv - whole_ffn - context_mm
    got_mm = counts[("ai.onnx", "MatMul")] + len(fp8) - fp8_gelu
    if got_mm != want_mm:
        plus = f" and {len(fp8) - fp8_gelu} {FP8_MATMUL} with gelu 0" if fp8 else ""
        problems.append(f"MatMul: {counts[('ai.onnx', 'MatMul')]} nodes{plus}, expected {want_mm} in all (dit.onnx's "
                        f"{std_counts[('ai.onnx', 'MatMul')]} less 2 for each of {plain_qkv} fused q|k|v projections, "
                        f"1 for each of {whole_ffn} MatMulBiasGelu (or {FP8_MATMUL} with gelu 1) and "
                        f"dit_context.onnx's {context_mm})")

    # Element types and shapes of the ai.unstep nodes' operands.
    info = _value_types(model)
    float_type = info["flow"][0]
    dim = info["kv_k.0"][1][-1] if "kv_k.0" in info else None
    for n in graph.node:
        if n.domain != UNSTEP_DOMAIN or n.op_type not in FUSED_DIT_OPS:
            continue
        n_in, n_out = FUSED_DIT_OPS[n.op_type]
        if len(n.input) != n_in or len(n.output) != n_out:
            problems.append(f"{n.name}: {len(n.input)} inputs / {len(n.output)} outputs, expected {n_in} / {n_out}")
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == FP8_MATMUL:
            problems += _check_fp8_node(n, attrs, info, const_shape, float_type)
            continue
        rope = n.op_type in ("BiasRmsNormRope", "QkvNormRopeCache")
        gelu = n.op_type in FUSED_DIT_GELU_OPS
        attention = n.op_type == "Attention"
        no_epsilon = gelu or attention
        want = (set() if no_epsilon else {"epsilon"}) | ({"num_heads"} if rope or attention else set())
        if set(attrs) != want or not (no_epsilon or isinstance(attrs.get("epsilon"), float)):
            problems.append(f"{n.name}: attributes {attrs}, expected {sorted(want)}")
        if (rope or attention) and attrs.get("num_heads") != heads:
            problems.append(f"{n.name}: num_heads {attrs.get('num_heads')}, expected {heads}")
        for name in list(n.input) + list(n.output):
            elem = info.get(name, (None, None))[0]
            if elem != float_type:
                problems.append(f"{n.name}: {name} has element type {elem}, the graph's is {float_type}")
        if attention:
            # Q [..., S, D] (QkvNormRopeCache's), K and V the layer's cache [..., L, D]; O Q's shape.
            shapes = [info.get(name, (None, None))[1] for name in list(n.input) + list(n.output)]
            if any(shape is None or len(shape) < 2 or shape[-1] != dim for shape in shapes):
                problems.append(f"{n.name}: Q, K, V, O have shapes {shapes}, expected [..., {dim}] each")
            continue
        if n.op_type == "MatMulBiasGelu":
            # W a constant [N, D] (the FFN's first layer's weight, out x in), bias [N], Y [..., N].
            w = const_shape(n.input[1])
            if w is None or len(w) != 2 or w[1] != dim:
                problems.append(f"{n.name}: W {n.input[1]} has shape {w}, expected a constant [N, {dim}]")
                continue
            shape = info.get(n.input[2], (None, None))[1]
            if shape != [w[0]]:
                problems.append(f"{n.name}: {n.input[2]} has shape {shape}, expected [{w[0]}] (W's rows)")
            y_shape = info.get(n.output[0], (None, None))[1]
            x_shape = info.get(n.input[0], (None, None))[1]
            if y_shape and x_shape and y_shape != x_shape[:-1] + [w[0]]:
                problems.append(f"{n.name}: Y has shape {y_shape}, expected X's {x_shape} with the last axis {w[0]}")
            continue
        if n.op_type == "BiasGelu":
            # X is the FFN's first (bias-free) product, a MatMul (a MatMulFp8 with gelu = 0 in an fp8
            # graph); bias [W] for X [..., W].
            mm = producer.get(n.input[0])
            if mm is None or mm.op_type not in ("MatMul", FP8_MATMUL):
                problems.append(f"{n.name}: X comes from {mm.op_type if mm else 'no node'}, expected a MatMul")
            w = const_shape(mm.input[1]) if mm is not None and mm.op_type in ("MatMul", FP8_MATMUL) else None
            w_width = (w[0] if mm.op_type == FP8_MATMUL else w[-1]) if w else None
            width = (info.get(n.input[0], (None, None))[1] or [None])[-1] or w_width
            shape = info.get(n.input[1], (None, None))[1]
            if shape is None or width is None or shape != [width]:
                problems.append(f"{n.name}: {n.input[1]} has shape {shape}, expected [{width}] (X's last axis)")
            y_shape = info.get(n.output[0], (None, None))[1]
            x_shape = info.get(n.input[0], (None, None))[1]
            if y_shape and x_shape and y_shape != x_shape:
                problems.append(f"{n.name}: Y has shape {y_shape}, X {x_shape}")
            continue
        if n.op_type == "GatedResidualLayerNorm":
            weights = [n.input[2]]
        elif n.op_type == "QkvNormRopeCache":
            weights = list(n.input[1:5])
            # (shape inference may leave QKV's shape unknown, []: the MatMul's weight is checked above)
            qkv_shape = info.get(n.input[0], (None, None))[1] or None
            q_shape = info.get(n.output[0], (None, None))[1] or None
            if qkv_shape is not None and (len(qkv_shape) < 2 or qkv_shape[-1] != 3 * dim):
                problems.append(f"{n.name}: QKV has shape {qkv_shape}, expected [..., T, {3 * dim}]")
            elif q_shape is not None and (q_shape[-1] != dim or (qkv_shape and q_shape != qkv_shape[:-1] + [dim])):
                problems.append(f"{n.name}: Q has shape {q_shape}, expected QKV's {qkv_shape} with the last axis {dim}")
            for c in n.input[7:9]:
                shape = info.get(c, (None, None))[1]
                if shape is None or len(shape) < 2 or shape[-1] != dim:
                    problems.append(f"{n.name}: {c} has shape {shape}, expected [..., L, {dim}]")
        else:
            weights = list(n.input[1:3])
        for name in weights:
            shape = info.get(name, (None, None))[1]
            if shape is not None and shape != [dim]:
                problems.append(f"{n.name}: {name} has shape {shape}, expected [{dim}]")
    return problems


def _check_fp8_node(n, attrs: dict, info: dict, const_shape, float_type) -> list:
    """One MatMulFp8 of dit_fused.onnx: attribute gelu 0 or 1, W a constant uint8 [N, K] with K X's
    last axis, w_scale a constant float32 [N], X, bias and Y of the graph's float type, bias [N],
    Y X's shape with N last."""
    from onnx import TensorProto

    problems = []
    if set(attrs) != {"gelu"} or attrs["gelu"] not in (0, 1):
        problems.append(f"{n.name}: attributes {attrs}, expected gelu 0 or 1")
    x, w, scale, bias = n.input
    for name, want in ((x, float_type), (w, TensorProto.UINT8), (scale, TensorProto.FLOAT), (bias, float_type),
                       (n.output[0], float_type)):
        elem = info.get(name, (None, None))[0]
        if elem != want:
            problems.append(f"{n.name}: {name} has element type {elem}, expected {want}")
    w_shape, x_shape = const_shape(w), info.get(x, (None, None))[1]
    if w_shape is None or len(w_shape) != 2 or (x_shape and x_shape[-1] is not None and x_shape[-1] != w_shape[1]):
        problems.append(f"{n.name}: W {w} has shape {w_shape}, expected a constant [N, K] with K X's last axis "
                        f"({x_shape})")
        return problems
    if const_shape(scale) != [w_shape[0]]:
        problems.append(f"{n.name}: w_scale {scale} has shape {const_shape(scale)}, expected a constant [{w_shape[0]}]")
    b_shape = info.get(bias, (None, None))[1]
    if b_shape != [w_shape[0]]:
        problems.append(f"{n.name}: {bias} has shape {b_shape}, expected [{w_shape[0]}] (W's rows)")
    y_shape = info.get(n.output[0], (None, None))[1]
    if y_shape and x_shape and y_shape != x_shape[:-1] + [w_shape[0]]:
        problems.append(f"{n.name}: Y has shape {y_shape}, expected X's {x_shape} with the last axis {w_shape[0]}")
    return problems


def _unstep_reference_ops():
    """numpy implementations of docs/bundle.md's operators (ai.unstep and the ONNX Runtime ops the
    DiT graphs use) for onnx.reference: float32 arithmetic, one rounding to T per output.  Written
    from the contract, independently of fused.py."""
    from onnx.reference.op_run import OpRun

    def rows(p, n, d):
        f = p.size // d
        assert f * d == p.size and n % f == 0, (p.shape, n, d)
        return np.repeat(p.astype(np.float32).reshape(f, d), n // f, axis=0)

    def rms(v, eps):
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + np.float32(eps))

    def bias_rms_norm_rope(x, bias, weight, cos, sin, epsilon, num_heads):
        """BiasRmsNormRope of the rows x [N, D], float32 [N, D] (not rounded)."""
        n, d = x.shape
        half = d // num_heads // 2
        u = rms(x.astype(np.float32) + bias.astype(np.float32).reshape(d), epsilon)
        u = u * weight.astype(np.float32).reshape(d)
        t = np.arange(n) % (cos.size // half)
        j = np.arange(d // 2) % half
        c = cos.astype(np.float32).reshape(-1, half)[t][:, j]  # [N, D/2]: pair i of row r
        s = sin.astype(np.float32).reshape(-1, half)[t][:, j]
        a, b = u[:, 0::2], u[:, 1::2]
        y = np.empty_like(u)
        y[:, 0::2] = a * c - b * s
        y[:, 1::2] = a * s + b * c
        return y

    class BiasRmsNormRope(OpRun):
        op_domain = "ai.unstep"

        def _run(self, x, bias, weight, cos, sin, epsilon=None, num_heads=None):
            d = x.shape[-1]
            y = bias_rms_norm_rope(x.reshape(-1, d), bias, weight, cos, sin, epsilon, num_heads)
            return (y.reshape(x.shape).astype(x.dtype),)

    class QkvNormRopeCache(OpRun):
        """Writes K and V in place, into the arrays it is given (onnx.reference passes the feed
        arrays through; `written` keeps each node's K and V so that the caller can check that)."""

        op_domain = "ai.unstep"
        written = []

        def _run(self, qkv, q_bias, k_bias, q_weight, k_weight, cos, sin, k, v, epsilon=None, num_heads=None):
            d = qkv.shape[-1] // 3
            t = qkv.shape[-2]
            n = qkv.size // (3 * d)
            b, big = n // t, k.shape[-2]
            assert qkv.shape[-1] == 3 * d and k.shape == v.shape and k.shape[-1] == d, (qkv.shape, k.shape, v.shape)
            assert big >= t and k.size == b * big * d, (qkv.shape, k.shape)
            rows = qkv.reshape(n, 3 * d)
            q = bias_rms_norm_rope(rows[:, :d], q_bias, q_weight, cos, sin, epsilon, num_heads)
            kn = bias_rms_norm_rope(rows[:, d:2 * d], k_bias, k_weight, cos, sin, epsilon, num_heads)
            kc, vc = k.reshape(b, big, d), v.reshape(b, big, d)
            assert np.shares_memory(kc, k) and np.shares_memory(vc, v), "K/V must be writable in place"
            kc[:, big - t:] = kn.reshape(b, t, d).astype(k.dtype)
            vc[:, big - t:] = rows[:, 2 * d:].reshape(b, t, d).astype(v.dtype)  # copied as is
            QkvNormRopeCache.written.append((k, v))
            return (q.reshape(qkv.shape[:-1] + (d,)).astype(qkv.dtype),)

    class BiasRmsNorm(OpRun):
        op_domain = "ai.unstep"

        def _run(self, x, bias, weight, epsilon=None, silu=None):
            d = x.shape[-1]
            y = rms(x.astype(np.float32).reshape(-1, d) + bias.astype(np.float32), epsilon) * weight.astype(np.float32)
            if silu:  # n * sigmoid(n), still float32, before the one rounding
                y = y / (np.float32(1) + np.exp(-y))
            return (y.reshape(x.shape).astype(x.dtype),)

    class PrefixBiasRmsNorm(OpRun):
        op_domain = "ai.unstep"

        def _run(self, x, bias, weight, prefix, epsilon=None, silu=None):
            assert x.ndim >= 2 and x.shape[0] == 1 and prefix.shape[:1] + prefix.shape[2:] == x.shape[:1] + x.shape[2:], \
                (x.shape, prefix.shape)
            (y,) = BiasRmsNorm._run(self, x, bias, weight, epsilon, silu)
            y = np.concatenate([prefix.astype(x.dtype), y], axis=1)
            return y, np.ascontiguousarray(y[:, y.shape[1] - prefix.shape[1]:])

    class GatedResidualLayerNorm(OpRun):
        op_domain = "ai.unstep"

        def _run(self, r, x, bias, gate, scale, shift, epsilon=None):
            d = x.shape[-1]
            n = x.size // d
            branch = x.astype(np.float32).reshape(n, d) + bias.astype(np.float32)
            s = r.astype(np.float32).reshape(n, d) + branch * rows(gate, n, d)
            s = s.astype(r.dtype)
            sf = s.astype(np.float32)
            mu = sf.mean(axis=-1, keepdims=True)
            var = ((sf - mu) ** 2).mean(axis=-1, keepdims=True)
            y = (sf - mu) / np.sqrt(var + np.float32(epsilon)) * rows(scale, n, d) + rows(shift, n, d)
            return s.reshape(r.shape), y.reshape(r.shape).astype(r.dtype)

    class BiasGelu(OpRun):
        op_domain = "ai.unstep"

        def _run(self, x, bias):
            d = x.shape[-1]
            v = x.astype(np.float32).reshape(-1, d) + bias.astype(np.float32).reshape(d)
            c = np.float32(np.sqrt(2.0 / np.pi))
            y = np.float32(0.5) * v * (np.float32(1) + np.tanh(c * (v + np.float32(0.044715) * v * v * v)))
            return (y.reshape(x.shape).astype(x.dtype),)

    class MatMulFp8(OpRun):
        """quantize.matmul_fp8: E4M3 weights and per-row E4M3 activations (docs/bundle.md)."""

        op_domain = "ai.unstep"

        def _run(self, x, w, w_scale, bias, gelu=None):
            return (matmul_fp8(x, w, w_scale, bias, gelu or 0),)

    class MatMulBiasGelu(OpRun):
        op_domain = "ai.unstep"

        def _run(self, x, w, bias):
            v = x.astype(np.float32) @ w.astype(np.float32).T + bias.astype(np.float32)
            c = np.float32(np.sqrt(2.0 / np.pi))
            y = np.float32(0.5) * v * (np.float32(1) + np.tanh(c * (v + np.float32(0.044715) * v * v * v)))
            return (y.astype(x.dtype),)

    def attention(q, k, v, num_heads):
        """Softmax attention of [B, S, D] rows over [B, L, D] keys and values, per head, float32,
        rounded once."""
        b, sq, d = q.shape
        hd = d // num_heads
        qh = q.astype(np.float32).reshape(b, sq, num_heads, hd).transpose(0, 2, 1, 3)
        kh = k.astype(np.float32).reshape(b, -1, num_heads, hd).transpose(0, 2, 1, 3)
        vh = v.astype(np.float32).reshape(b, -1, num_heads, hd).transpose(0, 2, 1, 3)
        a = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(np.float32(hd))
        a = np.exp(a - a.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        return (a @ vh).transpose(0, 2, 1, 3).reshape(b, sq, d).astype(q.dtype)

    class Attention(OpRun):
        op_domain = "ai.unstep"

        # onnx.reference also fills in the attributes of ONNX's own Attention (same name, default
        # domain) with their defaults: only num_heads is this operator's.
        def _run(self, q, k, v, num_heads=None, **_):
            return (attention(q, k, v, num_heads),)

    class MultiHeadAttention(OpRun):
        op_domain = "com.microsoft"

        def _run(self, q, k, v, num_heads=None):
            return (attention(q, k, v, num_heads),)

    class FastGelu(OpRun):
        op_domain = "com.microsoft"

        def _run(self, x, bias=None):
            y = x.astype(np.float32) + (0 if bias is None else bias.astype(np.float32))
            y = 0.5 * y * (1 + np.tanh(np.float32(0.7978845608028654) * (y + np.float32(0.044715) * y ** 3)))
            return (y.astype(x.dtype),)

    class SimplifiedLayerNormalization(OpRun):
        op_domain = ""

        def _run(self, x, scale, axis=None, epsilon=None, stash_type=None):
            assert axis in (-1, x.ndim - 1)
            return ((rms(x.astype(np.float32), epsilon) * scale.astype(np.float32)).astype(x.dtype),)

    class CausalConv3d(OpRun):
        op_domain = "ai.unstep"

        def _run(self, x, w):
            """X [N, T, H, W, C], W [K, kT, kH, kW, C] -> [N, T - kT + 1, H, W, K]: zeros around
            the frame in space (kH // 2, kW // 2), none in time; float32 sums, rounded once."""
            _, kt, kh, kw, _ = w.shape
            n, t, h, wd, c = x.shape
            xp = np.pad(x.astype(np.float32), ((0, 0), (0, 0), (kh // 2,) * 2, (kw // 2,) * 2, (0, 0)))
            wf = w.astype(np.float32)
            y = np.zeros((n, t - kt + 1, h, wd, w.shape[0]), np.float32)
            for a in range(kt):
                for b in range(kh):
                    for d in range(kw):
                        y += xp[:, a : a + t - kt + 1, b : b + h, d : d + wd, :] @ wf[:, a, b, d, :].T
            return (y.astype(x.dtype),)

    return [BiasRmsNormRope, QkvNormRopeCache, BiasRmsNorm, PrefixBiasRmsNorm, GatedResidualLayerNorm, BiasGelu,
            MatMulBiasGelu, MatMulFp8, Attention, CausalConv3d,
            MultiHeadAttention, FastGelu, SimplifiedLayerNormalization]


def prefix_norm_count(role: str, pairs: int) -> int:
    """The `PrefixBiasRmsNorm` nodes of a fused VAE graph: every norm + SiLU pair feeds a causal
    convolution, which has a cache in `vae_step` and none in `vae_first`."""
    return pairs if role == "vae_step" else 0


def check_fused_vae_structure(fused_path, std_path, pairs: int, conv_fed: int, carried: int, prefixed: int) -> list:
    """vae_first_fused / vae_step_fused against the standard graph of the same role and the
    contract of docs/bundle.md (no ONNX Runtime): `pairs` RMS norm + SiLU pairs (vae.py
    `norm_silu_pairs`), each one `ai.unstep::BiasRmsNorm` with silu = 1 and epsilon 1e-12 on a
    channels-last Transpose or an upsampling's channels-last Reshape (`PrefixBiasRmsNorm` where a
    cache goes in front: `prefixed` of them, each in place of a Concat), and no SimplifiedLayerNormalization, Sigmoid or Sigmoid-Mul (SiLU)
    left for them; `conv_fed` of them take their input straight from a causal convolution that has
    no bias input (the op adds it), the others a constant bias (zeros, or the biases the
    upsampling stages carry); `carried` more convolutions without a bias (vae.py
    `carried_bias_convs`); every other op as in the standard graph; inputs and outputs identical.
    Returns the problems and prints the node counts."""
    import collections

    import onnx

    from .fused import UNSTEP_DOMAIN

    problems = []
    std = onnx.load(str(std_path), load_external_data=False)
    model = onnx.load(str(fused_path), load_external_data=True)
    graph = model.graph
    name = Path(fused_path).name
    if _io_signature(graph.input) != _io_signature(std.graph.input):
        problems.append(f"inputs differ from {Path(std_path).name}")
    if _io_signature(graph.output) != _io_signature(std.graph.output):
        problems.append(f"outputs differ from {Path(std_path).name}")
    opsets = {o.domain: o.version for o in model.opset_import}
    if opsets.get(UNSTEP_DOMAIN) != 1:
        problems.append(f"opset_import {UNSTEP_DOMAIN} is {opsets.get(UNSTEP_DOMAIN)}, not 1")

    def count(g):
        return collections.Counter((n.domain or "ai.onnx", n.op_type) for n in g.node)

    def silu_patterns(g):  # Sigmoid(a) feeding a Mul that also reads a
        sig = {n.output[0]: n.input[0] for n in g.node if n.op_type == "Sigmoid"}
        return sum(1 for n in g.node if n.op_type == "Mul" and len(n.input) == 2
                   and any(sig.get(a) == b for a, b in (n.input, n.input[::-1])))

    def no_bias_convs(g):
        return sum(1 for n in g.node if n.op_type == "Conv" and (len(n.input) < 3 or not n.input[2]))

    counts, std_counts = count(graph), count(std.graph)
    print(f"{name} nodes: " + ", ".join(
        f"{d}::{t} {c}" for (d, t), c in sorted(counts.items()) if t not in ("Constant", "Identity")))
    kinds = tuple(FUSED_VAE_OPS)
    norms = [n for n in graph.node if n.domain == UNSTEP_DOMAIN and n.op_type in kinds]
    convs = [n for n in graph.node if n.domain == UNSTEP_DOMAIN and n.op_type == FUSED_VAE_CONV]
    others = sorted({n.op_type for n in graph.node if n.domain == UNSTEP_DOMAIN} - set(kinds) - {FUSED_VAE_CONV})
    if others:
        problems.append(f"{UNSTEP_DOMAIN} ops other than {', '.join(kinds)} and {FUSED_VAE_CONV}: {others}")
    if len(norms) != pairs:
        problems.append(f"BiasRmsNorm + PrefixBiasRmsNorm: {len(norms)} nodes, expected {pairs} (one per norm + "
                        "SiLU pair)")
    with_prefix = sum(n.op_type == "PrefixBiasRmsNorm" for n in norms)
    if with_prefix != prefixed:
        problems.append(f"PrefixBiasRmsNorm: {with_prefix} nodes, expected {prefixed}")
    if silu_patterns(std.graph) != pairs:
        problems.append(f"the standard graph has {silu_patterns(std.graph)} SiLU patterns, the model {pairs} pairs")
    if silu_patterns(graph):
        problems.append(f"{silu_patterns(graph)} Sigmoid-Mul (SiLU) patterns left")
    for op, fewer in (("SimplifiedLayerNormalization", pairs), ("Sigmoid", pairs), ("Conv", len(convs))):
        want = std_counts[("ai.onnx", op)] - fewer
        if counts[("ai.onnx", op)] != want:
            problems.append(f"{op}: {counts[('ai.onnx', op)]} nodes, expected {want} (the standard graph's "
                            f"{std_counts[('ai.onnx', op)]} less {fewer})")

    def cache_concats(g):  # Concats of a cache input (the graph's) with new frames
        inputs = {i.name for i in g.input}
        return sum(1 for n in g.node if n.op_type == "Concat" and any(i in inputs for i in n.input))

    if cache_concats(graph) != cache_concats(std.graph) - prefixed:
        problems.append(f"{cache_concats(graph)} Concats of a cache input, expected {cache_concats(std.graph)} less "
                        f"{prefixed} (the PrefixBiasRmsNorm nodes)")
    if no_bias_convs(graph) + len(convs) != no_bias_convs(std.graph) + conv_fed + carried:
        problems.append(f"{no_bias_convs(graph)} convolutions without bias and {len(convs)} {FUSED_VAE_CONV}, "
                        f"expected {no_bias_convs(std.graph)} + {conv_fed} + {carried} carried in all")
    for n in graph.node:
        kernel = next((a.ints for a in n.attribute if a.name == "kernel_shape"), [])
        if n.op_type == "Conv" and len(kernel) == 3 and not (len(n.input) >= 3 and n.input[2]):
            problems.append(f"{n.name}: a 3D convolution without bias left as Conv, not {FUSED_VAE_CONV}")
    for n in convs:
        if len(n.input) != 2 or len(n.output) != 1:
            problems.append(f"{n.name}: {len(n.input)} inputs / {len(n.output)} outputs, expected 2 / 1")

    index = _GraphIndex(graph)
    producer, consumers = index.producer, index.consumers

    info = _value_types(model)
    float_type = info["frames"][0]
    eps = float(np.float32(1e-12))
    fed = 0
    for n in norms:
        n_inputs, n_outputs = FUSED_VAE_OPS[n.op_type]
        if len(n.input) != n_inputs or len(n.output) != n_outputs:
            problems.append(f"{n.name}: {len(n.input)} inputs / {len(n.output)} outputs, expected {n_inputs} / "
                            f"{n_outputs}")
            continue
        if n_outputs == 2 and n.output[1] not in {o.name for o in graph.output}:
            problems.append(f"{n.name}: its tail is not a graph output (a cache)")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if attrs != {"epsilon": eps, "silu": 1}:
            problems.append(f"{n.name}: attributes {attrs}, expected epsilon 1e-12 (as float32) and silu 1")
        for v in list(n.input) + list(n.output):
            elem = info.get(v, (None, None))[0]
            if elem != float_type:
                problems.append(f"{n.name}: {v} has element type {elem}, the graph's is {float_type}")
        c = info.get(n.input[0], (None, None))[1]
        c = c[-1] if c else None
        for v in n.input[1:3]:
            shape = info.get(v, (None, None))[1]
            if shape is not None and c is not None and shape != [c]:
                problems.append(f"{n.name}: {v} has shape {shape}, expected [{c}]")
        perm = producer.get(n.input[0])
        # A channels-last Transpose, the Reshape that ends an upsampling stage's channels-last
        # interleave (vae.py Resample), whose output is already channels-last, or a CausalConv3d
        # (channels-last itself).
        if perm is None or perm.op_type not in ("Transpose", "Reshape", FUSED_VAE_CONV):
            problems.append(f"{n.name}: X does not come from a (channels-last) Transpose, an upsampling's Reshape "
                            f"or a {FUSED_VAE_CONV}")
            continue
        if perm.op_type == FUSED_VAE_CONV:
            conv, only = perm, len(consumers[n.input[0]]) == 1
        else:
            conv = producer.get(perm.input[0]) if perm.op_type == "Transpose" else None
            only = len(consumers[perm.input[0]]) == 1 and len(consumers[n.input[0]]) == 1
        if conv is not None and conv.op_type in ("Conv", FUSED_VAE_CONV) and only:
            # The convolution's output feeds this norm alone: its bias belongs in the op.
            if len(conv.input) >= 3 and conv.input[2]:
                problems.append(f"{n.name}: the convolution {conv.name} before it keeps its bias")
            else:
                fed += 1
        else:
            if not index.computed_from_constants(n.input[1]):
                problems.append(f"{n.name}: bias is not computed from constants (its input is not a convolution's)")
    if fed != conv_fed:
        problems.append(f"{fed} BiasRmsNorm take a bias-free convolution's output, expected {conv_fed}")
    return problems


def run_fused_reference(path, feed: dict):
    """Run a fused graph (dit_fused.onnx, vae_*_fused.onnx) in onnx.reference with the numpy
    operators above (no ONNX Runtime)."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(str(path), new_ops=_unstep_reference_ops()).run(None, feed)


def run_fused_dit(path, feed: dict, tokens: int):
    """dit_fused.onnx in onnx.reference (numpy operators) on the inputs of a dit.onnx run:
    `kv_k.{i}` = concat(past_k.{i}, zeros[T]), likewise `kv_v.{i}`, and `ctx_k.{i}`, `ctx_v.{i}`
    from dit_context.onnx (beside it) on `context`.  Returns (flow, new_k, new_v,
    problems): new_k/new_v are the last T rows of the cache arrays after the run (what the
    QkvNormRopeCache nodes wrote in place), problems says where the writes did not reach the fed
    arrays or touched the past rows."""
    from onnx.reference import ReferenceEvaluator

    layers = sum(1 for k in feed if k.startswith("past_k."))
    fused_feed = {k: v for k, v in feed.items() if not k.startswith("past_") and k != "context"}
    # The context's keys and values, from dit_context.onnx beside it (onnx.reference as well).
    context_graph = Path(path).with_name("dit_context.onnx")
    ctx = ReferenceEvaluator(str(context_graph), new_ops=_unstep_reference_ops()).run(None, {"context": feed["context"]})
    for i in range(layers):
        fused_feed[f"ctx_k.{i}"], fused_feed[f"ctx_v.{i}"] = ctx[2 * i], ctx[2 * i + 1]
    for i in range(layers):
        for kind in "kv":
            p = feed[f"past_{kind}.{i}"]
            zeros = np.zeros(p.shape[:-2] + (tokens, p.shape[-1]), p.dtype)
            fused_feed[f"kv_{kind}.{i}"] = np.ascontiguousarray(np.concatenate([p, zeros], axis=-2))
    ops = _unstep_reference_ops()
    cache_op = next(op for op in ops if op.__name__ == "QkvNormRopeCache")
    (flow,) = ReferenceEvaluator(str(path), new_ops=ops).run(None, fused_feed)
    problems = []
    written = cache_op.written
    caches = [(fused_feed[f"kv_k.{i}"], fused_feed[f"kv_v.{i}"]) for i in range(layers)]
    if len(written) != layers or any(wk is not k or wv is not v for (wk, wv), (k, v) in zip(written, caches)):
        problems.append("the QkvNormRopeCache nodes did not write into the fed kv_k/kv_v arrays "
                        f"({len(written)} writes for {layers} layers)")
    for i, (k, v) in enumerate(caches):
        for kind, c in (("k", k), ("v", v)):
            if not np.array_equal(c[..., : c.shape[-2] - tokens, :], feed[f"past_{kind}.{i}"]):
                problems.append(f"kv_{kind}.{i}: rows before L - T were changed")
    return flow, [k[..., -tokens:, :] for k, _ in caches], [v[..., -tokens:, :] for _, v in caches], problems


def report_vae_graphs(label, bundle: Path, z, report):
    """vae_first_fused then vae_step_fused of `bundle` in onnx.reference (numpy operators) against
    vae_first / vae_step in onnxruntime (CPU), fp32, all outputs; the step is fed the caches of
    onnxruntime's vae_first."""
    import onnxruntime as ort

    def ort_run(path, feed):
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)

    def flat(rs):
        return np.concatenate([np.asarray(r, np.float64).reshape(-1) for r in rs])

    std0 = ort_run(bundle / "vae_first.onnx", {"z": z})
    res0 = run_fused_reference(bundle / "vae_first_fused.onnx", {"z": z})
    report(f"{label} first frames", res0[0], std0[0])
    report(f"{label} first caches", flat(res0[1:]), flat(std0[1:]))
    feed = {"z": z * 0.5, **{f"cache_in.{j}": c for j, c in enumerate(std0[1:])}}
    std1 = ort_run(bundle / "vae_step.onnx", feed)
    res1 = run_fused_reference(bundle / "vae_step_fused.onnx", feed)
    report(f"{label} step frames", res1[0], std1[0])
    report(f"{label} step caches", flat(res1[1:]), flat(std1[1:]))


def run_fused_check(args) -> int:
    """The exported graphs' fused ops against eager PyTorch with every bias non-zero (seeded
    random weights leave biases at zero, which would hide a wrongly folded value bias or a
    FastGelu bias), for both VAE norm forms.  Exits 1 when a graph differs by more than 1e-4.

    dit_fused.onnx and vae_first_fused / vae_step_fused.onnx (the runner's ai.unstep operators,
    which ONNX Runtime cannot run): their eager structure vs the standard eager forward, their
    exported graphs' structure (fp32 and fp16), and the exported graphs run in onnx.reference with
    numpy operators written from the contract (dit_fused fed concat(past, zeros[T]) as its kv_k/kv_v
    and compared on flow and the rows its QkvNormRopeCache nodes wrote in place).  With --bundle,
    that bundle's fused graphs too."""
    import copy
    import tempfile

    import onnxruntime as ort

    from . import export as ex
    from . import fused
    from .build import build
    from .vae import RMSNorm as VaeRmsNorm
    from .vae import carried_bias_convs, norm_silu_pairs

    cfg = preset(args.preset)
    dit, _, vae = build(cfg)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for mod in (dit, vae):
            for name, p in mod.named_parameters():
                if p.dim() == 1 and not name.endswith("weight"):
                    p.add_(torch.randn(p.shape, generator=g) * 0.3)
    failed = 0

    def report(label, got, ref, tol=1e-4, absolute=False):
        nonlocal failed
        err = float(np.abs(np.asarray(got, np.float64) - np.asarray(ref, np.float64)).max())
        ok = err <= tol * (1.0 if absolute else max(1.0, float(np.abs(ref).max())))
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {label:<34} max_abs {err:.3e}")

    def structure(label, problems):
        nonlocal failed
        failed += bool(problems)
        print(f"{'ok  ' if not problems else 'FAIL'} {label}")
        for p in problems:
            print(f"       {p}")

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

        # dit_fused: the fused structure in eager PyTorch (the reference arithmetic of the ai.unstep
        # functions) against the standard eager forward, absolute 1e-4.
        with torch.no_grad(), fused.fused_dit():
            f_flow, f_nk, f_nv = dit(x, ts, ctx, off, pk, pv)
        report("dit_fused eager flow", f_flow.numpy(), flow.numpy(), absolute=True)
        report("dit_fused eager new_k (all layers)", torch.cat(f_nk, 1).numpy(), torch.cat(nk, 1).numpy(),
               absolute=True)
        report("dit_fused eager new_v + value bias", torch.cat([v + b for v, b in zip(f_nv, v_bias)], 1).numpy(),
               torch.cat(nv, 1).numpy(), absolute=True)

        # dit_fused.onnx: structure, then the graph itself in onnx.reference with numpy operators.
        ex.export_dit(dit, cfg, out, torch.float32, fused_ops=True)
        structure("dit_fused.onnx structure (fp32)",
                  check_fused_structure(out / "dit_fused.onnx", out / "dit.onnx", cfg.layers, cfg.heads))
        # The graph writes this block's keys/values into the last T rows of its kv_k/kv_v inputs
        # (fed as concat(past, zeros[T])); compare those rows with the eager new_k/new_v.
        tokens = f * cfg.tokens_per_frame
        r_flow, r_k, r_v, probs = run_fused_dit(out / "dit_fused.onnx", feed, tokens)
        structure("dit_fused.onnx (numpy ops) writes kv_k/kv_v in place", probs)
        report("dit_fused.onnx (numpy ops) flow", r_flow, flow.numpy())
        report("dit_fused.onnx (numpy ops) kv_k rows", np.concatenate(r_k, 1), torch.cat(nk, 1).numpy())
        report("dit_fused.onnx (numpy ops) kv_v rows+b",
               np.concatenate([v + b.numpy() for v, b in zip(r_v, v_bias)], 1), torch.cat(nv, 1).numpy())
        feed0 = dict(feed, frame_offset=np.array([0]))
        for i in range(cfg.layers):
            feed0[f"past_k.{i}"] = feed0[f"past_v.{i}"] = np.zeros((1, 0, cfg.dim), np.float32)
        std0 = session(out / "dit.onnx").run(None, feed0)  # flow, new_k.0, new_v.0, new_k.1, ...
        r_flow, r_k, r_v, probs = run_fused_dit(out / "dit_fused.onnx", feed0, tokens)
        structure("dit_fused.onnx (numpy ops) P=0 writes kv_k/kv_v in place", probs)
        res0 = [r_flow] + [c for kv in zip(r_k, r_v) for c in kv]
        report("dit_fused.onnx (numpy ops) P=0", np.concatenate([r.reshape(-1) for r in res0]),
               np.concatenate([r.reshape(-1) for r in std0]))
        half = copy.deepcopy(dit).half()
        ex.export_dit(half, cfg, out, torch.float16)
        ex.export_dit(half, cfg, out, torch.float16, fused_ops=True)
        structure("dit_fused.onnx structure (fp16)",
                  check_fused_structure(out / "dit_fused.onnx", out / "dit.onnx", cfg.layers, cfg.heads))
        del half
        # fp16 arithmetic (one rounding per op output) against the fp32 reference: a loose bound
        # that catches overflow or a wrong cast, not rounding.
        feed16 = {k: v.astype(np.float16) if v.dtype == np.float32 and k != "timestep" else v
                  for k, v in feed.items()}
        r_flow, r_k, _, probs = run_fused_dit(out / "dit_fused.onnx", feed16, tokens)
        structure("dit_fused.onnx fp16 (numpy ops) writes kv_k/kv_v in place", probs)
        report("dit_fused.onnx fp16 (numpy ops) flow", r_flow, flow.numpy(), tol=1e-2)
        report("dit_fused.onnx fp16 (numpy ops) kv_k rows", np.concatenate(r_k, 1), torch.cat(nk, 1).numpy(),
               tol=1e-2)

        z = torch.randn(1, cfg.latent_channels, 1, cfg.lat_h, cfg.lat_w, generator=g)
        with torch.no_grad():
            f0, c0 = vae.decode_frame(z, None)
            f1, _ = vae.decode_frame(z * 0.5, c0)
        for mode in ("transpose", "reduce"):
            VaeRmsNorm.export_mode = mode
            ex.export_vae(vae, cfg, out, torch.float32)
            r0 = session(out / "vae_first.onnx").run(None, {"z": z.numpy()})
            vfeed = {"z": (z * 0.5).numpy(), **{f"cache_in.{j}": c for j, c in enumerate(r0[1:])}}
            r1 = session(out / "vae_step.onnx").run(None, vfeed)
            report(f"vae_first frames ({mode} norm)", r0[0], f0.numpy())
            report(f"vae_step frames ({mode} norm)", r1[0], f1.numpy())
        VaeRmsNorm.export_mode = "transpose"

        # vae_first_fused / vae_step_fused: every RMS norm + SiLU as one BiasRmsNorm (silu = 1).
        # A copy of the VAE with its norm scales (gamma) away from 1 as well as non-zero biases.
        fvae = copy.deepcopy(vae)
        gv = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for name, p in fvae.named_parameters():
                if name.endswith("gamma"):
                    p.mul_(1.0 + 0.2 * torch.randn(p.shape, generator=gv))
        pairs, conv_fed = norm_silu_pairs(fvae)
        carried = carried_bias_convs(fvae)
        zv = torch.randn(1, cfg.latent_channels, 1, cfg.lat_h, cfg.lat_w, generator=gv) * 2
        # (1) the fused structure in eager PyTorch vs the standard eager decoder, absolute 1e-4;
        # the step is fed the standard first call's caches in both.
        with torch.no_grad():
            s0, sc0 = fvae.decode_frame(zv, None)
            s1, sc1 = fvae.decode_frame(zv * 0.5, sc0)
            with fused.fused_vae():
                q0, qc0 = fvae.decode_frame(zv, None)
                q1, qc1 = fvae.decode_frame(zv * 0.5, sc0)
        flat = lambda ts: np.concatenate([t.reshape(-1).numpy() for t in ts])  # noqa: E731
        report("vae_first_fused eager frames", q0.numpy(), s0.numpy(), absolute=True)
        report("vae_first_fused eager caches", flat(qc0), flat(sc0), absolute=True)
        report("vae_step_fused eager frames", q1.numpy(), s1.numpy(), absolute=True)
        report("vae_step_fused eager caches", flat(qc1), flat(sc1), absolute=True)
        # (2) structure of the exported graphs, fp32 and fp16
        ex.export_vae(fvae, cfg, out, torch.float32)
        ex.export_vae(fvae, cfg, out, torch.float32, fused_ops=True)
        for role in ("vae_first", "vae_step"):
            structure(f"{role}_fused.onnx structure (fp32)",
                      check_fused_vae_structure(out / f"{role}_fused.onnx", out / f"{role}.onnx", pairs, conv_fed,
                                                carried, prefix_norm_count(role, pairs)))
        # (3) the fused graphs in onnx.reference (numpy BiasRmsNorm) vs the standard graphs in
        # onnxruntime, fp32, every output.
        report_vae_graphs("vae_*_fused.onnx (numpy ops)", out, zv.numpy(), report)
        half = copy.deepcopy(fvae).half()
        with tempfile.TemporaryDirectory() as tmp16:
            out16 = Path(tmp16)
            ex.export_vae(half, cfg, out16, torch.float16)
            ex.export_vae(half, cfg, out16, torch.float16, fused_ops=True)
            for role in ("vae_first", "vae_step"):
                structure(f"{role}_fused.onnx structure (fp16)",
                          check_fused_vae_structure(out16 / f"{role}_fused.onnx", out16 / f"{role}.onnx",
                                                    pairs, conv_fed, carried, prefix_norm_count(role, pairs)))
        del half, fvae
    if getattr(args, "bundle", None):
        import tomllib

        bundle = Path(args.bundle)
        meta = tomllib.loads((bundle / "bundle.toml").read_text())
        listed_graphs = meta.get("graphs", {})
        fp32 = meta.get("precision") == "fp32"
        if meta.get("preset") != cfg.preset:
            # The structure checks count layers, heads and norm/SiLU pairs of --preset's model.
            structure(f"{bundle}: preset", [f"the bundle is {meta.get('preset')!r}; run with --preset "
                                            f"{meta.get('preset')}"])
        if (bundle / "dit_fused.onnx").exists():
            structure(f"{bundle}/dit_fused.onnx structure",
                      check_fused_structure(bundle / "dit_fused.onnx", bundle / "dit.onnx", cfg.layers, cfg.heads))
            listed = listed_graphs.get("dit_fused") == "dit_fused.onnx"
            structure(f"{bundle}/bundle.toml lists dit_fused", [] if listed else ["not in [graphs]"])
            if fp32:
                # The bundle's own two DiT graphs on one random input (P = T): dit.onnx in
                # onnxruntime, dit_fused.onnx in onnx.reference with the numpy operators; its flow
                # and the last T rows of its kv_k/kv_v against dit.onnx's flow, new_k and new_v.
                tokens = cfg.frames_per_block * cfg.tokens_per_frame
                for k, v in feed.items():
                    if k.startswith("past_"):
                        feed[k] = np.ascontiguousarray(v[:, :tokens])
                std = session(bundle / "dit.onnx").run(None, feed)
                r_flow, r_k, r_v, probs = run_fused_dit(bundle / "dit_fused.onnx", feed, tokens)
                structure(f"{bundle}/dit_fused.onnx writes kv_k/kv_v in place", probs)
                res = [r_flow] + [c for kv in zip(r_k, r_v) for c in kv]
                report(f"{bundle}: dit_fused vs dit (flow, kv rows)", np.concatenate([r.reshape(-1) for r in res]),
                       np.concatenate([r.reshape(-1) for r in std]))
        else:
            print(f"note: {bundle} has no dit_fused.onnx")
        roles = [r for r in ("vae_first", "vae_step") if (bundle / f"{r}_fused.onnx").exists()]
        pairs, conv_fed = norm_silu_pairs(vae)
        for role in roles:
            structure(f"{bundle}/{role}_fused.onnx structure",
                      check_fused_vae_structure(bundle / f"{role}_fused.onnx", bundle / f"{role}.onnx", pairs,
                                                conv_fed, carried_bias_convs(vae), prefix_norm_count(role, pairs)))
            listed = listed_graphs.get(f"{role}_fused") == f"{role}_fused.onnx"
            structure(f"{bundle}/bundle.toml lists {role}_fused", [] if listed else ["not in [graphs]"])
        if len(roles) == 1:
            structure(f"{bundle}: fused VAE graphs", [f"only {roles[0]}_fused.onnx: they come in pairs"])
        elif roles and fp32:
            # The bundle's own VAE graphs: standard in onnxruntime, fused in onnx.reference.
            zb = torch.randn(1, cfg.latent_channels, 1, cfg.lat_h, cfg.lat_w, generator=g).numpy() * 2
            report_vae_graphs(f"{bundle}: vae_*_fused vs vae_*", bundle, zb, report)
        elif not roles:
            print(f"note: {bundle} has no vae_first_fused.onnx / vae_step_fused.onnx")
    print("PASS" if not failed else f"FAIL ({failed})")
    return 1 if failed else 0

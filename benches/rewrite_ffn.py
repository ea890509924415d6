"""A/B of `MatMulBiasGelu` on one export: writes a copy of a bundle whose dit_fused.onnx has
exporter 0.8.0's FFN (a MatMul by W^T, then `BiasGelu`) in place of each `MatMulBiasGelu`; the
other files are symlinked and bundle.toml gets the new graph's sha256.

    python3 benches/rewrite_ffn.py BUNDLE OUT_DIR
    VARIANTS="fused=;split=BUNDLE=OUT_DIR" scripts/bench-gpu /tmp/bench BUNDLE
"""
import hashlib, os, re, sys
from pathlib import Path
import numpy as np
import onnx
from onnx import helper, numpy_helper

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True, exist_ok=True)
model = onnx.load(str(src / "dit_fused.onnx"), load_external_data=True)
g = model.graph
inits = {i.name: i for i in g.initializer}
nodes = []
n_rewritten = 0
for n in g.node:
    if n.domain == "ai.unstep" and n.op_type == "MatMulBiasGelu":
        x, w, b = n.input
        wt = numpy_helper.to_array(inits[w]).T.copy()
        name = w + "_t"
        g.initializer.append(numpy_helper.from_array(wt, name))
        mid = n.output[0] + "_mm"
        nodes.append(helper.make_node("MatMul", [x, name], [mid], name=n.name + "_mm"))
        nodes.append(helper.make_node("BiasGelu", [mid, b], list(n.output), name=n.name + "_gelu", domain="ai.unstep"))
        n_rewritten += 1
    else:
        nodes.append(n)
del g.node[:]
g.node.extend(nodes)
used = {i for n in g.node for i in n.input}
keep = [i for i in g.initializer if i.name in used]
del g.initializer[:]
g.initializer.extend(keep)
out = dst / "dit_fused.onnx"
for f in [out, dst / "dit_fused.onnx.data"]:
    if f.exists() or f.is_symlink():
        f.unlink()
big = sum(i.ByteSize() for i in g.initializer) > 1.5e9
if big:
    onnx.save_model(model, str(out), save_as_external_data=True, all_tensors_to_one_file=True, location="dit_fused.onnx.data")
else:
    onnx.save_model(model, str(out))
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
for f in src.iterdir():
    if f.name.startswith("dit_fused.onnx") or f.name == "bundle.toml":
        continue
    t = dst / f.name
    if not t.exists():
        t.symlink_to(f.resolve())
toml = (src / "bundle.toml").read_text()
toml = re.sub(r'"dit_fused\.onnx(\.data)?" = "[0-9a-f]+"\n', "", toml)
extra = [f'"{p.name}" = "{sha(p)}"\n' for p in [out, dst / "dit_fused.onnx.data"] if p.exists()]
toml = toml.replace("[files]\n", "[files]\n" + "".join(extra))
(dst / "bundle.toml").write_text(toml)
print(f"rewrote {n_rewritten} MatMulBiasGelu into MatMul + BiasGelu -> {dst}")

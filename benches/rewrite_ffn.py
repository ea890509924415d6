"""A/B of `MatMulBiasGelu` on one export: writes a copy of a bundle whose dit_fused.onnx has
exporter 0.8.0's FFN (a MatMul by W^T, then `BiasGelu`) in place of each `MatMulBiasGelu`; the
other files are symlinked and bundle.toml gets the new graph's sha256.

    python3 benches/rewrite_ffn.py BUNDLE OUT_DIR
    VARIANTS="fused=;split=BUNDLE=OUT_DIR" scripts/bench-gpu /tmp/bench BUNDLE
"""
import re
import sys
from pathlib import Path

import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "assets" / "export"))
from unstep_export.export import sha256  # noqa: E402 - after the path above

GRAPH = "dit_fused.onnx"
DATA = GRAPH + ".data"  # the exporter's external data file for graphs over 2 GB


def split_ffn(graph) -> int:
    """Replaces each MatMulBiasGelu(X, W, bias) by MatMul(X, W^T) and BiasGelu(., bias); returns
    how many there were. W^T is a new initializer; initializers no node reads any more go."""
    weights = {i.name: i for i in graph.initializer}
    nodes, count = [], 0
    for n in graph.node:
        if n.domain != "ai.unstep" or n.op_type != "MatMulBiasGelu":
            nodes.append(n)
            continue
        x, w, bias = n.input
        transposed = w + "_t"
        graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(weights[w]).T.copy(), transposed))
        product = n.output[0] + "_mm"
        nodes.append(helper.make_node("MatMul", [x, transposed], [product], name=n.name + "_mm"))
        nodes.append(helper.make_node("BiasGelu", [product, bias], list(n.output), name=n.name + "_gelu",
                                      domain="ai.unstep"))
        count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    read = {i for n in graph.node for i in n.input}
    kept = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return count


def main(src: Path, dst: Path):
    dst.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(src / GRAPH), load_external_data=True)
    count = split_ffn(model.graph)
    written = [dst / GRAPH, dst / DATA]
    for f in written:
        if f.exists() or f.is_symlink():
            f.unlink()
    if sum(i.ByteSize() for i in model.graph.initializer) > 1.5e9:
        onnx.save_model(model, str(written[0]), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=DATA)
    else:
        onnx.save_model(model, str(written[0]))
    for f in src.iterdir():
        if f.name not in (GRAPH, DATA, "bundle.toml") and not (dst / f.name).exists():
            (dst / f.name).symlink_to(f.resolve())
    toml = (src / "bundle.toml").read_text()
    toml = re.sub(r'"dit_fused\.onnx(\.data)?" = "[0-9a-f]+"\n', "", toml)
    hashes = "".join(f'"{f.name}" = "{sha256(f)}"\n' for f in written if f.exists())
    (dst / "bundle.toml").write_text(toml.replace("[files]\n", "[files]\n" + hashes))
    print(f"rewrote {count} MatMulBiasGelu into MatMul + BiasGelu -> {dst}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

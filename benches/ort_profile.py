"""Summarises ONNX Runtime profiles written with UNSTEP_ORT_PROFILE=<dir>: kernel time by
operator type (and the heaviest single nodes), per graph.

    python3 benches/ort_profile.py <dir> [top]
"""
import collections
import glob
import json
import os
import sys


def summarise(path, top):
    with open(path) as f:
        events = json.load(f)
    by_op = collections.Counter()
    by_node = collections.Counter()
    count = collections.Counter()
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        op = e.get("args", {}).get("op_name", "?")
        provider = e.get("args", {}).get("provider", "")
        by_op[(op, provider)] += e.get("dur", 0)
        by_node[e["name"][: -len("_kernel_time")]] += e.get("dur", 0)
        count[(op, provider)] += 1
    total = sum(by_op.values()) or 1
    print(f"== {os.path.basename(path)}: kernel time {total / 1e6:.3f} s")
    for (op, provider), us in by_op.most_common(top):
        print(f"  {op:<34} {provider:<26} {us / 1e6:8.3f} s {100 * us / total:5.1f} %  ({count[(op, provider)]} runs)")
    print("  heaviest nodes:")
    for node, us in by_node.most_common(8):
        print(f"    {node:<60} {us / 1e6:8.3f} s")


def main():
    folder = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        summarise(path, top)


if __name__ == "__main__":
    main()

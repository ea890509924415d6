"""Summarises ONNX Runtime's log of a worker run with UNSTEP_ORT_LOG=info (or verbose): per
session (the log id is the graph's name), when its build began and ended against the first
line of the log, and the longest gaps between one of its lines and its next, with the line that
ended each gap (the step that took that long). Sessions built in under 0.05 s (the runner's
small graphs) are counted, not listed. The runner's own lines on its CUDA kernels' creation
(`[unstep] OP kernel of node N: created in X ms`, logged with UNSTEP_ORT_LOG) are summed per
operator.

    python3 benches/ort_log.py LOG [top]
"""
import collections
import datetime
import re
import sys

KERNEL = re.compile(r"^\[unstep\] (\S+) kernel of node (.*): created in ([\d.]+) ms$")
LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) \[(\w):onnxruntime:([^,]*), ([^\]]*)\] (.*)$")


def stamp(text):
    day, clock = text.split(" ")
    whole, frac = clock.split(".")
    t = datetime.datetime.strptime(f"{day} {whole}", "%Y-%m-%d %H:%M:%S")
    return t.timestamp() + float("0." + frac)


def main(path, top):
    lines = collections.defaultdict(list)
    kernels = collections.defaultdict(list)
    first = None
    with open(path, errors="replace") as f:
        for raw in f:
            k = KERNEL.match(raw.rstrip("\n"))
            if k:
                kernels[k.group(1)].append((float(k.group(3)) * 1e-3, k.group(2)))
                continue
            m = LINE.match(raw.rstrip("\n"))
            if not m:
                continue
            t = stamp(m.group(1))
            first = t if first is None else first
            lines[m.group(3) or "(environment)"].append((t, m.group(4), m.group(5)))
    if first is None:
        print(f"{path}: no ONNX Runtime log lines")
        return
    small = 0
    for session, entries in lines.items():
        start = next((t for t, _, msg in entries if msg.startswith("Initializing session")), None)
        end = next((t for t, _, msg in entries if msg.startswith("Session successfully")), None)
        if start and end and end - start < 0.05:
            small += 1
            continue
        span = f"build {start - first:.3f} -> {end - first:.3f} s ({end - start:.3f} s)" if start and end else "no build span"
        print(f"{session}: {len(entries)} lines, {span}")
        gaps = sorted(
            ((b[0] - a[0], b[1], b[2][:110]) for a, b in zip(entries, entries[1:])),
            reverse=True,
        )[:top]
        for gap, where, msg in gaps:
            print(f"  {gap:7.3f} s before [{where}] {msg}")
    print(f"{small} sessions built in under 0.05 s")
    for op, made in sorted(kernels.items(), key=lambda kv: -sum(s for s, _ in kv[1])):
        slowest, node = max(made)
        print(f"kernels {op}: {len(made)} created in {sum(s for s, _ in made):.3f} s, slowest {slowest:.3f} s ({node})")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8)

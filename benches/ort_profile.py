"""Summarises ONNX Runtime profiles written with UNSTEP_ORT_PROFILE=<dir>, per graph: how long
the session took to load and initialise, its runs, kernel time by operator type (and the heaviest
single nodes), and the operators that took longer in the slowest run (a process's first, or the
run that captured a CUDA graph) than in the fastest.

    python3 benches/ort_profile.py <dir or file> [top] [run]    (run: the run to set against
    the fastest, by index; default the slowest)
"""
import collections
import glob
import json
import os
import sys


def summarise(path, top, index):
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
    session = {e["name"]: e["dur"] / 1e6 for e in events if e.get("cat") == "Session"
               and e["name"] in ("model_loading_uri", "session_initialization")}
    print(f"== {os.path.basename(path)}: kernel time {total / 1e6:.3f} s; "
          + ", ".join(f"{k} {v:.3f} s" for k, v in session.items()))
    runs(events, index)
    for (op, provider), us in by_op.most_common(top):
        print(f"  {op:<34} {provider:<26} {us / 1e6:8.3f} s {100 * us / total:5.1f} %  ({count[(op, provider)]} runs)")
    print("  heaviest nodes:")
    for node, us in by_node.most_common(8):
        print(f"    {node:<60} {us / 1e6:8.3f} s")


def run_ops(events, run):
    """Node time (µs) by operator type inside one run's window."""
    start, end = run["ts"], run["ts"] + run["dur"]
    totals = collections.Counter()
    for e in events:
        if (e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
                and start <= e["ts"] <= end):
            totals[e.get("args", {}).get("op_name", "?")] += e.get("dur", 0)
    return totals


def runs(events, index=None):
    """The session's runs, and where its slowest spent more than its fastest."""
    model_runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    if not model_runs:
        return
    ms = [round(r["dur"] / 1e3, 1) for r in model_runs]
    print(f"  {len(ms)} runs, ms: first {ms[:12]}, min {min(ms)}, max {max(ms)}")
    slow = model_runs[index] if index is not None and index < len(model_runs) else max(
        model_runs, key=lambda r: r["dur"])
    fast = min(model_runs, key=lambda r: r["dur"])
    slow_ops, fast_ops = run_ops(events, slow), run_ops(events, fast)
    extra = collections.Counter({op: us - fast_ops.get(op, 0) for op, us in slow_ops.items()})
    print(f"  run #{model_runs.index(slow)} against the fastest, node time by operator, ms:")
    for op, _ in extra.most_common(6):
        print(f"    {op:<34} {slow_ops[op] / 1e3:9.1f} {fast_ops.get(op, 0) / 1e3:9.1f}")
    print(f"    {'(all nodes)':<34} {sum(slow_ops.values()) / 1e3:9.1f} "
          f"{sum(fast_ops.values()) / 1e3:9.1f}")


def main():
    where = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    index = int(sys.argv[3]) if len(sys.argv) > 3 else None
    paths = sorted(glob.glob(os.path.join(where, "*.json"))) if os.path.isdir(where) else [where]
    for path in paths:
        summarise(path, top, index)


if __name__ == "__main__":
    main()

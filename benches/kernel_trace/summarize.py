#!/usr/bin/env python3
"""Summarise kernel_trace TSV reports (see README.md).

    python3 benches/kernel_trace/summarize.py [-n 25] [--width 110] REPORT.tsv [REPORT.tsv ...]
    python3 benches/kernel_trace/summarize.py --minus BASE.tsv [--per N] REPORT.tsv

`--minus` subtracts a shorter run of the same command (for example one prompt fewer): what is
left is exactly the extra work, with loading, warmup and algorithm searches cancelled out;
`--per N` divides it by N (the number of extra prompts).

Per report: span, kernel busy (union of kernel intervals), busy/span (GPU utilisation), the
top N rows by total time with their percent of kernel_sum, and the kernel time grouped into
categories by regex on the kernel name, then the device's idle gaps by the pair of records
around them (rows of kind "gap": every gap of 10 us or more charged to the record that ended
before it and the one that starts it, shorter ones in one row). With several reports, a merged
section follows (rows with the same kind and name are added; span and busy are added too, i.e.
the processes are taken as if they had run one after the other).
"""
import argparse
import re
import sys

# First match wins. Attention and conv come before gemm: cuDNN/CUTLASS conv kernels are
# "implicit gemm" and their names often hold "gemm"/"xmma"; SDPA kernels may hold "gemm" too.
CATEGORIES = [
    ("attention", re.compile(r"flash|fmha|attention|cudnn.*sdpa|sdpa", re.I)),
    ("conv", re.compile(r"conv|implicit|winograd|fft|xmma.*fprop|fprop|dgrad|wgrad", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|sm90_xmma|cublas|nvjet", re.I)),
    ("norm", re.compile(r"norm|LayerNorm|RMS", re.I)),
    # case-sensitive on purpose: short op names (Add, Mul, Cast, Copy) would match too much ignoring case
    ("elementwise", re.compile(
        r"elementwise|Elementwise|vectorized|unrolled|_Binary|_Unary|Cast|Mul|Add|Concat|[Tt]ranspose|Slice|Copy")),
]


def category(kind, name):
    if kind != "kernel":
        return kind.split("_")[0]  # memcpy / memset
    for cat, rx in CATEGORIES:
        if rx.search(name):
            return cat
    return "other"


class Report:
    def __init__(self, label):
        self.label = label
        self.meta = {}
        self.rows = {}  # (kind, name) -> [count, total, min, max, bytes]

    def add_row(self, kind, name, count, total, mn, mx, nbytes):
        r = self.rows.get((kind, name))
        if r is None:
            self.rows[(kind, name)] = [count, total, mn, mx, nbytes]
        else:
            r[0] += count
            r[1] += total
            r[2] = min(r[2], mn)
            r[3] = max(r[3], mx)
            r[4] += nbytes

    def m(self, key):
        return int(self.meta.get(key, 0))


def read_report(path):
    rep = Report(path)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            if line.startswith("#"):
                body = line[1:].strip()
                if body.startswith("columns="):
                    continue
                for tok in body.split():
                    if "=" in tok:
                        k, v = tok.split("=", 1)
                        rep.meta[k] = v
                continue
            f_ = line.split("\t")
            if len(f_) < 7:
                print(f"{path}: skipping malformed row: {line[:80]}", file=sys.stderr)
                continue
            nbytes = int(f_[7]) if len(f_) > 7 and f_[7] else 0
            rep.add_row(f_[0], f_[1], int(f_[2]), int(f_[3]), int(f_[5]), int(f_[6]), nbytes)
    return rep


def merge(reports):
    out = Report(f"merged ({len(reports)} reports)")
    for key in ("span_ns", "kernel_busy_ns", "kernel_sum_ns", "n_kernels", "gpu_busy_ns",
                "n_records_dropped", "n_records_skipped"):
        out.meta[key] = str(sum(r.m(key) for r in reports))
    for r in reports:
        for (kind, name), (c, t, mn, mx, b) in r.rows.items():
            out.add_row(kind, name, c, t, mn, mx, b)
    return out


def minus(rep, base, per):
    out = Report(f"{rep.label} minus {base.label}" + (f", per 1 of {per}" if per > 1 else ""))
    for key in ("span_ns", "kernel_busy_ns", "kernel_sum_ns", "n_kernels", "gpu_busy_ns"):
        out.meta[key] = str((rep.m(key) - base.m(key)) // per)
    for key, (c, t, mn, mx, b) in rep.rows.items():
        bc, bt, _, _, bb = base.rows.get(key, [0, 0, 0, 0, 0])
        if c - bc > 0:
            out.rows[key] = [(c - bc) // per, (t - bt) // per, mn, mx, (b - bb) // per]
    return out


def ms(ns):
    return f"{ns / 1e6:,.3f} ms"


def pct(a, b):
    return f"{100.0 * a / b:5.1f}%" if b else "    -"


def show(rep, top, width):
    span, busy = rep.m("span_ns"), rep.m("kernel_busy_ns")
    ksum, nk = rep.m("kernel_sum_ns"), rep.m("n_kernels")
    gbusy = rep.m("gpu_busy_ns")
    print(f"== {rep.label}")
    if "cupti_api" in rep.meta:
        print(f"   pid {rep.meta.get('pid', '?')}, CUPTI api {rep.meta['cupti_api']}, "
              f"skip_ns {rep.meta.get('skip_ns', '0')}")
    print(f"   span            {ms(span)}")
    print(f"   kernel busy     {ms(busy)}   busy/span {pct(busy, span)}  (GPU utilisation by kernels)")
    print(f"   gpu busy        {ms(gbusy)}   busy/span {pct(gbusy, span)}  (kernels + memcpy + memset)")
    print(f"   kernel sum      {ms(ksum)}   sum/busy {ksum / busy if busy else 0:.2f}x (overlap)   "
          f"{nk:,} kernels, {sum(1 for k, _ in rep.rows if k == 'kernel'):,} distinct names")
    if rep.m("n_records_dropped"):
        print(f"   WARNING: {rep.m('n_records_dropped'):,} records dropped by CUPTI")
    if gbusy > span:
        # A difference of two runs: their start-ups (session creation, first-call tuning) can
        # differ by more than the work between them, so the span difference undercounts it.
        print("   NOTE: busy exceeds span: the two runs' spans differ by less than their work; "
              "read the per-kernel rows, not the span or the idle total")

    work = {k: v for k, v in rep.rows.items() if k[0] != "gap"}
    gaps = {k: v for k, v in rep.rows.items() if k[0] == "gap"}

    # categories
    cats = {}
    for (kind, name), (c, t, _mn, _mx, b) in work.items():
        cat = category(kind, name)
        e = cats.setdefault(cat, [0, 0, 0])
        e[0] += c
        e[1] += t
        e[2] += b
    print(f"\n   {'category':<12} {'total':>16} {'%ksum':>6} {'count':>10}  bytes")
    for cat, (c, t, b) in sorted(cats.items(), key=lambda kv: -kv[1][1]):
        bs = f"  {b / 2**20:,.1f} MiB" if cat in ("memcpy", "memset") else ""
        print(f"   {cat:<12} {ms(t):>16} {pct(t, ksum)} {c:>10,}{bs}")

    # top rows
    rows = sorted(work.items(), key=lambda kv: -kv[1][1])[:top]
    print(f"\n   {'#':>3} {'kind':<12} {'total':>14} {'%ksum':>6} {'count':>9} {'avg us':>10} "
          f"{'max us':>10}  {'category':<11} name")
    for i, ((kind, name), (c, t, _mn, mx, _b)) in enumerate(rows, 1):
        nm = name if len(name) <= width else name[: width - 3] + "..."
        print(f"   {i:>3} {kind:<12} {ms(t):>14} {pct(t, ksum)} {c:>9,} {t / c / 1e3 if c else 0:>10.1f} "
              f"{mx / 1e3:>10.1f}  {category(kind, name):<11} {nm}")
    print()
    if gaps:
        show_gaps(gaps, span - gbusy, top, width)


def show_gaps(gaps, idle, top, width):
    """Idle time of the device by the pair of records around it (reports with gap rows)."""
    total = sum(t for c, t, *_ in gaps.values())
    print(f"   idle gaps: {ms(total)} in {sum(c for c, *_ in gaps.values()):,} gaps "
          f"(span - gpu busy: {ms(idle)}); by the record before -> the record after")
    print(f"   {'total':>14} {'%idle':>6} {'count':>9} {'avg us':>10} {'max us':>10}  before -> after")
    for (_kind, name), (c, t, _mn, mx, _b) in sorted(gaps.items(), key=lambda kv: -kv[1][1])[:top]:
        nm = name if len(name) <= width else name[: width - 3] + "..."
        print(f"   {ms(t):>14} {pct(t, total)} {c:>9,} {t / c / 1e3 if c else 0:>10.1f} "
              f"{mx / 1e3:>10.1f}  {nm}")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+")
    ap.add_argument("-n", "--top", type=int, default=25, help="rows to show (default 25)")
    ap.add_argument("--width", type=int, default=110, help="truncate kernel names to this many chars")
    ap.add_argument("--minus", metavar="BASE", help="subtract this report from each report")
    ap.add_argument("--per", type=int, default=1, help="divide the difference by N")
    a = ap.parse_args()
    reps = [read_report(p) for p in a.reports]
    if a.minus:
        base = read_report(a.minus)
        reps = [minus(r, base, a.per) for r in reps]
    for r in reps:
        show(r, a.top, a.width)
    if len(reps) > 1:
        show(merge(reps), a.top, a.width)


if __name__ == "__main__":
    main()

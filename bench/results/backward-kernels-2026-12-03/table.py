"""Markdown tables from breakdown.py's JSON lines: per (op, shape), each run's kgen GPU time (the first and
the last split into the row kernels and the column sums), the first / last ratio, and torch.compile's where a
run timed it.

python3 table.py FIRST.jsonl [MIDDLE.jsonl ...] LAST.jsonl"""

import json
import sys


def load(path):
    out = {}
    for line in open(path):
        d = json.loads(line)
        parts = d["kernels"]
        sums = sum(v for k, v in parts.items() if "column_sum" in k)
        out[(d["impl"], d["op"], d["shape"])] = (d["total_us"], d["total_us"] - sums, sums, d["tag"])
    return out


runs = [load(p) for p in sys.argv[1:]]
first, last = runs[0], runs[-1]
tag = lambda run: next(iter(run.values()))[3]  # noqa: E731
middle = "".join(f" {tag(r)} µs |" for r in runs[1:-1])
print(
    f"| op | shape | {tag(first)} µs (rows + sums) |{middle} {tag(last)} µs (rows + sums) | "
    f"{tag(first)} / {tag(last)} | torch.compile µs |"
)
print("|---|---|---|" + "---|" * (len(runs) - 2) + "---|---|---|")
for (impl, op, shape), (b, br, bs, _) in first.items():
    if impl != "kgen" or not all(("kgen", op, shape) in r for r in runs):
        continue
    a, ar, as_, _ = last[("kgen", op, shape)]
    c = next((r[("compile", op, shape)] for r in runs if ("compile", op, shape) in r), None)
    mid = "".join(f" {r[('kgen', op, shape)][0]:.1f} |" for r in runs[1:-1])
    print(
        f"| {op} | {shape} | {b:.1f} ({br:.1f} + {bs:.1f}) |{mid} {a:.1f} ({ar:.1f} + {as_:.1f}) | "
        f"{b / a:.2f} | " + (f"{c[0]:.1f} |" if c else "|")
    )

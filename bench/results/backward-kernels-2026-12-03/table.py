"""Markdown tables from breakdown.py's JSON lines: per (op, shape), each tag's kgen GPU time split into the
row kernels and the column sums, and torch.compile's where it was timed.

python3 table.py BEFORE.jsonl AFTER.jsonl [COMPILE.jsonl]"""

import json
import sys


def load(path):
    out = {}
    for line in open(path):
        d = json.loads(line)
        parts = d["kernels"]
        sums = sum(v for k, v in parts.items() if "column_sum" in k)
        out[(d["impl"], d["op"], d["shape"])] = (d["total_us"], d["total_us"] - sums, sums)
    return out


before, after = load(sys.argv[1]), load(sys.argv[2])
peer = load(sys.argv[3]) if len(sys.argv) > 3 else {}
print("| op | shape | before µs (rows + sums) | after µs (rows + sums) | before / after | torch.compile µs |")
print("|---|---|---|---|---|---|")
for (impl, op, shape), (b, br, bs) in before.items():
    if impl != "kgen" or ("kgen", op, shape) not in after:
        continue
    a, ar, as_ = after[("kgen", op, shape)]
    c = peer.get(("compile", op, shape)) or before.get(("compile", op, shape))
    print(
        f"| {op} | {shape} | {b:.1f} ({br:.1f} + {bs:.1f}) | {a:.1f} ({ar:.1f} + {as_:.1f}) | {b / a:.2f} | "
        + (f"{c[0]:.1f} |" if c else "|")
    )

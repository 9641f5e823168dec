"""The next run's experiment, written into the tree it runs in (never main's): the forward row ops' 16-bit
rows of up to 4 KB and 8 KB spread over threads of one 16-byte access each (rule: 4), rows of up to 16 KB over
512 threads of two (rule: 256 of four), as `kgen tune` entries in arch/tuning/sm_90.toml, so one build of
this tree and one of main's time the two against each other (scripts/variants.py). Why: under ncu at the
suite's misses (bench/results/decode-h100-2026-12-06/ncu-peers.md) Inductor's kernels spread a row over 2-4x
more threads than kgen's (28-40 registers, 72-90 % of the warps resident, against kgen's 48-79 and 36-56 %).

python3 bench/results/next/widen.py    (from the experiment tree's root)"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
from kgen.catalog import load_profile, load_spec, load_tuning  # noqa: E402
from kgen.planner import plan_kernel  # noqa: E402
from kgen.profile import TunedChoice  # noqa: E402
from kgen.tune import merge_and_write  # noqa: E402

OPS = (
    "rmsnorm",
    "layernorm",
    "fused_add_rmsnorm",
    "adaln_rmsnorm",
    "adaln_layernorm",
    "residual_adaln_rmsnorm",
    "residual_adaln_layernorm",
    "adaln_layernorm_fp32",
    "residual_adaln_layernorm_fp32",
    "residual_layernorm_fp32",
)
WIDE = {4096: 256, 8192: 512, 16384: 512}  # max_row_bytes -> threads per row
ARCH, DTYPE = "sm_90", "bfloat16"

for op in OPS:
    rule = plan_kernel(load_spec(op), load_profile(ARCH), DTYPE)
    rules = {b.max_row_bytes: b.threads_per_row for b in rule.buckets if b.vectorized}
    table = load_tuning(ARCH, op)
    kept = [c for c in table.choices if (c.op, c.dtype) == (op, DTYPE) and c.max_row_bytes not in WIDE]
    wide = [
        TunedChoice(
            op=op,
            dtype=DTYPE,
            max_row_bytes=size,
            threads=threads,
            rule_threads=rules[size],
            shapes=[],
            rule_us=1,
            tuned_us=1,
        )
        for size, threads in WIDE.items()
    ]
    path = merge_and_write(table.model_copy(update={"choices": kept + wide}), op, DTYPE)
    print(f"{op}: {', '.join(f'{s} B: {rules[s]} -> {t} threads' for s, t in WIDE.items())} ({path})")

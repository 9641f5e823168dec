"""The next run's experiment, written into the tree it runs in (never main's): the sm_90 profile's ladder of
threads per row (planner.row_reduce.threads_per_row) widened, so each thread of a row op holds fewer 16-byte
accesses of the row, and the tuning entries of the steps it changes dropped (they confirm today's rule and
would override the new one). One build of this tree and one of main's time the two against each other
(scripts/variants.py --forward). Why: under ncu at the suite's misses
(bench/results/decode-h100-2026-12-06/ncu-peers.md) Inductor's kernels spread a row over 2-4x more threads
than kgen's (28-40 registers, 72-90 % of the warps resident, against kgen's 48-79 and 36-56 %).

Variants (accesses a thread at the step's longest 16-bit row; main: 4 at every step from 4 KB):
  one   4 KB: 256 threads (1), 8 KB: 512 (1), 16 KB: 512 (2)
  two   4 KB: 128 threads (2), 8 KB: 256 (2), 16 KB: 512 (2)
  flat  4 KB: 256 threads (1), 8 KB: 512 (1), 16 KB: 1024 (1)

python3 bench/results/next/widen.py VARIANT    (from the experiment tree's root)"""

import re
import sys
from pathlib import Path

LADDERS = {
    "one": {4096: 256, 8192: 512, 16384: 512},
    "two": {4096: 128, 8192: 256, 16384: 512},
    "flat": {4096: 256, 8192: 512, 16384: 1024},
}
steps = LADDERS[sys.argv[1]]
profile = Path("arch/sm_90.toml")
text = profile.read_text()
for size, threads in steps.items():
    text, n = re.subn(
        rf"\{{ max_row_bytes = {size}, threads = \d+ \}}",
        f"{{ max_row_bytes = {size}, threads = {threads} }}",
        text,
    )
    assert n == 1, f"no ladder step for {size} B in {profile}"
profile.write_text(text)

tuning = Path("arch/tuning/sm_90.toml")
head, *entries = tuning.read_text().split("[[choices]]")
kept = [
    e
    for e in entries
    if not (
        re.search(r'^op = "[a-z_]*norm[a-z_0-9]*"', e, re.M)
        and re.search(r"^max_row_bytes = (\d+)", e, re.M).group(1) in map(str, steps)
    )
]
tuning.write_text("[[choices]]".join([head, *kept]))
print(f"{sys.argv[1]}: {steps}; tuning entries {len(entries)} -> {len(kept)}")

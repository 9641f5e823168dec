"""The GPU's SM clock, power and active clock-event reasons (nvidia-smi every 100 ms, clocks.csv) during each
timed round of `kgen bench --e2e ltx` (ltx.log, every line stamped with epoch seconds): a round's window is
the 20 runs before its line (20 × its median ms). python3 clocks.py RESULTS_DIR"""

import re
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

root = Path(sys.argv[1])
samples = []
for line in (root / "clocks.csv").read_text().splitlines()[1:]:
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 5 or not parts[1].endswith("MHz"):
        continue
    t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
    reasons = int(parts[5], 16) if len(parts) > 5 else 0
    samples.append((t, float(parts[1].split()[0]), float(parts[3].split()[0]), reasons))

text = (root / "ltx.log").read_text()
# a round's line, its ms sometimes wrapped onto the next stamped line
rounds = re.findall(
    r"^(\d+\.\d+) (LTX-Video forward, B=2, S=\d+) \S+: round (\d)/3, (.+?) "
    r"(?:\n\d+\.\d+ )?([\d.]+)\s*(?:\n\d+\.\d+ )?ms",
    text,
    re.M,
)
print("| S | variant | round | ms | SM MHz (mean, min) | power W (mean, max) | reasons seen |")
print("|---|---|---|---|---|---|---|")
rows = {}
for stamp, workload, rnd, variant, ms in rounds:
    end = float(stamp)
    start = end - 20 * float(ms) / 1000
    win = [s for s in samples if start <= s[0] <= end]
    if not win:
        continue
    clock = [s[1] for s in win]
    power = [s[2] for s in win]
    reasons = 0
    for s in win:
        reasons |= s[3]
    S = workload.split("S=")[1]
    rows.setdefault((S, variant), []).append(statistics.mean(clock))
    print(
        f"| {S} | {variant} | {rnd} | {ms} | {statistics.mean(clock):.0f}, {min(clock):.0f} | "
        f"{statistics.mean(power):.0f}, {max(power):.0f} | {reasons:#x} |"
    )
print()
print("| S | variant | mean SM MHz over its rounds |")
print("|---|---|---|")
for (S, variant), clocks in rows.items():
    print(f"| {S} | {variant} | {statistics.mean(clocks):.0f} |")

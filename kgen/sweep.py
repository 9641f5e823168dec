"""`kgen bench OP --sweep`: an op over a grid of rows × hidden sizes (log-spaced, with non-powers of two
and an odd hidden size) and a few seeded random shapes, timed with the peers as the suite is (`kgen.bench`),
then a heatmap of best peer / kgen and a Markdown table. The bar: kgen at or under the best peer (a ratio
>= 1) at every point that moves more than 1 MB; smaller points are shown, not judged (their time is launch
latency).

Every op whose params are all floats is swept as [1, rows, hidden] (an op with integer params, the latent
grids of the rotary ops, has no shape a (rows, hidden) pair names); with ``per_batch`` its broadcast inputs
are [1, 1, hidden]."""

from __future__ import annotations

import json
import random
from pathlib import Path

from .bench_report import MB, PNG
from .catalog import load_spec
from .errors import UsageError
from .families.base import Case

HIDDEN = (128, 1000, 2048, 4099, 5120, 8192, 14336, 32768, 65536)
ROWS = (1, 64, 333, 2048, 8192, 32768)
RANDOM_SHAPES = 6  # log-uniform rows 1..65536 and hidden 64..65536, any integer
# per tensor: 512 MB of bf16, so every input and output of a point fits beside the rest
MAX_ELEMENTS = 1 << 28
JUDGED_BYTES = 1 * MB  # the bar applies above this much traffic


def sweepable(op: str, per_batch: bool = False) -> bool:
    """Whether (rows, hidden) names a shape of the op (no integer params), with broadcast inputs to hold per
    batch where ``per_batch``."""
    spec = load_spec(op)
    return all(not p.integer for p in spec.params) and (
        not per_batch or any(t.broadcast for t in spec.inputs)
    )


def sweep_cases(op: str, per_batch: bool = False, seed: int = 0) -> list[Case]:
    """The grid (points over MAX_ELEMENTS left out), then RANDOM_SHAPES seeded random points."""
    if per_batch and not any(t.broadcast for t in load_spec(op).inputs):
        raise UsageError(f"--per-batch: {op} has no broadcast inputs to hold per batch")
    if not sweepable(op):
        raise UsageError(
            f"{op} takes integer params (a latent grid's sizes): a (rows, hidden) pair names no shape of it, "
            "so --sweep does not cover it"
        )
    grid = [(r, h) for r in ROWS for h in HIDDEN if r * h <= MAX_ELEMENTS]
    rng = random.Random(seed)
    extra = []
    while len(extra) < RANDOM_SHAPES:
        if (shape := random_shape(rng)) not in grid + extra:
            extra.append(shape)
    return [Case((1, r, h), per_batch) for r, h in grid + extra]


def random_shape(rng: random.Random) -> tuple[int, int]:
    """(rows, hidden), log-uniform over 1…65536 rows and 64…65536 channels, any integers, within
    MAX_ELEMENTS."""
    while True:
        rows, hidden = round(2 ** rng.uniform(0, 16)), round(2 ** rng.uniform(6, 16))
        if rows * hidden <= MAX_ELEMENTS:
            return rows, hidden


def stem(op: str, per_batch: bool) -> str:
    return f"{op}-sweep" + ("-per-batch" if per_batch else "")


def ratio(row: dict) -> float | None:
    return row["best_peer_over_kgen"]


def judged(row: dict) -> bool:
    return row["min_bytes"] > JUDGED_BYTES and ratio(row) is not None


def markdown(result: dict) -> str:
    """The grid as a rows × hidden table of best peer / kgen (a miss in bold with ✗, an unjudged point in
    parentheses), the random points as a list, and the tally."""
    by_shape = {tuple(r["shape"][1:]): r for r in result["rows"]}
    hidden = [h for h in HIDDEN if any((r, h) in by_shape for r in ROWS)]

    def cell(row: dict | None) -> str:
        if row is None or ratio(row) is None:
            return "-"
        text = f"{ratio(row):.2f}"
        if not judged(row):
            return f"({text})"
        return text if ratio(row) >= 1 else f"**{text}** ✗"

    lines = [
        f"{result['op']}{' (per batch)' if result.get('per_batch') else ''}, {result['dtype']}, "
        f"{result['device']} ({result['arch']}), torch {result['torch']}, {result['date']}; median of "
        f"{result['rounds']} rounds of {result['repeats']} runs, L2 flushed. Best peer / kgen (> 1: kgen "
        f"faster) at [1, rows, hidden]; in parentheses: {JUDGED_BYTES / MB:g} MB moved or less (not judged).",
        "",
        "| rows \\ hidden | " + " | ".join(map(str, hidden)) + " |",
        "|---" * (len(hidden) + 1) + "|",
    ]
    for r in ROWS:
        lines.append(f"| {r} | " + " | ".join(cell(by_shape.get((r, h))) for h in hidden) + " |")
    grid = {(r, h) for r in ROWS for h in HIDDEN}
    extra = [row for shape, row in by_shape.items() if shape not in grid]
    if extra:
        lines += [
            "",
            "| random shape | MB moved | kgen µs | best peer µs | best peer / kgen |",
            "|---" * 5 + "|",
        ]
        for row in extra:
            peers = {n: t for n, t in row["times_us"].items() if n != "kgen"}
            best = min(peers, key=peers.get)
            lines.append(
                f"| {row['label']} | {row['min_bytes'] / MB:.1f} | {row['times_us']['kgen']:.1f} | "
                f"{peers[best]:.1f} ({best}) | {cell(row)} |"
            )
    scored = [row for row in result["rows"] if judged(row)]
    misses = [row for row in scored if ratio(row) < 1]
    worst = min(scored, key=ratio, default=None)
    lines += [
        "",
        f"At or under the best peer at {len(scored) - len(misses)} of {len(scored)} points moving more than "
        f"{JUDGED_BYTES / MB:g} MB" + (f"; worst {ratio(worst):.2f} at {worst['label']}." if worst else "."),
    ]
    return "\n".join(lines) + "\n"


def heatmap(result: dict, path: Path) -> None:
    """best peer / kgen over the grid, green where kgen is faster, red where a peer is; unjudged points
    hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    by_shape = {tuple(r["shape"][1:]): r for r in result["rows"]}
    values = np.full((len(ROWS), len(HIDDEN)), np.nan)
    fig, ax = plt.subplots(figsize=(1.1 * len(HIDDEN) + 2, 0.6 * len(ROWS) + 2))
    for i, r in enumerate(ROWS):
        for j, h in enumerate(HIDDEN):
            row = by_shape.get((r, h))
            if row is None or ratio(row) is None:
                continue
            values[i, j] = ratio(row)
            ax.text(j, i, f"{ratio(row):.2f}", ha="center", va="center", fontsize=8)
            if not judged(row):
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", alpha=0.4))
    finite = values[np.isfinite(values)]
    spread = max(1.25, finite.max(initial=1.0), 1 / finite.min(initial=1.0))
    image = ax.imshow(values, cmap="RdYlGn", norm=TwoSlopeNorm(1.0, 1 / spread, spread), aspect="auto")
    ax.set_xticks(range(len(HIDDEN)), [str(h) for h in HIDDEN])
    ax.set_yticks(range(len(ROWS)), [str(r) for r in ROWS])
    ax.set(
        xlabel="hidden",
        ylabel="rows",
        title=f"{result['op']}{' per batch' if result.get('per_batch') else ''}: best peer / kgen "
        f"({result['device']}, {result['date']}; hatched: ≤ {JUDGED_BYTES / MB:g} MB, not judged)",
    )
    fig.colorbar(image, ax=ax, label="best peer / kgen (> 1: kgen faster)")
    fig.savefig(path, **PNG)
    plt.close(fig)


def run_sweep(op: str, *, out: Path, per_batch: bool = False, seed: int = 0, **bench) -> dict:
    """Times the sweep with `kgen.bench.run_bench` (``bench``: its keyword arguments), then writes
    OUT/<op>-sweep[-per-batch].{json,md,png} (the heatmap; the GB/s plot as -bandwidth.png)."""
    from .bench import run_bench

    name = stem(op, per_batch)
    cases = sweep_cases(op, per_batch, seed)
    result = run_bench(op, out=out, cases=cases, stem=name, skip_refused=True, **bench)
    result |= {"per_batch": per_batch, "seed": seed}
    (out / f"{name}.png").rename(out / f"{name}-bandwidth.png")
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown(result))
    heatmap(result, out / f"{name}.png")
    return result

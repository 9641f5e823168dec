"""Hardware counters (Nsight Compute) for kgen's kernel at every benchmark shape of the given ops, so a missed
bar can be explained by measurement: DRAM bytes moved against the bytes counted, DRAM throughput, achieved
against theoretical occupancy, waves, registers, instructions. With --peer, the op's torch.compile peer (as
kgen bench compiles it: its first peer, afresh per shape, dynamic=False) at the same shapes, for the misses
against it; --shapes keeps the shapes whose label holds one of the given texts; --backward adds each op's
derived backward (called directly, as scripts/variants.py calls it: its kernels, no autograd).

python3 scripts/ncu_counters.py rmsnorm rope3d --build-dir /tmp/kgen-build --out ncu.md
python3 scripts/ncu_counters.py rmsnorm --peer --shapes 1×128×4096 "2048×4096" --out ncu-peers.md
python3 scripts/ncu_counters.py qk_norm_rope_wan --extra sm__throughput.avg.pct_of_peak_sustained_elapsed
python3 scripts/ncu_counters.py qk_norm_rope3d --backward --shapes 2×2688×2048 --out ncu-backward.md

runs itself under `ncu --clock-control none` (clocks are left as they are; caches are flushed before each
replay, as the benchmark flushes L2) and profiles only the launch between cudaProfilerStart/Stop of each
shape."""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

METRICS = {  # metric -> (column, the factor from ncu's base unit: ns, bytes, counts)
    "gpu__time_duration.sum": ("µs", 1e-3),
    "dram__bytes_read.sum": ("DRAM read MB", 1e-6),
    "dram__bytes_write.sum": ("DRAM write MB", 1e-6),
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("DRAM % peak", 1),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("achieved occupancy %", 1),
    "sm__maximum_warps_per_active_cycle_pct": ("theoretical occupancy %", 1),
    "launch__waves_per_multiprocessor": ("waves", 1),
    "launch__registers_per_thread": ("registers", 1),
    "launch__grid_size": ("blocks", 1),
    "launch__block_size": ("threads", 1),
    "smsp__inst_executed.sum": ("instructions (M)", 1e-6),
    "lts__t_sector_hit_rate.pct": ("L2 hit %", 1),
    "l1tex__t_sector_hit_rate.pct": ("L1 hit %", 1),
}


def child(
    ops: list[str], build_dir: Path, labels_path: Path, peer: bool, shapes: list[str], backward: bool
) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kgen.bench import example_inputs
    from kgen.builder import build_op, device_arch, load
    from kgen.catalog import backward_spec, load_spec, suite

    labels = []

    def profiled(label: str, fn) -> None:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        torch.cuda._sleep(1)  # a marker kernel: the kernels up to the next marker are this call's
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        labels.append(label)

    for op in ops:
        lib = load(build_op(op, device_arch(), build_dir))
        derived = backward_spec(op) if backward else None
        for case, spec in [(c, s) for c in suite(op) for s in (load_spec(op), derived) if s is not None]:
            if shapes and not any(text in case.label for text in shapes):
                continue
            # the op's Python function; its backward's registered op
            kernel = getattr(lib, op) if spec.name == op else getattr(lib._ops.ops, spec.name)
            params = case.param_values(spec)
            inputs = example_inputs(
                spec, case.shape, torch.bfloat16, per_batch=case.per_batch, k_heads=case.k_heads
            )
            outputs = kernel(*inputs, *params)
            counted = sum(
                t.numel() * t.element_size()
                for t in [*inputs, *(outputs if isinstance(outputs, tuple) else [outputs])]
            )
            label = {"op": spec.name, "shape": case.label, "counted": counted}
            profiled(json.dumps(label | {"impl": "kgen"}), lambda: kernel(*inputs, *params))
            if peer and spec.peers and spec.name == op:
                torch._dynamo.reset()
                compiled = torch.compile(next(iter(spec.peers.values())), dynamic=False)
                profiled(json.dumps(label | {"impl": "torch.compile"}), lambda: compiled(*inputs, *params))
    labels_path.write_text("\n".join(labels) + "\n")


MARKER = "spin_kernel"  # torch.cuda._sleep's kernel, launched first in each profiled call


def calls(kernels: list[dict]) -> list[dict]:
    """The kernels between markers, one dict per profiled call: durations, DRAM bytes and instructions summed
    over its kernels, the other counters the longest kernel's, and how many kernels it launched."""
    out: list[list[dict]] = []
    for k in kernels:
        if MARKER in k["kernel"]:
            out.append([])
        elif out:
            out[-1].append(k)
    summed = (
        "gpu__time_duration.sum",
        "dram__bytes_read.sum",
        "dram__bytes_write.sum",
        "smsp__inst_executed.sum",
    )
    merged = []
    for group in out:
        longest = max(group, key=lambda k: k.get("gpu__time_duration.sum", 0.0), default={})
        sums = {m: sum(k.get(m, 0.0) for k in group) for m in summed}
        merged.append(longest | sums | {"kernels": len(group)})
    return merged


def parse(csv_text: str) -> list[dict]:
    """ncu's CSV (one row per kernel and metric) as one dict of metric -> value per kernel, in order."""
    start = csv_text.find('"ID"')
    kernels: dict[int, dict] = defaultdict(dict)
    for row in csv.DictReader(io.StringIO(csv_text[start:])):
        value = row["Metric Value"].replace(",", "")
        try:
            kernels[int(row["ID"])][row["Metric Name"]] = float(value)
        except ValueError:
            kernels[int(row["ID"])][row["Metric Name"]] = value
        kernels[int(row["ID"])]["kernel"] = row["Kernel Name"]
    return [kernels[i] for i in sorted(kernels)]


def table(rows: list[dict], metrics: dict = METRICS) -> str:
    head = ["op", "shape", "impl", "kernels", "MB counted", *(column for column, _ in metrics.values())]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["op"], r["shape"], r["impl"], str(r["kernels"]), f"{r['counted'] / 1e6:.1f}"]
        for metric, (_, factor) in metrics.items():
            v = r.get(metric)
            cells.append(f"{v * factor:.3g}" if isinstance(v, float) else str(v or ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ops", nargs="+")
    parser.add_argument("--build-dir", type=Path, default=Path("build/bench"))
    parser.add_argument("--out", type=Path, default=Path("ncu.md"))
    parser.add_argument("--peer", action="store_true", help="also the op's torch.compile peer")
    parser.add_argument("--shapes", nargs="+", default=[], help="only shapes whose label holds one of these")
    parser.add_argument("--backward", action="store_true", help="also each op's derived backward")
    parser.add_argument(
        "--extra",
        nargs="+",
        default=[],
        help="more ncu metrics, each a column of its raw value (e.g. a pipe's use)",
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    metrics = METRICS | {m: (m, 1) for m in args.extra}
    if args.child:
        return child(args.ops, args.build_dir, args.child, args.peer, args.shapes, args.backward)
    labels_path = args.out.with_suffix(".labels")
    cmd = [
        "ncu",
        "--clock-control",
        "none",
        "--profile-from-start",
        "off",
        "--print-units",
        "base",
        "--csv",
        "--metrics",
        ",".join(metrics),
        sys.executable,
        __file__,
        *args.ops,
        "--build-dir",
        str(args.build_dir),
        *(["--peer"] if args.peer else []),
        *(["--backward"] if args.backward else []),
        *(["--shapes", *args.shapes] if args.shapes else []),
        "--child",
        str(labels_path),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True)
    args.out.with_suffix(".ncu.csv").write_text(run.stdout)
    if run.returncode != 0:
        sys.exit(f"ncu failed ({run.returncode}):\n{run.stderr[-3000:]}\n{run.stdout[-3000:]}")
    kernels = calls(parse(run.stdout))
    labels = labels_path.read_text().splitlines()
    if len(kernels) != len(labels) or not all(k["kernels"] for k in kernels):
        sys.exit(
            f"{len(kernels)} calls profiled for {len(labels)} launches; see "
            f"{args.out.with_suffix('.ncu.csv')}"
        )
    rows = []
    for label, k in zip(labels, kernels):
        rows.append(json.loads(label) | k)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    args.out.write_text(table(rows, metrics))
    print(table(rows, metrics))


if __name__ == "__main__":
    main()

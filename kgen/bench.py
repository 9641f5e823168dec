"""`kgen bench`: the generated kernel against the implementations users run today, on this GPU.

Method (the standard of BENCHMARKS.md): CUDA events around each run, L2 flushed before each run
(a 256 MB write), warm-up first, the median of `repeats` runs; the whole comparison (every
implementation in turn) is repeated `rounds` times and each figure is the median of its rounds.
With `graphs`, each implementation is captured once in a CUDA graph and the replay is timed, which
takes host overhead out of small shapes. Effective bandwidth = minimum bytes (each input read once,
each output written once) / median time, next to what the same run measured: a 4 GiB-traffic copy
(the ceiling), a copy of the shape's own traffic and an empty launch."""

from __future__ import annotations

import datetime
import json
import platform
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .catalog import load_spec, suite, suite_table
from .dsl import OpSpec, Tensor
from .errors import UsageError
from .families import family_of
from .families.base import Case

LARGE_COPY_BYTES = 4 << 30  # traffic (read + write) of the ceiling copy
L2_FLUSH_BYTES = 256 << 20
MB = 1e6


def bars(row: dict, empty_us: float, compiled: str | None, vs_compile: float | None) -> dict[str, bool]:
    """The speed-of-light bars (BENCHMARKS.md, "The bars") that apply to one measured shape."""
    kgen, out = row["times_us"]["kgen"], {}
    if row["best_peer_over_kgen"] is not None:
        out["<= best peer"] = row["best_peer_over_kgen"] >= 1
    if row["min_bytes"] >= 256 * MB:
        out[">= 90 % of 4 GiB copy"] = row["kgen_pct_large_copy"] >= 90
    elif row["min_bytes"] >= 32 * MB:
        out[">= 95 % of same-size copy"] = row["kgen_pct_same_copy"] >= 95
    elif row["min_bytes"] < 4 * MB:
        out["<= 1.1x empty launch"] = kgen <= 1.1 * empty_us
    if vs_compile and compiled:
        out[f"<= {vs_compile:g}x torch.compile"] = kgen <= vs_compile * row["times_us"][compiled]
    return out


def tensor_shape(
    spec: OpSpec, tensor: Tensor, shape, per_batch: bool = False, k_heads: int | None = None
) -> tuple[int, ...]:
    """The shape of the spec's tensor when the op's outputs (a rotary op's lead tensor) have ``shape``."""
    return family_of(spec).tensor_shape(spec, tensor, Case(tuple(shape), per_batch, (), k_heads))


def example_inputs(
    spec,
    shape,
    dtype,
    *,
    per_batch: bool = False,
    k_heads: int | None = None,
    generator=None,
    magnitude: float = 1.0,
    present: dict[str, bool] | None = None,
) -> list:
    """Fresh random inputs (normal, times ``magnitude``; float32 tensors in float32) for the op at
    ``shape``; None for the optional inputs that ``present`` leaves out."""
    import torch

    return [
        None
        if t.optional and not (present or {}).get(t.name, True)
        else (
            torch.randn(tensor_shape(spec, t, shape, per_batch, k_heads), generator=generator, device="cuda")
            * magnitude
        ).to(torch.float32 if t.dtype == "float32" else dtype)
        for t in spec.inputs
    ]


class Timer:
    def __init__(self, torch, repeats: int, graphs: bool = False):
        self.torch, self.repeats, self.graphs = torch, repeats, graphs
        self.flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        self.captured: dict = {}  # fn -> its graph's replay (captured once per fn)

    def median_us(self, fn, graphs: bool | None = None) -> float:
        torch = self.torch
        for _ in range(5):
            fn()
        if self.graphs if graphs is None else graphs:
            if fn not in self.captured:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn()
                self.captured[fn] = graph.replay
            fn = self.captured[fn]
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.repeats)]
        for start, end in zip(starts, ends):
            self.flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
        return times[len(times) // 2]

    def copy_us(self, traffic_bytes: int) -> float:
        """Always timed with events: captured in a graph, the copy is a memcpy node that ran on the
        copy engines at 2.8 TB/s against 4.3 TB/s (H200), no ceiling for kernels."""
        src = self.torch.empty(max(1, traffic_bytes // 2), dtype=self.torch.uint8, device="cuda")
        dst = self.torch.empty_like(src)
        return self.median_us(lambda: dst.copy_(src), graphs=False)

    def rounds_us(self, fns: dict, rounds: int) -> dict[str, list[float]]:
        """Each implementation's median per round, implementations interleaved within a round."""
        times = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                times[name].append(self.median_us(fn))
        return times


def run_bench(
    op: str,
    *,
    out: Path,
    repeats: int,
    build_root: Path,
    console: Console,
    dtype: str = "bfloat16",
    rounds: int = 3,
    graphs: bool = False,
) -> dict:
    import torch

    from .builder import build_op, device_arch, load

    if not torch.cuda.is_available():
        raise UsageError("kgen bench needs a CUDA device")
    spec = load_spec(op)
    arch = device_arch()
    console.print(f"building {op} for {arch} ...")
    kernel = getattr(load(build_op(op, arch, build_root)), op)
    torch_dtype = getattr(torch, dtype)
    timer = Timer(torch, repeats, graphs)
    peers = dict(spec.peers)
    compiled_name = f"torch.compile({next(iter(peers))})" if peers else None
    large_copy = statistics.median(timer.copy_us(LARGE_COPY_BYTES) for _ in range(rounds))
    ceiling = LARGE_COPY_BYTES / large_copy / 1e3
    tiny = torch.empty(1, device="cuda")
    empty = statistics.median(timer.rounds_us({"empty": lambda: tiny.zero_()}, rounds)["empty"])
    console.print(
        f"{torch.cuda.get_device_name()}: {LARGE_COPY_BYTES >> 30} GiB-traffic copy "
        f"{large_copy:.0f} µs = {ceiling:.0f} GB/s; empty launch {empty:.1f} µs"
        + ("; CUDA-graph replays" if graphs else "")
    )
    cases = suite(op)
    if not cases:
        raise UsageError(f"bench/shapes.toml has no shapes for {op!r}")
    vs_compile = suite_table(op).get("max_time_vs_compile")
    rows_out = []
    for case in cases:
        params = case.param_values(spec)
        inputs = example_inputs(spec, case.shape, torch_dtype, per_batch=case.per_batch, k_heads=case.k_heads)
        outputs = kernel(*inputs, *params)
        # each input read once, each output written once
        min_bytes = sum(
            t.numel() * t.element_size()
            for t in [*inputs, *(outputs if isinstance(outputs, tuple) else [outputs])]
        )
        del outputs
        same_copy = timer.copy_us(min_bytes)
        fns = {"kgen": lambda: kernel(*inputs, *params)}
        for name, fn in list(peers.items()):
            try:
                fn(*inputs, *params)
            except ModuleNotFoundError as err:  # an optional peer library (Liger) that is not installed
                console.print(f"skipping peer {name!r}: {err}")
                peers.pop(name)
                continue
            fns[name] = lambda fn=fn: fn(*inputs, *params)
        if compiled_name:
            # A fresh compile per shape (dynamic=False: a kernel specialised to it, torch.compile's best
            # case) whose guards see one entry: reusing one compiled function across the suite piled up
            # recompiled entries and its host overhead showed in the timings.
            torch._dynamo.reset()
            compiled = torch.compile(next(iter(spec.peers.values())), dynamic=False)
            fns[compiled_name] = lambda: compiled(*inputs, *params)
        per_round = timer.rounds_us(fns, rounds)
        timer.captured.clear()
        times = {name: statistics.median(t) for name, t in per_round.items()}
        best_peer = min(t for name, t in times.items() if name != "kgen") if len(times) > 1 else None
        row = {
            "shape": list(case.shape),
            "label": case.label,
            "min_bytes": min_bytes,
            "copy_same_us": same_copy,
            "times_us": times,
            "rounds_us": per_round,
            "kgen_gbs": min_bytes / times["kgen"] / 1e3,
            "kgen_pct_large_copy": 100 * min_bytes / times["kgen"] / 1e3 / ceiling,
            "kgen_pct_same_copy": 100 * same_copy / times["kgen"],
            "best_peer_over_kgen": best_peer / times["kgen"] if best_peer else None,
        }
        row["bars"] = bars(row, empty, compiled_name, vs_compile)
        rows_out.append(row)
    result = {
        "op": op,
        "dtype": dtype,
        "device": torch.cuda.get_device_name(),
        "arch": arch,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "host": platform.node(),
        "repeats": repeats,
        "rounds": rounds,
        "mode": "graphs" if graphs else "events",
        "large_copy_us": large_copy,
        "large_copy_gbs": ceiling,
        "empty_launch_us": empty,
        "rows": rows_out,
    }
    out.mkdir(parents=True, exist_ok=True)
    stem = op + ("-graphs" if graphs else "")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(result))
    plot(result, out / f"{stem}.png")
    table = Table(title=f"{op} {dtype} on {result['device']} (median µs, {result['mode']})")
    names = list(rows_out[0]["times_us"])
    for col in [
        "shape",
        "MB",
        *names,
        "kgen GB/s",
        "% 4GiB copy",
        "% same copy",
        "best peer / kgen",
        "bars missed",
    ]:
        table.add_column(col, justify="right")
    for r in rows_out:
        table.add_row(
            r["label"],
            f"{r['min_bytes'] / MB:.1f}",
            *[f"{r['times_us'][n]:.1f}" for n in names],
            f"{r['kgen_gbs']:.0f}",
            f"{r['kgen_pct_large_copy']:.0f}",
            f"{r['kgen_pct_same_copy']:.0f}",
            f"{r['best_peer_over_kgen']:.2f}" if r["best_peer_over_kgen"] else "-",
            _missed(r),
        )
    console.print(table)
    return result


def _missed(row: dict) -> str:
    return "; ".join(name for name, ok in row.get("bars", {}).items() if not ok) or "none"


def summary(results: list[dict]) -> str:
    """One line per op and shape over every op benchmarked: what `kgen bench --all` writes."""
    lines = [
        "| op | shape | MB moved | kgen µs | best peer µs | best peer / kgen | % of 4 GiB copy "
        "| % of same-size copy | bars missed |",
        "|---" * 9 + "|",
    ]
    met = total = 0
    for result in results:
        for r in result["rows"]:
            peers = {n: t for n, t in r["times_us"].items() if n != "kgen"}
            best = min(peers, key=peers.get) if peers else None
            met += all(r["bars"].values())
            total += 1
            lines.append(
                f"| {result['op']} | {r['label']} | {r['min_bytes'] / MB:.1f} | {r['times_us']['kgen']:.1f} "
                f"| "
                + (f"{peers[best]:.1f} ({best})" if best else "-")
                + f" | {r['best_peer_over_kgen'] or 0:.2f} | {r['kgen_pct_large_copy']:.0f} | "
                f"{r['kgen_pct_same_copy']:.0f} | {_missed(r)} |"
            )
    first = results[0]
    head = (
        f"{first['dtype']}, {first['device']} ({first['arch']}), torch {first['torch']}, {first['date']}, "
        f"{first['mode']}; median of {first['rounds']} rounds of {first['repeats']} runs. "
        f"Every bar met at {met} of {total} shapes."
    )
    return head + "\n\n" + "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    """Effective GB/s against bytes moved, one line per implementation, with the same-size copies
    and the 4 GiB-copy ceiling measured in the same run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(result["rows"], key=lambda r: r["min_bytes"])
    mb = [r["min_bytes"] / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for name in rows[0]["times_us"]:
        # markers only: shapes of different hidden sizes can move the same bytes
        ax.plot(
            mb,
            [r["min_bytes"] / r["times_us"][name] / 1e3 for r in rows],
            linestyle="none",
            label=name,
            marker="o" if name == "kgen" else "x",
            markersize=8 if name == "kgen" else 6,
        )
    ax.plot(
        mb, [r["min_bytes"] / r["copy_same_us"] / 1e3 for r in rows], "k--", label="copy_ of the same bytes"
    )
    ax.axhline(
        result["large_copy_gbs"],
        color="gray",
        linestyle=":",
        label=f"4 GiB copy_: {result['large_copy_gbs']:.0f} GB/s",
    )
    ax.set(
        xscale="log",
        xlabel="minimum bytes moved (MB)",
        ylabel="effective bandwidth (GB/s)",
        title=f"{result['op']} {result['dtype']} on {result['device']}, torch {result['torch']}, "
        f"{result['date']}",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def markdown(result: dict) -> str:
    names = list(result["rows"][0]["times_us"])
    lines = [
        f"{result['op']}, {result['dtype']}, {result['device']} ({result['arch']}), torch {result['torch']}, "
        f"{result['date']}; {result.get('mode', 'events')}, median of {result.get('rounds', 1)} rounds of "
        f"{result['repeats']} runs, L2 flushed; 4 GiB-traffic copy: {result['large_copy_us']:.0f} µs = "
        f"{result['large_copy_gbs']:.0f} GB/s; empty launch {result.get('empty_launch_us', 0):.1f} µs.",
        "",
        "| shape | MB moved | "
        + " | ".join(f"{n} µs" for n in names)
        + " | kgen GB/s | % of 4 GiB copy | % of same-size copy | best peer / kgen | bars missed |",
        "|---" * (len(names) + 7) + "|",
    ]
    for r in result["rows"]:
        ratio = f"{r['best_peer_over_kgen']:.2f}" if r["best_peer_over_kgen"] else "-"
        lines.append(
            f"| {r['label']} | {r['min_bytes'] / MB:.1f} | "
            + " | ".join(f"{r['times_us'][n]:.1f}" for n in names)
            + f" | {r['kgen_gbs']:.0f} | {r['kgen_pct_large_copy']:.0f} | {r['kgen_pct_same_copy']:.0f} | "
            f"{ratio} "
            f"| {_missed(r)} |"
        )
    return "\n".join(lines) + "\n"

"""`kgen bench`: the generated kernel against the implementations users run today, on this GPU.

Method (the standard of BENCHMARKS.md): CUDA events around each run, L2 flushed before each run
(a 256 MB write), warm-up first, the median of `repeats` runs; the whole comparison (every
implementation in turn) is repeated `rounds` times and each figure is the median of its rounds.
With `graphs`, each implementation is captured once in a CUDA graph and the replay is timed, which
takes host overhead out of small shapes. Effective bandwidth = minimum bytes (each input read once,
each output written once) / median time, next to what the same run measured: a 4 GiB-traffic copy
(the ceiling), a copy of the shape's own traffic and an empty launch.

With `backward`, each implementation runs under autograd: its backward alone (`torch.autograd.grad` on a
retained graph, so the autograd engine's own overhead is in every figure alike) and its forward + backward;
the minimum bytes are the backward's (the inputs and the outputs' gradients read, the inputs' gradients
written)."""

from __future__ import annotations

import datetime
import json
import platform
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .autodiff import gradient_name, gradient_outputs
from .bench_report import MB, implementations, markdown, missed, plot, summary, us
from .catalog import backward_spec, load_spec, op_names, suite, suite_table
from .dsl import OpSpec, Tensor
from .errors import UsageError
from .families import family_of
from .families.base import Case

WHERE_SHAPES_GO = (  # the end of the message for an op that no shapes file lists (catalog.shapes_files)
    "list them under [<op>] in bench/shapes.toml, or for a spec on $KGEN_OPS_PATH in a shapes.toml beside it"
)
LARGE_COPY_BYTES = 4 << 30  # traffic (read + write) of the ceiling copy
L2_FLUSH_BYTES = 256 << 20


def bars(
    row: dict, empty_us: float, compiled: str | None, vs_compile: float | None, backward: bool = False
) -> dict[str, bool]:
    """The speed-of-light bars (BENCHMARKS.md, "The bars") that apply to one measured shape. A backward's: at
    most the best peer, and 85 % of a same-size copy from 32 MB (its small shapes carry the autograd engine's
    overhead, as every peer's do)."""
    kgen, out = row["times_us"]["kgen"], {}
    if row["best_peer_over_kgen"] is not None:
        out["<= best peer"] = row["best_peer_over_kgen"] >= 1
    if backward:
        if row["min_bytes"] >= 32 * MB:
            out[">= 85 % of same-size copy"] = row["kgen_pct_same_copy"] >= 85
        return out
    if row["min_bytes"] >= 256 * MB:
        out[">= 90 % of 4 GiB copy"] = row["kgen_pct_large_copy"] >= 90
    elif row["min_bytes"] >= 32 * MB:
        out[">= 95 % of same-size copy"] = row["kgen_pct_same_copy"] >= 95
    elif row["min_bytes"] < 4 * MB:
        out["<= 1.1x empty launch"] = kgen <= 1.1 * empty_us
    if vs_compile and compiled in row["times_us"]:
        out[f"<= {vs_compile:g}x torch.compile"] = kgen <= vs_compile * row["times_us"][compiled]
    return out


def has_backward(op: str) -> bool:
    return backward_spec(op) is not None


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
    case = Case(tuple(shape), per_batch, (), k_heads)
    return family_of(spec).example_inputs(spec, case, dtype, generator, "cuda", magnitude, present)


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

    def gpu_us(self, fn, calls: int = 30) -> float:
        """The GPU time of one call: the durations of the kernels, copies and memsets it runs (torch.profiler,
        CUPTI), L2 flushed before each call, summed over ``calls`` calls and divided by them. Leaves out the
        host's time between launches, which event timing counts (the autograd engine's, 50–130 µs a backward
        call on the H200's host), and the flush (the only fill of uint8 elements)."""
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile

        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                self.flush.zero_()
                fn()
            torch.cuda.synchronize()
        total = sum(
            e.device_time
            for e in prof.events()
            if e.device_type.name == "CUDA"
            and not getattr(e, "is_user_annotation", False)  # a range around kernels, not one
            and "FillFunctor<unsigned char>" not in e.name
        )
        return total / calls

    def rounds_us(self, fns: dict, rounds: int) -> dict[str, list[float]]:
        """Each implementation's median per round, implementations interleaved within a round, the order
        rotated round by round (each round starts one later): at 5-20 µs the one timed first ran up to 0.6 µs
        apart from the same build timed second, either way (H100, bench/results/rows-h100-2026-12-05)."""
        times, names = {name: [] for name in fns}, list(fns)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                times[name].append(self.median_us(fns[name]))
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
    backward: bool = False,
    cases: list[Case] | None = None,
    stem: str | None = None,
    skip_refused: bool = False,
) -> dict:
    """Times ``cases`` (default: the op's suite; with ``skip_refused``, leaving out those the op refuses and
    a peer where it fails) and writes OUT/<stem>.{json,md,png} (default stem: the op, with -graphs and
    -backward as they apply)."""
    import torch

    from .builder import build_op, device_arch, load

    spec = load_spec(op)
    cases = suite(op) if cases is None else cases
    if not cases:
        raise UsageError(f"no benchmark shapes for {op!r}: {WHERE_SHAPES_GO}")
    if not torch.cuda.is_available():
        raise UsageError("kgen bench needs a CUDA device")
    if backward and graphs:
        raise UsageError("--backward times autograd, which CUDA-graph replays leave out: drop --graphs")
    if backward and not has_backward(op):
        raise UsageError(
            f"{op} has no backward kernels yet (kgen derives them for elementwise and rotary ops and for row "
            "reductions with no optional per-row input that does not broadcast)"
        )
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
    vs_compile = suite_table(op).max_time_vs_compile
    rows_out = []
    for case in cases:
        params = case.param_values(spec)
        inputs = example_inputs(spec, case.shape, torch_dtype, per_batch=case.per_batch, k_heads=case.k_heads)
        traffic = inputs
        if backward:  # the inputs that get a gradient require one (a rotary op's tables get none)
            back = backward_spec(op)
            gradients = gradient_outputs(spec, back)
            inputs = [t.requires_grad_(s.name in gradients) for t, s in zip(inputs, spec.inputs)]
            read = {t.name for t in back.inputs}
            traffic = [t for t, s in zip(inputs, spec.inputs) if s.name in read]
            # a gradient another input shares is written once
            traffic += [
                t for t, s in zip(inputs, spec.inputs) if gradients.get(s.name) == gradient_name(s.name)
            ]
        try:
            outputs = kernel(*inputs, *params)
        except ValueError as err:  # a shape the op refuses (a rotary op's odd last dim), in a sweep's grid
            if not skip_refused:
                raise
            console.print(f"{case.label}: refused by kgen ({str(err).splitlines()[0]})")
            continue
        # each input read once, each output written once; backward: the inputs and saved outputs it reads
        # and the outputs' gradients read, the inputs' gradients written
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        if backward:
            traffic += [o for o, s in zip(outputs, spec.outputs) if s.name in read]
        min_bytes = sum(t.numel() * t.element_size() for t in [*traffic, *outputs])
        del outputs
        same_copy = timer.copy_us(min_bytes)
        # every implementation, called with the inputs (params bound)
        calls = {"kgen": lambda *a: kernel(*a, *params)}
        for name, fn in list(peers.items()):
            try:
                fn(*inputs, *params)
            except ModuleNotFoundError as err:  # an optional peer library (Liger) that is not installed
                console.print(f"skipping peer {name!r}: {err}")
                peers.pop(name)
                continue
            except Exception as err:  # a sweep's shape a peer cannot run (its compiled form neither)
                if not skip_refused:
                    raise
                console.print(f"{case.label}: {name} failed ({type(err).__name__}), left out here")
                continue
            calls[name] = lambda *a, fn=fn: fn(*a, *params)
        if compiled_name and next(iter(spec.peers)) in calls:
            # A fresh compile per shape (dynamic=False: a kernel specialised to it, torch.compile's best
            # case) whose guards see one entry: reusing one compiled function across the suite piled up
            # recompiled entries and its host overhead showed in the timings.
            torch._dynamo.reset()
            compiled = torch.compile(next(iter(spec.peers.values())), dynamic=False)
            calls[compiled_name] = lambda *a: compiled(*a, *params)
        both = {}
        if backward:
            fns, both = autograd_timings(
                torch,
                calls,
                inputs,
                lambda name, err: console.print(f"skipping {name!r} (backward failed: {err})"),
            )
        else:
            fns = {name: lambda call=call: call(*inputs) for name, call in calls.items()}
        per_round = timer.rounds_us(fns | {f"{name} fwd+bwd": fn for name, fn in both.items()}, rounds)
        timer.captured.clear()
        medians = {name: statistics.median(t) for name, t in per_round.items()}
        times = {name: medians[name] for name in fns}
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
        if backward:
            row["gpu_us"] = {name: timer.gpu_us(fn) for name, fn in fns.items()}
            peers_gpu = [t for name, t in row["gpu_us"].items() if name != "kgen"]
            row["gpu_best_peer_over_kgen"] = min(peers_gpu) / row["gpu_us"]["kgen"] if peers_gpu else None
            row["kgen_gpu_pct_same_copy"] = 100 * same_copy / row["gpu_us"]["kgen"]
            row["fwd_bwd_us"] = {name: medians[f"{name} fwd+bwd"] for name in both}
            peers_both = [t for name, t in row["fwd_bwd_us"].items() if name != "kgen"]
            row["fwd_bwd_best_peer_over_kgen"] = (
                min(peers_both) / row["fwd_bwd_us"]["kgen"] if peers_both else None
            )
        row["bars"] = bars(row, empty, compiled_name, vs_compile, backward)
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
        "direction": "backward" if backward else "forward",
        "large_copy_us": large_copy,
        "large_copy_gbs": ceiling,
        "empty_launch_us": empty,
        "rows": rows_out,
    }
    out.mkdir(parents=True, exist_ok=True)
    stem = stem or op + ("-graphs" if graphs else "") + ("-backward" if backward else "")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(result))
    plot(result, out / f"{stem}.png")
    table = Table(
        title=f"{op} {dtype} on {result['device']} (median µs, {result['mode']}"
        + (", backward alone; its GPU time and fwd+bwd in the .md)" if backward else ")")
    )
    names = implementations(rows_out)
    for col in [
        "shape",
        "MB",
        *names,
        "kgen GB/s",
        "% 4GiB copy",
        "% same copy",
        "best peer / kgen",
        *(["kgen GPU µs", "best peer / kgen (GPU)"] if backward else []),
        "bars missed",
    ]:
        table.add_column(col, justify="right")
    for r in rows_out:
        table.add_row(
            r["label"],
            f"{r['min_bytes'] / MB:.1f}",
            *[us(r["times_us"], n) for n in names],
            f"{r['kgen_gbs']:.0f}",
            f"{r['kgen_pct_large_copy']:.0f}",
            f"{r['kgen_pct_same_copy']:.0f}",
            f"{r['best_peer_over_kgen']:.2f}" if r["best_peer_over_kgen"] else "-",
            *([f"{r['gpu_us']['kgen']:.1f}", f"{r['gpu_best_peer_over_kgen'] or 0:.2f}"] if backward else []),
            missed(r),
        )
    console.print(table)
    return result


def run_suite(ops: list[str], *, out: Path, graphs: bool, backward: bool, **options) -> Path:
    """`run_bench` for each op (those with a backward, with ``backward``), then OUT/SUMMARY[-graphs]
    [-backward].md over every op's results in OUT; returns its path."""
    ops = [n for n in ops if not backward or has_backward(n)]
    if len(ops) > 1 and (unlisted := [n for n in ops if not suite(n)]):
        options["console"].print(f"no benchmark shapes for {', '.join(unlisted)}, skipped: {WHERE_SHAPES_GO}")
        ops = [n for n in ops if n not in unlisted]
    for i, name in enumerate(ops, 1):
        if len(ops) > 1:
            options["console"].rule(f"{name} ({i}/{len(ops)})")
        run_bench(name, out=out, graphs=graphs, backward=backward, **options)
    suffix = ("-graphs" if graphs else "") + ("-backward" if backward else "")
    results = [
        json.loads(p.read_text()) for p in (out / f"{n}{suffix}.json" for n in op_names()) if p.is_file()
    ]
    path = out / f"SUMMARY{suffix}.md"
    path.write_text(summary([r for r in results if "bars" in r["rows"][0]]))  # this harness's
    return path


def autograd_timings(torch, fns: dict, inputs: list, skip) -> tuple[dict, dict]:
    """Each forward callable (called with the inputs) as two: its backward alone (autograd.grad on a graph
    recorded once and retained) and its forward + backward. Each implementation gets its own copy of the
    inputs (Liger's backward writes its gradients into the saved inputs) and fresh random output gradients.
    One whose backward fails is left out, with ``skip(name, error)``."""
    alone, both = {}, {}
    for name, fn in fns.items():
        own = [
            t.detach().clone().requires_grad_() if t is not None and t.requires_grad else t for t in inputs
        ]
        leaves = [t for t in own if t is not None and t.requires_grad]
        try:
            outs = fn(*own)
            outs = outs if isinstance(outs, tuple) else (outs,)
            grads = [torch.randn_like(o) for o in outs]
            torch.autograd.grad(outs, leaves, grads, retain_graph=True)
        except (RuntimeError, ValueError, TypeError) as err:
            skip(name, err)
            continue
        alone[name] = lambda outs=outs, leaves=leaves, grads=grads: torch.autograd.grad(
            outs, leaves, grads, retain_graph=True
        )
        both[name] = lambda fn=fn, own=own, leaves=leaves, grads=grads: torch.autograd.grad(
            fn(*own), leaves, grads
        )
    return alone, both

"""Whole-model timing (`kgen bench --e2e ltx|ltx-train|flux|wan|wan-train|qwen3|qwen3-train|llama`): each
workload (kgen.integrations.workloads) as eager, eager + kgen, torch.compile and torch.compile + kgen (and
Liger-Kernel where a training workload has it), on one set of random weights, median of the rounds' medians,
the variants interleaved within a round. A training workload also reports each variant's peak memory of one
step: the most allocated above what was allocated when the step began, its gradients freed (activations,
gradients and workspaces; the weights excluded). With ``profile``, one more call of each variant runs under
torch.profiler and the report adds its kernel table: GPU time in matrix products and attention against
everything else (the memory-bound kernels kgen competes with), and the costliest of the latter. On a GPU with
nvidia-smi, each variant's mean SM clock and power while it was timed (gpu_clock), since a board at its power
limit runs a denser step at a lower clock."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Callable

from ..errors import KgenError
from .gpu_clock import sampler
from .workloads import BUILDERS, TRAINING

WARMUP = 3
PROFILE_TOP = 12  # memory-bound kernels listed per variant
# kernels that are matrix products or attention (cuBLAS, CUTLASS, flash / memory-efficient attention)
MATMUL = re.compile(r"gemm|nvjet|cutlass|xmma|flash|fmha|attention|sdpa|cudnn", re.IGNORECASE)
VARIANTS = ("eager", "eager + kgen", "torch.compile", "torch.compile + kgen", "Liger")
# variant: (the variant it is compared with, the goal of their ratio of times)
GOALS = {"eager + kgen": ("eager", 1.10), "torch.compile + kgen": ("torch.compile", 1.03)}
TRAINING_GOALS = {
    "eager + kgen": ("eager", 1.15),
    "torch.compile + kgen": ("torch.compile", 1.03),
    "eager + kgen vs Liger": ("Liger", 1.0),
}


def _median_ms(torch, device: str, repeats: int, fn: Callable[[], object], grad: bool = False) -> float:
    """CUDA events on the GPU (a whole forward or step: no L2 flush needed), the wall clock on a CPU."""
    with torch.set_grad_enabled(grad):
        for _ in range(WARMUP):
            fn()
        times = []
        for _ in range(repeats):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                begin = time.perf_counter()
                fn()
                times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def _peak_gib(torch, model, fn: Callable[[], object]) -> float:
    """GiB allocated at most during one training step above the allocation when it began (gradients freed)."""
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def is_matmul(name: str) -> bool:
    """Whether a kernel is a matrix product or attention; a torch.compile Triton kernel only as a template (a
    fused one is named after every op in it: q/k norms fused in front of attention, `..._attention_...`)."""
    return name.startswith("triton_tem_") if name.startswith("triton_") else bool(MATMUL.search(name))


def _kernel_table(torch, fn: Callable[[], object], grad: bool) -> dict:
    """One call of ``fn`` under torch.profiler: {"matmul us", "other us", "span us", "kernels": [[name,
    calls, us], ...]} (every kernel, copy and memset, costliest first; "matmul us" sums the `is_matmul` ones;
    "span us" from the first kernel's start to the last one's end: beyond the sum, the GPU waited)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.set_grad_enabled(grad):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    kernels: dict[str, list] = {}
    spans = []
    for e in prof.events():
        if e.device_type.name == "CUDA" and not getattr(e, "is_user_annotation", False):
            entry = kernels.setdefault(e.name, [e.name, 0, 0.0])
            entry[1] += 1
            entry[2] += e.device_time
            spans.append((e.time_range.start, e.time_range.end))
    table = sorted(kernels.values(), key=lambda k: -k[2])
    matmul = sum(us for name, _, us in table if is_matmul(name))
    span = max(end for _, end in spans) - min(start for start, _ in spans) if spans else None
    other = sum(k[2] for k in table) - matmul
    return {"matmul us": matmul, "other us": other, "span us": span, "kernels": table}


def _smi_id(torch) -> str:
    """nvidia-smi's index of the current CUDA device (CUDA_VISIBLE_DEVICES renumbers torch's)."""
    index = torch.cuda.current_device()
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[index] if index < len(visible) else str(index)


def run_e2e(
    target: str,
    *,
    rounds: int = 3,
    repeats: int = 20,
    device: str = "cuda",
    config: dict | None = None,
    variants: tuple[str, ...] = VARIANTS,
    build_root: Path = Path("build/bench"),
    arch: str | None = None,
    profile: bool = False,
    compile_mode: str | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """{"target", "device", "torch", "rows": [{"workload", "<variant> ms", ...}]}. ``config`` replaces the
    real model's (a small model for tests). A variant the target has no model for (Liger where it is not
    installed or has no patch for the model) is left out, with a line in the log. ``profile`` (a GPU only)
    adds each row's "profile": {variant: _kernel_table}. ``compile_mode`` is torch.compile's mode for the
    compiled variants ("reduce-overhead": CUDA graphs, as decode is served)."""
    import torch

    if target not in BUILDERS:
        raise KgenError(f"--e2e takes one of {sorted(BUILDERS)}, got {target!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise KgenError("kgen bench --e2e needs a CUDA device")
    if config is None and device != "cuda":  # an 8B model and its kgen copy: 32 GB of weights on the host
        raise KgenError(
            f"--e2e {target}: the full-size model runs on a CUDA device; elsewhere a small config"
        )
    training = target in TRAINING
    torch.manual_seed(0)
    calls = rounds * (repeats + WARMUP) + 1  # a variant's calls of a workload, + 1: --profile's or the peak's
    models, workloads = BUILDERS[target](
        torch, device, config, dict(root=build_root, arch=arch, step=log), calls, log
    )
    for variant, base in (("torch.compile", "eager"), ("torch.compile + kgen", "eager + kgen")):
        if variant in variants:
            models[variant] = torch.compile(models[base], mode=compile_mode)
    variants = tuple(v for v in variants if v in models)
    goals = {
        name: [base, goal]
        for name, (base, goal) in (TRAINING_GOALS if training else GOALS).items()
        if name.split(" vs ")[0] in variants and base in variants
    }
    rows, clocks = [], sampler(device, _smi_id(torch) if device == "cuda" else "0")
    with clocks or contextlib.nullcontext():
        for workload, run in workloads.items():
            times, windows = {v: [] for v in variants}, {v: [] for v in variants}
            for i in range(rounds):
                for variant in variants:  # each logged when timed: a crash's log says how far the run got
                    step = functools.partial(run, models[variant])
                    times[variant].append(_median_ms(torch, device, repeats, step, grad=training))
                    end = time.monotonic()  # the timed runs' window (after the warm-up's, a compile's)
                    windows[variant].append((end - repeats * times[variant][-1] / 1e3, end))
                    log(f"{workload}: round {i + 1}/{rounds}, {variant} {times[variant][-1]:.2f} ms")
            row = {"workload": workload, **{f"{v} ms": statistics.median(t) for v, t in times.items()}}
            for name, (base, _) in goals.items():
                row[f"{name} speed-up"] = row[f"{base} ms"] / row[f"{name.split(' vs ')[0]} ms"]
            if clocks and (seen := {v: c for v in variants if (c := clocks.summary(windows[v]))}):
                row["clocks"] = seen
            if training and device == "cuda":
                for variant in variants:
                    with torch.enable_grad():
                        step = functools.partial(run, models[variant])
                        row[f"{variant} peak GiB"] = _peak_gib(torch, models[variant], step)
            rows.append(row)
    if profile and device == "cuda":
        _profile_rows(torch, rows, list(workloads.values()), models, variants, training, log)
    name = torch.cuda.get_device_name() if device == "cuda" else device
    return {
        "target": target,
        "device": name,
        "torch": torch.__version__,
        "rounds": rounds,
        "repeats": repeats,
        "date": time.strftime("%Y-%m-%d"),
        "compile mode": compile_mode,
        "goals": goals,
        "rows": rows,
    }


def _profile_rows(torch, rows, runs, models, variants, training, log) -> None:
    """Each row's kernel tables (--profile), after every row was timed: a call that fails (a kernel's assert
    leaves the CUDA context unusable) is recorded in its row and ends the profiling; the timings stand."""
    for row, run in zip(rows, runs):
        calls = {v: functools.partial(run, models[v]) for v in variants}
        try:
            row["profile"] = {v: _kernel_table(torch, call, training) for v, call in calls.items()}
        except Exception as error:  # noqa: BLE001 (any failure: the timings are written, the run exits 1)
            row["profile error"] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
            return log(
                f"{row['workload']}: the profiled call failed, the timings stand ({row['profile error']})"
            )


def markdown(result: dict) -> str:
    first = result["rows"][0]
    variants = [v for v in VARIANTS if f"{v} ms" in first]
    peaks = [v for v in variants if f"{v} peak GiB" in first]
    goals = result["goals"]
    head = [
        "workload",
        *(f"{v} ms" for v in variants),
        *(f"{name.split(' vs ')[0]} / {base} (goal ≥ {goal}×)" for name, (base, goal) in goals.items()),
        *(f"{v} peak GiB" + (" (goal ≤ eager's)" if "kgen" in v else "") for v in peaks),
    ]
    lines = [
        f"{result['target']}: {result['device']}, torch {result['torch']}, {result['date']}; median of "
        f"{result['rounds']} rounds of {result['repeats']} runs"
        + (f"; torch.compile mode {mode}." if (mode := result.get("compile mode")) else "."),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in result["rows"]:
        cells = [
            row["workload"],
            *(f"{row[f'{v} ms']:.2f}" for v in variants),
            *(f"{row[f'{name} speed-up']:.3f}" for name in goals),
            *(f"{row[f'{v} peak GiB']:.2f}" for v in peaks),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if clocked := [row for row in result["rows"] if row.get("clocks")]:
        lines += [
            "",
            "SM clock and power while each variant was timed (nvidia-smi every 100 ms; capped: the share of "
            "the samples with the board's power cap active):",
            "",
            "| workload | " + " | ".join(f"{v} MHz, W, capped" for v in variants) + " |",
            "|" + "---|" * (len(variants) + 1),
        ]
        for row in clocked:
            cells = [_clock_cell(row["clocks"].get(v)) for v in variants]
            lines.append(f"| {row['workload']} | " + " | ".join(cells) + " |")
    for row in result["rows"]:
        if "profile" in row:
            lines += _profile_markdown(row["workload"], row["profile"])
        if error := row.get("profile error"):
            lines += ["", f"No kernel table for {row['workload']}: the profiled call failed ({error})."]
    return "\n".join(lines) + "\n"


def _clock_cell(clock: dict | None) -> str:
    if clock is None:
        return "n/a"
    capped = "n/a" if clock["power capped"] is None else f"{clock['power capped']:.0%}"
    return f"{clock['SM MHz']:.0f}, {clock['W']:.0f}, {capped}"


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1e3:.2f}"


def _profile_markdown(workload: str, tables: dict) -> list[str]:
    lines = [
        "",
        f"Kernel time of one call, {workload} (torch.profiler):",
        "",
        "| variant | matmul + attention ms | other ms | kernels | first start to last end ms | GPU idle ms |",
        "|---|---|---|---|---|---|",
    ]
    for variant, t in tables.items():
        span = t.get("span us")  # absent from results written before it was recorded
        idle = None if span is None else span - t["matmul us"] - t["other us"]
        calls = sum(c for _, c, _ in t["kernels"])
        cells = [_ms(t["matmul us"]), _ms(t["other us"]), str(calls), _ms(span), _ms(idle)]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    for variant, t in tables.items():
        lines += ["", f"{variant}: costliest kernels other than matmul and attention", ""]
        lines += ["| kernel | calls | ms |", "|---|---|---|"]
        others = [k for k in t["kernels"] if not is_matmul(k[0])][:PROFILE_TOP]
        lines += [f"| `{name[:110]}` | {calls} | {us / 1e3:.3f} |" for name, calls, us in others]
    return lines


def write(result: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"e2e-{result['target']}" + ("-graphs" if result.get("compile mode") == "reduce-overhead" else "")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    path = out / f"{stem}.md"
    path.write_text(markdown(result))
    return path

"""`kgen tune`: the planner's candidate plans measured on this GPU, winners written to the arch's
tuning table (arch/tuning/<arch>.toml; a user's op: tuning/<arch>.toml beside its spec) that `kgen build`
and `kgen explain` read.

Candidates: the rule's threads per row (per block for elementwise and rotary ops) and half and
twice that, in every vector configuration the profile allows (register budget, at least one
access per thread, the ladder's widest step). Each candidate is one build; every build's output
is checked against the op's float64 reference before it is timed. The suite's shapes (bench/
shapes.toml) are grouped by the configuration the rule launches them with, and a configuration
takes a candidate only if it beats the rule on its shapes' summed medians by more than the table's margin
(2 %: run-to-run noise is ~1 %), and is no slower than the rule on shapes it was not tuned on: seeded random
[1, rows, hidden] shapes the rule launches in the same configuration (HELD_OUT each), for every op a (rows,
hidden) pair shapes (`kgen.sweep`)."""

from __future__ import annotations

import dataclasses
import datetime
import random
import statistics
from pathlib import Path

import tomllib
from rich.console import Console

from .bench import Timer, example_inputs
from .catalog import load_profile, load_spec, load_tuning, suite, tuning_file
from .errors import UsageError
from .families import family_of
from .families.base import Case
from .planner import plan_kernel, plan_launch
from .profile import TunedChoice, TuningTable
from .sweep import random_shape, sweepable

FACTORS = (0.5, 2)
HELD_OUT = 2  # random shapes per configuration that the winner is checked on, not chosen on


def candidates(op: str, arch: str, dtype: str) -> dict[str, list[TunedChoice]]:
    """name -> the choices of one candidate build (the rule's: none)."""
    spec, profile = load_spec(op), load_profile(arch)
    family, rule = family_of(spec), plan_kernel(spec, profile, dtype)
    out: dict[str, list[TunedChoice]] = {"rule": []}
    for factor in FACTORS:
        choices = [
            TunedChoice(
                op=op,
                dtype=dtype,
                max_row_bytes=b.max_row_bytes,
                threads=int(b.threads_per_row * factor),
                rule_threads=b.threads_per_row,
                shapes=[],
                rule_us=1,
                tuned_us=1,
            )
            for b in family.tunable(rule)
            if family.threads_allowed(spec, profile, rule, b, int(b.threads_per_row * factor))
        ]
        if choices:
            out[f"x{factor:g}"] = choices
    return out


def choose(measured: dict[int, float], rule: int, margin: float, held: dict[int, float]) -> int:
    """The threads to keep: the fastest on the tuned shapes if it beats the rule by more than ``margin``
    and is no slower than the rule on the held-out shapes (where there are any), else the rule's."""
    best = min(measured, key=measured.get)
    if measured[best] >= (1 - margin) * measured[rule]:
        return rule  # within noise of the rule
    return rule if held and held[best] > held[rule] else best  # else: fast on the tuned shapes only


def held_out_cases(op: str, arch: str, dtype: str, buckets: list, seed: int = 0) -> list[Case]:
    """HELD_OUT seeded random [1, rows, hidden] shapes per configuration in ``buckets`` (max_row_bytes)
    that the rule launches on its vector path; none for an op a (rows, hidden) pair does not shape."""
    spec, profile = load_spec(op), load_profile(arch)
    found: dict = {b: [] for b in buckets} if sweepable(op) else {}
    rng = random.Random(seed)
    for _ in range(5000):  # a configuration few random shapes fall in may get fewer than HELD_OUT
        if all(len(cases) >= HELD_OUT for cases in found.values()):
            break
        rows, hidden = random_shape(rng)
        bucket = plan_launch(spec, profile, dtype, (rows, hidden)).bucket
        cases = found.get(bucket.max_row_bytes)
        if bucket.vectorized and cases is not None and len(cases) < HELD_OUT:
            cases.append(Case((1, rows, hidden)))
    return [c for cases in found.values() for c in cases]


def tune(
    op: str, arch: str, dtype: str, *, build_root: Path, console: Console, repeats: int = 100, rounds: int = 3
) -> TuningTable:
    import torch

    from .builder import build_project, device_arch, write_project
    from .project import resolve_target
    from .render import SMOKE_TOLERANCE

    if not torch.cuda.is_available() or device_arch() != arch:
        raise UsageError(
            f"kgen tune {op} --arch {arch} needs a GPU that runs {arch} kernels as its newest arch"
        )
    spec, profile = load_spec(op), load_profile(arch)
    base = resolve_target(op, arch, (dtype,))
    table = TuningTable(
        arch=arch,
        device=torch.cuda.get_device_name(),
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
    )
    kernels, options = {}, candidates(op, arch, dtype)
    for name, choices in options.items():
        target = dataclasses.replace(base, tuning=table.model_copy(update={"choices": choices}))
        project = write_project(target, build_root / name)
        console.print(
            f"building candidate {name}: "
            + (
                ", ".join(
                    f"{c.threads} threads (rule {c.rule_threads}) up to {c.max_row_bytes or 'any'} B"
                    for c in choices
                )
                or "the rules"
            )
        )
        out = build_project(project, target)
        (lib,) = out.glob("*.abi3.so")
        torch.ops.load_library(str(lib))
        kernels[name] = getattr(getattr(torch.ops, lib.name.split(".")[0]), op)
    timer, torch_dtype, tol = Timer(torch, repeats), getattr(torch, dtype), SMOKE_TOLERANCE[dtype]

    def measure(cases: list[Case], label: str) -> dict:
        """Every candidate checked against the reference, then timed: µs summed per configuration."""
        by_bucket: dict[int | None, dict] = {}
        for case in cases:
            params = case.param_values(spec)
            inputs = example_inputs(
                spec, case.shape, torch_dtype, per_batch=case.per_batch, k_heads=case.k_heads
            )
            want = spec.reference(*inputs, *params)
            for name, kernel in kernels.items():
                got = kernel(*inputs, *params)
                for g, w in zip(*(o if isinstance(o, tuple) else (o,) for o in (got, want))):
                    if not torch.allclose(g.double(), w, rtol=tol, atol=tol):
                        raise UsageError(
                            f"candidate {name} of {op} disagrees with the reference at {case.label}: "
                            f"max |diff| {(g.double() - w).abs().max().item():.3g}"
                        )
            calls = {n: (lambda k=k: k(*inputs, *params)) for n, k in kernels.items()}
            times = {n: statistics.median(t) for n, t in timer.rounds_us(calls, rounds).items()}
            launch = plan_launch(spec, profile, dtype, case.shape)
            if not launch.bucket.vectorized:
                continue  # scalar configurations are not tuned
            entry = by_bucket.setdefault(
                launch.bucket.max_row_bytes, {"shapes": [], "us": dict.fromkeys(kernels, 0.0)}
            )
            entry["shapes"].append(case.label)
            for n, us in times.items():
                entry["us"][n] += us
            console.print(f"{label}{case.label}: " + ", ".join(f"{n} {us:.1f} µs" for n, us in times.items()))
        return by_bucket

    by_bucket = measure(suite(op), "")
    held = measure(held_out_cases(op, arch, dtype, list(by_bucket)), "held out ")
    rule = plan_kernel(spec, profile, dtype)
    found = []
    for bucket, entry in by_bucket.items():
        rule_threads = next(
            b.threads_per_row for b in rule.buckets if b.vectorized and b.max_row_bytes == bucket
        )
        names = {rule_threads: "rule"} | {
            c.threads: name for name, choices in options.items() for c in choices if c.max_row_bytes == bucket
        }
        measured = {t: entry["us"][name] for t, name in names.items()}
        out = held.get(bucket, {"shapes": [], "us": {}})
        held_us = {t: out["us"][name] for t, name in names.items()} if out["shapes"] else {}
        best = choose(measured, rule_threads, table.margin, held_us)
        found.append(
            TunedChoice(
                op=op,
                dtype=dtype,
                max_row_bytes=bucket,
                threads=best,
                rule_threads=rule_threads,
                shapes=entry["shapes"],
                rule_us=measured[rule_threads],
                tuned_us=measured[best],
                others={str(t): round(us, 2) for t, us in measured.items() if t not in (best, rule_threads)},
                held_out=out["shapes"],
                held_rule_us=out["us"].get("rule"),
                held_tuned_us=out["us"].get(names[best]),
            )
        )
    return table.model_copy(update={"choices": found})


def merge_and_write(found: TuningTable, op: str, dtype: str) -> Path:
    """Replaces the op's (and dtype's) entries of the committed table by ``found``'s."""
    path, _ = tuning_file(op, found.arch)
    old = load_tuning(found.arch, op)
    kept = [c for c in (old.choices if old else []) if (c.op, c.dtype) != (op, dtype)]
    table = found.model_copy(
        update={"choices": sorted(kept + found.choices, key=lambda c: (c.op, c.dtype, c.max_row_bytes or 0))}
    )
    lines = [
        "# Written by `kgen tune` (kgen/tune.py): per op, dtype and rows up to max_row_bytes, the threads "
        "per",
        "# row (per block for elementwise and rotary ops) measured fastest on the GPU named; threads equal",
        "# to rule_threads means the planner's rule was kept (a candidate must beat it by `margin`).",
        "# rule_us, tuned_us and others (by thread count) are medians summed over the shapes.",
        "# Re-run `kgen tune OP --arch ARCH` to refresh.",
        f'arch = "{table.arch}"',
        f'device = "{table.device}"',
        f'date = "{table.date}"',
        f'torch = "{table.torch}"',
        f"margin = {table.margin}",
    ]
    for c in table.choices:
        lines += ["", "[[choices]]", f'op = "{c.op}"', f'dtype = "{c.dtype}"']
        lines += [f"max_row_bytes = {c.max_row_bytes}"] if c.max_row_bytes is not None else []
        lines += [
            f"threads = {c.threads}",
            f"rule_threads = {c.rule_threads}",
            "shapes = [" + ", ".join(f'"{s}"' for s in c.shapes) + "]",
            f"rule_us = {c.rule_us:.2f}",
            f"tuned_us = {c.tuned_us:.2f}",
            "others = {" + ", ".join(f'"{t}" = {us}' for t, us in c.others.items()) + "}",
        ]
        if c.held_out:
            lines += [
                "held_out = [" + ", ".join(f'"{s}"' for s in c.held_out) + "]",
                f"held_rule_us = {c.held_rule_us:.2f}",
                f"held_tuned_us = {c.held_tuned_us:.2f}",
            ]
    text = "\n".join(lines) + "\n"
    TuningTable.model_validate(tomllib.loads(text))  # what the planner will read back
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    load_tuning.cache_clear()
    return path

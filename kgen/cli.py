"""The kgen command line: list, build, explain, bench, tune, plot."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .catalog import arch_names, load_profile, load_spec, load_tuning, op_names
from .errors import KgenError, UsageError

app = typer.Typer(
    help="Generate fused CUDA kernels and their PyTorch bindings from op specs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def _user_errors(fn):
    """KgenError is the user's problem, not a crash: print its message and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KgenError as err:
            err_console.print(f"[bold red]error:[/] {escape(str(err))}")
            raise typer.Exit(2) from None

    return wrapper


@app.command("list")
@_user_errors
def list_cmd() -> None:
    """Show the ops and the arch profiles."""
    ops = Table("op", "summary", "conventions (first = default)", "layers", title="ops", title_justify="left")
    for name in op_names():
        spec = load_spec(name)
        ops.add_row(
            name,
            escape(spec.summary),
            ", ".join(c.name for c in spec.structure.conventions),
            ", ".join(layer.name for layer in spec.layers) or "-",
        )
    console.print(ops)
    archs = Table(
        "arch",
        "devices",
        "SMs",
        "bandwidth",
        "shared mem / block",
        "dtypes",
        title="arch profiles",
        title_justify="left",
    )
    for name in arch_names():
        p = load_profile(name)
        archs.add_row(
            name,
            ", ".join(d.name for d in p.devices),
            str(p.sm_count),
            ", ".join(f"{d.memory_bandwidth_gbs:g} GB/s" for d in p.devices),
            f"{p.max_shared_memory_per_block // 1024} KB",
            ", ".join(p.dtypes),
        )
    console.print(archs)


@app.command()
@_user_errors
def build(
    op: Annotated[Optional[str], typer.Argument(help="op name (see `kgen list`)")] = None,
    arch: Annotated[
        Optional[list[str]], typer.Option("--arch", help="arch profile; repeat for several (default: all)")
    ] = None,
    dtype: Annotated[
        Optional[list[str]],
        typer.Option("--dtype", help="I/O dtype; repeat (default: all the arch supports)"),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="every op × every arch profile")] = False,
    out: Annotated[
        Path, typer.Option("--out", help="output root; each project goes to OUT/<op>-<arch>")
    ] = Path("generated"),
    compile_: Annotated[
        bool, typer.Option("--compile", help="also compile a local build variant (nvcc + CUDA torch)")
    ] = False,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", min=1, help="projects compiled at once (each runs 2 compilers)")
    ] = 1,
) -> None:
    """Write kernel-builder projects (and with --compile, a local build `kernels` loads)."""
    from .builder import build_project, write_project
    from .project import resolve_target

    if all_ == (op is not None):
        raise UsageError("give an op name or --all (not both)")
    ops = op_names() if all_ else [op]
    archs = arch or arch_names()
    targets = [resolve_target(o, a, dtype) for o in ops for a in archs]
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("writing projects", total=len(targets) * (2 if compile_ else 1))
        paths = []
        for target in targets:
            progress.update(task, description=f"writing {target.kernel_name}")
            paths.append(write_project(target, out))
            progress.advance(task)
            progress.console.print(f"wrote {paths[-1]}")
        if compile_:
            from concurrent.futures import ThreadPoolExecutor

            def compile_one(path, target):
                variant = build_project(path, target, step=lambda msg: progress.update(task, description=msg))
                progress.advance(task)
                progress.console.print(f"built {variant}")

            with ThreadPoolExecutor(max_workers=jobs) as pool:
                for future in [pool.submit(compile_one, p, t) for p, t in zip(paths, targets)]:
                    future.result()


def _shape(text: str) -> tuple[int, int]:
    try:
        dims = [int(d) for d in text.lower().split("x")]
    except ValueError:
        raise UsageError(f"--shape must look like 8192x4096 (leading dims x hidden), got {text!r}") from None
    if not dims or any(d < 1 for d in dims):
        raise UsageError(f"--shape dims must be >= 1, got {text!r}")
    return math.prod(dims[:-1]), dims[-1]


def _dtype(name: str) -> str:
    from .families.base import DTYPE_BYTES

    aliases = {
        "bf16": "bfloat16",
        "fp16": "float16",
        "half": "float16",
        "fp32": "float32",
        "float": "float32",
    }
    name = aliases.get(name, name)
    if name not in DTYPE_BYTES:
        raise UsageError(
            f"unknown dtype {name!r}; expected one of {', '.join(DTYPE_BYTES)} (or bf16, fp16, fp32)"
        )
    return name


@app.command()
@_user_errors
def explain(
    op: Annotated[str, typer.Argument(help="op name")],
    arch: Annotated[str, typer.Option("--arch", help="arch profile")] = "sm_90",
    dtype: Annotated[str, typer.Option("--dtype")] = "bfloat16",
    shape: Annotated[str, typer.Option("--shape", help="e.g. 8192x4096 or 2x4096x3072")] = "8192x4096",
) -> None:
    """Print the plan for one shape: every choice, the rule that set it, and a roofline estimate."""
    from .planner import plan_launch

    dtype = _dtype(dtype)
    spec, profile = load_spec(op), load_profile(arch)
    rows, hidden = _shape(shape)
    tuning = load_tuning(profile.name)
    plan = plan_launch(spec, profile, dtype, rows, hidden, tuning)
    tuned = [c for c in (tuning.choices if tuning else []) if (c.op, c.dtype) == (op, dtype)]
    console.print(
        f"[bold]{op}[/] on {profile.name} ({', '.join(d.name for d in profile.devices)}), "
        f"{dtype}, {rows} rows × hidden {hidden}; "
        + (
            f"{len(tuned)} choice(s) from arch/tuning/{profile.name}.toml, the rest from rules"
            if tuned
            else f"every choice from rules (no `kgen tune` table entry for {op} {dtype} on {profile.name})"
        )
    )
    table = Table("choice", "value", "why")
    for choice in plan.choices:
        table.add_row(*choice)
    console.print(table)
    console.print(
        f"minimum traffic: {plan.min_bytes / 1e6:.2f} MB (each input read once, each output written once)"
    )
    for device in profile.devices:
        console.print(
            f"roofline on {device.name} ({device.memory_bandwidth_gbs:g} GB/s): "
            f"{plan.roofline_us(device.memory_bandwidth_gbs):.1f} µs"
        )


@app.command()
@_user_errors
def bench(
    op: Annotated[Optional[str], typer.Argument(help="op name")] = None,
    all_ops: Annotated[
        bool, typer.Option("--all", help="every op (SUMMARY.md covers every op's JSON in OUT)")
    ] = False,
    out: Annotated[Path, typer.Option("--out", help="where the JSON results go")] = Path("bench/results"),
    repeats: Annotated[int, typer.Option(help="timed runs per implementation, shape and round")] = 100,
    rounds: Annotated[
        int, typer.Option(help="repeats of the whole comparison; each figure is their median")
    ] = 3,
    graphs: Annotated[
        bool, typer.Option("--graphs", help="time CUDA-graph replays (no host overhead)")
    ] = False,
    build_dir: Annotated[Path, typer.Option("--build-dir", help="project root to build into")] = Path(
        "build/bench"
    ),
    dtype: Annotated[str, typer.Option("--dtype")] = "bfloat16",
    e2e: Annotated[
        Optional[str],
        typer.Option(
            "--e2e", help="ltx or qwen3: the whole model, eager and compiled, with and without kgen"
        ),
    ] = None,
) -> None:
    """Time the kgen kernel against the op's peers (eager, PyTorch's fused op, Liger) and torch.compile on
    this GPU."""
    from .bench import run_bench, summary

    if e2e is not None:
        from .integrations.e2e import run_e2e, write

        path = write(
            run_e2e(e2e, rounds=rounds, repeats=min(repeats, 20), build_root=build_dir, log=console.print),
            out,
        )
        console.print(path.read_text())
        return
    if (op is None) == (not all_ops):
        raise UsageError("name one op, pass --all, or --e2e ltx|qwen3")
    ops = op_names() if all_ops else [op]
    for i, name in enumerate(ops, 1):
        if all_ops:
            console.rule(f"{name} ({i}/{len(ops)})")
        run_bench(
            name,
            out=out,
            repeats=repeats,
            build_root=build_dir,
            console=console,
            dtype=_dtype(dtype),
            rounds=rounds,
            graphs=graphs,
        )
    suffix = "-graphs" if graphs else ""
    results = [
        json.loads(p.read_text()) for p in (out / f"{n}{suffix}.json" for n in op_names()) if p.is_file()
    ]
    (out / f"SUMMARY{suffix}.md").write_text(
        summary([r for r in results if "bars" in r["rows"][0]])
    )  # this harness's
    console.print(f"wrote {out / f'SUMMARY{suffix}.md'}")


@app.command()
@_user_errors
def tune(
    op: Annotated[str, typer.Argument(help="op name")],
    arch: Annotated[str, typer.Option("--arch", help="arch profile of this GPU")] = "sm_90",
    dtype: Annotated[str, typer.Option("--dtype")] = "bfloat16",
    build_dir: Annotated[Path, typer.Option("--build-dir", help="where the candidate builds go")] = Path(
        "build/tune"
    ),
    write: Annotated[bool, typer.Option(help="merge the winners into arch/tuning/<arch>.toml")] = True,
) -> None:
    """Measure the planner's candidate plans on this GPU and record the winners for `kgen build`."""
    from .tune import merge_and_write
    from .tune import tune as run_tune

    found = run_tune(op, load_profile(arch).name, _dtype(dtype), build_root=build_dir, console=console)
    for c in found.choices:
        console.print(
            f"rows up to {c.max_row_bytes or 'any size'} B: "
            + (
                f"the rule's {c.rule_threads} threads kept ({c.rule_us:.1f} µs)"
                if c.threads == c.rule_threads
                else f"{c.threads} threads instead of the rule's {c.rule_threads} ({c.tuned_us:.1f} µs "
                f"against {c.rule_us:.1f})"
            )
            + "".join(f"; {t} threads {us:.1f} µs" for t, us in c.others.items())
        )
    if write:
        console.print(f"wrote {merge_and_write(found, op, _dtype(dtype))}")


@app.command()
@_user_errors
def plot(
    op: Annotated[str, typer.Argument(help="op name")],
    results: Annotated[
        Path, typer.Option("--results", help="folder with <op>.json from `kgen bench`")
    ] = Path("bench/results"),
) -> None:
    """Redraw <op>.png (GB/s against bytes moved, with the copy ceilings) from a `kgen bench` JSON."""
    from .bench import plot as draw

    source = results / f"{op}.json"
    if not source.is_file():
        raise UsageError(f"no benchmark results at {source}: run `kgen bench {op}` on a GPU first")
    draw(json.loads(source.read_text()), results / f"{op}.png")
    console.print(f"wrote {results / f'{op}.png'}")

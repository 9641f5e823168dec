"""The kgen command line: list, build, check, explain, bench, tune, plot."""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .catalog import arch_names, backward_spec, load_profile, load_spec, load_tuning, op_names, tuning_file
from .errors import KgenError, UsageError

app = typer.Typer(
    help="Generate fused CUDA kernels and their PyTorch bindings from op specs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(highlight=False)
E2E = "ltx, ltx-train, flux, wan, wan-train, qwen3, qwen3-train or llama"  # kgen bench --e2e's targets
err_console = Console(stderr=True, highlight=False)
DTYPE_HELP = "I/O dtype: bf16, fp16, fp32 or torch's names"


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


def _table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    """A table on a terminal; without one (a CI log, a pipe) plain, complete lines: a title, then the
    columns and each row joined by ' | ', never cut to a width."""
    if console.is_terminal:
        table = Table(*columns, title=title, title_justify="left")
        for row in rows:
            table.add_row(*map(escape, row))
        console.print(table)
        return
    print(f"{title}:")
    for row in [columns, *rows]:
        print(" | ".join(row))


@app.command("list")
@_user_errors
def list_cmd() -> None:
    """Show the ops (with whether kgen derives their backward) and the arch profiles."""
    from .bench import has_backward

    rows = []
    for name in op_names():
        spec = load_spec(name)
        rows.append(
            [
                name,
                spec.summary,
                ", ".join(c.name for c in spec.structure.conventions),
                ", ".join(layer.name for layer in spec.layers) or "-",
                "derived" if has_backward(name) else "-",
            ]
        )
    _table("ops", ["op", "summary", "conventions (first = default)", "layers", "backward"], rows)
    rows = []
    for name in arch_names():
        p = load_profile(name)
        rows.append(
            [
                name,
                ", ".join(d.name for d in p.devices),
                str(p.sm_count),
                ", ".join(f"{d.memory_bandwidth_gbs:g} GB/s" for d in p.devices),
                f"{p.max_shared_memory_per_block // 1024} KB",
                ", ".join(p.dtypes),
            ]
        )
    _table("arch profiles", ["arch", "devices", "SMs", "bandwidth", "shared mem / block", "dtypes"], rows)


class _Steps:
    """Progress of a long command: a bar on a terminal; elsewhere (CI logs) one plain line per step, as it
    happens."""

    def __init__(self, total: int, description: str):
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            disable=not console.is_terminal,
        )
        self.task = self.progress.add_task(description, total=total)

    def __enter__(self) -> _Steps:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def doing(self, message: str) -> None:
        """A step under way: the bar's description on a terminal, a line elsewhere."""
        self.progress.update(self.task, description=message)
        if not console.is_terminal:
            print(message, flush=True)

    def done(self, message: str) -> None:
        """A step finished: a line in both cases."""
        self.progress.advance(self.task)
        if console.is_terminal:
            self.progress.console.print(escape(message))
        else:
            print(message, flush=True)


@app.command()
@_user_errors
def build(
    ops: Annotated[
        Optional[list[str]], typer.Argument(help="op names (see `kgen list`)", show_default=False)
    ] = None,
    arch: Annotated[
        Optional[list[str]],
        typer.Option(
            "--arch",
            help="arch profile, a project each; repeat for several. A comma list (sm_80,sm_90) or 'all' "
            "makes one project for those archs. Default: a project for each arch",
        ),
    ] = None,
    dtype: Annotated[
        Optional[list[str]],
        typer.Option(
            "--dtype",
            help=f"{DTYPE_HELP}; repeat for several (default: all the arch supports)",
        ),
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="every op: a project for each arch and one for every arch")
    ] = False,
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="output root; a project goes to OUT/<op>-<arch>, '-' for '_' (qk-norm-rope-sm90)"
        ),
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
    from .project import resolve_multi_target, resolve_target

    names = _op_list(ops, all_)
    dtypes = [_dtype(d) for d in dtype] if dtype else None
    archs = arch or (arch_names() + ["all"] if all_ else arch_names())
    targets = [
        resolve_multi_target(o, a.split(","), dtypes)
        if "," in a or a == "all"
        else resolve_target(o, a, dtypes)
        for o in names
        for a in archs
    ]
    with _Steps(len(targets) * (2 if compile_ else 1), "writing projects") as steps:
        paths = []
        for target in targets:
            steps.doing(f"writing {target.kernel_name}")
            paths.append(write_project(target, out))
            steps.done(f"wrote {paths[-1]}")
        if compile_:
            from concurrent.futures import ThreadPoolExecutor

            def compile_one(path, target):
                messages = []

                def step(message: str) -> None:
                    messages.append(message)
                    if not message.startswith("up to date"):  # said once, when done
                        steps.doing(message)

                variant = build_project(path, target, step=step)
                up_to_date = any(m.startswith("up to date") for m in messages)
                steps.done(f"{'up to date' if up_to_date else 'built'}: {variant}")

            with ThreadPoolExecutor(max_workers=jobs) as pool:
                for future in [pool.submit(compile_one, p, t) for p, t in zip(paths, targets)]:
                    future.result()


@app.command()
@_user_errors
def check(
    ops: Annotated[
        Optional[list[str]], typer.Argument(help="op names (see `kgen list`)", show_default=False)
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="every op")] = False,
    seed: Annotated[int, typer.Option(help="seed of the random inputs")] = 0,
) -> None:
    """Compare each convention's math, evaluated on the CPU, with the spec's reference: no GPU needed.

    The spec's sympy expressions in float32 and bfloat16, at the op's example shapes."""
    from .check import check as check_op
    from .check import disagreement
    from .errors import SpecError

    results = [r for op in _op_list(ops, all_) for r in check_op(op, seed)]
    _table(
        "the spec's math against its reference (worst |difference| / tolerance: at most 1 passes)",
        ["op", "convention", "dtype", "shapes", "worst", "at", "verdict"],
        [
            [
                r.op,
                r.convention,
                r.dtype,
                str(r.shapes),
                f"{r.worst:.3g}",
                r.where,
                "ok" if r.ok else "DISAGREE",
            ]
            for r in results
        ],
    )
    if bad := [r for r in results if not r.ok]:
        raise SpecError(disagreement(bad))


def _op_list(ops: list[str] | None, all_: bool) -> list[str]:
    if all_ and ops:
        raise UsageError("give op names or --all, not both")
    if not all_ and not ops:
        raise UsageError("give op names (`kgen list` shows them) or --all")
    return op_names() if all_ else list(dict.fromkeys(ops))


def _shape(text: str) -> tuple[int, ...]:
    """8192x4096, or as the tables and torch print shapes: 2×8064×2048, 2,8064,2048, [2, 8064, 2048]."""
    try:
        dims = [int(d) for d in re.split(r"\s*[x×,]\s*", text.lower().strip(" []()"))]
    except ValueError:
        raise UsageError(f"--shape must look like 8192x4096 (leading dims x hidden), got {text!r}") from None
    if not dims or any(d < 1 for d in dims):
        raise UsageError(f"--shape dims must be >= 1, got {text!r}")
    return tuple(dims)


def _dtype(name: str) -> str:
    from .families.base import DTYPE_BYTES

    aliases = {
        "bf16": "bfloat16",
        "fp16": "float16",
        "half": "float16",
        "fp32": "float32",
        "float": "float32",
    }
    name = name.lower().removeprefix("torch.")
    name = aliases.get(name, name)
    if name not in DTYPE_BYTES:
        raise UsageError(
            f"unknown dtype {name!r}; expected one of {', '.join(DTYPE_BYTES)} (or bf16, fp16, fp32)"
        )
    return name


def _params(op: str, items: list[str]) -> dict[str, float]:
    """--param NAME=VALUE items as the op's params."""
    from .catalog import check_params

    out = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            raise UsageError(f"--param {item!r}: give NAME=VALUE, VALUE a number") from None
    check_params(op, out, "--param {}:", UsageError)
    return {p.name: (int if p.integer else float)(out[p.name]) for p in load_spec(op).params if p.name in out}


@app.command()
@_user_errors
def explain(
    op: Annotated[str, typer.Argument(help="op name")],
    arch: Annotated[
        str,
        typer.Option("--arch", help="arch profile; a comma list or 'all' explains each arch's plan in turn"),
    ] = "sm_90",
    dtype: Annotated[str, typer.Option("--dtype", help=DTYPE_HELP)] = "bfloat16",
    shape: Annotated[
        Optional[str],
        typer.Option(
            "--shape",
            help="e.g. 8192x4096, 2x4096x3072 or 2×8064×2048 (default: the op's first benchmark shape)",
        ),
    ] = None,
    backward: Annotated[
        bool, typer.Option("--backward", help="the plan of the op's derived backward")
    ] = False,
    k_heads: Annotated[
        Optional[int],
        typer.Option("--k-heads", min=1, help="a rotary op's heads of k where they differ from q's (dim 1)"),
    ] = None,
    per_batch: Annotated[
        bool, typer.Option("--per-batch", help="broadcast inputs per batch (without --shape: the suite's)")
    ] = False,
    param: Annotated[
        Optional[list[str]],
        typer.Option(
            "--param",
            help="NAME=VALUE, repeatable: an op param the binding checks the shape against (a grid's sizes; "
            "without --shape: over the suite case's)",
        ),
    ] = None,
) -> None:
    """Print the plan for one shape: every choice, the rule that set it, and a roofline estimate."""
    from .catalog import suite
    from .planner import plan_launch

    dtype, print_line = _dtype(dtype), console.print if console.is_terminal else print
    archs = arch_names() if arch == "all" else arch.split(",")
    if len(archs) > 1:
        for name in archs:
            if dtype in load_profile(name).dtypes:
                explain(op, name, dtype, shape, backward, k_heads, per_batch, param)
            else:  # one arch without the dtype does not stop the others' plans
                print_line(
                    f"{name}: no {dtype} arithmetic there, left out (its plans: --arch {name} --dtype fp16)"
                )
        return
    spec, profile = load_spec(op), load_profile(arch)
    case = None if shape is not None else next(iter(suite(op)), None)  # the op's first benchmark shape
    dims = _shape(shape) if shape is not None else case.shape if case else (8192, 4096)
    if case:  # its k heads, per-batch broadcast inputs and params with it
        k_heads, per_batch = k_heads or case.k_heads, per_batch or case.per_batch
    given = (dict(case.params) if case else {}) | _params(op, param or [])
    tuning, (_, table_file) = load_tuning(profile.name, op), tuning_file(op, profile.name)
    if backward:
        if (spec := backward_spec(op)) is None:
            raise UsageError(f"{op} has no backward kernels yet (kgen list shows which ops have)")
        op = spec.name
    params = {p.name: p.default for p in spec.params} | given if given else None  # none given: left unchecked
    plan = plan_launch(spec, profile, dtype, dims, tuning, k_heads, per_batch, params)
    entries = [c for c in (tuning.choices if tuning else []) if (c.op, c.dtype) == (op, dtype)]
    cited = sum(table_file in why for _, _, why in plan.choices)  # the choices at this shape the table made
    source = (
        f"{cited} choice(s) here from {table_file} (of its {len(entries)} entries for {op} {dtype}), "
        "the rest from rules"
        if cited
        else f"every choice from rules ({table_file} has {len(entries)} entries for {op} {dtype}, "
        "none for this configuration)"
        if entries
        else f"every choice from rules (no `kgen tune` table entry for {op} {dtype} on {profile.name})"
    )
    devices = ", ".join(d.name for d in profile.devices)
    shown, rows = "×".join(map(str, dims)), math.prod(dims[:-1])
    what = f"shape {shown}" if len(dims) > 3 or per_batch else f"{rows} rows × hidden {dims[-1]}"
    what += f" (k heads {k_heads})" * bool(k_heads) + ", broadcast inputs per batch" * per_batch
    what += f" ({', '.join(f'{k}={v:g}' for k, v in given.items())})" * bool(given)
    print_line(f"{op} on {profile.name} ({devices}), {dtype}, {what}; {source}")
    print_line(f"the planner's facts for {profile.name}: {profile.planner.basis}")
    _table("plan", ["choice", "value", "why"], [list(row) for row in plan.choices])
    print_line(
        f"minimum traffic: {plan.min_bytes / 1e6:.2f} MB (each input read once, each output written once)"
    )
    if plan.min_bytes <= profile.l2_bytes:
        print_line(
            f"it fits the {profile.l2_bytes / 2**20:.0f} MB L2 of {profile.name}: calls back to back on "
            "the same data may run from L2, faster than this roofline (kgen bench flushes L2 before each run)"
        )
    for device in profile.devices:
        print_line(
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
        bool, typer.Option("--graphs", help="time CUDA-graph replays; --e2e: compiled as reduce-overhead")
    ] = False,
    build_dir: Annotated[Path, typer.Option("--build-dir", help="project root to build into")] = Path(
        "build/bench"
    ),
    dtype: Annotated[str, typer.Option("--dtype", help=DTYPE_HELP)] = "bfloat16",
    e2e: Annotated[
        Optional[str],
        typer.Option(
            "--e2e",
            help=f"{E2E}: the whole model, eager and compiled, with and without kgen",
        ),
    ] = None,
    backward: Annotated[
        bool,
        typer.Option("--backward", help="time the backward alone and forward + backward under autograd"),
    ] = False,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile", help="with --e2e: add each variant's kernel table (one call under torch.profiler)"
        ),
    ] = False,
    sweep: Annotated[
        bool, typer.Option("--sweep", help="a rows × hidden grid and random shapes: heatmap and table")
    ] = False,
    per_batch: Annotated[
        bool, typer.Option("--per-batch", help="with --sweep: broadcast inputs per batch")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="with --sweep: the random shapes' seed")] = 0,
) -> None:
    """Time the kgen kernel against the op's peers and torch.compile on this GPU.

    The peers: eager, PyTorch's fused op, Liger where installed; --sweep, --backward, --e2e: see below."""
    from .bench import run_suite

    if e2e is not None:
        from .integrations.e2e import run_e2e, write

        result = run_e2e(
            e2e,
            rounds=rounds,
            repeats=min(repeats, 20),
            build_root=build_dir,
            profile=profile,
            compile_mode="reduce-overhead" if graphs else None,
            log=console.print,
        )
        path = write(result, out)
        console.print(path.read_text())
        if failed := [row["workload"] for row in result["rows"] if "profile error" in row]:
            raise KgenError(f"--profile failed at {', '.join(failed)}; the timings are in {path}")
        return
    if (op is None) == (not all_ops):
        raise UsageError(f"name one op, pass --all, or --e2e with one of {E2E}")
    options = dict(repeats=repeats, build_root=build_dir, console=console, dtype=_dtype(dtype), rounds=rounds)
    if sweep:
        from .sweep import run_sweep, stem, sweepable

        if graphs or backward:
            raise UsageError("--sweep times the forward with events: drop --graphs and --backward")
        ops = [n for n in op_names() if sweepable(n, per_batch)] if all_ops else [op]
        for i, name in enumerate(ops, 1):
            console.rule(f"{name} sweep ({i}/{len(ops)})")
            run_sweep(name, out=out, per_batch=per_batch, seed=seed, **options)
            console.print((out / f"{stem(name, per_batch)}.md").read_text())
        return
    path = run_suite(op_names() if all_ops else [op], out=out, graphs=graphs, backward=backward, **options)
    console.print(f"wrote {path}")


@app.command()
@_user_errors
def tune(
    op: Annotated[str, typer.Argument(help="op name")],
    arch: Annotated[str, typer.Option("--arch", help="arch profile of this GPU")] = "sm_90",
    dtype: Annotated[str, typer.Option("--dtype", help=DTYPE_HELP)] = "bfloat16",
    build_dir: Annotated[Path, typer.Option("--build-dir", help="where the candidate builds go")] = Path(
        "build/tune"
    ),
    write: Annotated[bool, typer.Option(help="merge the winners into the op's tuning table")] = True,
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
            + (f"; held out: {c.held_tuned_us:.1f} µs, the rule {c.held_rule_us:.1f}" if c.held_out else "")
        )
    if write:
        console.print(f"wrote {merge_and_write(found, op, _dtype(dtype))}")


@app.command()
@_user_errors
def report(
    results: Annotated[Path, typer.Argument(help="a `kgen bench` output folder")] = Path("bench/results"),
    into: Annotated[
        Optional[Path], typer.Option("--into", help="rewrite the marked region of this file (BENCHMARKS.md)")
    ] = None,
) -> None:
    """Write one run's report: the summary, the end-to-end tables, each op's table with its peers.

    To RESULTS/REPORT.md, or with --into between the file's `kgen report` marker lines."""
    import inspect

    from .bench_report import replace_region
    from .bench_report import report as run_report

    def doc(fn) -> str:  # a peer's docstring, its first paragraph on one line
        return " ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split()).rstrip(".")

    docs = {op: {name: doc(fn) for name, fn in load_spec(op).peers.items()} for op in op_names()}
    try:
        body = run_report(results, op_names(), docs)
        target = into or results / "REPORT.md"
        target.write_text(replace_region(target.read_text(), body, str(target)) if into else body)
    except (FileNotFoundError, ValueError) as err:
        raise UsageError(str(err)) from None
    console.print(f"wrote {target}")


@app.command()
@_user_errors
def plot(
    op: Annotated[str, typer.Argument(help="op name")],
    results: Annotated[
        Path, typer.Option("--results", help="folder with <op>.json from `kgen bench`")
    ] = Path("bench/results"),
) -> None:
    """Redraw <op>.png (GB/s against bytes moved, with the copy ceilings) from a `kgen bench` JSON."""
    from .bench_report import plot as draw

    load_spec(op)  # an unknown op is named as such, not as missing results
    source = results / f"{op}.json"
    if not source.is_file():
        raise UsageError(f"no benchmark results at {source}: run `kgen bench {op}` on a GPU first")
    draw(json.loads(source.read_text()), results / f"{op}.png")
    console.print(f"wrote {results / f'{op}.png'}")

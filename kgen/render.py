"""Rendering and packaging: spec + plans -> the files of a kernel-builder project.

``render_project`` is pure (name -> text); ``write_project`` puts the files on disk
atomically. Templates only place what this module computed; they do no math."""

from __future__ import annotations

import contextlib
import fcntl
import inspect
import os
import shutil
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from . import __version__
from .catalog import KgenError, data_dir, load_profile, load_spec, load_tuning, spec_hash
from .codegen import statements
from .dsl import reference_helpers
from .planner import KernelPlan, check_dtype, plan_kernel
from .profile import TuningTable

CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
ATEN = {"float32": "at::kFloat", "float16": "at::kHalf", "bfloat16": "at::kBFloat16"}
# Absolute/relative tolerance of the generated project's own smoke test, per I/O dtype.
SMOKE_TOLERANCE = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 2e-2}


def kernel_name(op: str, arch: str) -> str:
    """The Hub name: lowercase and dash-separated, e.g. rmsnorm-sm90."""
    return f"{op}-{arch}".replace("_", "-").replace("sm-", "sm")


def python_name(op: str, arch: str) -> str:
    return kernel_name(op, arch).replace("-", "_")


@dataclass(frozen=True)
class Target:
    op: str
    arch: str
    dtypes: tuple[str, ...]
    tuning: TuningTable | None = field(default=None, compare=False)  # the arch's `kgen tune` table

    @property
    def kernel_name(self) -> str:
        return kernel_name(self.op, self.arch)

    @property
    def python_name(self) -> str:
        return python_name(self.op, self.arch)


def resolve_target(op: str, arch: str, dtypes: list[str] | None = None) -> Target:
    spec, profile = load_spec(op), load_profile(arch)
    for dtype in dtypes or []:
        check_dtype(profile, dtype)
    return Target(spec.name, profile.name, tuple(dtypes or profile.dtypes), load_tuning(profile.name))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(data_dir("codegen_templates"))),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=False, lstrip_blocks=False)
    env.filters["format_code"] = lambda s: f"`{s}`"
    env.filters["nix_string"] = lambda s: s.replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${")
    return env


def plan_lines(plans: list[KernelPlan]) -> list[str]:
    """The plan as text: the rule behind each knob, then every compiled configuration."""
    lines = [f"{key}: {why}" for key, why in plans[0].notes.items()]
    if plans[0].kind != "row_reduce":
        return lines + [f"{kp.dtype}: " + ", ".join(f"{b.elems_per_access} elem/access" for b in kp.buckets)
                        + f"; {kp.buckets[0].block_threads} threads/block"
                        + ("" if kp.notes == plans[0].notes else f" ({kp.notes['block_threads']})") for kp in plans]
    for kp in plans:
        lines.append(f"{kp.dtype}:")
        for b in kp.buckets:
            limit = f"<= {b.max_row_bytes} B" if b.max_row_bytes else "any size"
            columns = ", weight with the row in one-wave grids" if b.columns_fit else ""
            lines.append(f"  rows {limit}: {b.elems_per_access} elem/access, {b.threads_per_row} threads/row, "
                         f"{b.rows_per_block} rows/block, row in {b.storage}{columns}, {b.reduction}")
    reasons = {}
    for kp in plans:  # a dtype's reasons differ where a tuning table decided
        for b in kp.buckets:
            for key, why in b.reasons.items():
                key = f"{key} ({b.max_row_bytes or 'any'} B, {b.elems_per_access}/access)"
                reasons.setdefault(key if reasons.get(key, why) == why else f"{key} {kp.dtype}", why)
    lines.append("why:")
    lines += [f"  {key}: {why}" for key, why in reasons.items()]
    return lines


def _element(t, source: str) -> str:
    """The fp32 value of tensor t's element j in the access ``source`` (its absent value if None)."""
    value = f"to_float({source}.v[j])"
    return f"({t.name} != nullptr ? {value} : {float(t.absent_value)!r}f)" if t.optional else value


def _conventions(spec, names: dict[str, str], extra=lambda c: {}) -> list[dict]:
    """Each convention's name, documentation, op-name suffix (none for the default), the statements
    of its outputs, and ``extra(c)``."""
    return [{"name": c.name, "matches": c.matches, "suffix": "" if i == 0 else f"_{c.name}",
             "lines": statements({f"{o}_out": e for o, e in c.outputs.items()}, names), **extra(c)}
            for i, c in enumerate(spec.structure.conventions)]


def _row_reduce_context(spec, names: dict[str, str]) -> dict:
    names |= {r.stat: f"stats.{r.stat}" for r in spec.structure.reductions}
    reductions = [{
        "stat": r.stat, "summand_src": str(r.summand), "finalize_src": str(r.finalize),
        "summand": statements({"partial": r.summand}, names),
        "finalize": statements({"stat": r.finalize}, names),
    } for r in spec.structure.reductions]
    values = spec.row_values
    late = [t for t in spec.row_inputs if t.name in spec.late_inputs]
    early = [t for t in spec.row_inputs if t.name not in spec.late_inputs]
    conventions = _conventions(spec, names, lambda c: {
        "prologue": statements({f"{v}_out": e for v, e in (spec.structure.prologue | c.prologue).items()}, names)})
    return {
        "reductions": reductions, "conventions": conventions, "values": values,
        "prologue": bool(spec.structure.prologue),
        "early_inputs": early, "late_inputs": late,
        "row_args": ", ".join(f"float {t.name}" for t in early),
        "value_args": ", ".join(f"float {v}" for v in values),
        "values_j": ", ".join(f"{v}_f[j]" for v in values),
        "prologue_out_args": ", ".join(f"float& {v}_out" for v in values),
        "prologue_elems": ", ".join(_element(t, f"{t.name}_in") for t in early),
        "all_args": ", ".join([f"float {v}" for v in values] + [f"float {t.name}" for t in late]
                              + [f"float {t.name}" for t in spec.column_inputs]),
        "value_elems": ", ".join(f"to_float(vals.{v}.v[j])" for v in values),
        "epilogue_elems": ", ".join([f"to_float(vals.{v}.v[j])" for v in values]
                                    + [_element(t, f"{t.name}_v") for t in late + spec.column_inputs]),
    }


def _elementwise_context(spec, names: dict[str, str]) -> dict:
    sources = []
    for t in spec.row_inputs:
        halves = t.halves or (t.name,)
        sources += [{"name": h, "tensor": t.name, "second_half": i == 1} for i, h in enumerate(halves)]
    return {
        "conventions": _conventions(spec, names), "sources": sources,
        "source_args": ", ".join(f"float {s['name']}" for s in sources),
        "source_elems": ", ".join(f"to_float({s['name']}_in.v[j])" for s in sources),
    }


def _rotary_context(spec, names: dict[str, str]) -> dict:
    structure, rotated, tables = spec.structure, spec.rotated_inputs, spec.tables
    conventions = _conventions(spec, names, lambda c: {  # a function per output
        "lines": {o: statements({f"{o}_out": e}, names) for o, e in c.outputs.items()}})
    grid = None
    if structure.grid is not None:
        g = structure.grid
        grid = {"axes": g.axes, "sizes": g.sizes, "coordinates_input": g.coordinates_input,
                "coordinates": [statements({"coord": e}, names) for e in g.coordinates],
                "frequency": statements({"freq": g.frequency}, names),
                "angle": statements({"angle": g.angle}, names)}
    return {
        "conventions": conventions, "pairing": structure.pairing, "grid": grid,
        "rotated": [t.name for t in rotated], "rotated_tensors": rotated, "tables": tables,
        "table_float32": any(t.dtype == "float32" for t in tables),
        "heads_expr": [f"args.{t.name}_heads" for t in rotated],
    }


def _fake_result(spec, empty: str) -> str:
    empties = ([f"torch.empty({t.name}.shape, dtype=x.dtype, device=x.device)" for t in spec.rotated_inputs]
               if spec.structure.kind == "rotary" else [empty] * len(spec.outputs))  # rotary: each input's shape
    return empties[0] if len(empties) == 1 else f"({', '.join(empties)})"


def _returns(n: int) -> dict[str, str]:
    """How n returned tensors are typed in C++, in the op schema and in Python."""
    return {"cpp": {0: "void", 1: "torch::Tensor"}.get(n, f"std::tuple<{', '.join(['torch::Tensor'] * n)}>"),
            "schema": {0: "()", 1: "Tensor"}.get(n, f"({', '.join(['Tensor'] * n)})"),
            "py": {0: "None", 1: "torch.Tensor"}.get(n, f"tuple[{', '.join(['torch.Tensor'] * n)}]")}


EXAMPLE_SHAPES = {  # a Python expression of `shape` (the outputs' shape) per tensor kind
    "row": "shape", "packed": "(*shape[:-1], 2 * shape[-1])", "column": "shape[-1:]"}


def _context(target: Target) -> dict:
    spec, profile = load_spec(target.op), load_profile(target.arch)
    plans = [plan_kernel(spec, profile, dtype, target.tuning) for dtype in target.dtypes]
    op = spec.name
    names = {p.name: f"params.{p.name}" for p in spec.params}
    names |= {"hidden": "params.hidden", "inv_hidden": "params.inv_hidden"}
    kind = spec.structure.kind
    ctx = {"row_reduce": _row_reduce_context, "elementwise": _elementwise_context,
           "rotary": _rotary_context}[kind](spec, names)
    conventions = ctx["conventions"]

    py_params = [f"{t.name}: Optional[torch.Tensor] = None" if t.optional else f"{t.name}: torch.Tensor"
                 for t in spec.inputs] + [f"{p.name}: int = {int(p.default)}" if p.integer else
                                          f"{p.name}: float = {p.default!r}" for p in spec.params]
    mutated = {name: chr(ord("a") + i) for i, name in enumerate(spec.inplace.values())}  # alias letters

    def cpp_params(inplace: bool) -> str:
        return ", ".join([f"const std::optional<torch::Tensor>& {t.name}" if t.optional else
                          f"torch::Tensor& {t.name}" if inplace and t.name in mutated else f"const torch::Tensor& {t.name}"
                          for t in spec.inputs] + [f"{'int64_t' if p.integer else 'double'} {p.name}" for p in spec.params])

    def schema(inplace: bool) -> str:
        return ", ".join([f"Tensor({mutated[t.name]}!) {t.name}" if inplace and t.name in mutated else
                          f"Tensor{'?' if t.optional else ''} {t.name}" for t in spec.inputs]
                         + [f"{'int' if p.integer else 'float'} {p.name}" for p in spec.params])
    call = ", ".join([t.name for t in spec.inputs] + [p.name for p in spec.params])
    banner = (f"Generated by kgen {__version__} from ops/{op}.py (spec {spec_hash(op)}) for {profile.name}. "
              f"Do not edit: regenerate with `kgen build {op} --arch {profile.name}`.")
    x = spec.row_inputs[0]
    out_shape = "list(x.shape[:-1]) + [x.shape[-1] // 2]" if x.packed else "x.shape"
    empty = f"torch.empty({out_shape}, dtype=x.dtype, device=x.device)"
    kernel_params, launch_args = [], []
    for t in spec.row_inputs + spec.column_inputs + spec.outputs:
        const = "" if t.role == "output" else "const "
        kernel_params.append(f"{const}T* __restrict__ {t.name}")
        launch_args.append(f"static_cast<{const}T*>(args.{t.name})")
        if t.per_row:
            kernel_params.append(f"int64_t {t.name}_row_stride")
            launch_args.append(f"args.{t.name}_row_stride")
        if t.broadcast:
            kernel_params.append(f"int64_t {t.name}_outer_stride")
            launch_args.append(f"args.{t.name}_outer_stride")
    kept = [t for t in spec.outputs if t.name not in spec.inplace]  # what the in-place form returns
    returns, inplace_returns = _returns(len(spec.outputs)), _returns(len(kept))
    example = {t.name: EXAMPLE_SHAPES["packed" if t.packed else "row" if t.per_row else "column"] for t in spec.inputs}
    example_cases = [(shape, "") for shape in [(1, 1), (3, 7), (4, 128), (2, 5, 4096), (8, 5120), (2, 65536)]]
    if kind == "rotary":  # rotated tensors as x; the tables are x's shape without a head dim
        example |= {t.name: "shape[:1] + shape[2:] if len(shape) == 4 else shape" for t in ctx["tables"]}
        example_cases = [(shape, "") for shape in [(2, 7, 64), (1, 5, 2), (2, 3, 5, 128), (1, 4, 33, 96)]]
        if spec.structure.grid is not None:  # a grid of 2·3·4 tokens
            sizes = ", ".join(f"{name}={n}" for name, n in zip(spec.structure.grid.sizes, (2, 3, 4)))
            example_cases = [((1, 24, c), sizes) for c in (2, 12, 100, 2048, 4096)]
    bench_cases = [((8192, 4096), ""), ((16384, 2048), ""), ((4096, 8192), "")]
    if kind == "rotary":
        bench_cases = [((1, 32, 2048, 128), ""), ((64, 32, 1, 128), ""), ((2, 2688, 2048), "")]
        grid = spec.structure.grid
        if grid is not None:  # LTX-Video 49 and 161 frames at 512×768
            sizes = [", ".join(f"{n}={v}" for n, v in zip(grid.sizes, (f, 16, 24))) for f in (7, 21)]
            bench_cases = [((2, f * 16 * 24, 2048), size) for f, size in zip((7, 21), sizes)]
            example |= {t.name: f"(shape[0], {len(grid.axes)}, shape[1])" for t in spec.inputs if t.coordinates}
    card_shape, card_params = bench_cases[0]
    card_inputs = {t.name: eval(example[t.name], {"shape": card_shape}) for t in spec.inputs}  # noqa: S307
    return ctx | {
        "kind": kind, "block_threads": profile.planner.block_threads,
        "min_blocks": profile.planner.min_blocks_per_sm * profile.sm_count,
        "op": op, "op_camel": "".join(w.title() for w in op.split("_")), "spec": spec, "profile": profile,
        "spec_hash": spec_hash(op), "banner": banner,
        "kernel_name": target.kernel_name, "python_name": target.python_name,
        "tensors": spec.tensors, "inputs": spec.inputs, "row_inputs": spec.row_inputs,
        "column_inputs": spec.column_inputs, "outputs": spec.outputs, "params": spec.params,
        "broadcast_inputs": [t for t in spec.inputs if t.broadcast], "x_packed": x.packed,
        "example_shape": example, "example_cases": example_cases, "bench_cases": bench_cases,
        "card_inputs": card_inputs, "card_params": card_params,
        "suffix": {c["name"]: c["suffix"] for c in conventions},
        "plans": [{"dtype": kp.dtype, "ctype": CTYPES[kp.dtype], "aten": ATEN[kp.dtype],
                   "vector_elems": 16 // kp.elem_bytes, "buckets": kp.buckets,
                   "register_buckets": [b for b in kp.buckets if b.storage == "registers"],
                   "tolerance": SMOKE_TOLERANCE[kp.dtype]} for kp in plans],
        "plan_lines": plan_lines(plans), "heads_in_flight": plans[0].buckets[0].heads_in_flight,
        "plan_markdown": "```\n" + "\n".join(plan_lines(plans)) + "\n```",
        "out_args": ", ".join(f"float& {t.name}_out" for t in spec.outputs),
        "out_elems": ", ".join(f"{t.name}_f[j]" for t in spec.outputs),
        "kernel_params": ", ".join(kernel_params), "launch_args": ", ".join(launch_args),
        "py_signature": ", ".join(py_params), "py_call": call,
        "tensor_call": ", ".join(t.name for t in spec.inputs),
        "cpp_return": returns["cpp"], "schema_return": returns["schema"], "py_return": returns["py"],
        "cpp_result": spec.outputs[0].name if len(spec.outputs) == 1 else
                      f"std::make_tuple({', '.join(t.name for t in spec.outputs)})",
        "fake_result": _fake_result(spec, empty),
        "cpp_signature": cpp_params(False), "cpp_call": call, "schema_args": schema(False),
        "inplace": spec.inplace, "inplace_schema_args": schema(True), "inplace_cpp_signature": cpp_params(True),
        "inplace_cpp_return": inplace_returns["cpp"], "inplace_schema_return": inplace_returns["schema"],
        "inplace_py_return": inplace_returns["py"],
        "inplace_cpp_result": "" if not kept else f"std::get<{spec.outputs.index(kept[0])}>(result)" if len(kept) == 1
        else "std::make_tuple(" + ", ".join(f"std::get<{spec.outputs.index(t)}>(result)" for t in kept) + ")",
        "inplace_fake_result": "None" if not kept else ", ".join([empty] * len(kept)),
        "reference_source": "\n\n".join(textwrap.dedent(inspect.getsource(fn))
                                          for fn in [*reference_helpers(spec.reference), spec.reference]),
        "reference_name": spec.reference.__name__,
        "reference_takes_convention": "convention" in inspect.signature(spec.reference).parameters,
    }


def _cuda_header(ctx: dict) -> str:
    spec, profile = ctx["spec"], ctx["profile"]
    lines = [f"{ctx['op']}: {spec.summary}",
             ctx["banner"],
             "",
             f"arch: {profile.name} ({', '.join(d.name for d in profile.devices)}), "
             f"{profile.sm_count} SMs, {profile.max_shared_memory_per_block // 1024} KB shared memory per block",
             f"dtypes: {', '.join(p['dtype'] for p in ctx['plans'])}",
             "plan (one configuration per hidden-size bucket; the launcher picks at run time):"
             if ctx["kind"] == "row_reduce" else "plan (the launcher picks the access width at run time):"]
    lines += ["  " + line for line in ctx["plan_lines"]]
    return "\n".join(("// " + line).rstrip() for line in lines)


def render_project(target: Target) -> dict[str, str]:
    """Every file of the kernel-builder project, by path relative to the project root."""
    ctx = _context(target)
    ctx["header"] = _cuda_header(ctx)
    env = _environment()
    op, pkg = target.op, target.python_name

    def render(template: str) -> str:
        return env.get_template(template).render(ctx)

    return {
        "build.toml": render("project/build.toml.j2"),
        "flake.nix": render("project/flake.nix.j2"),
        "CARD.md": render("project/CARD.md.j2"),
        ".gitignore": "build/\n__pycache__/\n",
        f"{op}_cuda/{op}.cu": render(f"{ctx['kind']}.cu.j2"),
        f"{op}_cuda/{op}.h": render("kernel.h.j2"),
        "torch-ext/torch_binding.h": render("project/torch_binding.h.j2"),
        "torch-ext/torch_binding.cpp": render("project/torch_binding.cpp.j2"),
        f"torch-ext/{pkg}/__init__.py": render("project/__init__.py.j2"),
        f"torch-ext/{pkg}/layers.py": render("project/layers.py.j2"),
        f"tests/test_{op}.py": render("project/test_op.py.j2"),
        f"benchmarks/benchmark_{op}.py": render("project/benchmark_op.py.j2"),
    }


def render_local_files(ops_name: str) -> dict[str, str]:
    """What kernel-builder generates at build time: the registration header and _ops.py."""
    env = _environment()
    ctx = {"ops_name": ops_name, "banner": f"Generated by kgen {__version__} for the local build."}
    return {"registration.h": env.get_template("local/registration.h.j2").render(ctx),
            "_ops.py": env.get_template("local/_ops.py.j2").render(ctx)}


def write_tree(files: dict[str, str | bytes], out_dir: Path, keep: tuple[str, ...] = ()) -> None:
    """Writes ``files`` as the whole content of ``out_dir``, atomically: they go to a sibling
    temporary folder that replaces ``out_dir`` only once complete, under a lock on the parent
    folder so concurrent writers of the same output take turns. Entries named in ``keep``
    (e.g. a previous build/) are carried over."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.new.", dir=out_dir.parent))
    try:
        for rel, text in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text if isinstance(text, bytes) else text.encode())
        with _locked(out_dir.parent):
            if not out_dir.exists():
                os.replace(staging, out_dir)
                return
            kept = [name for name in keep if (out_dir / name).exists()]
            for name in kept:
                os.replace(out_dir / name, staging / name)
            old = staging.with_name(staging.name.replace(".new.", ".old."))
            try:
                os.replace(out_dir, old)
                os.replace(staging, out_dir)
            except BaseException:
                if old.exists() and not out_dir.exists():
                    os.replace(old, out_dir)
                for name in kept:
                    if (staging / name).exists():
                        os.replace(staging / name, out_dir / name)
                raise
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _locked(folder: Path):
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_project(target: Target, out_root: Path) -> Path:
    try:
        files = render_project(target)
    except jinja2.TemplateError as err:
        raise KgenError(f"rendering {target.op} for {target.arch} failed: {err}") from err
    out_dir = Path(out_root) / target.kernel_name
    write_tree(files, out_dir, keep=("build",))
    return out_dir

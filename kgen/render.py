"""Rendering: a loaded spec, its profile and its plans -> a kernel-builder project's files (name -> text).

The context is two typed parts: what every project shares (`ProjectContext`: names, signatures, the op
schema, the reference, the example shapes) and what the spec's family computed (its `FamilyContext`).
Templates only place what these hold; they decide and compute nothing."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path

import jinja2

from . import __version__
from .autodiff import gradient_name, gradient_outputs
from .catalog import data_dir, spec_origin, suite
from .dsl import OpSpec, Param, Tensor, reference_helpers
from .errors import BuildError
from .families import families, family_of
from .families.base import Case, KernelPlan, element_type
from .profile import ArchProfile
from .project import kernel_name, python_name

CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
ATEN = {"float32": "at::kFloat", "float16": "at::kHalf", "bfloat16": "at::kBFloat16"}
# Absolute/relative tolerance of the generated project's own smoke test, per I/O dtype.
SMOKE_TOLERANCE = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 2e-2}


@dataclass(frozen=True)
class ExampleCase:
    """The inputs' shapes and the params of one call in the generated test, benchmark or card."""

    shapes: dict[str, tuple[int, ...]]
    params: dict[str, float | int]


@dataclass(frozen=True)
class ArchCode:
    """One arch's plans in a project, and where its kernels go."""

    profile: ArchProfile
    plans: list[KernelPlan]
    launcher: str  # launch_<op>, or launch_<op>_<arch> in a project for several archs
    source: str  # its .cu, relative to the project: <project op>_cuda/<op>[_<arch>].cu
    plan_title: str
    plan_lines: list[str]
    header: str  # the .cu's opening comment: op, arch, dtypes, spec hash, the plan and its reasons
    dtype_mask: int  # bit k: the arch runs the project's k-th dtype (the binding's table of plans)

    @property
    def dtypes(self) -> list[str]:
        return [kp.dtype for kp in self.plans]

    @property
    def file(self) -> str:
        return self.source.split("/")[-1]

    @property
    def section(self) -> str:
        """Its [kernel.<section>] in build.toml."""
        return self.file.removesuffix(".cu")


@dataclass(frozen=True)
class ProjectContext:
    op: str  # the op this context renders: the project's, or its backward's
    project_op: str  # the project's op (its folder names)
    op_camel: str
    spec: OpSpec
    profile: ArchProfile  # the newest arch's (a kernel .cu is rendered with its own)
    archs: list[ArchCode]  # oldest first
    arch_label: str  # sm_90, or sm_80, sm_90 for a project of several archs
    dtypes: list[str]  # every arch's, together
    spec_hash: str
    origin: str  # the spec's file: ops/<op>.py, or $KGEN_OPS_PATH/<op>.py
    banner: str
    kernel_name: str
    python_name: str
    lead: Tensor
    tensors: list[Tensor]
    inputs: list[Tensor]
    outputs: list[Tensor]
    row_outputs: list[Tensor]
    column_outputs: list[Tensor]  # 'hidden' outputs, summed over the rows
    row_inputs: list[Tensor]
    column_inputs: list[Tensor]
    broadcast_inputs: list[Tensor]
    packed_outputs: list[Tensor]
    lead_position: int  # the lead tensor's place among the inputs
    params: list[Param]
    plans: list[KernelPlan]  # the newest arch's (a kernel .cu is rendered with its own)
    short_header: str  # the .h's: op and spec hash, pointing at the .cu for the plan
    py_signature: str
    py_call: str
    tensor_call: str
    cpp_signature: str
    cpp_types: str  # the signature's types alone: the op's C++ function type for the dispatcher
    schema_args: str
    cpp_return: str
    schema_return: str
    py_return: str
    cpp_result: str
    fake_result: str
    inplace: dict[str, str]
    inplace_schema_args: str
    inplace_cpp_signature: str
    inplace_cpp_return: str
    inplace_schema_return: str
    inplace_py_return: str
    inplace_cpp_result: str
    inplace_fake_result: str
    reference_source: str
    reference_name: str
    reference_takes_convention: bool
    test_cases: list[ExampleCase]
    bench_cases: list[ExampleCase]
    other_params: dict[str, float]  # every float param away from its default (the generated test)
    optional_inputs: list[str]


def _environment() -> jinja2.Environment:
    roots = [data_dir("codegen_templates")] + [Path(f.template_root) for f in families() if f.template_root]
    return _environment_for(tuple(str(r) for r in dict.fromkeys(roots)))


@functools.cache
def _environment_for(roots: tuple[str, ...]) -> jinja2.Environment:
    """One environment per set of template folders: its templates are parsed once per process (and reloaded
    when their files change)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(list(roots)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )
    env.filters["format_code"] = lambda s: f"`{s}`"
    env.filters["nix_string"] = lambda s: s.replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${")
    env.filters["ctype"] = CTYPES.__getitem__
    env.filters["aten"] = ATEN.__getitem__
    env.filters["elem"] = element_type
    # one access of a tensor, and its alignment: a float32 tensor's is wider beside a 16-bit T
    wide = {
        "access": ("Access", "Pack<float, ELEMS>"),
        "access_align": ("kAccessBytes", "alignof(Pack<float, kVector>)"),
    }
    for name, (io, float32) in wide.items():
        env.filters[name] = lambda t, io=io, float32=float32: float32 if t.dtype == "float32" else io
    env.filters["smoke_tolerance"] = SMOKE_TOLERANCE.__getitem__
    return env


def _returns(n: int) -> tuple[str, str, str]:
    """How n returned tensors are typed in C++, in the op schema and in Python."""
    return (
        {0: "void", 1: "torch::Tensor"}.get(n, f"std::tuple<{', '.join(['torch::Tensor'] * n)}>"),
        {0: "()", 1: "Tensor"}.get(n, f"({', '.join(['Tensor'] * n)})"),
        {0: "None", 1: "torch.Tensor"}.get(n, f"tuple[{', '.join(['torch.Tensor'] * n)}]"),
    )


def _tuple(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"({', '.join(items)})"


def project_context(
    spec: OpSpec,
    parts: list[tuple[ArchProfile, list[KernelPlan]]],
    spec_hash: str,
    fake_outputs: list[str],
    name: str | None = None,
    project_op: str | None = None,
) -> ProjectContext:
    """The context of one op of a project (``project_op``'s; its own by default): the forward, or its
    backward."""
    family, op = family_of(spec), spec.name
    project_op = project_op or op
    mutated = {name: chr(ord("a") + i) for i, name in enumerate(spec.inplace.values())}  # alias letters

    def cpp_params(inplace: bool) -> str:
        return ", ".join(
            [
                f"const std::optional<torch::Tensor>& {t.name}"
                if t.optional
                else f"torch::Tensor& {t.name}"
                if inplace and t.name in mutated
                else f"const torch::Tensor& {t.name}"
                for t in spec.inputs
            ]
            + [f"{'int64_t' if p.integer else 'double'} {p.name}" for p in spec.params]
        )

    def schema(inplace: bool) -> str:
        return ", ".join(
            [
                f"Tensor({mutated[t.name]}!) {t.name}"
                if inplace and t.name in mutated
                else f"Tensor{'?' if t.optional else ''} {t.name}"
                for t in spec.inputs
            ]
            + [f"{'int' if p.integer else 'float'} {p.name}" for p in spec.params]
        )

    def example(case: Case) -> ExampleCase:
        ints = {p.name for p in spec.params if p.integer}
        return ExampleCase(
            {t.name: family.tensor_shape(spec, t, case) for t in spec.inputs},
            {k: int(v) if k in ints else v for k, v in case.params},
        )

    kept = [t for t in spec.outputs if t.name not in spec.inplace]  # what the in-place form returns
    cpp_return, schema_return, py_return = _returns(len(spec.outputs))
    inplace_returns = _returns(len(kept))
    several = len(parts) > 1
    arch_label = ", ".join(profile.name for profile, _ in parts)
    arch_flag = ",".join(profile.name for profile, _ in parts)
    origin = spec_origin(project_op)
    banner = (
        f"Generated by kgen {__version__} from {origin} (spec {spec_hash}) for {arch_label}. "
        f"Do not edit: regenerate with `kgen build {project_op} --arch {arch_flag}`."
    )
    dtypes = [d for d in CTYPES if any(d in (kp.dtype for kp in plans) for _, plans in parts)]
    archs = []
    for profile, plans in parts:
        plan_title, *plan_lines = family.describe(plans)
        header = [
            f"{op}: {spec.summary}",
            banner,
            "",
            f"arch: {profile.name} ({', '.join(d.name for d in profile.devices)}), {profile.sm_count} SMs, "
            f"{profile.max_shared_memory_per_block // 1024} KB shared memory per block",
            f"dtypes: {', '.join(kp.dtype for kp in plans)}",
            f"planner facts: {profile.planner.basis}",
            f"plan ({plan_title}):",
        ]
        header += ["  " + line for line in plan_lines]
        suffix = f"_{profile.name}" if several else ""
        archs.append(
            ArchCode(
                profile,
                plans,
                f"launch_{op}{suffix}",
                f"{project_op}_cuda/{op}{suffix}.cu",
                plan_title,
                plan_lines,
                "\n".join(("// " + line).rstrip() for line in header),
                sum(1 << dtypes.index(kp.dtype) for kp in plans),
            )
        )
    profile, plans = parts[-1]
    return ProjectContext(
        op=op,
        project_op=project_op,
        op_camel="".join(w.title() for w in op.split("_")),
        spec=spec,
        profile=profile,
        archs=archs,
        arch_label=arch_label,
        dtypes=dtypes,
        spec_hash=spec_hash,
        origin=origin,
        banner=banner,
        kernel_name=name or kernel_name(project_op, profile.name),
        python_name=python_name(name or kernel_name(project_op, profile.name)),
        lead=spec.lead,
        tensors=spec.tensors,
        inputs=spec.inputs,
        outputs=spec.outputs,
        row_outputs=spec.row_outputs,
        column_outputs=spec.column_outputs,
        row_inputs=spec.row_inputs,
        column_inputs=spec.column_inputs,
        broadcast_inputs=[t for t in spec.inputs if t.broadcast],
        packed_outputs=[t for t in spec.outputs if t.packed],
        lead_position=spec.inputs.index(spec.lead),
        params=spec.params,
        plans=plans,
        short_header="\n".join(
            f"// {line}"
            for line in [
                f"{op}: {spec.summary}",
                banner,
                f"The plan and the rule behind each choice: "
                f"{', '.join(c.source.split('/')[-1] for c in archs)}.",
            ]
        ),
        py_signature=", ".join(
            [
                f"{t.name}: Optional[torch.Tensor] = None" if t.optional else f"{t.name}: torch.Tensor"
                for t in spec.inputs
            ]
            + [
                f"{p.name}: int = {int(p.default)}" if p.integer else f"{p.name}: float = {p.default!r}"
                for p in spec.params
            ]
        ),
        py_call=", ".join([t.name for t in spec.inputs] + [p.name for p in spec.params]),
        tensor_call=", ".join(t.name for t in spec.inputs),
        cpp_signature=cpp_params(False),
        cpp_types=", ".join(arg.rsplit(" ", 1)[0] for arg in cpp_params(False).split(", ")),
        schema_args=schema(False),
        cpp_return=cpp_return,
        schema_return=schema_return,
        py_return=py_return,
        cpp_result=spec.outputs[0].name
        if len(spec.outputs) == 1
        else f"std::make_tuple({', '.join(t.name for t in spec.outputs)})",
        fake_result=_tuple(fake_outputs),
        inplace=spec.inplace,
        inplace_schema_args=schema(True),
        inplace_cpp_signature=cpp_params(True),
        inplace_cpp_return=inplace_returns[0],
        inplace_schema_return=inplace_returns[1],
        inplace_py_return=inplace_returns[2],
        inplace_cpp_result=""
        if not kept
        else f"std::get<{spec.outputs.index(kept[0])}>(result)"
        if len(kept) == 1
        else "std::make_tuple(" + ", ".join(f"std::get<{spec.outputs.index(t)}>(result)" for t in kept) + ")",
        inplace_fake_result="None"
        if not kept
        else ", ".join(fake_outputs[spec.outputs.index(t)] for t in kept),
        reference_source="\n\n".join(
            textwrap.dedent(inspect.getsource(fn))
            for fn in [*reference_helpers(spec.reference), spec.reference]
        ),
        reference_name=spec.reference.__name__,
        reference_takes_convention="convention" in inspect.signature(spec.reference).parameters,
        test_cases=[example(c) for c in family.example_cases(spec)],
        bench_cases=[example(c) for c in suite(op) or family.example_cases(spec)],
        other_params={p.name: 2 * p.default + 0.5 for p in spec.params if not p.integer},
        optional_inputs=[t.name for t in spec.inputs if t.optional],
    )


def _backward_glue(forward: OpSpec, backward: OpSpec) -> dict[str, list[str]]:
    """The autograd backward's arguments to the backward op (the forward's inputs and outputs it reads,
    saved, and the outputs' incoming gradients), each forward input's gradient in its result (its output, one
    it shares, or none: a constant, which the autograd refuses requiring a gradient)."""
    read = {t.name for t in backward.inputs}
    saved = [t for t in forward.inputs if t.name in read]
    saved_outputs = [t for t in forward.outputs if t.name in read]
    given = {t.name: f"saved[{i}]" for i, t in enumerate(saved + saved_outputs)}
    given |= {gradient_name(t.name): f"grads[{i}]" for i, t in enumerate(forward.outputs)}
    optional = "{0}.defined() ? std::optional<torch::Tensor>({0}) : std::nullopt"
    outs, gradients = [t.name for t in backward.outputs], gradient_outputs(forward, backward)
    results = []
    for t in forward.inputs:
        if t.name not in gradients:
            results.append("torch::Tensor()")
            continue
        got = "result" if len(outs) == 1 else f"std::get<{outs.index(gradients[t.name])}>(result)"
        if passed := backward.passes.get(gradients[t.name]):  # empty where it is `passed`: that handed on
            got = f"{given[t.name]}.sizes() == {given[passed]}.sizes() ? {given[passed]} : {got}"
        results.append(f"{given[t.name]}.defined() ? {got} : torch::Tensor()" if t.optional else got)
    calls = [optional.format(given[t.name]) if t.optional else given[t.name] for t in backward.inputs]
    constants = [t for t in forward.inputs if t.name not in gradients]
    return {
        "call": calls,
        "results": results,
        "saved": saved,
        "saved_outputs": [forward.outputs.index(t) for t in saved_outputs],
        "constants": constants,
    }


def _fields(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


Unit = tuple[OpSpec, list[tuple[ArchProfile, list[KernelPlan]]]]  # an op and each arch's plans for it


def render_project(units: list[Unit], spec_hash: str, name: str | None = None) -> dict[str, str]:
    """Every file of the kernel-builder project, by path relative to the project root. ``units``: the op, then
    its backward where its family derives one, each with one arch's plans or several archs' (oldest first;
    ``name`` is then the project's). Every unit has its own header and kernels; the binding and the Python
    package hold them all."""
    op = units[0][0].name
    contexts, extras_of = [], []
    for spec, parts in units:
        family = family_of(spec)
        extras = [family.context(spec, profile, plans) for profile, plans in parts]
        core = project_context(spec, parts, spec_hash, extras[-1].fake_outputs, name, op)
        shared = set(_fields(core)) & set(_fields(extras[-1]))
        if shared:
            raise BuildError(f"family {family.name!r}: its context redefines {sorted(shared)}")
        contexts.append(_fields(core) | _fields(extras[-1]))
        extras_of.append((core, extras))
    env = _environment()
    core = extras_of[0][0]
    pkg = core.python_name

    def render(template: str, context: dict) -> str:
        try:
            return env.get_template(template).render(context)
        except jinja2.TemplateError as err:
            raise BuildError(
                f"rendering {template} for {context['op']} on {core.arch_label} failed: {err}"
            ) from err

    backward = contexts[1] | _backward_glue(units[0][0], units[1][0]) if len(contexts) > 1 else None
    ctx = contexts[0] | {
        "units": contexts,
        "backward": backward,
        # the op's autograd is its backward unit; a backward has no autograd (no double backward)
        "unit_bindings": [render("project/unit_binding.cpp.j2", contexts[0] | {"backward": backward})]
        + [render("project/unit_binding.cpp.j2", c | {"backward": None}) for c in contexts[1:]],
        "unit_fakes": [render("project/unit_fake.py.j2", c) for c in contexts],
    }
    files = {
        "build.toml": render("project/build.toml.j2", ctx),
        "flake.nix": render("project/flake.nix.j2", ctx),
        "CARD.md": render("project/CARD.md.j2", ctx),
        ".gitignore": "build/\n__pycache__/\n",
        "torch-ext/torch_binding.h": render("project/torch_binding.h.j2", ctx),
        "torch-ext/torch_binding.cpp": render("project/torch_binding.cpp.j2", ctx),
        f"torch-ext/{pkg}/__init__.py": render("project/__init__.py.j2", ctx),
        f"torch-ext/{pkg}/layers.py": render("project/layers.py.j2", ctx),
        f"tests/test_{op}.py": render("project/test_op.py.j2", ctx),
        f"benchmarks/benchmark_{op}.py": render("project/benchmark_op.py.j2", ctx),
    }
    for unit_ctx, (unit_core, extras) in zip(contexts, extras_of):
        files[f"{op}_cuda/{unit_core.op}.h"] = render("kernel.h.j2", unit_ctx)
        for code, extra in zip(unit_core.archs, extras):  # each arch's kernels, from its own plans
            arch_ctx = (
                unit_ctx | _fields(extra) | {"profile": code.profile, "plans": code.plans, "code": code}
            )
            files[code.source] = render(extra.templates.kernel, arch_ctx)
    return dict(sorted(files.items()))


def render_local_files(ops_name: str) -> dict[str, str]:
    """What kernel-builder generates at build time: the registration header and _ops.py."""
    env = _environment()
    ctx = {"ops_name": ops_name, "banner": f"Generated by kgen {__version__} for the local build."}
    return {
        "registration.h": env.get_template("local/registration.h.j2").render(ctx),
        "_ops.py": env.get_template("local/_ops.py.j2").render(ctx),
    }

"""What every structure family shares: the plan types, the benchmark case, the render context's common
part, and the `Family` interface the core calls. A family (one module per structure kind) subclasses
`Family` and fills in its DSL node, plan, render context, shapes and templates; the core never asks which
family it holds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from ..codegen import statements
from ..dsl import OpSpec, Structure, Tensor
from ..profile import ArchProfile, TuningTable

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Case:
    """One shape an op runs at: the outputs' shape (a rotary op's lead tensor's), broadcast inputs per
    batch ([..., 1, hidden]) or per token, params other than their defaults, a second rotated tensor's head
    count."""

    shape: tuple[int, ...]
    per_batch: bool = False
    params: tuple[tuple[str, float], ...] = ()
    k_heads: int | None = None

    @property
    def label(self) -> str:
        extra = [f"{k}={v:g}" for k, v in self.params] + ([f"k heads {self.k_heads}"] if self.k_heads else [])
        return (
            "×".join(map(str, self.shape))
            + (" per batch" if self.per_batch else "")
            + (f" ({', '.join(extra)})" if extra else "")
        )

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    def param_values(self, spec: OpSpec) -> list:
        given = dict(self.params)
        return [(int if p.integer else float)(given.get(p.name, p.default)) for p in spec.params]


@dataclass(frozen=True)
class Bucket:
    """One compiled kernel configuration, serving rows up to ``max_row_bytes`` (None: any)."""

    max_row_bytes: int | None
    elems_per_access: int
    threads_per_row: int  # threads per block where rows are flattened
    rows_per_block: int
    max_accesses_per_thread: int  # the register array length (registers storage only)
    storage: str  # where a row lives between passes: "registers" | "staged" | "shared" | "global" (re-read)
    columns_fit: bool  # per-column inputs fit in registers beside the row (loaded with it in one-wave grids)
    reasons: dict[str, str] = field(compare=False, hash=False)

    @property
    def block_threads(self) -> int:
        return self.threads_per_row * self.rows_per_block

    @property
    def vectorized(self) -> bool:
        return self.elems_per_access > 1


@dataclass(frozen=True)
class KernelPlan:
    """Every configuration compiled for (op, arch, dtype), and the plan-wide choices the templates print. A
    family may subclass it with more choices."""

    op: str
    arch: str
    dtype: str
    elem_bytes: int
    vector_elems: int  # elements per access on the vector path (the profile's widest access)
    scalar_elems: int  # elements per access on the scalar path
    block_threads: int  # threads per block where rows are flattened or short
    buckets: list[Bucket]
    notes: dict[str, str]  # choice -> the rule behind it

    @property
    def vector_bytes(self) -> int:
        return self.vector_elems * self.elem_bytes


@dataclass(frozen=True)
class LaunchPlan:
    """The configuration the generated launcher picks for one contiguous, aligned shape, and why."""

    kernel: KernelPlan
    bucket: Bucket
    rows: int
    hidden: int
    grid: int
    shared_bytes: int
    min_bytes: int
    choices: list[tuple[str, str, str]]  # (choice, value, why): what `kgen explain` prints

    def roofline_us(self, bandwidth_gbs: float) -> float:
        return self.min_bytes / (bandwidth_gbs * 1e9) * 1e6


@dataclass(frozen=True)
class Templates:
    """The templates a family renders, by path under its template root (codegen_templates/ for kgen's own)."""

    kernel: str  # the .cu: kernels and the launcher
    args: str  # the launcher's argument struct, in the .h
    binding: str  # <op>_forward in torch_binding.cpp: argument checks, views, the launch
    fake: str  # the checks of the Python fake (meta) kernel
    inputs: str  # CARD.md's "Inputs" section
    fake_helpers: str | None = None  # module-level helpers of the Python fake kernels, if the family has any


@dataclass(frozen=True)
class ConventionCode:
    """One convention as the templates print it: the op name suffix (none for the default) and the statements
    sympy printed (their shape is the family's)."""

    name: str
    matches: str
    suffix: str
    lines: Any
    prologue: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FamilyContext:
    """The family's part of the render context; a family subclasses it with the fields its templates read."""

    conventions: list[ConventionCode]
    templates: Templates
    # per output, the Python expression of an empty tensor like it (the fake kernel's)
    fake_outputs: list[str]


class Family:
    """One structure kind end to end. A subclass sets the class attributes and implements the hooks below; the
    registry (kgen.families) maps its ``structure`` to it."""

    name: ClassVar[str]  # the structure's kind
    structure: ClassVar[type[Structure]]
    templates: ClassVar[Templates]
    template_root: ClassVar[Path | None] = None  # None: kgen's codegen_templates/
    facts: ClassVar[type[BaseModel] | None] = None  # the schema of the profiles' [planner.<name>] table

    def plan(self, spec: OpSpec, profile: ArchProfile, dtype: str, tuning: TuningTable | None) -> KernelPlan:
        raise NotImplementedError

    def launch(self, spec: OpSpec, profile: ArchProfile, kernel: KernelPlan, case: Case) -> LaunchPlan:
        raise NotImplementedError

    def context(self, spec: OpSpec, profile: ArchProfile, plans: list[KernelPlan]) -> FamilyContext:
        raise NotImplementedError

    def describe(self, plans: list[KernelPlan]) -> list[str]:
        """The plan as text (the .cu header and CARD.md): the rule behind each choice, then each dtype's
        configurations."""
        lines = ["the launcher picks the access width at run time"]
        lines += [f"{key}: {why}" for key, why in plans[0].notes.items()]
        return lines + [
            f"{kp.dtype}: "
            + ", ".join(f"{b.elems_per_access} elem/access" for b in kp.buckets)
            + f"; {kp.block_threads} threads/block"
            + f" ({kp.notes['block_threads']})"
            * (kp.notes["block_threads"] != plans[0].notes["block_threads"])
            for kp in plans
        ]

    def tensor_shape(self, spec: OpSpec, tensor: Tensor, case: Case) -> tuple[int, ...]:
        raise NotImplementedError

    def takes_k_heads(self, spec: OpSpec, shape: tuple[int, ...]) -> bool:  # a second tensor's head count
        return False

    def refuses(self, spec: OpSpec, kernel: KernelPlan, case: Case) -> str | None:
        """Why the generated binding refuses ``case``'s shape (worded as its error), or None."""
        return None

    def backward(self, spec: OpSpec) -> OpSpec | None:
        """The op's backward as a spec of its own (derived from the forward's math; planned and rendered
        like any op, into the forward's project), or None where the family derives none yet."""
        return None

    def example_cases(self, spec: OpSpec) -> list[Case]:
        """The shapes of the generated project's own test: edge sizes and a few real ones."""
        raise NotImplementedError

    def example_inputs(
        self,
        spec: OpSpec,
        case: Case,
        dtype,
        generator,
        device="cpu",
        magnitude=1.0,
        present=None,
        probes=False,
    ) -> list:
        """Every input's example value (``example_input``), None for an optional one ``present`` leaves out;
        a family whose inputs depend on each other (a saved forward output) fills them in together.
        ``probes``: exact 0, 1, -1 in turn at elements 0, 4, 8, ... of every floating input (ties) and at
        2, 6, 10, ... shifted by its place (kinks of max, min, abs, piecewise; the others not 0 there)."""
        inputs = [
            None
            if t.optional and not (present or {}).get(t.name, True)
            else self.example_input(spec, t, case, dtype, generator, device, magnitude)
            for t in spec.inputs
        ]
        for place, x in enumerate(inputs if probes else []):
            if x is not None and x.is_floating_point() and x.numel():
                cycle = x.new_tensor([0.0, 1.0, -1.0])
                for start, shift in ((0, 0), (2, place)):
                    probed = x.view(-1)[start::4]
                    probed.copy_(cycle.roll(-shift).repeat(probed.numel())[: probed.numel()])
        return inputs

    def example_input(
        self, spec: OpSpec, tensor: Tensor, case: Case, dtype, generator, device="cpu", magnitude: float = 1.0
    ):
        """A fresh random value of input ``tensor`` at ``case`` (what `kgen check`, the benchmark and the
        tests feed the op): normal times ``magnitude``, in float32 for a float32 tensor, else ``dtype``. A
        family with index inputs draws those."""
        import torch

        wide = torch.float64 if str(device) == "cpu" else torch.float32  # drawn in, before the cast
        values = torch.randn(
            self.tensor_shape(spec, tensor, case), generator=generator, dtype=wide, device=device
        )
        return (values * magnitude).to(torch.float32 if tensor.dtype == "float32" else dtype)

    def evaluate(self, spec: OpSpec, inputs: list, params: list, convention: str) -> tuple:
        """The spec's math for one convention computed on the CPU from its sympy expressions (float64, the
        convention's roundings to the inputs' dtype included): what `kgen check` compares with the
        reference."""
        raise NotImplementedError(f"the {self.name} family has no CPU evaluation of its math")

    def check_tolerance(self, spec: OpSpec, atol: float, rtol: float) -> tuple[float, float]:
        """How far `evaluate` may be from the reference where the family's math loses precision by nature."""
        return atol, rtol

    # -- kgen tune -------------------------------------------------------------------------------------------
    def tunable(self, plan: KernelPlan) -> list[Bucket]:
        """The configurations whose threads `kgen tune` varies: by default the vector one."""
        return [b for b in plan.buckets if b.vectorized][:1]

    def threads_allowed(
        self, spec: OpSpec, profile: ArchProfile, plan: KernelPlan, bucket: Bucket, threads: int
    ) -> bool:
        return 64 <= threads <= profile.max_threads_per_block

    # -- the profile's table (read when a profile loads, and by the plan) ---------------------
    def check_facts(self, profile: ArchProfile) -> BaseModel | None:
        """This family's table of the profile, validated (pydantic raises naming the field)."""
        return None if self.facts is None else self.facts.model_validate(profile.family_facts(self.name))


def printed_names(spec: OpSpec) -> dict[str, str]:
    """How the kernels name each param and builtin symbol: members of their Params struct."""
    return {p.name: f"params.{p.name}" for p in spec.params} | {
        "hidden": "params.hidden",
        "inv_hidden": "params.inv_hidden",
    }


def element_value(t: Tensor, source: str) -> str:
    """The fp32 value of tensor t's element j in the access ``source`` (its absent value if None)."""
    value = f"to_float({source}.v[j])"
    return f"({t.name} != nullptr ? {value} : {float(t.absent_value)!r}f)" if t.optional else value


def bucket_description(plans: list[KernelPlan], line) -> list[str]:
    """`Family.describe` for plans of hidden-size buckets: the notes, each dtype's buckets (``line(plan,
    bucket)`` after the bucket's row limit), then the reason behind each bucket's choices (a dtype's own where
    a tuning table decided differently)."""
    lines = ["one configuration per hidden-size bucket; the launcher picks at run time"]
    lines += [f"{key}: {why}" for key, why in plans[0].notes.items()]
    for kp in plans:
        lines.append(f"{kp.dtype}:")
        for b in kp.buckets:
            limit = f"<= {b.max_row_bytes} B" if b.max_row_bytes else "any size"
            lines.append(f"  rows {limit}: {line(kp, b)}")
    reasons = {}
    for kp in plans:
        for b in kp.buckets:
            for key, why in b.reasons.items():
                key = f"{key} ({b.max_row_bytes or 'any'} B, {b.elems_per_access}/access)"
                reasons.setdefault(key if reasons.get(key, why) == why else f"{key} {kp.dtype}", why)
    return lines + ["why:"] + [f"  {key}: {why}" for key, why in reasons.items()]


def convention_code(
    spec: OpSpec, names: dict[str, str], lines=None, prologue=None, suffix: str = "_out"
) -> list[ConventionCode]:
    """Each convention with its outputs printed as `<output><suffix> = ...;` statements (or ``lines(c)``)."""
    return [
        ConventionCode(
            c.name,
            c.matches,
            spec.variant(c.name).removeprefix(spec.name),
            lines(c) if lines else statements({f"{o}{suffix}": e for o, e in c.outputs.items()}, names),
            prologue(c) if prologue else [],
        )
        for c in spec.structure.conventions
    ]


def vector_notes(
    plan_dtype: str, vector_elems: int, elem_bytes: int, tensors: str, what: str, wide: list[str] = ()
) -> dict[str, str]:
    """The vector path's note; ``tensors`` says which must be aligned, with its verb ("x, out are"); ``wide``
    names the float32 tensors, whose accesses are wider beside a 16-bit dtype."""
    vector_bytes = vector_elems * elem_bytes
    if wide and elem_bytes < 4:
        what += f" (float32 {', '.join(wide)}: {4 * vector_elems}-byte accesses and alignment)"
    return {
        "vector path": f"{vector_bytes}-byte accesses ({vector_elems} × {plan_dtype}) when {tensors} "
        f"{vector_bytes}-byte aligned and hidden and strides are multiples of {vector_elems}"
        f"{what}: the widest global access a thread can issue (profile max_access_bytes)"
    }


def min_bytes(family: Family, spec: OpSpec, case: Case, elem: int) -> int:
    """Each input read once and each output written once (broadcast inputs per batch where ``case`` is)."""
    return sum(
        math.prod(family.tensor_shape(spec, t, case)) * (4 if t.dtype == "float32" else elem)
        for t in spec.tensors
    )


class RowsFamily(Family):
    """The [rows, hidden] layout that the row reduction and elementwise families share: every tensor viewed as
    rows of the lead tensor's last dim ('*rows hidden', '*rows 2*hidden' packed, 'hidden' per column), a
    broadcast input read with an outer stride."""

    def tensor_shape(self, spec: OpSpec, tensor: Tensor, case: Case) -> tuple[int, ...]:
        shape = tuple(case.shape)
        if tensor.packed:
            return (*shape[:-1], 2 * shape[-1])
        if tensor.column:
            return shape[-1:]
        if tensor.broadcast and case.per_batch and len(shape) >= 2:
            return (*shape[:-2], 1, shape[-1])
        return shape

    def example_cases(self, spec: OpSpec) -> list[Case]:
        return [Case(shape) for shape in [(1, 1), (3, 7), (4, 128), (2, 5, 4096), (8, 5120), (2, 65536)]]

    @staticmethod
    def values(spec: OpSpec, inputs: list, params: list) -> tuple[dict, tuple[int, ...]]:
        """The symbols of the spec's expressions bound to float64 tensors: each input's element (broadcast to
        the outputs' shape; a packed input's halves; an absent optional input's value), each param, hidden and
        inv_hidden; and the outputs' shape."""
        lead = inputs[spec.inputs.index(spec.lead)]
        shape = (*lead.shape[:-1], lead.shape[-1] // 2) if spec.lead.packed else tuple(lead.shape)
        values = scalar_values(spec, params, shape[-1])
        for t, v in zip(spec.inputs, inputs):
            if v is None:
                values[t.name] = float(t.absent_value)
            elif t.packed:
                values[t.halves[0]], values[t.halves[1]] = v.double().chunk(2, dim=-1)
            else:
                values[t.name] = v.double().expand(shape[:-1] + v.shape[-1:]) if t.per_row else v.double()
        return values, shape

    @staticmethod
    def kernel_arguments(spec: OpSpec) -> tuple[str, str]:
        """The kernel's tensor parameters and the launcher's matching arguments: pointers, row strides, and
        the outer strides of broadcast inputs; row outputs only (a family with column outputs adds its
        own)."""
        params, args = [], []
        for t in spec.row_inputs + spec.column_inputs + spec.row_outputs:
            const = "" if t.role == "output" else "const "
            params.append(f"{const}{element_type(t)}* __restrict__ {t.name}")
            args.append(f"static_cast<{const}{element_type(t)}*>(args.{t.name})")
            for stride in (["row"] if t.per_row else []) + (["outer"] if t.broadcast else []):
                params.append(f"int64_t {t.name}_{stride}_stride")
                args.append(f"args.{t.name}_{stride}_stride")
        return ", ".join(params), ", ".join(args)


def scalar_values(spec: OpSpec, params: list, hidden: int) -> dict:
    """The scalar symbols of the spec's expressions: each param, hidden and inv_hidden (1/hidden in fp32)."""
    import torch

    return {p.name: v for p, v in zip(spec.params, params)} | {
        "hidden": float(hidden),
        "inv_hidden": float(torch.tensor(1 / hidden, dtype=torch.float32)),
    }


def io_rounding(dtype):
    """to_io_dtype on float64 tensors: a rounding to the op's I/O dtype and back."""
    return lambda v: v.to(dtype).to(v.dtype)


def rows_fake_outputs(spec: OpSpec) -> list[str]:
    """Every output has the lead's shape with hidden as its last dim (2 · hidden when the output is packed,
    hidden half the lead's last dim when the lead is)."""
    lead = spec.lead

    def shape(t: Tensor) -> str:
        if t.packed == lead.packed:
            return f"{lead.name}.shape"
        last = f"{lead.name}.shape[-1] // 2" if lead.packed else f"2 * {lead.name}.shape[-1]"
        return f"list({lead.name}.shape[:-1]) + [{last}]"

    return [
        f"torch.empty({shape(t)}, dtype={fake_dtype(t, lead)}, device={lead.name}.device)"
        for t in spec.outputs
    ]


def element_type(t: Tensor) -> str:
    """A tensor's element type in a kernel templated on the I/O dtype T: float for a float32 one, else T."""
    return "float" if t.dtype == "float32" else "T"


def fake_dtype(t: Tensor, lead: Tensor) -> str:
    """A fake kernel's dtype for output ``t``: float32's, or the lead's (the I/O dtype)."""
    return "torch.float32" if t.dtype == "float32" else f"{lead.name}.dtype"


def access_bytes_of(t: Tensor, elem: int, elems: int) -> int:
    """One access of ``elems`` elements of ``t`` in bytes: 4 per float32 element, else the I/O elem."""
    return elems * (4 if t.dtype == "float32" else elem)

"""The column reduction family: per row, sums over the row that give per-row scalars, then per element the
row's outputs and, for 'hidden' outputs, values summed over every row: a row reduction's backward (dx, the
weight's and the bias's gradients), or any op that reduces across rows.

Determinism: a column output is never accumulated with atomics. Each block takes a fixed partition of the
rows (block b, row slot s: rows (b · rows per block + s) + k · blocks · rows per block), sums its rows'
values in fp32 registers and writes one partial row; a second kernel adds the partial rows in a fixed order
and rounds once to the dtype. The block count comes from the profile ([planner.column_reduce]: the threads
resident per SM × the SMs), never grows with the row count, and the same shape on the same build always
sums in the same order: the result is bitwise identical run to run.

DSL: `ColumnReduce(sums={convention: [RowSum, ...]}, when_given={output: optional input})`. Plan: threads per
row by row size (the profile's ladder), the row's accesses, the column inputs and the accumulators in
registers within the profile's budget, else re-read from global memory with the partial row accumulated in
place. Templates: codegen_templates/column_reduce/ and the [rows, hidden] layout of rows/."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..autodiff import backward_reference, derivative, gradient_name
from ..codegen import evaluate, statements
from ..dsl import (
    BUILTIN_SYMBOLS,
    Convention,
    Identifier,
    OpSpec,
    Structure,
    SympyExpr,
    Tensor,
    _Model,
    check_symbols,
)
from ..profile import ArchProfile, TuningTable
from .base import (
    DTYPE_BYTES,
    Bucket,
    Case,
    FamilyContext,
    KernelPlan,
    LaunchPlan,
    RowsFamily,
    Templates,
    bucket_description,
    convention_code,
    element_value,
    io_rounding,
    min_bytes,
    printed_names,
    vector_notes,
)

row_sum = sp.Symbol("row_sum")


# The suffix of an output's parameter in a convention's function: not "_out", which a gradient's name has
# (grad_residual + _out is the incoming gradient of an output residual_out); checked against the inputs.
RESULT = "_result"


class RowSum(_Model):
    """The fp32 sum of ``summand`` over the row, then per-row scalars computed from it (``row_sum``) in order;
    each may use the earlier ones."""

    summand: SympyExpr
    finalize: dict[Identifier, SympyExpr] = Field(min_length=1)


class ColumnReduce(Structure):
    """Per row, ``sums`` in order (a later sum's summand may use the scalars of the earlier ones), each
    convention with its own expressions for the same scalars; then per element each output: a '*rows hidden'
    output is written, a 'hidden' output is summed over every row. ``when_given`` maps a 'hidden' output to an
    optional input: the output is computed only when the input is given (an empty tensor otherwise), as the
    gradient of an absent weight."""

    kind: str = "column_reduce"
    sums: dict[Identifier, list[RowSum]]
    when_given: dict[Identifier, Identifier] = {}

    dims = ("*rows hidden", "hidden")
    column_outputs: ClassVar[bool] = True
    declares = frozenset(
        {
            "rows",
            "as_rows",
            "accesses",
            "count",
            "lane",
            "slot",
            "partial",
            "row",
            "first",
            "scratch",
            "stats",
            "row_reduce_sum",
            "for_each_access",
            "column_sum",
            "workspace",
            "row_sum",
            "i",
            "j",
            "k",
        }
    )

    def scalars(self) -> list[str]:
        return [name for s in self.sums[self.conventions[0].name] for name in s.finalize]

    def summed(self) -> set[str]:
        """The names any convention's summands read: the row inputs held on chip; the outputs alone read the
        others where they need them."""
        return {str(v) for sums in self.sums.values() for s in sums for v in s.summand.free_symbols}

    def names(self) -> list[str]:
        return self.scalars()

    def check(self, spec: OpSpec) -> set[str]:
        if set(self.sums) != {c.name for c in self.conventions}:
            raise ValueError(
                f"structure.sums: one list of sums per convention {[c.name for c in self.conventions]}, "
                f"got {sorted(self.sums)}"
            )
        if any(t.broadcast or t.packed for t in spec.tensors):
            raise ValueError("column_reduce ops take '*rows hidden' and 'hidden' tensors only")
        shape = [list(s.finalize) for s in self.sums[self.conventions[0].name]]
        inputs = {t.name for t in spec.row_inputs + spec.column_inputs}
        if clash := sorted(
            {t.name + RESULT for t in spec.outputs} & (inputs | {p.name for p in spec.params})
        ):
            raise ValueError(f"{', '.join(clash)}: the name of an output's result in the kernel; rename it")
        for conv, sums in self.sums.items():
            if [list(s.finalize) for s in sums] != shape:
                raise ValueError(
                    f"structure.sums.{conv}: every convention computes the same scalars in the same sums "
                    f"{shape}"
                )
            known = inputs | {p.name for p in spec.params} | BUILTIN_SYMBOLS
            for i, s in enumerate(sums):
                check_symbols(s.summand, known, f"structure.sums.{conv}.{i}.summand")
                for name, expr in s.finalize.items():
                    allowed = known - inputs | {"row_sum"}
                    check_symbols(expr, allowed, f"structure.sums.{conv}.{i}.finalize.{name}", False)
                    known = known | {name}
        optional = {t.name for t in spec.inputs if t.optional}
        columns = {t.name for t in spec.column_outputs}
        if not set(self.when_given) <= columns or not set(self.when_given.values()) <= optional:
            raise ValueError(
                f"structure.when_given: maps 'hidden' outputs {sorted(columns)} to optional inputs "
                f"{sorted(optional)}; got {self.when_given}"
            )
        return inputs | set(self.scalars())


class ColumnReduceFacts(BaseModel):
    """[planner.column_reduce] of an arch profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    resident_threads_per_sm: int = Field(ge=32, multiple_of=32)
    register_bytes_per_thread: int = Field(ge=16, multiple_of=16)
    threads_per_row: list[int] = Field(min_length=1)

    @model_validator(mode="after")
    def _ladder(self) -> ColumnReduceFacts:
        steps = self.threads_per_row
        if any(t & (t - 1) or t < 1 for t in steps) or steps != sorted(set(steps)):
            raise ValueError("threads_per_row: increasing powers of two")
        if steps[-1] > self.resident_threads_per_sm:
            raise ValueError("threads_per_row: the widest step must fit the resident threads of an SM")
        return self


@dataclass(frozen=True)
class ColumnReducePlan(KernelPlan):
    warp_size: int
    sm_count: int
    resident_threads_per_sm: int

    def blocks(self, bucket: Bucket, rows: int) -> int:
        """The partition: at most the blocks resident at once (never more with more rows)."""
        most = max(1, self.sm_count * self.resident_threads_per_sm // bucket.block_threads)
        return min(-(-rows // bucket.rows_per_block), most)


@dataclass(frozen=True)
class SumCode:
    summand_src: str
    summand: list[str]
    finalize_src: str
    finalize: list[str]


@dataclass(frozen=True)
class ColumnConventionCode:
    name: str
    matches: str
    suffix: str
    lines: list[str]
    sums: list[SumCode]


@dataclass(frozen=True)
class ColumnReduceContext(FamilyContext):
    scalars: list[str]
    n_sums: int
    kernel_params: str
    launch_args: str
    input_args: str
    input_elems: str
    out_args: str
    out_elems: str
    when_given: dict[str, str]
    streamed: list[str]  # row inputs only the outputs read: loaded there, not held with the row


class ColumnReduceFamily(RowsFamily):
    name = "column_reduce"
    structure = ColumnReduce
    facts = ColumnReduceFacts
    templates = Templates(
        kernel="column_reduce/kernel.cu.j2",
        args="rows/args.h.j2",
        binding="rows/binding.cpp.j2",
        fake="rows/fake.py.j2",
        inputs="rows/inputs.md.j2",
    )

    def plan(
        self, spec: OpSpec, profile: ArchProfile, dtype: str, tuning: TuningTable | None
    ) -> ColumnReducePlan:
        facts, elem = self.check_facts(profile), DTYPE_BYTES[dtype]
        vector = profile.max_access_bytes // elem
        buckets = self._buckets(profile, facts, spec, elem, vector) + self._buckets(
            profile, facts, spec, elem, 1
        )
        notes = vector_notes(dtype, vector, elem, ", ".join(t.name for t in spec.tensors) + " are", "") | {
            "scalar path": "otherwise one element per access: correct for any alignment and any hidden size",
            "partition": f"at most {facts.resident_threads_per_sm} threads per SM × {profile.sm_count} SMs "
            "of blocks (profile planner.column_reduce.resident_threads_per_sm), each summing a fixed set of "
            "rows into one fp32 partial row per row slot; a second kernel adds them in a fixed order: "
            "deterministic, no atomics",
            "block_threads": f"{profile.planner.block_threads} threads per block when rows are short "
            "(profile planner.block_threads)",
            "warp size": f"{profile.warp_size} lanes per shuffle reduction (profile warp_size)",
        }
        return ColumnReducePlan(
            spec.name,
            profile.name,
            dtype,
            elem,
            vector,
            1,
            profile.planner.block_threads,
            buckets,
            notes,
            profile.warp_size,
            profile.sm_count,
            facts.resident_threads_per_sm,
        )

    def _buckets(self, profile, facts, spec, elem, elems) -> list[Bucket]:
        access_bytes = elem * elems
        held_bytes = max(4, access_bytes)  # a 16-bit element alone still takes a 32-bit register
        sums = len(spec.column_outputs) * elems * 4
        held = [t for t in spec.row_inputs if t.name in spec.structure.summed()]
        rows_only = len(held) * held_bytes + sums
        budget_bytes = facts.register_bytes_per_thread
        # at most 4 accesses: 8 scalar accesses of layernorm's 4 inputs and 2 sums spilled at 64 registers
        # (nvcc 13.0, sm_90)
        accesses = max(1, min(4, budget_bytes // rows_only))
        columns = accesses * (rows_only + len(spec.column_inputs) * held_bytes) <= budget_bytes
        budget = (
            f"{accesses} × ({len(held)} row inputs × {held_bytes} B + "
            f"{len(spec.column_outputs)} × {elems} fp32 sums) per thread"
            + (
                f" and the column inputs ({len(spec.column_inputs)} × {held_bytes} B), loaded once per block,"
                if columns
                else ""
            )
            + f" within the {budget_bytes} B budget (profile planner.column_reduce.register_bytes_per_thread)"
            + (
                ""
                if columns or not spec.column_inputs
                else "; the column inputs do not fit beside them and are re-read per row (L1 hits)"
            )
            + "".join(
                f"; {t.name}, which only the outputs read, is loaded there, not held"
                for t in spec.row_inputs
                if t not in held
            )
        )
        out = []
        for threads in facts.threads_per_row:
            rows_per_block = max(1, profile.planner.block_threads // threads)
            out.append(
                Bucket(
                    threads * accesses * access_bytes,
                    elems,
                    threads,
                    rows_per_block,
                    accesses,
                    "registers",
                    columns,
                    {
                        "threads_per_row": f"{threads}: the narrowest step of the profile's ladder "
                        "(planner.column_reduce.threads_per_row) that holds the row",
                        "rows_per_block": f"{rows_per_block}: {profile.planner.block_threads} threads per "
                        f"block / {threads} per row"
                        if rows_per_block > 1
                        else "1: a row needs the whole block",
                        "storage": f"registers: {budget}",
                    },
                )
            )
        threads = min(512, facts.threads_per_row[-1])
        out.append(
            Bucket(
                None,
                elems,
                threads,
                1,
                1,
                "global",
                False,
                {
                    "threads_per_row": f"{threads}: at most 512, so a thread may hold more than 64 registers "
                    "(the 1024-thread fp32 kernel spilled at 64, nvcc 13.0, sm_90)",
                    "rows_per_block": "1: a row needs the whole block",
                    "storage": "global: the row exceeds the register budget; each pass re-reads it (mostly "
                    "from L2) and the partial row is accumulated in place",
                },
            )
        )
        return out

    def launch(self, spec: OpSpec, profile: ArchProfile, kernel: ColumnReducePlan, case: Case) -> LaunchPlan:
        rows, hidden = case.rows, case.shape[-1]
        row_bytes = hidden * kernel.elem_bytes
        vector = hidden % kernel.vector_elems == 0
        candidates = [b for b in kernel.buckets if b.vectorized == vector]
        b = next(b for b in candidates if b.max_row_bytes is None or row_bytes <= b.max_row_bytes)
        grid = kernel.blocks(b, rows)
        choices = [
            (
                "accesses",
                f"{b.elems_per_access * kernel.elem_bytes} B ({b.elems_per_access} elements)",
                kernel.notes["vector path" if vector else "scalar path"],
            ),
            ("threads per row", str(b.threads_per_row), b.reasons["threads_per_row"]),
            ("rows per block", str(b.rows_per_block), b.reasons["rows_per_block"]),
            ("row lives in", b.storage, b.reasons["storage"]),
            ("grid", f"{grid} blocks", kernel.notes["partition"]),
            (
                "partial rows",
                f"{grid * b.rows_per_block} × {hidden} fp32 per column output",
                "one per row slot, added in a fixed order by the second kernel",
            ),
        ]
        return LaunchPlan(
            kernel, b, rows, hidden, grid, 0, min_bytes(self, spec, case, kernel.elem_bytes), choices
        )

    def check_tolerance(self, spec: OpSpec, atol: float, rtol: float) -> tuple[float, float]:
        """A column output adds up to 1000 rows (the example shapes): the roundings of its terms to the dtype
        (a convention's, which the float64 reference leaves out) grow like √rows, so its absolute tolerance is
        32× (≈ √1000) the per-element one."""
        return (32 * atol, rtol) if spec.column_outputs else (atol, rtol)

    def evaluate(self, spec: OpSpec, inputs: list, params: list, convention: str) -> tuple:
        import torch

        structure, io = spec.structure, io_rounding(inputs[0].dtype)
        values, shape = self.values(spec, inputs, params)
        for s in structure.sums[convention]:
            total = evaluate(s.summand, values, io).expand(shape).sum(-1, keepdim=True)
            scope = values | {"row_sum": total}
            for name, expr in s.finalize.items():
                scope[name] = values[name] = evaluate(expr, scope, io)
        outputs = structure.convention(convention).outputs
        out = []
        for t in spec.outputs:
            value = torch.as_tensor(evaluate(outputs[t.name], values, io), dtype=torch.float64).expand(shape)
            if t.column:
                given = structure.when_given.get(t.name)
                absent = given and inputs[[i.name for i in spec.inputs].index(given)] is None
                value = value.new_empty(0) if absent else value.reshape(-1, shape[-1]).sum(0)
            out.append(value)
        return tuple(out)

    def tensor_shape(self, spec: OpSpec, tensor, case: Case) -> tuple[int, ...]:
        return case.shape[-1:] if tensor.column else tuple(case.shape)

    def describe(self, plans: list[ColumnReducePlan]) -> list[str]:
        return bucket_description(
            plans,
            lambda kp, b: (
                f"{b.elems_per_access} elem/access, {b.threads_per_row} threads/row, "
                f"{b.rows_per_block} rows/block, {b.max_accesses_per_thread} accesses/thread, "
                f"row in {b.storage}"
            ),
        )

    def example_cases(self, spec: OpSpec) -> list[Case]:
        return [Case(s) for s in [(1, 1), (3, 7), (4, 128), (2, 5, 4096), (1000, 96), (2, 20000)]]

    # -- render ----------------------------------------------------------------------------------------------
    def kernel_arguments(self, spec: OpSpec) -> tuple[str, str]:
        """The [rows, hidden] layout's, then each column output as its fp32 partial rows."""
        params, args = super().kernel_arguments(spec)
        partials = [f"float* __restrict__ {t.name}_partials" for t in spec.column_outputs]
        slots = [f"partials[{i}]" for i in range(len(spec.column_outputs))]
        return ", ".join([params, *partials]), ", ".join([args, *slots])

    def context(self, spec: OpSpec, profile: ArchProfile, plans: list[KernelPlan]) -> ColumnReduceContext:
        structure = spec.structure
        names = printed_names(spec) | {s: f"stats.{s}" for s in structure.scalars()}
        inputs = spec.row_inputs + spec.column_inputs
        kernel_params, launch_args = self.kernel_arguments(spec)

        def sums(conv: str) -> list[SumCode]:
            return [
                SumCode(
                    str(s.summand),
                    statements({"partial": s.summand}, names),
                    ", ".join(f"{k} = {v}" for k, v in s.finalize.items()),
                    statements(
                        {f"stats.{k}": v for k, v in s.finalize.items()}, names | {"row_sum": "row_sum"}
                    ),
                )
                for s in structure.sums[conv]
            ]

        conventions = [
            ColumnConventionCode(c.name, c.matches, c.suffix, c.lines, sums(c.name))
            for c in convention_code(spec, names, suffix=RESULT)
        ]
        lead = spec.lead.name
        return ColumnReduceContext(
            conventions=conventions,
            templates=self.templates,
            fake_outputs=[
                f"torch.empty({lead}.shape, dtype={lead}.dtype, device={lead}.device)"
                if t.per_row
                else f"{lead}.new_empty({lead}.shape[-1:]"
                + (
                    f" if {structure.when_given[t.name]} is not None else [0]"
                    if t.name in structure.when_given
                    else ""
                )
                + ")"
                for t in spec.outputs
            ],
            scalars=structure.scalars(),
            n_sums=len(structure.sums[spec.default_convention]),
            kernel_params=kernel_params,
            launch_args=launch_args,
            input_args=", ".join(f"float {t.name}" for t in inputs),
            input_elems=", ".join(element_value(t, f"{t.name}_v") for t in inputs),
            out_args=", ".join(f"float& {t.name}{RESULT}" for t in spec.outputs),
            out_elems=", ".join(f"{t.name}_f[j]" for t in spec.outputs),
            when_given=structure.when_given,
            streamed=[t.name for t in spec.row_inputs if t.name not in structure.summed()],
        )


def backward_of_row_reduction(spec: OpSpec, reductions: list) -> OpSpec:
    """The backward of a row reduction (kgen.families.row_reduce: its reductions, each a stat = finalize(Σ
    summand), and its conventions' outputs), as a column reduction; see RowReduceFamily.backward."""
    structure = spec.structure
    dy = {t.name: sp.Symbol(gradient_name(t.name)) for t in spec.outputs}

    def slope(stat: str) -> sp.Symbol:
        return sp.Symbol(f"{stat}_slope")

    def grad_sum(stat: str) -> sp.Symbol:
        return sp.Symbol(f"grad_sum_{stat}")

    def back_summands(outputs: dict) -> list[sp.Expr]:
        """Per statistic (in the forward's order), the summand of its backward sum."""
        summands = [sp.S.Zero] * len(reductions)
        for k in reversed(range(len(reductions))):
            stat = reductions[k].stat
            summands[k] = sp.Add(
                *(dy[o] * derivative(e, stat) for o, e in outputs.items()),
                *(grad_sum(r.stat) * derivative(r.summand, stat) for r in reductions[k + 1 :]),
            )
        return summands

    per_convention = {c.name: back_summands(c.outputs) for c in structure.conventions}
    needed = [k for k in range(len(reductions)) if any(s[k] != 0 for s in per_convention.values())]
    forward = [  # the statistics again, with their slopes dF/dS
        RowSum(
            summand=r.summand,
            finalize={r.stat: r.finalize, slope(r.stat).name: derivative(r.finalize, "row_sum")},
        )
        for r in reductions
    ]
    sums, conventions = {}, []
    for c in structure.conventions:
        backward = [
            RowSum(
                summand=per_convention[c.name][k],
                finalize={grad_sum(reductions[k].stat).name: row_sum * slope(reductions[k].stat)},
            )
            for k in reversed(needed)
        ]
        sums[c.name] = forward + backward

        def gradient(v: str) -> sp.Expr:
            return sp.Add(
                *(dy[o] * derivative(e, v) for o, e in c.outputs.items()),
                *(grad_sum(reductions[k].stat) * derivative(reductions[k].summand, v) for k in needed),
            )

        conventions.append(
            Convention(
                name=c.name,
                matches=f"the gradient of {c.name} (its roundings to the dtype differentiate as the "
                "identity)",
                outputs={gradient_name(t.name): gradient(t.name) for t in spec.inputs},
            )
        )
    # a row input whose gradient is an earlier one's in every convention (x and residual of a fused add)
    # gets that tensor: written once
    rows = [gradient_name(t.name) for t in spec.inputs if t.per_row]
    shared = {}
    for i, name in enumerate(rows):
        same = (
            o
            for o in rows[:i]
            if o not in shared and all(c.outputs[o] == c.outputs[name] for c in conventions)
        )
        if (first := next(same, None)) is not None:
            shared[name] = first
    conventions = [
        c.model_copy(update={"outputs": {o: e for o, e in c.outputs.items() if o not in shared}})
        for c in conventions
    ]
    written = [t for t in spec.inputs if gradient_name(t.name) not in shared]
    required = [t for t in spec.inputs if not t.optional]
    optional = [t for t in spec.inputs if t.optional]
    incoming = [
        Tensor(name=gradient_name(t.name), dims=t.dims, doc=f"the gradient of {t.name}") for t in spec.outputs
    ]
    return OpSpec(
        name=f"{spec.name}_backward",
        summary=f"the gradient of {spec.name} ({spec.summary})",
        tensors=[
            *required,
            *incoming,
            *optional,
            *(
                Tensor(
                    name=gradient_name(t.name),
                    dims=t.dims,
                    role="output",
                    doc=f"the gradient of {t.name}",
                )
                for t in written
            ),
        ],
        params=spec.params,
        shared=shared,
        structure=ColumnReduce(
            sums=sums,
            conventions=conventions,
            when_given={gradient_name(t.name): t.name for t in optional if t.column},
        ),
        reference=backward_reference(
            spec, [t.name for t in required + incoming + optional], [t.name for t in written]
        ),
    )


family = ColumnReduceFamily()

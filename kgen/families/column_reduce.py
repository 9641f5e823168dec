"""The column reduction family: per row, sums over the row that give per-row scalars, then per element the
row's outputs and, for 'hidden' outputs, values summed over every row: a row reduction's backward (dx, the
weight's and the bias's gradients, and a broadcast input's: AdaLN's per-batch scale and shift), or any op that
reduces across rows.

Determinism: a column output is never accumulated with atomics. Each block takes a fixed partition of the
rows (block b, row slot s: rows (b · rows per block + s) + k · blocks · rows per block), sums its rows'
values in fp32 registers, adds its row slots' in shared memory in slot order and writes one partial row; a
second kernel adds the partial rows in a fixed order and rounds once to the dtype. An output shaped like a
broadcast input (`shaped_like`) is summed over the rows the input broadcasts over: a per-token [B, S, C]
input's is written per row; a per-batch [B, 1, C] input's is summed per batch, the partition then splitting
each batch's rows among its own blocks (block b of batch g, never rows of two batches) so that batch g's
partial rows are a contiguous run the second kernel adds alone; any other broadcast's is written per row to
scratch and summed to the input's shape by torch. The block count comes from the profile
([planner.column_reduce]: the threads resident per SM × the SMs), never grows with the row count, and the
same shape on the same build always sums in the same order: the result is bitwise identical run to run.

DSL: `ColumnReduce(sums={convention: [RowSum, ...]}, when_given={output: optional input},
shaped_like={output: broadcast input})`. Plan: threads per row by row size (the profile's ladder), the row's
accesses, the column inputs and the accumulators in registers within the profile's budget; beyond it the sums
and the outputs split into two kernels (the row scalars written between them, the outputs over row groups ×
column chunks, a partial row per group). Templates: codegen_templates/column_reduce/ and the [rows, hidden]
layout of rows/."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import sympy as sp
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..codegen import evaluate, statements
from ..dsl import (
    BUILTIN_SYMBOLS,
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
    access_bytes_of,
    bucket_description,
    convention_code,
    element_value,
    fake_dtype,
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
    gradient of an absent weight. ``shaped_like`` maps a '*rows hidden' output to a broadcast input: the
    output has the input's shape, each element the sum over the rows it broadcasts to (its gradient). The
    spec's ``passes`` maps such an output to the incoming gradient it equals (AdaLN shift's): where the input
    has every row the output is empty, not written, and the autograd hands that gradient on."""

    kind: str = "column_reduce"
    sums: dict[Identifier, list[RowSum]]
    when_given: dict[Identifier, Identifier] = {}
    shaped_like: dict[Identifier, Identifier] = {}

    dims = ("*rows hidden", "hidden")
    column_outputs: ClassVar[tuple[str, ...]] = ("hidden",)
    declares = frozenset(
        {
            "rows",
            "rows_of",
            "broadcast_rows_of",
            "accesses",
            "count",
            "lane",
            "slot",
            "partial",
            "row",
            "first",
            "scratch",
            "stats",
            "row_reduce_sums",
            "add_slots",
            "slot_sums",
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

    def read(self) -> set[str]:
        """The names any convention's summands, finalizes or outputs read."""
        exprs = [e for sums in self.sums.values() for s in sums for e in (s.summand, *s.finalize.values())]
        exprs += [e for c in self.conventions for e in c.outputs.values()]
        return {str(v) for e in exprs for v in e.free_symbols}

    def names(self) -> list[str]:
        return self.scalars()

    def levels(self) -> list[list[int]]:
        """Runs of consecutive sums whose summands (every convention's) read no scalar finalized in the run:
        one pass over the row and one reduction of its values each, every value reduced as alone."""
        runs, made = [], set()
        for k, first in enumerate(self.sums[self.conventions[0].name]):
            reads = {str(v) for sums in self.sums.values() for v in sums[k].summand.free_symbols}
            if not runs or reads & made:
                runs, made = [*runs, []], set()
            runs[-1].append(k)
            made |= set(first.finalize)
        return runs

    def check(self, spec: OpSpec) -> set[str]:
        if set(self.sums) != {c.name for c in self.conventions}:
            raise ValueError(
                f"structure.sums: one list of sums per convention {[c.name for c in self.conventions]}, "
                f"got {sorted(self.sums)}"
            )
        if any(t.packed for t in spec.tensors):
            raise ValueError("column_reduce ops take '*rows hidden' and 'hidden' tensors only")
        rows = {t.name for t in spec.row_outputs}
        broadcast = {t.name for t in spec.inputs if t.broadcast}
        if not set(self.shaped_like) <= rows or not set(self.shaped_like.values()) <= broadcast:
            raise ValueError(
                f"structure.shaped_like: maps '*rows hidden' outputs {sorted(rows)} to broadcast inputs "
                f"{sorted(broadcast)}; got {self.shaped_like}"
            )
        full = {(t.name, t.dtype) for t in spec.row_inputs if not (t.broadcast or t.optional)}
        dtype = {t.name: t.dtype for t in spec.outputs}
        if any(o not in self.shaped_like or (i, dtype[o]) not in full for o, i in spec.passes.items()) or any(
            c.outputs[o] != sp.Symbol(i) for c in self.conventions for o, i in spec.passes.items()
        ):
            raise ValueError(
                f"passes: outputs shaped like an input to row inputs they equal; got {spec.passes}"
            )
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
        summed = columns | set(self.shaped_like)
        if not set(self.when_given) <= summed or not set(self.when_given.values()) <= optional:
            raise ValueError(
                f"structure.when_given: maps 'hidden' outputs {sorted(columns)} or those shaped like an "
                f"input {sorted(self.shaped_like)} to optional inputs "
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
        if any(t < 1 or (t & (t - 1) if t <= 32 else t % 32) for t in steps) or steps != sorted(set(steps)):
            raise ValueError("threads_per_row: increasing, powers of two up to a warp, whole warps beyond")
        if steps[-1] > self.resident_threads_per_sm:
            raise ValueError("threads_per_row: the widest step must fit the resident threads of an SM")
        return self


@dataclass(frozen=True)
class ColumnReducePlan(KernelPlan):
    warp_size: int
    sm_count: int
    resident_threads_per_sm: int
    split_threads: int = 256  # a split row's outputs kernel: threads per block, one access of a row each ...
    split_rows: int = 1  # ... and the rows a thread loads before it computes them (loads in flight)

    def blocks(self, bucket: Bucket, rows: int, batches: int = 1) -> int:
        """The partition: at most the whole blocks resident at once (never more with more rows), split
        evenly among the batches (at least one each) when an output is summed per batch."""
        most = max(1, self.sm_count * max(1, self.resident_threads_per_sm // bucket.block_threads) // batches)
        return batches * min(-(-(rows // batches) // bucket.rows_per_block), most)

    def split_grid(self, rows: int, hidden: int, elems: int, batches: int = 1) -> tuple[int, int]:
        """A split row's outputs kernel: column chunks of split_threads accesses × row groups, as many
        groups as the resident blocks allow (at least one per batch, at most a batch's rows)."""
        chunks = -(-(hidden // elems) // self.split_threads)
        resident = self.sm_count * self.resident_threads_per_sm // self.split_threads
        return chunks, batches * max(1, min(rows // batches, resident // chunks // batches))


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
    levels: list[list[int]]  # runs of sums reduced together (ColumnReduce.levels)
    kernel_params: str
    launch_args: str
    input_args: str
    input_elems: str
    out_args: str
    out_elems: str
    when_given: dict[str, str]
    streamed: list[str]  # row inputs only the outputs read: loaded there, not held with the row
    unread: list[str]  # row inputs no expression reads (an AdaLN shift): passed for their shape, never loaded
    held: list[Tensor]  # the others: held on chip (registers, staged or re-read) with the row
    shaped_like: dict[str, str]  # an output shaped like a broadcast input -> that input
    passes: dict[str, str]  # such an output -> the row input it equals (not written where it has every row)
    summed_outputs: list[Tensor]  # the column outputs, then those shaped like an input: fp32 sums per block
    workspace: bool  # the launcher takes fp32 scratch (partial rows, a split row's scalars) from the binding


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
        # one partition for every dtype (the kernels share the arch's constants): sized for 16-bit elements,
        # whose vector access carries the most fp32 sums
        widest = profile.max_access_bytes // 2
        resident, budget = self._resident(profile, facts, spec, profile.max_access_bytes, widest)
        # a split row's outputs kernel: the rows whose accesses (16-bit) a thread holds within the budget
        row_bytes = sum(access_bytes_of(t, 2, widest) for t in spec.row_inputs)
        split_rows = max(1, min(4, budget // max(1, row_bytes)))
        buckets = self._buckets(profile, facts, spec, elem, vector, resident, budget) + self._buckets(
            profile, facts, spec, elem, 1, resident, budget
        )
        halved = (
            f" halved to {resident} while one access of the row's held inputs and the fp32 sums "
            f"({self._held_bytes(spec, profile.max_access_bytes, widest)} B at 16 bits) exceeds a thread's "
            "budget, which grows by "
            "the registers freed"
            if resident < facts.resident_threads_per_sm
            else ""
        )
        wide = [t.name for t in spec.tensors if t.dtype == "float32"]
        notes = vector_notes(
            dtype, vector, elem, ", ".join(t.name for t in spec.tensors) + " are", "", wide
        ) | {
            "scalar path": "otherwise one element per access: correct for any alignment and any hidden size",
            "partition": f"at most {resident} threads per SM × {profile.sm_count} SMs of blocks (profile "
            f"planner.column_reduce.resident_threads_per_sm{halved}), each summing a fixed set of "
            "rows into one fp32 partial row per block (its row slots' added in order in shared memory); "
            "a second kernel adds them in a fixed order: deterministic, no atomics",
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
            resident,
            split_rows=split_rows,
        )

    @staticmethod
    def _held(spec: OpSpec) -> list[Tensor]:
        """The row inputs the sums read: held on chip with the row (the others are loaded by the outputs)."""
        return [t for t in spec.row_inputs if t.name in spec.structure.summed()]

    def _held_bytes(self, spec: OpSpec, access_bytes: int, elems: int) -> int:
        """One access of the row inputs the sums read and the fp32 sums of every summed output."""
        held = self._held(spec)
        summed = len(spec.column_outputs) + len(spec.structure.shaped_like)
        elem = access_bytes // elems
        return sum(max(4, access_bytes_of(t, elem, elems)) for t in held) + summed * elems * 4

    def _resident(self, profile, facts, spec, access_bytes, elems) -> tuple[int, int]:
        """The threads resident per SM and a thread's register budget (bytes): the profile's, or fewer
        threads while one vector access does not fit (at most down to 256), each budget growing by half the
        registers freed: the other half goes to the temporaries of the gradients' math (with all of them,
        adaln_rmsnorm's bf16 kernel took 2 accesses and spilled 220 B at 128 registers, nvcc 13.0, sm_90).
        The ladder then stops at the resident threads."""
        resident, budget = facts.resident_threads_per_sm, facts.register_bytes_per_thread
        need = self._held_bytes(spec, access_bytes, elems)
        while need > budget and resident > 256:
            freed = profile.registers_per_sm // (resident // 2) - profile.registers_per_sm // resident
            budget += freed // 2 * 4
            resident //= 2
        return resident, budget

    def _buckets(self, profile, facts, spec, elem, elems, resident, budget_bytes) -> list[Bucket]:
        access_bytes = elem * elems
        held_bytes = max(4, access_bytes)  # a 16-bit element alone still takes a 32-bit register
        summed = len(spec.column_outputs) + len(spec.structure.shaped_like)
        held, read = self._held(spec), spec.structure.read()
        rows_only = self._held_bytes(spec, access_bytes, elems)
        # at most 4 accesses: 8 scalar accesses of layernorm's 4 inputs and 2 sums spilled at 64 registers
        # (nvcc 13.0, sm_90)
        accesses = max(1, min(4, budget_bytes // max(1, rows_only)))  # nothing held: a spec's sums of params

        def register_bytes(tensors: list[Tensor]) -> str:  # their share of one access, as text
            if all(t.dtype == "io" for t in tensors):
                return f" × {held_bytes} B"
            return f", {sum(max(4, access_bytes_of(t, elem, elems)) for t in tensors)} B"

        column_bytes = sum(max(4, access_bytes_of(t, elem, elems)) for t in spec.column_inputs)
        columns = accesses * (rows_only + column_bytes) <= budget_bytes
        budget = (
            f"{accesses} × ({len(held)} row inputs{register_bytes(held)} + {summed} × {elems} fp32 sums) per "
            "thread"
            + (
                f" and the column inputs ({len(spec.column_inputs)}{register_bytes(spec.column_inputs)}), "
                "loaded once per block,"
                if columns
                else ""
            )
            + f" within the {budget_bytes} B budget (profile planner.column_reduce.register_bytes_per_thread"
            + (
                f", {facts.register_bytes_per_thread} B, grown with {resident} threads resident per SM)"
                if budget_bytes != facts.register_bytes_per_thread
                else ")"
            )
            + (
                ""
                if columns or not spec.column_inputs
                else "; the column inputs do not fit beside them and are re-read per row (L1 hits)"
            )
            + "".join(
                f"; {t.name}, which only the outputs read, is loaded there, not held"
                if t.name in read
                else f"; {t.name}, which nothing reads, is not loaded (its shape alone is used)"
                for t in spec.row_inputs
                if t not in held
            )
        )
        # the slot's next row copied into shared memory while this one is reduced: two buffers of the row
        # inputs' accesses for every resident thread, within 3/4 of the SM's shared memory (the rest stays L1
        # for the column inputs re-read per row); cp.async copies 4, 8 or 16 bytes
        slot_bytes = max((access_bytes_of(t, elem, elems) for t in spec.row_inputs), default=access_bytes)
        staged_bytes = 2 * accesses * sum(t.name in read for t in spec.row_inputs) * slot_bytes * resident
        staged = (
            profile.async_copy
            and held
            and access_bytes >= 4
            and staged_bytes <= profile.shared_memory_per_sm * 3 // 4
        )
        storage = (
            f"staged: {budget}; the slot's next row is copied (cp.async) into shared memory while this one "
            f"is reduced, {staged_bytes // 1024} KB per SM in two buffers (within 3/4 of profile "
            "shared_memory_per_sm): two rows in flight per slot"
            if staged
            else f"registers: {budget}"
        )
        out = []
        for threads in (t for t in facts.threads_per_row if t <= resident):
            rows_per_block = max(1, profile.planner.block_threads // threads)
            out.append(
                Bucket(
                    threads * accesses * access_bytes,
                    elems,
                    threads,
                    rows_per_block,
                    accesses,
                    "staged" if staged else "registers",
                    columns,
                    {
                        "threads_per_row": f"{threads}: the narrowest step of the profile's ladder "
                        "(planner.column_reduce.threads_per_row) that holds the row",
                        "rows_per_block": f"{rows_per_block}: {profile.planner.block_threads} threads per "
                        f"block / {threads} per row"
                        if rows_per_block > 1
                        else "1: a row needs the whole block",
                        "storage": storage,
                    },
                )
            )
        threads = min(512, resident, facts.threads_per_row[-1])
        out.append(
            Bucket(
                None,
                elems,
                threads,
                1,
                1,
                "split",
                False,
                {
                    "threads_per_row": f"{threads}: at most 512, so a thread may hold more than 64 registers "
                    "(the 1024-thread fp32 kernel spilled at 64, nvcc 13.0, sm_90)",
                    "rows_per_block": "1: a row needs the whole block",
                    "storage": "split: the row exceeds the register budget: one kernel computes each row's "
                    "sums (each pass re-reads the row, mostly from L2) and writes its scalars, a second the "
                    "outputs over row groups × column chunks, a group's column sums in registers",
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
        per_batch = case.per_batch and len(case.shape) > 2 and bool(spec.structure.shaped_like)
        batches = math.prod(case.shape[:-2]) if per_batch else 1
        grid = kernel.blocks(b, rows, batches)
        choices = [
            (
                "accesses",
                f"{b.elems_per_access * kernel.elem_bytes} B ({b.elems_per_access} elements)",
                kernel.notes["vector path" if vector else "scalar path"],
            ),
            ("threads per row", str(b.threads_per_row), b.reasons["threads_per_row"]),
            ("rows per block", str(b.rows_per_block), b.reasons["rows_per_block"]),
            ("row lives in", b.storage, b.reasons["storage"]),
        ]
        split, slots = b.storage == "split", grid
        what = (
            "the sums kernel: the blocks resident at once, a row each" if split else kernel.notes["partition"]
        )
        choices.append(
            ("grid", f"{grid} blocks" + (f", {grid // batches} per batch" if per_batch else ""), what)
        )
        if split:
            chunks, slots = kernel.split_grid(rows, hidden, b.elems_per_access, batches)
            why = f"a row group per resident block of {kernel.split_threads} threads and column chunk; each "
            why += f"loads {kernel.split_rows} rows (within planner.column_reduce.register_bytes_per_thread)"
            choices.append(("outputs grid", f"{chunks} column chunks × {slots} row groups", why))
        per = "row group" if split else "block"
        choices.append(
            (
                "partial rows",
                f"{slots} × {hidden} fp32 per column output" + (" and per-batch output" if per_batch else ""),
                f"one per {per}, added in a fixed order by the second kernel (the column sums)",
            )
        )
        return LaunchPlan(
            kernel, b, rows, hidden, grid, 0, min_bytes(self, spec, case, kernel.elem_bytes), choices
        )

    def check_tolerance(self, spec: OpSpec, atol: float, rtol: float) -> tuple[float, float]:
        """A column output adds up to 1000 rows (the example shapes): the roundings of its terms to the dtype
        (a convention's, which the float64 reference leaves out) grow like √rows, so its absolute tolerance is
        32× (≈ √1000) the per-element one; so has an output summed per batch."""
        return (32 * atol, rtol) if spec.column_outputs or spec.structure.shaped_like else (atol, rtol)

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
        named = {t.name: v for t, v in zip(spec.inputs, inputs)}
        out = []
        for t in spec.outputs:
            value = torch.as_tensor(evaluate(outputs[t.name], values, io), dtype=torch.float64).expand(shape)
            given = structure.when_given.get(t.name)
            absent = given and named[given] is None
            if absent:
                value = value.new_empty(0)
            elif t.column:
                value = value.reshape(-1, shape[-1]).sum(0)
            elif t.name in spec.passes and named[structure.shaped_like[t.name]].shape == shape:
                value = value.new_empty(0)  # the autograd hands the input it equals on
            elif like := structure.shaped_like.get(t.name):
                value = value.sum_to_size(named[like].shape)
            out.append(value)
        return tuple(out)

    def tensor_shape(self, spec: OpSpec, tensor, case: Case) -> tuple[int, ...]:
        like = spec.structure.shaped_like.get(tensor.name)
        return super().tensor_shape(
            spec, next(t for t in spec.inputs if t.name == like) if like else tensor, case
        )

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
        """Edge and real sizes; with broadcast inputs also per batch, a batch's rows fewer and more than a
        block's."""
        cases = [Case(s) for s in [(1, 1), (3, 7), (4, 128), (2, 5, 4096), (1000, 96), (2, 20000)]]
        if spec.structure.shaped_like:
            cases += [Case(s, per_batch=True) for s in [(3, 7, 96), (2, 700, 64), (2, 5, 4096)]]
        return cases

    # -- render ----------------------------------------------------------------------------------------------
    def kernel_arguments(self, spec: OpSpec) -> tuple[str, str]:
        """The [rows, hidden] layout's, then each column output and each output shaped like a broadcast input
        as its fp32 partial rows (null where an output like a per-token input is written per row)."""
        params, args = super().kernel_arguments(spec)
        summed = self.summed_outputs(spec)
        partials = [f"float* __restrict__ {t.name}_partials" for t in summed]
        slots = [f"partials[{i}]" for i in range(len(summed))]
        return ", ".join([params, *partials]), ", ".join([args, *slots])

    @staticmethod
    def summed_outputs(spec: OpSpec) -> list[Tensor]:
        return spec.column_outputs + [t for t in spec.outputs if t.name in spec.structure.shaped_like]

    def context(self, spec: OpSpec, profile: ArchProfile, plans: list[KernelPlan]) -> ColumnReduceContext:
        structure = spec.structure
        read = structure.read()
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
        return ColumnReduceContext(
            conventions=conventions,
            templates=self.templates,
            fake_outputs=[self._fake_output(spec, t) for t in spec.outputs],
            scalars=structure.scalars(),
            n_sums=len(structure.sums[spec.default_convention]),
            levels=structure.levels(),
            kernel_params=kernel_params,
            launch_args=launch_args,
            input_args=", ".join(f"float {t.name}" for t in inputs),
            input_elems=", ".join(element_value(t, f"{t.name}_v") for t in inputs),
            out_args=", ".join(f"float& {t.name}{RESULT}" for t in spec.outputs),
            out_elems=", ".join(f"{t.name}_f[j]" for t in spec.outputs),
            when_given=structure.when_given,
            streamed=[t.name for t in spec.row_inputs if t.name in read - structure.summed()],
            unread=[t.name for t in spec.row_inputs if t.name not in read],
            held=self._held(spec),
            shaped_like=structure.shaped_like,
            passes=spec.passes,
            summed_outputs=self.summed_outputs(spec),
            workspace=True,
        )

    @staticmethod
    def _fake_output(spec: OpSpec, t: Tensor) -> str:
        lead, structure = spec.lead.name, spec.structure
        shape = (
            f"{structure.shaped_like[t.name]}.shape"
            if t.name in structure.shaped_like
            else f"{lead}.shape[-1:]"
            if t.column
            else f"{lead}.shape"
        )
        if given := structure.when_given.get(t.name):
            shape = f"{shape} if {given} is not None else [0]"
        if t.name in spec.passes:
            shape = f"[0] if {shape} == {lead}.shape else {shape}"
        return (
            f"{lead}.new_empty({shape}{', dtype=torch.float32' if t.dtype == 'float32' else ''})"
            if t.column or given or t.name in spec.passes
            else f"torch.empty({shape}, dtype={fake_dtype(t, spec.lead)}, device={lead}.device)"
        )


family = ColumnReduceFamily()

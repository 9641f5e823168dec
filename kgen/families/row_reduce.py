"""The row reduction family: per-row statistics over the last dim, then an elementwise epilogue (norms,
AdaLN).

DSL: `RowReduce(prologue, reductions, conventions)`. Plan: a ladder of threads per row by row size (profile
[planner.row_reduce]), rows kept in registers, shared memory or re-read, a grid-fill rule. Templates:
codegen_templates/row_reduce/ and the [rows, hidden] layout shared with elementwise ops (rows/)."""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..codegen import evaluate, statements
from ..dsl import BUILTIN_SYMBOLS, Identifier, OpSpec, Structure, SympyExpr, _Model, check_symbols
from ..errors import PlanError
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
    io_rounding,
    min_bytes,
    printed_names,
    rows_fake_outputs,
    vector_notes,
)

row_sum = sp.Symbol("row_sum")


class Reduction(_Model):
    """``stat = finalize(row_sum)`` where ``row_sum`` is the fp32 sum of ``summand`` over the row."""

    stat: Identifier
    summand: SympyExpr
    finalize: SympyExpr


class RowReduce(Structure):
    """An optional prologue (per-element values computed from the '*rows hidden' inputs, kept on chip in
    the I/O dtype in their place, e.g. r = x + residual), reductions over the last dim (in order; a later
    one may use earlier stats), then an elementwise epilogue per convention. Row inputs that only the
    epilogue uses are read there, not kept on chip. Symbols: every statistic (in an epilogue, all of them;
    in a reduction, the earlier ones), and ``row_sum`` inside a reduction's ``finalize``."""

    kind: str = "row_reduce"
    prologue: dict[Identifier, SympyExpr] = {}
    reductions: list[Reduction] = Field(min_length=1)

    dims = ("*rows hidden", "hidden")
    # the [rows, hidden] binding's locals, the kernel's locals, helpers and loop variables
    declares = frozenset(
        {
            "rows",
            "inner",
            "rows_of",
            "broadcast_rows_of",
            "accesses",
            "fetch",
            "from_global",
            "lane",
            "partial",
            "row",
            "scratch",
            "col",
            "per_row",
            "positions",
            "stride",
            "row_reduce_sum",
            "for_each_access",
            "row_sum",
            "i",
            "j",
            "g",
            "k",
        }
    )

    def names(self) -> list[str]:
        return [r.stat for r in self.reductions] + list(self.prologue)

    def check(self, spec: OpSpec) -> set[str]:
        row_names = {t.name for t in spec.row_inputs}
        known = {p.name for p in spec.params} | BUILTIN_SYMBOLS
        for name, expr in self.prologue.items():
            check_symbols(expr, row_names | known, f"structure.prologue.{name}")
        if (
            self.prologue
            and not set().union(*(map(str, e.free_symbols) for e in self.prologue.values())) & row_names
        ):
            raise ValueError(
                "structure.prologue: reads no '*rows ...' input (its values stand for the row's)"
            )
        values = set(row_values(spec))  # what the later passes read from the row
        if stored := [t.name for t in spec.row_inputs if t.name in values and t.dtype == "float32"]:
            raise ValueError(
                f"{stored}: float32 row inputs the reductions read would be kept on chip in the I/O dtype; "
                "read them in a prologue, or give them the I/O dtype"
            )
        for i, red in enumerate(self.reductions):
            check_symbols(red.summand, values | known, f"structure.reductions.{i}.summand", False)
            check_symbols(red.finalize, known | {"row_sum"}, f"structure.reductions.{i}.finalize", False)
            known.add(red.stat)
        for i, conv in enumerate(self.conventions):
            if not set(conv.prologue) <= set(self.prologue):
                raise ValueError(
                    f"structure.conventions.{i}.prologue: may only replace the structure's prologue "
                    f"values {sorted(self.prologue)}, got {sorted(conv.prologue)}"
                )
            for name, expr in conv.prologue.items():
                check_symbols(
                    expr,
                    row_names | known - {r.stat for r in self.reductions},
                    f"structure.conventions.{i}.prologue.{name}",
                )
        return values | {t.name for t in spec.column_inputs} | set(late_inputs(spec)) | set(self.names())


def row_values(spec: OpSpec) -> list[str]:
    """The per-element values kept on chip: the prologue's, else the row inputs the reductions read (the lead
    always)."""
    structure = spec.structure
    if structure.prologue:
        return list(structure.prologue)
    used = {str(s) for r in structure.reductions for s in r.summand.free_symbols}
    return [t.name for t in spec.row_inputs if t.name in used or t is spec.lead]


def late_inputs(spec: OpSpec) -> list[str]:
    """The row inputs only the epilogue reads (read there, never kept on chip)."""
    structure = spec.structure
    prologues = [structure.prologue] + [c.prologue for c in structure.conventions]
    early = {str(s) for p in prologues for e in p.values() for s in e.free_symbols} | set(row_values(spec))
    return [t.name for t in spec.row_inputs if t.name not in early]


class LadderStep(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_row_bytes: int = Field(gt=0)
    threads: int = Field(gt=0)


class RowReduceFacts(BaseModel):
    """[planner.row_reduce] of an arch profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    row_register_bytes_per_thread: int = Field(ge=16, multiple_of=16)
    threads_per_row: list[LadderStep] = Field(min_length=1)
    min_blocks_per_sm: int = Field(ge=1)
    resident_blocks: int = Field(ge=1)
    # steps of the ladder taken wider by 16-bit rows of ops with one reduction and no float32 tensor
    one_reduction_threads_per_row: list[LadderStep] = []

    @model_validator(mode="after")
    def _ladder(self) -> RowReduceFacts:
        steps, wider = self.threads_per_row, self.one_reduction_threads_per_row
        if any(b.max_row_bytes <= a.max_row_bytes for a, b in zip(steps, steps[1:])):
            raise ValueError("threads_per_row: max_row_bytes must increase step by step")
        for step in steps + wider:
            if step.threads & (step.threads - 1):
                raise ValueError(f"threads_per_row: threads must be a power of two, got {step.threads}")
        if extra := {s.max_row_bytes for s in wider} - {s.max_row_bytes for s in steps}:
            raise ValueError(
                f"one_reduction_threads_per_row: {min(extra)} B is not a step of threads_per_row"
            )
        return self

    def ladder(self, one_reduction: bool) -> list[tuple[LadderStep, str]]:
        """(step, its profile key): the ladder, with the one-reduction steps where they apply."""
        wider = {s.max_row_bytes: s for s in self.one_reduction_threads_per_row if one_reduction}
        key = "one_reduction_threads_per_row"
        return [
            (wider[s.max_row_bytes], key) if s.max_row_bytes in wider else (s, "threads_per_row")
            for s in self.threads_per_row
        ]


@dataclass(frozen=True)
class RowReducePlan(KernelPlan):
    warp_size: int  # lanes of one shuffle reduction
    min_blocks_per_sm: int  # the grid-fill rule: fewer blocks than this per SM of the device spread rows ...
    min_blocks: int  # ... (× the profile board's SMs: what explain shows, the launcher's fallback)
    resident_blocks: int  # an SM, asked of the compiler for blocks of <= resident_block_threads ...
    resident_block_threads: int  # ... that do not hold the per-column inputs

    @property
    def register_buckets(self) -> list[Bucket]:
        return [b for b in self.buckets if b.storage == "registers"]


@dataclass(frozen=True)
class RowLaunch(LaunchPlan):
    widened: str | None  # why the launcher took a wider configuration than the row size asks for
    columns_early: bool  # per-column inputs loaded with the row (one-wave grids) or after the reduction


@dataclass(frozen=True)
class ReductionCode:
    stat: str
    summand_src: str
    finalize_src: str
    summand: list[str]
    finalize: list[str]


@dataclass(frozen=True)
class RowReduceContext(FamilyContext):
    reductions: list[ReductionCode]
    values: list[str]  # kept on chip between passes
    prologue: bool
    early_inputs: list
    late_inputs: list
    kernel_params: str
    launch_args: str
    row_args: str
    value_args: str
    values_j: str
    prologue_out_args: str
    prologue_elems: str
    all_args: str
    value_elems: str
    epilogue_elems: str
    out_args: str
    out_elems: str


_SCRATCH_BYTES = 4 * 1024  # shared memory reserved for the per-warp partial sums of the reductions
_RESIDENT_REGISTERS = 64  # a thread's, where several blocks are asked (at 48 fused_add_rmsnorm spilled)


class RowReduceFamily(RowsFamily):
    name = "row_reduce"
    structure = RowReduce
    facts = RowReduceFacts
    templates = Templates(
        kernel="row_reduce/kernel.cu.j2",
        args="rows/args.h.j2",
        binding="rows/binding.cpp.j2",
        fake="rows/fake.py.j2",
        inputs="rows/inputs.md.j2",
    )

    def check_facts(self, profile: ArchProfile) -> RowReduceFacts:
        facts = super().check_facts(profile)
        widest = max(facts.threads_per_row[-1].threads, profile.planner.block_threads)
        for key in ("threads_per_row", "one_reduction_threads_per_row"):
            if any(s.threads > profile.max_threads_per_block for s in getattr(facts, key)):
                raise ValueError(f"planner.row_reduce.{key} asks for more threads than max_threads_per_block")
        if facts.row_register_bytes_per_thread // 4 > profile.register_cap(widest) // 2:
            raise ValueError(
                f"planner.row_reduce.row_register_bytes_per_thread: {facts.row_register_bytes_per_thread}"
                f" B is more than half the {profile.register_cap(widest)} registers a thread of a "
                f"{widest}-thread block may hold"
            )
        return facts

    # -- plan ------------------------------------------------------------------------------------------------
    def plan(
        self, spec: OpSpec, profile: ArchProfile, dtype: str, tuning: TuningTable | None
    ) -> RowReducePlan:
        """The rules of the profile, except where ``tuning`` (a `kgen tune` table) measured better threads
        for a vector configuration."""
        facts, elem = self.check_facts(profile), DTYPE_BYTES[dtype]
        vector = profile.max_access_bytes // elem
        # a float32 column input holds twice the registers of a 16-bit one
        values, columns = (
            len(row_values(spec)),
            sum(access_bytes_of(t, elem, 1) / elem for t in spec.column_inputs),
        )

        def tuned(max_row_bytes, rule):
            return tuning.threads(spec.name, dtype, max_row_bytes, rule) if tuning else (None, "")

        wide = [t.name for t in spec.tensors if t.dtype == "float32"]
        # one block-wide reduction a row affords more threads than two (a barrier each); measured on 16-bit
        # rows; float32 inputs took more registers a thread and lost (bench/results/ladder-h100-2026-12-06)
        ladder = facts.ladder(len(spec.structure.reductions) == 1 and not wide and elem == 2)
        buckets = self._buckets(profile, facts, ladder, elem, vector, values, columns, tuned) + self._buckets(
            profile, facts, ladder, elem, 1, values, columns, tuned
        )
        largest = max(
            facts.threads_per_row[-1].threads * facts.row_register_bytes_per_thread,
            profile.max_shared_memory_per_block - _SCRATCH_BYTES,
        )
        # a float32 tensor keeps 1: at 64 registers residual_layernorm_fp32's bf16 kernels spilled 12 B
        blocks = 1 if wide else facts.resident_blocks
        resident_threads = profile.registers_per_sm // (blocks * _RESIDENT_REGISTERS)
        notes = vector_notes(
            dtype, vector, elem, ", ".join(t.name for t in spec.tensors) + " are", "", wide
        ) | {
            "scalar path": "otherwise one element per access, the row re-read from L2 instead of cached: "
            "correct for any alignment and any hidden size",
            "clusters": (
                f"not used: one block holds rows up to {largest // 1024} KB on chip, beyond any hidden "
                "size in the shape suite"
                if profile.clusters
                else f"not available on {profile.name} (profile: clusters = false)"
            ),
            "bulk copies (TMA)": (
                "not used: each thread's 16-byte loads put its part of the row straight into registers"
                if profile.tma
                else f"not available on {profile.name} (profile: tma = false)"
            ),
            "block_threads": f"{profile.planner.block_threads} threads per block when rows are short "
            "(profile planner.block_threads)",
            "warp size": f"{profile.warp_size} lanes per shuffle reduction (profile warp_size)",
            "grid fill": f"at least {facts.min_blocks_per_sm} blocks per SM × {profile.sm_count} SMs "
            "(profile planner.row_reduce.min_blocks_per_sm; a launch counts its device's SMs), else rows "
            "spread over more threads",
            "resident blocks": f"{blocks} an SM asked of the compiler for blocks of <= {resident_threads} "
            f"threads not holding the per-column inputs ({_RESIDENT_REGISTERS} registers a thread; profile "
            "planner.row_reduce.resident_blocks; 1 with a float32 tensor), else 1: ptxas takes what it needs",
        }
        return RowReducePlan(
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
            facts.min_blocks_per_sm,
            facts.min_blocks_per_sm * profile.sm_count,
            blocks,
            resident_threads,
        )

    def _buckets(
        self, profile, facts, ladder, elem, elems_per_access, row_values, column_inputs, tuned
    ) -> list[Bucket]:
        access_bytes = elem * elems_per_access
        out = []
        for step, key in ladder:
            # the tuning table measured the vector configurations only
            choice, why = tuned(step.max_row_bytes, step.threads) if elems_per_access > 1 else (None, "")
            threads = choice or step.threads
            rows_per_block = max(1, profile.planner.block_threads // threads)
            reasons = {
                "threads_per_row": why
                if choice
                else f"{threads}: rows up to {step.max_row_bytes} B (profile planner.row_reduce.{key}"
                + ("; 16-bit rows, one reduction, no float32 tensor)" if key.startswith("one") else ")")
                + why,
                "rows_per_block": (
                    f"{rows_per_block}: {profile.planner.block_threads} threads per block / {threads} per row"
                    if rows_per_block > 1
                    else "1: a row needs the whole block"
                ),
            }
            columns = False
            if elems_per_access > 1:
                accesses = -(-step.max_row_bytes // (access_bytes * threads))
                budget = facts.row_register_bytes_per_thread
                if row_values * accesses * access_bytes > budget:
                    if choice:
                        raise PlanError(
                            f"arch/tuning/{profile.name}.toml: {threads} threads per row for rows up to "
                            f"{step.max_row_bytes} B would hold {row_values * accesses * access_bytes} B "
                            f"per thread, over the {budget} B register budget; re-run `kgen tune`"
                        )
                    continue  # several row values would not fit: longer steps or shared memory take them
                cap = profile.register_cap(threads * rows_per_block)
                reasons["storage"] = (
                    f"registers: {accesses} × {access_bytes} B per thread, within the {budget} B "
                    f"budget (profile planner.row_reduce.row_register_bytes_per_thread; "
                    f"{budget // 4} of the {cap} registers a thread of this block may hold): "
                    "one read, one write"
                )
                storage = "registers"
                held = int((row_values + column_inputs) * accesses * access_bytes)
                columns = column_inputs > 0 and held <= budget
                if column_inputs:
                    reasons["columns"] = (
                        f"{held} B per thread with the row fits the {budget} B budget"
                        if columns
                        else f"{held} B per thread with the row would exceed the {budget} B budget"
                    )
            else:
                accesses = 1
                reasons["storage"] = "global: scalar path re-reads the row (from L2) instead of caching it"
                storage = "global"
            out.append(
                Bucket(
                    step.max_row_bytes,
                    elems_per_access,
                    threads,
                    rows_per_block,
                    accesses,
                    storage,
                    columns,
                    reasons,
                )
            )

        threads = facts.threads_per_row[-1].threads
        largest_in_registers = threads * facts.row_register_bytes_per_thread
        shared_limit = (profile.max_shared_memory_per_block - _SCRATCH_BYTES) // row_values
        if elems_per_access > 1 and shared_limit > largest_in_registers:
            out.append(
                Bucket(
                    shared_limit,
                    elems_per_access,
                    threads,
                    1,
                    1,
                    "shared",
                    False,
                    {
                        "threads_per_row": f"{threads}: the longest ladder step",
                        "rows_per_block": "1: a row needs the whole block",
                        "storage": (
                            f"shared memory: beyond {largest_in_registers // 1024} KB in registers, up to "
                            f"the "
                            f"profile's {profile.max_shared_memory_per_block // 1024} KB per block less "
                            f"{_SCRATCH_BYTES // 1024} KB scratch: one read, one write"
                        ),
                    },
                )
            )
        out.append(
            Bucket(
                None,
                elems_per_access,
                threads,
                1,
                1,
                "global",
                False,
                {
                    "threads_per_row": f"{threads}: the longest ladder step",
                    "rows_per_block": "1: a row needs the whole block",
                    "storage": "global: the row exceeds every on-chip budget; the second pass re-reads it "
                    "(mostly from L2)",
                },
            )
        )
        return out

    @staticmethod
    def _held(bucket: Bucket, row_bytes: int, elem_bytes: int) -> str:
        """The storage reason; for registers, with this row's accesses a thread where the configuration (sized
        for its longest row) would hold more."""
        access = bucket.elems_per_access * elem_bytes
        held = -(-row_bytes // (access * bucket.threads_per_row))
        if bucket.storage != "registers" or held >= bucket.max_accesses_per_thread:
            return bucket.reasons["storage"]
        rest = bucket.reasons["storage"].removeprefix("registers: ")
        return f"registers: {held} × {access} B per thread at this row, of the configuration's {rest}"

    def launch(self, spec: OpSpec, profile: ArchProfile, kernel: RowReducePlan, case: Case) -> RowLaunch:
        rows, hidden = case.rows, case.shape[-1]
        row_bytes = hidden * kernel.elem_bytes
        vector = hidden % kernel.vector_elems == 0
        vector_reason = (
            f"hidden {hidden} is a multiple of {kernel.vector_elems}: {kernel.vector_bytes}-byte accesses"
            if vector
            else f"hidden {hidden} is not a multiple of {kernel.vector_elems}: scalar accesses"
        )
        candidates = [b for b in kernel.buckets if b.vectorized == vector]
        index = next(
            i for i, b in enumerate(candidates) if b.max_row_bytes is None or row_bytes <= b.max_row_bytes
        )
        bucket, widened = widen(candidates, index, rows, hidden, kernel.min_blocks), None
        if bucket is not candidates[index]:
            widened = (
                f"{-(-rows // candidates[index].rows_per_block)} blocks would be under {kernel.min_blocks} "
                f"({kernel.notes['grid fill']}): the launcher spreads each row over {bucket.threads_per_row} "
                f"threads instead of {candidates[index].threads_per_row}"
            )
        grid = -(-rows // bucket.rows_per_block)
        columns_early = bucket.columns_fit and one_wave(grid, bucket, profile)
        shared = row_bytes if bucket.storage == "shared" else 0
        b = bucket
        choices = [
            (
                "accesses",
                f"{b.elems_per_access * kernel.elem_bytes} B ({b.elems_per_access} elements)",
                vector_reason + "; " + kernel.notes["vector path" if b.vectorized else "scalar path"],
            ),
            ("threads per row", str(b.threads_per_row), widened or b.reasons["threads_per_row"]),
            ("rows per block", str(b.rows_per_block), b.reasons["rows_per_block"]),
            ("block", f"{b.block_threads} threads", "threads per row × rows per block"),
            (
                "reduction",
                reduction(b, kernel.warp_size),
                f"threads per row <= warp size ({kernel.warp_size})"
                if b.threads_per_row <= kernel.warp_size
                else f"{b.threads_per_row // kernel.warp_size} warps per row exchange partial sums once",
            ),
            ("row lives in", b.storage, self._held(b, row_bytes, kernel.elem_bytes)),
        ]
        if "columns" in b.reasons:
            waves = (
                "one wave: every block resident"
                if columns_early or not b.columns_fit
                else "several waves: registers are better spent on occupancy"
            )
            choices.append(
                (
                    "weight",
                    "with the row" if columns_early else "after the reduction",
                    f"{b.reasons['columns']}; {waves}",
                )
            )
        held = b.block_threads <= kernel.resident_block_threads and not columns_early
        resident = str(kernel.resident_blocks if held else 1)
        choices += [
            ("resident blocks", resident, kernel.notes["resident blocks"]),
            ("clusters", "no", kernel.notes["clusters"]),
            (
                "grid",
                f"{grid} blocks",
                f"ceil({rows} rows / {b.rows_per_block}) on {profile.sm_count} SMs "
                f"({grid / profile.sm_count:.1f} blocks per SM)",
            ),
            ("shared memory", f"{shared} B dynamic", "the row" if shared else "only reduction scratch"),
        ]
        return RowLaunch(
            kernel,
            bucket,
            rows,
            hidden,
            grid,
            shared,
            min_bytes(self, spec, case, kernel.elem_bytes),
            choices,
            widened,
            columns_early,
        )

    def evaluate(self, spec: OpSpec, inputs: list, params: list, convention: str) -> tuple:
        """The prologue's values rounded to the I/O dtype (kept on chip in it), each reduction summed over the
        row in turn, then the epilogue."""
        structure, io = spec.structure, io_rounding(inputs[0].dtype)
        conv = structure.convention(convention)
        values, shape = self.values(spec, inputs, params)
        for name, expr in (structure.prologue | conv.prologue).items():
            values[name] = io(evaluate(expr, values, io).expand(shape))
        for r in structure.reductions:
            row_sum = evaluate(r.summand, values, io).expand(shape).sum(-1, keepdim=True)
            values[r.stat] = evaluate(r.finalize, values | {"row_sum": row_sum}, io)
        return tuple(evaluate(conv.outputs[t.name], values, io).expand(shape) for t in spec.outputs)

    # -- backward --------------------------------------------------------------------------------------------
    def backward(self, spec: OpSpec) -> OpSpec | None:
        """A column reduction (kgen.families.column_reduce), derived from the spec: per row it recomputes the
        statistics from the inputs (on chip, no bytes: nothing but the inputs is saved, or a saved sum, below)
        with each one's slope dF/dS, then in reverse order one sum per statistic, the gradient reaching its
        row sum S:
        dL/dS_k = F_k'(S_k) · Σ_j (Σ_o dy_o ∂y_o/∂stat_k + Σ_{m>k} dL/dS_m ∂summand_m/∂stat_k); then per
        element the gradient of each row input, Σ_o dy_o ∂y_o/∂v + Σ_k dL/dS_k ∂summand_k/∂v, and of each
        column input (weight, bias), Σ_o dy_o ∂y_o/∂w summed over the rows. For RMSNorm that is
        dx = rstd·(w·dy - x̂·mean(x̂·w·dy)) in its one-extra-reduction form. A prologue's values are
        written out in the inputs, each convention's own, except one that is an output and the plain sum of
        inputs nothing else reads (fused add + RMSNorm: residual_out = round(x + residual)): the backward
        reads that output, saved by the autograd, instead of them (one tensor, which the next layer holds
        anyway, for two), and its gradient is each of theirs. A broadcast input's gradient (AdaLN's scale,
        shift, gate) is summed over the rows it broadcasts to: per batch for a [B, 1, C] input. None
        (backprop then raises) for optional row inputs that do not broadcast, a finalize reading an earlier
        statistic, or where a derivative has no CUDA form."""
        structure = spec.structure
        stats = {r.stat for r in structure.reductions}
        if any(t.optional and t.per_row and not t.broadcast for t in spec.inputs) or any(
            {str(s) for s in r.finalize.free_symbols} & stats for r in structure.reductions
        ):
            return None
        from .row_backward import backward_of_row_reduction, saved_sums

        saved = saved_sums(spec)
        reductions, conventions = {}, []
        for c in structure.conventions:
            inline = {}  # each prologue value as an expression of the inputs (a later one may use an earlier)
            for name, expr in (structure.prologue | c.prologue).items():
                if name not in saved:
                    inline[sp.Symbol(name)] = expr.xreplace(inline)
            reductions[c.name] = [
                r.model_copy(update={"summand": r.summand.xreplace(inline)}) for r in structure.reductions
            ]
            outputs = {o: e.xreplace(inline) for o, e in c.outputs.items()}
            conventions.append(c.model_copy(update={"prologue": {}, "outputs": outputs}))
        written_out = structure.model_copy(
            update={"prologue": {}, "reductions": reductions[conventions[0].name], "conventions": conventions}
        )
        try:
            return backward_of_row_reduction(
                spec.model_copy(update={"structure": written_out}), reductions, saved
            )
        except ValueError:  # pydantic's ValidationError too: the derived spec is invalid
            return None

    def describe(self, plans: list[RowReducePlan]) -> list[str]:
        return bucket_description(
            plans,
            lambda kp, b: (
                f"{b.elems_per_access} elem/access, {b.threads_per_row} threads/row, "
                f"{b.rows_per_block} rows/block, row in {b.storage}"
                + (", weight with the row in one-wave grids" if b.columns_fit else "")
                + f", {reduction(b, kp.warp_size)}"
            ),
        )

    # -- kgen tune -------------------------------------------------------------------------------------------
    def tunable(self, plan: KernelPlan) -> list[Bucket]:
        return [b for b in plan.buckets if b.vectorized and b.storage == "registers"]

    def threads_allowed(
        self, spec: OpSpec, profile: ArchProfile, plan: KernelPlan, bucket: Bucket, threads: int
    ) -> bool:
        facts, access_bytes = self.check_facts(profile), bucket.elems_per_access * plan.elem_bytes
        accesses = -(-bucket.max_row_bytes // (access_bytes * threads))
        return (
            threads <= facts.threads_per_row[-1].threads
            and threads * access_bytes <= bucket.max_row_bytes
            and len(row_values(spec)) * accesses * access_bytes <= facts.row_register_bytes_per_thread
        )

    # -- render ----------------------------------------------------------------------------------------------
    def context(self, spec: OpSpec, profile: ArchProfile, plans: list[KernelPlan]) -> RowReduceContext:
        structure = spec.structure
        names = printed_names(spec) | {r.stat: f"stats.{r.stat}" for r in structure.reductions}
        values = row_values(spec)
        late = [t for t in spec.row_inputs if t.name in late_inputs(spec)]
        early = [t for t in spec.row_inputs if t.name not in late_inputs(spec)]
        kernel_params, launch_args = self.kernel_arguments(spec)
        conventions = convention_code(
            spec,
            names,
            prologue=lambda c: statements(
                {f"{v}_out": e for v, e in (structure.prologue | c.prologue).items()}, names
            ),
        )
        return RowReduceContext(
            conventions=conventions,
            templates=self.templates,
            fake_outputs=rows_fake_outputs(spec),
            reductions=[
                ReductionCode(
                    r.stat,
                    str(r.summand),
                    str(r.finalize),
                    statements({"partial": r.summand}, names),
                    statements({"stat": r.finalize}, names),
                )
                for r in structure.reductions
            ],
            values=values,
            prologue=bool(structure.prologue),
            early_inputs=early,
            late_inputs=late,
            kernel_params=kernel_params,
            launch_args=launch_args,
            row_args=", ".join(f"float {t.name}" for t in early),
            value_args=", ".join(f"float {v}" for v in values),
            values_j=", ".join(f"{v}_f[j]" for v in values),
            prologue_out_args=", ".join(f"float& {v}_out" for v in values),
            prologue_elems=", ".join(element_value(t, f"{t.name}_in") for t in early),
            all_args=", ".join(
                [f"float {v}" for v in values]
                + [f"float {t.name}" for t in late]
                + [f"float {t.name}" for t in spec.column_inputs]
            ),
            value_elems=", ".join(f"to_float(vals.{v}.v[j])" for v in values),
            epilogue_elems=", ".join(
                [f"to_float(vals.{v}.v[j])" for v in values]
                + [element_value(t, f"{t.name}_v") for t in late + spec.column_inputs]
            ),
            out_args=", ".join(f"float& {t.name}_out" for t in spec.outputs),
            out_elems=", ".join(f"{t.name}_f[j]" for t in spec.outputs),
        )


def reduction(bucket: Bucket, warp_size: int) -> str:
    return (
        "warp shuffle" if bucket.threads_per_row <= warp_size else "warp shuffle + one shared-memory exchange"
    )


def one_wave(grid: int, bucket: Bucket, profile: ArchProfile) -> bool:
    """Whether every block is resident at once. Then latency dominates and the weight is loaded with the
    row; with several waves occupancy dominates and the weight, re-read after the reduction, costs no
    registers (bench, H200: loading it early slowed 8192×4096 bf16 by 13 %). This estimate assumes full
    occupancy; the generated launcher asks the CUDA occupancy API."""
    return grid * bucket.block_threads <= profile.sm_count * profile.max_threads_per_sm


def widen(candidates: list[Bucket], index: int, rows: int, hidden: int, min_blocks: int) -> Bucket:
    """The grid-fill rule, as the generated launcher applies it: while the grid would have fewer than
    ``min_blocks`` blocks, take the next wider register configuration, as long as every thread keeps at
    least one access of the row."""
    while True:
        b = candidates[index]
        nxt = candidates[index + 1] if index + 1 < len(candidates) else None
        if (
            -(-rows // b.rows_per_block) >= min_blocks
            or nxt is None
            or nxt.storage != "registers"
            or b.storage != "registers"
            or nxt.threads_per_row <= b.threads_per_row
            or nxt.threads_per_row * nxt.elems_per_access > hidden
        ):
            return b
        index += 1


family = RowReduceFamily()

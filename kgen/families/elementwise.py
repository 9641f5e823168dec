"""The elementwise family: each output element from the inputs' elements at the same position (activations,
gated products of a packed input's halves).

DSL: `Elementwise(conventions)`. Plan: one thread per access position, rows flattened, a block size
(profile [planner] block_threads or a `kgen tune` table). Templates: codegen_templates/elementwise/ and the
[rows, hidden] layout shared with row reductions (rows/)."""

from __future__ import annotations

from dataclasses import dataclass

from ..codegen import evaluate
from ..dsl import OpSpec, Structure
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
    convention_code,
    io_rounding,
    min_bytes,
    printed_names,
    rows_fake_outputs,
    vector_notes,
)


class Elementwise(Structure):
    """Each output element from the inputs' elements at the same position (a packed input's halves at the same
    column), per convention. No per-column or broadcast inputs."""

    kind: str = "elementwise"

    dims = ("*rows hidden", "*rows 2*hidden")
    # the [rows, hidden] binding's locals, the kernel's locals and loop variables
    declares = frozenset(
        {
            "rows",
            "inner",
            "as_rows",
            "as_broadcast_rows",
            "per_row",
            "positions",
            "stride",
            "row",
            "col",
            "g",
            "i",
            "j",
            "k",
        }
    )

    def check(self, spec: OpSpec) -> set[str]:
        if any(t.broadcast for t in spec.tensors):
            raise ValueError(
                "an elementwise op takes no broadcast inputs (each output element reads its position)"
            )
        return {t.name for t in spec.row_inputs if not t.packed} | {
            h for t in spec.inputs if t.halves for h in t.halves
        }


@dataclass(frozen=True)
class Source:
    name: str  # the element's symbol: a tensor, or a packed tensor's half
    tensor: str
    second_half: bool


@dataclass(frozen=True)
class ElementwiseContext(FamilyContext):
    sources: list[Source]
    source_args: str
    source_elems: str
    kernel_params: str
    launch_args: str
    out_args: str
    out_elems: str


class ElementwiseFamily(RowsFamily):
    name = "elementwise"
    structure = Elementwise
    templates = Templates(
        kernel="elementwise/kernel.cu.j2",
        args="rows/args.h.j2",
        binding="rows/binding.cpp.j2",
        fake="rows/fake.py.j2",
        inputs="rows/inputs.md.j2",
    )

    def plan(self, spec: OpSpec, profile: ArchProfile, dtype: str, tuning: TuningTable | None) -> KernelPlan:
        """One thread per access of each output: no reduction, nothing kept, so the only choices are the
        access width and the block size."""
        elem = DTYPE_BYTES[dtype]
        vector = profile.max_access_bytes // elem
        tuned = tuning.threads(spec.name, dtype, None) if tuning else None
        threads = tuned[0] if tuned else profile.planner.block_threads
        reasons = {
            "threads_per_row": (tuned[1] + " (threads per block)")
            if tuned
            else f"{threads} threads per block, each one access of every tensor at one position "
            "(profile planner.block_threads); rows are flattened",
            "rows_per_block": "rows are flattened: a block covers consecutive positions",
            "storage": "nothing kept: each element is read once and written once",
        }
        buckets = [Bucket(None, n, threads, 1, 1, "global", False, reasons) for n in (vector, 1)]
        notes = vector_notes(dtype, vector, elem, "every tensor is", " (each half of a packed one)") | {
            "scalar path": "otherwise one element per access: correct for any alignment and any hidden size",
            "block_threads": reasons["threads_per_row"],
        }
        return KernelPlan(spec.name, profile.name, dtype, elem, vector, 1, threads, buckets, notes)

    def evaluate(self, spec: OpSpec, inputs: list, params: list, convention: str) -> tuple:
        values, shape = self.values(spec, inputs, params)
        outputs = spec.structure.convention(convention).outputs
        io = io_rounding(inputs[0].dtype)
        return tuple(evaluate(outputs[t.name], values, io).expand(shape) for t in spec.outputs)

    def launch(self, spec: OpSpec, profile: ArchProfile, kernel: KernelPlan, case: Case) -> LaunchPlan:
        rows, hidden = case.rows, case.shape[-1]
        vector = hidden % kernel.vector_elems == 0
        b = kernel.buckets[0 if vector else 1]
        grid = -(-rows * (hidden // b.elems_per_access) // b.block_threads)
        choices = [
            (
                "accesses",
                f"{b.elems_per_access * kernel.elem_bytes} B ({b.elems_per_access} elements)",
                f"hidden {hidden} is {'' if vector else 'not '}a multiple of {kernel.vector_elems}; "
                + kernel.notes["vector path" if vector else "scalar path"],
            ),
            ("block", f"{b.block_threads} threads", b.reasons["threads_per_row"]),
            (
                "grid",
                f"{grid} blocks",
                f"ceil({rows} × {hidden} / {b.elems_per_access} accesses / "
                f"{b.block_threads}) on {profile.sm_count} SMs",
            ),
            ("storage", "none", b.reasons["storage"]),
        ]
        return LaunchPlan(
            kernel, b, rows, hidden, grid, 0, min_bytes(self, spec, case, kernel.elem_bytes), choices
        )

    def context(self, spec: OpSpec, profile: ArchProfile, plans: list[KernelPlan]) -> ElementwiseContext:
        sources = [
            Source(h, t.name, i == 1) for t in spec.row_inputs for i, h in enumerate(t.halves or (t.name,))
        ]
        kernel_params, launch_args = self.kernel_arguments(spec)
        return ElementwiseContext(
            conventions=convention_code(spec, printed_names(spec)),
            templates=self.templates,
            fake_outputs=rows_fake_outputs(spec),
            sources=sources,
            source_args=", ".join(f"float {s.name}" for s in sources),
            source_elems=", ".join(f"to_float({s.name}_in.v[j])" for s in sources),
            kernel_params=kernel_params,
            launch_args=launch_args,
            out_args=", ".join(f"float& {t.name}_out" for t in spec.outputs),
            out_elems=", ".join(f"{t.name}_f[j]" for t in spec.outputs),
        )


family = ElementwiseFamily()

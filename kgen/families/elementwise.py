"""The elementwise family: each output element from the inputs' elements at the same position (activations,
gated products of a packed input's halves).

DSL: `Elementwise(conventions)`. Plan: one thread per access position, rows flattened, a block size
(profile [planner] block_threads or a `kgen tune` table). Templates: codegen_templates/elementwise/ and the
[rows, hidden] layout shared with row reductions (rows/)."""

from __future__ import annotations

from dataclasses import dataclass

from ..autodiff import backward_reference, gradient_name, vjp
from ..codegen import evaluate
from ..dsl import Convention, OpSpec, Structure, Tensor
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
            "rows_of",
            "broadcast_rows_of",
            "packed_shape",
            "per_row",
            "positions",
            "stride",
            "split",
            "tail",
            "row",
            "col",
            "g",
            "i",
            "j",
            "k",
        }
    )

    def check(self, spec: OpSpec) -> set[str]:
        if any(t.dtype != "io" for t in spec.tensors):
            raise ValueError(
                "an elementwise op's tensors all have the I/O dtype (float32 ones are not served)"
            )
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
class Target:
    name: str  # the value a convention assigns: an output, or a packed output's half
    tensor: str
    second_half: bool


@dataclass(frozen=True)
class ElementwiseContext(FamilyContext):
    sources: list[Source]
    targets: list[Target]
    source_args: str
    source_elems: str
    kernel_params: str
    launch_args: str
    out_args: str
    out_elems: str
    flattens: bool  # dense tensors may be seen as one row (ElementwiseFamily.flattens)


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
        tuned, why = (
            tuning.threads(spec.name, dtype, None, profile.planner.block_threads) if tuning else (None, "")
        )
        threads = tuned or profile.planner.block_threads
        reasons = {
            "threads_per_row": why + " (threads per block)"
            if tuned
            else f"{threads} threads per block, each one access of every tensor at one position "
            f"(profile planner.block_threads); rows are flattened{why}",
            "rows_per_block": "rows are flattened: a block covers consecutive positions",
            "storage": "nothing kept: each element is read once and written once",
        }
        buckets = [Bucket(None, n, threads, 1, 1, "global", False, reasons) for n in (vector, 1)]
        notes = vector_notes(dtype, vector, elem, "every tensor is", " (each half of a packed one)") | {
            "scalar path": "otherwise one element per access: correct for any alignment and any hidden size",
            "block_threads": reasons["threads_per_row"],
        }
        if self.flattens(spec):
            notes["flat path"] = (
                "dense tensors are one row of rows × hidden elements: vector accesses at their index (no "
                "row/column division, no row stride) for all but the last rows × hidden mod the width, which "
                "the grid's last thread takes one at a time in the same launch; an odd hidden does not send "
                "the whole tensor down the scalar path"
            )
        return KernelPlan(spec.name, profile.name, dtype, elem, vector, 1, threads, buckets, notes)

    def evaluate(self, spec: OpSpec, inputs: list, params: list, convention: str) -> tuple:
        import torch

        values, shape = self.values(spec, inputs, params)
        outputs = spec.structure.convention(convention).outputs
        io = io_rounding(inputs[0].dtype)
        return tuple(
            torch.cat([evaluate(outputs[v], values, io).expand(shape) for v in t.halves or (t.name,)], dim=-1)
            for t in spec.outputs
        )

    def backward(self, spec: OpSpec) -> OpSpec | None:
        """Elementwise again: each input's gradient at a position from the inputs and the outputs'
        gradients at that position, the vector-Jacobian product of each convention's expressions
        (kgen.autodiff). The inputs are read again, not saved twice; a packed input's gradient is packed
        the same way. None (backprop then raises) for an op with optional inputs (not supported yet), where
        a derivative has no CUDA form (a function sympy cannot differentiate in closed form) or a gradient's
        name (grad_<input>) is taken."""
        if any(t.optional for t in spec.inputs):
            return None
        try:
            return self._backward(spec)
        except ValueError:  # pydantic's ValidationError too: the derived spec is invalid
            return None

    def _backward(self, spec: OpSpec) -> OpSpec:

        def grad(t: Tensor, role: str) -> Tensor:
            return Tensor(
                name=gradient_name(t.name),
                dims=t.dims,
                role=role,
                halves=tuple(gradient_name(h) for h in t.halves) if t.halves else None,
                doc=f"the gradient of {t.name}",
            )

        sources = [v for t in spec.row_inputs for v in (t.halves or (t.name,))]
        return OpSpec(
            name=f"{spec.name}_backward",
            summary=f"the gradient of {spec.name} ({spec.summary})",
            tensors=[
                *spec.inputs,
                *(grad(t, "input") for t in spec.outputs),
                *(grad(t, "output") for t in spec.inputs),
            ],
            params=spec.params,
            structure=Elementwise(
                conventions=[
                    Convention(
                        name=c.name,
                        matches=f"the gradient of {c.name} (its roundings to the dtype differentiate as the "
                        f"identity)",
                        outputs=vjp(c.outputs, sources),
                    )
                    for c in spec.structure.conventions
                ]
            ),
            reference=backward_reference(spec),
        )

    @staticmethod
    def flattens(spec: OpSpec) -> bool:
        """Whether dense tensors can be seen as one row: every tensor '*rows hidden' of one shape (no packed
        halves, broadcast, column or optional inputs)."""
        return all(t.dims == "*rows hidden" and not (t.broadcast or t.optional) for t in spec.tensors)

    def launch(self, spec: OpSpec, profile: ArchProfile, kernel: KernelPlan, case: Case) -> LaunchPlan:
        rows, hidden = case.rows, case.shape[-1]
        vector = hidden % kernel.vector_elems == 0
        flat = self.flattens(spec) and rows * hidden >= kernel.vector_elems  # a case's tensors are dense
        b = kernel.buckets[0 if vector or flat else 1]
        grid = -(-(rows * hidden // b.elems_per_access) // b.block_threads)
        why = kernel.notes["flat path" if flat else "vector path" if vector else "scalar path"]
        choices = [
            (
                "accesses",
                f"{b.elems_per_access * kernel.elem_bytes} B ({b.elems_per_access} elements)",
                f"hidden {hidden} is {'' if vector else 'not '}a multiple of {kernel.vector_elems}; " + why,
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
            targets=[
                Target(v, t.name, i == 1) for t in spec.outputs for i, v in enumerate(t.halves or (t.name,))
            ],
            out_args=", ".join(f"float& {v}_out" for v in spec.output_values),
            out_elems=", ".join(f"{v}_f[j]" for v in spec.output_values),
            flattens=self.flattens(spec),
        )


family = ElementwiseFamily()

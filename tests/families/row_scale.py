"""A structure family defined outside kgen (loaded from $KGEN_FAMILIES_PATH): each row of a '*rows hidden'
tensor scaled by that row's value of a '*rows' tensor (one value per row), through the spec's expression.
It brings its own tensor layout, checks, plan, render context, shapes and templates (row_scale/ beside this
file), and uses kgen's project templates, binding helpers and build."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kgen.dsl import OpSpec, Structure, Tensor
from kgen.families.base import (
    DTYPE_BYTES,
    Bucket,
    Case,
    Family,
    FamilyContext,
    KernelPlan,
    LaunchPlan,
    Templates,
    convention_code,
    min_bytes,
    printed_names,
)
from kgen.profile import ArchProfile, TuningTable

PER_ROW = "*rows"  # one value per row of the lead tensor: its leading dims


class RowScale(Structure):
    """out = f(x, s) per element, where s is the element's row's value of a '*rows' input."""

    kind: str = "row_scale"

    dims = ("*rows hidden", PER_ROW)
    declares = frozenset({"rows", "row", "col", "i", "lead_value", "row_value"})

    def check(self, spec: OpSpec) -> set[str]:
        scales = [t for t in spec.inputs if t.dims == PER_ROW]
        if len(scales) != 1 or scales[0].optional or len(spec.inputs) != 2 or len(spec.outputs) != 1:
            raise ValueError(
                "a row_scale op takes its lead '*rows hidden' input and one required '*rows' input, and "
                "has one output"
            )
        return {spec.lead.name, scales[0].name}


@dataclass(frozen=True)
class RowScaleContext(FamilyContext):
    scale: Tensor


class RowScaleFamily(Family):
    name = "row_scale"
    structure = RowScale
    template_root = Path(__file__).resolve().parent
    templates = Templates(
        kernel="row_scale/kernel.cu.j2",
        args="row_scale/args.h.j2",
        binding="row_scale/binding.cpp.j2",
        fake="row_scale/fake.py.j2",
        inputs="row_scale/inputs.md.j2",
    )

    def plan(self, spec: OpSpec, profile: ArchProfile, dtype: str, tuning: TuningTable | None) -> KernelPlan:
        threads = profile.planner.block_threads
        reasons = {
            "threads_per_row": f"{threads} threads per block, one element each (profile "
            f"planner.block_threads)",
            "rows_per_block": "rows are flattened",
            "storage": "nothing kept",
        }
        return KernelPlan(
            spec.name,
            profile.name,
            dtype,
            DTYPE_BYTES[dtype],
            1,
            1,
            threads,
            [Bucket(None, 1, threads, 1, 1, "global", False, reasons)],
            {
                "block_threads": reasons["threads_per_row"],
                "accesses": "one element per access: any alignment, any hidden size",
            },
        )

    def launch(self, spec: OpSpec, profile: ArchProfile, kernel: KernelPlan, case: Case) -> LaunchPlan:
        b = kernel.buckets[0]
        grid = -(-case.rows * case.shape[-1] // b.block_threads)
        return LaunchPlan(
            kernel,
            b,
            case.rows,
            case.shape[-1],
            grid,
            0,
            min_bytes(self, spec, case, kernel.elem_bytes),
            [
                ("block", f"{b.block_threads} threads", kernel.notes["block_threads"]),
                ("grid", f"{grid} blocks", "one thread per element"),
            ],
        )

    def context(self, spec: OpSpec, profile: ArchProfile, plans: list[KernelPlan]) -> RowScaleContext:
        lead = spec.lead.name
        return RowScaleContext(
            conventions=convention_code(spec, printed_names(spec)),
            templates=self.templates,
            fake_outputs=[f"torch.empty({lead}.shape, dtype={lead}.dtype, device={lead}.device)"],
            scale=next(t for t in spec.inputs if t.dims == PER_ROW),
        )

    def tensor_shape(self, spec: OpSpec, tensor: Tensor, case: Case) -> tuple[int, ...]:
        return tuple(case.shape[:-1]) if tensor.dims == PER_ROW else tuple(case.shape)

    def example_cases(self, spec: OpSpec) -> list[Case]:
        return [Case(shape) for shape in [(1, 1), (3, 7), (2, 5, 64), (4, 4096)]]

    def tunable(self, plan: KernelPlan) -> list[Bucket]:
        return []  # nothing to tune: one configuration


family = RowScaleFamily()

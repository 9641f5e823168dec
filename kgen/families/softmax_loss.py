"""The softmax-loss family: a loss of each row's softmax over the last dim against the row's class label
(cross-entropy over a vocabulary), and its derived gradient.

DSL: `SoftmaxLoss(logit, conventions)`: `logit` is the score an element of the lead tensor contributes (the
lead's own symbol, or e.g. a soft cap of it); each convention gives the row's loss in `lse` (the fp32
log-sum-exp of the row's scores) and `picked` (the score at the row's label). A row whose label is the
`ignore_index` param has loss 0 and gradient 0. Plan: one block per row streams the row (an online max and
sum in fp32; the gradient reads the row a second time to write it), the block size by row length (profile
[planner] block_threads). Templates: codegen_templates/softmax_loss/."""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy as sp

from ..autodiff import backward_reference, derivative, gradient_name
from ..codegen import evaluate, statements
from ..dsl import Convention, OpSpec, Structure, SympyExpr, Tensor, check_symbols
from ..profile import ArchProfile, TuningTable
from .base import (
    DTYPE_BYTES,
    Bucket,
    Case,
    Family,
    FamilyContext,
    KernelPlan,
    LaunchPlan,
    Templates,
    convention_code,
    io_rounding,
    printed_names,
    scalar_values,
    vector_notes,
)

# the loss's symbols: the row's log-sum-exp and the score at its label; the gradient's: the softmax at the
# element and whether the element is the label's
lse, picked = sp.symbols("lse picked")
probability, is_label = sp.symbols("probability is_label")
IGNORE = "ignore_index"  # the integer param that marks a row without a label
SMALL_ROW = 4096  # elements: rows up to this many take the small block (a row per block either way)


class SoftmaxLoss(Structure):
    """Inputs: the lead ('*rows hidden', the scores), one int64 '*rows' label, and for the gradient one
    float32 '*rows' incoming gradient. Outputs: one float32 '*rows' loss, or (the gradient) one '*rows hidden'
    gradient of the lead. Params: an integer ``ignore_index``, and any the logit reads."""

    kind: str = "softmax_loss"
    logit: SympyExpr
    gradient: bool = False  # the derived backward (see SoftmaxLossFamily.backward)

    dims = ("*rows hidden", "*rows")
    row_output_dims = ("*rows", "*rows hidden")
    int_inputs = True
    declares = frozenset(
        {
            "rows",
            "row",
            "col",
            "z",
            "m",
            "s",
            "lane",
            "warp",
            "i",
            "j",
            "k",
            "x",
            "p",
            "g",
            "hit",
            "d",
            "flat",
            "rows_of",
            "hidden",
            "row_shape",
            "target",
            "ignored",
            "valid",
            "top",
            "acc",
        }
    )

    def names(self) -> list[str]:
        return ["lse", "picked", "probability", "is_label"]

    def check(self, spec: OpSpec) -> set[str]:
        lead, labels = spec.lead, [t for t in spec.inputs if t.dtype == "int64"]
        floats = [t for t in spec.inputs if t.dims == "*rows" and t.dtype == "float32"]
        rest = [t for t in spec.inputs if t is not lead and t not in labels + floats]
        if lead.dims != "*rows hidden" or len(labels) != 1 or labels[0].dims != "*rows" or rest:
            raise ValueError(
                "a softmax loss takes the scores ('*rows hidden', leading), one int64 '*rows' label and, "
                "for its "
                f"gradient, one float32 '*rows' incoming gradient; got {[t.name for t in spec.inputs]}"
            )
        if len(floats) != int(self.gradient):
            raise ValueError("only the gradient takes a float32 '*rows' input (the loss's incoming gradient)")
        want = ("*rows hidden", "io") if self.gradient else ("*rows", "float32")
        if len(spec.outputs) != 1 or (spec.outputs[0].dims, spec.outputs[0].dtype) != want:
            raise ValueError(
                f"a softmax loss{' gradient' if self.gradient else ''} has one output of dims "
                f"{want[0]!r} and dtype {want[1]}"
            )
        ignore = next((p for p in spec.params if p.name == IGNORE), None)
        if ignore is None or not ignore.integer:
            raise ValueError(
                f"a softmax loss needs the integer param {IGNORE!r} (the label of rows without one)"
            )
        params = {p.name for p in spec.params}
        check_symbols(self.logit, {lead.name} | params, "structure.logit", rounds=False)
        if self.gradient:
            return {"probability", "is_label", lead.name, floats[0].name}
        return {"lse", "picked"}


@dataclass(frozen=True)
class SoftmaxLossContext(FamilyContext):
    logit_lines: list[str]  # sets z from x (the element's fp32 value)
    label: Tensor
    incoming: Tensor | None  # the gradient's incoming per-row gradient
    gradient: bool
    int_params: list[str]  # params the kernel takes as int64 (the ignore index)
    small_row: int
    warp_size: int  # lanes of one shuffle reduction (profile warp_size)


class SoftmaxLossFamily(Family):
    name = "softmax_loss"
    structure = SoftmaxLoss
    templates = Templates(
        kernel="softmax_loss/kernel.cu.j2",
        args="softmax_loss/args.h.j2",
        binding="softmax_loss/binding.cpp.j2",
        fake="softmax_loss/fake.py.j2",
        inputs="softmax_loss/inputs.md.j2",
    )

    def plan(self, spec: OpSpec, profile: ArchProfile, dtype: str, tuning: TuningTable | None) -> KernelPlan:
        """A block per row: the row is far longer than a warp's share in the vocabularies this serves (32K to
        256K), so its threads stream it with the widest accesses, keep a running max and sum in registers and
        combine them once per block. Short rows (up to SMALL_ROW elements) take a small block."""
        elem = DTYPE_BYTES[dtype]
        vector = profile.max_access_bytes // elem
        big = profile.planner.block_threads
        small = min(big, 128)
        reasons = {
            "threads_per_row": f"{big} threads per row (profile planner.block_threads), {small} for rows of "
            "at most "
            f"{SMALL_ROW} elements: every thread still has accesses of its own",
            "rows_per_block": "one row per block: the block combines its threads' running max and sum once",
            "storage": "the row is streamed: an online max and sum in fp32 registers"
            + (
                "; the gradient streams it again to write each element (the row's log-sum-exp is "
                "recomputed, not saved: one more read of the scores)"
                if spec.structure.gradient
                else ""
            ),
        }
        buckets = [
            Bucket(SMALL_ROW * elem, n, small, 1, 1, "global", False, reasons) for n in (vector, 1)
        ] + [Bucket(None, n, big, 1, 1, "global", False, reasons) for n in (vector, 1)]
        notes = vector_notes(dtype, vector, elem, f"{spec.lead.name} is", "") | {
            "scalar path": "otherwise one element per access: correct for any alignment and any row length",
            "block_threads": reasons["threads_per_row"],
            "labels": f"a label outside [0, hidden) other than {IGNORE} gives a NaN loss (gradient: NaN row)",
        }
        return KernelPlan(spec.name, profile.name, dtype, elem, vector, 1, big, buckets, notes)

    def launch(self, spec: OpSpec, profile: ArchProfile, kernel: KernelPlan, case: Case) -> LaunchPlan:
        rows, hidden = case.rows, case.shape[-1]
        vector = hidden % kernel.vector_elems == 0
        row_bytes = hidden * kernel.elem_bytes
        b = next(
            b
            for b in kernel.buckets
            if b.vectorized == vector and (b.max_row_bytes is None or row_bytes <= b.max_row_bytes)
        )
        choices = [
            (
                "accesses",
                f"{b.elems_per_access * kernel.elem_bytes} B ({b.elems_per_access} elements)",
                f"hidden {hidden} is {'' if vector else 'not '}a multiple of {kernel.vector_elems}; "
                + kernel.notes["vector path" if vector else "scalar path"],
            ),
            ("block", f"{b.block_threads} threads", b.reasons["threads_per_row"]),
            ("grid", f"{rows} blocks", f"one per row on {profile.sm_count} SMs"),
            ("storage", "none", b.reasons["storage"]),
        ]
        return LaunchPlan(
            kernel, b, rows, hidden, rows, 0, self.traffic(spec, case, kernel.elem_bytes), choices
        )

    @staticmethod
    def traffic(spec: OpSpec, case: Case, elem: int) -> int:
        """The minimum: the scores read once (and the gradient written once), the labels, the per-row
        floats. The gradient's kernel reads the scores twice (the log-sum-exp is recomputed, not saved)."""
        rows, hidden = case.rows, case.shape[-1]
        row_passes = 2 if spec.structure.gradient else 1
        return rows * hidden * elem * row_passes + rows * (8 + 4 + 4 * spec.structure.gradient)

    def context(self, spec: OpSpec, profile: ArchProfile, plans: list[KernelPlan]) -> SoftmaxLossContext:
        structure = spec.structure
        names = printed_names(spec) | {spec.lead.name: "x"}
        label = next(t for t in spec.inputs if t.dtype == "int64")
        incoming = next((t for t in spec.inputs if t.dims == "*rows" and t.dtype == "float32"), None)
        if structure.gradient:
            names |= {"probability": "p", "is_label": "hit", incoming.name: "g"}
        conventions = convention_code(spec, names)
        lead = spec.lead.name
        fake = (
            f"torch.empty_like({lead}, memory_format=torch.contiguous_format)"
            if structure.gradient
            else f"torch.empty({lead}.shape[:-1], dtype=torch.float32, device={lead}.device)"
        )
        return SoftmaxLossContext(
            conventions=conventions,
            templates=self.templates,
            fake_outputs=[fake],
            logit_lines=statements({"z": structure.logit}, names),
            label=label,
            incoming=incoming,
            gradient=structure.gradient,
            int_params=[p.name for p in spec.params if p.integer],
            small_row=SMALL_ROW,
            warp_size=profile.warp_size,
        )

    def tensor_shape(self, spec: OpSpec, tensor: Tensor, case: Case) -> tuple[int, ...]:
        shape = tuple(case.shape)
        return shape if tensor.dims == "*rows hidden" else shape[:-1]

    def example_input(
        self, spec: OpSpec, tensor: Tensor, case: Case, dtype, generator, device="cpu", magnitude: float = 1.0
    ):
        """Labels: uniform over the row's classes, about one row in five ignore_index (the param's value in
        ``case``); the rest as any family's."""
        if tensor.dtype != "int64":
            return super().example_input(spec, tensor, case, dtype, generator, device, magnitude)
        import torch

        shape, classes = self.tensor_shape(spec, tensor, case), case.shape[-1]
        label = torch.randint(0, classes, shape, generator=generator, device=device)
        ignore = case.param_values(spec)[[p.name for p in spec.params].index(IGNORE)]
        dropped = torch.randint(0, 5, shape, generator=generator, device=device) == 0
        return torch.where(dropped, torch.full_like(label, ignore), label)

    def example_cases(self, spec: OpSpec) -> list[Case]:
        return [Case(s) for s in [(1, 1), (3, 7), (4, 1000), (2, 5, 4096), (3, 32001), (2, 151936)]]

    def backward(self, spec: OpSpec) -> OpSpec | None:
        """The gradient of the loss with respect to the scores' input, from the convention's loss
        L(lse, picked) and the logit z(x): g · (∂L/∂lse · softmax + ∂L/∂picked · [at the label]) · dz/dx,
        g the row's incoming gradient. The scores are read again (not saved); the label gets no
        gradient."""
        structure = spec.structure
        if structure.gradient:
            return None
        lead, out = spec.lead, spec.outputs[0]
        label = next(t for t in spec.inputs if t.dtype == "int64")
        g = sp.Symbol(gradient_name(out.name))
        dz = derivative(structure.logit, lead.name)
        conventions = [
            Convention(
                name=c.name,
                matches=f"the gradient of {c.name}",
                outputs={
                    gradient_name(lead.name): g
                    * (
                        derivative(c.outputs[out.name], "lse") * probability
                        + derivative(c.outputs[out.name], "picked") * is_label
                    )
                    * dz
                },
            )
            for c in structure.conventions
        ]
        return OpSpec(
            name=f"{spec.name}_backward",
            summary=f"the gradient of {spec.name} ({spec.summary})",
            tensors=[
                lead,
                label,
                Tensor(name=g.name, dims="*rows", dtype="float32", doc=f"the gradient of {out.name}"),
                Tensor(
                    name=gradient_name(lead.name),
                    dims="*rows hidden",
                    role="output",
                    doc=f"the gradient of {lead.name}",
                ),
            ],
            params=spec.params,
            structure=SoftmaxLoss(logit=structure.logit, gradient=True, conventions=conventions),
            reference=backward_reference(spec, returns=[lead.name]),
        )

    def evaluate(self, spec: OpSpec, inputs: list, params: list, convention: str) -> tuple:
        """The loss (or its gradient) in float64 from the spec's expressions: z from the scores, the row's
        log-sum-exp with the max taken out, the picked score, the convention's expression; 0 where the label
        is ignore_index."""
        import torch

        structure = spec.structure
        lead = inputs[0]
        label = inputs[[t.dtype for t in spec.inputs].index("int64")]
        values = scalar_values(spec, params, lead.shape[-1]) | {spec.lead.name: lead.double()}
        io = io_rounding(lead.dtype)
        z = evaluate(structure.logit, values, io).expand(lead.shape)
        ignore = int(values[IGNORE])
        kept = label != ignore
        index = torch.where(kept, label, 0).unsqueeze(-1)
        top = z.amax(-1, keepdim=True)  # taken out as the kernel does: a +inf score gives NaN (inf - inf)
        row_lse = (top + torch.exp(z - top).sum(-1, keepdim=True).log()).squeeze(-1)
        expr = structure.convention(convention).outputs[spec.outputs[0].name]
        if not structure.gradient:
            loss = evaluate(expr, values | {"lse": row_lse, "picked": z.gather(-1, index).squeeze(-1)}, io)
            return (torch.where(kept, loss, torch.zeros_like(row_lse)),)
        incoming = inputs[2].double().unsqueeze(-1)
        hit = torch.zeros_like(z).scatter_(-1, index, 1.0)
        grad = evaluate(
            expr,
            values
            | {
                "probability": torch.exp(z - row_lse.unsqueeze(-1)),
                "is_label": hit,
                spec.inputs[2].name: incoming,
            },
            io,
        ).expand(lead.shape)
        return (torch.where(kept.unsqueeze(-1), grad, torch.zeros_like(grad)),)

    def check_tolerance(self, spec: OpSpec, atol: float, rtol: float) -> tuple[float, float]:
        return max(atol, 1e-9), max(rtol, 1e-9)

    def threads_allowed(self, spec, profile, plan, bucket, threads) -> bool:
        return 32 <= threads <= profile.max_threads_per_block and math.log2(threads).is_integer()


family = SoftmaxLossFamily()

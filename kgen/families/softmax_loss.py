"""The softmax-loss family: a loss of each row's softmax over the last dim against the row's class label
(cross-entropy over a vocabulary), and its derived gradient.

DSL: `SoftmaxLoss(logit, conventions)`: `logit` is the score an element of the lead tensor contributes (the
lead's own symbol, or e.g. a soft cap of it); each convention gives the row's loss in `lse` (the fp32
log-sum-exp of the row's scores) and `picked` (the score at the row's label). A row whose label is the
`ignore_index` param has loss 0 and gradient 0. Plan: one block per row streams the row (an online max and
sum in fp32), the block size by row length (profile [planner] block_threads). The gradient takes the row's
log-sum-exp from the forward's saved loss and the picked score where sympy inverts the loss for it (lse =
loss + picked for cross-entropy), so it reads the row once; otherwise it recomputes it (a second read).
Templates: codegen_templates/softmax_loss/."""

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
    float32 '*rows' incoming gradient (after the forward's saved loss where ``lse_from`` reads it). Outputs:
    one float32 '*rows' loss, or (the gradient) one '*rows hidden' gradient of the lead. Params: an integer
    ``ignore_index``, and any the logit reads."""

    kind: str = "softmax_loss"
    logit: SympyExpr
    gradient: bool = False  # the derived backward (see SoftmaxLossFamily.backward)
    # the gradient's row log-sum-exp from the forward's saved loss (its symbol) and `picked`, else recomputed
    lse_from: SympyExpr | None = None

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
            "saved",
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
        saved, _ = self.row_floats(spec)
        if len(floats) != int(self.gradient) + (saved is not None):
            raise ValueError(
                "only the gradient takes float32 '*rows' inputs: the loss's incoming gradient, after the "
                "forward's saved loss where lse_from reads it"
            )
        if self.lse_from is not None:
            if not self.gradient or saved is None:
                raise ValueError("structure.lse_from: a gradient's, reading its first float32 '*rows' input")
            check_symbols(self.lse_from, {saved.name, "picked"}, "structure.lse_from", rounds=False)
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
            return {"probability", "is_label", lead.name, floats[-1].name}
        return {"lse", "picked"}

    def row_floats(self, spec: OpSpec) -> tuple[Tensor | None, Tensor | None]:
        """The gradient's float32 '*rows' inputs: the forward's saved loss (the first, if lse_from) and the
        incoming gradient (the last)."""
        floats = [t for t in spec.inputs if t.dims == "*rows" and t.dtype == "float32"]
        saved = floats[0] if self.lse_from is not None and len(floats) == 2 else None
        return saved, floats[-1] if self.gradient and floats else None


@dataclass(frozen=True)
class SoftmaxLossContext(FamilyContext):
    logit_lines: list[str]  # sets z from x (the element's fp32 value)
    label: Tensor
    incoming: Tensor | None  # the gradient's incoming per-row gradient
    saved: Tensor | None  # the forward's saved loss the gradient's row log-sum-exp comes from
    lse_lines: list[str]  # sets lse from saved (the saved loss) and picked
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
            "storage": f"the row streamed once, its log-sum-exp lse = {spec.structure.lse_from} from the "
            "forward's saved loss"
            if spec.structure.lse_from is not None
            else "the row streamed: an online max and sum in fp32 registers"
            + (
                "; then again to write the gradient (no saved loss to solve for lse)"
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
        floats. Without lse_from the gradient's kernel reads the scores twice (the log-sum-exp recomputed)."""
        rows, hidden = case.rows, case.shape[-1]
        row_passes = 2 if spec.structure.gradient else 1
        floats = 1 + spec.structure.gradient + (spec.structure.lse_from is not None)
        return rows * hidden * elem * row_passes + rows * (8 + 4 * floats)

    def context(self, spec: OpSpec, profile: ArchProfile, plans: list[KernelPlan]) -> SoftmaxLossContext:
        structure = spec.structure
        names = printed_names(spec) | {spec.lead.name: "x"}
        label = next(t for t in spec.inputs if t.dtype == "int64")
        saved, incoming = structure.row_floats(spec)
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
            saved=saved,
            lse_lines=[]
            if saved is None
            else statements({"lse": structure.lse_from}, names | {saved.name: "saved", "picked": "picked"}),
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

    def example_inputs(self, spec: OpSpec, case: Case, *args, **options) -> list:
        """As any family's; a gradient's saved loss is then the forward's loss of those scores and labels
        (the inverse of lse_from, in float64, rounded to float32; 0 where the label is ignored)."""
        inputs = super().example_inputs(spec, case, *args, **options)
        saved, _ = spec.structure.row_floats(spec)
        if saved is not None:
            (loss,) = sp.solve(sp.Eq(lse, spec.structure.lse_from), sp.Symbol(saved.name))
            values, _, kept = self._rows(spec, inputs, case.param_values(spec))
            value = evaluate(loss, values, io_rounding(inputs[0].dtype))
            inputs[[t.name for t in spec.inputs].index(saved.name)] = value.where(kept, 0.0).float()
        return inputs

    def _rows(self, spec: OpSpec, inputs: list, params: list):
        """Float64: the values bound (scalars, the lead, each row's lse of its scores with the max taken out
        as the kernel does, so a +inf score gives NaN, and the score picked at its label), z, and whether
        each row's label is kept (not ignore_index)."""
        import torch

        lead = inputs[0]
        label = inputs[[t.dtype for t in spec.inputs].index("int64")]
        values = scalar_values(spec, params, lead.shape[-1]) | {spec.lead.name: lead.double()}
        z = evaluate(spec.structure.logit, values, io_rounding(lead.dtype)).expand(lead.shape)
        kept = label != int(values[IGNORE])
        top = z.amax(-1, keepdim=True)
        values["lse"] = (top + torch.exp(z - top).sum(-1, keepdim=True).log()).squeeze(-1)
        values["picked"] = z.gather(-1, torch.where(kept, label, 0).unsqueeze(-1)).squeeze(-1)
        return values, z, kept

    def example_cases(self, spec: OpSpec) -> list[Case]:
        return [Case(s) for s in [(1, 1), (3, 7), (4, 1000), (2, 5, 4096), (3, 32001), (2, 151936)]]

    def backward(self, spec: OpSpec) -> OpSpec | None:
        """The gradient of the loss with respect to the scores' input, from the convention's loss
        L(lse, picked) and the logit z(x): g · (∂L/∂lse · softmax + ∂L/∂picked · [at the label]) · dz/dx,
        g the row's incoming gradient; the label gets no gradient. Where every convention's loss solves for
        lse alone (sympy), the gradient reads the forward's loss (saved) and takes lse from it and the
        picked score instead of reading the row a second time."""
        structure = spec.structure
        if structure.gradient:
            return None
        lead, out = spec.lead, spec.outputs[0]
        label = next(t for t in spec.inputs if t.dtype == "int64")
        g = sp.Symbol(gradient_name(out.name))
        dz = derivative(structure.logit, lead.name)
        loss = sp.Symbol(out.name)
        solved = {tuple(sp.solve(sp.Eq(loss, c.outputs[out.name]), lse)) for c in structure.conventions}
        lse_from = solved.pop()[0] if len(solved) == 1 and len(next(iter(solved), ())) == 1 else None
        if lse_from is not None and not lse_from.free_symbols <= {loss, picked}:
            lse_from = None
        saved = [Tensor(name=out.name, dims="*rows", dtype="float32", doc=f"the forward's {out.name}")]
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
                *(saved if lse_from is not None else []),
                Tensor(name=g.name, dims="*rows", dtype="float32", doc=f"the gradient of {out.name}"),
                Tensor(
                    name=gradient_name(lead.name),
                    dims="*rows hidden",
                    role="output",
                    doc=f"the gradient of {lead.name}",
                ),
            ],
            params=spec.params,
            structure=SoftmaxLoss(
                logit=structure.logit, gradient=True, lse_from=lse_from, conventions=conventions
            ),
            reference=backward_reference(
                spec,
                order=[lead.name, label.name, *([out.name] if lse_from is not None else []), g.name],
                returns=[lead.name],
            ),
        )

    def evaluate(self, spec: OpSpec, inputs: list, params: list, convention: str) -> tuple:
        """The loss (or its gradient) in float64 from the spec's expressions: z from the scores, the row's
        log-sum-exp with the max taken out, the picked score, the convention's expression; 0 where the label
        is ignore_index."""
        import torch

        structure = spec.structure
        lead, names = inputs[0], [t.name for t in spec.inputs]
        io = io_rounding(lead.dtype)
        values, z, kept = self._rows(spec, inputs, params)
        expr = structure.convention(convention).outputs[spec.outputs[0].name]
        if not structure.gradient:
            return (evaluate(expr, values, io).where(kept, 0.0),)
        saved, incoming = structure.row_floats(spec)
        if saved is not None:  # as the kernel takes it: from the saved loss and the picked score
            values["lse"] = evaluate(
                structure.lse_from, values | {saved.name: inputs[names.index(saved.name)].double()}, io
            )
        label = inputs[names.index(next(t.name for t in spec.inputs if t.dtype == "int64"))]
        values |= {
            "probability": torch.exp(z - values["lse"].unsqueeze(-1)),
            "is_label": torch.zeros_like(z).scatter_(-1, torch.where(kept, label, 0).unsqueeze(-1), 1.0),
            incoming.name: inputs[names.index(incoming.name)].double().unsqueeze(-1),
        }
        grad = evaluate(expr, values, io).expand(lead.shape)
        return (grad.where(kept.unsqueeze(-1), 0.0),)

    def check_tolerance(self, spec: OpSpec, atol: float, rtol: float) -> tuple[float, float]:
        return max(atol, 1e-9), max(rtol, 1e-9)

    def threads_allowed(self, spec, profile, plan, bucket, threads) -> bool:
        return 32 <= threads <= profile.max_threads_per_block and math.log2(threads).is_integer()


family = SoftmaxLossFamily()

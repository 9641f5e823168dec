"""A row reduction's backward, derived from its spec as a column reduction (kgen.families.column_reduce):
per row the statistics again with their slopes, one backward sum per statistic in reverse order, then each
input's gradient per element, summed over the rows for a weight's or a broadcast input's. Called by
RowReduceFamily.backward, which writes the prologue out in the inputs first."""

from __future__ import annotations

import sympy as sp

from ..autodiff import backward_reference, derivative, gradient_name
from ..dsl import Convention, OpSpec, Tensor
from .column_reduce import ColumnReduce, RowSum, row_sum


def backward_of_row_reduction(spec: OpSpec, reductions: dict[str, list]) -> OpSpec:
    """The backward of a row reduction (kgen.families.row_reduce: per convention its reductions, each a stat
    = finalize(Σ summand), and its outputs), as a column reduction; see RowReduceFamily.backward. A broadcast
    input's gradient is shaped like it (summed over the rows it broadcasts to)."""
    structure = spec.structure
    dy = {t.name: sp.Symbol(gradient_name(t.name)) for t in spec.outputs}

    def slope(stat: str) -> sp.Symbol:
        return sp.Symbol(f"{stat}_slope")

    def grad_sum(stat: str) -> sp.Symbol:
        return sp.Symbol(f"grad_sum_{stat}")

    def back_summands(outputs: dict, reductions: list) -> list[sp.Expr]:
        """Per statistic (in the forward's order), the summand of its backward sum."""
        summands = [sp.S.Zero] * len(reductions)
        for k in reversed(range(len(reductions))):
            stat = reductions[k].stat
            summands[k] = sp.Add(
                *(dy[o] * derivative(e, stat) for o, e in outputs.items()),
                *(grad_sum(r.stat) * derivative(r.summand, stat) for r in reductions[k + 1 :]),
            )
        return summands

    per_convention = {c.name: back_summands(c.outputs, reductions[c.name]) for c in structure.conventions}
    stats = [r.stat for r in reductions[structure.conventions[0].name]]
    needed = [k for k in range(len(stats)) if any(s[k] != 0 for s in per_convention.values())]
    sums, conventions = {}, []
    for c in structure.conventions:
        forward = [  # the statistics again, with their slopes dF/dS
            RowSum(
                summand=r.summand,
                finalize={r.stat: r.finalize, slope(r.stat).name: derivative(r.finalize, "row_sum")},
            )
            for r in reductions[c.name]
        ]
        backward = [
            RowSum(
                summand=per_convention[c.name][k],
                finalize={grad_sum(stats[k]).name: row_sum * slope(stats[k])},
            )
            for k in reversed(needed)
        ]
        sums[c.name] = forward + backward

        def gradient(v: str) -> sp.Expr:
            return sp.Add(
                *(dy[o] * derivative(e, v) for o, e in c.outputs.items()),
                *(grad_sum(stats[k]) * derivative(reductions[c.name][k].summand, v) for k in needed),
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
    rows = [gradient_name(t.name) for t in spec.inputs if t.per_row and not t.broadcast]
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
        Tensor(name=gradient_name(t.name), dims=t.dims, dtype=t.dtype, doc=f"the gradient of {t.name}")
        for t in spec.outputs
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
                    dtype=t.dtype,  # rounded once to its input's dtype
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
            when_given={gradient_name(t.name): t.name for t in optional if t.column or t.broadcast},
            shaped_like={gradient_name(t.name): t.name for t in written if t.broadcast},
        ),
        reference=backward_reference(
            spec, [t.name for t in required + incoming + optional], [t.name for t in written]
        ),
    )

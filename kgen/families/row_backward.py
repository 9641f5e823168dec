"""A row reduction's backward, derived from its spec as a column reduction (kgen.families.column_reduce):
per row the statistics again with their slopes, one backward sum per statistic in reverse order, then each
input's gradient per element, summed over the rows for a weight's or a broadcast input's. Called by
RowReduceFamily.backward, which writes the prologue out in the inputs first."""

from __future__ import annotations

import sympy as sp

from ..autodiff import backward_reference, derivative, gradient_name
from ..dsl import Convention, OpSpec, Tensor, inv_hidden
from .column_reduce import ColumnReduce, RowSum, row_sum


def linear_parts(
    summand: sp.Expr, scalars: set[str], chained: set[str], means: dict | None = None
) -> list[tuple] | None:
    """``summand`` as Σ coefficient · part, each coefficient a product of row scalars (``scalars``: the
    same for every element of a row), the parts (distinct, in first-seen order) reading none of ``chained``,
    those that sum to zero over a row left out (zero_sum, given the ``means``); None where that form does
    not exist or reads no ``chained`` scalar (nothing to gain: one sum stays one)."""

    def reads(e: sp.Expr) -> set[str]:
        return {str(v) for v in e.free_symbols}

    if not reads(summand) & chained:
        return None
    parts: dict[sp.Expr, sp.Expr] = {}
    for term in sp.Add.make_args(summand):
        factors = sp.Mul.make_args(term)
        coefficient = sp.Mul(*(f for f in factors if reads(f) <= scalars))
        part = sp.Mul(*(f for f in factors if not reads(f) <= scalars))
        if reads(part) & chained:
            return None
        parts[part] = parts.get(part, sp.S.Zero) + coefficient
    return [(c, p) for p, c in parts.items() if not zero_sum(p, means or {}, scalars)] or None


def zero_sum(part: sp.Expr, means: dict[str, sp.Expr], scalars: set[str]) -> bool:
    """Whether ``part`` sums to zero over a row in exact arithmetic: α·(s - g) with α a row scalar and
    s = inv_hidden·Σ g one of ``means`` (a statistic's name -> its summand g): Σ (s - g) = hidden·s - Σ g = 0
    (layernorm's mean gradient reads Σ 2·(mean - x): in floats, rounding noise)."""
    slopes = {s: sp.diff(part, sp.Symbol(s)) for s in means}
    return any(
        {str(v) for v in a.free_symbols} <= scalars and sp.expand(part - a * (sp.Symbol(s) - means[s])) == 0
        for s, a in slopes.items()
    )


def saved_sums(spec: OpSpec) -> dict[str, list[str]]:
    """The prologue values a row reduction's backward reads, saved, in place of the inputs they sum:
    {value: those inputs}. A value qualifies where every convention outputs it as it is and computes it the
    same way, from whole-row inputs (not optional, not broadcast) that nothing else reads, each with slope 1
    (a sum, rounded once: fused add + RMSNorm's residual_out = round(x + residual)); each input's gradient is
    then the value's."""
    structure, inputs = spec.structure, {t.name: t for t in spec.inputs}
    found = {}
    for name, expr in structure.prologue.items():
        reads = [v for v in inputs if sp.Symbol(v) in expr.free_symbols]
        prologues = [structure.prologue | c.prologue for c in structure.conventions]
        others = [e for c in structure.conventions for o, e in c.outputs.items() if o != name]
        others += [e for p in prologues for n, e in p.items() if n != name]
        others += [e for r in structure.reductions for e in (r.summand, r.finalize)]
        if (
            reads
            and len(reads) == len(expr.free_symbols)
            and all(c.outputs.get(name) == sp.Symbol(name) for c in structure.conventions)
            and all(p[name] == expr for p in prologues)
            and all(inputs[v].per_row and not inputs[v].optional and not inputs[v].broadcast for v in reads)
            and all(derivative(expr, v) == 1 for v in reads)
            and not {sp.Symbol(v) for v in reads} & {s for e in others for s in e.free_symbols}
        ):
            found[name] = reads
    return found


def backward_of_row_reduction(
    spec: OpSpec, reductions: dict[str, list], saved: dict[str, list[str]] | None = None
) -> OpSpec:
    """The backward of a row reduction (kgen.families.row_reduce: per convention its reductions, each a stat
    = finalize(Σ summand), and its outputs), as a column reduction; see RowReduceFamily.backward. A broadcast
    input's gradient is shaped like it (summed over the rows it broadcasts to). ``saved`` (saved_sums): the
    outputs it reads in place of the inputs they sum, which the expressions read as symbols."""
    structure, saved = spec.structure, saved or {}
    stands_for = {v: value for value, summed in saved.items() for v in summed}  # input -> the saved output
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
    # a backward sum whose summand is Σ row scalar · part, with parts that read no gradient sum, splits
    # into one sum per part (in every convention as many), reduced with the sums before it
    # (ColumnReduce.levels) and combined by the last part's finalize
    scalars = {p.name for p in spec.params} | {
        n for r in reductions[structure.conventions[0].name] for n in (r.stat, slope(r.stat).name)
    }
    grad_sums = {grad_sum(s).name for s in stats}
    means = {  # per convention, each statistic that is a mean: its summand (zero_sum)
        c.name: {r.stat: r.summand for r in reductions[c.name] if r.finalize == row_sum * inv_hidden}
        for c in structure.conventions
    }
    parts = {
        c: [linear_parts(summands[k], scalars | grad_sums, grad_sums, means[c]) for k in range(len(stats))]
        for c, summands in per_convention.items()
    }
    split = {
        k
        for k in needed
        if all(p[k] is not None for p in parts.values()) and len({len(p[k]) for p in parts.values()}) == 1
    }

    def backward_sums(convention: str, k: int) -> list[RowSum]:
        name, slope_ = grad_sum(stats[k]).name, slope(stats[k])
        if k not in split:
            return [RowSum(summand=per_convention[convention][k], finalize={name: row_sum * slope_})]
        mine = parts[convention][k]
        names = [sp.Symbol(f"{name}_part{j}") for j in range(len(mine))]
        combined = slope_ * sp.Add(*(c * n for (c, _), n in zip(mine, names, strict=True)))
        return [
            RowSum(
                summand=part, finalize={n.name: row_sum} | ({name: combined} if j == len(mine) - 1 else {})
            )
            for j, ((_, part), n) in enumerate(zip(mine, names, strict=True))
        ]

    sums, conventions = {}, []
    for c in structure.conventions:
        forward = [  # the statistics again, with their slopes dF/dS
            RowSum(
                summand=r.summand,
                finalize={r.stat: r.finalize, slope(r.stat).name: derivative(r.finalize, "row_sum")},
            )
            for r in reductions[c.name]
        ]
        backward = [sum_ for k in reversed(needed) for sum_ in backward_sums(c.name, k)]
        sums[c.name] = forward + backward

        def gradient(v: str) -> sp.Expr:
            v = stands_for.get(v, v)  # a summed input's gradient is its saved sum's (slope 1)
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
    # a broadcast input's gradient that is an incoming one of its dtype in every convention (AdaLN's shift):
    # not written where the input has every row (the autograd hands the incoming gradient on)
    dtype = {gradient_name(t.name): t.dtype for t in spec.outputs}
    passing = {  # input -> the incoming gradient
        t.name: g
        for t in written
        for g in dtype
        if t.broadcast
        and dtype[g] == t.dtype
        and all(c.outputs[gradient_name(t.name)] == sp.Symbol(g) for c in conventions)
    }
    outputs = {t.name: t for t in spec.outputs}
    required = []
    for t in spec.inputs:  # a saved output where the first input it sums was
        if t.optional or (t.name in stands_for and saved[stands_for[t.name]][0] != t.name):
            continue
        value = stands_for.get(t.name)
        required.append(
            t
            if value is None
            else Tensor(
                name=value,
                dims=outputs[value].dims,
                dtype=outputs[value].dtype,
                doc=f"the forward's {value} (saved), in place of {' + '.join(saved[value])}",
            )
        )
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
        passes={gradient_name(name): g for name, g in passing.items()},
        structure=ColumnReduce(
            sums=sums,
            conventions=conventions,
            when_given={gradient_name(t.name): t.name for t in optional if t.column or t.broadcast},
            shaped_like={gradient_name(t.name): t.name for t in written if t.broadcast},
        ),
        reference=backward_reference(
            spec,
            [t.name for t in required + incoming + optional],
            [t.name for t in written],
            stand_in={v: value for value, summed in saved.items() for v in summed[1:]},
            passes=passing,
            aliases={summed[0]: value for value, summed in saved.items()},
        ),
    )

"""The rotary family's derived backward: a rotation again, by -θ, of the outputs' gradients (and after a norm
of each head or token, the norm's backward from rotary_norm.py)."""

from __future__ import annotations

import sympy as sp

from ..autodiff import backward_reference, derivative, gradient_name
from ..dsl import Convention, OpSpec, Tensor
from .rotary_norm import rstd

# an element's pair partner is <name>_pair; sign is -1 on a pair's first element, +1 on its second;
# cos_pair and sin_pair are the partner's table values (equal to cos and sin in every table a model builds,
# but a backward reads them: the partner's output holds this element with the partner's angle)
cos, sin, sign, cos_pair, sin_pair = sp.symbols("cos sin sign cos_pair sin_pair")

# A head norm's backward whose wave of weight partial rows (a row per block) passes this many bytes stops its
# grid at the row reductions' partition, half a wave, and sums them with the wide column sum: its launcher's
# kWidePartialBytes (qk_norm_rope3d's 17 MB, a norm across every head: 1.10-1.23x; a weight per head keeps a
# wave: bench/results/partials-h100-2026-12-07).
WIDE_PARTIAL_BYTES = 4 << 20


def backward_spec(spec: OpSpec) -> OpSpec | None:
    """A rotation again, of the outputs' gradients into the rotated inputs' (the transpose: rotation by
    -θ), with the same tables or grid angles; no table or angle is saved. An element is in its own output
    and in its partner's, so its gradient is ∂out/∂x · grad_out + ∂out_pair/∂x · grad_out_pair, the
    second being ∂out/∂x_pair at the partner: its cos, sin and sign (-sign). The tables and coordinates
    get no gradient (the binding refuses them requiring one). None where an output is not linear in its
    own input and partner (the gradient would need the inputs: not a rotation).

    After a norm over each head, that rotation gives the gradient reaching the normed values, and the
    norm's backward (RotaryNorm.gradients) carries it to the inputs, which the backward reads again (their
    statistic recomputed, nothing saved); the weights' gradients are summed over every head and token in
    a fixed order. After a norm over a token's heads (a weight with a channel per head), a first kernel
    writes each token's statistics beside the inputs' gradients and a second sums the weights' (see the
    plan's notes); the backward sum is taken with the statistic, so its summand must not need rstd (else
    None)."""
    structure = spec.structure
    if structure.norm is not None and structure.norm.over == "token":
        if structure.norm.gradients()["back_summand"].has(rstd):
            return None
    at_partner = {cos: cos_pair, sin: sin_pair, cos_pair: cos, sin_pair: sin, sign: -sign}
    rotated = {s for n in structure.rotates for s in (n, f"{n}_pair")}
    grads = [gradient_name(t.name) for t in spec.outputs]

    def gradient(expr: sp.Expr, name: str, g: str) -> sp.Expr | None:
        own, partner = derivative(expr, name), derivative(expr, f"{name}_pair")
        if {str(s) for s in own.free_symbols | partner.free_symbols} & rotated:
            return None
        return sp.Symbol(g) * own + sp.Symbol(f"{g}_pair") * partner.xreplace(at_partner)

    conventions = []
    for c in structure.conventions:
        outputs = {
            gradient_name(name): gradient(c.outputs[t.name], name, g)
            for name, t, g in zip(structure.rotates, spec.outputs, grads)
        }
        if None in outputs.values():
            return None
        matches = f"the gradient of {c.name} (roundings differentiate as the identity)"
        if structure.norm is not None:
            matches += ", reaching the normed values; the norm's backward takes it to the inputs"
        conventions.append(Convention(name=c.name, matches=matches, outputs=outputs))
    by_name = {t.name: t for t in spec.inputs}
    normed = [by_name[n] for n in structure.rotates] if structure.norm else []
    weights = [by_name[n] for n in structure.norm.weights] if structure.norm else []
    rest = [t for t in spec.inputs if t.name not in structure.rotates]
    tensors = [
        *(
            Tensor(name=g, dims="*rows hidden", doc=f"the gradient of {t.name}")
            for g, t in zip(grads, spec.outputs)
        ),
        *(t.model_copy(update={"doc": f"{t.doc or t.name} (the forward's, read again)"}) for t in normed),
        *rest,
        *(
            Tensor(name=gradient_name(n), dims="*rows hidden", role="output", doc=f"the gradient of {n}")
            for n in structure.rotates
        ),
        *(
            Tensor(
                name=gradient_name(w.name),
                dims=w.dims,
                role="output",
                doc=f"the gradient of {w.name}, summed over every head and token",
            )
            for w in weights
        ),
    ]
    update = {"rotates": grads, "conventions": conventions}
    if structure.norm is not None:
        update["norm_inputs"] = list(structure.rotates)
    inputs = [t.name for t in tensors if t.role == "input"]
    return OpSpec(
        name=f"{spec.name}_backward",
        summary=f"the gradient of {spec.name} ({spec.summary})",
        tensors=tensors,
        params=spec.params,
        structure=structure.model_copy(update=update),
        reference=backward_reference(
            spec,
            inputs,
            [*structure.rotates, *(w.name for w in weights)],
            None if normed else dict(zip(structure.rotates, grads)),
        ),
    )

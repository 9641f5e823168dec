"""`kgen check`: a spec's math against its reference, on the CPU. Each convention's sympy expressions are
evaluated by the spec's family (float64, the convention's roundings to the I/O dtype included) on fresh
random inputs at the family's example shapes, then on inputs with exact 0, 1 and -1 among them (the kinks of
max, min, abs and piecewise math, and ties between inputs: a derivative there is a convention, e.g. sympy's
max splits a tie's gradient in halves as torch.maximum does, where torch.relu gives 0), in float32 and
bfloat16, and compared with the float64 reference: a spec whose math and reference disagree fails here,
before any kernel is built. Where the family derives the op's backward, its derived math is checked the same
way against autograd of the reference, whose gradient is rounded to the dtype at each of the convention's
roundings it flows back through (the derived math takes a rounding's derivative as 1, unrounded): the
tolerance grows by one step per rounding."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import sympy as sp

from .catalog import load_spec
from .families import family_of

# |math - reference| <= ATOL + RTOL·|reference|: float32 leaves only the order of float64 operations; a
# bfloat16 rounding the two place on either side of a tie differs by one step (2^-8 relative)
TOLERANCE = {"float32": (1e-5, 1e-5), "bfloat16": (1e-2, 1e-2)}


PROBED = " (exact 0, ±1, tied inputs)"  # where a result's worst element is one of the probes


@dataclass(frozen=True)
class Result:
    op: str
    convention: str
    dtype: str
    shapes: int  # how many example shapes were compared
    worst: float  # the largest |math - reference| / (ATOL + RTOL·|reference|): <= 1 passes
    where: str  # the shape and output of the worst element

    @property
    def ok(self) -> bool:
        return self.worst <= 1


def check(op: str, seed: int = 0) -> list[Result]:
    """One result per convention and dtype, for the op and then its backward."""
    import torch

    spec = load_spec(op)
    backward = family_of(spec).backward(spec)
    generator = torch.Generator().manual_seed(seed)
    results = _check_spec(spec, generator)
    if backward:
        results += _check_spec(backward, generator, lambda c: 1 + _roundings(spec, c))
    return results


def _roundings(spec, convention: str) -> int:
    """How many roundings to the dtype a convention's outputs (and prologue) write."""
    conv = spec.structure.convention(convention)
    exprs = [*conv.outputs.values(), *getattr(conv, "prologue", {}).values()]
    return sum(1 for e in exprs for node in sp.preorder_traversal(e) if type(node).__name__ == "to_io_dtype")


def _check_spec(spec, generator, steps=lambda convention: 1) -> list[Result]:
    import torch

    family = family_of(spec)
    takes_convention = "convention" in inspect.signature(spec.reference).parameters
    results = []
    for convention in (c.name for c in spec.structure.conventions):
        for dtype, tolerance in TOLERANCE.items():
            atol, rtol = (steps(convention) * t for t in family.check_tolerance(spec, *tolerance))
            worst, where, cases = 0.0, "-", family.example_cases(spec)
            for case, probes in ((c, p) for c in cases for p in (False, True)):
                inputs = family.example_inputs(spec, case, getattr(torch, dtype), generator, probes=probes)
                params = case.param_values(spec)
                math = family.evaluate(spec, inputs, params, convention)
                reference = spec.reference(
                    *inputs, *params, **({"convention": convention} if takes_convention else {})
                )
                reference = reference if isinstance(reference, tuple) else (reference,)
                for tensor, got, want in zip(spec.outputs, math, reference):
                    want = want.double()
                    scale = want.abs()
                    if 0 < want.numel() < inputs[0].numel():  # a sum over rows (a weight's gradient)
                        # each row's term carries its own rounding error, so the sum's error grows with the
                        # terms (about their root-sum-square), not with a sum that cancelled to near zero
                        scale = scale.clamp_min(want.square().mean().sqrt().item())
                    ratio = ((got - want).abs() / (atol + rtol * scale)).nan_to_num(1e30)
                    if ratio.numel() and ratio.max().item() > worst:
                        probed = PROBED if probes else ""
                        worst, where = ratio.max().item(), f"{case.label}{probed}, {tensor.name}"
            results.append(Result(spec.name, convention, dtype, len(cases), worst, where))
    return results


def disagreement(bad: list[Result]) -> str:
    """The error for results that failed: each with where and by how much; a hint where a probe failed."""
    text = "the math and the reference disagree: " + "; ".join(
        f"{r.op} (convention {r.convention}, {r.dtype}) at {r.where}, {r.worst:.3g}× the tolerance"
        for r in bad
    )
    if any(PROBED in r.where for r in bad):
        text += (
            ". At an exact 0, ±1 or a tie the derivative is a convention: sympy's Max and Min split a tie's "
            "gradient in halves (torch.maximum's), Abs's is 0 at 0; torch.relu's 0 at 0 is "
            "Piecewise((x, x > 0), (0, True)), and 1 at 0 Piecewise((x, x >= 0), (0, True))"
        )
    return text

"""`kgen check`: a spec's math against its reference, on the CPU. Each convention's sympy expressions are
evaluated by the spec's family (float64, the convention's roundings to the I/O dtype included) on fresh
random inputs at the family's example shapes, then on inputs with exact 0, 1 and -1 among them (the kinks of
max, min, abs and piecewise math, and ties between inputs: a derivative there is a convention, e.g. sympy's
max splits a tie's gradient in halves as torch.maximum does, where torch.relu gives 0), in float32 and
bfloat16, and compared with the float64 reference: a spec whose math and reference disagree fails here,
before any kernel is built. The forward runs once more with a NaN, +inf and -inf in its lead input: where the
reference gives a NaN or an infinity the math must give the same (a comparison is false at NaN, so a
Piecewise whose last branch drops it turns a NaN into a number: a silent failure on bad input). Where the
family derives the op's backward, its derived math (which takes a rounding's derivative as 1, at the
forward's rounded values) is checked the same way against autograd of the reference, run twice: at float64
leaves (no rounding moves a value: near a cancellation, x + h·gate ≈ 0 under a norm, one rounding moves the
exact gradient by far more than a step) and at leaves in the inputs' dtype (the reference's roundings round
the values as the math's do, and the gradient at each rounding and at each use of an input, which the math
does not). Each element passes against the one it agrees with best; the tolerance grows by one step per
rounding. The small shapes run again at two other values of the params no shape sets (a math or reference
that ignores a param); a reference that raises, or returns other than one float64 tensor per output shaped as
the math's, is a one-line error."""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass, replace
from math import prod

import sympy as sp

from .catalog import load_spec
from .errors import SpecError
from .families import family_of

# |math - reference| <= ATOL + RTOL·|reference|: float32 leaves only the order of float64 operations; a
# bfloat16 rounding the two place on either side of a tie differs by one step (2^-8 relative)
TOLERANCE = {"float32": (1e-5, 1e-5), "bfloat16": (1e-2, 1e-2)}


PROBED = " (exact 0, ±1, tied inputs)"  # a result's worst is where probes are, random inputs all agree
SPECIAL = " (NaN, +inf, -inf in the lead input)"  # the forward's last run: where the non-finite values go
NOT_THE_SAME = 1e30  # the ratio where one side is a NaN or an infinity and the other is not the same


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
    generator, variants = torch.Generator().manual_seed(seed), _variants(spec, random.Random(seed))
    results = _check_spec(spec, generator, variants)
    if backward:
        results += _check_spec(backward, generator, variants, lambda c: 1 + _roundings(spec, c), spec.name)
    return results


def _variants(spec, rng: random.Random) -> list[dict]:
    """Two sets of param values other than the defaults, to catch math or a reference that ignores one: a
    float's default times 1.6 to 3.2, and times 1/4 to 1/1.6 negated unless positive (±0.5 to 2 for a 0); an
    int's plus 1 to 4, and minus 1 to 4 (plus 5 to 8 where a positive one would drop below 1). Not wider:
    rope3d's angles (float32 steps in diffusers) outgrow the tolerance at 10× its params, and a backward's
    bfloat16 check found one seed at ×4 (1.05× the tolerance: theta ×3.9 with its scales up too)."""
    up, down = {}, {}
    for p in spec.params:
        d = p.default
        if p.integer:
            up[p.name], below = d + rng.randint(1, 4), d - rng.randint(1, 4)
            down[p.name] = below if below >= 1 or not p.positive else d + rng.randint(5, 8)
        else:
            up[p.name] = d * 10 ** rng.uniform(0.2, 0.5) if d else rng.uniform(0.5, 2)
            sign = 1 if p.positive else -1
            down[p.name] = sign * (d * 10 ** rng.uniform(-0.6, -0.2) if d else rng.uniform(0.5, 2))
    return [up, down] if spec.params else []


def _roundings(spec, convention: str) -> int:
    """How many roundings to the dtype a convention's outputs (and prologue) write."""
    conv = spec.structure.convention(convention)
    exprs = [*conv.outputs.values(), *getattr(conv, "prologue", {}).values()]
    return sum(1 for e in exprs for node in sp.preorder_traversal(e) if type(node).__name__ == "to_io_dtype")


def _cases(cases: list, variants: list[dict]) -> list:
    """The family's example cases, then the small ones (4096 elements at most) again at each variant of the
    params that no case sets (those a case sets are tied to its shape: a grid's sizes, an axis's channels)."""
    tied = {name for c in cases for name, _ in c.params}
    small = [c for c in cases if prod(c.shape) <= 4096] or cases[:1]
    return cases + [
        replace(c, params=c.params + tuple((k, v) for k, v in values.items() if k not in tied))
        for values in variants
        if set(values) - tied
        for c in small
    ]


def _reference(spec, inputs, params, convention, case, math, forward, rounded=False) -> tuple:
    """The reference's outputs at a case (a backward's: ``rounded``, at leaves in the inputs' dtype); a
    KgenError where it raises or returns other than one float64 tensor per output, shaped as the math's."""
    import torch

    takes_convention = "convention" in inspect.signature(spec.reference).parameters
    try:
        extra = {"convention": convention} if takes_convention else {}
        out = spec.reference(*inputs, *params, **extra, **({"rounded": rounded} if forward else {}))
    except Exception as err:  # the user's code: any error, as one line
        message = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
        if forward:  # the backward's reference is autograd through the forward's, which ran fine
            raise SpecError(
                f"reference of {forward} is not differentiable by autograd (the backward check needs it): "
                + message
            ) from None
        raise SpecError(f"reference of {spec.name} raised at shape {case.label}: {message}") from None
    out = out if isinstance(out, tuple) else (out,)
    if len(out) != len(spec.outputs):
        raise SpecError(
            f"reference of {spec.name} returned {len(out)} tensors, the spec has {len(spec.outputs)} output"
            + "s" * (len(spec.outputs) > 1)
        )
    for tensor, got, want in zip(spec.outputs, math, out):
        if not isinstance(want, torch.Tensor) or want.numel() and want.shape != got.shape:
            found = (
                f"shape {tuple(want.shape)}" if isinstance(want, torch.Tensor) else f"a {type(want).__name__}"
            )
            raise SpecError(
                f"reference of {spec.name} returned {found} for output {tensor.name!r}, "
                f"expected {tuple(got.shape)}"
            )
        if want.is_floating_point() and want.dtype != torch.float64:
            raise SpecError(
                f"reference of {spec.name} returned {str(want.dtype).removeprefix('torch.')} for output "
                f"{tensor.name!r}: it must compute in float64 (e.g. x.double()), the check's yardstick"
            )
    return out


def _check_spec(spec, generator, variants, steps=lambda convention: 1, forward=None) -> list[Result]:
    import torch

    family = family_of(spec)
    results, examples = [], family.example_cases(spec)
    cases = _cases(examples, variants)
    runs = ("", PROBED) if forward else ("", PROBED, SPECIAL)  # random inputs, probes, non-finite (forward)
    for convention in (c.name for c in spec.structure.conventions):
        for dtype, tolerance in TOLERANCE.items():
            atol, rtol = (steps(convention) * t for t in family.check_tolerance(spec, *tolerance))
            worst, where, random_bad = 0.0, "-", False
            for case, run in ((c, r) for c in cases for r in runs):
                inputs = family.example_inputs(
                    spec, case, getattr(torch, dtype), generator, probes=run == PROBED
                )
                if run == SPECIAL and not _non_finite(inputs[0]):
                    continue
                params = case.param_values(spec)
                math = family.evaluate(spec, inputs, params, convention)
                # a backward: autograd of the reference at float64 leaves, and at leaves in the dtype
                references = [
                    _reference(spec, inputs, params, convention, case, math, forward, rounded)
                    for rounded in ((False, True) if forward else (False,))
                ]
                for at, (tensor, got) in enumerate(zip(spec.outputs, math)):
                    ratio = torch.stack([_ratio(got, r[at], inputs[0], atol, rtol) for r in references])
                    ratio = ratio.amin(0)  # each element against the reference it agrees with best
                    bad = ratio.max().item() if ratio.numel() else 0.0
                    random_bad = random_bad or (bad > 1 and not run)
                    if bad > worst:
                        worst, where = bad, f"{case.label}{run}, {tensor.name}"
            # only a failure where the probes are (none on random inputs) is a derivative's convention there
            where = where.replace(PROBED, "").replace(SPECIAL, "") if random_bad else where
            results.append(Result(spec.name, convention, dtype, len(examples), worst, where))
    return results


def _ratio(got, want, lead, atol: float, rtol: float):
    """|got - want| / (atol + rtol·scale) per element; 0 where both are the same NaN or infinity, NOT_THE_SAME
    where only one side is finite or they differ."""
    want, got = want.double(), got.double()
    scale = want.abs()
    if 0 < want.numel() < lead.numel():  # a sum over rows (a weight's gradient)
        # each row's term carries its own rounding error, so the sum's error grows with the terms (about
        # their root-sum-square), not with a sum that cancelled to near zero
        scale = scale.clamp_min(want.square().mean().sqrt().item())
    # a NaN or an infinity matches only the same; numbers, within the tolerance
    same = (got == want) | (got.isnan() & want.isnan())
    finite = got.isfinite() & want.isfinite()
    ratio = ((got - want).abs() / (atol + rtol * scale)).where(finite, 0.0)
    return ratio.where(finite | same, NOT_THE_SAME)


def _non_finite(x) -> bool:
    """A NaN, +inf and -inf in place of elements 1, n / 2 and n - 1 of the lead input (as many of them as
    are distinct: one element takes the NaN alone); False where it is not a floating tensor with elements."""
    if x is None or not x.is_floating_point() or x.numel() < 1:
        return False
    flat, n = x.view(-1), x.numel()
    places = dict.fromkeys((min(1, n - 1), n // 2, n - 1))
    for at, value in zip(places, (float("nan"), float("inf"), float("-inf"))):
        flat[at] = value
    return True


def disagreement(bad: list[Result]) -> str:
    """The error for results that failed: each with where and by how much; a hint where only probes did."""
    text = "the math and the reference disagree: " + "; ".join(
        f"{r.op} (convention {r.convention}, {r.dtype}) at {r.where}, "
        + (
            f"{r.worst:.3g}× the tolerance"
            if r.worst < NOT_THE_SAME
            else "a NaN or infinity on one side only"
        )
        for r in bad
    )
    if all(PROBED in r.where for r in bad):
        text += (
            ". At an exact 0, ±1 or a tie the derivative is a convention: sympy's Max and Min split a tie's "
            "gradient in halves (torch.maximum's), Abs's is 0 at 0; torch.relu's 0 at 0 is "
            "Piecewise((0, x <= 0), (x, True)), and 1 at 0 Piecewise((0, x < 0), (x, True))"
        )
    if all(SPECIAL in r.where for r in bad):
        text += (
            ". A comparison is false at NaN, so Piecewise takes its last branch there: "
            "Piecewise((x, x > 0), (0, True)) turns a NaN into 0 where torch.relu keeps it; put the branch "
            "that keeps it last, Piecewise((0, x <= 0), (x, True)); Max and Min keep a NaN (torch.maximum's)"
        )
    return text

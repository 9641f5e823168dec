"""Gradients of spec math: what a family derives an op's backward from.

Each convention's output expressions are differentiated by sympy (vector-Jacobian products). A rounding to the
I/O dtype (`to_io_dtype`) differentiates as the identity, as autograd treats a library's cast, and a rounded
value a derivative keeps stays rounded, as the tensor the library saves. ``1 / (1 + exp(-u))`` is first
rewritten as ``sigmoid(u)``, whose derivative s·(1 - s) stays finite where exp(-u) overflows (SiLU's
derivative from x / (1 + exp(-x)) is inf / inf for x < -88 in fp32). The backward's float64 reference is
autograd through the forward's reference: the derived math is checked against the library-level definition."""

from __future__ import annotations

import functools
import inspect

import sympy as sp

from .dsl import OpSpec, sigmoid


def gradient_name(name: str) -> str:
    """The gradient of a tensor (or a packed tensor's half) in a backward op: grad_<name>."""
    return f"grad_{name}"


def differentiable(expr: sp.Expr) -> sp.Expr:
    """The expression with its logistic terms written as sigmoid."""

    def logistic(e) -> bool:
        if not (e.is_Pow and e.exp == -1 and e.base.is_Add and len(e.base.args) == 2):
            return False
        one, rest = sorted(e.base.args, key=lambda a: not a.is_Number)
        return one == 1 and isinstance(rest, sp.exp)

    def as_sigmoid(e):
        rest = next(a for a in e.base.args if isinstance(a, sp.exp))
        return sigmoid(-rest.args[0])

    return expr.replace(logistic, as_sigmoid)


def _step(u: sp.Expr) -> sp.Expr:
    """Heaviside(u) as a printable conditional, torch.maximum's: ½ at 0 (a tie's halves), 1 where u is NaN."""
    return sp.Piecewise((0, u < 0), (sp.Rational(1, 2), sp.Eq(u, 0)), (1, True))


@functools.lru_cache(maxsize=4096)
def derivative(expr: sp.Expr, symbol: str) -> sp.Expr:
    """∂expr/∂symbol over the reals, in functions the CUDA printer knows: |u|' = sign(u) and max/min's step
    become conditionals, floor's derivative is 0 (as autograd's). Cached: every build, check and listing of
    an op derives its backward again, from the same expressions."""
    real = {s: sp.Symbol(s.name, real=True) for s in expr.free_symbols}
    d = sp.diff(differentiable(expr).xreplace(real), sp.Symbol(symbol, real=True))
    d = d.replace(sp.sign, lambda u: sp.Piecewise((1, u > 0), (-1, u < 0), (0, True))).replace(
        sp.Heaviside, lambda u, *_: _step(u)
    )
    d = d.replace(
        lambda e: isinstance(e, sp.Derivative) and isinstance(e.expr, sp.floor), lambda e: sp.S.Zero
    )
    return d.xreplace({r: s for s, r in real.items()} | {sp.Symbol(symbol, real=True): sp.Symbol(symbol)})


def vjp(outputs: dict[str, sp.Expr], wrt: list[str]) -> dict[str, sp.Expr]:
    """For each symbol in ``wrt``, Σ over outputs of grad_<output> · ∂output/∂symbol."""
    terms = {v: [sp.Symbol(gradient_name(o)) * derivative(e, v) for o, e in outputs.items()] for v in wrt}
    return {gradient_name(v): sp.Add(*t) for v, t in terms.items()}


def gradient_outputs(forward: OpSpec, backward: OpSpec) -> dict[str, str]:
    """Each input that gets a gradient -> the backward output holding it (its own or a shared one)."""
    outs = {t.name for t in backward.outputs}
    found = {
        t.name: backward.shared.get(gradient_name(t.name), gradient_name(t.name)) for t in forward.inputs
    }
    return {name: out for name, out in found.items() if out in outs}


def backward_reference(forward: OpSpec, order=None, returns=None, stand_in=None, passes=None, aliases=None):
    """The backward's float64 reference: autograd of the forward's reference. Called with the backward's
    inputs in ``order`` (names: the forward's inputs and one incoming gradient per output, grad_<output>;
    by default the forward's inputs, then the gradients), then the params, and ``convention``. A forward
    input the backward does not take (a linear op's gradients do not depend on it) is zeros shaped like the
    input ``stand_in`` maps it to, or (``aliases``) the backward input it maps to (a saved sum: its first
    input). Returns the gradient of every input (named in ``returns``) in order, one ``passes`` maps to the
    incoming gradient it equals empty where it has that gradient's shape. By default the inputs are float64
    leaves (the exact gradient, which the GPU tests hold kernels to); ``rounded=True`` keeps each in its own
    dtype, so the forward reference's roundings to that dtype round the values as the convention does (and the
    gradients at each rounding and each use of an input): `kgen check` compares derived math with both."""
    names = [t.name for t in forward.inputs]
    grads = [gradient_name(t.name) for t in forward.outputs]
    order, reference = order or names + grads, forward.reference
    takes_convention = "convention" in inspect.signature(reference).parameters

    def backward_reference(*args, convention=None, rounded=False, **params):
        import torch

        given = dict(zip(order, args))
        given |= {n: torch.zeros_like(given[other]) for n, other in (stand_in or {}).items()}
        given |= {n: given[other] for n, other in (aliases or {}).items()}

        def leaf(t):  # float64 (or as given) and requiring grad; an index tensor (a label) as it is
            return (t if rounded else t.double()).detach().requires_grad_() if t.is_floating_point() else t

        inputs = [None if given[n] is None else leaf(given[n]) for n in names]
        incoming = [given[g].double() for g in grads]
        extra = {"convention": convention} if takes_convention and convention is not None else {}
        with torch.enable_grad():
            outs = reference(*inputs, *args[len(order) :], **params, **extra)
            outs = outs if isinstance(outs, tuple) else (outs,)
            present = [t for t in inputs if t is not None and t.requires_grad]
            found = iter(torch.autograd.grad(outs, present, incoming, allow_unused=True))

        def grad_of(
            t,
        ):  # zeros for an input the outputs do not use, empty for an absent one, none for an index
            if t is None or not t.requires_grad:
                return torch.zeros(0, dtype=torch.float64)
            return (torch.zeros_like(t) if (g := next(found)) is None else g).double()

        by_name = dict(zip(names, map(grad_of, inputs)))
        by_name |= {
            n: by_name[n].new_empty(0)
            for n, g in (passes or {}).items()
            if by_name[n].shape == given[g].shape
        }
        return tuple(by_name[n] for n in returns or names)

    return backward_reference

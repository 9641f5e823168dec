"""Prints spec math (sympy) as CUDA C++ statements, after common-subexpression
elimination, with sympy's C99 printer set to fp32 (sqrtf, expf, 1.0F ...), or to fp64 where a spec
computes in double as the library it matches does (rotary angles from fp64 frequency tables)."""

from __future__ import annotations

import sympy as sp
from sympy.codegen.ast import float32, float64, real
from sympy.printing.c import C99CodePrinter


class CudaPrinter(C99CodePrinter):
    """C99 in fp32 (or fp64 with ``double``), plus the CUDA intrinsics a memory-bound kernel wants:
    rsqrtf, products (and sqrtf) instead of powf for small integer and half-integer powers, and
    ``to_io_dtype``."""

    def __init__(self, names: dict[str, str], double: bool = False):
        # no math macros: M_SQRT2 and friends are doubles and would pull fp32 arithmetic into fp64
        super().__init__({"type_aliases": {real: float64 if double else float32}, "math_macros": {}})
        self._names, self._suffix = names, "" if double else "F"

    def _print_Symbol(self, symbol):
        return self._names.get(symbol.name, symbol.name)

    def _print_Pow(self, expr):
        base, exp = expr.args
        if exp == sp.Rational(-1, 2):
            return f"rsqrt{'f' if self._suffix else ''}({self._print(base)})"
        factor = self.parenthesize(base, sp.printing.precedence.PRECEDENCE["Mul"])
        if exp.is_Integer and 2 <= int(exp) <= 4:
            return "(" + "*".join([factor] * int(exp)) + ")"
        if exp.is_Rational and exp.q == 2 and 3 <= abs(exp.p) <= 7:  # b**(3/2): b*sqrtf(b), not powf
            # (~110 PTX instructions with its special cases: a norm backward's rstd slope, per row and thread)
            power = "(" + "*".join([factor] * (abs(exp.p) // 2) + [self._print(sp.sqrt(base))]) + ")"
            return power if exp.p > 0 else f"(1.0{self._suffix}/{power})"
        return super()._print_Pow(expr)

    def _print_NumberSymbol(self, expr):  # pi, E, ...: a literal in the printer's precision
        return f"{float(expr)!r}{self._suffix}"

    _print_Pi = _print_Exp1 = _print_NumberSymbol

    def _print_UnevaluatedExpr(self, expr):  # kept as written: e.g. a reciprocal multiplied, as torch does
        return f"({self._print(expr.args[0])})"

    _print_re = _print_UnevaluatedExpr  # every value is real: sympy writes Abs(exp(x)) as exp(re(x))

    def _print_Piecewise(self, expr):  # one line of nested conditionals
        *cases, (last, _) = expr.args
        text = self._print(last)
        for value, cond in reversed(cases):
            text = f"({self._print(cond)} ? {self._print(value)} : {text})"
        return text

    def _print_Max(self, expr, helper="nan_max"):  # torch.maximum's NaN: fmaxf would return the other operand
        args = [self._print(sp.Float(a) if a.is_Number else a) for a in expr.args]  # one type: a template's
        text = args[0]
        for arg in args[1:]:
            text = f"{helper}({text}, {arg})"
        return text

    def _print_Min(self, expr):
        return self._print_Max(expr, "nan_min")

    def _print_sigmoid(self, expr):
        f = "f" if self._suffix else ""
        return f"(1.0{self._suffix} / (1.0{self._suffix} + exp{f}(-({self._print(expr.args[0])}))))"

    def _print_to_io_dtype(self, expr):
        return f"round_to_io<T>({self._print(expr.args[0])})"


def statements(assignments: dict[str, sp.Expr], names: dict[str, str], double: bool = False) -> list[str]:
    """``target = expr;`` lines (targets are C++ lvalues), shared subexpressions first as consts; in fp64
    with ``double``."""
    printer = CudaPrinter(names, double)
    targets = list(assignments)
    temps, reduced = sp.cse([assignments[t] for t in targets], symbols=sp.numbered_symbols("t"))
    lines = [
        f"const {'double' if double else 'float'} {tmp} = {printer.doprint(value)};" for tmp, value in temps
    ]
    lines += [f"{target} = {printer.doprint(value)};" for target, value in zip(targets, reduced)]
    return lines


def evaluate(expr: sp.Expr, values: dict, round_io):
    """The expression's value, elementwise, on torch tensors (or numbers) bound to its symbols: the spec's
    math computed on the CPU in the tensors' precision, what `kgen check` compares with the reference.
    ``round_io`` is to_io_dtype (a rounding to the op's I/O dtype and back)."""
    import torch

    def tensor(v):  # a number as a float64 scalar (it then takes the tensors' precision in arithmetic)
        return v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.float64)

    def ev(e):
        if isinstance(e, sp.Symbol):
            return values[e.name]
        if isinstance(e, (sp.Number, sp.NumberSymbol)):
            return float(e)
        if isinstance(e, sp.logic.boolalg.BooleanAtom):
            return bool(e)
        args = [ev(a) for a in e.args] if not isinstance(e, sp.Piecewise) else None
        name = type(e).__name__
        if isinstance(e, sp.Add):
            out = args[0]
            for a in args[1:]:
                out = out + a
            return out
        if isinstance(e, sp.Mul):
            out = args[0]
            for a in args[1:]:
                out = out * a
            return out
        if isinstance(e, sp.Pow):
            base, power = args
            # a tensor power: 0 to a negative power is inf (a Piecewise branch it does not take), not an error
            return torch.rsqrt(tensor(base)) if e.args[1] == sp.Rational(-1, 2) else tensor(base) ** power
        if isinstance(e, sp.Piecewise):  # the first true condition's value
            *cases, (last, _) = e.args
            out = tensor(ev(last))
            for value, cond in reversed(cases):
                out = torch.where(tensor(ev(cond)), tensor(ev(value)), out)
            return out
        if isinstance(e, sp.Rel):
            return {
                "<": torch.lt,
                "<=": torch.le,
                ">": torch.gt,
                ">=": torch.ge,
                "==": torch.eq,
                "!=": torch.ne,
            }[e.rel_op](tensor(args[0]), tensor(args[1]))
        unary = {
            "exp": torch.exp,
            "log": torch.log,
            "tanh": torch.tanh,
            "erf": torch.erf,
            "sqrt": torch.sqrt,
            "sin": torch.sin,
            "cos": torch.cos,
            "Abs": torch.abs,
            "floor": torch.floor,
            "re": lambda v: v,
            "UnevaluatedExpr": lambda v: v,
            "to_io_dtype": round_io,
            "sigmoid": torch.sigmoid,
            "Not": torch.logical_not,
        }
        if name in unary:
            return unary[name](tensor(args[0]))
        if name in ("Max", "Min", "And", "Or"):
            fn = {
                "Max": torch.maximum,
                "Min": torch.minimum,
                "And": torch.logical_and,
                "Or": torch.logical_or,
            }[name]
            out = tensor(args[0])
            for a in args[1:]:
                out = fn(out, tensor(a))
            return out
        if name == "ITE":
            return torch.where(tensor(args[0]), tensor(args[1]), tensor(args[2]))
        raise ValueError(f"no evaluation of {name}")  # the DSL refuses what it cannot print, so this is a bug

    return ev(expr)

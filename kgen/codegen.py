"""Prints spec math (sympy) as CUDA C++ statements, after common-subexpression
elimination, with sympy's C99 printer set to fp32 (sqrtf, expf, 1.0F ...)."""

from __future__ import annotations

import sympy as sp
from sympy.codegen.ast import float32, real
from sympy.printing.c import C99CodePrinter


class CudaPrinter(C99CodePrinter):
    """C99 in fp32, plus the CUDA intrinsics a memory-bound kernel wants: rsqrtf,
    products instead of powf for small integer powers, and ``to_io_dtype``."""

    def __init__(self, names: dict[str, str]):
        # no math macros: M_SQRT2 and friends are doubles and would pull the arithmetic into fp64
        super().__init__({"type_aliases": {real: float32}, "math_macros": {}})
        self._names = names

    def _print_Symbol(self, symbol):
        return self._names.get(symbol.name, symbol.name)

    def _print_Pow(self, expr):
        base, exp = expr.args
        if exp == sp.Rational(-1, 2):
            return f"rsqrtf({self._print(base)})"
        if exp.is_Integer and 2 <= int(exp) <= 4:
            factor = self.parenthesize(base, sp.printing.precedence.PRECEDENCE["Mul"])
            return "(" + "*".join([factor] * int(exp)) + ")"
        return super()._print_Pow(expr)

    def _print_NumberSymbol(self, expr):  # pi, E, ...: an fp32 literal
        return f"{float(expr)!r}F"

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

    def _print_to_io_dtype(self, expr):
        return f"round_to_io<T>({self._print(expr.args[0])})"


def statements(assignments: dict[str, sp.Expr], names: dict[str, str]) -> list[str]:
    """``target = expr;`` lines (targets are C++ lvalues), shared subexpressions first as consts."""
    printer = CudaPrinter(names)
    targets = list(assignments)
    temps, reduced = sp.cse([assignments[t] for t in targets], symbols=sp.numbered_symbols("t"))
    lines = [f"const float {tmp} = {printer.doprint(value)};" for tmp, value in temps]
    lines += [f"{target} = {printer.doprint(value)};" for target, value in zip(targets, reduced)]
    return lines

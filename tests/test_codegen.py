"""Spec math printed as CUDA by sympy: fp32 functions, intrinsics, CSE."""

from __future__ import annotations

import sympy as sp

from kgen.codegen import statements
from kgen.dsl import to_io_dtype

x, w, s, eps = sp.symbols("x w s eps")


def test_fp32_functions_and_intrinsics():
    lines = statements(
        {
            "a": 1 / sp.sqrt(s + eps),
            "b": x**2,
            "c": sp.exp(x) * sp.Rational(1, 2),
            "d": sp.erf(x) + sp.tanh(x),
            "e": sp.sqrt(x),
            "f": sp.sin(x) * sp.cos(x),  # e.g. Snake's sin(αx)² and its derivative
        },
        {},
    )
    assert "a = rsqrtf(eps + s);" in lines
    assert "b = (x*x);" in lines
    assert "c = (1.0F/2.0F)*expf(x);" in lines
    assert "d = tanhf(x) + erff(x);" in lines
    assert "e = sqrtf(x);" in lines
    assert "f = sinf(x)*cosf(x);" in lines


def test_names_and_io_rounding():
    lines = statements({"out": w * to_io_dtype(x * s)}, {"s": "stats.rstd", "w": "weight"})
    assert lines == ["out = weight*round_to_io<T>(stats.rstd*x);"]


def test_common_subexpressions_are_shared():
    shared = 1 / sp.sqrt(s * s + eps)
    lines = statements({"a": x * shared, "b": w * shared}, {})
    assert lines[0].startswith("const float t0 = ")
    assert lines[1:] == ["a = t0*x;", "b = t0*w;"]


def test_real_parts_sympy_introduces_print_as_the_value():
    # sympy's symbols may be complex: it rewrites |exp(x)| as exp(re(x)); every kernel value is real
    assert statements({"a": sp.Abs(sp.exp(x))}, {}) == ["a = expf((x));"]
    assert statements({"b": sp.Abs(2**x)}, {}) == ["b = powf(2, (x));"]


def test_half_integer_powers_are_products_with_a_square_root():
    # a norm backward's rstd slope, -(1/2)/(eps + s)**(3/2): no powf (about 110 PTX instructions a call)
    lines = statements(
        {
            "a": -x / (2 * (s + eps) ** sp.Rational(3, 2)),
            "b": s ** sp.Rational(-3, 2),
            "c": s ** sp.Rational(5, 2),
        },
        {},
    )
    assert lines == [
        "a = -1.0F/2.0F*x/((eps + s)*sqrtf(eps + s));",
        "b = (1.0F/(s*sqrtf(s)));",
        "c = (s*s*sqrtf(s));",
    ]
    assert not any("pow" in line for line in statements({"d": s ** sp.Rational(7, 2)}, {}, double=True))
    assert statements({"e": s ** sp.Rational(9, 2)}, {}) == ["e = powf(s, 9.0F/2.0F);"]  # beyond: powf

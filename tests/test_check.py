"""`kgen check` on the CPU: every spec's math (its sympy expressions, evaluated by its family) agrees with its
reference for every convention, and a spec whose math and reference disagree is caught, naming the op, the
convention and where."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kgen.catalog import load_spec, op_names
from kgen.check import _variants, check
from kgen.cli import app
from kgen.dsl import Param
from kgen.families import family_of

OPS = Path(__file__).resolve().parents[1] / "ops"


@pytest.mark.parametrize("op", op_names())
def test_every_spec_agrees_with_its_reference(op):
    results = check(op, seed=1)
    assert {r.convention for r in results} == {c.name for c in load_spec(op).structure.conventions}
    assert all(r.ok and r.shapes > 0 for r in results), [r for r in results if not r.ok]


# (spec file, its text, the mistake) -> a copy of a real spec with one slip in its math
MISTAKES = [
    ("rmsnorm", 'outputs={"out": x * rstd * weight}', 'outputs={"out": x * rstd}'),  # the weight dropped
    ("rmsnorm", "finalize=1 / sp.sqrt(row_sum * inv_hidden + eps)", "finalize=1 / sp.sqrt(row_sum + eps)"),
    ("geglu", 'outputs={"out": h * gelu_tanh}', 'outputs={"out": h * gelu_erf}'),  # tanh convention, erf math
    (
        "rope",
        'outputs={"out": x * cos + sign * x_pair * sin',
        'outputs={"out": x * cos - sign * x_pair * sin',
    ),
    ("rope3d", "angle=freq * (2 * coord - 1)", "angle=freq * (2 * coord + 1)"),
]


@pytest.mark.parametrize("op, text, slip", MISTAKES, ids=[f"{op}: {slip}" for op, _, slip in MISTAKES])
def test_a_slip_in_the_math_is_caught(tmp_path, monkeypatch, op, text, slip):
    source = (OPS / f"{op}.py").read_text()
    assert text in source, "the spec changed: update this test's text"
    (tmp_path / f"{op}_slip.py").write_text(
        source.replace(text, slip).replace(f'name="{op}"', f'name="{op}_slip"')
    )
    monkeypatch.setenv("KGEN_OPS_PATH", str(tmp_path))
    load_spec.cache_clear()
    try:
        assert not all(r.ok for r in check(f"{op}_slip"))
        result = CliRunner().invoke(app, ["check", f"{op}_slip", "rmsnorm"])
        assert result.exit_code == 2, result.output
        assert f"the math and the reference disagree: {op}_slip (convention" in result.output
        assert "rmsnorm | single_rounding | float32 | 6 | " in result.output  # the others are still listed
    finally:
        load_spec.cache_clear()


RELU = """
import sympy as sp
import torch

from kgen.dsl import Convention, OpSpec, Tensor
from kgen.families.elementwise import Elementwise

x = sp.Symbol("x")

spec = OpSpec(
    name="NAME",
    summary="ReLU",
    tensors=[Tensor(name="x", dims="*rows hidden"), Tensor(name="out", dims="*rows hidden", role="output")],
    structure=Elementwise(
        conventions=[Convention(name="single_rounding", outputs={"out": MATH}, matches="-")]
    ),
    reference=lambda x: REFERENCE,
)
"""


@pytest.mark.parametrize(
    "math, reference, agree",
    [
        ("sp.Max(x, 0)", "torch.relu(x.double())", False),  # sympy's derivative at 0 is ½, torch.relu's 0
        ("sp.Piecewise((0, x <= 0), (x, True))", "torch.relu(x.double())", True),  # NaN kept, as torch.relu
        ("sp.Max(x, 0)", "torch.maximum(x.double(), torch.zeros_like(x.double()))", True),  # ½ both
        ("sp.Piecewise((x, x >= 0), (0, True))", "torch.where(x >= 0, x.double(), 0.0)", True),  # 1 at 0
    ],
)
def test_the_derivative_at_a_kink_is_checked(tmp_path, monkeypatch, math, reference, agree):
    """Random inputs never land on a kink: `kgen check` also probes exact 0, ±1 and ties, where a derivative
    is a convention (torch.relu's 0 at 0, torch.maximum's ½, a torch.where's 1), and names the conventions
    when a probe fails."""
    (tmp_path / "kinked.py").write_text(
        RELU.replace("NAME", "kinked").replace("MATH", math).replace("REFERENCE", reference)
    )
    monkeypatch.setenv("KGEN_OPS_PATH", str(tmp_path))
    load_spec.cache_clear()
    try:
        results = check("kinked")
        assert all(r.ok for r in results if r.op == "kinked")  # the forward agrees everywhere
        backward = [r for r in results if r.op == "kinked_backward"]
        assert len(backward) == 2 and all(r.ok == agree for r in backward), backward
        assert agree or all("(exact 0, ±1, tied inputs), grad_x" in r.where for r in backward)
        result = CliRunner().invoke(app, ["check", "kinked"])
        assert result.exit_code == (0 if agree else 2), result.output
        assert ("Piecewise((0, x <= 0), (x, True))" in " ".join(result.output.split())) == (not agree)
    finally:
        load_spec.cache_clear()


@pytest.mark.parametrize(
    "math, reference, agree",
    [
        ("sp.Piecewise((x, x > 0), (0, True))", "torch.relu(x.double())", False),  # NaN > 0 is false: 0
        ("sp.Piecewise((0, x <= 0), (x, True))", "torch.relu(x.double())", True),  # NaN falls to x
        ("2 * x", "(2 * x.double()).nan_to_num(nan=0.0)", False),  # the math keeps a NaN the ref drops
        ("sp.Piecewise((x, x > 0), (0, True))", "torch.where(x > 0, x.double(), 0.0)", True),  # both drop it
        ("sp.exp(x)", "torch.exp(x.double()).nan_to_num(posinf=3.0e38)", False),  # an infinity made finite
    ],
)
def test_nan_and_infinity_in_the_lead_input_go_where_the_reference_sends_them(
    tmp_path, monkeypatch, math, reference, agree
):
    """Random inputs and the probes are finite: the forward runs once more with a NaN, +inf and -inf in its
    lead input, and the math must give a NaN or an infinity exactly where the reference does. A Piecewise
    that drops a NaN (a comparison is false there) would map bad input to numbers without a word."""
    (tmp_path / "nan.py").write_text(
        RELU.replace("NAME", "nan").replace("MATH", math).replace("REFERENCE", reference)
    )
    monkeypatch.setenv("KGEN_OPS_PATH", str(tmp_path))
    load_spec.cache_clear()
    try:
        forward = [r for r in check("nan") if r.op == "nan"]
        assert len(forward) == 2 and all(r.ok == agree for r in forward), forward
        assert agree or all("(NaN, +inf, -inf in the lead input), out" in r.where for r in forward)
        result = CliRunner().invoke(app, ["check", "nan"])
        output = " ".join(result.output.split())
        assert result.exit_code == (0 if agree else 2), result.output
        assert ("a NaN or infinity on one side only" in output) == (not agree), output
        assert ("A comparison is false at NaN" in output) == (not agree), output
    finally:
        load_spec.cache_clear()


LEAKY = """
import sympy as sp
import torch
import torch.nn.functional as F

from kgen.dsl import Convention, OpSpec, Param, Tensor
from kgen.families.elementwise import Elementwise

x, slope = sp.symbols("x negative_slope")


def leaky(name, s):
    return Convention(name=name, outputs={"out": sp.Piecewise((x, x > 0), (s * x, True))}, matches="-")


spec = OpSpec(
    name="leaky",
    summary="leaky ReLU",
    tensors=[Tensor(name="x", dims="*rows hidden"), Tensor(name="out", dims="*rows hidden", role="output")],
    params=[Param(name="negative_slope", default=0.01)],
    structure=Elementwise(conventions=[leaky("slope", slope), leaky("fixed", MATH)]),
    reference=lambda x, negative_slope=0.01, convention=None: REFERENCE,
)
"""


def _check_leaky(tmp_path, monkeypatch, math="slope", reference="F.leaky_relu(x.double(), negative_slope)"):
    """`kgen check leaky` of LEAKY with its second convention's slope and its reference: the exit code and the
    error on one line."""
    (tmp_path / "leaky.py").write_text(LEAKY.replace("MATH", math).replace("REFERENCE", reference))
    monkeypatch.setenv("KGEN_OPS_PATH", str(tmp_path))
    load_spec.cache_clear()
    try:
        result = CliRunner().invoke(app, ["check", "leaky"])
    finally:
        load_spec.cache_clear()
    return result.exit_code, " ".join(result.output.split())


def test_a_param_the_math_or_the_reference_ignores_is_caught(tmp_path, monkeypatch):
    """At the defaults a slope hard-coded to the default's 0.01 agrees: the check also runs the small shapes
    at two other values of the params, and names them."""
    assert _check_leaky(tmp_path, monkeypatch)[0] == 0
    code, output = _check_leaky(tmp_path, monkeypatch, math="0.01")  # the math's second convention
    assert code == 2 and "leaky (convention fixed, float32) at " in output and "(negative_slope=" in output
    assert "(convention slope" not in output, output
    code, output = _check_leaky(tmp_path, monkeypatch, reference="F.leaky_relu(x.double(), 0.01)")
    assert code == 2 and "leaky (convention slope, float32) at " in output and "(negative_slope=" in output


def test_the_params_vary_within_their_range():
    """Other values than the defaults, the same for a seed: a positive param's positive, an int's an int."""

    class Spec:
        params = [
            Param(name="eps", default=1e-6, positive=True),
            Param(name="slope", default=0.01),
            Param(name="shift", default=0.0),
            Param(name="frames", default=1, integer=True, positive=True),
            Param(name="ignore", default=-100, integer=True),
        ]

    for seed in range(20):
        variants = _variants(Spec, random.Random(seed))
        assert len(variants) == 2 and variants == _variants(Spec, random.Random(seed))
        for values in variants:
            assert values["eps"] > 0 and values["frames"] >= 1
            assert isinstance(values["frames"], int) and isinstance(values["ignore"], int)
            assert all(values[p.name] != p.default for p in Spec.params)
        assert variants[0] != variants[1]


def test_the_example_cases_are_asked_once_a_spec(monkeypatch):
    """They were asked again for every convention and dtype (once more only to count them)."""
    spec = load_spec("gelu_tanh")
    family = type(family_of(spec))  # the backward's too
    asked, example_cases = [], family.example_cases

    def counted(self, spec):
        asked.append(spec.name)
        return example_cases(self, spec)

    monkeypatch.setattr(family, "example_cases", counted)
    results = check("gelu_tanh")
    assert sorted(asked) == ["gelu_tanh", "gelu_tanh_backward"]
    assert {r.shapes for r in results if r.op == "gelu_tanh"} == {len(example_cases(family_of(spec), spec))}


@pytest.mark.parametrize(
    "reference, error",
    [
        (
            "F.leaky_relu(x.double(), negative_slope).sum(-1)",
            "error: reference of leaky returned shape (1,) for output 'out', expected (1, 1)",
        ),
        (
            "(F.leaky_relu(x.double(), negative_slope), x.double())",
            "error: reference of leaky returned 2 tensors, the spec has 1 output",
        ),
        (
            "torch.from_numpy(F.leaky_relu(x.double(), negative_slope).numpy())",
            "error: reference of leaky is not differentiable by autograd (the backward check needs it): "
            "RuntimeError: Can't call numpy() on Tensor that requires grad.",
        ),
        (
            "x.double().view(-1, 3)",
            "error: reference of leaky raised at shape 1×1: RuntimeError: shape '[-1, 3]'",
        ),
        (
            "F.leaky_relu(x.double(), negative_slope).tolist()",
            "error: reference of leaky returned a list for output 'out', expected (1, 1)",
        ),
        # the reference's own dtype: float32 agrees within the float32 tolerance, yet is not the yardstick
        (
            "F.leaky_relu(x, negative_slope)",
            "error: reference of leaky returned float32 for output 'out': it must compute in float64",
        ),
        ("F.leaky_relu(x.to(torch.bfloat16), negative_slope)", "error: reference of leaky returned bfloat16"),
    ],
)
def test_a_broken_reference_is_a_one_line_error(tmp_path, monkeypatch, reference, error):
    code, output = _check_leaky(tmp_path, monkeypatch, reference=reference)
    assert code == 2 and output.startswith(error), output


def test_the_hint_on_derivatives_at_ties_is_only_where_the_probes_alone_disagree(tmp_path, monkeypatch):
    """A reference wrong on random inputs fails everywhere, the probes' runs included: no hint on kinks."""
    code, output = _check_leaky(
        tmp_path, monkeypatch, reference="F.leaky_relu(x.double(), negative_slope) * 1.01"
    )
    error = output[output.index("error: ") :].split(" the spec's math against its reference")[0]
    assert code == 2 and error.startswith("error: the math and the reference disagree: leaky (conv"), output
    assert "(exact 0, ±1, tied inputs)" not in error and "At an exact 0" not in error, error

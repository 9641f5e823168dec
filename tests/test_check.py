"""`kgen check` on the CPU: every spec's math (its sympy expressions, evaluated by its family) agrees with its
reference for every convention, and a spec whose math and reference disagree is caught, naming the op, the
convention and where."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kgen.catalog import load_spec, op_names
from kgen.check import check
from kgen.cli import app

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
        ("sp.Piecewise((x, x > 0), (0, True))", "torch.relu(x.double())", True),
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
        assert ("Piecewise((x, x > 0), (0, True))" in " ".join(result.output.split())) == (not agree)
    finally:
        load_spec.cache_clear()

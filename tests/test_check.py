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

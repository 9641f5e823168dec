"""Structure families plug in from outside kgen: tests/families/row_scale.py (a '*rows' scale per row, its
own tensor layout, checks, plan, context, shapes and templates) is registered from $KGEN_FAMILIES_PATH, and
the spec tests/family_ops/scale_rows.py uses it, with no edit in kgen/. It renders, explains, compiles with
nvcc and builds (CI), and runs on the GPU against its reference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import kgen.catalog as catalog
import kgen.families as registry
from kgen.builder import build_project, compile_kernel, load, render_target, write_project
from kgen.catalog import load_profile, load_spec
from kgen.cli import app
from kgen.errors import KgenError
from kgen.families import family_of, register
from kgen.families.base import Family
from kgen.project import resolve_target

HERE = Path(__file__).resolve().parent


@pytest.fixture
def plugged(monkeypatch):
    """The row_scale family and its op on the search paths, registered for this test only."""
    monkeypatch.setenv("KGEN_FAMILIES_PATH", str(HERE / "families"))
    monkeypatch.setenv("KGEN_OPS_PATH", str(HERE / "family_ops"))
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    catalog._load_families.cache_clear()
    load_spec.cache_clear()
    yield
    catalog._load_families.cache_clear()
    load_spec.cache_clear()


def test_a_family_from_outside_kgen_plans_and_renders(plugged):
    spec = load_spec("scale_rows")
    assert family_of(spec).name == "row_scale" and not Path(family_of(spec).template_root).is_relative_to(
        Path(catalog.__file__).parent
    )
    files = render_target(resolve_target("scale_rows", "sm_90"))
    kernel = files["scale_rows_cuda/scale_rows.cu"]
    assert "scale_rows_kernel" in kernel and "out_out = s*x;" in kernel
    assert "s must have x's leading dims" in files["torch-ext/scale_rows_sm90/__init__.py"]
    assert "`s` holds one value per row" in files["CARD.md"]
    assert "'s': (2, 5)" in files["tests/test_scale_rows.py"]  # the family's shapes reach the generated test
    result = CliRunner().invoke(app, ["explain", "scale_rows", "--shape", "4x4096"])
    assert result.exit_code == 0 and "one thread per element" in result.output, result.output
    # a family that derives no backward: `explain --backward` refuses it
    refused = CliRunner().invoke(app, ["explain", "scale_rows", "--backward"])
    assert refused.exit_code == 2 and "scale_rows has no backward kernels yet" in refused.output


def test_a_spec_of_an_unregistered_family_is_refused(monkeypatch):
    """Without $KGEN_FAMILIES_PATH the spec cannot import its family: refused naming the spec, line and
    cause."""
    monkeypatch.setenv("KGEN_OPS_PATH", str(HERE / "family_ops"))
    for module in ("kgen_families", "kgen_families.row_scale"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    catalog._load_families.cache_clear()
    load_spec.cache_clear()
    source = (HERE / "family_ops" / "scale_rows.py").read_text().splitlines()
    line = 1 + next(i for i, text in enumerate(source) if text.startswith("from kgen_families"))
    try:
        with pytest.raises(
            KgenError,
            match=rf"spec 'scale_rows' \(.*scale_rows.py:{line}\) failed to load: "
            r"ModuleNotFoundError: .*is its folder on \$KGEN_FAMILIES_PATH",
        ):
            load_spec("scale_rows")
    finally:
        load_spec.cache_clear()


def test_registration_checks_the_family(monkeypatch):
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    with pytest.raises(KgenError, match="is not a structure family"):
        register(object())

    class Misnamed(Family):
        name = "something_else"
        structure = type(load_spec("rmsnorm").structure)

    with pytest.raises(KgenError, match="has kind 'row_reduce'; they must be equal"):
        register(Misnamed())

    class Impostor(Family):
        name = "row_reduce"
        structure = type(load_spec("rmsnorm").structure)

    with pytest.raises(KgenError, match="two families are named 'row_reduce'"):
        register(Impostor())


def test_a_family_module_without_family_is_refused(tmp_path, monkeypatch):
    (tmp_path / "nothing.py").write_text("x = 1\n")
    monkeypatch.setenv("KGEN_FAMILIES_PATH", str(tmp_path))
    catalog._load_families.cache_clear()
    try:
        with pytest.raises(KgenError, match=r"must define `family = <a kgen.families.base.Family>`"):
            catalog.load_families()
    finally:
        catalog._load_families.cache_clear()


@pytest.mark.toolchain
def test_the_outside_family_compiles_and_builds(plugged, tmp_path):
    target = resolve_target("scale_rows", "sm_90")
    project = write_project(target, tmp_path)
    log = compile_kernel(project, "scale_rows", load_profile("sm_90"), tmp_path / "kernel.o")
    assert "warning" not in log.lower(), log
    variant = build_project(project, target)
    assert len(list(variant.glob("*.abi3.so"))) == 1
    # its family derives no backward: backprop raises instead of PyTorch's default warning and no gradient
    scale_rows = load(project)
    x = torch.randn(2, 4, 40, device="meta", requires_grad=True)
    s = torch.randn(2, 4, device="meta")
    with pytest.raises(RuntimeError, match="derivative for .*scale_rows is not implemented"):
        scale_rows.scale_rows(x, s).sum().backward()
    with torch.no_grad():
        assert scale_rows.scale_rows(x, s).shape == x.shape


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_outside_family_runs(plugged, build_root, dtype):
    from conftest import test_arch

    from kgen.builder import build_op

    kernel = load(build_op("scale_rows", test_arch(), build_root)).scale_rows
    spec = load_spec("scale_rows")
    for shape in [(1, 1), (3, 7), (2, 5, 4096), (1000, 333)]:
        x = torch.randn(shape, dtype=dtype, device="cuda")
        s = torch.randn(shape[:-1], dtype=dtype, device="cuda")
        want = spec.reference(x, s).to(dtype)
        torch.testing.assert_close(kernel(x, s), want, rtol=0, atol=0)  # one fp32 product, rounded once
        wide = torch.randn(*shape[:-1], 2 * shape[-1], dtype=dtype, device="cuda")[
            ..., ::2
        ]  # strided: copied
        torch.testing.assert_close(kernel(wide, s), spec.reference(wide, s).to(dtype), rtol=0, atol=0)
    with pytest.raises(ValueError, match="scale_rows: s must have x's leading dims"):
        kernel(torch.ones(2, 3, device="cuda", dtype=dtype), torch.ones(3, device="cuda", dtype=dtype))

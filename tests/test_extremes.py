"""A spec's Max and Min (tests/backward_ops/extremes.py) behave as torch.maximum and torch.minimum: NaN where
either operand is NaN (CUDA's fmaxf and fminf return the other operand: relu(NaN) would be 0), and a tie's
gradient split in halves. The printed math, the check on the CPU, and the kernels on the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import sympy as sp
import torch

from kgen.builder import load, render_target
from kgen.catalog import load_spec
from kgen.check import check
from kgen.codegen import statements
from kgen.project import resolve_target


@pytest.fixture
def extremes(monkeypatch):
    monkeypatch.setenv("KGEN_OPS_PATH", str(Path(__file__).resolve().parent / "backward_ops"))
    load_spec.cache_clear()
    yield
    load_spec.cache_clear()


def test_max_and_min_print_as_the_nan_propagating_helpers():
    x, y = sp.symbols("x y")
    assert statements({"o": sp.Max(x, 0)}, {}) == [
        "o = nan_max(0.0F, x);"
    ]  # one operand type for the template
    assert statements({"o": sp.Min(x, y, 1)}, {}, double=True) == ["o = nan_min(nan_min(1.0, x), y);"]
    assert "fmaxf" not in statements({"o": sp.Max(x, y) ** 2}, {})[-1]


def test_the_rendered_kernel_and_its_check(extremes):
    source = render_target(resolve_target("extremes", "sm_90"))["extremes_cuda/extremes.cu"]
    assert "V nan_max(V a, V b) { return (a != a || b != b) ? a + b : fmax(a, b); }" in source
    assert "nan_max(x, y)" in source and "nan_min(x, y)" in source
    assert all(r.ok for r in check("extremes")), check("extremes")


@pytest.mark.toolchain
def test_the_helpers_compile(extremes, tmp_path):
    from kgen.builder import compile_kernel, write_project
    from kgen.catalog import load_profile

    for arch in ("sm_75", "sm_90"):
        project = write_project(resolve_target("extremes", arch), tmp_path / arch)
        log = compile_kernel(project, "extremes", load_profile(arch), tmp_path / f"{arch}.o")
        assert "warning" not in log.lower() and "error" not in log.lower(), log


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_and_ties_on_the_gpu(extremes, build_root, dtype):
    from conftest import test_arch

    from kgen.builder import build_op

    op = load(build_op("extremes", test_arch(), build_root)).extremes
    for shape in [(1, 1), (3, 7), (64, 4096)]:
        x, y = (torch.randn(shape, dtype=dtype, device="cuda") for _ in range(2))
        x.view(-1)[::5], y.view(-1)[1::5] = float("nan"), float("nan")  # NaN in either operand
        y.view(-1)[2::5] = x.view(-1)[2::5]  # ties
        x.view(-1)[3::5], y.view(-1)[3::5] = float("inf"), float("-inf")
        x.requires_grad_(), y.requires_grad_()
        hi, lo = op(x, y)
        torch.testing.assert_close(hi, torch.maximum(x, y), rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(lo, torch.minimum(x, y), rtol=0, atol=0, equal_nan=True)
        dhi, dlo = torch.randn_like(hi), torch.randn_like(lo)
        got = torch.autograd.grad((hi, lo), (x, y), (dhi, dlo))
        xd, yd = (t.detach().double().requires_grad_() for t in (x, y))
        want = torch.autograd.grad((torch.maximum(xd, yd), torch.minimum(xd, yd)), (xd, yd), (dhi, dlo))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w.to(dtype), rtol=0, atol=0, equal_nan=True)

"""Invariants of the generated kernels on the GPU, kernel against kernel: what the math promises
whatever the reference says (scale invariance of RMSNorm, AdaLN with zero modulation is the plain
norm, the residual fused into AdaLN is the residual of fused add + RMSNorm)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ULP = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def within_ulps(got: torch.Tensor, want: torch.Tensor, ulps: float, hidden: int | None = None) -> None:
    """|got - want| <= ulps ulp of the dtype, plus the fp32 sum over the row (8·sqrt(hidden)·2^-24)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    hidden = hidden or got.shape[-1]
    tolerance = (
        ulps * ULP[got.dtype] + 8 * hidden**0.5 * 2.0**-24
    ) * want.double().abs() + ulps * torch.finfo(got.dtype).smallest_normal * ULP[
        got.dtype
    ]  # subnormal results have fixed spacing
    bad = (got.double() - want.double()).abs() > tolerance
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} elements differ by more than {ulps} ulp"


@SETTINGS
@given(
    rows=st.integers(1, 300),
    hidden=st.sampled_from([1, 7, 128, 1000, 2048, 5120, 16384]),
    dtype=st.sampled_from(DTYPES),
    exponent=st.integers(-8, 8),
    factor=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**31 - 1),
)
def test_rmsnorm_is_scale_invariant(built, rows, hidden, dtype, exponent, factor, seed):
    """rmsnorm(a·x) = rmsnorm(x) for a > 0: bitwise for a power of two that scales every element
    exactly (none becomes subnormal), within the roundings of a·x and of the output otherwise."""
    rmsnorm = built("rmsnorm")[1].rmsnorm
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, hidden, generator=gen, device="cuda").to(dtype)
    weight = torch.randn(hidden, generator=gen, device="cuda").to(dtype)
    base = rmsnorm(x, weight, 1e-30)
    power = x * 2.0**exponent
    exact = power * 2.0**-exponent == x  # False where a·x went subnormal (or overflowed) and lost digits
    if exact.all():
        assert torch.equal(rmsnorm(power, weight, 1e-30), base)
    # elements whose scaled input kept its digits: within the roundings of the rms and the output
    within_ulps(rmsnorm(power, weight, 1e-30)[exact], base[exact], 3, hidden)
    scaled = (x.double() * factor).to(dtype)
    normal = scaled.abs() >= torch.finfo(dtype).smallest_normal  # a·x rounded by 1/2 ulp at most
    within_ulps(rmsnorm(scaled, weight, 1e-30)[normal], base[normal], 3, hidden)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 77, 2048), (1, 3, 100), (4, 1, 4096)])
def test_adaln_with_zero_modulation_is_the_norm(built, dtype, shape):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, generator=gen, device="cuda").to(dtype)
    h = torch.randn(shape, generator=gen, device="cuda").to(dtype)
    weight = torch.randn(shape[-1], generator=gen, device="cuda").to(dtype)
    zero_batch = torch.zeros(shape[0], 1, shape[-1], device="cuda", dtype=dtype)
    zero_token = torch.zeros(shape, device="cuda", dtype=dtype)
    rmsnorm = built("rmsnorm")[1].rmsnorm(x, weight)
    layernorm = built("layernorm")[1].layernorm(x, None, None, 1e-6)
    fused, residual = built("fused_add_rmsnorm")[1].fused_add_rmsnorm(x, h, weight)
    for zero in (zero_batch, zero_token):
        within_ulps(built("adaln_rmsnorm")[1].adaln_rmsnorm(x, zero, zero, weight), rmsnorm, 1)
        within_ulps(built("adaln_layernorm")[1].adaln_layernorm(x, zero, zero), layernorm, 1)
        out, r = built("residual_adaln_rmsnorm")[1].residual_adaln_rmsnorm(x, h, zero, zero, None, weight)
        assert torch.equal(r, residual)
        within_ulps(out, fused, 1)
        # a gate of ones is no gate
        ones = torch.ones_like(zero)
        out_gated, r_gated = built("residual_adaln_rmsnorm")[1].residual_adaln_rmsnorm(
            x, h, zero, zero, ones, weight
        )
        assert torch.equal(r_gated, residual) and torch.equal(out_gated, out)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_batch_modulation_is_the_per_token_one_broadcast(built, dtype):
    """A [B, 1, C] scale/shift read in place gives what its materialised [B, S, C] copy gives,
    including the strided views diffusers passes (`ada_values.unbind(dim=2)`)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    b, s, c = 2, 333, 2048
    x = torch.randn(b, s, c, generator=gen, device="cuda").to(dtype)
    ada = torch.randn(b, 1, 6, c, generator=gen, device="cuda").to(dtype)
    shift, scale = ada.unbind(dim=2)[:2]  # [B, 1, C] views with stride 6·C
    adaln = built("adaln_rmsnorm")[1].adaln_rmsnorm
    for convention in ("single_rounding", "diffusers"):
        got = adaln(x, scale, shift, convention=convention)
        want = adaln(
            x, scale.expand(b, s, c).contiguous(), shift.expand(b, s, c).contiguous(), convention=convention
        )
        assert torch.equal(got, want)

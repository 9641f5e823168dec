"""rmsnorm on the GPU: hypothesis property tests against the float64 reference, both numerics
conventions, strides and alignment, opcheck, torch.compile and `kernels.kernelize`."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgen.catalog import load_spec

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
reference = load_spec("rmsnorm").reference


@pytest.fixture(scope="module")
def rmsnorm_kernel(built):
    return built("rmsnorm")[1]


def tolerance(dtype: torch.dtype, convention: str, hidden: int) -> float:
    """Relative error allowed: one rounding to dtype (0.5 ulp) plus fp32 arithmetic, whose sum of
    squares over `hidden` terms grows like sqrt(hidden); transformers rounds twice."""
    ulp = 2.0 ** -MANTISSA_BITS[dtype]
    roundings = 2 if convention == "transformers" else 1
    return roundings * ulp + 8 * math.sqrt(hidden) * 2.0**-24


def assert_matches(out, x, weight, eps, convention):
    expected = reference(x, weight, eps, convention)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert not torch.isnan(out).any(), "unwritten (poisoned) or NaN elements"
    rel = tolerance(x.dtype, convention, x.shape[-1])
    # Elements are O(|weight|); the floor covers values that round to zero or subnormals.
    scale = 1.0 if weight is None else weight.double().abs().max().item()
    torch.testing.assert_close(out.double(), expected, rtol=rel, atol=rel * 1e-2 * max(scale, 1e-30))


def poison_allocator(numel: int, dtype: torch.dtype) -> None:
    """Fill the block the caching allocator will hand out next with NaN, so unwritten output shows."""
    torch.full((numel,), float("nan"), dtype=dtype, device="cuda")
    # (freed at once; the next same-size allocation reuses it)


hidden_sizes = st.one_of(
    st.integers(1, 64), st.integers(65, 9000), st.sampled_from([127, 128, 2048, 4095, 4096, 5120, 8192, 16384]),
    st.integers(9000, 65536))


@st.composite
def cases(draw):
    hidden = draw(hidden_sizes)
    max_rows = max(1, min(4096, 2_000_000 // hidden))
    rows = draw(st.integers(1, max_rows))
    lead = draw(st.sampled_from(["2d", "3d", "1d"])) if rows > 1 else "1d"
    shape = {"1d": (hidden,) if rows == 1 else (rows, hidden), "2d": (rows, hidden)}.get(lead)
    if lead == "3d":
        first = draw(st.sampled_from([d for d in (1, 2, 3, 4) if rows % d == 0]))
        shape = (first, rows // first, hidden)
    return dict(shape=shape, dtype=draw(st.sampled_from(DTYPES)),
                eps=draw(st.sampled_from([1e-6, 1e-5, 1e-12, 0.1])),
                has_weight=draw(st.booleans()),
                magnitude=draw(st.sampled_from([1e-3, 1.0, 30.0, 1e4])),
                convention=draw(st.sampled_from(["single_rounding", "transformers"])),
                seed=draw(st.integers(0, 2**31 - 1)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_matches_float64_reference(rmsnorm_kernel, case):
    gen = torch.Generator(device="cuda").manual_seed(case["seed"])
    dtype, shape = case["dtype"], case["shape"]
    x = (torch.randn(shape, generator=gen, device="cuda") * case["magnitude"]).to(dtype)
    weight = torch.randn(shape[-1], generator=gen, device="cuda").to(dtype) if case["has_weight"] else None
    poison_allocator(x.numel(), dtype)
    out = rmsnorm_kernel.rmsnorm(x, weight, case["eps"], convention=case["convention"])
    assert_matches(out, x, weight, case["eps"], case["convention"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 3, 8, 100, 128, 4096, 5120, 65536, 100_000, 262_144])
def test_edge_hidden_sizes(rmsnorm_kernel, dtype, hidden):
    """Every planner bucket, the shared-memory row and the re-read path beyond it."""
    x = torch.randn(3, hidden, device="cuda").to(dtype)
    weight = torch.randn(hidden, device="cuda").to(dtype)
    for convention in ("single_rounding", "transformers"):
        poison_allocator(x.numel(), dtype)
        assert_matches(rmsnorm_kernel.rmsnorm(x, weight, 1e-6, convention=convention), x, weight, 1e-6, convention)


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_and_misaligned_views(rmsnorm_kernel, dtype):
    base = torch.randn(64, 4096 + 8, device="cuda").to(dtype)
    weight = torch.randn(4096, device="cuda").to(dtype)
    row_strided = base[:, :4096]                      # row stride 4104: no copy, vector path
    misaligned = base.view(-1)[1:1 + 64 * 4096].view(64, 4096)  # 2- or 4-byte offset: scalar path
    transposed = torch.randn(4096, 64, device="cuda").to(dtype).t()  # last-dim stride 64: copied
    for x in (row_strided, misaligned, transposed):
        assert_matches(rmsnorm_kernel.rmsnorm(x, weight, 1e-6), x, weight, 1e-6, "single_rounding")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bitwise_agreement_with_libraries(rmsnorm_kernel, dtype, record_property):
    """How close to bitwise equal: transformers' LlamaRMSNorm order and torch's F.rms_norm."""
    x = torch.randn(4096, 4096, device="cuda").to(dtype)
    weight = torch.randn(4096, device="cuda").to(dtype)
    xf = x.float()
    hf = weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    ours_hf = rmsnorm_kernel.rmsnorm(x, weight, 1e-6, convention="transformers")
    torch_fused = torch.nn.functional.rms_norm(x, (4096,), weight, 1e-6)
    ours_single = rmsnorm_kernel.rmsnorm(x, weight, 1e-6)
    equal_hf = (ours_hf == hf).double().mean().item()
    equal_torch = (ours_single == torch_fused).double().mean().item()
    max_ulps_hf = ((ours_hf.float() - hf.float()).abs() / (hf.float().abs() * 2.0 ** -MANTISSA_BITS[dtype]).clamp_min(1e-30)).max().item()
    record_property("bitwise_equal_transformers", equal_hf)
    record_property("bitwise_equal_f_rms_norm", equal_torch)
    print(f"{dtype}: bitwise equal to transformers {equal_hf:.6f} (max {max_ulps_hf:.1f} ulp), "
          f"to F.rms_norm {equal_torch:.6f}")
    assert equal_hf > 0.99 and equal_torch > 0.98


def test_errors_name_the_argument(rmsnorm_kernel):
    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    cases = [
        (lambda: rmsnorm_kernel.rmsnorm(x.cpu()), ValueError, "x must be a CUDA tensor"),
        (lambda: rmsnorm_kernel.rmsnorm(x, torch.ones(64, device="cuda")), TypeError, "weight has dtype"),
        (lambda: rmsnorm_kernel.rmsnorm(x, torch.ones(63, device="cuda", dtype=x.dtype)), ValueError, "weight must have shape [64]"),
        (lambda: rmsnorm_kernel.rmsnorm(x, None, 0.0), ValueError, "eps must be a finite number > 0"),
        (lambda: rmsnorm_kernel.rmsnorm(x.double()), TypeError, "x has dtype Double"),
        (lambda: rmsnorm_kernel.rmsnorm(x, convention="fast"), ValueError, "convention must be one of"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
            call()


def test_empty_input(rmsnorm_kernel):
    x = torch.randn(0, 4096, device="cuda", dtype=torch.float16)
    assert rmsnorm_kernel.rmsnorm(x).shape == (0, 4096)


@pytest.mark.parametrize("op_name", ["rmsnorm", "rmsnorm_transformers"])
def test_opcheck(rmsnorm_kernel, op_name):
    op = getattr(rmsnorm_kernel._ops.ops, op_name)
    for dtype in DTYPES:
        x = torch.randn(5, 7, 256, device="cuda").to(dtype)
        w = torch.randn(256, device="cuda").to(dtype)
        torch.library.opcheck(op, (x, w, 1e-6))
        torch.library.opcheck(op, (x, None, 1e-5))


def test_torch_compile_fullgraph(rmsnorm_kernel):
    torch._dynamo.reset()

    def block(x, w):
        return rmsnorm_kernel.rmsnorm(x * 2, w, 1e-6, convention="transformers") + 1

    compiled = torch.compile(block, fullgraph=True)
    x = torch.randn(8, 1024, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(compiled(x, w), block(x, w), rtol=0, atol=0)
    explanation = torch._dynamo.explain(block)(x, w)
    assert explanation.graph_break_count == 0


def test_kernelize_replaces_transformers_rmsnorm(built):
    transformers = pytest.importorskip("transformers")
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_mapping
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    project, kernel = built("rmsnorm")
    norm = LlamaRMSNorm(4096, eps=1e-6).cuda().to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(2, 128, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        expected = norm(x)
    mapping = {"RMSNorm": {"cuda": LocalLayerRepository(repo_path=project, layer_name="RMSNorm")}}
    model = torch.nn.Sequential(norm)
    with use_kernel_mapping(mapping):
        kernelize(model, mode=Mode.INFERENCE, device="cuda")
    with torch.no_grad():
        got = model(x)
    direct = kernel.rmsnorm(x, norm.weight, 1e-6, convention="transformers")
    torch.testing.assert_close(got, direct, rtol=0, atol=0)  # the layer is the kernel
    assert (got == expected).double().mean().item() > 0.99  # and matches transformers bit for bit, almost

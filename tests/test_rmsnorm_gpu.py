"""rmsnorm on the GPU, beyond what test_ops_gpu.py checks for every op: bitwise agreement with
transformers and F.rms_norm, argument errors, and `kernels.kernelize` into a transformers model."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}


@pytest.fixture(scope="module")
def rmsnorm_kernel(built):
    return built("rmsnorm")[1]


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
    max_ulps_hf = (
        (
            (ours_hf.float() - hf.float()).abs()
            / (hf.float().abs() * 2.0 ** -MANTISSA_BITS[dtype]).clamp_min(1e-30)
        )
        .max()
        .item()
    )
    record_property("bitwise_equal_transformers", equal_hf)
    record_property("bitwise_equal_f_rms_norm", equal_torch)
    print(
        f"{dtype}: bitwise equal to transformers {equal_hf:.6f} (max {max_ulps_hf:.1f} ulp), "
        f"to F.rms_norm {equal_torch:.6f}"
    )
    assert equal_hf > 0.99 and equal_torch > 0.98


def test_errors_name_the_argument(rmsnorm_kernel):
    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    cases = [
        (lambda: rmsnorm_kernel.rmsnorm(x.cpu()), ValueError, "x must be a CUDA tensor"),
        (lambda: rmsnorm_kernel.rmsnorm(x, torch.ones(64, device="cuda")), TypeError, "weight has dtype"),
        (
            lambda: rmsnorm_kernel.rmsnorm(x, torch.ones(63, device="cuda", dtype=x.dtype)),
            ValueError,
            "weight must have shape [64]",
        ),
        (lambda: rmsnorm_kernel.rmsnorm(x, None, 0.0), ValueError, "eps must be a finite number > 0"),
        (lambda: rmsnorm_kernel.rmsnorm(x.double()), TypeError, "x has dtype Double"),
        (lambda: rmsnorm_kernel.rmsnorm(x, convention="fast"), ValueError, "convention must be one of"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
            call()


def test_kernelize_replaces_transformers_rmsnorm(built, record_property):
    pytest.importorskip("transformers")
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    # transformers hooks LlamaRMSNorm up to `kernels` only when it accepts the installed kernels
    # version; the hook is added here with kernels' own decorator, so the test checks kgen's layer
    # against transformers' module either way.
    record_property("transformers_class_hooked", hasattr(LlamaRMSNorm, "kernel_layer_name"))

    @use_kernel_forward_from_hub("RMSNorm")
    class HookedLlamaRMSNorm(LlamaRMSNorm):
        pass

    project, kernel = built("rmsnorm")
    norm = HookedLlamaRMSNorm(4096, eps=1e-6).cuda().to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(2, 128, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        expected = norm(x)
    mapping = {"RMSNorm": {"cuda": LocalLayerRepository(repo_path=project, layer_name="RMSNorm")}}
    model = torch.nn.Sequential(norm)
    with use_kernel_mapping(mapping):
        kernelize(model, mode=Mode.INFERENCE, device="cuda")
    served_by = getattr(norm.forward, "__func__", norm.forward).__module__
    assert served_by.endswith(".layers"), f"kernelize kept the forward from {served_by}, not kgen's layer"
    with torch.no_grad():
        got = model(x)
    direct = kernel.rmsnorm(x, norm.weight, 1e-6, convention="transformers")
    torch.testing.assert_close(got, direct, rtol=0, atol=0)  # the layer is the kernel
    assert (got == expected).double().mean().item() > 0.99  # and matches transformers bit for bit, almost

"""kgen's kernels in diffusers' LTX-Video transformer (kgen.integrations.diffusers).

Without a GPU the real libraries are built and loaded and each op gets a CPU kernel computed by its spec's
reference (tests/conftest.py): the structure checks, the dataflow of the patched blocks and attentions, the
arguments each op gets (the latent grid for the rotary angles included), the outputs and torch.compile
tracing. On a GPU the same tests run the real kernels with the LTX-Video 2B config (two blocks) at B = 2,
7×16×24 latents."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from kgen.errors import KgenError  # noqa: E402
from kgen.integrations.diffusers import OPS, patch  # noqa: E402

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
LTX_2B = {}  # the class defaults are LTX-Video 2B's: 32 heads × 64, cross-attention 2048, captions 4096
SMALL = dict(
    in_channels=16,
    out_channels=16,
    num_attention_heads=2,
    attention_head_dim=32,
    cross_attention_dim=64,
    caption_channels=32,
)  # inner dim 64: 64 % 6 = 4 channels of rotary padding, as 2048 has 2
GRID = (7, 16, 24) if GPU else (2, 3, 4)
SCALE = (8 / 25, 32.0, 32.0)  # rope_interpolation_scale at 25 fps with the VAE's 8× and 32× compression
pytestmark = pytest.mark.gpu if GPU else pytest.mark.toolchain


@pytest.fixture(scope="module")
def served_ops(reference_kernels):
    return (None, Counter()) if GPU else ("sm_90", reference_kernels(OPS))


def model_of(config: dict, layers: int = 2):
    torch.manual_seed(0)
    with torch.device(DEVICE):
        return diffusers.LTXVideoTransformer3DModel(**config, num_layers=layers).eval()


def inputs_of(model, grid=GRID, batch=2, text=16):
    frames, height, width = grid
    config = model.config
    generator = torch.Generator(DEVICE).manual_seed(1)
    mask = torch.ones(batch, text, device=DEVICE)
    mask[1, text // 2 :] = 0  # a shorter caption in the second sample
    return dict(
        hidden_states=torch.randn(
            batch, frames * height * width, config.in_channels, device=DEVICE, generator=generator
        ),
        encoder_hidden_states=torch.randn(
            batch, text, config.caption_channels, device=DEVICE, generator=generator
        ),
        timestep=torch.tensor([500, 20], device=DEVICE),
        encoder_attention_mask=mask,
        num_frames=frames,
        height=height,
        width=width,
        rope_interpolation_scale=SCALE,
    )


def cast(inputs, dtype=torch.bfloat16):
    return {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}


def output(model, inputs, dtype):
    with torch.no_grad():
        return model.to(dtype)(**cast(inputs, dtype), return_dict=False)[0].double()


def check_output_matches(config, served_ops, root, **overrides):
    """The patched model's bf16 output is as close to the fp32 model's as diffusers' own bf16 output is."""
    arch, calls = served_ops
    model = model_of(config)
    inputs = {**inputs_of(model), **overrides}
    truth, eager = output(model, inputs, torch.float32), output(model, inputs, torch.bfloat16)
    assert patch(model, arch=arch, root=root) == {"blocks": 2, "attentions": 4, "gelu_tanh": 2, "norm_out": 1}
    before = calls.copy()
    kgen = output(model, inputs, torch.bfloat16)
    if not GPU:
        # self-attention's q/k norms and rotation in one launch; with video_coords, rmsnorm then the rotation
        coords = inputs.get("video_coords") is not None
        rope = {"rope3d_coords": 4, "rmsnorm": 8} if coords else {"qk_norm_rope3d": 2, "rmsnorm": 4}
        ran = {name: calls[name] - before[name] for name in calls if calls[name] > before[name]}
        # norm1 of block 0; norm2 of each block and norm1 of block 1 with the residual before; norm_out with
        # the last
        assert ran == {
            "adaln_rmsnorm_diffusers": 1,
            "residual_adaln_rmsnorm_diffusers": 3,
            "residual_adaln_layernorm_diffusers": 1,
            "gelu_tanh": 2,
            **rope,
        }
    eager_err, kgen_err = (eager - truth).abs().max().item(), (kgen - truth).abs().max().item()
    assert torch.isfinite(kgen).all()
    assert kgen_err <= 1.5 * eager_err + 1e-3, f"kgen {kgen_err:.4g} vs diffusers {eager_err:.4g} from fp32"
    return model, inputs


def test_ltx_video_output_matches(served_ops, build_root):
    check_output_matches(LTX_2B if GPU else SMALL, served_ops, build_root)


def test_training_mode_gradients_of_every_parameter_flow(served_ops, build_root):
    """A patched model trains: every op runs with its derived backward (the blocks' AdaLN norms and fused
    residual adds too, their per-batch modulation's gradients summed per batch); one training step's bf16
    gradients of every parameter are as close to the fp32 model's as diffusers' own bf16 gradients are."""
    import copy

    arch, calls = served_ops
    model = model_of(LTX_2B if GPU else SMALL).train()
    inputs = inputs_of(model)
    target = torch.randn(*inputs["hidden_states"].shape[:2], model.config.out_channels, device=DEVICE)

    def grads(m, dtype):
        out = m.to(dtype)(**cast(inputs, dtype), return_dict=False)[0]
        torch.nn.functional.mse_loss(out.float(), target).backward()
        return {n: p.grad.double() for n, p in m.named_parameters() if p.grad is not None}

    truth = grads(copy.deepcopy(model), torch.float32)
    eager = grads(copy.deepcopy(model), torch.bfloat16)
    kgen = copy.deepcopy(model)
    served = patch(kgen, arch=arch, root=build_root)
    assert served == {"blocks": 2, "attentions": 4, "gelu_tanh": 2, "norm_out": 1}
    before = calls.copy()
    got = grads(kgen, torch.bfloat16)
    if not GPU:  # each op and its derived backward ran
        ran = {name: calls[name] - before[name] for name in calls if calls[name] > before[name]}
        assert ran == {
            "adaln_rmsnorm_diffusers": 1,
            "adaln_rmsnorm_backward_diffusers": 1,
            "residual_adaln_rmsnorm_diffusers": 3,
            "residual_adaln_rmsnorm_backward_diffusers": 3,
            "residual_adaln_layernorm_diffusers": 1,
            "residual_adaln_layernorm_backward_diffusers": 1,
            "rmsnorm": 4,
            "rmsnorm_backward": 4,
            "qk_norm_rope3d": 2,
            "qk_norm_rope3d_backward": 2,
            "gelu_tanh": 2,
            "gelu_tanh_backward": 2,
        }
    assert got.keys() == truth.keys() == dict(model.named_parameters()).keys()
    # Each parameter's gradient as a whole (relative L2 error from fp32) as close as diffusers' own bf16, and
    # no element far off: the largest error within 4× diffusers' largest. A gradient summed over 2 × 2688 rows
    # (the AdaLN tables') carries every block's bf16 error; its worst element is a few bf16 steps either way,
    # and kgen's derived backwards round other steps than ATen's.
    for name, want in truth.items():
        assert torch.isfinite(got[name]).all(), name
        eager_rel, kgen_rel = (
            (g - want).norm().item() / want.norm().item() for g in (eager[name], got[name])
        )
        eager_err, kgen_err = (eager[name] - want).abs().max().item(), (got[name] - want).abs().max().item()
        assert (
            kgen_rel <= 1.5 * eager_rel + 1e-3 and kgen_err <= 4 * eager_err + 1e-3 * want.abs().max().item()
        ), (
            f"{name}: kgen {kgen_rel:.4g} (worst element {kgen_err:.4g}) vs diffusers {eager_rel:.4g} "
            f"({eager_err:.4g}) from fp32"
        )


def test_ltx_video_with_video_coords(served_ops, build_root):
    frames, height, width = GRID
    grid = torch.stack(
        torch.meshgrid(*(torch.arange(n, device=DEVICE, dtype=torch.float32) for n in GRID), indexing="ij")
    ).flatten(1)
    coords = (
        (grid * torch.tensor([8 / 25 * 8, 32.0, 32.0], device=DEVICE)[:, None]).expand(2, 3, -1).contiguous()
    )
    check_output_matches(LTX_2B if GPU else SMALL, served_ops, build_root, video_coords=coords)


def test_ltx_video_without_interpolation_scale(served_ops, build_root):
    check_output_matches(SMALL, served_ops, build_root, rope_interpolation_scale=None)


def test_a_model_it_does_not_know_is_refused(served_ops, build_root):
    with pytest.raises(
        KgenError,
        match="LTXVideoTransformer3DModel, FluxTransformer2DModel and WanTransformer3DModel, not Linear",
    ):
        patch(torch.nn.Linear(2, 2), arch=served_ops[0], root=build_root)
    model = model_of(SMALL)
    model.transformer_blocks[1].norm2 = torch.nn.LayerNorm(64)
    with pytest.raises(KgenError, match=r"transformer_blocks\.1\.norm2: a LayerNorm, not a RMSNorm"):
        patch(model, arch=served_ops[0], root=build_root)
    assert "forward" not in vars(model.transformer_blocks[0])  # checked before anything changed


def test_refused_after_cpu_offload_hooks(served_ops, build_root):
    accelerate = pytest.importorskip("accelerate")
    model = model_of(SMALL)
    accelerate.cpu_offload_with_hook(model, execution_device=DEVICE)
    with pytest.raises(KgenError, match="patch it before enable_model_cpu_offload"):
        patch(model, arch=served_ops[0], root=build_root)


def test_compiles_whole_with_no_graph_breaks(served_ops, build_root):
    model, inputs = check_output_matches(SMALL, served_ops, build_root)
    bf16 = cast(inputs)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(**bf16, return_dict=False)
    assert explained.graph_break_count == 0, explained.break_reasons
    code = "".join(g.code for g in explained.graphs)
    for op in (
        "adaln_rmsnorm_diffusers",
        "residual_adaln_rmsnorm_diffusers",
        "residual_adaln_layernorm_diffusers",
        "qk_norm_rope3d",
        "gelu_tanh",
    ):
        assert op in code
    eager = output(model, inputs, torch.bfloat16)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True)(**bf16, return_dict=False)[0].double()
    assert (compiled - eager).abs().max().item() <= 0.05 * eager.abs().max().item()


def test_a_compiled_training_step_leaves_the_blocks_norms_to_inductor(served_ops, build_root):
    """Traced with autograd on, the blocks are diffusers' own (norms, modulation, residual adds: Inductor
    fuses them with the gradient adds around them) and norm_out too; the attentions' q/k norms with the
    rotation and the GELU stay kgen's; no graph break; the compiled step's loss and gradients are the eager
    patched model's."""
    model, inputs = check_output_matches(SMALL, served_ops, build_root)
    model.train()
    bf16 = cast(inputs)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(**bf16, return_dict=False)
    assert explained.graph_break_count == 0, explained.break_reasons
    code = "".join(g.code for g in explained.graphs)
    assert "qk_norm_rope3d" in code and "gelu_tanh" in code and "rmsnorm" in code
    assert "adaln" not in code, "a block's AdaLN norm traced as kgen's op"

    def step(m):  # the model's own parameters: a compiled module's names carry a prefix
        model.zero_grad(set_to_none=True)
        loss = m(**bf16, return_dict=False)[0].float().square().mean()
        loss.backward()
        return loss.detach(), {n: p.grad.double() for n, p in model.named_parameters()}

    eager_loss, eager_grads = step(model)
    torch._dynamo.reset()
    loss, grads = step(torch.compile(model, fullgraph=True))
    assert abs(loss.item() - eager_loss.item()) <= 0.02 * abs(eager_loss.item())
    for name, want in eager_grads.items():
        assert torch.isfinite(grads[name]).all(), name
        assert (grads[name] - want).norm().item() <= 0.1 * want.norm().item() + 1e-6, name


@pytest.mark.skipif(not GPU, reason="CUDA graphs need a CUDA device")
def test_reduce_overhead_captures_and_replays(served_ops, build_root):
    from torch._dynamo.utils import counters

    model, inputs = check_output_matches(SMALL, served_ops, build_root)
    bf16 = cast(inputs)
    eager = output(model, inputs, torch.bfloat16)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        outs = [compiled(**bf16, return_dict=False)[0].double().clone() for _ in range(4)]
    assert counters["inductor"]["cudagraph_skips"] == 0
    for out in outs:
        assert (out - eager).abs().max().item() <= 0.05 * eager.abs().max().item()

"""kgen's kernels in diffusers' Wan 2.x transformer (kgen.integrations.wan, through
kgen.integrations.diffusers.patch).

Without a GPU the real libraries are built and loaded and each op gets a CPU kernel computed by its spec's
reference (tests/conftest.py): the patched dataflow, the ops each forward runs, the outputs (a timestep per
batch and per token), training (with gradient checkpointing too) and torch.compile tracing, on a tiny model
(2 heads × 12: the rotary split 4 / 4 / 4), B = 2, 2×4×4 latents and 5 text tokens. On a GPU the same tests
run the real kernels with Wan 2.1 1.3B's widths (12 heads × 128, ffn 8960, text 4096), two blocks, B = 2,
3×16×16 latents (192 tokens) and 64 text tokens. The refusals need no kernels: the check comes first."""

from __future__ import annotations

import copy
import functools
from collections import Counter

import pytest
import torch
from conftest import assert_grads_close
from torch.nn.attention import SDPBackend, sdpa_kernel

diffusers = pytest.importorskip("diffusers")

from diffusers.models.normalization import FP32LayerNorm  # noqa: E402

from kgen.errors import KgenError  # noqa: E402
from kgen.integrations.diffusers import patch  # noqa: E402
from kgen.integrations.wan import OPS, cast_as_from_pretrained  # noqa: E402

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
WAN_1_3B = dict(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, text_dim=4096, freq_dim=256)
SMALL = dict(
    num_attention_heads=2,
    attention_head_dim=16,  # a head size the fused q/k norm and rotation serves
    in_channels=4,
    out_channels=4,
    text_dim=16,
    freq_dim=16,
    ffn_dim=32,
)
LATENTS, TEXT = ((3, 16, 16), 64) if GPU else ((2, 4, 4), 5)
SERVED = {"blocks": 2, "attentions": 4, "qk_norms": 8, "gelu_tanh": 2, "norm_out": 1}
pytestmark = pytest.mark.gpu if GPU else pytest.mark.toolchain
# torch 2.11's cuDNN attention backward fails on the H200 (see tests/test_flux_integration.py): the training
# steps use the other backends
NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# per forward, with or without gradients: norm1 of block 0; norm3 of each block, norm1 of block 1 and norm_out
# with the residual add before; norm2 with self-attention's gated residual add; the cross-attentions' q and k
# norms; the feed-forward's GELU; self-attention's q/k norms and rotation in one launch
TRAINING = {
    "adaln_layernorm_fp32": 1,
    "residual_adaln_layernorm_fp32": 4,
    "residual_layernorm_fp32": 2,
    "rmsnorm": 4,
    "gelu_tanh": 2,
    "qk_norm_rope_wan": 2,
}
BACKWARD = {f"{name}_backward": n for name, n in TRAINING.items()}
FORWARD = TRAINING


@pytest.fixture(scope="module")
def served_ops(reference_kernels):
    return (None, Counter()) if GPU else ("sm_90", reference_kernels(OPS))


def model_of(config: dict = SMALL, **overrides):
    """A float32 model of two blocks, patch (1, 2, 2)."""
    torch.manual_seed(0)
    with torch.device(DEVICE):
        return diffusers.WanTransformer3DModel(**config, num_layers=2, **overrides).eval()


def bf16(model):
    """A copy in bf16 with Wan's float32 modules, as from_pretrained(torch_dtype=torch.bfloat16) loads it."""
    return cast_as_from_pretrained(copy.deepcopy(model), torch.bfloat16)


def inputs_of(model, per_token: bool = False, batch: int = 2) -> dict:
    """Latents [B, C, F, H, W], text, and a timestep per batch or (Wan 2.2 TI2V) per token."""
    config, generator = model.config, torch.Generator(DEVICE).manual_seed(1)
    frames, height, width = LATENTS
    tokens = frames * (height // 2) * (width // 2)
    timestep = torch.tensor([900.0, 200.0], device=DEVICE)
    if per_token:  # the first frame's tokens clean (timestep 0), as TI2V conditions on an image
        timestep = timestep[:, None].repeat(1, tokens)
        timestep[:, : tokens // frames] = 0.0
    return dict(
        hidden_states=torch.randn(batch, config.in_channels, *LATENTS, device=DEVICE, generator=generator),
        timestep=timestep,
        encoder_hidden_states=torch.randn(batch, TEXT, config.text_dim, device=DEVICE, generator=generator),
    )


def cast(inputs, dtype=torch.bfloat16):
    return {k: v.to(dtype) if k != "timestep" else v for k, v in inputs.items()}


def output(model, inputs, dtype=torch.bfloat16):
    with torch.no_grad():
        return model(**cast(inputs, dtype), return_dict=False)[0].double()


def ran_since(calls, before) -> dict:
    return {name: calls[name] - before[name] for name in calls if calls[name] > before[name]}


def check_output_matches(served_ops, root, config=WAN_1_3B if GPU else SMALL, per_token=False):
    """The patched model's bf16 output is as close to the fp32 model's as diffusers' own bf16 output is."""
    arch, calls = served_ops
    model = model_of(config)
    inputs = inputs_of(model, per_token)
    truth, eager = output(model, inputs, torch.float32), output(bf16(model), inputs)
    kgen = bf16(model)
    assert patch(kgen, arch=arch, root=root) == SERVED
    before = calls.copy()
    got = output(kgen, inputs)
    if not GPU:
        assert ran_since(calls, before) == FORWARD
    eager_err, kgen_err = (eager - truth).abs().max().item(), (got - truth).abs().max().item()
    assert torch.isfinite(got).all()
    assert kgen_err <= 1.5 * eager_err + 1e-3, f"kgen {kgen_err:.4g} vs diffusers {eager_err:.4g} from fp32"
    return kgen, inputs


def test_wan_output_matches(served_ops, build_root):
    check_output_matches(served_ops, build_root)


def test_wan_output_matches_with_a_timestep_per_token(served_ops, build_root):
    """Wan 2.2 TI2V's form: timestep [B, S], the modulation per token ([B, S, 6, C]) in every block and
    norm_out."""
    check_output_matches(served_ops, build_root, per_token=True)


def test_wan_returns_what_diffusers_returns(served_ops, build_root):
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    model, inputs = check_output_matches(served_ops, build_root, config=SMALL)
    with torch.no_grad():
        out = model(**cast(inputs))
        plain = model(**cast(inputs), return_dict=False)
    assert isinstance(out, Transformer2DModelOutput) and isinstance(plain, tuple) and len(plain) == 1
    assert out.sample.shape == inputs["hidden_states"].shape[:1] + (4, *LATENTS)
    assert torch.equal(out.sample, plain[0])


def grads_of(model, inputs, target):
    with sdpa_kernel(NO_CUDNN):
        out = model(**cast(inputs, next(model.proj_out.parameters()).dtype), return_dict=False)[0]
        torch.nn.functional.mse_loss(out.float(), target).backward()
    return {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}


def test_wan_trains_every_parameter_gets_its_gradient(served_ops, build_root):
    """One training step of a patched model: every op with its derived backward (the per-batch modulation's
    gradients summed per batch); each parameter's bf16 gradient as close to the fp32 model's as diffusers'
    own bf16 gradient (relative L2 error, and the worst element within 4× diffusers' worst)."""
    arch, calls = served_ops
    model = model_of(WAN_1_3B if GPU else SMALL).train()
    inputs = inputs_of(model)
    target = torch.randn(inputs["hidden_states"].shape, device=DEVICE)
    truth = grads_of(copy.deepcopy(model), inputs, target)
    eager = grads_of(bf16(model), inputs, target)
    kgen = bf16(model)
    assert patch(kgen, arch=arch, root=build_root) == SERVED
    before = calls.copy()
    got = grads_of(kgen, inputs, target)
    if not GPU:  # each op and its derived backward ran
        assert ran_since(calls, before) == TRAINING | BACKWARD
    assert got.keys() == truth.keys() == dict(model.named_parameters()).keys()
    assert_grads_close(got, eager, truth)


@pytest.mark.parametrize("reentrant", [False, True])
def test_wan_trains_with_gradient_checkpointing(served_ops, build_root, reentrant):
    """diffusers' checkpointing (non-reentrant, its default) and a reentrant one: each block runs on plain
    tensors, its ops once more in the backward, and the gradients are the ones without checkpointing."""
    arch, calls = served_ops
    model = model_of(SMALL).train()
    inputs = inputs_of(model)
    target = torch.randn(inputs["hidden_states"].shape, device=DEVICE)
    plain = bf16(model)
    patch(plain, arch=arch, root=build_root)
    want = grads_of(plain, inputs, target)
    kgen = bf16(model)
    patch(kgen, arch=arch, root=build_root)
    if reentrant:
        checkpoint = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=True)
        kgen.enable_gradient_checkpointing(checkpoint)
    else:
        kgen.enable_gradient_checkpointing()
    before = calls.copy()
    got = grads_of(kgen, inputs, target)
    if not GPU:  # the blocks' ops ran twice (forward, then again in the backward), norm_out's once
        again = {
            "adaln_layernorm_fp32": 2,
            "residual_adaln_layernorm_fp32": 7,
            "residual_layernorm_fp32": 4,
            "rmsnorm": 8,
            "gelu_tanh": 4,
            "qk_norm_rope_wan": 4,
        }
        assert ran_since(calls, before) == again | BACKWARD
    assert got.keys() == want.keys() == dict(model.named_parameters()).keys()
    # the same on a CPU, but a reentrant checkpoint hands each block's bf16 gradient of the text (which every
    # block reads) back on its own, summed in another order, and on a GPU the attention's backward may sum in
    # another order too
    tolerance = 2e-2 if GPU or reentrant else 0.0
    for name, g in got.items():
        assert (g - want[name]).norm().item() <= tolerance * want[name].norm().item(), name


def test_wan_compiles_whole_with_no_graph_breaks(served_ops, build_root):
    model, inputs = check_output_matches(served_ops, build_root, config=SMALL)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(**cast(inputs), return_dict=False)
    assert explained.graph_break_count == 0, explained.break_reasons
    code = "".join(g.code for g in explained.graphs)
    for op in FORWARD:
        assert op in code
    eager = output(model, inputs)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True)(**cast(inputs), return_dict=False)[0].double()
    assert (compiled - eager).abs().max().item() <= 0.05 * eager.abs().max().item()


def test_cast_as_from_pretrained_keeps_what_from_pretrained_keeps(tmp_path):
    """Every parameter and buffer in from_pretrained(torch_dtype=torch.bfloat16)'s dtype, with its values."""
    model = diffusers.WanTransformer3DModel(**SMALL, num_layers=2)
    model.save_pretrained(tmp_path)
    loaded = diffusers.WanTransformer3DModel.from_pretrained(tmp_path, torch_dtype=torch.bfloat16)
    model = cast_as_from_pretrained(model, torch.bfloat16)
    mine = dict(model.named_parameters()) | dict(model.named_buffers())
    theirs = dict(loaded.named_parameters()) | dict(loaded.named_buffers())
    assert mine.keys() == theirs.keys()
    kept = {name for name, t in theirs.items() if t.dtype == torch.float32}
    assert any(".norm2." in n for n in kept) and "scale_shift_table" in kept and "rope.freqs_cos" in kept
    for name, tensor in mine.items():
        assert tensor.dtype == theirs[name].dtype, name
        assert torch.equal(tensor, theirs[name]), name


# each refusal: what changes in a tiny model, and the message (the check runs before anything is built)
REFUSALS = {
    "hooks": (None, "patch it before enable_model_cpu_offload"),
    "cross_attn_norm": (
        dict(cross_attn_norm=False),
        r"blocks\.0\.norm2: a torch\.nn\.Identity \(cross_attn_norm=False\), not a FP32LayerNorm",
    ),
    "image_conditioned": (
        dict(added_kv_proj_dim=16, image_dim=16),
        r"blocks\.0\.attn2: image-conditioned attention \(add_k_proj: Wan I2V\), which kgen's patch does not",
    ),
    "norm1_affine": (
        lambda m: setattr(m.blocks[1], "norm1", FP32LayerNorm(24, 1e-6, elementwise_affine=True)),
        r"blocks\.1\.norm1: an FP32LayerNorm with affine, which kgen's adaln ops do not apply",
    ),
    "norm3_class": (
        lambda m: setattr(m.blocks[0], "norm3", torch.nn.LayerNorm(24, elementwise_affine=False)),
        r"blocks\.0\.norm3: a torch\.nn\.LayerNorm, not a FP32LayerNorm",
    ),
    "qk_norm_class": (
        lambda m: setattr(m.blocks[1].attn2, "norm_k", diffusers.models.normalization.RMSNorm(24, 1e-6)),
        r"blocks\.1\.attn2\.norm_k: a RMSNorm, not a torch\.nn\.RMSNorm",
    ),
    "processor": (
        lambda m: m.blocks[0].attn1.set_processor(diffusers.models.attention_processor.AttnProcessor2_0()),
        r"blocks\.0\.attn1\.processor: a AttnProcessor2_0, not a WanAttnProcessor",
    ),
    "gelu": (
        lambda m: setattr(m.blocks[1].ffn.net[0], "approximate", "none"),
        r"blocks\.1\.ffn\.net\.0: GELU\(approximate='none'\), not 'tanh'",
    ),
    "rope": (
        lambda m: setattr(m, "rope", torch.nn.Identity()),
        r"WanTransformer3DModel\.rope: a torch\.nn\.Identity, not a WanRotaryPosEmbed",
    ),
    "norm_out_class": (
        lambda m: setattr(m, "norm_out", torch.nn.LayerNorm(24, elementwise_affine=False)),
        r"WanTransformer3DModel\.norm_out: a torch\.nn\.LayerNorm, not a FP32LayerNorm",
    ),
    "norm_out_affine": (
        lambda m: setattr(m, "norm_out", FP32LayerNorm(24, 1e-6, elementwise_affine=True)),
        r"WanTransformer3DModel\.norm_out: an FP32LayerNorm with affine",
    ),
}


@pytest.mark.parametrize("refusal", REFUSALS)
def test_a_wan_model_it_does_not_serve_is_refused_and_left_unchanged(refusal, build_root):
    change, message = REFUSALS[refusal]
    model = model_of(SMALL, **change) if isinstance(change, dict) else model_of(SMALL)
    if callable(change):
        change(model)
    if refusal == "hooks":
        accelerate = pytest.importorskip("accelerate")
        accelerate.cpu_offload_with_hook(model, execution_device=DEVICE)

    def state():  # the forwards set on instances (the hooks' own included) and the attention processors
        return [(vars(m).get("forward"), getattr(m, "processor", None)) for m in model.modules()]

    before = state()
    with pytest.raises(KgenError, match=message):
        patch(model, arch="sm_90", root=build_root)
    assert state() == before  # checked before anything changed

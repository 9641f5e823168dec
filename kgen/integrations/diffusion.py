"""The diffusion transformers `kgen bench --e2e` times (ltx, ltx-train, flux, wan, wan-train: described in
kgen.integrations.workloads), each builder returning the untimed models ({variant: model}, the kgen one a
deep copy of the eager one, patched) and the workloads ({name: fn(model)}). Random weights, bf16."""

from __future__ import annotations

import copy

from .diffusers import patch
from .wan import cast_as_from_pretrained

WAN = {  # Wan 2.1's text-to-video transformers (in and out 16 channels, patch (1, 2, 2): the defaults)
    "Wan 2.1 1.3B": dict(
        num_attention_heads=12,
        attention_head_dim=128,
        ffn_dim=8960,
        text_dim=4096,
        freq_dim=256,
        num_layers=30,
    ),
    "Wan 2.1 14B, 2 blocks": dict(
        num_attention_heads=40,
        attention_head_dim=128,
        ffn_dim=13824,
        text_dim=4096,
        freq_dim=256,
        num_layers=2,
    ),
}


def ltx(torch, device, config, patch_kwargs, steps, log):  # steps: the decode budget, for qwen3
    from diffusers import LTXVideoTransformer3DModel

    with torch.device(device):
        model = LTXVideoTransformer3DModel(**(config or {})).to(torch.bfloat16).eval()
    kgen = copy.deepcopy(model)
    patch(kgen, **patch_kwargs)
    workloads = {}
    for grid in [(7, 16, 24), (21, 16, 24)] if not config else [(2, 3, 4)]:
        inputs = _ltx_inputs(torch, device, model, grid)
        name = f"LTX-Video forward, B=2, S={grid[0] * grid[1] * grid[2]} ({'×'.join(map(str, grid))})"
        workloads[name] = lambda m, inputs=inputs: m(**inputs)
    return {"eager": model, "eager + kgen": kgen}, workloads


def ltx_train(torch, device, config, patch_kwargs, steps, log):
    from diffusers import LTXVideoTransformer3DModel

    with torch.device(device):
        model = LTXVideoTransformer3DModel(**(config or {"num_layers": 4})).to(torch.bfloat16).train()
    kgen = copy.deepcopy(model)
    patch(kgen, **patch_kwargs)
    grid = (7, 16, 24) if not config else (2, 3, 4)
    inputs = _ltx_inputs(torch, device, model, grid)
    target = torch.randn(*inputs["hidden_states"].shape[:2], model.config.out_channels, device=device)

    def step(m):
        m.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(m(**inputs)[0].float(), target).backward()

    tokens, blocks = grid[0] * grid[1] * grid[2], model.config.num_layers
    name = f"LTX-Video training step, {blocks} blocks, B=2, S={tokens} ({'×'.join(map(str, grid))})"
    return {"eager": model, "eager + kgen": kgen}, {name: step}


def flux(torch, device, config, patch_kwargs, steps, log):
    from diffusers import FluxTransformer2DModel

    with torch.device(device):
        model = FluxTransformer2DModel(**(config or {"guidance_embeds": True})).to(torch.bfloat16).eval()
    kgen = copy.deepcopy(model)
    patch(kgen, **patch_kwargs)
    side, text = (64, 512) if not config else (3, 5)
    cfg, tokens = model.config, side * side
    image_ids = torch.zeros(tokens, 3, device=device)  # (0, row, column) per image token, as Flux pipelines
    position = torch.arange(tokens, device=device)
    image_ids[:, 1], image_ids[:, 2] = position // side, position % side
    bf16 = dict(device=device, dtype=torch.bfloat16)
    inputs = dict(
        hidden_states=torch.randn(1, tokens, cfg.in_channels, **bf16),
        encoder_hidden_states=torch.randn(1, text, cfg.joint_attention_dim, **bf16),
        pooled_projections=torch.randn(1, cfg.pooled_projection_dim, **bf16),
        timestep=torch.tensor([0.5], **bf16),
        img_ids=image_ids,
        txt_ids=torch.zeros(text, 3, device=device),
        **({"guidance": torch.tensor([3.5], **bf16)} if cfg.guidance_embeds else {}),
        return_dict=False,
    )
    name = f"Flux.1 forward, B=1, {tokens} image + {text} text tokens"
    return {"eager": model, "eager + kgen": kgen}, {name: lambda m: m(**inputs)}


def wan(torch, device, config, patch_kwargs, steps, log):
    """Wan 2.1 1.3B (30 blocks) and 14B cut to 2 blocks, each variant's two models one module called by name.
    bf16 with the modules Wan keeps in float32 as from_pretrained loads them."""
    configs = WAN if not config else {"Wan": config}
    variants, workloads = {"eager": {}, "eager + kgen": {}}, {}
    for i, (label, cfg) in enumerate(configs.items()):
        model, kgen = _wan_models(torch, device, cfg, patch_kwargs, train=False)
        key = f"model{i}"
        variants["eager"][key], variants["eager + kgen"][key] = model, kgen
        inputs, shape = _wan_inputs(torch, device, model, small=bool(config))
        workloads[f"{label} forward, {shape}"] = lambda m, key=key, inputs=inputs: m(key, **inputs)
    return {variant: _by_name(torch, models) for variant, models in variants.items()}, workloads


def wan_train(torch, device, config, patch_kwargs, steps, log):
    """One training step of Wan 2.1 1.3B cut to 4 blocks (forward, a mean-squared error against a random
    target, backward; no optimizer) at wan's shape. Attention by the flash, memory-efficient or math
    backend in every variant: torch 2.11's cuDNN attention backward fails on the H200 in Wan's training step,
    diffusers' own model included (tests/test_flux_integration.py)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = config or WAN["Wan 2.1 1.3B"] | {"num_layers": 4}
    model, kgen = _wan_models(torch, device, cfg, patch_kwargs, train=True)
    inputs, shape = _wan_inputs(torch, device, model, small=bool(config))
    latents = inputs["hidden_states"]
    out_channels = model.config.out_channels or model.config.in_channels
    target = torch.randn(latents.shape[0], out_channels, *latents.shape[2:], device=device)

    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

    def step(m):
        m.zero_grad(set_to_none=True)
        with sdpa_kernel(backends):
            torch.nn.functional.mse_loss(m(**inputs)[0].float(), target).backward()

    label = "Wan" if config else "Wan 2.1 1.3B"
    name = f"{label} training step, {model.config.num_layers} blocks, {shape}"
    return {"eager": model, "eager + kgen": kgen}, {name: step}


def _wan_models(torch, device, cfg: dict, patch_kwargs, train: bool):
    """A WanTransformer3DModel of ``cfg`` in bf16 with the modules Wan keeps in float32 as from_pretrained
    loads them, and a patched copy."""
    from diffusers import WanTransformer3DModel

    with torch.device(device):
        model = cast_as_from_pretrained(WanTransformer3DModel(**cfg), torch.bfloat16).train(train)
    kgen = copy.deepcopy(model)
    patch(kgen, **patch_kwargs)
    return model, kgen


def _wan_inputs(torch, device, model, small: bool) -> tuple[dict, str]:
    """The transformer's arguments at B = 1 (a 480p video of 81 frames: 21×60×104 latents, 512 text tokens;
    ``small``: 2×4×4 and 5) and the shape in words."""
    (frames, height, width), text = ((21, 60, 104), 512) if not small else ((2, 4, 4), 5)
    inputs = dict(
        hidden_states=torch.randn(
            1, model.config.in_channels, frames, height, width, device=device, dtype=torch.bfloat16
        ),
        timestep=torch.tensor([500.0], device=device),
        encoder_hidden_states=torch.randn(
            1, text, model.config.text_dim, device=device, dtype=torch.bfloat16
        ),
        return_dict=False,
    )
    p_t, p_h, p_w = model.config.patch_size
    tokens = frames // p_t * (height // p_h) * (width // p_w)
    return inputs, f"B=1, {frames}×{height}×{width} latents ({tokens} tokens), {text} text tokens"


def _by_name(torch, models: dict):
    """``models`` as one module whose forward takes a model's name first (torch.compile wraps them all)."""

    class Models(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.models = torch.nn.ModuleDict(models)

        def forward(self, name, **inputs):
            return self.models[name](**inputs)

    return Models()


def _ltx_inputs(torch, device, model, grid) -> dict:
    """The transformer's arguments for B = 2 videos of ``grid`` latents and 128 caption tokens (bf16)."""
    inputs = dict(
        hidden_states=torch.randn(2, grid[0] * grid[1] * grid[2], model.config.in_channels),
        encoder_hidden_states=torch.randn(2, 128, model.config.caption_channels),
        timestep=torch.tensor([500, 500]),
        encoder_attention_mask=torch.ones(2, 128),
    )
    inputs = {
        k: v.to(device, torch.bfloat16 if v.is_floating_point() else v.dtype) for k, v in inputs.items()
    }
    return inputs | dict(
        num_frames=grid[0],
        height=grid[1],
        width=grid[2],
        rope_interpolation_scale=(8 / 25, 32, 32),
        return_dict=False,
    )

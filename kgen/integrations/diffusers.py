"""Runs a diffusers LTX-Video transformer (`LTXVideoTransformer3DModel`) on kgen's kernels; `patch` also
takes a Flux.1 (`FluxTransformer2DModel`, kgen.integrations.flux) or a Wan 2.x transformer
(`WanTransformer3DModel`, kgen.integrations.wan) and hands it to that module.

In each block: norm1 and the AdaLN modulation after it -> adaln_rmsnorm, and from the second block on,
fused with the residual add that ends the block before (`+ ff · gate`: a block hands the next one a
`Pending` add, the last one hands it to norm_out -> residual_adaln_layernorm); attn2's residual add, norm2
and its modulation -> residual_adaln_rmsnorm (one pass over the residual stream); in self-attention norm_q,
norm_k (torch.nn.RMSNorm across heads) and the 3D rotary embedding -> qk_norm_rope3d, q and k read once and
written once in one launch, the angles computed in the kernel from the latent grid (where the kernel serves
C, else rmsnorm then rope3d_qk; with video_coords, rmsnorm then rope3d_coords), so the model's rope no
longer builds its two fp32 [B, S, C] tables; in cross-attention norm_q and norm_k -> rmsnorm; the
FeedForward's GELU(approximate="tanh") -> gelu_tanh. Numerics: diffusers' own roundings (the ops' "diffusers"
conventions; torch.nn.RMSNorm's for the q/k norms, fp32 rotation rounded once as diffusers'
apply_rotary_emb). Modules are matched by class name (diffusers' RMSNorm is not torch.nn.RMSNorm) and the
whole structure is checked before anything changes.

Every op has a derived backward, so a patched model trains as it is: the AdaLN norms' per-batch scale, shift
and gate get their gradients summed over each batch's rows, the residual stream's flow through both outputs
of the fused residual adds. Traced by torch.compile with autograd on (a compiled training step), the blocks
keep diffusers' own norms, modulation and residual adds (their attentions and GELU stay kgen's) and norm_out
its own: Inductor fuses those with the gradient adds around them, which an op's opaque backward cannot take
in (attn1's residual stream feeds attn2 and norm2: its two gradients are summed in a kernel of their own).
LTX-Video's compiled training step on an H100 ran 1.027x torch.compile's that way against 1.014x with the
fused norms, its kernels 3.9 % under torch.compile's against 2.8 %
(bench/results/partials-h100-2026-12-07)."""

from __future__ import annotations

import functools
from pathlib import Path
from types import MethodType
from typing import Any, Callable, NamedTuple

from ..builder import PROGRESS, build_op, device_arch, load
from ..errors import KgenError
from . import flux, wan
from ._diffusers_common import Pending, fuses_qk_norms, gelu_forward, refuse_hooks, rms_forward

OPS = (
    "adaln_rmsnorm",
    "residual_adaln_rmsnorm",
    "residual_adaln_layernorm",
    "rmsnorm",
    "rope3d_qk",
    "rope3d_coords",
    "qk_norm_rope3d",
    "gelu_tanh",
)
BLOCK, ATTENTION = "LTXVideoTransformerBlock", "LTXAttention"


class LatentGrid(NamedTuple):
    """What the patched rope hands the blocks in place of its (cos, sin) tables: what the angles come from."""

    frames: int
    height: int
    width: int
    scales: tuple[float, float, float]  # rope_interpolation_scale (t, h, w)
    patches: tuple[float, float]  # patch_size_t, patch_size
    base: tuple[float, float, float]  # base_num_frames, base_height, base_width
    theta: float
    coords: Any = None  # video_coords [B, 3, S], when the caller gave them


def patch(
    model,
    *,
    arch: str | None = None,
    root: Path = Path("generated"),
    step: Callable[[str], None] = PROGRESS.info,
) -> dict[str, int]:
    """Patches ``model`` in place (before `enable_model_cpu_offload`, whose hooks wrap the forwards it
    finds); returns how many modules of each kind now run on kgen's kernels. Refuses a model it does not
    know. A patched block returns a `Pending` residual add for the next block or norm_out: call the model,
    not a block. The patched model trains too (every op's backward is derived from its spec). A
    FluxTransformer2DModel is patched by `kgen.integrations.flux`, a WanTransformer3DModel by
    `kgen.integrations.wan` (each checked before its ops are built)."""
    for served in (flux, wan):
        if type(model).__name__ == served.MODEL:
            served.check(model)
            return served.apply(
                model, {op: load(build_op(op, arch or device_arch(), root, step)) for op in served.OPS}
            )
    _check(model)
    kernels = {op: load(build_op(op, arch or device_arch(), root, step)) for op in OPS}
    model.rope.forward = MethodType(_latent_grid, model.rope)
    done = {"blocks": 0, "attentions": 0, "gelu_tanh": 0, "norm_out": 1}
    norm_out = model.norm_out
    norm_out.forward = MethodType(
        _final_norm(kernels["residual_adaln_layernorm"], type(norm_out).forward), norm_out
    )
    for block in model.transformer_blocks:
        block.forward = MethodType(_block_forward(kernels, type(block).forward), block)
        done["blocks"] += 1
        for attn in (block.attn1, block.attn2):
            attn.set_processor(_Attention(kernels, attn.processor))
        for module in block.ff.modules():
            if type(module).__name__ == "GELU" and module.approximate == "tanh":
                module.forward = MethodType(gelu_forward(kernels["gelu_tanh"]), module)
                done["gelu_tanh"] += 1
        done["attentions"] += 2
    return done


PROCESSORS = ("LTXVideoAttnProcessor", "_Attention")  # diffusers', or this module's from an earlier patch
STRUCTURE = {
    "": BLOCK,
    "norm1": "RMSNorm",
    "norm2": "RMSNorm",
    "attn1": ATTENTION,
    "attn2": ATTENTION,  # by class name
    "attn1.norm_q": "RMSNorm",
    "attn1.norm_k": "RMSNorm",
    "attn2.norm_q": "RMSNorm",
    "attn2.norm_k": "RMSNorm",
    "attn1.processor": PROCESSORS,
    "attn2.processor": PROCESSORS,
}


def _check(model) -> None:
    name = type(model).__name__
    if name != "LTXVideoTransformer3DModel":
        raise KgenError(
            "kgen.integrations.diffusers patches diffusers' LTXVideoTransformer3DModel, "
            f"{flux.MODEL} and {wan.MODEL}, not {name}"
        )
    refuse_hooks(model, "LTXVideoTransformer3DModel")
    norm = model.norm_out
    if type(norm).__name__ != "LayerNorm" or norm.weight is not None or norm.bias is not None:
        raise KgenError(
            f"LTXVideoTransformer3DModel.norm_out: a {type(norm).__name__}, not a LayerNorm without affine"
        )
    if type(model.rope).__name__ != "LTXVideoRotaryPosEmbed":
        raise KgenError(
            f"LTXVideoTransformer3DModel: rope is a {type(model.rope).__name__}, not LTXVideoRotaryPosEmbed"
        )
    for i, block in enumerate(model.transformer_blocks):
        for path, wanted in STRUCTURE.items():
            found = type(functools.reduce(getattr, path.split(".") if path else [], block)).__name__
            if found not in (wanted if isinstance(wanted, tuple) else (wanted,)):
                raise KgenError(
                    f"LTXVideoTransformer3DModel.transformer_blocks.{i}{'.' * bool(path)}{path}: a {found}, "
                    f"not a {wanted if isinstance(wanted, str) else wanted[0]}"
                )
            if path in ("norm1", "norm2") and getattr(getattr(block, path), "bias", None) is not None:
                raise KgenError(
                    f"LTXVideoTransformer3DModel.transformer_blocks.{i}.{path}: an RMSNorm with a bias, "
                    "which kgen's adaln ops do not add"
                )


def _latent_grid(
    self,
    hidden_states,
    num_frames=None,
    height=None,
    width=None,
    rope_interpolation_scale=None,
    video_coords=None,
) -> LatentGrid:
    """LTXVideoRotaryPosEmbed.forward's arguments, kept for the kernels. Without rope_interpolation_scale
    diffusers uses the grid indices as they are: scales of base / patch do that."""
    base = (float(self.base_num_frames), float(self.base_height), float(self.base_width))
    patches = (float(self.patch_size_t), float(self.patch_size))
    if rope_interpolation_scale is None:
        scales = (base[0] / patches[0], base[1] / patches[1], base[2] / patches[1])
    else:
        scales = tuple(float(s) for s in rope_interpolation_scale)
    coords = None if video_coords is None else video_coords.float()
    return LatentGrid(
        num_frames or 1, height or 1, width or 1, scales, patches, base, float(self.theta), coords
    )


def _rope_params(grid: LatentGrid) -> tuple:
    """rope3d's params after its tensors: the grid, theta, base sizes, scales and patch sizes."""
    return (grid.frames, grid.height, grid.width, grid.theta, *grid.base, *grid.scales, *grid.patches)


def _rotate(kernels, query, key, grid: LatentGrid):
    if grid.coords is not None:
        rope = kernels["rope3d_coords"].rope3d_coords
        return (
            rope(query, grid.coords, grid.theta, *grid.base),
            rope(key, grid.coords, grid.theta, *grid.base),
        )
    return kernels["rope3d_qk"].rope3d_qk(query, key, *_rope_params(grid))


def _rms(kernels, norm, x):
    """``norm`` (a torch.nn.RMSNorm) of x on kgen's rmsnorm, as the patched q/k norms of Flux and Wan run."""
    return rms_forward(kernels["rmsnorm"].rmsnorm)(norm, x)


class _Attention:
    """An LTX attention processor: diffusers' steps (projections, q/k norms, rotary, attention dispatch,
    output projection), with kgen's norm and rotary kernels."""

    def __init__(self, kernels, original):
        self.kernels = kernels
        self._attention_backend = getattr(original, "_attention_backend", None)
        self._parallel_config = getattr(original, "_parallel_config", None)

    def __call__(
        self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None
    ):
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.transformers.transformer_ltx import apply_rotary_emb

        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, context.shape[1], context.shape[0])
            attention_mask = attention_mask.view(context.shape[0], attn.heads, -1, attention_mask.shape[-1])
        query, key, value = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
        grid = image_rotary_emb if isinstance(image_rotary_emb, LatentGrid) else None
        if grid is not None and grid.coords is None and fuses_qk_norms(query, attn.norm_q, attn.norm_k):
            # norm_q, norm_k and the rotation in one launch
            weights = attn.norm_q.weight, attn.norm_k.weight
            query, key = self.kernels["qk_norm_rope3d"].qk_norm_rope3d(
                query, key, *weights, *_rope_params(grid), eps=attn.norm_q.eps
            )
        else:
            query, key = _rms(self.kernels, attn.norm_q, query), _rms(self.kernels, attn.norm_k, key)
            if grid is not None:
                query, key = _rotate(self.kernels, query, key, grid)
            elif image_rotary_emb is not None:  # tables from an unpatched rope
                query, key = (
                    apply_rotary_emb(query, image_rotary_emb),
                    apply_rotary_emb(key, image_rotary_emb),
                )
        heads = [t.unflatten(2, (attn.heads, -1)) for t in (query, key, value)]
        out = dispatch_attention_fn(
            *heads,
            attn_mask=attention_mask,
            dropout_p=0.0,
            is_causal=False,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        return attn.to_out[1](attn.to_out[0](out.flatten(2, 3).to(query.dtype)))


def _block_forward(kernels, original):  # original: diffusers' forward (a function dynamo traces into)
    import torch

    adaln, residual_adaln = (
        kernels["adaln_rmsnorm"].adaln_rmsnorm,
        kernels["residual_adaln_rmsnorm"].residual_adaln_rmsnorm,
    )

    def forward(
        self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, encoder_attention_mask=None
    ):
        """LTXVideoTransformerBlock's dataflow in diffusers' roundings; each norm fused with its modulation
        and the residual add before it (attn2's for norm2; for norm1, the block before's, handed over as
        `Pending`). Traced by torch.compile with autograd on: diffusers' own block (see the module's
        docstring)."""
        if torch.compiler.is_compiling() and torch.is_grad_enabled():
            args = (hidden_states, encoder_hidden_states, temb, image_rotary_emb, encoder_attention_mask)
            return original(self, *args)
        table = self.scale_shift_table
        modulation = table[None, None].to(temb.device) + temb.reshape(
            temb.shape[0], temb.shape[1], table.shape[0], -1
        )
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulation.unbind(dim=2)
        if isinstance(hidden_states, Pending):  # the block before's `+ ff · gate`, fused with this norm
            before = hidden_states
            normed, hidden_states = residual_adaln(
                before.hidden,
                before.ff,
                scale_msa,
                shift_msa,
                before.gate,
                self.norm1.weight,
                self.norm1.eps,
                convention="diffusers",
            )
        else:
            normed = adaln(
                hidden_states, scale_msa, shift_msa, self.norm1.weight, self.norm1.eps, convention="diffusers"
            )
        attended = self.attn1(
            hidden_states=normed, encoder_hidden_states=None, image_rotary_emb=image_rotary_emb
        )
        hidden_states = hidden_states + attended * gate_msa
        crossed = self.attn2(
            hidden_states,
            encoder_hidden_states=encoder_hidden_states,
            image_rotary_emb=None,
            attention_mask=encoder_attention_mask,
        )
        normed, hidden_states = residual_adaln(
            hidden_states,
            crossed,
            scale_mlp,
            shift_mlp,
            None,
            self.norm2.weight,
            self.norm2.eps,
            convention="diffusers",
        )
        return Pending(hidden_states, self.ff(normed), gate_mlp)

    return forward


def _final_norm(kernel, original):
    def forward(self, hidden_states):
        """norm_out (LayerNorm, no affine) after the last block, with its pending residual add: the
        modulation that follows stays in the model's code, so scale and shift are 0 here (diffusers'
        roundings: exact)."""
        if not isinstance(hidden_states, Pending):
            return original(self, hidden_states)
        x, ff, gate = hidden_states
        zeros = x.new_zeros(x.shape[0], 1, x.shape[-1])
        return kernel.residual_adaln_layernorm(x, ff, zeros, zeros, gate, self.eps, convention="diffusers")[0]

    return forward

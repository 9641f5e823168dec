"""Runs a diffusers Wan 2.x transformer (`WanTransformer3DModel`: text to video, Wan 2.1 and 2.2, TI2V's
timestep per token included) on kgen's kernels: what `kgen.integrations.diffusers.patch` does to one (it
checks the model, builds and loads OPS, then applies).

In each block: norm1 (FP32LayerNorm without affine) and the modulation after it -> adaln_layernorm_fp32, from
the second block on residual_adaln_layernorm_fp32 with the `+ ff · gate` that ends the block before (a block
hands the next one a `Pending` add); self-attention's gated residual add and norm2 (FP32LayerNorm with its
affine) -> residual_layernorm_fp32; cross-attention's residual add, norm3 and its modulation ->
residual_adaln_layernorm_fp32 (no gate). In each attention norm_q and norm_k (torch.nn.RMSNorm across heads)
-> rmsnorm; in self-attention the rotary embedding -> rope_wan, q and k in one launch (over [B, H, S, D] views
of the [B, S, H, D] heads) with the angles computed in the kernel from the latent grid, so the model's rope
hands the blocks the grid instead of building its two fp32 tables; where the q/k norms fit the fused kernel
(`fuses_qk_norms`; in training too, through its derived backward), self-attention's norm_q, norm_k and
rotation -> one qk_norm_rope_wan launch; the feed-forward's GELU(approximate="tanh") -> gelu_tanh. The
model's forward is replaced by one with diffusers' dataflow whose output norm takes the last block's pending
add: norm_out and the output modulation -> residual_adaln_layernorm_fp32.

Numerics: Wan's own. The modulation (`scale_shift_table + temb`) stays float32 and reaches the kernels as it
is, per batch ([B, 1, C] chunks of [B, 6, C]) or per token ([B, S, C] chunks of [B, S, 6, C]); every norm is
fp32 math rounded once, as Wan's `norm(x.float()) ... .type_as(x)`; the gated residual adds are fp32 with the
float32 gate, rounded once; the rotation is fp32 from cos and sin bitwise WanRotaryPosEmbed's (float64 angles
rounded to fp32), rounded once. That is the model from_pretrained(torch_dtype=torch.bfloat16) loads, which
keeps `_keep_in_fp32_modules` (rope, time_embedder, scale_shift_table, norm1, norm2, norm3) in float32
(`cast_as_from_pretrained` does the same to a model built with random weights). A model cast whole to bf16
runs the same except where diffusers then rounds more: its rotary tables and its output modulation are bf16
there, kgen's fp32.

Refused before anything changes: a model that hooks wrap (offloading, caching, context parallelism),
image-conditioned cross-attention (Wan 2.1 I2V's added key and value projections), a block without norm2
(cross_attn_norm=False), a norm with an affine the ops do not apply, another GELU, another attention
processor, and any module of another class than Wan's. Gradient checkpointing runs each block on plain
tensors (the pending add unpacked), reentrant or not."""

from __future__ import annotations

import functools
from types import MethodType
from typing import NamedTuple

from ..errors import KgenError
from ._diffusers_common import (
    Pending,
    fuses_qk_norms,
    gelu_forward,
    packed,
    refuse_hooks,
    rms_forward,
    unpacked,
)

OPS = (
    "adaln_layernorm_fp32",
    "residual_adaln_layernorm_fp32",
    "residual_layernorm_fp32",
    "rmsnorm",
    "gelu_tanh",
    "rope_wan",
    "qk_norm_rope_wan",
)
MODEL = "WanTransformer3DModel"
THETA = 10000.0  # the model builds its rope with WanRotaryPosEmbed's default theta, which it does not keep
STRUCTURE = {  # class names, torch's own as torch.nn.<name> (diffusers has an RMSNorm and a GELU of its own)
    "": "WanTransformerBlock",
    "norm1": "FP32LayerNorm",
    "norm2": "FP32LayerNorm",
    "norm3": "FP32LayerNorm",
    "attn1": "WanAttention",
    "attn2": "WanAttention",
    "attn1.norm_q": "torch.nn.RMSNorm",
    "attn1.norm_k": "torch.nn.RMSNorm",
    "attn2.norm_q": "torch.nn.RMSNorm",
    "attn2.norm_k": "torch.nn.RMSNorm",
    "ffn": "FeedForward",
    "ffn.net.0": "GELU",
}


class Grid(NamedTuple):
    """What the patched rope hands the blocks instead of its (cos, sin) tables: the latent grid after
    patching, which the rotary angles come from."""

    frames: int
    height: int
    width: int


def apply(model, kernels: dict) -> dict[str, int]:
    """Patches a WanTransformer3DModel that `check` accepted, in place, with ``kernels`` (OPS' loaded
    libraries); returns how many modules of each kind now run on kgen's kernels."""
    from diffusers.utils import apply_lora_scale

    rope = model.rope
    rope.forward = MethodType(_grid_forward, rope)
    dims = dict(theta=THETA, dim_t=rope.t_dim, dim_h=rope.h_dim, dim_w=rope.w_dim)
    rotate = functools.partial(kernels["rope_wan"].rope_wan, **dims)
    fused = functools.partial(kernels["qk_norm_rope_wan"].qk_norm_rope_wan, **dims)
    rms, gelu = rms_forward(kernels["rmsnorm"].rmsnorm), gelu_forward(kernels["gelu_tanh"])
    done = {"blocks": 0, "attentions": 0, "qk_norms": 0, "gelu_tanh": 0, "norm_out": 1}
    for block in model.blocks:
        block.forward = MethodType(_block_forward(kernels), block)
        for attn in (block.attn1, block.attn2):
            attn.set_processor(_Attention(rotate, fused, attn.processor))
            for norm in (attn.norm_q, attn.norm_k):
                norm.forward = MethodType(rms, norm)
        block.ffn.net[0].forward = MethodType(gelu, block.ffn.net[0])
        done["blocks"] += 1
        done["attentions"] += 2
        done["qk_norms"] += 4
        done["gelu_tanh"] += 1
    forward = _model_forward(kernels)
    model.forward = MethodType(apply_lora_scale("attention_kwargs")(forward), model)
    return done


def check(model) -> None:
    """Refuses a model whose structure differs from what `apply` serves, before anything changes."""
    refuse_hooks(model, MODEL)
    if (found := _name(model.rope)) != "WanRotaryPosEmbed":
        raise KgenError(f"{MODEL}.rope: a {found}, not a WanRotaryPosEmbed")
    if (found := _name(model.norm_out)) != "FP32LayerNorm":
        raise KgenError(f"{MODEL}.norm_out: a {found}, not a FP32LayerNorm")
    norms = [("norm_out", model.norm_out)]
    for i, block in enumerate(model.blocks):
        where = f"blocks.{i}"
        for path, wanted in STRUCTURE.items():
            module = functools.reduce(getattr, path.split(".") if path else [], block)
            if (found := _name(module)) != wanted:
                hint = " (cross_attn_norm=False)" if path == "norm2" and found == "torch.nn.Identity" else ""
                raise KgenError(f"{MODEL}.{where}{'.' * bool(path)}{path}: a {found}{hint}, not a {wanted}")
        if block.ffn.net[0].approximate != "tanh":
            raise KgenError(
                f"{MODEL}.{where}.ffn.net.0: GELU(approximate={block.ffn.net[0].approximate!r}), not 'tanh'"
            )
        for path in ("attn1", "attn2"):
            attn = getattr(block, path)
            if not isinstance(attn.processor, _Attention) and _name(attn.processor) != "WanAttnProcessor":
                raise KgenError(
                    f"{MODEL}.{where}.{path}.processor: a {_name(attn.processor)}, not a WanAttnProcessor"
                )
            if attn.add_k_proj is not None:
                raise KgenError(
                    f"{MODEL}.{where}.{path}: image-conditioned attention (add_k_proj: Wan I2V), which "
                    "kgen's patch does not serve"
                )
        norms += [(f"{where}.norm1", block.norm1), (f"{where}.norm3", block.norm3)]
    for where, norm in norms:
        if norm.weight is not None or norm.bias is not None:
            raise KgenError(
                f"{MODEL}.{where}: an FP32LayerNorm with affine, which kgen's adaln ops do not apply"
            )


def cast_as_from_pretrained(model, dtype):
    """Casts ``model``'s floating parameters and buffers to ``dtype`` in place as from_pretrained(torch_dtype=
    dtype) loads them: float32 instead where a part of the dotted name is one of the class's
    `_keep_in_fp32_modules` (for Wan rope, time_embedder, scale_shift_table, norm1, norm2, norm3); returns
    ``model``. For a model built with random weights in float32 (tests, the e2e benchmark)."""
    import torch

    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for prefix, module in model.named_modules():
        for store in (module._parameters, module._buffers):
            for name, tensor in store.items():
                if tensor is not None and tensor.is_floating_point():
                    parts = {*prefix.split("."), name} if prefix else {name}
                    tensor.data = tensor.data.to(torch.float32 if keep & parts else dtype)
    return model


def _name(module) -> str:
    """A module's class name, torch.nn's own as torch.nn.<name>."""
    cls = type(module)
    return f"torch.nn.{cls.__name__}" if cls.__module__.startswith("torch.nn.") else cls.__name__


def _grid_forward(self, hidden_states) -> Grid:
    """WanRotaryPosEmbed.forward's grid (latents [B, C, F, H, W] over the patch size), kept for rope_wan."""
    _, _, frames, height, width = hidden_states.shape
    p_t, p_h, p_w = self.patch_size
    return Grid(frames // p_t, height // p_h, width // p_w)


class _Attention:
    """A Wan attention processor for text to video: diffusers' dataflow (projections, norm_q / norm_k across
    heads, heads split, rotary on q and k, attention dispatch, output projection) with q and k rotated by
    kgen's rope_wan in one launch, seen as [B, H, S, D] views, from the grid the patched rope passes on.
    Where the norms fit it (`fuses_qk_norms`), self-attention's norms and rotation are one qk_norm_rope_wan
    launch."""

    def __init__(self, rotate, fused, original):
        self.rotate, self.fused = rotate, fused
        self._attention_backend = getattr(original, "_attention_backend", None)
        self._parallel_config = getattr(original, "_parallel_config", None)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.transformers.transformer_wan import _get_qkv_projections

        q, k, v = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        if rotary_emb is not None and not isinstance(rotary_emb, Grid):
            raise KgenError(f"{MODEL}: a patched attention rotates by the grid the patched rope returns")

        def split(t):  # [B, S, H·D] -> [B, S, H, D]
            return t.unflatten(2, (attn.heads, -1))

        if rotary_emb is not None and fuses_qk_norms(split(q), attn.norm_q, attn.norm_k, "token"):
            # norm_q, norm_k (across heads) and the rotation in one launch, over [B, H, S, D] views
            weights = attn.norm_q.weight, attn.norm_k.weight
            rotated = self.fused(
                split(q).transpose(1, 2), split(k).transpose(1, 2), *weights, *rotary_emb, eps=attn.norm_q.eps
            )
            (q, k), v = (t.transpose(1, 2) for t in rotated), split(v)
        else:
            q, k, v = (split(t) for t in (attn.norm_q(q), attn.norm_k(k), v))
            if rotary_emb is not None:
                rotated = self.rotate(q.transpose(1, 2), k.transpose(1, 2), *rotary_emb)
                q, k = (t.transpose(1, 2) for t in rotated)
        out = dispatch_attention_fn(
            q,
            k,
            v,
            attn_mask=attention_mask,
            dropout_p=0.0,
            is_causal=False,
            backend=self._attention_backend,
            parallel_config=self._parallel_config if encoder_hidden_states is None else None,
        )
        return attn.to_out[1](attn.to_out[0](out.flatten(2, 3).type_as(q)))


def _modulation(table, temb, chunks: int) -> tuple:
    """``table`` + ``temb`` in float32 as Wan adds them, in ``chunks`` pieces: per batch (temb [B, chunks, C]:
    [B, 1, C] each) or per token (temb [B, S, chunks, C]: [B, S, C] each)."""
    if temb.ndim == 4:
        return (table.unsqueeze(0) + temb.float()).unbind(dim=2)
    return (table + temb.float()).chunk(chunks, dim=1)


def _block_forward(kernels):
    adaln = kernels["adaln_layernorm_fp32"].adaln_layernorm_fp32
    residual_adaln = kernels["residual_adaln_layernorm_fp32"].residual_adaln_layernorm_fp32
    residual_norm = kernels["residual_layernorm_fp32"].residual_layernorm_fp32

    def forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb):
        """WanTransformerBlock's dataflow in Wan's roundings; each norm fused with its modulation and the
        residual add before it (for norm1 the block before's, handed over as `Pending`)."""
        shift, scale, gate, c_shift, c_scale, c_gate = _modulation(self.scale_shift_table, temb, 6)
        if isinstance(hidden_states, Pending):
            before = hidden_states
            normed, hidden_states = residual_adaln(
                before.hidden, before.ff, scale, shift, before.gate, self.norm1.eps
            )
        else:
            normed = adaln(hidden_states, scale, shift, self.norm1.eps)
        attended = self.attn1(normed, None, None, rotary_emb)
        weight, bias = (None if p is None else p.float() for p in (self.norm2.weight, self.norm2.bias))
        normed, hidden_states = residual_norm(hidden_states, attended, gate, weight, bias, self.norm2.eps)
        crossed = self.attn2(normed, encoder_hidden_states, None, None)
        normed, hidden_states = residual_adaln(hidden_states, crossed, c_scale, c_shift, None, self.norm3.eps)
        return Pending(hidden_states, self.ffn(normed), c_gate)

    return forward


def _block_step(block, hidden, ff, gate, encoder_hidden_states, temb, grid) -> tuple:
    """One block on plain tensors, the pending add it takes and the one it returns unpacked: what a checkpoint
    function, reentrant or not, saves, runs again and differentiates."""
    return tuple(block(packed(hidden, ff, gate), encoder_hidden_states, temb, grid))


def _model_forward(kernels):
    adaln = kernels["adaln_layernorm_fp32"].adaln_layernorm_fp32
    residual_adaln = kernels["residual_adaln_layernorm_fp32"].residual_adaln_layernorm_fp32

    def forward(
        self,
        hidden_states,
        timestep,
        encoder_hidden_states,
        encoder_hidden_states_image=None,
        return_dict=True,
        attention_kwargs=None,
    ):
        """WanTransformer3DModel.forward's dataflow: the rope's grid, patch embedding, the condition embedder
        (a timestep per batch, or per token: timestep [B, S]), the blocks handing on their pending adds, then
        the last one's fused with norm_out and the output modulation, the projection and unpatchify."""
        import torch
        from diffusers.models.modeling_outputs import Transformer2DModelOutput

        batch = hidden_states.shape[0]
        grid = self.rope(hidden_states)
        hidden_states = self.patch_embedding(hidden_states).flatten(2).transpose(1, 2).contiguous()
        per_token = timestep.ndim == 2
        temb, projected, encoder_hidden_states, encoder_hidden_states_image = self.condition_embedder(
            timestep.flatten() if per_token else timestep,
            encoder_hidden_states,
            encoder_hidden_states_image,
            timestep_seq_len=timestep.shape[1] if per_token else None,
        )
        projected = projected.unflatten(2 if per_token else 1, (6, -1))
        if encoder_hidden_states_image is not None:
            encoder_hidden_states = torch.concat([encoder_hidden_states_image, encoder_hidden_states], dim=1)
        checkpointing = torch.is_grad_enabled() and self.gradient_checkpointing
        for block in self.blocks:
            if checkpointing:
                step = functools.partial(_block_step, block)
                hidden_states = Pending(
                    *self._gradient_checkpointing_func(
                        step, *unpacked(hidden_states), encoder_hidden_states, projected, grid
                    )
                )
            else:
                hidden_states = block(hidden_states, encoder_hidden_states, projected, grid)
        table = self.scale_shift_table.to(temb.device)
        shift, scale = _modulation(table, temb.unsqueeze(-2), 2)
        if isinstance(hidden_states, Pending):
            last = hidden_states
            normed = residual_adaln(last.hidden, last.ff, scale, shift, last.gate, self.norm_out.eps)[0]
        else:  # no blocks
            normed = adaln(hidden_states, scale, shift, self.norm_out.eps)
        out = self.proj_out(normed).reshape(batch, *grid, *self.config.patch_size, -1)
        out = out.permute(0, 7, 1, 4, 2, 5, 3, 6).flatten(6, 7).flatten(4, 5).flatten(2, 3)
        return Transformer2DModelOutput(sample=out) if return_dict else (out,)

    return forward

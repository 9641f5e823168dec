"""Runs a diffusers Flux.1 transformer (`FluxTransformer2DModel`) on kgen's kernels: what
`kgen.integrations.diffusers.patch` does to one (it checks the model, builds and loads OPS, then applies).

Double blocks, both streams: norm1 / norm1_context (AdaLayerNormZero: LayerNorm without affine, then the
modulation from the timestep embedding's chunks) -> adaln_layernorm in the first block, and from the second on
residual_adaln_layernorm, fused with the residual add that ends the block before (`+ gate · ff`: a block hands
the next one a `Pending` add per stream); the attention's gated residual add, norm2 and its modulation ->
residual_adaln_layernorm (one pass over the residual stream); the feed-forwards' GELU(approximate="tanh") ->
gelu_tanh. Single blocks run on the joint stream (text tokens first) that the model concatenates once, after
the double blocks, instead of splitting and concatenating it again in every block: norm
(AdaLayerNormZeroSingle) -> adaln_layernorm in the first, residual_adaln_layernorm with the block before's
`+ gate · proj_out` in the others; act_mlp -> gelu_tanh in eager (under torch.compile torch's GELU, which
compile writes straight into the concatenation that follows). norm_out (AdaLayerNormContinuous) takes the last
block's pending add -> residual_adaln_layernorm, over the joint stream, the image tokens kept. Every
attention's norm_q, norm_k, norm_added_q, norm_added_k (torch.nn.RMSNorm over head_dim) -> rmsnorm. The
model's forward is replaced by one with diffusers' dataflow (guidance, LoRA scale, ControlNet residuals, which
make the pending add first, float16's clipping where diffusers clips, gradient checkpointing on plain tensors,
reentrant or not) that hands the pending adds on. Numerics: diffusers' own roundings (the ops' "diffusers"
conventions; torch.nn.RMSNorm's for the q/k norms): each pending add is rounded as diffusers' `hidden + gate ·
ff` (the product, then the sum), so the output is the one the unfused adds give.

The rotary embedding: pos_embed (FluxPosEmbed) passes the ids on instead of building its two fp32 tables, and
every attention rotates q and k in one rope_flux launch with the angles computed in the kernel from the ids
(kgen.integrations._flux_attention); where the q/k norms are served, each stream's q/k norms and the rotation
are one qk_norm_rope_flux launch. Refused: IP-Adapter image embeddings (their processor is not served)."""

from __future__ import annotations

import functools
import math
from types import MethodType

from ..errors import KgenError
from ._diffusers_common import Pending, gelu_forward, packed, refuse_hooks, rms_forward, unpacked
from ._flux_attention import Attention, positions_forward

OPS = (
    "adaln_layernorm",
    "residual_adaln_layernorm",
    "rmsnorm",
    "gelu_tanh",
    "rope_flux",
    "qk_norm_rope_flux",
)
MODEL = "FluxTransformer2DModel"
QK_NORMS = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")
PROCESSORS = ("FluxAttnProcessor", "_Attention")  # diffusers', or this module's from an earlier patch
DOUBLE = {
    "": "FluxTransformerBlock",
    "norm1": "AdaLayerNormZero",
    "norm1_context": "AdaLayerNormZero",
    "norm1.norm": "LayerNorm",
    "norm1_context.norm": "LayerNorm",
    "norm2": "LayerNorm",
    "norm2_context": "LayerNorm",
    "attn": "FluxAttention",
    "attn.processor": PROCESSORS,
    **{f"attn.{n}": "RMSNorm" for n in QK_NORMS},
    "ff.net.0": "GELU",
    "ff_context.net.0": "GELU",
}
SINGLE = {
    "": "FluxSingleTransformerBlock",
    "norm": "AdaLayerNormZeroSingle",
    "norm.norm": "LayerNorm",
    "act_mlp": "GELU",
    "attn": "FluxAttention",
    "attn.processor": PROCESSORS,
    "attn.norm_q": "RMSNorm",
    "attn.norm_k": "RMSNorm",
}


def apply(model, kernels: dict) -> dict[str, int]:
    """Patches a FluxTransformer2DModel that `check` accepted, in place, with ``kernels`` (OPS' loaded
    libraries); returns how many modules of each kind now run on kgen's kernels. The patched blocks take and
    return `Pending` adds, and a single block the joint stream: the patched model's forward calls them."""
    from diffusers.utils import apply_lora_scale

    done = {
        "double_blocks": 0,
        "single_blocks": 0,
        "attentions": 0,
        "adaln_norms": 1,  # norm_out
        "qk_norms": 0,
        "gelu_tanh": 0,
    }
    norm = _zero_norm(kernels)
    for block in model.transformer_blocks:
        block.forward = MethodType(_double_forward(norm, kernels["residual_adaln_layernorm"]), block)
        for ff in (block.ff, block.ff_context):
            ff.net[0].forward = MethodType(gelu_forward(kernels["gelu_tanh"]), ff.net[0])
        done["double_blocks"] += 1
        done["adaln_norms"] += 2
        done["gelu_tanh"] += 2
    for block in model.single_transformer_blocks:
        block.forward = MethodType(_single_forward(norm), block)
        block.act_mlp.forward = MethodType(_act_mlp_forward(kernels["gelu_tanh"]), block.act_mlp)
        done["single_blocks"] += 1
        done["adaln_norms"] += 1
        done["gelu_tanh"] += 1
    model.pos_embed.forward = MethodType(positions_forward, model.pos_embed)
    dims = dict(zip(("dim_0", "dim_1", "dim_2"), model.pos_embed.axes_dim))
    dims["theta"] = float(model.pos_embed.theta)
    rope = functools.partial(kernels["rope_flux"].rope_flux, **dims)
    fused = functools.partial(kernels["qk_norm_rope_flux"].qk_norm_rope_flux, **dims)
    for attn in (m for m in model.modules() if type(m).__name__ == "FluxAttention"):
        attn.set_processor(Attention(rope, fused, attn.processor))
        done["attentions"] += 1
        for name in QK_NORMS:
            if (qk_norm := getattr(attn, name, None)) is not None:
                qk_norm.forward = MethodType(rms_forward(kernels["rmsnorm"].rmsnorm), qk_norm)
                done["qk_norms"] += 1
    model.forward = MethodType(apply_lora_scale("joint_attention_kwargs")(_model_forward(norm)), model)
    return done


def check(model) -> None:
    """Refuses a model whose structure differs from what `apply` serves, before anything changes."""
    refuse_hooks(model, MODEL)
    found = type(model.pos_embed).__name__
    if found != "FluxPosEmbed" or len(model.pos_embed.axes_dim) != 3:
        raise KgenError(
            f"{MODEL}.pos_embed: a {found} of {len(model.pos_embed.axes_dim)} axes, not a FluxPosEmbed of 3"
        )
    found = type(model.norm_out).__name__, type(getattr(model.norm_out, "norm", None)).__name__
    if found != ("AdaLayerNormContinuous", "LayerNorm"):
        raise KgenError(
            f"{MODEL}.norm_out: a {found[0]} of a {found[1]}, not an AdaLayerNormContinuous of a LayerNorm"
        )
    blocks = [(f"transformer_blocks.{i}", b, DOUBLE) for i, b in enumerate(model.transformer_blocks)]
    blocks += [
        (f"single_transformer_blocks.{i}", b, SINGLE) for i, b in enumerate(model.single_transformer_blocks)
    ]
    norms = [("norm_out.norm", model.norm_out.norm)]
    for where, block, structure in blocks:
        for path, wanted in structure.items():
            module = functools.reduce(getattr, path.split(".") if path else [], block)
            if type(module).__name__ not in (wanted if isinstance(wanted, tuple) else (wanted,)):
                wanted = wanted if isinstance(wanted, str) else wanted[0]
                raise KgenError(
                    f"{MODEL}.{where}{'.' * bool(path)}{path}: a {type(module).__name__}, not a {wanted}"
                )
            if wanted == "LayerNorm":
                norms.append((f"{where}.{path}", module))
            if wanted == "GELU" and module.approximate != "tanh":
                raise KgenError(
                    f"{MODEL}.{where}.{path}: GELU(approximate={module.approximate!r}), not 'tanh'"
                )
        for path in ("norm1", "norm1_context"):
            if getattr(block, path, None) is not None and getattr(block, path).emb is not None:
                raise KgenError(
                    f"{MODEL}.{where}.{path}: embeds class labels itself, which kgen's patch does not"
                )
    for where, norm in norms:
        if norm.weight is not None or norm.bias is not None:
            raise KgenError(f"{MODEL}.{where}: a LayerNorm with affine, which kgen's adaln ops do not apply")


def _zero_norm(kernels):
    adaln = kernels["adaln_layernorm"].adaln_layernorm
    residual_adaln = kernels["residual_adaln_layernorm"].residual_adaln_layernorm

    def norm(module, x, emb, chunks: int):
        """An AdaLayerNormZero(Single) or AdaLayerNormContinuous (`module`, ``chunks`` chunks of its linear's
        output: shift and scale first, or scale and shift for the continuous one, chunks == 2) over x or over
        a pending add: LayerNorm and `* (1 + scale) + shift` in one pass, with the add when there is one.
        Returns the normalized tensor, the residual stream (x, or the add made) and the other chunks."""
        activated = module.silu(emb)
        if chunks == 2:  # AdaLayerNormContinuous casts to x's dtype
            activated = activated.to(unpacked(x)[0].dtype)
        first, second, *rest = module.linear(activated).chunk(chunks, dim=1)
        shift, scale = (second, first) if chunks == 2 else (first, second)
        scale, shift, eps = scale[:, None], shift[:, None], module.norm.eps
        if isinstance(x, Pending):
            normed, x = residual_adaln(x.hidden, x.ff, scale, shift, x.gate, eps, convention="diffusers")
        else:
            normed = adaln(x, scale, shift, eps, convention="diffusers")
        return normed, x, rest

    return norm


def _act_mlp_forward(kernel):
    def forward(self, x):
        """A single block's act_mlp: kgen's gelu_tanh in eager; torch's while torch.compile traces, which
        writes it straight into the `cat([attention, mlp])` after it (kgen's output would be copied there)."""
        import torch

        if torch.compiler.is_compiling():
            return torch.nn.functional.gelu(x, approximate="tanh")
        return kernel.gelu_tanh(x)

    return forward


def _double_forward(norm, kernel):
    residual_adaln = kernel.residual_adaln_layernorm

    def forward(
        self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, joint_attention_kwargs=None
    ):
        """FluxTransformerBlock's dataflow in diffusers' roundings, each stream's input a tensor or the block
        before's `Pending` add; each gated residual add fused with the norm after it; returns the text's and
        the image's pending adds (the feed-forwards' `+ gate · ff`)."""
        normed, hidden_states, (gate_msa, shift_mlp, scale_mlp, gate_mlp) = norm(
            self.norm1, hidden_states, temb, 6
        )
        normed_context, encoder_hidden_states, (c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp) = norm(
            self.norm1_context, encoder_hidden_states, temb, 6
        )
        attended, attended_context = self.attn(
            hidden_states=normed,
            encoder_hidden_states=normed_context,
            image_rotary_emb=image_rotary_emb,
            **(joint_attention_kwargs or {}),
        )
        normed, hidden_states = residual_adaln(
            hidden_states,
            attended,
            scale_mlp[:, None],
            shift_mlp[:, None],
            gate_msa[:, None],
            self.norm2.eps,
            convention="diffusers",
        )
        image = Pending(hidden_states, self.ff(normed), gate_mlp[:, None])
        normed_context, encoder_hidden_states = residual_adaln(
            encoder_hidden_states,
            attended_context,
            c_scale_mlp[:, None],
            c_shift_mlp[:, None],
            c_gate_msa[:, None],
            self.norm2_context.eps,
            convention="diffusers",
        )
        return Pending(encoder_hidden_states, self.ff_context(normed_context), c_gate_mlp[:, None]), image

    return forward


def _single_forward(norm):
    def forward(self, hidden_states, temb, image_rotary_emb=None, joint_attention_kwargs=None):
        """FluxSingleTransformerBlock's dataflow on the joint stream (a tensor, or the block before's
        `Pending` add, fused with this block's norm); returns its own `+ gate · proj_out` pending."""
        import torch

        normed, hidden_states, (gate,) = norm(self.norm, hidden_states, temb, 3)
        mlp = self.act_mlp(self.proj_mlp(normed))
        attended = self.attn(
            hidden_states=normed, image_rotary_emb=image_rotary_emb, **(joint_attention_kwargs or {})
        )
        return Pending(hidden_states, self.proj_out(torch.cat([attended, mlp], dim=2)), gate[:, None])

    return forward


def _settle(x, clip: bool = False):
    """A pending add made as diffusers makes it (`gate · ff` rounded, then the sum), clipped to float16's
    range with ``clip``; a tensor as it is."""
    if not isinstance(x, Pending):
        return x
    made = x.hidden + x.gate * x.ff
    return made.clip(-65504, 65504) if clip else made


def _double_step(block, *args) -> tuple:
    """A double block on plain tensors (each stream's pending add unpacked, the image's first): what a
    checkpoint function, reentrant or not, saves, runs again and differentiates."""
    text, image = block(packed(*args[:3]), packed(*args[3:6]), *args[6:])
    return (*image, *text)


def _single_step(block, hidden, ff, gate, *args) -> tuple:
    return tuple(block(packed(hidden, ff, gate), *args))


def _sample(samples, index: int, blocks: int, repeat: bool = False):
    """The ControlNet residual diffusers adds after block ``index`` of ``blocks``."""
    return samples[index % len(samples)] if repeat else samples[index // math.ceil(blocks / len(samples))]


def _model_forward(norm):
    def forward(
        self,
        hidden_states,
        encoder_hidden_states=None,
        pooled_projections=None,
        timestep=None,
        img_ids=None,
        txt_ids=None,
        guidance=None,
        joint_attention_kwargs=None,
        controlnet_block_samples=None,
        controlnet_single_block_samples=None,
        return_dict=True,
        controlnet_blocks_repeat=False,
    ):
        """FluxTransformer2DModel.forward's dataflow: embeddings, the ids for the rotary embedding, the double
        blocks handing on each stream's pending add, the joint stream through the single blocks, the last
        pending add fused with norm_out, the projection of the image tokens."""
        import torch
        from diffusers.models.modeling_outputs import Transformer2DModelOutput

        if joint_attention_kwargs and "ip_adapter_image_embeds" in joint_attention_kwargs:
            raise KgenError(f"{MODEL}: IP-Adapter image embeddings are not served by kgen's patch")
        image = self.x_embedder(hidden_states)
        clip = image.dtype == torch.float16  # where diffusers clips to float16's range
        timestep = timestep.to(image.dtype) * 1000
        embedded = (timestep, pooled_projections)
        if guidance is not None:
            embedded = (timestep, guidance.to(image.dtype) * 1000, pooled_projections)
        temb = self.time_text_embed(*embedded)
        text = self.context_embedder(encoder_hidden_states)
        ids = [i[0] if i.ndim == 3 else i for i in (txt_ids, img_ids)]  # diffusers' deprecated batched ids
        rotary = self.pos_embed(torch.cat(ids, dim=0))
        step = torch.is_grad_enabled() and self.gradient_checkpointing and self._gradient_checkpointing_func
        blocks = len(self.transformer_blocks)
        for index, block in enumerate(self.transformer_blocks):
            if step:
                run = functools.partial(_double_step, block)
                parts = step(run, *unpacked(image), *unpacked(text), temb, rotary, joint_attention_kwargs)
                image, text = Pending(*parts[:3]), Pending(*parts[3:])
            else:
                text, image = block(image, text, temb, rotary, joint_attention_kwargs)
            if clip:
                text = _settle(text, clip=True)
            if controlnet_block_samples is not None:
                sample = _sample(controlnet_block_samples, index, blocks, controlnet_blocks_repeat)
                image = _settle(image) + sample
        split = 0
        if self.single_transformer_blocks:  # the joint stream, text first, from here to norm_out
            split = unpacked(text)[0].shape[1]
            image = torch.cat([_settle(text), _settle(image)], dim=1)
        blocks = len(self.single_transformer_blocks)
        for index, block in enumerate(self.single_transformer_blocks):
            if step:
                run = functools.partial(_single_step, block)
                image = Pending(*step(run, *unpacked(image), temb, rotary, joint_attention_kwargs))
            else:
                image = block(image, temb, rotary, joint_attention_kwargs)
            if clip:
                image = _settle(image, clip=True)
            if controlnet_single_block_samples is not None:
                made = _settle(image)
                sample = _sample(controlnet_single_block_samples, index, blocks)
                image = torch.cat([made[:, :split], made[:, split:] + sample], dim=1)
        normed = norm(self.norm_out, image, temb, 2)[0]
        out = self.proj_out(normed[:, split:])
        return Transformer2DModelOutput(sample=out) if return_dict else (out,)

    return forward

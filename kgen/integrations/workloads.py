"""The models `kgen bench --e2e` times: each builder returns the untimed models ({variant: model}, the kgen
one a deep copy of the eager one, patched) and the workloads ({name: fn(model)}). Random weights, bf16.

- ltx: the LTX-Video 2B transformer forward (28 blocks) at B = 2 and S = 2688 (7×16×24 latents: 49 frames at
  512×768) and S = 8064 (21×16×24: 161 frames), 128 caption tokens.
- ltx-train: one training step (forward, a mean-squared error against a random target, backward; no
  optimizer) of the LTX-Video 2B config cut to 4 blocks at B = 2, S = 2688 (7×16×24); the kgen model patched
  as for inference (every op runs with its derived backward).
- flux: the Flux.1-dev transformer forward (19 double and 38 single blocks, guidance embedding) at B = 1, a
  1024×1024 image (64×64 = 4096 image tokens) and 512 text tokens.
- wan: the Wan 2.1 text-to-video transformer forward, 1.3B (30 blocks) and 14B cut to 2 blocks, at B = 1, a
  480p video of 81 frames (21×60×104 latents: 21×30×52 = 32760 tokens after the (1, 2, 2) patch), 512 text
  tokens, a timestep per batch; bf16 with the modules Wan keeps in float32 (as from_pretrained loads it).
- wan-train: one training step (forward, a mean-squared error against a random target, backward; no
  optimizer) of the Wan 2.1 1.3B config cut to 4 blocks at wan's shape (B = 1, 32760 video + 512 text tokens);
  the kgen model patched as for inference (every op runs with its derived backward).
- qwen3: the Qwen3-8B config (36 layers): prefill of 2048 tokens (batch 1), and one decode step at batch 64
  after 512 tokens of context in a static cache (each timed step appends a token; a static cache attends over
  its whole length, so every step costs the same); the kgen model kernelized with
  kgen.integrations.transformers' OPS (RMSNorm, the residual adds fused with the norms after them, the q/k
  norms fused with the rotary embedding, the SwiGLU MLP).
- llama: the Llama-3-8B config (32 layers), the same two workloads as qwen3 (kernelized with the same OPS: the
  norms, the residual adds, the MLP; its rotation stays transformers').
- qwen3-train: one training step (forward with the causal-LM loss on random labels, then backward; no
  optimizer) of the Qwen3-8B config cut to 4 layers at 2 × 2048 tokens; the kgen model kernelized for
  training (OPS and the causal-LM loss's cross-entropy, with their derived backwards), and Liger-Kernel's
  `apply_liger_kernel_to_qwen3` (its defaults: RMSNorm, SwiGLU, RoPE, fused linear cross-entropy) where it
  is installed.
"""

from __future__ import annotations

import copy
import functools
import inspect

from ..errors import KgenError
from .diffusion import flux, ltx, ltx_train, wan, wan_train
from .transformers import OPS, kernelize

QWEN3_8B = dict(
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-6,
    num_hidden_layers=36,
)
# Llama-3-8B: Qwen3-8B's widths and heads (head size 128) but for these
LLAMA3_8B = QWEN3_8B | dict(
    vocab_size=128256, intermediate_size=14336, rms_norm_eps=1e-5, rope_theta=500000.0, num_hidden_layers=32
)


def causal_lm(kind: str, torch, device, config, kernelize_kwargs, steps, log):
    """A causal LM's prefill (no cache) and one decode step (a static cache filled with the context once): the
    ``kind`` "Qwen3" (Qwen3-8B's config) or "Llama" (Llama-3-8B's), or a small ``config`` of it."""
    import transformers
    from transformers import StaticCache

    cls = getattr(transformers, f"{kind}ForCausalLM")
    cfg = getattr(transformers, f"{kind}Config")(**(config or {"Qwen3": QWEN3_8B, "Llama": LLAMA3_8B}[kind]))
    full = not config
    with torch.device(device):
        model = cls(cfg).to(torch.bfloat16).eval()
    kgen = copy.deepcopy(model)
    kernelize(kgen, **kernelize_kwargs)
    prefill, (batch, context) = (2048, (64, 512)) if full else (32, (4, 16))
    ids = torch.randint(0, cfg.vocab_size, (1, prefill), device=device)
    tokens = torch.randint(0, cfg.vocab_size, (batch, 1), device=device)
    caches, calls = {}, {}
    # the cache's keyword: `cache` from transformers 5.24 (`past_key_values`, deprecated, goes in 5.40)
    name = "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"

    def decode(m):
        if id(m) not in caches:  # each model (compiled or not) fills its own cache with the context once
            cache = StaticCache(config=cfg, max_cache_len=context + steps)
            context_ids = torch.randint(0, cfg.vocab_size, (batch, context), device=device)
            # filled by the module itself, not its torch.compile: transformers marks the cache's tensors as
            # static addresses only where it creates them outside dynamo, and CUDA graphs (reduce-overhead)
            # skip a graph that mutates unmarked inputs; the last token's logits only (not 64 × 512 tokens')
            getattr(m, "_orig_mod", m)(context_ids, use_cache=True, logits_to_keep=1, **{name: cache})
            caches[id(m)], calls[id(m)] = cache, 0
        calls[id(m)] += 1  # each step appends a token: past the cache's end a GPU index would assert
        if calls[id(m)] > steps:
            raise KgenError(f"the decode workload's static cache holds {steps} steps after its context")
        return m(tokens, use_cache=True, **{name: caches[id(m)]})

    workloads = {
        f"{kind} prefill, 1×{prefill} tokens": lambda m: m(ids, use_cache=False),
        f"{kind} decode step, batch {batch}, {context} tokens of context": decode,
    }
    return {"eager": model, "eager + kgen": kgen}, workloads


def qwen3_train(torch, device, config, kernelize_kwargs, steps, log):
    from kernels import Mode
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**(config or QWEN3_8B | {"num_hidden_layers": 4}))
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).train()
    models = {"eager": model, "eager + kgen": copy.deepcopy(model)}
    kernelize(models["eager + kgen"], OPS + ("cross_entropy",), mode=Mode.TRAINING, **kernelize_kwargs)
    liger = _liger_qwen3(copy.deepcopy(model))
    if liger is None:
        log("Liger-Kernel is not installed (pip install liger-kernel): no Liger column")
    else:
        models["Liger"] = liger
    batch, tokens = (2, 2048) if not config else (2, 32)
    ids = torch.randint(0, cfg.vocab_size, (batch, tokens), device=device)
    labels = torch.randint(0, cfg.vocab_size, (batch, tokens), device=device)

    def step(m):  # m: a model above or torch.compile of one
        m.zero_grad(set_to_none=True)
        m(ids, labels=labels, use_cache=False).loss.backward()

    return models, {f"Qwen3 training step, {cfg.num_hidden_layers} layers, {batch}×{tokens} tokens": step}


def _liger_qwen3(model):
    """``model`` patched by Liger-Kernel, or None without it. Liger patches the instance's modules and
    forward, but also replaces names in transformers' modeling_qwen3 that every Qwen3 model uses (the rotary
    function) or builds from (the norm and MLP classes): those are put back, and the rotary function is
    Liger's only while this model runs."""
    try:
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3
    except ModuleNotFoundError:
        return None
    from transformers.models.qwen3 import modeling_qwen3

    names = ("apply_rotary_pos_emb", "Qwen3RMSNorm", "Qwen3MLP")
    own = {n: getattr(modeling_qwen3, n) for n in names}
    apply_liger_kernel_to_qwen3(model=model)
    liger_rope = modeling_qwen3.apply_rotary_pos_emb
    for n, value in own.items():
        setattr(modeling_qwen3, n, value)
    model.register_forward_pre_hook(lambda *_: setattr(modeling_qwen3, names[0], liger_rope))
    model.register_forward_hook(lambda *_: setattr(modeling_qwen3, names[0], own[names[0]]), always_call=True)
    return model


BUILDERS = {
    "ltx": ltx,
    "ltx-train": ltx_train,
    "flux": flux,
    "wan": wan,
    "wan-train": wan_train,
    "qwen3": functools.partial(causal_lm, "Qwen3"),
    "qwen3-train": qwen3_train,
    "llama": functools.partial(causal_lm, "Llama"),
}
TRAINING = {"ltx-train", "qwen3-train", "wan-train"}

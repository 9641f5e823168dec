"""kgen's layers in transformers models through `kernels.kernelize` (kgen.integrations.transformers).

Without a GPU the real libraries are built and loaded, and each op gets a CPU kernel computed by its spec's
reference (in the model dtype): the marking, the mapping, the layers' bindings, the outputs and
torch.compile tracing are all checked, everything but the CUDA kernels (which tests/test_ops_gpu.py
checks). On a GPU the same checks run on the real kernels, with the Qwen3-8B and Llama-3-8B configs (two
layers)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kgen.errors import KgenError  # noqa: E402
from kgen.integrations import causal_mask  # noqa: E402
from kgen.integrations.transformers import OPS, kernelize  # noqa: E402

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
QWEN3_8B = dict(
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
)
LLAMA3_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    rms_norm_eps=1e-5,
)
SMALL = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=128,
)  # head_dim 128 as Qwen3's q_norm / k_norm
pytestmark = pytest.mark.gpu if GPU else pytest.mark.toolchain


@pytest.fixture(scope="module")
def served_ops(reference_kernels):
    """The arch to build for and {op name in its library: calls}: on a GPU the device's arch and the real
    kernels; on a CPU sm_90 and each op computed by its spec's reference."""
    return (None, Counter()) if GPU else ("sm_90", reference_kernels(OPS + ("rope", "cross_entropy")))


def model_of(kind: str, config: dict, layers: int = 2, **extra):
    torch.manual_seed(0)
    if kind == "qwen3":
        cfg, cls = (
            transformers.Qwen3Config(**config, num_hidden_layers=layers, **extra),
            transformers.Qwen3ForCausalLM,
        )
    else:
        cfg, cls = (
            transformers.LlamaConfig(**config, num_hidden_layers=layers, **extra),
            transformers.LlamaForCausalLM,
        )
    with torch.device(DEVICE):
        return cls(cfg).eval()


def logits(model, ids, dtype):
    with torch.no_grad():
        return model.to(dtype)(ids).logits.double()


def fused_norms(model) -> dict[str, str]:
    """What kernelize reports for the norms fused_add_rmsnorm serves with the residual add before them: every
    decoder layer's post_attention_layernorm, and the input_layernorm of every layer after the first."""
    layers = [n for n, m in model.named_modules() if type(m).__name__.endswith("DecoderLayer")]
    return {
        f"{n}.post_attention_layernorm": "fused_add_rmsnorm (with the attention's residual add)"
        for n in layers
    } | {
        f"{n}.input_layernorm": "fused_add_rmsnorm (with the layer before's residual add)" for n in layers[1:]
    }


def qk_norms(model) -> dict[str, str]:
    """What kernelize reports for the q/k norms qk_norm_rope serves with the rotary embedding after them:
    every Qwen3 attention's q_norm and k_norm ({} for Llama, which has none)."""
    attentions = [n for n, m in model.named_modules() if type(m).__name__ == "Qwen3Attention"]
    return {
        f"{n}.{norm}": "qk_norm_rope (with the rotary embedding)"
        for n in attentions
        for norm in ("q_norm", "k_norm")
    }


def causal_masks(model) -> dict[str, str]:
    """What kernelize reports for the causal mask it leaves to SDPA's is_causal: every Qwen3Model and
    LlamaModel."""
    models = ("Qwen3Model", "LlamaModel")
    return {n: causal_mask.SERVED for n, m in model.named_modules() if type(m).__name__ in models}


def grouped_attentions(model) -> dict[str, str]:
    """What kernelize reports for the decode steps it attends on the grouped k/v heads: every Qwen3 and Llama
    attention with fewer k/v heads than query heads."""
    from kgen.integrations import grouped_decode

    names = ("Qwen3Attention", "LlamaAttention")
    return {
        n: grouped_decode.SERVED
        for n, m in model.named_modules()
        if type(m).__name__ in names and m.num_key_value_groups > 1
    }


def check_logits_match(kind, config, served_ops, root, tokens=32, rope=False):
    """kgen's bf16 logits are as close to the fp32 model's as transformers' own bf16 logits are."""
    arch, calls = served_ops
    model = model_of(kind, config)
    ids = torch.randint(0, config["vocab_size"], (2, tokens), device=DEVICE)
    truth = logits(model, ids, torch.float32)
    eager = logits(model, ids, torch.bfloat16)
    served = kernelize(model, OPS + ("rope",) * rope, arch=arch, root=root)
    prefix = type(model).__name__.removesuffix("ForCausalLM")
    norms = [n for n, m in model.named_modules() if type(m).__name__ == f"{prefix}RMSNorm"]
    mlps = [n for n, m in model.named_modules() if type(m).__name__ == f"{prefix}MLP"]
    rotary = (
        {f"transformers.models.{kind}.modeling_{kind}.apply_rotary_pos_emb": "rope.RotaryPosEmb"}
        if rope
        else {}
    )
    fused, qk = fused_norms(model), qk_norms(model)
    assert served == {
        **{n: "rmsnorm.RMSNorm" for n in norms},
        **{n: "silu_mul.GatedMLP" for n in mlps},
        **rotary,
        **fused,
        **qk,
        **causal_masks(model),
        **grouped_attentions(model),
    }
    assert len(qk) == (2 * len(mlps) if kind == "qwen3" else 0)
    before = calls.copy()
    kgen = logits(model, ids, torch.bfloat16)
    if not GPU:
        ran = calls - before  # a Counter: 0 for an op that did not run
        assert ran["rmsnorm_transformers"] == len(norms) - len(fused) - len(qk)
        assert ran["fused_add_rmsnorm_transformers"] == len(fused)
        assert ran["qk_norm_rope"] == len(qk) // 2  # q and k in one call
        assert ran["silu_mul_transformers"] == len(mlps)
        # the rotation on request where no q/k norm comes before it (Llama)
        assert ran["rope_transformers"] == (len(mlps) if rope and not qk else 0)
    eager_err, kgen_err = (eager - truth).abs().max().item(), (kgen - truth).abs().max().item()
    assert kgen_err <= 1.5 * eager_err + 1e-3, (
        f"kgen {kgen_err:.4g} vs transformers {eager_err:.4g} from fp32"
    )
    assert torch.isfinite(kgen).all()
    return model, ids


def test_qwen3_every_rmsnorm_and_the_mlp_served_logits_match(served_ops, build_root):
    check_logits_match("qwen3", QWEN3_8B if GPU else SMALL, served_ops, build_root)


def test_llama_every_rmsnorm_and_the_mlp_served_logits_match(served_ops, build_root):
    config = LLAMA3_8B if GPU else {k: v for k, v in SMALL.items() if k != "head_dim"}
    check_logits_match("llama", config, served_ops, build_root)


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_rope_on_request(kind, served_ops, build_root, monkeypatch):
    """apply_rotary_pos_emb is a module-level function: kernels' module for it takes its place in the modeling
    file (put back after the test), and q/k arrive as transformers' transposed views."""
    modeling = getattr(transformers.models, kind)
    modeling = getattr(modeling, f"modeling_{kind}")
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    config = (
        (QWEN3_8B if GPU else SMALL)
        if kind == "qwen3"
        else (LLAMA3_8B if GPU else {k: v for k, v in SMALL.items() if k != "head_dim"})
    )
    check_logits_match(kind, config, served_ops, build_root, rope=True)
    with pytest.raises(ValueError, match="RotaryPosEmb computes unsqueeze_dim=1 only, got 2"):
        q = torch.randn(1, 2, 3, 8, device=DEVICE)
        modeling.apply_rotary_pos_emb(q, q, q[:, 0], q[:, 0], unsqueeze_dim=2)


def config_of(kind: str) -> dict:
    if kind == "qwen3":
        return QWEN3_8B if GPU else SMALL
    return LLAMA3_8B if GPU else {k: v for k, v in SMALL.items() if k != "head_dim"}


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_the_fused_residual_adds_change_no_bit(kind, served_ops, build_root):
    """fused_add_rmsnorm serving the decoder layers' residual adds (each layer handing its last add on to the
    next) gives the logits, bit for bit, of the same model with kgen's unfused RMSNorm; with
    output_hidden_states (recorded by forward hooks on the layers) each layer returns its sum as a tensor:
    the same hidden states, bit for bit, and the same logits after that too."""
    import copy

    arch, calls = served_ops
    config = config_of(kind)
    unfused = model_of(kind, config, layers=3).to(torch.bfloat16)
    fused = copy.deepcopy(unfused)
    kernelize(unfused, ("rmsnorm", "silu_mul"), arch=arch, root=build_root)
    served = kernelize(fused, ("rmsnorm", "fused_add_rmsnorm", "silu_mul"), arch=arch, root=build_root)
    assert served.items() >= fused_norms(fused).items() and len(fused_norms(fused)) == 5
    ids = torch.randint(0, config["vocab_size"], (2, 24), device=DEVICE)
    with torch.no_grad():
        before = calls.copy()
        got = fused(ids).logits
        if not GPU:
            assert calls["fused_add_rmsnorm_transformers"] - before["fused_add_rmsnorm_transformers"] == 5
        assert torch.equal(got, unfused(ids).logits)
        want, got = (m(ids, output_hidden_states=True).hidden_states for m in (unfused, fused))
        assert len(got) == len(want) == 4 and all(type(h) is torch.Tensor for h in got)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        assert torch.equal(fused(ids).logits, unfused(ids).logits)
    again = kernelize(fused, ("rmsnorm", "fused_add_rmsnorm", "silu_mul"), arch=arch, root=build_root)
    assert again == served  # the same layers, the same report
    with torch.no_grad():
        assert torch.equal(fused(ids).logits, unfused(ids).logits)


def test_a_layer_with_another_norm_takes_no_pending_add(served_ops, build_root):
    """A decoder layer whose post-attention norm is not the model's RMSNorm keeps its own forward, and the
    layer before it returns its sum as a tensor: the logits are those of kgen's unfused RMSNorm."""
    import copy

    arch, _ = served_ops
    unfused = model_of("qwen3", SMALL, layers=3).to(torch.bfloat16)
    middle = unfused.model.layers[1]
    middle.post_attention_layernorm = torch.nn.RMSNorm(
        SMALL["hidden_size"], eps=1e-6, device=DEVICE, dtype=torch.bfloat16
    )
    fused = copy.deepcopy(unfused)
    kernelize(unfused, ("rmsnorm", "silu_mul"), arch=arch, root=build_root)
    served = kernelize(fused, ("rmsnorm", "fused_add_rmsnorm", "silu_mul"), arch=arch, root=build_root)
    assert {n for n, v in served.items() if v.startswith("fused_add_rmsnorm")} == {
        "model.layers.0.post_attention_layernorm",
        "model.layers.2.post_attention_layernorm",
    }
    assert fused.model.layers[1].forward.__func__ is type(middle).forward
    ids = torch.randint(0, SMALL["vocab_size"], (2, 24), device=DEVICE)
    with torch.no_grad():
        assert torch.equal(fused(ids).logits, unfused(ids).logits)


def same_logits(got, want):
    """On a CPU bit for bit (the reference kernels round as the model: the normed values, then each rotation
    product, in the dtype); on a GPU the fused kernel's fp32 sum of a head's squares may round a normed value
    one unit apart from kgen's RMSNorm's (test_rotary_norm_gpu counts those), so close."""
    if GPU:
        assert (got.double() - want.double()).abs().max().item() <= 0.02 * want.abs().max().item()
    else:
        assert torch.equal(got, want)


def test_qwen3_q_k_norms_and_rotation_in_one_pass(served_ops, build_root):
    """qk_norm_rope serves each Qwen3 attention's q_norm and k_norm with the rotary embedding after them, one
    call per attention: the logits of kgen's unfused RMSNorm and transformers' rotation, and with a dynamic
    and a static cache (passed by name through the decoder layers) the same greedy tokens; kernelize again
    gives the same report."""
    import copy

    arch, calls = served_ops
    unfused = model_of("qwen3", SMALL, layers=3).to(torch.bfloat16)
    fused = copy.deepcopy(unfused)
    kernelize(unfused, ("rmsnorm", "fused_add_rmsnorm", "silu_mul"), arch=arch, root=build_root)
    served = kernelize(fused, arch=arch, root=build_root)
    qk = qk_norms(fused)
    assert served.items() >= qk.items() and len(qk) == 6
    attention = fused.model.layers[0].self_attn
    assert isinstance(attention, transformers.models.qwen3.modeling_qwen3.Qwen3Attention)
    ids = torch.randint(0, SMALL["vocab_size"], (2, 24), device=DEVICE)
    with torch.no_grad():
        before = calls.copy()
        got = fused(ids).logits
        if not GPU:
            assert calls["qk_norm_rope"] - before["qk_norm_rope"] == 3
            assert calls["rmsnorm_transformers"] - before["rmsnorm_transformers"] == 2  # the first and final
        same_logits(got, unfused(ids).logits)
    for cache in ("dynamic", "static"):
        tokens = [
            m.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation=cache, pad_token_id=0)
            for m in (fused, unfused)
        ]
        assert tokens[0].shape == (2, 28) and (GPU or torch.equal(*tokens)), cache
    assert kernelize(fused, arch=arch, root=build_root) == served


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_a_decode_step_attends_on_the_grouped_heads(kind, served_ops, build_root, monkeypatch):
    """With a static cache each decode step (one query token, a mask) of a served attention runs SDPA on the
    grouped k/v heads, not the model's attention function (which copies k and v out to every query head
    there on transformers < 5.24, and under torch.compile on any); the prefill (many tokens) is the model's
    function, and so is every step with grouped_decode=False; the greedy tokens are the same."""
    import copy

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from kgen.integrations import grouped_decode

    arch, _ = served_ops
    plain = model_of(kind, SMALL, layers=2).to(torch.bfloat16)
    grouped = copy.deepcopy(plain)
    assert not set(kernelize(plain, arch=arch, root=build_root, grouped_decode=False).values()) & {
        grouped_decode.SERVED
    }
    assert kernelize(grouped, arch=arch, root=build_root).items() >= grouped_attentions(grouped).items()
    assert len(grouped_attentions(grouped)) == 2
    sdpa, queries = ALL_ATTENTION_FUNCTIONS["sdpa"], Counter()

    def counted(module, q, *args, **kwargs):
        queries[q.shape[2]] += 1
        return sdpa(module, q, *args, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", counted)
    ids = torch.randint(0, SMALL["vocab_size"], (2, 24), device=DEVICE)
    tokens = []
    for model in (grouped, plain):
        queries.clear()
        tokens.append(
            model.generate(
                ids, max_new_tokens=4, do_sample=False, cache_implementation="static", pad_token_id=0
            )
        )
        assert queries[24] == 2, model  # the prefill: the model's function in both layers
        assert queries[1] == (0 if model is grouped else 6), model  # 3 decode steps × 2 layers
    assert tokens[0].shape == (2, 28) and (GPU or torch.equal(*tokens))


def test_the_registry_view_groups_only_sdpa_for_served_modules():
    """The modeling file's registry view: another implementation is the registry's own; "sdpa" one wrapper
    that attends on the grouped heads only for a served module's masked decode step."""
    from types import SimpleNamespace

    from kgen.integrations.grouped_decode import _Registry

    calls = []

    def sdpa(module, q, k, v, mask, **kwargs):
        calls.append(q.shape)
        return "the model's", None

    class Registry(dict):
        def get_interface(self, name, default):
            return self.get(name, default)

    other = object()
    view = _Registry(Registry(sdpa=sdpa, flash=other))
    assert view.get_interface("flash", None) is other and view["flash"] is other
    attend = view.get_interface("sdpa", None)
    assert attend is view["sdpa"] and attend is not sdpa
    q, k = torch.randn(2, 8, 1, 4), torch.randn(2, 2, 9, 4)
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    served = SimpleNamespace(kgen_grouped_decode=True)
    out, weights = attend(served, q, k, k, mask, scaling=0.5)
    assert out.shape == (2, 1, 8, 4) and weights is None and not calls
    assert attend(SimpleNamespace(), q, k, k, mask)[0] == "the model's"  # not served
    assert attend(served, q, k, k, None)[0] == "the model's"  # no mask: SDPA's enable_gqa serves it
    assert len(calls) == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_grouped_decode_attention_is_as_exact_as_the_models(dtype):
    """SDPA on the grouped heads against SDPA on k and v copied out to every head (transformers' repeat_kv)
    and both against float64: its error no larger than the copy's (× 1.5 plus one unit of the dtype at the
    outputs' size; the same scores, softmax and sums, in another kernel launch shape)."""
    from transformers.integrations.sdpa_attention import repeat_kv

    from kgen.integrations.grouped_decode import _attend_grouped

    batch, heads, kv_heads, keys, dim = 3, 8, 2, 77, 128
    torch.manual_seed(0)
    q = torch.randn(batch, 1, heads, dim, device=DEVICE).to(dtype).transpose(1, 2)  # as the model's view
    k, v = (torch.randn(batch, kv_heads, keys, dim, device=DEVICE).to(dtype) for _ in range(2))
    mask = torch.rand(batch, 1, 1, keys, device=DEVICE) < 0.6
    mask[..., 0] = True
    scaling = dim**-0.5
    got = _attend_grouped(q, k, v, mask, scaling)

    def sdpa(q, k, v):
        groups = heads // kv_heads
        out = torch.nn.functional.scaled_dot_product_attention(
            q, repeat_kv(k, groups), repeat_kv(v, groups), attn_mask=mask, scale=scaling
        )
        return out.transpose(1, 2)

    want, truth = sdpa(q, k, v), sdpa(q.double(), k.double(), v.double())
    assert got.shape == want.shape == (batch, 1, heads, dim) and got.dtype == dtype
    unit = torch.finfo(dtype).eps * truth.abs().max().item()
    error = [(t.double() - truth).abs().max().item() for t in (got, want)]
    assert error[0] <= 1.5 * error[1] + unit, error


def test_only_a_masked_grouped_decode_step_is_attended_on_the_grouped_heads():
    """The grouped call is for SDPA's copy only: not without a mask (SDPA's enable_gqa serves it), at many
    query tokens, without grouped heads, with a mask per head, with dropout or scores asked for."""
    from kgen.integrations.grouped_decode import _grouped_decode

    q, k, mask = torch.zeros(2, 8, 1, 4), torch.zeros(2, 2, 9, 4), torch.ones(2, 1, 1, 9, dtype=torch.bool)
    assert _grouped_decode(q, k, mask, {"dropout": 0.0, "scaling": 0.5})
    assert _grouped_decode(q, k, mask[:1], {})  # one mask for the batch
    refused = [
        (q, k, None, {}),
        (torch.zeros(2, 8, 3, 4), k, torch.ones(2, 1, 3, 9, dtype=torch.bool), {}),
        (q, torch.zeros(2, 8, 9, 4), mask, {}),
        (q, torch.zeros(2, 3, 9, 4), mask, {}),
        (q, k, torch.ones(2, 8, 1, 9, dtype=torch.bool), {}),  # a mask per head
        (q, k, mask, {"dropout": 0.1}),
        (q, k, mask, {"output_attentions": True}),
    ]
    for case in refused:
        assert not _grouped_decode(*case), case


def test_an_attention_the_kernel_does_not_fit_runs_the_models_norms(served_ops, build_root):
    """Where a call does not fit qk_norm_rope (here k_norm's eps unlike q_norm's), that attention runs its
    norms (kgen's RMSNorm) and transformers' rotation: the unfused model's logits; an attention whose q_norm
    is another norm keeps the model's forward and is not reported."""
    import copy

    arch, calls = served_ops
    unfused = model_of("qwen3", SMALL, layers=3).to(torch.bfloat16)
    unfused.model.layers[1].self_attn.k_norm.variance_epsilon = 1e-5
    unfused.model.layers[2].self_attn.q_norm = torch.nn.RMSNorm(
        SMALL["head_dim"], eps=1e-6, device=DEVICE, dtype=torch.bfloat16
    )
    fused = copy.deepcopy(unfused)
    kernelize(unfused, ("rmsnorm", "fused_add_rmsnorm", "silu_mul"), arch=arch, root=build_root)
    served = kernelize(fused, arch=arch, root=build_root)
    assert {n for n, v in served.items() if v.startswith("qk_norm_rope")} == {
        f"model.layers.{i}.self_attn.{norm}" for i in (0, 1) for norm in ("q_norm", "k_norm")
    }
    kept = fused.model.layers[2].self_attn
    assert type(kept).forward is transformers.models.qwen3.modeling_qwen3.Qwen3Attention.forward
    ids = torch.randint(0, SMALL["vocab_size"], (2, 24), device=DEVICE)
    with torch.no_grad():
        before = calls.copy()
        got = fused(ids).logits
        if not GPU:
            assert calls["qk_norm_rope"] - before["qk_norm_rope"] == 1
        same_logits(got, unfused(ids).logits)


@pytest.mark.parametrize(
    "half_pairs, element_size, over, smallest, largest",
    [
        (True, 2, "head", 16, 4096),
        (True, 4, "head", 8, 2048),
        (False, 2, "head", 8, 2048),
        (False, 4, "head", 4, 1024),
        (False, 2, "token", 8, 256),
        (False, 4, "token", 4, 128),
    ],
)
def test_the_fused_q_k_norms_fit_the_head_sizes_their_launcher_serves(
    half_pairs, element_size, over, smallest, largest
):
    """The integrations' per-call test (qk_norm_rope here, the Flux, Wan and LTX-Video ones interleaved): a
    lane keeps a 16-byte access (of each half for rotate_half) and a head's lanes are a power of two up to a
    256-thread block's (a token's, Wan's: up to a warp), so the head sizes are smallest·2^k up to largest
    (README: qk_norm_rope 16·2^k up to 4096 in 16-bit)."""
    from kgen.integrations._rotary_fit import lanes_fit

    sizes = [smallest << k for k in range(9 if over == "head" else 6)]
    assert sizes[-1] == largest
    assert [d for d in range(1, 4 * largest) if lanes_fit(d, element_size, half_pairs, over)] == sizes


def test_an_mlp_without_silu_keeps_its_forward(served_ops, build_root):
    model = model_of("qwen3", SMALL, layers=1, hidden_act="gelu_pytorch_tanh")
    served = kernelize(model, arch=served_ops[0], root=build_root)
    assert "model.layers.0.mlp" not in served and "model.layers.0.input_layernorm" in served
    assert (
        model.model.layers[0].mlp.forward.__func__
        is transformers.models.qwen3.modeling_qwen3.Qwen3MLP.forward
    )


def test_a_model_it_does_not_know_is_refused(served_ops, build_root):
    with pytest.raises(
        KgenError,
        match=r"Sequential: no module is one that kgen's rmsnorm, fused_add_rmsnorm, qk_norm_rope, silu_mul "
        r"layers replace \(.*LlamaDecoderLayer.*LlamaRMSNorm.*Qwen3Attention.*Qwen3DecoderLayer.*Qwen3MLP",
    ):
        kernelize(torch.nn.Sequential(torch.nn.Linear(4, 4)), arch=served_ops[0], root=build_root)


def test_compiles_whole_with_no_graph_breaks(served_ops, build_root):
    model, ids = check_logits_match("qwen3", SMALL, served_ops, build_root, tokens=16)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(ids)
    assert explained.graph_break_count == 0, explained.break_reasons
    code = "".join(g.code for g in explained.graphs)
    in_graph = ("rmsnorm_transformers", "fused_add_rmsnorm_transformers", "qk_norm_rope")
    in_graph += ("silu_mul_transformers",)
    assert all(op in code for op in in_graph)  # in the graph, not around it
    eager = logits(model, ids, torch.bfloat16)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True)(ids).logits.double()
    assert (compiled - eager).abs().max().item() <= 0.05 * eager.abs().max().item()


def sdpa_masks(model, ids, **kwargs) -> list[tuple[bool, bool]]:
    """(a mask given, is_causal) of every SDPA call in the graph dynamo traces of ``model(ids, **kwargs)``."""
    found = []

    def backend(gm, inputs):
        calls = [n for n in gm.graph.nodes if "scaled_dot_product_attention" in str(n.target)]
        found.extend((n.kwargs.get("attn_mask") is not None, n.kwargs.get("is_causal")) for n in calls)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True)(ids, **kwargs)
    return found


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_compiled_model_attends_causally_without_a_mask(kind, served_ops, build_root):
    """Under torch.compile a Qwen3 / Llama call with no attention mask, no position ids and no cache attends
    with is_causal and no mask, as in eager (transformers alone materializes one: it cannot check the
    positions for packing while tracing), with a fresh cache too; a call with padding or its own positions
    keeps the model's mask, and so does a model of the same kind that kgen does not serve, called after a
    served one (Llama's flag is the call's); the logits match eager's."""
    config = SMALL if kind == "qwen3" else {k: v for k, v in SMALL.items() if k != "head_dim"}
    model, unserved = model_of(kind, config), model_of(kind, config)
    ids = torch.randint(0, SMALL["vocab_size"], (2, 16), device=DEVICE)
    layers = model.config.num_hidden_layers
    masked = [(True, False)] * layers
    assert sdpa_masks(model, ids, use_cache=False) == masked
    served = kernelize(model, OPS, arch=served_ops[0], root=build_root)
    assert served.items() >= causal_masks(model).items() and len(causal_masks(model)) == 1
    for cache in (False, True):
        assert sdpa_masks(model, ids, use_cache=cache) == [(False, True)] * layers
    padded = torch.ones_like(ids)
    padded[0, :3] = 0
    positions = torch.arange(16, device=DEVICE)[None]
    for given in (dict(attention_mask=padded), dict(position_ids=positions)):
        assert sdpa_masks(model, ids, use_cache=False, **given) == masked
    with torch.no_grad():
        model(ids, use_cache=False)
    assert sdpa_masks(unserved, ids, use_cache=False) == masked
    model.to(torch.bfloat16)
    eager = logits(model, ids, torch.bfloat16)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True)(ids).logits.double()
    assert (compiled - eager).abs().max().item() <= 0.05 * eager.abs().max().item()


def test_a_training_step_compiles_whole(served_ops, build_root):
    """kernelize(mode=Mode.TRAINING): dynamo traces a training step's forward (the loss included) as one
    graph, kgen's layers and the q/k norms fused with the rotation inside it, kgen's rope nowhere;
    the loss served on request is transformers' own there (Inductor fuses it with the returned logits'
    gradient)."""
    from kernels import Mode

    arch, calls = served_ops
    model = model_of("qwen3", SMALL).train().to(torch.bfloat16)
    kernelize(model, OPS + ("cross_entropy",), arch=arch, root=build_root, mode=Mode.TRAINING)
    ids, labels = (torch.randint(0, SMALL["vocab_size"], (2, 16), device=DEVICE) for _ in range(2))
    torch._dynamo.reset()
    before = calls.copy()
    explained = torch._dynamo.explain(lambda i, y: model(i, labels=y, use_cache=False).loss)(ids, labels)
    assert explained.graph_break_count == 0, explained.break_reasons
    code = "".join(g.code for g in explained.graphs)
    assert all(op in code for op in ("rmsnorm_transformers", "silu_mul_transformers", "qk_norm_rope"))
    assert "rope_transformers" not in code.replace("qk_norm_rope", "")
    assert "torch.nn.functional.cross_entropy" in code
    assert calls["cross_entropy"] == before["cross_entropy"]


@pytest.mark.skipif(not GPU, reason="CUDA graphs need a CUDA device")
def test_reduce_overhead_captures_and_replays(served_ops, build_root):
    from torch._dynamo.utils import counters

    model, ids = check_logits_match("qwen3", SMALL, served_ops, build_root, tokens=16)
    eager = logits(model, ids, torch.bfloat16)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        outs = [compiled(ids).logits.double().clone() for _ in range(4)]  # warm-up, record, replays
    assert counters["inductor"]["cudagraph_skips"] == 0
    for out in outs:
        assert (out - eager).abs().max().item() <= 0.05 * eager.abs().max().item()


def grads(model, ids, labels) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(ids, labels=labels).loss.backward()
    return {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_training_mode_gradients_of_every_parameter_flow(kind, rope, served_ops, build_root, monkeypatch):
    """kernelize(mode=Mode.TRAINING) serves the norms and MLPs (their layers have derived backwards), and the
    rotary embedding on request; one training step's bf16 gradients of every parameter are as close to the
    fp32 model's as transformers' own bf16 gradients are."""
    import copy

    from kernels import Mode

    arch, calls = served_ops
    modeling = getattr(getattr(transformers.models, kind), f"modeling_{kind}")
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)  # put back after
    config = SMALL if kind == "qwen3" else {k: v for k, v in SMALL.items() if k != "head_dim"}
    model = model_of(kind, config).train()
    ids, labels = (torch.randint(0, config["vocab_size"], (2, 16), device=DEVICE) for _ in range(2))
    truth = grads(model, ids, labels)
    eager = grads(copy.deepcopy(model).to(torch.bfloat16), ids, labels)
    kgen = copy.deepcopy(model).to(torch.bfloat16)
    served = kernelize(kgen, OPS + ("rope",) * rope, arch=arch, root=build_root, mode=Mode.TRAINING)
    fused, qk, masks = fused_norms(kgen), qk_norms(kgen), causal_masks(kgen) | grouped_attentions(kgen)
    assert served.items() >= (fused | qk | masks).items()
    assert set(served.values()) - set((fused | qk | masks).values()) == {
        "rmsnorm.RMSNorm",
        "silu_mul.GatedMLP",
    } | ({"rope.RotaryPosEmb"} if rope else set())
    before = calls.copy()
    got = grads(kgen, ids, labels)
    if not GPU:  # the derived backwards ran, once per served module (rope's once per layer)
        norms = sum(v == "rmsnorm.RMSNorm" for v in served.values())
        assert calls["rmsnorm_backward_transformers"] - before["rmsnorm_backward_transformers"] == norms
        assert calls["silu_mul_backward_transformers"] - before["silu_mul_backward_transformers"] > 0
        layers = model.config.num_hidden_layers
        added = (
            calls["fused_add_rmsnorm_backward_transformers"]
            - before["fused_add_rmsnorm_backward_transformers"]
        )
        assert added == 2 * layers - 1
        qk_calls = calls["qk_norm_rope_backward"] - before["qk_norm_rope_backward"]
        assert qk_calls == len(qk) // 2  # q's and k's gradients in one call per layer
        rotations = calls["rope_backward_transformers"] - before["rope_backward_transformers"]
        assert rotations == (layers * rope if not qk else 0)  # the rotation on request: Llama's
    assert got.keys() == truth.keys() == dict(model.named_parameters()).keys()
    for name, want in truth.items():
        eager_err, kgen_err = (eager[name] - want).abs().max().item(), (got[name] - want).abs().max().item()
        assert torch.isfinite(got[name]).all(), name
        assert kgen_err <= 1.5 * eager_err + 1e-3 * want.abs().max().item(), (
            f"{name}: kgen {kgen_err:.4g} vs transformers {eager_err:.4g} from fp32"
        )


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_a_training_step_saves_no_more_than_eager(kind, served_ops, build_root):
    """Issue 13's memory bar on a model: what autograd keeps for the backward of one bf16 training step with
    kgen's norms, fused adds, q/k norms with the rotation, MLP and loss (each storage counted once: a view
    of a kept tensor adds nothing; the weights, which both keep, left out) is no more than transformers' own
    step keeps."""
    import copy

    from kernels import Mode

    arch, _ = served_ops
    config = SMALL if kind == "qwen3" else {k: v for k, v in SMALL.items() if k != "head_dim"}
    model = model_of(kind, config).to(torch.bfloat16).train()
    kgen = copy.deepcopy(model)
    kernelize(kgen, OPS + ("cross_entropy",), arch=arch, root=build_root, mode=Mode.TRAINING)
    ids, labels = (torch.randint(0, config["vocab_size"], (2, 16), device=DEVICE) for _ in range(2))

    def saved_bytes(m) -> int:
        storages, weights = {}, {p.untyped_storage().data_ptr() for p in m.parameters()}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = m(ids, labels=labels).loss
        loss.backward()
        return sum(n for ptr, n in storages.items() if ptr not in weights)

    kept, own = saved_bytes(kgen), saved_bytes(model)
    assert kept <= own, f"kgen's step keeps {kept} bytes for its backward, transformers' {own}"


def test_the_fused_add_saves_its_sum_not_its_inputs(served_ops, build_root):
    """fused_add_rmsnorm's autograd saves residual_out (which the next decoder layer holds anyway) and the
    weight, not x and residual: a layer's attention and MLP outputs are freed after their add. Its backward
    gives x and residual the same gradient."""
    from kgen.builder import build_op, device_arch, load

    arch, _ = served_ops
    op = load(build_op("fused_add_rmsnorm", arch or device_arch(), build_root)).fused_add_rmsnorm
    x, residual = (torch.randn(4, 256, device=DEVICE, dtype=torch.bfloat16).requires_grad_() for _ in "xr")
    weight = torch.rand(256, device=DEVICE, dtype=torch.bfloat16).add(0.5).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out, residual_out = op(x, residual, weight, 1e-6, convention="transformers")
    assert {t.data_ptr() for t in saved} == {residual_out.data_ptr(), weight.data_ptr()}
    (out.float().pow(2).sum() + residual_out.float().sum()).backward()
    assert torch.equal(x.grad, residual.grad) and weight.grad.abs().sum() > 0


@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing_keeps_every_gradient(reentrant, served_ops, build_root):
    """Under gradient checkpointing (transformers' reentrant form differentiates only the tensors a layer is
    given) each layer returns its sum as a tensor: every parameter's bf16 gradient is as close to the fp32
    model's as transformers' own, as without checkpointing."""
    import copy

    from kernels import Mode

    arch, calls = served_ops
    model = model_of("qwen3", SMALL, layers=3).train()
    ids, labels = (torch.randint(0, SMALL["vocab_size"], (2, 16), device=DEVICE) for _ in range(2))
    truth = grads(model, ids, labels)
    eager = grads(copy.deepcopy(model).to(torch.bfloat16), ids, labels)
    kgen = copy.deepcopy(model).to(torch.bfloat16)
    kgen.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    kernelize(kgen, arch=arch, root=build_root, mode=Mode.TRAINING)
    before = calls.copy()
    got = grads(kgen, ids, labels)
    if not GPU:  # the attention's add fused in each layer, run again by the checkpoint
        assert calls["fused_add_rmsnorm_transformers"] - before["fused_add_rmsnorm_transformers"] == 6
    assert got.keys() == truth.keys()
    for name, want in truth.items():
        eager_err, kgen_err = (eager[name] - want).abs().max().item(), (got[name] - want).abs().max().item()
        assert kgen_err <= 1.5 * eager_err + 1e-3 * want.abs().max().item(), (
            f"{name}: kgen {kgen_err:.4g} vs transformers {eager_err:.4g} from fp32"
        )


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_the_loss_on_request_matches_and_its_gradients_flow(kind, served_ops, build_root):
    """kernelize(..., OPS + ("cross_entropy",)) serves the causal-LM loss (the model's loss_function) with
    kgen's cross-entropy on the bf16 logits: the loss and every parameter's bf16 gradient are as close to the
    fp32 model's as transformers' own bf16 ones (which copy the logits to fp32 first); -100 labels ignored."""
    import copy

    from kernels import Mode

    arch, calls = served_ops
    config = SMALL if kind == "qwen3" else {k: v for k, v in SMALL.items() if k != "head_dim"}
    model = model_of(kind, config).train()
    ids, labels = (torch.randint(0, config["vocab_size"], (2, 16), device=DEVICE) for _ in range(2))
    labels[:, :3] = -100
    truth = grads(model, ids, labels)
    eager_model = copy.deepcopy(model).to(torch.bfloat16)
    eager = grads(eager_model, ids, labels)
    kgen = copy.deepcopy(model).to(torch.bfloat16)
    served = kernelize(kgen, OPS + ("cross_entropy",), arch=arch, root=build_root, mode=Mode.TRAINING)
    assert served["loss_function"] == "cross_entropy (causal LM loss)"
    before = calls.copy()
    got = grads(kgen, ids, labels)
    if not GPU:  # the loss and its derived backward ran once each
        assert calls["cross_entropy"] - before["cross_entropy"] == 1
        assert calls["cross_entropy_backward"] - before["cross_entropy_backward"] == 1
    with torch.no_grad():
        want_loss = model(ids, labels=labels).loss.item()
        eager_loss, kgen_loss = (m(ids, labels=labels).loss.item() for m in (eager_model, kgen))
    assert abs(kgen_loss - want_loss) <= 1.5 * abs(eager_loss - want_loss) + 1e-3
    assert got.keys() == truth.keys()
    for name, want in truth.items():
        eager_err, kgen_err = (eager[name] - want).abs().max().item(), (got[name] - want).abs().max().item()
        assert torch.isfinite(got[name]).all(), name
        assert kgen_err <= 1.5 * eager_err + 1e-3 * want.abs().max().item(), (
            f"{name}: kgen {kgen_err:.4g} vs transformers {eager_err:.4g} from fp32"
        )

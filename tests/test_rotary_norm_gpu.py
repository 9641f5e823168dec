"""Rotary ops with a norm before the rotation (qk_norm_rope_flux: RMSNorm over each head; qk_norm_rope_wan:
over every head of a token; qk_norm_rope: Qwen3's norm over each head, rotate_half pairs, cos/sin tables;
qk_norm_rope3d: LTX-Video's over a token's C channels, one head of [B, S, C]) on
the GPU: hypothesis property tests against the float64 references (head sizes up to a block's lanes,
heads, tokens, dtypes, magnitudes, layouts as the models pass them), the two-op pipelines they replace (kgen's
rmsnorm then rope_flux / rope_wan, and the spec's diffusers peer), a NaN staying in its head or token, the
refused head sizes and weights, opcheck and torch.compile. The derived backward (both ops): gradients of q, k
and both weights against float64 autograd of the reference, no worse than the library's own bf16 autograd; the
weights' sums bitwise equal run to run; a NaN staying in its head or token; opcheck with inputs that require
grad, and a compiled training step."""

from __future__ import annotations

import pytest
import torch
from conftest import REFUSAL, fit_axis_dims, refused, usable_dtype
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgen.catalog import load_spec, op_names
from kgen.families import family_of

pytestmark = pytest.mark.gpu

NORMED = [op for op in op_names() if getattr(load_spec(op).structure, "norm", None) is not None]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ULP = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
# the rotation each fuses, and the convention of that and of kgen's rmsnorm that the op's numerics are
PIPELINE = {
    "qk_norm_rope_flux": "rope_flux",
    "qk_norm_rope_wan": "rope_wan",
    "qk_norm_rope": "rope",
    "qk_norm_rope3d": "rope3d_qk",
}
# ops on [B, S, C]: a token's C channels are one head (LTX-Video's q and k before the head split)
TOKEN_ROWS = {"qk_norm_rope3d"}
CONVENTION = {"qk_norm_rope": {"convention": "transformers"}}
RMSNORM_REF = load_spec("rmsnorm").reference  # float64 x · rsqrt(mean(x²) + eps) · weight over the last dim
TRAINED = [op for op in NORMED if family_of(load_spec(op)).backward(load_spec(op)) is not None]


@pytest.fixture(scope="module")
def ops(built):
    return {op: getattr(built(op)[1], op) for op in [*NORMED, *PIPELINE.values(), "rmsnorm"]}


def grid_of(tokens: int) -> list[int]:
    """frames, height, width with that many tokens (frames·height·width, row-major)."""
    for frames in (3, 2, 1):
        if tokens % frames == 0:
            rest = tokens // frames
            height = next(h for h in (4, 3, 2, 1) if rest % h == 0)
            return [frames, height, rest // height]
    raise AssertionError


def make_call(op, dtype, gen, batch, heads, tokens, hidden, layout="bshd", magnitude=1.0, k_heads=None):
    """Inputs and params: q and k [B, H, S, D] as views of [B, S, H, D] heads ("bshd", as the models pass
    them), contiguous, or one element off 16-byte alignment ("misaligned": the scalar path); weights around 1;
    Flux's positions whole numbers up to about 2000; Wan's and LTX-Video's grid of the tokens; cos and sin
    tables [1, S, D] in the dtype, as a transformers model's rotary embedding gives them (each frequency
    twice: rotate_half). TOKEN_ROWS ops take [B, S, C] (C = hidden, no heads): "bshd" is then every other
    row of [B, 2S, C] (rows 2C apart, as a strided view)."""
    spec = load_spec(op)
    k_heads = k_heads or heads

    def heads_tensor(h):
        h = 1 if op in TOKEN_ROWS else h
        raw = torch.randn(batch * tokens * h * hidden + 1, generator=gen, device="cuda") * magnitude
        raw = raw.to(dtype)
        if op in TOKEN_ROWS:
            if layout == "bshd":
                wide = torch.randn(batch, 2 * tokens, hidden, generator=gen, device="cuda") * magnitude
                return wide.to(dtype)[:, ::2]
            return (raw[1:] if layout == "misaligned" else raw[:-1]).view(batch, tokens, hidden)
        if layout == "misaligned":
            return raw[1:].view(batch, h, tokens, hidden)
        if layout == "bshd":
            return raw[:-1].view(batch, tokens, h, hidden).transpose(1, 2)
        return raw[:-1].view(batch, h, tokens, hidden)

    over_token = spec.structure.norm.over == "token"

    def weight(h):
        n = hidden * (h if over_token else 1)
        return (1 + 0.5 * torch.randn(n, generator=gen, device="cuda")).to(dtype)

    inputs = [heads_tensor(heads), heads_tensor(k_heads), weight(heads), weight(k_heads)]
    params = [p.default for p in spec.params]
    named = {p.name: i for i, p in enumerate(spec.params)}
    if "positions" in {t.name for t in spec.inputs}:
        positions = (torch.randn(1, 3, tokens, generator=gen, device="cuda").abs() * 700).round()
        inputs.append(positions.expand(batch, -1, -1))
    elif spec.structure.tables:
        frequencies = 1e6 ** -(torch.arange(0, hidden, 2, device="cuda", dtype=torch.float64) / hidden)
        angles = torch.arange(tokens, device="cuda", dtype=torch.float64)[:, None] * frequencies
        angles = torch.cat([angles, angles], dim=-1)[None]
        inputs += [angles.cos().to(dtype), angles.sin().to(dtype)]
    else:
        params[:3] = grid_of(tokens)
    params = fit_axis_dims(spec, hidden, params)
    params[named["eps"]] = 1e-6
    return inputs, params


def check(op, outs, inputs, params):
    """Each output within one rounding of the float64 reference, for the rotated values the reference
    normalizes (a normed value one unit in the last place apart where the fp32 sum rounds a tie the other
    way is within the bound)."""
    spec = load_spec(op)
    want = spec.reference(*inputs, *params)
    if spec.structure.tables:
        cos, sin = inputs[4:6]
    else:
        pipeline = load_spec(PIPELINE[op])
        cos, sin = pipeline.reference(*inputs[:2], *inputs[4:], *params[:-1], tables=True)
    if inputs[0].dim() == 4:  # [B or 1, S, D] tables beside [B, H, S, D]
        cos, sin = (
            (cos.unsqueeze(1) if cos.dim() == 3 else cos),
            (sin.unsqueeze(1) if sin.dim() == 3 else sin),
        )
    over_token = spec.structure.norm.over == "token"
    for out, w, x, weight in zip(outs, want, inputs[:2], inputs[2:4]):
        assert out.shape == x.shape and out.dtype == x.dtype
        normed = norm_reference(x, weight, params[-1], over_token)
        if spec.structure.pairing == "half":
            partner = torch.cat(normed.chunk(2, dim=-1)[::-1], dim=-1)
        else:
            partner = normed.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
        magnitude = normed.abs() * cos.double().abs() + partner.abs() * sin.double().abs()
        # 16-bit: a normed value one unit apart; float32: the fp32 sum of squares and rsqrtf (a few units);
        # where each rotation product is rounded to the dtype (transformers'), that unit may flip its rounding
        ulp, normed_error = ULP[x.dtype], max(ULP[x.dtype], 2.0**-18)
        normed_error *= 2 if op in CONVENTION else 1
        bound = ulp * w.abs() + (normed_error + 4 * 2.0**-24) * magnitude
        bound += torch.finfo(x.dtype).smallest_normal * ulp
        bad = (out.double() - w).abs() > bound
        if bad.any():
            i = bad.flatten().nonzero()[0].item()
            raise AssertionError(
                f"{op}: {int(bad.sum())} of {bad.numel()} off; e.g. got {out.flatten()[i].item()!r}, want "
                f"{w.flatten()[i].item()!r}"
            )


def norm_reference(x, weight, eps, over_token):
    """The normalized x as float64 of its dtype's values (rmsnorm's reference, rounded as the module's
    output): the rotation's input in the reference. Over a token: over [B, S, H·D], as the model's norm sees
    the projection."""
    if not over_token:
        return RMSNORM_REF(x, weight, eps).to(x.dtype).double()
    flat = x.transpose(1, 2).flatten(2)
    normed = RMSNORM_REF(flat, weight, eps).to(x.dtype).double()
    return normed.unflatten(2, (x.shape[1], x.shape[3])).transpose(1, 2)


def most_lanes(op: str) -> int:
    """The lanes that may sum a head: a warp's over a token, a 256-thread block's over a head."""
    return 32 if load_spec(op).structure.norm.over == "token" else 256


@st.composite
def cases(draw, ops=NORMED):
    dtype, op = draw(st.sampled_from(DTYPES)), draw(st.sampled_from(ops))
    # a lane's 16-byte access (of each half of a head, with rotate_half pairs); 1 to most_lanes sum a head
    elems = 16 // dtype.itemsize * (2 if load_spec(op).structure.pairing == "half" else 1)
    sizes = [
        d for d in (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if elems <= d <= most_lanes(op) * elems
    ]
    hidden = draw(st.sampled_from(sizes))
    return dict(
        op=op,
        dtype=dtype,
        batch=draw(st.integers(1, 3)),
        # 48: Wan's backward holds q's and k's 96 heads of 128 16-bit channels in no block (its other path);
        # heads wider than 512 channels (a head across warps) come few to a token
        heads=draw(st.sampled_from([1, 2, 3, 12, 48] if hidden <= 512 else [1, 2, 3])),
        tokens=draw(st.sampled_from([1, 2, 7, 24, 60, 257])),
        hidden=hidden,
        layout=draw(st.sampled_from(["bshd", "contiguous", "misaligned"])),
        magnitude=draw(st.sampled_from([1e-3, 1.0, 300.0])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_matches_reference(ops, case):
    op, dtype = case["op"], case["dtype"]
    gen = torch.Generator(device="cuda").manual_seed(case["seed"])
    keys = ("batch", "heads", "tokens", "hidden", "layout", "magnitude")
    inputs, params = make_call(op, dtype, gen, *(case[k] for k in keys))
    if refused(dtype):
        with pytest.raises(TypeError, match=REFUSAL):
            ops[op](*inputs, *params)
        return
    check(op, ops[op](*inputs, *params), inputs, params)


@pytest.mark.parametrize("op", NORMED)
@pytest.mark.parametrize("shape", [(1, 24, 4608, 128), (1, 12, 2 * 30 * 52, 128)])
def test_equals_the_two_ops_it_replaces(ops, record_property, op, shape):
    """Against kgen's rmsnorm then the rotation op (what the model integrations ran before) at a model's
    shape (LTX-Video's [2, 2688, 2048] and a [1, 3120, 1024] for the [B, S, C] op): equal but where the two
    reductions' fp32 sums round a normed value apart (counted; at most one in a thousand, each within the
    reference's bound); and against the spec's peer (F.rms_norm, then diffusers' apply_rotary_emb with fp32
    tables) within the same bound."""
    dtype = usable_dtype()
    if op in TOKEN_ROWS:
        shape = (2, 1, 2688, 2048) if shape[1] == 24 else (1, 1, 3120, 1024)
    gen = torch.Generator(device="cuda").manual_seed(sum(shape))
    batch, heads, tokens, hidden = shape
    inputs, params = make_call(op, dtype, gen, batch, heads, tokens, hidden)
    got = ops[op](*inputs, *params)
    check(op, got, inputs, params)
    x, k, xw, kw, *rest = inputs
    eps, rope_params = params[-1], params[:-1]
    convention = CONVENTION.get(op, {})
    if load_spec(op).structure.norm.over == "head":
        normed = [ops["rmsnorm"](t, w, eps, **convention) for t, w in ((x, xw), (k, kw))]
    else:  # over [B, S, H·D], as the model's norm sees the projection
        normed = [
            ops["rmsnorm"](t.transpose(1, 2).flatten(2), w, eps).unflatten(2, t.shape[1::2]).transpose(1, 2)
            for t, w in ((x, xw), (k, kw))
        ]
    two_ops = ops[PIPELINE[op]](*normed, *rest, *rope_params, **convention)
    differ = sum(int((a != b).sum()) for a, b in zip(got, two_ops))
    record_property("differ_from_two_ops", differ)
    assert differ <= 1e-3 * sum(t.numel() for t in got), differ
    peer = next(iter(load_spec(op).peers.values()))
    check(op, peer(*inputs, *params), inputs, params)


@pytest.mark.parametrize("op", NORMED)
def test_nan_stays_in_its_head_or_token(ops, op):
    """A NaN in one element of q: NaN in its head of its token (Flux, over a head; LTX-Video, the token's
    channels) or in every head of q at its token (Wan, over a token), nowhere else; k untouched."""
    dtype = usable_dtype()
    hidden = 2048 if op in TOKEN_ROWS else 128  # a head across a block's warps
    inputs, params = make_call(op, dtype, torch.Generator(device="cuda").manual_seed(7), 2, 3, 24, hidden)
    if op in TOKEN_ROWS:
        inputs[0][1, 5, 17] = float("nan")
        out, k_out = ops[op](*inputs, *params)
        expected = torch.zeros_like(out, dtype=torch.bool)
        expected[1, 5, :] = True
        assert torch.equal(out.isnan(), expected) and not k_out.isnan().any()
        return
    inputs[0][1, 2, 5, 17] = float("nan")
    out, k_out = ops[op](*inputs, *params)
    expected = torch.zeros_like(out, dtype=torch.bool)
    if load_spec(op).structure.norm.over == "head":
        expected[1, 2, 5, :] = True
    else:
        expected[1, :, 5, :] = True
    assert torch.equal(out.isnan(), expected)
    assert not k_out.isnan().any()


@pytest.mark.parametrize("op", NORMED)
def test_refusals(ops, op):
    """Head sizes whose lanes are no power of two up to a warp (over a token) or a 256-thread block (over a
    head), and weights of the wrong shape or dtype, are refused naming the argument."""
    spec = load_spec(op)
    gen = torch.Generator(device="cuda").manual_seed(1)
    dtype = usable_dtype()
    elems = 16 if spec.structure.pairing == "half" else 8  # a lane's 16-byte access (of each half)
    most = most_lanes(op)
    lanes = "of one warp" + " or whole warps of a 256-thread block" * (most > 32)
    for hidden in (96, 2 * most * elems):
        inputs, params = make_call(op, dtype, gen, 1, 2, 24, hidden)
        message = (
            rf"{op}: the norm before the rotation serves head sizes D = {elems} · 2\^k up to {most * elems} "
            rf"in (BFloat16|Half) \(D / {elems} lanes {lanes} sum a (head|token)\), got D = {hidden}"
        )
        with pytest.raises(ValueError, match=message):
            ops[op](*inputs, *params)
    inputs, params = make_call(op, dtype, gen, 1, 2, 24, 128)
    shape = r"\[D\] = \[128\]" if spec.structure.norm.over == "head" else r"\[H·D\] = \[256\] or \[H, D\]"
    with pytest.raises(ValueError, match=rf"{op}: x_weight must have shape {shape}"):
        ops[op](inputs[0], inputs[1], inputs[2][:-2], *inputs[3:], *params)
    with pytest.raises(TypeError, match=rf"{op}: k_weight has dtype Float but x has"):
        ops[op](*inputs[:3], inputs[3].float(), *inputs[4:], *params)


@pytest.mark.parametrize("op", NORMED)
def test_opcheck_and_compile(built, ops, op):
    overload = getattr(built(op)[1]._ops.ops, op)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in DTYPES:
        inputs, params = make_call(op, dtype, gen, 2, 3, 24, 64)
        if refused(dtype):
            continue
        torch.library.opcheck(overload, (*inputs, *params))
    torch._dynamo.reset()
    inputs, params = make_call(op, usable_dtype(), gen, 2, 3, 24, 128)

    def block(x, *rest):
        outs = ops[op](x * 2, *rest, *params)
        return tuple(o + 1 for o in outs)

    torch.testing.assert_close(torch.compile(block, fullgraph=True)(*inputs), block(*inputs), rtol=0, atol=0)
    assert torch._dynamo.explain(block)(*inputs).graph_break_count == 0


@pytest.mark.parametrize("op", NORMED)
def test_empty_input(ops, op):
    """No batch: empty outputs of the inputs' shape (the grid ops' 1·1·1 grid)."""
    inputs, params = make_call(op, torch.float16, torch.Generator(device="cuda").manual_seed(2), 1, 2, 1, 64)
    inputs = [t[:0] if i in (0, 1, 4) else t for i, t in enumerate(inputs)]
    for out in ops[op](*inputs, *params):
        assert out.shape == ((0, 1, 64) if op in TOKEN_ROWS else (0, 2, 1, 64))


def gradient_case(op, dtype, gen, batch, heads, tokens, hidden, layout="bshd", magnitude=1.0):
    """make_call's inputs with q, k and the weights requiring grad, the outputs, and random incoming
    gradients."""
    inputs, params = make_call(op, dtype, gen, batch, heads, tokens, hidden, layout, magnitude)
    inputs = [t.requires_grad_() if i < 4 else t for i, t in enumerate(inputs)]
    grads = [torch.randn(t.shape, generator=gen, device="cuda").to(dtype) for t in inputs[:2]]
    return inputs, params, grads


def reference_gradients(op, inputs, params, grads, dtype=None):
    """The gradients of q, k and the weights: float64 autograd of the reference, or (``dtype``) the spec's
    peer (F.rms_norm, then diffusers' rotation) under eager autograd in that dtype."""
    spec = load_spec(op)
    leaves = [t.detach().double() if dtype is None else t.detach().clone() for t in inputs[:4]]
    leaves = [t.requires_grad_() for t in leaves]
    fn = spec.reference if dtype is None else next(iter(spec.peers.values()))
    with torch.enable_grad():
        outs = fn(*leaves, *inputs[4:], *params)
    incoming = [g.double() if dtype is None else g for g in grads]
    return torch.autograd.grad(outs, leaves, incoming)


def assert_gradients_close(op, got, want, library, inputs, params, grads):
    """Each gradient's worst error at most 4× the library's own plus a floor: the derived dx adds the head's
    (or token's) terms (up to |dy|·|w|·rstd) before they cancel, where autograd of F.rms_norm factors them
    first (as for the row reductions' backward, test_backward_gpu's allowance), so 8 fp32 unit roundoffs of
    that scale (times the heads of a token, over a token; times the rows summed, for a weight's gradient: fp32
    sums over every head and token, rounded once); and two roundings of the dtype of the largest gradient."""
    x, k, xw, kw = (t.detach().double() for t in inputs[:4])
    heads = x.shape[1] if load_spec(op).structure.norm.over == "token" else 1
    eps = params[-1]
    rstd = max((t.pow(2).mean(-1) + eps).rsqrt().max().item() for t in (x, k))
    scale = (
        max(g.abs().max().item() for g in grads) * max(xw.abs().max().item(), kw.abs().max().item()) * rstd
    )
    ulp = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[inputs[0].dtype]
    for name, g, w, lib, of in zip(("x", "k", "x_weight", "k_weight"), got, want, library, (x, k, x, k)):
        assert g.shape == w.shape and g.dtype == inputs[0].dtype, name
        assert torch.isfinite(g).all(), f"{op} grad {name}: not finite"
        error = (g.double() - w).abs().max().item()
        library_error = (lib.double() - w).abs().max().item()
        rows = w.numel() and (heads if g.dim() > 1 else of.numel() // w.numel())
        allowed = 4 * library_error + 2 * ulp * w.abs().max().item() + 8 * 2.0**-24 * scale * rows
        assert error <= allowed, f"{op} grad {name}: worst error {error:.3g}, allowed {allowed:.3g}"


@st.composite
def gradient_cases(draw):
    return draw(cases(TRAINED)) | dict(magnitude=draw(st.sampled_from([1e-2, 1.0, 30.0])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=gradient_cases())
def test_gradients_match_float64_autograd(ops, case):
    op, dtype = case["op"], case["dtype"]
    if refused(dtype):
        return  # the forward refuses the dtype (test_matches_reference checks the refusal)
    gen = torch.Generator(device="cuda").manual_seed(case["seed"])
    keys = ("batch", "heads", "tokens", "hidden", "layout", "magnitude")
    inputs, params, grads = gradient_case(op, dtype, gen, *(case[k] for k in keys))
    got = torch.autograd.grad(ops[op](*inputs, *params), inputs[:4], grads)
    want = reference_gradients(op, inputs, params, grads)
    library = reference_gradients(op, inputs, params, grads, dtype)
    assert_gradients_close(op, got, want, library, inputs, params, grads)


# Flux.1-dev's image stream (24 heads); Wan 2.1 14B's self-attention (40 heads: a token's q and k heads held
# by one block's threads), and 48 heads (too many to hold: a kernel per token, then one for the weights)
MODEL_HEADS = [(op, {"qk_norm_rope_wan": 40}.get(op, 24)) for op in TRAINED] + [("qk_norm_rope_wan", 48)]


@pytest.mark.parametrize("op, heads", MODEL_HEADS)
def test_gradients_at_a_model_shape_repeat_bitwise(ops, op, heads):
    """The models' heads over 4608 tokens (LTX-Video's [2, 2688, 2048] for the [B, S, C] op): the gradients
    against float64, and three runs bitwise equal (each weight's partial sums added in a fixed order, no
    atomics)."""
    dtype = usable_dtype()
    shape = (2, 1, 2688, 2048) if op in TOKEN_ROWS else (1, heads, 4608, 128)
    inputs, params, grads = gradient_case(op, dtype, torch.Generator(device="cuda").manual_seed(3), *shape)
    outs = ops[op](*inputs, *params)
    runs = [torch.autograd.grad(outs, inputs[:4], grads, retain_graph=True) for _ in range(3)]
    for again in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], again))
    want = reference_gradients(op, inputs, params, grads)
    library = reference_gradients(op, inputs, params, grads, dtype)
    assert_gradients_close(op, runs[0], want, library, inputs, params, grads)


@pytest.mark.parametrize("op", TRAINED)
def test_a_nan_gradient_stays_in_its_head(ops, op):
    """A NaN in one incoming gradient element: NaN in q's gradient at its head (over a token: every head of
    it) and token only (the backward sum), and in the weight's gradient at the channels the rotation mixes it
    into (over a token: of that head); k untouched."""
    dtype = usable_dtype()
    inputs, params, grads = gradient_case(
        op, dtype, torch.Generator(device="cuda").manual_seed(5), 2, 3, 24, 128
    )
    at_head = () if op in TOKEN_ROWS else (2,)  # [B, S, C]: the token's channels are its head
    grads[0][(1, *at_head, 5, 16)] = float("nan")
    gx, gk, gxw, gkw = torch.autograd.grad(ops[op](*inputs, *params), inputs[:4], grads)
    over_token = load_spec(op).structure.norm.over == "token"
    expected = torch.zeros_like(gx, dtype=torch.bool)
    expected[(1, *((slice(None),) if over_token else at_head), 5)] = True
    assert torch.equal(gx.isnan(), expected)
    assert not gk.isnan().any() and not gkw.isnan().any()
    at = 2 * 128 + 16 if over_token else 16  # head 2's channel 16 of an [H·D] weight
    mixed = torch.zeros_like(gxw, dtype=torch.bool)  # channel 16 and its pair partner
    mixed[[at, at + 64] if load_spec(op).structure.pairing == "half" else [at, at + 1]] = True
    assert torch.equal(gxw.isnan(), mixed)


@pytest.mark.parametrize("op", TRAINED)
def test_opcheck_with_grad_and_a_compiled_training_step(built, ops, op):
    overload = getattr(built(op)[1]._ops.ops, op)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in DTYPES:
        if refused(dtype):
            continue
        inputs, params, _ = gradient_case(op, dtype, gen, 2, 3, 24, 64)
        torch.library.opcheck(overload, (*inputs, *params))
    torch._dynamo.reset()
    inputs, params, grads = gradient_case(op, usable_dtype(), gen, 2, 3, 24, 128)

    # the loss around the op is exact in both (its gradient is the weight, rounded to the dtype once), so any
    # difference would be the op's
    weight = torch.randn(128, generator=gen, device="cuda").to(inputs[0].dtype).float()

    def step(*args):
        return sum((o.float() * weight).sum() for o in ops[op](*args, *params))

    eager = torch.autograd.grad(step(*inputs), inputs[:4])
    compiled = torch.autograd.grad(torch.compile(step, fullgraph=True)(*inputs), inputs[:4])
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert torch._dynamo.explain(step)(*inputs).graph_break_count == 0

"""Rotary ops on the GPU: hypothesis property tests against the float64 references (layouts,
head counts, broadcast tables, dtypes, conventions), strided views as transformers passes them,
norm preservation, rope3d's in-kernel angles against the table form and against the tables
diffusers builds, argument errors, opcheck and torch.compile."""

from __future__ import annotations

import pytest
import torch
from conftest import REFUSAL, fit_axis_dims, refused, usable_dtype
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgen.bench import example_inputs
from kgen.catalog import load_spec, op_names
from kgen.families.rotary import COORDINATES

pytestmark = pytest.mark.gpu

# rotary ops with a norm before the rotation have their own tests (test_rotary_norm_gpu.py): head sizes of a
# power of two lanes only, and a reference whose rotated values are normalized
ROTARY = [
    op
    for op in op_names()
    if load_spec(op).structure.kind == "rotary" and load_spec(op).structure.norm is None
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ULP = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
LTX_GRIDS = {2688: (7, 16, 24), 8064: (21, 16, 24)}


@pytest.fixture(scope="module")
def ops(built):
    return {op: getattr(built(op)[1], op) for op in ROTARY}


def partner(t: torch.Tensor, pairing: str) -> torch.Tensor:
    if pairing == "half":
        first, second = t.chunk(2, dim=-1)
        return torch.cat((second, first), dim=-1)
    return t.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)


def tables(op: str, x: torch.Tensor, inputs: list, params: list):
    """The cos and sin each element of x sees, broadcast to x's shape."""
    spec = load_spec(op)
    if spec.structure.grid is not None:  # the tables the reference builds (q's, where it rotates q and k)
        cos, sin = spec.reference(*inputs, *params, tables=True)
        cos, sin = (cos[0], cos[1]) if isinstance(cos, tuple) else (cos, sin)
    else:
        cos, sin = inputs[-2:]
    if x.dim() == 4 and cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return cos.double().expand(x.shape), sin.double().expand(x.shape)


def check(op, outs, inputs, params, convention):
    spec = load_spec(op)
    kwargs = {"convention": convention} if len(spec.structure.conventions) > 1 else {}
    expected = spec.reference(*inputs, *params, **kwargs)
    outs, expected = (outs, expected) if isinstance(outs, tuple) else ((outs,), (expected,))
    rotated = [
        t for t, spec_t in zip(inputs, spec.inputs) if t is not None and not spec_t.dims == COORDINATES
    ][: len(outs)]
    roundings = 3 if convention == "transformers" else 1
    for out, want, x in zip(outs, expected, rotated):
        assert out.shape == x.shape and out.dtype == x.dtype
        cos, sin = tables(op, x, inputs, params)
        # the size of the two products that cancel, each rounded in fp32 (and in the dtype by transformers)
        magnitude = (
            x.double().abs() * cos.abs() + partner(x.double(), spec.structure.pairing).abs() * sin.abs()
        )
        ulp = ULP[x.dtype]
        bound = (
            roundings * ulp * want.abs()
            + (roundings * ulp + 4 * 2.0**-24) * magnitude
            + roundings * torch.finfo(x.dtype).smallest_normal * ulp
        )
        bad = (out.double() - want).abs() > bound
        if bad.any():
            i = bad.flatten().nonzero()[0].item()
            raise AssertionError(
                f"{op} {convention}: {int(bad.sum())} of {bad.numel()} off; e.g. got "
                f"{out.flatten()[i].item()!r}, want {want.flatten()[i].item()!r}"
            )


@st.composite
def cases(draw):
    op = draw(st.sampled_from(ROTARY))
    spec = load_spec(op)
    dtype = draw(st.sampled_from(DTYPES))
    hidden = draw(st.sampled_from([2, 4, 6, 8, 12, 14, 16, 64, 96, 100, 128, 256, 2048]))
    params = [p.default for p in spec.params]
    k_heads = None
    grid = spec.structure.grid
    if grid is not None:
        tokens = draw(st.integers(1, 300))  # coordinates given per token, or a grid of 1 to 216 tokens
        if grid.sizes:
            sizes = [draw(st.integers(1, 6)) for _ in range(3)]
            tokens = sizes[0] * sizes[1] * sizes[2]
            params[:3] = sizes
        # [B, S, C], or for a blocks grid (a head's channels split among the axes) [B, H, S, D]
        heads = draw(st.sampled_from([None, 1, 3])) if grid.layout == "blocks" else None
        shape = (draw(st.integers(1, 3)), *((heads,) if heads else ()), tokens, hidden)
        named = {p.name: i for i, p in enumerate(spec.params)}
        if draw(st.booleans()):  # other settings: theta, LTX's frame rate and patch size
            for name, choices in (
                ("theta", [10000.0, 500.0]),
                ("scale_t", [8 / 25, 8 / 24, 1.0]),
                ("patch", [2.0]),
            ):
                if name in named:
                    params[named[name]] = draw(st.sampled_from(choices))
        if grid.layout == "blocks":  # any split of the head among the axes (empty axes included)
            first = 2 * draw(st.integers(0, hidden // 2))
            second = 2 * draw(st.integers(0, (hidden - first) // 2))
            for name, width in zip(grid.axis_dims, (first, second, hidden - first - second)):
                params[named[name]] = width
    else:
        layout = draw(st.sampled_from(["bhtd", "bsc", "td"]))
        b, t = draw(st.integers(1, 3)), draw(st.integers(1, 200))
        shape = {"bhtd": (b, draw(st.integers(1, 8)), t, hidden), "bsc": (b, t, hidden), "td": (t, hidden)}[
            layout
        ]
        k_heads = draw(st.integers(1, 8))
    return dict(
        op=op,
        dtype=dtype,
        shape=shape,
        params=params,
        k_heads=k_heads,
        per_batch=draw(st.booleans()),
        magnitude=draw(st.sampled_from([1e-3, 1.0, 300.0])),
        convention=draw(st.sampled_from([c.name for c in spec.structure.conventions])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_matches_reference(ops, case):
    op, spec = case["op"], load_spec(case["op"])
    gen = torch.Generator(device="cuda").manual_seed(case["seed"])
    inputs = example_inputs(
        spec,
        case["shape"],
        case["dtype"],
        per_batch=case["per_batch"],
        k_heads=case["k_heads"],
        generator=gen,
        magnitude=case["magnitude"],
    )
    for t, tensor in zip(inputs, spec.inputs):  # tables are cos/sin-sized, coordinates up to 2048
        if tensor.name in ("cos", "sin"):
            t.div_(case["magnitude"])
        if tensor.dims == COORDINATES:
            t.copy_((t.abs() * 700 / case["magnitude"]).round())
    if refused(case["dtype"]):  # the tested arch has no arithmetic for it: the build says so
        with pytest.raises(TypeError, match=REFUSAL):
            ops[op](*inputs, *case["params"], convention=case["convention"])
        return
    outs = ops[op](*inputs, *case["params"], convention=case["convention"])
    check(op, outs, inputs, case["params"], case["convention"])


@pytest.mark.parametrize("dtype", DTYPES)
def test_transformers_layouts_in_place(ops, dtype):
    """q and k as transformers makes them (proj(x).view(B, T, H, D).transpose(1, 2): strided, not
    copied), a misaligned view (scalar path), and tables sliced from a longer cache."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    b, t, hq, hk, d = 2, 77, 8, 2, 128
    q = torch.randn(b, t, hq * d, generator=gen, device="cuda").to(dtype).view(b, t, hq, d).transpose(1, 2)
    k = torch.randn(b, t, hk * d, generator=gen, device="cuda").to(dtype).view(b, t, hk, d).transpose(1, 2)
    cos_cache = torch.randn(b, 200, d, generator=gen, device="cuda").to(dtype)
    cos, sin = cos_cache[:, 10 : 10 + t], cos_cache.flip(-1)[:, :t]
    check("rope", ops["rope"](q, k, cos, sin), [q, k, cos, sin], [], "single_rounding")
    raw = torch.randn(b * hq * t * d + 1, generator=gen, device="cuda").to(dtype)
    misaligned = raw[1:].view(b, hq, t, d)
    check("rope", ops["rope"](misaligned, k, cos, sin), [misaligned, k, cos, sin], [], "transformers")


@pytest.mark.parametrize("op", ["rope", "rope3d"])
def test_rotation_preserves_each_pair_norm(ops, op):
    gen = torch.Generator(device="cuda").manual_seed(5)
    if op == "rope":
        x = torch.randn(2, 4, 50, 64, generator=gen, device="cuda")
        angle = torch.randn(2, 50, 32, generator=gen, device="cuda") * 100
        cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
        out, _ = ops["rope"](x, x, cos, sin)
        pairs = lambda t: torch.stack(t.chunk(2, -1), -1)  # noqa: E731
    else:
        x = torch.randn(2, 2688, 2048, generator=gen, device="cuda")
        out = ops["rope3d"](x, *LTX_GRIDS[2688])
        pairs = lambda t: t.unflatten(-1, (-1, 2))  # noqa: E731
    before, after = pairs(x.double()).norm(dim=-1), pairs(out.double()).norm(dim=-1)
    torch.testing.assert_close(after, before, rtol=4e-7, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, channels", [(2688, 2048), (8064, 2048), (8064, 4096)])
def test_rope3d_in_kernel_angles_equal_the_table_form(ops, record_property, dtype, tokens, channels):
    """rope3d with its angles computed in the kernel gives what rope_apply gives with the fp32
    tables diffusers' code builds (C = 2048: 2 pad channels; C = 4096, LTX-Video 13B: 4)."""
    gen = torch.Generator(device="cuda").manual_seed(channels)
    x = torch.randn(2, tokens, channels, generator=gen, device="cuda").to(dtype)
    grid = LTX_GRIDS[tokens]
    cos, sin = load_spec("rope3d").reference(x, *grid, tables=True)
    in_kernel, from_tables = ops["rope3d"](x, *grid), ops["rope_apply"](x, cos, sin)
    same = (in_kernel == from_tables).float().mean().item()
    record_property("bitwise_equal", same)
    assert same == 1.0
    q_out, k_out = ops["rope3d_qk"](x, x.flip(0), *grid)  # q and k in one launch: the same angles
    assert torch.equal(q_out, in_kernel) and torch.equal(k_out, ops["rope3d"](x.flip(0), *grid))
    # the same grid given as video_coords (f·8/25, h·32, w·32 per token, as LTX-Video's pipeline makes them)
    f, h, w = torch.meshgrid(
        *(torch.arange(n, dtype=torch.float32, device="cuda") for n in grid), indexing="ij"
    )
    coords = torch.stack([f * (8 / 25) * 1.0, h * 32.0 * 1.0, w * 32.0 * 1.0]).flatten(1).expand(2, 3, tokens)
    assert torch.equal(ops["rope3d_coords"](x, coords), in_kernel)


@pytest.mark.parametrize("tokens, channels", [(2688, 2048), (8064, 4096)])
def test_rope3d_angles_match_diffusers(ops, record_property, tokens, channels):
    """The cos and sin the kernel uses (read back through fp32 x = [1, 0, 1, 0, ...]: out = [cos, sin,
    ...]) against the tables of diffusers' LTXVideoRotaryPosEmbed itself."""
    diffusers_ltx = pytest.importorskip("diffusers.models.transformers.transformer_ltx")
    grid = LTX_GRIDS[tokens]
    embed = diffusers_ltx.LTXVideoRotaryPosEmbed(
        dim=channels,
        base_num_frames=20,
        base_height=2048,
        base_width=2048,
        patch_size=1,
        patch_size_t=1,
        theta=10000.0,
    )
    x = torch.zeros(2, tokens, channels, device="cuda")
    want_cos, want_sin = embed(x, *grid, rope_interpolation_scale=(8 / 25, 32, 32))
    coords = (
        torch.rand(2, 3, tokens, device="cuda") * torch.tensor([20.0, 2048, 2048], device="cuda")[:, None]
    )
    coords_cos, coords_sin = embed(x, video_coords=coords)
    x[..., 0::2] = 1.0
    from_coords = ops["rope3d_coords"](x, coords)
    assert torch.equal(from_coords[..., 0::2].repeat_interleave(2, -1), coords_cos)
    assert torch.equal(from_coords[..., 1::2].repeat_interleave(2, -1), coords_sin)
    out = ops["rope3d"](x, *grid)
    got_cos, got_sin = out[..., 0::2].repeat_interleave(2, -1), out[..., 1::2].repeat_interleave(2, -1)
    pad = channels % 6
    assert torch.equal(want_cos[..., :pad], torch.ones_like(want_cos[..., :pad]))
    for name, got, want in (("cos", got_cos, want_cos), ("sin", got_sin, want_sin)):
        equal = (got == want).float().mean().item()
        worst = (got - want).abs().max().item()
        record_property(f"{name}_bitwise_equal", equal)
        record_property(f"{name}_max_abs_diff", worst)
        assert equal == 1.0, f"{name}: {equal:.6%} equal, max |diff| {worst:.3g}"


def read_back(op_fn, tokens: int, *args):
    """The cos and sin [S, D] the kernel used, read back through fp32 q = k = [1, 0, 1, 0, ...] in 2 heads
    (out = [cos, sin, ...] exactly); both heads and k's the same."""
    q = torch.zeros(1, 2, tokens, 128, device="cuda")
    q[..., 0::2] = 1.0
    out, k_out = op_fn(q, q, *args)
    assert torch.equal(out, k_out) and torch.equal(out[:, 0], out[:, 1])
    return out[0, 0, :, 0::2].repeat_interleave(2, -1), out[0, 0, :, 1::2].repeat_interleave(2, -1)


def assert_tables_equal(record_property, got: tuple, want: tuple):
    for name, g, w in zip(("cos", "sin"), got, want):
        equal, worst = (g == w).float().mean().item(), (g - w).abs().max().item()
        record_property(f"{name}_bitwise_equal", equal)
        assert equal == 1.0, f"{name}: {equal:.6%} equal, max |diff| {worst:.3g}"


def test_rope_flux_angles_match_diffusers(ops, record_property):
    """rope_flux's cos and sin against FluxPosEmbed's own tables (float64 on the GPU, rounded to fp32) for
    Flux.1's ids (512 text tokens at 0, a 64 × 64 image grid) and for fractional positions up to 300."""
    flux = pytest.importorskip("diffusers.models.transformers.transformer_flux")
    embed = flux.FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])
    side, text = 64, 512
    image = torch.zeros(side * side, 3, device="cuda")
    position = torch.arange(side * side, device="cuda")
    image[:, 1], image[:, 2] = position // side, position % side
    gen = torch.Generator(device="cuda").manual_seed(5)
    for ids in (
        torch.cat([torch.zeros(text, 3, device="cuda"), image]),
        torch.rand(777, 3, generator=gen, device="cuda") * 300,
    ):
        got = read_back(ops["rope_flux"], ids.shape[0], ids.t().unsqueeze(0), 10000.0, 16, 56, 56)
        assert_tables_equal(record_property, got, embed(ids))


def test_rope_wan_angles_match_diffusers(ops, record_property):
    """rope_wan's cos and sin against WanRotaryPosEmbed's own tables (float64 on the CPU, rounded to fp32,
    moved to the GPU) on Wan's 480p, 81-frame latent grid (21 × 30 × 52 after patching)."""
    wan = pytest.importorskip("diffusers.models.transformers.transformer_wan")
    embed = wan.WanRotaryPosEmbed(attention_head_dim=128, patch_size=(1, 2, 2), max_seq_len=1024).to("cuda")
    grid = (21, 30, 52)
    want = embed(torch.zeros(1, 16, grid[0], 2 * grid[1], 2 * grid[2], device="cuda"))
    widths = (embed.t_dim, embed.h_dim, embed.w_dim)
    got = read_back(ops["rope_wan"], grid[0] * grid[1] * grid[2], *grid, 10000.0, *widths)
    assert_tables_equal(record_property, got, tuple(t[0, :, 0] for t in want))


def test_argument_errors(ops):
    dtype = usable_dtype()
    x = torch.randn(2, 4, 10, 64, device="cuda", dtype=dtype)
    cos = torch.randn(2, 10, 64, device="cuda", dtype=dtype)
    with pytest.raises(ValueError, match=r"rope: k must match x but for the head count"):
        ops["rope"](x, torch.randn(2, 4, 11, 64, device="cuda", dtype=dtype), cos, cos)
    with pytest.raises(ValueError, match=r"rope: cos must have shape \[B or 1, T, D\] = \[2 or 1, 10, 64\]"):
        ops["rope"](x, x, cos[:, :9], cos)
    with pytest.raises(ValueError, match=r"last dim holds pairs and must be even"):
        ops["rope_apply"](
            torch.randn(2, 5, 7, device="cuda"),
            torch.randn(2, 5, 7, device="cuda"),
            torch.randn(2, 5, 7, device="cuda"),
        )
    with pytest.raises(TypeError, match=r"rope_apply: cos must be float32"):
        ops["rope_apply"](x[:, 0], cos, cos.float())
    with pytest.raises(
        ValueError, match=r"rope3d: x has 10 tokens per batch but frames·height·width = 2·3·4"
    ):
        ops["rope3d"](x[:, 0], 2, 3, 4)
    with pytest.raises(ValueError, match=r"rope3d: frames must be an integer > 0, got 0"):
        ops["rope3d"](x[:, 0], 0, 3, 4)
    with pytest.raises(ValueError, match=r"rope3d: x must be \[B, S, C\] with S = frames·height·width"):
        ops["rope3d"](x, 2, 5, 1)  # LTX's axes interleave across the channels of a token: no heads
    q = torch.randn(1, 2, 24, 128, device="cuda", dtype=dtype)
    with pytest.raises(
        ValueError,
        match=r"rope_wan: the axes' channels dim_t \+ dim_h \+ dim_w = 44 \+ 42 \+ 40 must equal x's last "
        r"dim 128",
    ):
        ops["rope_wan"](q, q, 2, 3, 4, 10000.0, 44, 42, 40)
    positions = torch.zeros(1, 3, 24, device="cuda")
    with pytest.raises(
        ValueError, match=r"rope_flux: dim_0 must be an even integer >= 0 \(whole pairs\), got 15"
    ):
        ops["rope_flux"](q, q, positions, 10000.0, 15, 57, 56)
    with pytest.raises(ValueError, match=r"rope_flux: positions must have shape \[B, 3, S\] = \[1, 3, 24\]"):
        ops["rope_flux"](q, q, positions[..., :23], 10000.0, 16, 56, 56)


def valid_inputs(op, dtype, gen):
    spec = load_spec(op)
    grid = spec.structure.grid is not None and bool(spec.structure.grid.sizes)
    shape = (2, 24, 256) if spec.structure.grid else (2, 3, 7, 64)
    params = [p.default for p in spec.params]  # the schema has no defaults: opcheck passes them all
    if grid:
        params[:3] = [2, 3, 4]  # frames, height, width of the 24-token grid
    params = fit_axis_dims(spec, shape[-1], params)
    return example_inputs(spec, shape, dtype, k_heads=2, generator=gen), params


@pytest.mark.parametrize("op", ROTARY)
def test_opcheck_and_compile(built, ops, op):
    spec = load_spec(op)
    namespace = built(op)[1]._ops.ops
    gen = torch.Generator(device="cuda").manual_seed(0)
    for i, convention in enumerate(spec.structure.conventions):
        overload = getattr(namespace, op if i == 0 else f"{op}_{convention.name}")
        for dtype in DTYPES:
            inputs, params = valid_inputs(op, dtype, gen)
            if refused(dtype):
                with pytest.raises(TypeError, match=REFUSAL):
                    overload(*inputs, *params)
                continue
            torch.library.opcheck(overload, (*inputs, *params))
    torch._dynamo.reset()
    inputs, params = valid_inputs(op, usable_dtype(), gen)

    def block(x, *rest):
        outs = ops[op](x * 2, *rest, *params)
        return tuple(o + 1 for o in outs) if isinstance(outs, tuple) else outs + 1

    torch.testing.assert_close(torch.compile(block, fullgraph=True)(*inputs), block(*inputs), rtol=0, atol=0)
    assert torch._dynamo.explain(block)(*inputs).graph_break_count == 0


@pytest.mark.parametrize("op", ROTARY)
def test_outputs_keep_a_dense_input_layout(built, ops, op):
    """Rotated tensors that are dense views with a unit last stride ([B, H, S, D] views of [B, S, H, D] heads)
    come back in that memory, so the attention after them copies nothing; a view that is not dense (a slice of
    a wider last dim) comes back contiguous. Values as from contiguous inputs, and the fake kernel's strides
    are the real ones."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    spec = load_spec(op)
    overload = getattr(built(op)[1]._ops.ops, op)
    inputs, params = valid_inputs(op, usable_dtype(), torch.Generator(device="cuda").manual_seed(3))
    rotated = [t.name in spec.structure.rotates for t in spec.inputs]

    def swap(t):  # dims 1 and 2 of [B, H, S, D] (0 and 1 of [B, S, C]) swapped in memory, not in shape
        return t.transpose(1, 2) if t.dim() == 4 else t.transpose(0, 1)

    def outputs(fn, args):
        outs = fn(*args, *params)
        return outs if isinstance(outs, tuple) else (outs,)

    want = outputs(ops[op], inputs)
    dense = [swap(swap(t).contiguous()) if r else t for t, r in zip(inputs, rotated)]
    sliced = [torch.cat([t, t], dim=-1)[..., : t.shape[-1]] if r else t for t, r in zip(inputs, rotated)]
    for args, layout in ((dense, "dense"), (sliced, "sliced")):
        views = [t for t, r in zip(args, rotated) if r]
        assert all(not t.is_contiguous() for t in views)
        got = outputs(ops[op], args)
        with FakeTensorMode() as mode:
            fake = outputs(overload, [mode.from_tensor(t) for t in args])
        for g, w, f, x in zip(got, want, fake, views):
            assert torch.equal(g, w), layout
            strides = x.stride() if layout == "dense" else w.contiguous().stride()
            assert g.stride() == strides and f.stride() == strides, layout
    torch.library.opcheck(overload, (*dense, *params))


@pytest.mark.parametrize("op", ROTARY)
def test_empty_input(ops, op):
    spec = load_spec(op)
    shape = (0, 1, 64) if spec.structure.grid else (2, 0, 64)  # grid ops: no batch on a 1·1·1 grid
    inputs = example_inputs(spec, shape, torch.float16)
    defaults = [int(p.default) if p.integer else p.default for p in spec.params]
    outs = ops[op](*inputs, *fit_axis_dims(spec, 64, defaults))
    for out in outs if isinstance(outs, tuple) else (outs,):
        assert out.shape == shape


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_in_place(built, ops, dtype):
    """rope_ rotates q and k where they are (transformers' transposed views included), equal to rope."""
    module = built("rope")[1]
    gen = torch.Generator(device="cuda").manual_seed(13)
    b, t, d = 2, 33, 128
    q = torch.randn(b, t, 8 * d, generator=gen, device="cuda").to(dtype).view(b, t, 8, d).transpose(1, 2)
    k = torch.randn(b, t, 2 * d, generator=gen, device="cuda").to(dtype).view(b, t, 2, d).transpose(1, 2)
    cos, sin = (torch.randn(b, t, d, generator=gen, device="cuda").to(dtype) for _ in range(2))
    for convention in ("single_rounding", "transformers"):
        want_q, want_k = ops["rope"](q, k, cos, sin, convention=convention)
        q2, k2 = q.clone(), k.clone()
        assert module.rope_(q2, k2, cos, sin, convention=convention) is None
        assert torch.equal(q2, want_q) and torch.equal(k2, want_k)
    torch.library.opcheck(module._ops.ops.rope_, (q.clone(), k.clone(), cos, sin))
    with pytest.raises(
        ValueError, match="rope_: x is rotated in place, so its last dim must have unit stride"
    ):
        module.rope_(q.transpose(-1, -2).contiguous().transpose(-1, -2), k, cos, sin)

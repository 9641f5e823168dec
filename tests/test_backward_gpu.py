"""The derived backward kernels on the GPU, for every op whose family derives one: gradients through
autograd against float64 autograd of the spec's reference (hypothesis over shapes, dtypes, conventions,
magnitudes and the incoming gradient's layout), no worse than the library's own eager autograd in the same
dtype; opcheck with inputs that require grad; a compiled training step (fullgraph); activation
checkpointing; a zero-stride gradient from .sum(); NaN staying where it was (row-local for a row reduction);
run-to-run identity, also of the gradients summed over many rows (weight, bias, a per-batch modulation);
absent optional inputs. A new op of such a family is covered by its spec alone."""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import fit_axis_dims, refused
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_ops_gpu import poison_allocator

from kgen.autodiff import gradient_name, gradient_outputs
from kgen.bench import example_inputs
from kgen.catalog import load_spec, op_names, suite
from kgen.families import family_of

pytestmark = pytest.mark.gpu

# the row, elementwise and rotary ops' derived backwards (a softmax loss's: test_softmax_loss_gpu.py; a rotary
# op's with a norm before the rotation, whose head sizes are restricted: test_rotary_norm_gpu.py)
OPS = [
    op
    for op in op_names()
    if family_of(load_spec(op)).backward(load_spec(op)) is not None
    and load_spec(op).structure.kind != "softmax_loss"
    and getattr(load_spec(op).structure, "norm", None) is None
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# ops with inputs that broadcast over the rows (AdaLN's scale, shift, gate): per token or per batch; not a
# rotary op's tables, constants of its backward (test_an_input_without_a_gradient_refuses_requiring_one)
BROADCAST = [
    op
    for op in OPS
    if any(t.broadcast for t in load_spec(op).inputs) and load_spec(op).structure.kind != "rotary"
]


def backward_spec(op):
    spec = load_spec(op)
    return family_of(spec).backward(spec)


@pytest.fixture(scope="module")
def libraries(built):
    """op -> its library, built on first use (built() keeps it): -k builds only the ops it selects."""

    class Libraries(dict):
        def __missing__(self, op):
            return built(op)[1]

    return Libraries()


def differentiated(op) -> list[str]:
    """The inputs the op's backward gives a gradient (a rotary op's tables and coordinates get none)."""
    return list(gradient_outputs(load_spec(op), backward_spec(op)))


def at(op, shape):
    """The op's shape and params for a test shape ([rows, hidden] or [B, S, hidden]). A rotary op: hidden
    made even (it holds pairs), the rank of its benchmark shapes (what its peers take: [B, H, T, D] for
    transformers' rope, one head); grid angles over a latent grid like LTX-Video's (at most 16 × 24 a frame,
    so the coordinates, and the fp32 angles' error, stay as in a model), the tokens rounded up to fill it; a
    blocks grid's axis widths splitting the head."""
    spec = load_spec(op)
    params = [p.default for p in spec.params]
    if spec.structure.kind != "rotary":
        return tuple(shape), params
    rank = len(suite(op)[0].shape)
    shape = (*shape[:-1], shape[-1] + shape[-1] % 2)
    shape = (shape[0] if len(shape) == 3 else 1,) + (1,) * (rank - 3) + shape[-2:]
    if spec.structure.grid is not None and spec.structure.grid.sizes:
        tokens = shape[-2]
        width = min(tokens, 24)
        height = min(-(-tokens // width), 16)
        frames = -(-tokens // (width * height))
        shape = (*shape[:-2], frames * height * width, shape[-1])
        sizes = dict(zip(spec.structure.grid.sizes, (frames, height, width)))
        params = [sizes.get(p.name, p.default) for p in spec.params]
    return shape, fit_axis_dims(spec, shape[-1], params)


def leaves(op, shape, dtype, gen, magnitude=1.0, present=None, per_batch=False):
    """The op's inputs at `at(op, shape)` (broadcast inputs per token, or per batch: [..., 1, hidden]), those
    with a gradient requiring it (None for the optional inputs ``present`` leaves out), and its params."""
    shape, params = at(op, shape)
    wanted = differentiated(op)
    inputs = example_inputs(
        load_spec(op), shape, dtype, per_batch=per_batch, generator=gen, magnitude=magnitude, present=present
    )
    return [
        t.requires_grad_() if t is not None and spec_t.name in wanted else t
        for t, spec_t in zip(inputs, load_spec(op).inputs)
    ], params


def given_(inputs):
    """The inputs a gradient is taken of."""
    return [t for t in inputs if t is not None and t.requires_grad]


def as_tuple(out) -> tuple:
    """An op's outputs as a tuple (fused_add_rmsnorm returns two)."""
    return out if isinstance(out, tuple) else (out,)


def random_grads(outs, gen, dtype, layout=lambda g: g) -> list:
    """One random incoming gradient per output, in ``layout``."""
    return [layout(torch.randn(o.shape, generator=gen, device="cuda").to(dtype)) for o in outs]


def expected_grads(op, inputs, params, grads, convention):
    """float64 autograd of the reference, for the given inputs that have a gradient."""
    spec = load_spec(op)
    named = dict(zip((t.name for t in spec.inputs), inputs))
    named |= {gradient_name(t.name): g for t, g in zip(spec.outputs, grads)}
    back = backward_spec(op)
    if saved := [t for t in spec.outputs if t.name in {b.name for b in back.inputs}]:
        # forward outputs the backward reads (saved by the autograd; fused add: residual_out = round(x +
        # residual)): the reference's, rounded to the dtype, as the kernel stores them
        takes = "convention" in inspect.signature(spec.reference).parameters
        outs = as_tuple(spec.reference(*inputs, *params, **({"convention": convention} if takes else {})))
        dtype = named[spec.lead.name].dtype
        named |= {t.name: outs[spec.outputs.index(t)].to(dtype) for t in saved}
    found = back.reference(*(named[t.name] for t in back.inputs), *params, convention=convention)
    by_name = dict(zip((t.name for t in back.outputs), found))  # an input sharing another's: that one
    # an empty one that the autograd hands an incoming gradient for (AdaLN's shift per token): that gradient
    if back.passes:  # only column reductions hand gradients on (and have `shaped_like`)
        like = back.structure.shaped_like
        by_name |= {
            g: named[i].double() for g, i in back.passes.items() if named[like[g]].shape == named[i].shape
        }
    wanted = [t for t, v in zip(spec.inputs, inputs) if v is not None and v.requires_grad]
    return [by_name[back.shared.get(g, g)] for g in (gradient_name(t.name) for t in wanted)]


def library_grads(op, inputs, params, grads: list, want):
    """The gradients of the most accurate peer installed (the libraries the op replaces) under eager
    autograd, in the inputs' dtype."""
    spec = load_spec(op)
    best, best_error = None, float("inf")
    for peer in spec.peers.values():
        leaves_ = [None if t is None else t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
        try:
            out = as_tuple(peer(*leaves_, *params))
            found = torch.autograd.grad(out, given_(leaves_), grads)
        # Liger: not installed, its backward refuses 3-d inputs, an absent weight or one head of [B, H, T, D]
        except (ImportError, RuntimeError, AttributeError, TypeError, ValueError, IndexError):
            continue
        error = max(
            ((f.double() - w).abs().nan_to_num(0).max().item() for f, w in zip(found, want)), default=0
        )
        if error < best_error:
            best, best_error = found, error
    return best


ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def assert_close_to_reference(op, got, want, library, dtype, names=None, allowance=(2, 0.0)):
    """Each gradient's largest error is at most twice the library's own, over the elements where the
    library's result is finite (the kernel rounds each gradient once from fp32 math; the library rounds its
    intermediates too, and 2 covers the worst element where two of its roundings happen to cancel), plus
    two unit roundoffs of the dtype times the largest gradient (one rounding of the result, where the
    library's error is smaller). ``allowance`` (factor, floor) replaces the 2 and adds an absolute floor, for
    row reductions and grid angles (see `allowance`)."""
    names = names or differentiated(op)
    float32 = {t.name for t in load_spec(op).inputs if t.dtype == "float32"}  # their gradients are float32
    for name, g, w, lib in zip(names, got, want, library):
        assert g.shape == w.shape and g.dtype == (torch.float32 if name in float32 else dtype), name
        assert torch.equal(torch.isnan(g), torch.isnan(w)), (
            f"{op} grad {name}: unwritten (poisoned) or stray NaN"
        )
        # beyond the dtype's range the gradient overflows to ±inf (or rounds to ±max), as the library's does
        top = torch.finfo(dtype).max
        beyond = torch.isfinite(w) & (w.abs() > top)
        assert ((g.abs() >= top) & (g.sign() == w.sign()))[beyond].all(), f"{op} grad {name}: overflow"
        finite = torch.isfinite(w) & ~beyond
        if not finite.any():
            continue
        error = (g.double() - w).abs()[finite]
        both = finite & torch.isfinite(lib)
        library_error = (lib.double() - w).abs()[both].max().item() if both.any() else 0.0
        factor, floor = allowance
        allowed = factor * library_error + 2 * ROUNDOFF[dtype] * w.abs()[finite].max().item() + floor
        assert error.max().item() <= allowed, (
            f"{op} grad {name} ({dtype}): worst error {error.max().item():.3g}, allowed {allowed:.3g} "
            f"(the library's {library_error:.3g})"
        )


def allowance(op, inputs, grads: list) -> tuple[int, float]:
    """(factor, floor) for `assert_close_to_reference`: (2, 0), except for a rotation with grid angles and an
    op whose backward reduces rows.

    Grid angles are computed in the kernel in fp32, in another order than the fp32 tables the reference and
    the library build (diffusers' steps): the family's tolerance for that (`check_tolerance`, the one `kgen
    check` uses for the forward) times the largest incoming gradient is the floor.

    Its derived dx adds the row's terms (up to |dy|·|w|·rstd) before they cancel, where ATen's norms factor
    them first (rstd·(dy·w - mean(dy·w) - x̂·mean(dy·w·x̂))); in a row whose dx nearly cancels both lose digits
    to fp32 roundoff, the derived form more: float32 layernorm at hidden 2 measured 3× F.layer_norm's error
    (2.1e-7 against 7e-8 on a dx of 3.7e-5), float16 at hidden 2 5× (2.2e-7 against 4.4e-8 on a dx of 2e-5).
    There the factor is 4, and the floor is 8 fp32 unit roundoffs of the terms' scale |dy|·|w|·rstd (w the
    weights, 1 when absent; rstd at most 1/sqrt(var + eps) of the normalised row, the row inputs' sum:
    1/sqrt(eps) for a one-element row, which normalises to a constant and whose dx cancels to 0 or nearly)."""
    spec = load_spec(op)
    if backward_spec(op).structure.kind != "column_reduce":
        angles, _ = family_of(spec).check_tolerance(spec, 0.0, 0.0)
        return 2, angles * max(g.abs().max().item() for g in grads)
    eps = min(p.default for p in spec.params if p.name == "eps")
    lead = inputs[0]
    normalised = sum(
        v.detach().double()
        for t, v in zip(spec.inputs, inputs)
        if v is not None and not t.column and v.shape == lead.shape
    )
    rstd = (normalised.var(-1, unbiased=False) + eps).rsqrt().max().item()
    columns = [v for t, v in zip(spec.inputs, inputs) if t.column and v is not None]
    # a broadcast input (AdaLN's scale, gate) multiplies the terms too: (1 + |scale|) at most
    broadcast = [
        1 + v.abs().max().item() for t, v in zip(spec.inputs, inputs) if t.broadcast and v is not None
    ]
    scale = (
        max(g.abs().max().item() for g in grads)
        * max([1.0] + [v.abs().max().item() for v in columns])
        * max([1.0] + broadcast) ** 2
        * rstd
    )
    return 4, 8 * 2.0**-24 * scale


GRAD_LAYOUTS = {
    "contiguous": lambda g: g,
    "transposed": lambda g: (
        g.t().contiguous().t() if g.dim() == 2 else g
    ),  # column-major: copied by the binding
    "row-strided": lambda g: torch.cat([g, g[..., :1]], dim=-1)[..., :-1],  # a view with a padded row stride
}


@st.composite
def cases(draw):
    op = draw(st.sampled_from(OPS))
    # a one-element row of a reduction is degenerate (see allowance): test_edge_shapes covers it
    low = 2 if backward_spec(op).structure.kind == "column_reduce" else 1
    hidden = draw(
        st.one_of(st.integers(low, 70), st.sampled_from([127, 128, 4095, 4096, 8192]), st.integers(70, 20000))
    )
    rows = draw(st.integers(1, max(1, min(2048, 1_000_000 // hidden))))
    batches = draw(st.sampled_from([1, 2, 3])) if op in BROADCAST else 1
    return dict(
        op=op,
        shape=(rows, hidden) if batches == 1 else (batches, max(1, rows // batches), hidden),
        per_batch=op in BROADCAST and draw(st.booleans()),
        dtype=draw(st.sampled_from(DTYPES)),
        convention=draw(st.sampled_from([c.name for c in load_spec(op).structure.conventions])),
        magnitude=draw(st.sampled_from([1e-3, 1.0, 8.0, 1e4])),
        layout=draw(st.sampled_from(list(GRAD_LAYOUTS))),
        seed=draw(st.integers(0, 2**31 - 1)),
        present={t.name: draw(st.booleans()) for t in load_spec(op).inputs if t.optional},
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_gradients_match_float64_autograd(libraries, case):
    op, dtype, convention = case["op"], case["dtype"], case["convention"]
    if refused(dtype):
        return  # the forward refuses the dtype (test_ops_gpu checks the refusal)
    gen = torch.Generator(device="cuda").manual_seed(case["seed"])
    inputs, params = leaves(
        op, case["shape"], dtype, gen, case["magnitude"], case["present"], case["per_batch"]
    )
    # where the forward itself overflows the dtype (float16 at 1e4: x·cos, h·gate) no gradient means anything:
    # the library's, the reference's and the kernel's differ in how they turn inf into NaN
    spec = load_spec(op)
    takes = "convention" in inspect.signature(spec.reference).parameters
    reference = as_tuple(spec.reference(*inputs, *params, **({"convention": convention} if takes else {})))
    assume(all(o.abs().max() <= torch.finfo(dtype).max for o in reference if o.numel()))
    outs = as_tuple(getattr(libraries[op], op)(*inputs, *params, convention=convention))
    grads = random_grads(outs, gen, dtype, GRAD_LAYOUTS[case["layout"]])
    poison_allocator(inputs[0].numel(), dtype, len(inputs))
    got = torch.autograd.grad(outs, given_(inputs), grads)
    want = expected_grads(op, inputs, params, grads, convention)
    names = [t.name for t, v in zip(load_spec(op).inputs, inputs) if v is not None and v.requires_grad]
    library = library_grads(op, inputs, params, grads, want)
    assert_close_to_reference(op, got, want, library, dtype, names, allowance(op, inputs, grads))


TALL = [(70000, 64), (3000, 4096), (2, 700, 5120), (600, 20000)]  # many rows per row slot; 20000: re-read


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", TALL)
def test_tall_shapes_and_gradients_summed_over_rows_repeat_bitwise(libraries, op, shape):
    """Shapes with many rows per block of the fixed partition (and rows beyond the register budget): the
    gradients against float64, and three runs bitwise equal (the partial sums are added in a fixed order)."""
    dtype = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(len(shape) + shape[-1])
    inputs, params = leaves(op, shape, dtype, gen)
    outs = as_tuple(getattr(libraries[op], op)(*inputs, *params))
    grads = random_grads(outs, gen, dtype)
    runs = [torch.autograd.grad(outs, given_(inputs), grads, retain_graph=True) for _ in range(3)]
    for again in runs[1:]:
        for a, b in zip(runs[0], again):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    want = expected_grads(op, inputs, params, grads, load_spec(op).default_convention)
    library = library_grads(op, inputs, params, grads, want)
    assert_close_to_reference(op, runs[0], want, library, dtype, allowance=allowance(op, inputs, grads))


# the last two: rows beyond the registers (split: the outputs kernel's row groups within each batch)
BATCHED = [
    (2, 700, 2048),
    (4, 3000, 128),
    (1, 5, 64),
    (3, 2688, 2048),
    (70, 3, 96),
    (2, 300, 5120),
    (3, 40, 40000),
]


@pytest.mark.parametrize("op", BROADCAST)
@pytest.mark.parametrize("shape", BATCHED)
def test_per_batch_modulation_gradients_summed_per_batch_repeat_bitwise(libraries, op, shape):
    """Scale, shift (and gate) per batch ([B, 1, C]): their gradients summed over each batch's rows by the
    batch's own blocks, against float64 and three runs bitwise equal; batches with fewer rows than a block,
    and more batches than a wave holds blocks."""
    dtype = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(sum(shape))
    inputs, params = leaves(op, shape, dtype, gen, per_batch=True)
    assert all(
        v.shape[-2] == 1 for t, v in zip(load_spec(op).inputs, inputs) if t.broadcast and v is not None
    )
    outs = as_tuple(getattr(libraries[op], op)(*inputs, *params))
    grads = random_grads(outs, gen, dtype)
    runs = [torch.autograd.grad(outs, given_(inputs), grads, retain_graph=True) for _ in range(3)]
    for again in runs[1:]:
        for a, b in zip(runs[0], again):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    want = expected_grads(op, inputs, params, grads, load_spec(op).default_convention)
    library = library_grads(op, inputs, params, grads, want)
    assert_close_to_reference(op, runs[0], want, library, dtype, allowance=allowance(op, inputs, grads))


@pytest.mark.parametrize("op", [op for op in OPS if backward_spec(op).passes])
def test_a_per_token_shift_gets_the_incoming_gradient_itself(libraries, op):
    """AdaLN's shift per token: its gradient is grad_out, handed on by the autograd (the backward op returns
    it empty and writes no row for it); per batch the op sums it. Bitwise: no rounding in between."""
    spec, back, dtype = load_spec(op), backward_spec(op), torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(5)
    for per_batch in (False, True):
        inputs, params = leaves(op, (2, 300, 1024), dtype, gen, per_batch=per_batch)
        outs = as_tuple(getattr(libraries[op], op)(*inputs, *params))
        grads = random_grads(outs, gen, dtype)
        shift = [t.name for t in spec.inputs].index("shift")
        got = torch.autograd.grad(outs, inputs[shift], grads)[0]
        named = dict(zip((t.name for t in spec.inputs), inputs))
        named |= {gradient_name(t.name): g for t, g in zip(spec.outputs, grads)}
        direct = getattr(libraries[op].ops, back.name)(*(named[t.name] for t in back.inputs), *params)
        grad_shift = direct[[t.name for t in back.outputs].index("grad_shift")]
        if per_batch:
            assert grad_shift.shape == got.shape == (2, 1, 1024) and torch.equal(grad_shift, got)
        else:
            assert grad_shift.numel() == 0 and torch.equal(got, grads[0])


@pytest.mark.parametrize("op", BROADCAST)
def test_mixed_and_other_broadcasts_get_gradients_of_their_shapes(libraries, op):
    """Scale per batch beside shift per token, and a modulation shared by the batch ([1, S, C], summed to
    its shape after the kernel): each gradient has its input's shape and matches float64 autograd."""
    spec, dtype = load_spec(op), torch.float32
    gen = torch.Generator(device="cuda").manual_seed(11)
    for layout in ("mixed", "shared"):
        inputs, params = leaves(op, (3, 50, 264), dtype, gen)
        for i, t in enumerate(spec.inputs):
            if t.broadcast and inputs[i] is not None:
                v = inputs[i].detach()
                v = v[:, :1] if (layout == "mixed") == (t.name == "scale") else v
                v = v[:1] if layout == "shared" else v
                inputs[i] = v.contiguous().requires_grad_()
        outs = as_tuple(getattr(libraries[op], op)(*inputs, *params))
        grads = random_grads(outs, gen, dtype)
        got = torch.autograd.grad(outs, given_(inputs), grads)
        want = expected_grads(op, inputs, params, grads, spec.default_convention)
        for g, w in zip(got, want):
            assert g.shape == w.shape
        library = library_grads(op, inputs, params, grads, want)
        assert_close_to_reference(op, got, want, library, dtype, allowance=allowance(op, inputs, grads))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (1, 3), (5, 7), (3, 4100), (2, 3, 8192)])
def test_edge_shapes_every_convention(libraries, op, dtype, shape):
    gen = torch.Generator(device="cuda").manual_seed(sum(shape))
    inputs, params = leaves(op, shape, dtype, gen)
    for convention in (c.name for c in load_spec(op).structure.conventions):
        outs = as_tuple(getattr(libraries[op], op)(*inputs, *params, convention=convention))
        grads = random_grads(outs, gen, dtype)
        poison_allocator(inputs[0].numel(), dtype, len(inputs))
        got = torch.autograd.grad(outs, given_(inputs), grads)
        want = expected_grads(op, inputs, params, grads, convention)
        library = library_grads(op, inputs, params, grads, want)
        assert_close_to_reference(op, got, want, library, dtype, allowance=allowance(op, inputs, grads))


@pytest.mark.parametrize("op", OPS)
def test_zero_stride_gradient_from_sum(libraries, op):
    """out.sum().backward() hands the backward an expanded (all-zero strides) gradient (each output's)."""
    dtype = torch.float32
    inputs, params = leaves(op, (33, 520), dtype, torch.Generator(device="cuda").manual_seed(1))
    outs = as_tuple(getattr(libraries[op], op)(*inputs, *params))
    sum(o.sum() for o in outs).backward()
    ones = [torch.ones_like(o) for o in outs]
    want = expected_grads(op, inputs, params, ones, load_spec(op).default_convention)
    library = library_grads(op, inputs, params, ones, want)
    got = [t.grad for t in given_(inputs)]
    assert_close_to_reference(op, got, want, library, dtype, allowance=allowance(op, inputs, ones))


@pytest.mark.parametrize("op", OPS)
def test_opcheck_with_inputs_that_require_grad(libraries, op):
    """torch.library.opcheck: schema, fake kernels of forward and backward, the autograd registration and AOT
    dispatch (which traces the backward)."""
    spec = load_spec(op)
    gen = torch.Generator(device="cuda").manual_seed(3)
    optional = [t.name for t in spec.inputs if t.optional]
    for convention in spec.structure.conventions:
        for present in [None, dict.fromkeys(optional, False)] if optional else [None]:
            for per_batch in [False, True] if op in BROADCAST else [False]:
                shape = (2, 4, 264) if op in BROADCAST else (4, 264)
                inputs, params = leaves(op, shape, torch.float32, gen, present=present, per_batch=per_batch)
                torch.library.opcheck(
                    getattr(libraries[op].ops, spec.variant(convention.name)), (*inputs, *params)
                )


@pytest.mark.parametrize("op", [op for op in OPS if len(differentiated(op)) < len(load_spec(op).inputs)])
def test_an_input_without_a_gradient_refuses_requiring_one(libraries, op):
    """A rotary op's tables (and coordinates) are constants of its backward: requiring a gradient of one
    raises instead of leaving it silently without."""
    inputs, params = leaves(op, (4, 64), torch.float32, torch.Generator(device="cuda").manual_seed(7))
    constant = next(i for i, v in enumerate(inputs) if v is not None and not v.requires_grad)
    inputs[constant].requires_grad_()
    name = load_spec(op).inputs[constant].name
    with pytest.raises(ValueError, match=f"{name} requires grad, but"):
        getattr(libraries[op], op)(*inputs, *params)
    with torch.no_grad():  # no gradient is recorded: no refusal
        getattr(libraries[op], op)(*inputs, *params)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_training_step_has_no_graph_break_and_matches_eager(libraries, op, dtype):
    if refused(dtype):
        return
    torch._dynamo.reset()
    fn = getattr(libraries[op], op)
    gen = torch.Generator(device="cuda").manual_seed(4)
    inputs, params = leaves(op, (64, 1024), dtype, gen)
    # the loss around the op is exact in both (its gradient is the weight, rounded to the dtype once), so any
    # difference would be the op's
    weight = torch.randn(1024, generator=gen, device="cuda").to(dtype).float()

    def step(*args):
        return sum((o.float() * weight).sum() for o in as_tuple(fn(*args, *params)))

    eager = torch.autograd.grad(step(*inputs), given_(inputs))
    compiled = torch.autograd.grad(torch.compile(step, fullgraph=True)(*inputs), given_(inputs))
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(c, e, rtol=0, atol=0)


@pytest.mark.parametrize("op", OPS)
def test_activation_checkpointing(libraries, op):
    from torch.utils.checkpoint import checkpoint

    fn = getattr(libraries[op], op)
    inputs, params = leaves(op, (16, 2048), torch.bfloat16, torch.Generator(device="cuda").manual_seed(5))

    def loss(*args):
        return sum(o.float().square().sum() for o in as_tuple(fn(*args, *params)))

    plain = torch.autograd.grad(loss(*inputs), given_(inputs))
    again = torch.autograd.grad(checkpoint(loss, *inputs, use_reentrant=False), given_(inputs))
    for p, a in zip(plain, again):
        assert torch.equal(p, a)


@pytest.mark.parametrize("op", OPS)
def test_nan_stays_where_the_reference_has_it_and_runs_repeat_bitwise(libraries, op):
    """A NaN in the lead input and one in the first output's incoming gradient: at their positions for an
    elementwise op (and the partner's for a rotation, which never sees the input); in their rows, and in every
    gradient summed over the rows, for a row reduction: as float64 autograd of the reference."""
    fn = getattr(libraries[op], op)
    inputs, params = leaves(op, (8, 4096), torch.bfloat16, torch.Generator(device="cuda").manual_seed(6))
    inputs = [None if t is None else t.detach() for t in inputs]
    inputs[0].view(-1, inputs[0].shape[-1])[3, 17] = float("nan")
    wanted = differentiated(op)
    inputs = [t.requires_grad_() if s.name in wanted else t for t, s in zip(inputs, load_spec(op).inputs)]
    outs = as_tuple(fn(*inputs, *params))
    grads = [torch.ones_like(o) for o in outs]
    grads[0].view(-1, grads[0].shape[-1])[5, 40] = float("nan")
    first = torch.autograd.grad(outs, given_(inputs), grads, retain_graph=True)
    second = torch.autograd.grad(outs, given_(inputs), grads)
    want = expected_grads(op, inputs, params, grads, load_spec(op).default_convention)
    assert first[0].isnan().any()
    for f, s, w in zip(first, second, want):
        assert torch.equal(f.isnan(), w.isnan())
        assert torch.equal(f.view(torch.int16), s.view(torch.int16))


def test_layers_say_they_have_a_backward(libraries):
    for op in OPS:
        for layer in load_spec(op).layers:
            assert getattr(libraries[op].layers, layer.name).has_backward is True


def test_bench_gpu_time_counts_the_call_not_the_flush_nor_the_host():
    """`kgen bench --backward`'s GPU time: the kernels of the call alone. The 256 MB uint8 flush before each
    call is left out, and so is host time: a call that sleeps 1 ms between its two launches costs the GPU
    time of two launches."""
    import time

    from kgen.bench import Timer

    timer = Timer(torch, 20)
    x = torch.ones(16 << 20, device="cuda")  # 64 MB, read and written: a quarter of the flush's bytes
    one = timer.gpu_us(lambda: x.mul_(1.0))
    flush = timer.median_us(lambda: timer.flush.zero_())
    assert 0 < one < 0.75 * flush, (one, flush)
    two = timer.gpu_us(lambda: (x.mul_(1.0), time.sleep(1e-3), x.mul_(1.0)))
    assert 1.5 * one < two < 3 * one, (one, two)

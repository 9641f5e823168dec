"""Bad input at run time, for every op, built from its spec: a CPU tensor, a foreign or mixed dtype,
shapes that don't agree, broadcasts that don't broadcast, params <= 0 or not finite, an unknown
convention: each a Python exception naming the argument and what was expected. And the inputs that
must give the right answer instead: NaN and Inf (propagated as in the reference), misaligned and
strided rotary views, rotary rows of 2 and of 262144, more than 2^31 elements (64-bit indexing),
and a second GPU. Row ops' edge sizes, strides and empty input: test_ops_gpu; rotary: test_rotary_gpu."""

from __future__ import annotations

import math
import re

import pytest
import test_ops_gpu as rows_suite
import test_rotary_gpu as rotary_suite
import torch
from conftest import fit_axis_dims

from kgen.bench import example_inputs
from kgen.catalog import load_spec, op_names
from kgen.families.rotary import COORDINATES

pytestmark = pytest.mark.gpu

OPS = op_names()
ROTARY = [op for op in OPS if load_spec(op).structure.kind == "rotary"]
# a norm before the rotation serves power-of-two lanes per head only: its NaN, layout and head-size tests are
# in test_rotary_norm_gpu.py
NORMED = [op for op in ROTARY if load_spec(op).structure.norm is not None]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def fns(built):
    return {op: getattr(built(op)[1], op) for op in OPS}


def valid_call(op, dtype=torch.bfloat16, gen=None, shape=None, per_batch=False):
    """Inputs and params of a valid call: [2, 3, 64] rows, a [2, 3, 7, 64] q with 2 k heads, or a
    [2, 24, 256] video latent on a 2·3·4 grid (a blocks grid's axis widths splitting the 256)."""
    spec = load_spec(op)
    params = [p.default for p in spec.params]
    grid = spec.structure.grid if spec.structure.kind == "rotary" else None
    if grid is not None and grid.sizes:
        params[:3] = [2, 3, 4]
    shape = shape or (
        (2, 24, 256) if grid is not None else (2, 3, 7, 64) if spec.structure.kind == "rotary" else (2, 3, 64)
    )
    params = fit_axis_dims(spec, shape[-1], params)
    inputs = example_inputs(spec, shape, dtype, k_heads=2, generator=gen, per_batch=per_batch)
    for t, tensor in zip(inputs, spec.inputs):
        if tensor.dims == COORDINATES:  # latent-grid positions: whole numbers up to about 2000
            t.copy_((t.abs() * 700).round())
    return inputs, params


def bad_calls(op):
    """(what, inputs, params, exception, message) for each way to get one argument wrong."""
    spec = load_spec(op)

    def variant(change_input=None, change_param=None):
        inputs, params = valid_call(op)
        if change_input:
            i, fn = change_input
            inputs[i] = fn(inputs[i])
        if change_param:
            i, value = change_param
            params[i] = value
        return inputs, params

    lead = spec.inputs[0].name
    for i, t in enumerate(spec.inputs):
        name = re.escape(t.name)
        integral = "|must be int64" if t.dtype == "int64" else ""
        yield (
            f"{t.name} on the CPU",
            *variant((i, lambda v: v.cpu())),
            ValueError,
            rf"{op}: {name} must be a CUDA tensor",
        )
        yield (
            f"{t.name} float64",
            *variant((i, lambda v: v.double())),
            TypeError,
            rf"{op}: {name} (has dtype Double|must be float32{integral})",
        )
        if t.name != lead:
            other = torch.float32 if t.dtype in ("io", "int64") else torch.float16  # the lead is bfloat16
            yield (
                f"{t.name} {other}",
                *variant((i, lambda v: v.to(other))),
                TypeError,
                rf"{op}: {name} (has dtype Float but {lead} has BFloat16|must be float32{integral})",
            )
            yield (
                f"{t.name} with 2 more in its last dim",
                *variant(
                    (i, lambda v: torch.zeros(*v.shape[:-1], v.shape[-1] + 2, dtype=v.dtype, device=v.device))
                ),
                ValueError,
                rf"{op}: {name} (must|has shape)",
            )
        if t.broadcast and spec.structure.kind != "rotary":
            yield (
                f"{t.name} [2, 2, 64] beside x [2, 3, 64]",
                *variant((i, lambda v: v[:, :2])),
                ValueError,
                rf"{op}: {name} must broadcast to \[2, 3, 64\]",
            )
    yield (
        f"{lead} 0-dim",
        *variant((0, lambda v: v.flatten()[0])),
        ValueError,
        rf"{op}: {lead} must have (at least one dim|1 to 4 dims)",
    )
    if spec.structure.kind == "rotary" or spec.inputs[0].packed:
        yield (
            "x with an odd last dim",
            *variant((0, lambda v: v[..., :-1])),
            ValueError,
            rf"{op}: x.*must be even",
        )
    for i, p in enumerate(spec.params):
        if p.integer and p.positive:
            for value in (0, -3):
                yield (
                    f"{p.name}={value}",
                    *variant(change_param=(i, value)),
                    ValueError,
                    rf"{op}: {p.name} must be an integer > 0, got",
                )
        elif not p.integer:  # checked as the kernel's float32: 1e300 is inf there, 1e-300 zero
            bad = (
                (0.0, -1e-6, math.nan, math.inf, 1e300, 1e-300)
                if p.positive
                else (math.nan, math.inf, -1e300)
            )
            for value in bad:
                yield (
                    f"{p.name}={value}",
                    *variant(change_param=(i, value)),
                    ValueError,
                    rf"{op}: {p.name} must be a finite number{' > 0' if p.positive else ''} in float32, got "
                    + re.escape(f"{value:.17g}"),
                )


@pytest.mark.parametrize("op", OPS)
def test_every_bad_argument_is_named(fns, op):
    cases = list(bad_calls(op))
    assert len(cases) >= 3  # x on the CPU, x float64, x 0-dim at least
    for what, inputs, params, error, message in cases:
        with pytest.raises(error, match=message):
            fns[op](*inputs, *params)
            pytest.fail(f"{op}: {what} was accepted")
    inputs, params = valid_call(op)
    with pytest.raises(ValueError, match="convention must be one of"):
        fns[op](*inputs, *params, convention="fastest")


@pytest.mark.parametrize("op", [op for op in OPS if op not in NORMED])
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_inf_propagate_as_in_the_reference(fns, op, dtype):
    """NaN, +Inf and -Inf planted in every input: the same elements are NaN or ±Inf as in the
    float64 reference, and the finite rest agrees (its precision is the property tests' business)."""
    spec = load_spec(op)
    gen = torch.Generator(device="cuda").manual_seed(17)
    inputs, params = valid_call(op, dtype, gen, shape=(2, 24, 256) if op in ROTARY else (4, 5, 256))
    for t, tensor in zip(inputs, spec.inputs):
        if t is None or tensor.dims == COORDINATES or tensor.dtype == "int64":  # positions, class labels
            continue
        flat = t.view(-1)
        where = torch.randperm(flat.numel(), generator=gen, device="cuda")[:6]
        flat[where] = torch.tensor([math.nan, math.inf, -math.inf] * 2, device="cuda", dtype=t.dtype)
    got = fns[op](*inputs, *params)
    got = got if isinstance(got, tuple) else (got,)
    wanted = rows_suite.reference(op, inputs, params, spec.default_convention)
    for out, want, tensor in zip(got, wanted if isinstance(wanted, tuple) else (wanted,), spec.outputs):
        out = out.double()
        assert torch.equal(out.isnan(), want.isnan()), (
            f"{op} {tensor.name}: NaN where the reference has none, or none where it has"
        )
        assert torch.equal(out.isinf(), want.isinf()) and torch.equal(out[out.isinf()], want[want.isinf()]), (
            f"{op} {tensor.name}: ±Inf differ from the reference"
        )
        finite = want.isfinite()
        scale = want[finite].abs().max().clamp_min(1.0)
        assert ((out[finite] - want[finite]).abs() <= 0.05 * scale).all(), (
            f"{op} {tensor.name}: finite values off"
        )


@pytest.mark.parametrize("op", [op for op in ROTARY if op not in NORMED])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_misaligned_and_strided_views(fns, op, dtype):
    """Every rotated tensor and table as a view at an odd element offset (the scalar path), then as a
    16-byte aligned slice of a wider buffer (strided rows, read in place)."""
    spec = load_spec(op)
    gen = torch.Generator(device="cuda").manual_seed(23)
    inputs, params = valid_call(op, dtype, gen)
    for layout in ("misaligned", "strided"):
        views = []
        for t in inputs:
            if layout == "misaligned":
                view = torch.empty(t.numel() + 1, dtype=t.dtype, device="cuda")[1:].view(t.shape).copy_(t)
                assert view.data_ptr() % 16 != 0
            else:
                view = torch.empty(*t.shape[:-1], t.shape[-1] + 16, dtype=t.dtype, device="cuda")[
                    ..., 8:-8
                ].copy_(t)
            views.append(view)
        rotary_suite.check(op, fns[op](*views, *params), views, params, spec.default_convention)


@pytest.mark.parametrize("op", [op for op in ROTARY if op not in NORMED])
@pytest.mark.parametrize("hidden", [2, 10, 262_144])
def test_rotary_edge_head_dims(fns, op, hidden):
    spec = load_spec(op)
    gen = torch.Generator(device="cuda").manual_seed(hidden)
    shape = (1, 24, hidden) if spec.structure.grid is not None else (1, 2, 3, hidden)
    inputs, params = valid_call(op, torch.float16, gen, shape=shape)
    rotary_suite.check(op, fns[op](*inputs, *params), inputs, params, spec.default_convention)


BIG_OPS = ["rmsnorm", "residual_adaln_rmsnorm", "silu_and_mul", "gelu_tanh", "rope"]


@pytest.mark.parametrize("op", BIG_OPS)
def test_more_than_2_to_the_31_elements(fns, op):
    """An output of over 2^31 elements (bf16, 4 GiB): the first and the last rows against the
    reference, so a 32-bit index anywhere shows as a wrong or unwritten tail."""
    spec = load_spec(op)
    gen = torch.Generator(device="cuda").manual_seed(31)
    if op in ROTARY:
        shape, k_heads = (1, 2, 2**31 // (2 * 128) + 3, 128), 1
    else:
        shape, k_heads = (2, 2**31 // (2 * 4096) + 3, 4096), None
    assert math.prod(shape) > 2**31
    inputs = example_inputs(spec, shape, torch.bfloat16, per_batch=True, k_heads=k_heads, generator=gen)
    params = [p.default for p in spec.params]
    rows_suite.poison_allocator(math.prod(shape), torch.bfloat16, len(spec.outputs))
    outs = fns[op](*inputs, *params)
    outs = outs if isinstance(outs, tuple) else (outs,)
    token_dim = -2
    for part in (slice(0, 5), slice(-5, None)):

        def cut(t):
            if t is None or t.dim() == 1 or t.shape[token_dim] == 1:
                return t  # weights, per-batch modulation
            return t[(slice(None),) * (t.dim() + token_dim) + (part,)]

        pieces = tuple(cut(o) for o in outs)
        suite = rotary_suite if op in ROTARY else rows_suite
        suite.check(
            op,
            pieces if len(pieces) > 1 else pieces[0],
            [cut(t) for t in inputs],
            params,
            spec.default_convention,
        )
    del inputs, outs
    torch.cuda.empty_cache()


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


@two_gpus
@pytest.mark.parametrize("op", OPS)
def test_second_gpu(fns, op):
    """On cuda:1 while cuda:0 is current: the same result as on cuda:0; a tensor on the other GPU
    than x is refused by name."""
    spec = load_spec(op)
    gen = torch.Generator(device="cuda").manual_seed(29)
    inputs, params = valid_call(op, torch.bfloat16, gen)
    here = fns[op](*inputs, *params)
    there = fns[op](*[None if t is None else t.to("cuda:1") for t in inputs], *params)
    for a, b in zip(
        here if isinstance(here, tuple) else (here,), there if isinstance(there, tuple) else (there,)
    ):
        assert b.device == torch.device("cuda:1") and torch.equal(a, b.to("cuda:0"))
    if len(spec.inputs) > 1:
        inputs[1] = inputs[1].to("cuda:1")
        with pytest.raises(ValueError, match=rf"{op}: {spec.inputs[1].name} is on cuda:1 but x is on cuda:0"):
            fns[op](*inputs, *params)

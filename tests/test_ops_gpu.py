"""Every row_reduce and elementwise op on the GPU: hypothesis property tests against its float64
reference (shapes, dtypes, values, optional inputs, per-batch or per-token broadcast inputs,
conventions), edge hidden sizes, strided and misaligned views, empty input, opcheck and
torch.compile; and every op's generated project runs its own tests and benchmark. Inputs are built
from each spec's tensors, so a new op is covered by adding its spec. Rotary ops: test_rotary_gpu;
softmax losses: test_softmax_loss_gpu."""

from __future__ import annotations

import inspect
import math

import pytest
import sympy as sp
import torch
from conftest import REFUSAL, refused, usable_dtype
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kgen.bench import example_inputs, tensor_shape
from kgen.catalog import load_spec, op_names
from kgen.dsl import to_io_dtype

pytestmark = pytest.mark.gpu

ALL_OPS = op_names()
OPS = [op for op in ALL_OPS if load_spec(op).structure.kind in ("row_reduce", "elementwise")]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}


def roundings(op: str, convention: str, output: str) -> int:
    """Roundings to the I/O dtype on the way to an output: the final store plus each to_io_dtype."""
    structure = load_spec(op).structure
    conv = next(c for c in structure.conventions if c.name == convention)
    prologue = (
        getattr(structure, "prologue", {}) | conv.prologue
    )  # r rounded once more than the reference may
    exprs = [conv.outputs[output], *prologue.values()]
    return 1 + sum(1 for e in exprs for _ in sp.preorder_traversal(e) if isinstance(_, to_io_dtype))


def make_inputs(op, shape, dtype, gen, magnitude=1.0, present=None, per_batch=False):
    return example_inputs(
        load_spec(op), shape, dtype, generator=gen, magnitude=magnitude, present=present, per_batch=per_batch
    )


def reference(op, inputs, params, convention):
    spec = load_spec(op)
    kwargs = (
        {"convention": convention} if "convention" in inspect.signature(spec.reference).parameters else {}
    )
    return spec.reference(*inputs, *params, **kwargs)


def check(op, outs, inputs, params, convention):
    spec = load_spec(op)
    expected = reference(op, inputs, params, convention)
    # The size of the terms that cancel: the reference at |inputs| (e.g. gelu's 1 + erf(g) for
    # negative g, or adaln's shift against the modulated norm), whose fp32 rounding shows up as an
    # absolute error relative to it.
    magnitude = reference(op, [t if t is None else t.abs() for t in inputs], params, convention)
    if isinstance(outs, torch.Tensor):
        outs, expected, magnitude = (outs,), (expected,), (magnitude,)
    assert len(outs) == len(spec.outputs)
    x = inputs[0]
    for out, ref, mag, tensor in zip(outs, expected, magnitude, spec.outputs):
        assert out.shape == ref.shape and out.dtype == x.dtype and out.device == x.device
        # NaN only where the reference has one (overflow to inf, inf·0): poisoned elements show here
        assert torch.equal(torch.isnan(out), torch.isnan(ref)), (
            f"{tensor.name}: unwritten (poisoned) or stray NaN"
        )
        hidden = out.shape[-1]
        ulp = 2.0 ** -MANTISSA_BITS[x.dtype]
        rel = roundings(op, convention, tensor.name) * ulp + 8 * math.sqrt(hidden) * 2.0**-24
        got, want = out.double().reshape(-1, hidden), ref.reshape(-1, hidden)
        mag = mag.abs().reshape(-1, hidden)
        # plus the dtype's subnormal spacing for each rounding (fp16 results below 6e-5 are subnormal)
        subnormal = torch.finfo(x.dtype).smallest_normal * ulp
        bound = (
            rel * want.abs()
            + 4 * rel * torch.where(torch.isfinite(mag), mag, 0)
            + roundings(op, convention, tensor.name) * subnormal
        )
        if spec.structure.kind == "row_reduce":
            # Per row: rel times the row's largest value times how much subtracting the row mean
            # cancels (layernorm's x - mean loses digits in fp32, as torch's own fp32 math does;
            # about 1 for rmsnorm).
            # the normalized row: the row inputs of the lead's shape added (a residual form's x + residual)
            rows = [
                v for t, v in zip(spec.inputs, inputs) if v is not None and t.per_row and v.shape == x.shape
            ]
            x64 = sum(v.double() for v in rows).reshape(-1, x.shape[-1])
            centered = (x64 - x64.mean(-1, keepdim=True)).abs().amax(-1, keepdim=True)
            cancel = (x64.abs().amax(-1, keepdim=True) / centered.clamp_min(1e-300)).clamp_min(1.0)
            row_scale = torch.where(torch.isfinite(want), want.abs(), 0).amax(-1, keepdim=True)
            bound = bound + rel * cancel * row_scale
        same = (got == want) | (torch.isnan(got) & torch.isnan(want))
        # beyond the dtype's range the store overflows to ±inf (or rounds to ±max), as torch's would
        top = torch.finfo(x.dtype).max
        same |= (want.abs() > top * (1 - 2 * ulp)) & (got.abs() >= top) & (got.sign() == want.sign())
        ok = same | ((got - want).abs() <= bound)
        if not ok.all():
            worst = ((got - want).abs() / bound).nan_to_num(float("inf")).argmax()
            raise AssertionError(
                f"{op} {tensor.name} {convention}: {int((~ok).sum())} of {ok.numel()} elements "
                f"off; worst got {got.flatten()[worst].item()!r}, want {want.flatten()[worst].item()!r}, "
                f"allowed ±{bound.flatten()[worst].item():.3g}"
            )


def poison_allocator(numel: int, dtype: torch.dtype, outputs: int) -> None:
    """Fill the blocks the caching allocator hands out next with NaN, so unwritten output shows."""
    blocks = [torch.full((numel,), float("nan"), dtype=dtype, device="cuda") for _ in range(outputs)]
    del blocks


@pytest.fixture(scope="module")
def kernels_by_op(built):
    return {op: getattr(built(op)[1], op) for op in OPS}


hidden_sizes = st.one_of(
    st.integers(1, 64),
    st.integers(65, 9000),
    st.sampled_from([127, 128, 2048, 4095, 4096, 5120, 8192, 16384]),
    st.integers(9000, 65536),
)


@st.composite
def cases(draw):
    op = draw(st.sampled_from(OPS))
    spec = load_spec(op)
    hidden = draw(hidden_sizes)
    rows = draw(st.integers(1, max(1, min(4096, 2_000_000 // hidden))))
    lead = draw(st.sampled_from(["1d", "2d", "3d"])) if rows > 1 else "1d"
    shape = (hidden,) if lead == "1d" and rows == 1 else (rows, hidden)
    if lead == "3d":
        first = draw(st.sampled_from([d for d in (1, 2, 3, 4) if rows % d == 0]))
        shape = (first, rows // first, hidden)
    return dict(
        op=op,
        shape=shape,
        dtype=draw(st.sampled_from(DTYPES)),
        params=[draw(st.sampled_from([p.default, 1e-12, 0.1])) for p in spec.params],
        present={t.name: draw(st.booleans()) for t in spec.inputs if t.optional},
        magnitude=draw(st.sampled_from([1e-3, 1.0, 30.0, 1e4])),
        per_batch=draw(st.booleans()) if any(t.broadcast for t in spec.inputs) else False,
        convention=draw(st.sampled_from([c.name for c in spec.structure.conventions])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_matches_float64_reference(kernels_by_op, case):
    op = case["op"]
    gen = torch.Generator(device="cuda").manual_seed(case["seed"])
    inputs = make_inputs(
        op, case["shape"], case["dtype"], gen, case["magnitude"], case["present"], case["per_batch"]
    )
    if refused(case["dtype"]):  # the tested arch has no arithmetic for it: the build says so
        with pytest.raises(TypeError, match=REFUSAL):
            kernels_by_op[op](*inputs, *case["params"], convention=case["convention"])
        return
    poison_allocator(inputs[0].numel(), case["dtype"], len(load_spec(op).outputs))
    outs = kernels_by_op[op](*inputs, *case["params"], convention=case["convention"])
    check(op, outs, inputs, case["params"], case["convention"])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 3, 8, 100, 128, 4096, 5120, 65536, 100_000, 262_144])
def test_edge_hidden_sizes(kernels_by_op, op, dtype, hidden):
    """Every planner bucket, the shared-memory row and the re-read path beyond it."""
    gen = torch.Generator(device="cuda").manual_seed(hidden)
    inputs = make_inputs(op, (3, hidden), dtype, gen)
    params = [p.default for p in load_spec(op).params]
    for convention in [c.name for c in load_spec(op).structure.conventions]:
        poison_allocator(inputs[0].numel(), dtype, len(load_spec(op).outputs))
        check(op, kernels_by_op[op](*inputs, *params, convention=convention), inputs, params, convention)


LAYOUTS = {  # (dtype, generator) -> a [64, 4096] view
    "row-strided": lambda d, g: torch.randn(64, 4104, generator=g, device="cuda").to(d)[:, :4096],  # no copy
    "misaligned": lambda d, g: (
        torch.randn(64 * 4096 + 1, generator=g, device="cuda").to(d)[1:].view(64, 4096)
    ),
    "transposed": lambda d, g: torch.randn(4096, 64, generator=g, device="cuda").to(d).t(),  # copied
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_strided_and_misaligned_views(kernels_by_op, op, dtype, layout):
    spec = load_spec(op)
    gen = torch.Generator(device="cuda").manual_seed(7)
    inputs = [
        LAYOUTS[layout](own, gen) if t.per_row else torch.randn(4096, generator=gen, device="cuda").to(own)
        for t, own in ((t, torch.float32 if t.dtype == "float32" else dtype) for t in spec.inputs)
    ]  # a packed input's halves are 2048 wide
    assert (inputs[0].data_ptr() % 16 != 0) == (layout == "misaligned")
    assert (inputs[0].stride(0) == 4104) == (layout == "row-strided")
    params = [p.default for p in spec.params]
    check(op, kernels_by_op[op](*inputs, *params), inputs, params, spec.default_convention)


@pytest.mark.parametrize("op", OPS)
def test_empty_input(kernels_by_op, op):
    spec = load_spec(op)
    inputs = [
        torch.randn(
            tensor_shape(spec, t, (0, 4096)),
            device="cuda",
            dtype=torch.float32 if t.dtype == "float32" else torch.float16,
        )
        for t in spec.inputs
    ]
    outs = kernels_by_op[op](*inputs)
    for out in (outs,) if isinstance(outs, torch.Tensor) else outs:
        assert out.shape == (0, 4096)


@pytest.mark.parametrize("op", OPS)
def test_opcheck_every_convention(built, op):
    spec = load_spec(op)
    ops = built(op)[1]._ops.ops
    gen = torch.Generator(device="cuda").manual_seed(0)
    for i, convention in enumerate(spec.structure.conventions):
        op_overload = getattr(ops, op if i == 0 else f"{op}_{convention.name}")
        for dtype in DTYPES:
            inputs = make_inputs(op, (5, 7, 256), dtype, gen)
            if refused(dtype):
                with pytest.raises(TypeError, match=REFUSAL):
                    op_overload(*inputs, *[p.default for p in spec.params])
                continue
            torch.library.opcheck(op_overload, (*inputs, *[p.default for p in spec.params]))
            if any(t.broadcast for t in spec.inputs):
                inputs = make_inputs(op, (5, 7, 256), dtype, gen, per_batch=True)
                torch.library.opcheck(op_overload, (*inputs, *[p.default for p in spec.params]))
            if any(t.optional for t in spec.inputs):
                absent = make_inputs(
                    op, (5, 7, 256), dtype, gen, present={t.name: False for t in spec.inputs}
                )
                torch.library.opcheck(op_overload, (*absent, *[p.default for p in spec.params]))


@pytest.mark.parametrize("op", OPS)
def test_torch_compile_fullgraph(kernels_by_op, op):
    torch._dynamo.reset()
    fn = kernels_by_op[op]

    def block(*inputs):
        outs = fn(inputs[0] * 2, *inputs[1:])
        return tuple(o + 1 for o in outs) if isinstance(outs, tuple) else outs + 1

    gen = torch.Generator(device="cuda").manual_seed(1)
    inputs = make_inputs(op, (8, 512, 4096), usable_dtype(), gen)
    compiled = torch.compile(block, fullgraph=True)
    got, want = compiled(*inputs), block(*inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch._dynamo.explain(block)(*inputs).graph_break_count == 0


@pytest.mark.parametrize("op", ALL_OPS)
def test_the_generated_project_runs_its_own_test_and_benchmark(built, op):
    """What a user of the published kernel runs: the project's tests/ and benchmarks/."""
    import os
    import subprocess
    import sys

    project, _ = built(op)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project / "tests")],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-3000:]
    assert " passed" in tests.stdout and "skipped" not in tests.stdout.splitlines()[-1]
    bench = subprocess.run(
        [sys.executable, str(project / "benchmarks" / f"benchmark_{op}.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
    )
    assert bench.returncode == 0 and "GB/s" in bench.stdout, bench.stdout[-2000:] + bench.stderr[-2000:]


INPLACE_OPS = [op for op in OPS if load_spec(op).inplace]


@pytest.mark.parametrize("op", INPLACE_OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_inplace_form(built, op, dtype):
    """<op>_ writes the mapped outputs into their inputs and returns the rest, equal to <op>;
    an input that cannot be updated through a [rows, hidden] view is refused, not copied."""
    spec = load_spec(op)
    module = built(op)[1]
    gen = torch.Generator(device="cuda").manual_seed(11)
    params = [p.default for p in spec.params]
    names = [t.name for t in spec.inputs]
    for convention in [c.name for c in spec.structure.conventions]:
        inputs = make_inputs(op, (3, 50, 1000), dtype, gen)
        expected = getattr(module, op)(*inputs, *params, convention=convention)
        expected = expected if isinstance(expected, tuple) else (expected,)
        returned = getattr(module, f"{op}_")(*inputs, *params, convention=convention)
        kept = [out for out, t in zip(expected, spec.outputs) if t.name not in spec.inplace]
        returned = () if returned is None else returned if isinstance(returned, tuple) else (returned,)
        assert len(returned) == len(kept) and all(torch.equal(a, b) for a, b in zip(returned, kept))
        for out, t in zip(expected, spec.outputs):
            if t.name in spec.inplace:
                assert torch.equal(inputs[names.index(spec.inplace[t.name])], out)
        overload = getattr(
            module._ops.ops, f"{op}_" if convention == spec.default_convention else f"{op}_{convention}_"
        )
        torch.library.opcheck(overload, (*make_inputs(op, (3, 50, 1000), dtype, gen), *params))
    target = (
        spec.inplace[spec.outputs[-1].name]
        if spec.outputs[-1].name in spec.inplace
        else next(iter(spec.inplace.values()))
    )
    inputs = make_inputs(op, (64, 256), dtype, gen)
    inputs[names.index(target)] = (
        inputs[names.index(target)].t().contiguous().t()
    )  # column-major: not a row view
    with pytest.raises(ValueError, match=f"{op}_: {target} is updated in place, so it must be viewable"):
        getattr(module, f"{op}_")(*inputs, *params)


def f_gelu_tanh(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


LIBRARY_GELUS = {  # (op, convention): the library code that convention claims, bit for bit
    ("gelu_tanh", "single_rounding"): f_gelu_tanh,
    ("geglu", "erf_diffusers"): load_spec("geglu").peers["eager (diffusers GEGLU)"],
    ("geglu", "tanh_diffusers"): lambda x: (lambda h, g: h * f_gelu_tanh(g))(*x.chunk(2, dim=-1)),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    which=st.sampled_from(sorted(LIBRARY_GELUS)),
    rows=st.integers(1, 64),
    hidden=st.sampled_from([1, 7, 8, 1000, 8192]),
    dtype=st.sampled_from(DTYPES),
    magnitude=st.sampled_from([1e-3, 1.0, 3.0, 30.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_gelus_are_the_librarys_bitwise(kernels_by_op, which, rows, hidden, dtype, magnitude, seed):
    """A GELU convention that names F.gelu(approximate='tanh') or diffusers' GEGLU takes the same fp32 steps
    (kBeta · (x + kKappa · x³), tanhf or erff, 0.5 · x · (1 + t), the library's roundings), so the same bits
    in every dtype, specials included."""
    assume(not refused(dtype))
    op, convention = which
    gen = torch.Generator(device="cuda").manual_seed(seed)
    width = hidden * (2 if op == "geglu" else 1)
    x = (torch.randn(rows, width, generator=gen, device="cuda") * magnitude).to(dtype)
    x.view(-1)[: min(4, x.numel())] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])[
        : min(4, x.numel())
    ].to(dtype)
    got, want = kernels_by_op[op](x, convention=convention), LIBRARY_GELUS[which](x)
    same = (got == want) | (got.isnan() & want.isnan())
    assert same.all(), f"{int((~same).sum())} of {same.numel()} elements differ from the library"

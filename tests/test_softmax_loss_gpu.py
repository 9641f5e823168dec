"""Softmax losses (cross_entropy) on the GPU: hypothesis property tests of the loss and its derived gradient
against float64 references (rows, vocabulary sizes with odd and huge rows, dtypes, magnitudes, labels with
ignored rows, strided scores), against F.cross_entropy on float32 logits (what transformers computes), bad
labels giving NaN, a zero-stride incoming gradient (the mean's), the gradient's log-sum-exp taken from the
saved loss, opcheck, a compiled training step with no graph break, and gradients that repeat bitwise."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import REFUSAL, refused, usable_dtype
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgen.bench import example_inputs
from kgen.catalog import load_spec, op_names
from kgen.families import family_of

pytestmark = pytest.mark.gpu

LOSSES = [op for op in op_names() if load_spec(op).structure.kind == "softmax_loss"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}


@pytest.fixture(scope="module")
def libraries(built):
    return {op: built(op)[1] for op in LOSSES}


def inputs_at(op, shape, dtype, seed, magnitude=1.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits, label = example_inputs(load_spec(op), shape, dtype, generator=gen, magnitude=magnitude)
    return logits, label


def reference_loss(op, logits, label):
    spec = load_spec(op)
    return spec.reference(logits, label, *[p.default for p in spec.params])


def reference_grad(op, logits, label, loss, grad):
    """float64 autograd of the reference; the backward op's inputs in its order (the forward's saved loss
    among them, which the reference recomputes)."""
    spec = load_spec(op)
    back = family_of(spec).backward(spec)
    given = {"logits": logits, "label": label, "loss": loss, "grad_loss": grad}
    (found,) = back.reference(*[given[t.name] for t in back.inputs], *[p.default for p in spec.params])
    return found


def assert_loss_close(got, want, hidden):
    """fp32 math over the row: the log-sum-exp's error grows with the row's length (about sqrt(hidden)
    roundings of a sum), relative to the loss and the log-sum-exp's own size."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "stray or missing NaN"
    bound = (4 * hidden**0.5 + 16) * 2.0**-24 * (want.abs() + 1 + torch.log(torch.tensor(float(hidden))))
    ok = (got.double() - want).abs() <= bound
    ok |= torch.isnan(got) & torch.isnan(want)
    assert ok.all(), (
        f"{int((~ok).sum())} of {ok.numel()} losses off: worst {((got.double() - want).abs() / bound).max()}"
    )


def assert_grad_close(got, want, dtype, logits, label, grad):
    """Each element g·(p - [label]) rounded once to the dtype, after fp32 math: p = exp(z - lse) is off by
    the roundings of its argument (relative to |z| + |lse|) and of the log-sum-exp's sum (as in
    assert_loss_close), and p - 1 at the label by a rounding of 1. The scores are the logits as they are
    (cross_entropy's logit is the identity)."""
    assert got.dtype == dtype and got.shape == want.shape
    ulp = 2.0 ** -MANTISSA_BITS[dtype]
    z = logits.double()
    lse = torch.logsumexp(z, -1, keepdim=True)
    p = (z - lse).exp()
    hit = torch.zeros_like(z).scatter_(-1, label.clamp_min(0).unsqueeze(-1), 1.0)
    # lse comes from the saved fp32 loss (lse - picked, rounded at its own size) plus the picked score
    picked = z.gather(-1, label.clamp_min(0).unsqueeze(-1))
    rel = (4 * z.shape[-1] ** 0.5 + 16 + z.abs() + lse.abs() + (lse - picked).abs()) * 2.0**-24
    fp32 = 2 * grad.double().abs().unsqueeze(-1) * (p * rel + hit * 2.0**-24)
    bound = ulp * want.abs() + fp32 + torch.finfo(dtype).smallest_normal
    ok = ((got.double() - want).abs() <= bound) | (torch.isnan(got) & torch.isnan(want))
    assert ok.all(), (
        f"{int((~ok).sum())} of {ok.numel()} gradient elements off: worst "
        f"{((got.double() - want).abs() / bound).max()}"
    )


@st.composite
def cases(draw):
    hidden = draw(
        st.one_of(st.integers(1, 64), st.integers(65, 9000), st.sampled_from([4095, 32000, 32001, 151936]))
    )
    rows = draw(st.integers(1, max(1, min(512, 4_000_000 // hidden))))
    shape = draw(st.sampled_from([(rows, hidden), (1, rows, hidden)]))
    return dict(
        op=draw(st.sampled_from(LOSSES)),
        shape=shape,
        dtype=draw(st.sampled_from(DTYPES)),
        magnitude=draw(st.sampled_from([1e-3, 1.0, 30.0])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_loss_and_gradient_match_float64(libraries, case):
    op, dtype = case["op"], case["dtype"]
    logits, label = inputs_at(op, case["shape"], dtype, case["seed"], case["magnitude"])
    fn = getattr(libraries[op], op)
    if refused(dtype):
        with pytest.raises(TypeError, match=REFUSAL):
            fn(logits, label)
        return
    leaf = logits.clone().requires_grad_()
    loss = fn(leaf, label)
    assert_loss_close(loss, reference_loss(op, logits, label), logits.shape[-1])
    grad = torch.randn(loss.shape, device="cuda")
    (got,) = torch.autograd.grad(loss, leaf, grad)
    assert_grad_close(got, reference_grad(op, logits, label, loss, grad), dtype, logits, label, grad)


@pytest.mark.parametrize("shape", [(7, 1000), (3, 32001), (2, 151936)])
def test_strided_scores_are_read_in_place_or_copied(libraries, shape):
    dtype = usable_dtype()
    for op in LOSSES:
        wide, label = inputs_at(op, (shape[0], shape[1] + 8), dtype, 3)
        logits = wide[:, 1 : shape[1] + 1]  # row-strided and misaligned
        loss = getattr(libraries[op], op)(logits, label.clamp(max=shape[1] - 1))
        assert_loss_close(loss, reference_loss(op, logits, label.clamp(max=shape[1] - 1)), shape[1])


def test_matches_f_cross_entropy_on_float32_logits(libraries):
    """What transformers computes: the logits copied to float32, F.cross_entropy, the mean over the rows
    with a label; and its gradient."""
    dtype = usable_dtype()
    logits, label = inputs_at("cross_entropy", (512, 151936), dtype, 11, magnitude=4.0)
    leaf = logits.clone().requires_grad_()
    loss = libraries["cross_entropy"].cross_entropy(leaf, label)
    mean = loss.sum() / (label != -100).sum()
    ours = torch.autograd.grad(mean, leaf)[0]
    theirs_leaf = logits.clone().requires_grad_()
    theirs = F.cross_entropy(theirs_leaf.float(), label, ignore_index=-100)
    (their_grad,) = torch.autograd.grad(theirs, theirs_leaf)
    torch.testing.assert_close(mean, theirs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours, their_grad, rtol=2.0 ** -MANTISSA_BITS[dtype], atol=1e-7)


def test_ignored_rows_and_bad_labels(libraries):
    logits, _ = inputs_at("cross_entropy", (6, 1000), usable_dtype(), 5)
    label = torch.tensor([3, -100, 999, 1000, -1, 0], device="cuda")
    leaf = logits.clone().requires_grad_()
    loss = libraries["cross_entropy"].cross_entropy(leaf, label)
    assert loss[1] == 0 and torch.isfinite(loss[[0, 2, 5]]).all()
    assert torch.isnan(loss[3]) and torch.isnan(loss[4]), "a label outside [0, hidden) must not be silent"
    (grad,) = torch.autograd.grad(loss[[0, 1, 2, 5]].sum(), leaf)
    assert (grad[1] == 0).all() and torch.isfinite(grad[[0, 2, 5]]).all()


def test_zero_stride_gradient_of_the_mean_and_runs_repeat_bitwise(libraries):
    logits, label = inputs_at("cross_entropy", (64, 32000), usable_dtype(), 9)
    grads = []
    for _ in range(2):
        leaf = logits.clone().requires_grad_()
        libraries["cross_entropy"].cross_entropy(leaf, label).mean().backward()  # grad: expanded, stride 0
        grads.append(leaf.grad)
    assert torch.equal(grads[0], grads[1])
    grad = torch.full(label.shape, 1 / 64, device="cuda")
    assert_grad_close(
        grads[0],
        reference_grad(
            "cross_entropy", logits, label, libraries["cross_entropy"].cross_entropy(logits, label), grad
        ),
        logits.dtype,
        logits,
        label,
        grad,
    )


def test_the_gradient_takes_the_log_sum_exp_from_the_saved_loss(libraries):
    """The backward reads each row once: its log-sum-exp is the forward's saved loss plus the score at the
    label. A loss off by 1 scales every softmax term by e^-1; the loss changed in place after the forward is
    refused by autograd, not used."""
    ops = libraries["cross_entropy"]._ops.ops
    logits, label = inputs_at("cross_entropy", (8, 5000), torch.float32, 4)
    label = label.clamp_min(0)  # every row labelled
    loss = ops.cross_entropy(logits, label, -100)
    grad = torch.rand_like(loss)
    got = ops.cross_entropy_backward(logits, label, loss + 1, grad, -100)
    z = logits.double()
    p = torch.softmax(z, -1)
    hit = torch.zeros_like(z).scatter_(-1, label.unsqueeze(-1), 1.0)
    want = grad.double().unsqueeze(-1) * (p * math.exp(-1) - hit)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-7)
    leaf = logits.clone().requires_grad_()
    out = libraries["cross_entropy"].cross_entropy(leaf, label)
    out.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_opcheck_and_compiled_training_step(libraries):
    ops = libraries["cross_entropy"]._ops.ops
    logits, label = inputs_at("cross_entropy", (5, 7, 1000), usable_dtype(), 2)
    torch.library.opcheck(ops.cross_entropy, (logits.clone().requires_grad_(), label, -100))
    fn = libraries["cross_entropy"].cross_entropy

    def step(x, y):
        return fn(x * 2, y).mean()

    torch._dynamo.reset()
    leaf = logits.clone().requires_grad_()
    compiled = torch.compile(step, fullgraph=True)
    compiled(leaf, label).backward()
    eager_leaf = logits.clone().requires_grad_()
    step(eager_leaf, label).backward()
    torch.testing.assert_close(leaf.grad, eager_leaf.grad, rtol=0, atol=0)
    assert torch._dynamo.explain(step)(leaf, label).graph_break_count == 0


def test_errors_name_the_argument(libraries):
    fn = libraries["cross_entropy"].cross_entropy
    logits, label = inputs_at("cross_entropy", (4, 100), usable_dtype(), 1)
    with pytest.raises(TypeError, match="label must be int64"):
        fn(logits, label.int())
    with pytest.raises(ValueError, match=r"label must have shape \[4\]"):
        fn(logits, label[:3])
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        fn(logits, label.cpu())

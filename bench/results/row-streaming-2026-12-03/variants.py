"""Row-reduction kernels with per-batch (broadcast) inputs: plain loads and stores of the row data ("base")
against cache-streaming ones ("stream", evict-first, so the per-batch vectors every row reads again stay in
L1 and L2), interleaved in one process with the peers and a same-size copy; outputs compared bitwise. The
builds: `kgen build OPS --arch sm_90 --compile --out BASE` from main and the same into STREAM with
stream.patch (beside this script) applied with `patch -p1`. Run: python variants.py BASE STREAM OP...
(results in variants.json beside it). Not kept: streaming was slower everywhere (BENCHMARKS.md)."""

import json
import statistics
import sys
from pathlib import Path

import torch

from kgen.bench import Timer, example_inputs
from kgen.builder import load
from kgen.catalog import load_spec, suite

VARIANTS = {"base": sys.argv[1], "stream": sys.argv[2]}
EXTRA = {"residual_adaln_rmsnorm": [(2, 6144, 2048)]}  # per batch, the anchors' size, outside the suite
timer = Timer(torch, 100)
results = []
for op in sys.argv[3:]:
    spec = load_spec(op)
    kern = {v: getattr(load(Path(root) / f"{op.replace('_', '-')}-sm90"), op) for v, root in VARIANTS.items()}
    cases = [(c.shape, c.per_batch, c.param_values(spec)) for c in suite(op)]
    cases += [(s, True, suite(op)[0].param_values(spec)) for s in EXTRA.get(op, [])]
    for shape, per_batch, params in cases:
        inputs = example_inputs(spec, shape, torch.bfloat16, per_batch=per_batch)
        outs = {v: k(*inputs, *params) for v, k in kern.items()}
        outs = {v: o if isinstance(o, tuple) else (o,) for v, o in outs.items()}
        same = all(torch.equal(a, b) for a, b in zip(outs["base"], outs["stream"]))
        nbytes = sum(t.numel() * t.element_size() for t in [*inputs, *outs["base"]])
        del outs
        fns = {v: (lambda k=k: k(*inputs, *params)) for v, k in kern.items()}
        for name, fn in spec.peers.items():
            fns[name] = lambda fn=fn: fn(*inputs, *params)
        torch._dynamo.reset()
        compiled = torch.compile(next(iter(spec.peers.values())), dynamic=False)
        fns["compile"] = lambda: compiled(*inputs, *params)
        copy = timer.copy_us(nbytes)
        per = timer.rounds_us(fns, 3)
        med = {n: statistics.median(t) for n, t in per.items()}
        best = min(t for n, t in med.items() if n not in VARIANTS)
        label = f"{'x'.join(map(str, shape))}{' per batch' if per_batch else ''}"
        print(
            f"{op} {label} {nbytes / 1e6:.1f} MB copy {copy:.1f} | "
            + " ".join(f"{n}={t:.1f}" for n, t in med.items())
            + f" | best peer {best:.1f} | % copy "
            + " ".join(f"{v} {100 * copy / med[v]:.0f}" for v in VARIANTS)
            + f" | best peer / stream {best / med['stream']:.2f} | bitwise same {same}",
            flush=True,
        )
        results.append(
            {
                "op": op,
                "shape": list(shape),
                "per_batch": per_batch,
                "bytes": nbytes,
                "copy_us": copy,
                "median_us": med,
                "rounds_us": per,
                "same": same,
            }
        )
        Path(sys.argv[0]).with_name("variants.json").write_text(json.dumps(results, indent=1))

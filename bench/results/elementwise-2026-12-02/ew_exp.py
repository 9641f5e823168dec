"""Elementwise kernels before (one thread per position) and after (threads walking positions) against the
peers, interleaved in one process; gelu_tanh against F.gelu bitwise. The builds: `kgen build geglu
silu_and_mul silu_mul --arch sm_90 --dtype bf16 --compile --out /tmp/kbold` and `kgen build gelu_tanh --arch
sm_90 --compile --out /tmp/kbold` from main, the same into /tmp/kbnew from the branch elementwise-walk (for
the accesses-per-thread run, VARIANTS named /tmp/kb1, /tmp/kb2 and /tmp/kb4, built with
[planner.elementwise] accesses_per_thread = 1, 2, 4)."""

import json
import statistics
import sys
from pathlib import Path

import torch

from kgen.bench import Timer, example_inputs
from kgen.builder import load
from kgen.catalog import load_spec, suite

VARIANTS = {"old": "/tmp/kbold", "new": "/tmp/kbnew"}
EXTRA = {  # model shapes outside the suite: Wan 1.3B / 14B FFN, Flux FFN, odd sizes
    "gelu_tanh": [(1, 32760, 8960), (1, 4608, 12288), (1, 2048, 13824), (3, 1001, 4104), (64, 8960)],
    "geglu": [(3, 1001, 4104)],
    "silu_and_mul": [(3, 1001, 4104), (1, 14336)],
    "silu_mul": [(3, 1001, 4104)],
}
timer = Timer(torch, 100)
results = []
if "gelu_tanh" in sys.argv[1:]:  # bitwise against F.gelu, every dtype, the old and the new spelling
    g = torch.Generator(device="cuda").manual_seed(0)
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        x = (torch.randn(4096, 8192, device="cuda", generator=g) * 3).to(dt)
        ref = torch.nn.functional.gelu(x, approximate="tanh")
        for v, root in VARIANTS.items():
            k = load(Path(root) / "gelu-tanh-sm90").gelu_tanh
            out = k(x)
            print(
                f"bitwise gelu_tanh {v} {dt}: {(out != ref).sum().item()} of {x.numel()} differ from F.gelu",
                flush=True,
            )
for op in sys.argv[1:]:
    spec = load_spec(op)
    kern = {v: getattr(load(Path(root) / f"{op.replace('_', '-')}-sm90"), op) for v, root in VARIANTS.items()}
    cases = [c.shape for c in suite(op)] + EXTRA.get(op, [])
    for shape in cases:
        inputs = example_inputs(spec, shape, torch.bfloat16)
        out = kern["old"](*inputs)
        ref = {v: k(*inputs) for v, k in kern.items()}
        same = all(torch.equal(ref["old"], r) for r in ref.values())
        outs = out if isinstance(out, tuple) else [out]
        nbytes = sum(t.numel() * t.element_size() for t in [*inputs, *outs])
        fns = {v: (lambda k=k: k(*inputs)) for v, k in kern.items()}
        for name, fn in spec.peers.items():
            try:
                fn(*inputs)
            except Exception as err:  # noqa: BLE001
                print("skip", name, err)
                continue
            fns[name] = lambda fn=fn: fn(*inputs)
        torch._dynamo.reset()
        compiled = torch.compile(next(iter(spec.peers.values())), dynamic=False)
        fns["compile"] = lambda: compiled(*inputs)
        copy = timer.copy_us(nbytes)
        per = timer.rounds_us(fns, 3)
        med = {n: statistics.median(t) for n, t in per.items()}
        best = min(t for n, t in med.items() if n not in VARIANTS)
        line = (
            f"{op} {shape} {nbytes / 1e6:.1f} MB copy {copy:.1f} | "
            + " ".join(f"{n}={t:.1f}" for n, t in med.items())
            + f" | best peer {best:.1f} | old/new % copy "
            + " ".join(f"{100 * copy / med[v]:.0f}" for v in VARIANTS)
            + f" | bitwise same {same}"
        )
        print(line, flush=True)
        results.append(
            {
                "op": op,
                "shape": list(shape),
                "bytes": nbytes,
                "copy_us": copy,
                "median_us": med,
                "rounds_us": per,
                "same": same,
            }
        )
Path("/tmp/res/ew_exp.json").write_text(json.dumps(results, indent=1))

"""LTX-Video's training step under torch.compile with kgen serving all of its ops, or only the attentions' q/k
norms with the rotation and the GELU (the blocks' AdaLN norms, their residual adds and norm_out left to
torch.compile, which fuses them with their neighbours): which takes more GPU work off the compiled step.
Each variant's step timed as `kgen bench --e2e ltx-train` does (CUDA events, rounds interleaved), and ten
steps back to back with no synchronization between them (the host's time before a step's first kernel then
overlaps the step before), and its kernels summed under torch.profiler (three profiled steps, the median of
each sum).

python3 bench/results/partials-h100-2026-12-07/ltx_split.py BUILD_DIR OUT.json"""

from __future__ import annotations

import copy
import functools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from kgen.integrations.diffusers import patch  # noqa: E402
from kgen.integrations.diffusion import _ltx_inputs  # noqa: E402
from kgen.integrations.e2e import _kernel_table, _median_ms  # noqa: E402


def main() -> None:
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LTXVideoTransformer3DModel(num_layers=4).to(torch.bfloat16).train()
    full = copy.deepcopy(model)
    patch(full, root=root)
    partial = copy.deepcopy(model)
    patch(partial, root=root)
    for block in partial.transformer_blocks:  # the blocks' own forward: torch's norms and residual adds
        del block.forward
    del partial.norm_out.forward
    inputs = _ltx_inputs(torch, "cuda", model, (7, 16, 24))
    target = torch.randn(*inputs["hidden_states"].shape[:2], model.config.out_channels, device="cuda")

    def step(m):
        m.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(m(**inputs)[0].float(), target).backward()

    models = {
        "torch.compile": torch.compile(model),
        "torch.compile + kgen": torch.compile(full),
        "torch.compile + kgen (attentions and GELU only)": torch.compile(partial),
    }

    def steps(m, count=10):  # back to back, no synchronization between them: the host runs ahead
        for _ in range(count):
            step(m)

    times, chained = {v: [] for v in models}, {v: [] for v in models}
    for i in range(4):
        for v, m in models.items():
            times[v].append(_median_ms(torch, "cuda", 20, functools.partial(step, m), grad=True))
            chained[v].append(_median_ms(torch, "cuda", 3, functools.partial(steps, m), grad=True) / 10)
            print(f"round {i + 1} {v}: {times[v][-1]:.2f} ms, chained {chained[v][-1]:.2f} ms", flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "variants": {}}
    for v, m in models.items():
        tables = [_kernel_table(torch, functools.partial(step, m), True) for _ in range(3)]
        result["variants"][v] = {
            "ms": statistics.median(times[v]),
            "rounds ms": times[v],
            "chained ms": statistics.median(chained[v]),  # ten steps timed together, a step's share
            "chained rounds ms": chained[v],
            "matmul us": statistics.median(t["matmul us"] for t in tables),
            "other us": statistics.median(t["other us"] for t in tables),
            "span us": statistics.median(t["span us"] for t in tables),
            "kernels": tables[0]["kernels"],
        }
        r = result["variants"][v]
        sums = f"matmul {r['matmul us']:.0f} us, other {r['other us']:.0f} us"
        print(f"{v}: {r['ms']:.2f} ms, {sums}", flush=True)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""Whole-model timing (`kgen bench --e2e ltx|qwen3`): each workload as eager, eager + kgen, torch.compile and
torch.compile + kgen, on one set of random weights (the kgen model is a deep copy, patched), median of the
rounds' medians, the variants interleaved within a round.

- ltx: the LTX-Video 2B transformer forward (28 blocks) at B = 2 and S = 2688 (7×16×24 latents: 49 frames at
  512×768) and S = 8064 (21×16×24: 161 frames), 128 caption tokens, bf16.
- qwen3: the Qwen3-8B config (36 layers): prefill of 2048 tokens (batch 1), and one decode step at batch 64
  after 512 tokens of context in a static cache (each timed step appends a token; a static cache attends over
  its whole length, so every step costs the same), bf16.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from pathlib import Path
from typing import Callable

from ..errors import KgenError
from .diffusers import patch
from .transformers import kernelize

WARMUP = 3
VARIANTS = ("eager", "eager + kgen", "torch.compile", "torch.compile + kgen")
GOALS = {"eager + kgen": ("eager", 1.10), "torch.compile + kgen": ("torch.compile", 1.03)}
QWEN3_8B = dict(
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-6,
    num_hidden_layers=36,
)


def _median_ms(torch, device: str, repeats: int, fn: Callable[[], object]) -> float:
    """CUDA events on the GPU (a whole forward: no L2 flush needed), the wall clock on a CPU."""
    with torch.no_grad():
        for _ in range(WARMUP):
            fn()
        times = []
        for _ in range(repeats):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                begin = time.perf_counter()
                fn()
                times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def _ltx(torch, device, config, patch_kwargs, steps):  # steps: the decode budget, for qwen3
    from diffusers import LTXVideoTransformer3DModel

    with torch.device(device):
        model = LTXVideoTransformer3DModel(**(config or {})).to(torch.bfloat16).eval()
    kgen = copy.deepcopy(model)
    patch(kgen, **patch_kwargs)
    workloads = {}
    for grid in [(7, 16, 24), (21, 16, 24)] if not config else [(2, 3, 4)]:
        inputs = dict(
            hidden_states=torch.randn(2, grid[0] * grid[1] * grid[2], model.config.in_channels),
            encoder_hidden_states=torch.randn(2, 128, model.config.caption_channels),
            timestep=torch.tensor([500, 500]),
            encoder_attention_mask=torch.ones(2, 128),
        )
        inputs = {
            k: v.to(device, torch.bfloat16 if v.is_floating_point() else v.dtype) for k, v in inputs.items()
        }
        kwargs = dict(
            num_frames=grid[0],
            height=grid[1],
            width=grid[2],
            rope_interpolation_scale=(8 / 25, 32, 32),
            return_dict=False,
        )
        name = f"LTX-Video forward, B=2, S={grid[0] * grid[1] * grid[2]} ({'×'.join(map(str, grid))})"
        workloads[name] = lambda m, inputs=inputs, kwargs=kwargs: m(**inputs, **kwargs)
    return model, kgen, workloads


def _qwen3(torch, device, config, kernelize_kwargs, steps):
    from transformers import Qwen3Config, Qwen3ForCausalLM, StaticCache

    cfg = Qwen3Config(**(config or QWEN3_8B))
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    kgen = copy.deepcopy(model)
    kernelize(kgen, **kernelize_kwargs)
    prefill, (batch, context) = (2048, (64, 512)) if not config else (32, (4, 16))
    ids = torch.randint(0, cfg.vocab_size, (1, prefill), device=device)
    tokens = torch.randint(0, cfg.vocab_size, (batch, 1), device=device)
    caches = {}

    def decode(m):
        if id(m) not in caches:  # each model (compiled or not) fills its own cache with the context once
            cache = StaticCache(config=cfg, max_cache_len=context + steps)
            m(
                torch.randint(0, cfg.vocab_size, (batch, context), device=device),
                past_key_values=cache,
                use_cache=True,
            )
            caches[id(m)] = cache
        return m(tokens, past_key_values=caches[id(m)], use_cache=True)

    workloads = {
        f"Qwen3 prefill, 1×{prefill} tokens": lambda m: m(ids, use_cache=False),
        f"Qwen3 decode step, batch {batch}, {context} tokens of context": decode,
    }
    return model, kgen, workloads


def run_e2e(
    target: str,
    *,
    rounds: int = 3,
    repeats: int = 20,
    device: str = "cuda",
    config: dict | None = None,
    variants: tuple[str, ...] = VARIANTS,
    build_root: Path = Path("build/bench"),
    arch: str | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """{"target", "device", "torch", "rows": [{"workload", "<variant> ms", ...}]}. ``config`` replaces the
    real model's (a small model for tests)."""
    import torch

    builders = {"ltx": _ltx, "qwen3": _qwen3}
    if target not in builders:
        raise KgenError(f"--e2e takes one of {sorted(builders)}, got {target!r}")
    torch.manual_seed(0)
    model, kgen, workloads = builders[target](
        torch, device, config, dict(root=build_root, arch=arch, step=log), rounds * (repeats + WARMUP)
    )
    models = {"eager": model, "eager + kgen": kgen}
    if "torch.compile" in variants:
        models["torch.compile"] = torch.compile(model)
    if "torch.compile + kgen" in variants:
        models["torch.compile + kgen"] = torch.compile(kgen)
    rows = []
    for workload, run in workloads.items():
        times = {v: [] for v in variants}
        for i in range(rounds):
            for variant in variants:
                times[variant].append(_median_ms(torch, device, repeats, lambda: run(models[variant])))
            log(f"{workload}: round {i + 1}/{rounds}")
        row = {"workload": workload, **{f"{v} ms": statistics.median(t) for v, t in times.items()}}
        for variant, (base, _) in GOALS.items():
            if variant in variants and base in variants:
                row[f"{variant} speed-up"] = row[f"{base} ms"] / row[f"{variant} ms"]
        rows.append(row)
    name = torch.cuda.get_device_name() if device == "cuda" else device
    return {
        "target": target,
        "device": name,
        "torch": torch.__version__,
        "rounds": rounds,
        "repeats": repeats,
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
    }


def markdown(result: dict) -> str:
    variants = [v for v in VARIANTS if f"{v} ms" in result["rows"][0]]
    ups = [v for v in GOALS if f"{v} speed-up" in result["rows"][0]]
    head = [
        "workload",
        *(f"{v} ms" for v in variants),
        *(f"{v} / {GOALS[v][0]} (goal ≥ {GOALS[v][1]}×)" for v in ups),
    ]
    lines = [
        f"{result['target']}: {result['device']}, torch {result['torch']}, {result['date']}; median of "
        f"{result['rounds']} rounds of {result['repeats']} runs.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in result["rows"]:
        cells = [
            row["workload"],
            *(f"{row[f'{v} ms']:.2f}" for v in variants),
            *(f"{row[f'{v} speed-up']:.3f}" for v in ups),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write(result: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"e2e-{result['target']}.json").write_text(json.dumps(result, indent=2) + "\n")
    path = out / f"e2e-{result['target']}.md"
    path.write_text(markdown(result))
    return path

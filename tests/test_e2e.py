"""The whole-model benchmark's harness (kgen.integrations.e2e) on small models: on a CPU the real libraries
with each op computed by its spec's reference (tests/conftest.py); the numbers themselves come from `kgen
bench --e2e` on the GPU (BENCHMARKS.md)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("diffusers")

from kgen.errors import KgenError  # noqa: E402
from kgen.integrations import diffusers as kgen_diffusers  # noqa: E402
from kgen.integrations import flux as kgen_flux  # noqa: E402
from kgen.integrations import transformers as kgen_transformers
from kgen.integrations import wan as kgen_wan  # noqa: E402
from kgen.integrations.e2e import is_matmul, markdown, run_e2e, write  # noqa: E402
from kgen.integrations.workloads import BUILDERS  # noqa: E402

pytestmark = pytest.mark.toolchain
SMALL = {
    "qwen3": dict(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        num_hidden_layers=2,
    ),
    "ltx": dict(
        in_channels=16,
        out_channels=16,
        num_attention_heads=2,
        attention_head_dim=32,
        cross_attention_dim=64,
        caption_channels=32,
        num_layers=2,
    ),
    "flux": dict(
        in_channels=16,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=(4, 6, 6),
        num_layers=1,
        num_single_layers=1,
    ),
    "wan": dict(
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=16,
        ffn_dim=32,
        num_layers=2,
    ),
}

SMALL["llama"] = {k: v for k, v in SMALL["qwen3"].items() if k != "head_dim"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real thing: kgen bench --e2e")
def test_qwen3_train_runs_kgens_ops_in_the_kgen_models_step_alone(reference_kernels, build_root):
    """The training workload's kgen model runs each layer's q/k norms and rotation as one qk_norm_rope (and
    its derived backward) and the loss's cross-entropy, compiled or not; the eager model runs none of kgen's
    ops, and transformers' module-level apply_rotary_pos_emb stays its own throughout."""
    from transformers.models.qwen3 import modeling_qwen3

    calls = reference_kernels(kgen_transformers.OPS + ("cross_entropy",))
    own = modeling_qwen3.apply_rotary_pos_emb
    kwargs = dict(root=build_root, arch="sm_90", step=lambda _: None)
    models, workloads = BUILDERS["qwen3-train"](torch, "cpu", SMALL["qwen3"], kwargs, 1, lambda _: None)
    (step,) = workloads.values()

    class Compiled(torch.nn.Module):  # as torch.compile returns a model: the original as _orig_mod
        def __init__(self, model):
            super().__init__()
            self._orig_mod = model

        def forward(self, *args, **kwargs):
            return self._orig_mod(*args, **kwargs)

    models["compiled kgen"] = Compiled(models["eager + kgen"])
    layers = SMALL["qwen3"]["num_hidden_layers"]
    for variant, runs in (("eager", 0), ("eager + kgen", 1), ("eager", 0), ("compiled kgen", 1)):
        before = calls.copy()
        step(models[variant])
        ran = {op: calls[op] - before[op] for op in calls if calls[op] > before[op]}
        if not runs:
            assert not ran, variant
            continue
        assert ran["qk_norm_rope"] == ran["qk_norm_rope_backward"] == layers
        assert ran["cross_entropy_backward"] == 1  # the loss's
        assert "rope_transformers" not in ran and "rmsnorm_transformers" in ran
        assert modeling_qwen3.apply_rotary_pos_emb is own


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real thing: kgen bench --e2e")
@pytest.mark.parametrize(
    "target", ["qwen3", "llama", "ltx", "qwen3-train", "ltx-train", "flux", "wan", "wan-train"]
)
def test_harness_times_each_workload_and_writes_the_table(target, reference_kernels, build_root, tmp_path):
    ops = kgen_transformers.OPS + kgen_diffusers.OPS + kgen_flux.OPS
    wan = kgen_wan.OPS if target.startswith("wan") else ()
    calls = reference_kernels(ops + wan + ("rope", "cross_entropy"))
    before = calls.copy()
    result = run_e2e(
        target,
        rounds=2,
        repeats=2,
        device="cpu",
        config=SMALL[target.removesuffix("-train")],
        build_root=build_root,
        arch="sm_90",
        variants=("eager", "eager + kgen"),
        log=lambda _: None,
    )
    ran = {op for op in calls if calls[op] > before[op]}
    assert ran  # the kgen variant ran kgen's ops
    if target == "qwen3-train":  # and their derived backwards
        assert {
            "rmsnorm_backward_transformers",
            "fused_add_rmsnorm_backward_transformers",
            "silu_mul_backward_transformers",
            "qk_norm_rope_backward",
        } <= ran
    if target == "qwen3":  # each decoder layer's residual adds with the norms after them, its q/k norms
        assert {"fused_add_rmsnorm_transformers", "qk_norm_rope"} <= ran
    if target == "llama":  # the residual adds with the norms, the MLP; its rotation transformers'
        assert {
            "fused_add_rmsnorm_transformers",
            "silu_mul_transformers",
        } <= ran and "qk_norm_rope" not in ran
    if target == "ltx-train":
        assert {"rmsnorm_backward", "qk_norm_rope3d_backward", "gelu_tanh_backward"} <= ran
    if target == "wan-train":  # (head size 12: the q/k norms and the rotation apart)
        assert {"adaln_layernorm_fp32_backward", "rope_wan_backward", "gelu_tanh_backward"} <= ran
    workloads = [row["workload"] for row in result["rows"]]
    assert (
        workloads
        == {
            "qwen3": ["Qwen3 prefill, 1×32 tokens", "Qwen3 decode step, batch 4, 16 tokens of context"],
            "llama": ["Llama prefill, 1×32 tokens", "Llama decode step, batch 4, 16 tokens of context"],
            "ltx": ["LTX-Video forward, B=2, S=24 (2×3×4)"],
            "qwen3-train": ["Qwen3 training step, 2 layers, 2×32 tokens"],
            "ltx-train": ["LTX-Video training step, 2 blocks, B=2, S=24 (2×3×4)"],
            "flux": ["Flux.1 forward, B=1, 9 image + 5 text tokens"],
            "wan": ["Wan forward, B=1, 2×4×4 latents (8 tokens), 5 text tokens"],
            "wan-train": ["Wan training step, 2 blocks, B=1, 2×4×4 latents (8 tokens), 5 text tokens"],
        }[target]
    )
    for row in result["rows"]:
        assert row["eager ms"] > 0 and row["eager + kgen ms"] > 0
        assert row["eager + kgen speed-up"] == pytest.approx(row["eager ms"] / row["eager + kgen ms"])
    table = write(result, tmp_path).read_text()
    assert json.loads((tmp_path / f"e2e-{target}.json").read_text()) == result
    assert f"| {workloads[0]} | {result['rows'][0]['eager ms']:.2f} |" in table
    goal = 1.15 if target.endswith("-train") else 1.1
    assert f"eager + kgen / eager (goal ≥ {goal}×)" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real thing: kgen bench --e2e")
def test_graphs_compile_in_reduce_overhead_mode(reference_kernels, build_root, tmp_path, monkeypatch):
    """--e2e with --graphs compiles the compiled variants as decode is served (CUDA graphs) and says so."""
    reference_kernels(kgen_transformers.OPS)
    modes = []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: modes.append(mode) or model)
    result = run_e2e(
        "qwen3",
        rounds=1,
        repeats=1,
        device="cpu",
        config=SMALL["qwen3"],
        build_root=build_root,
        arch="sm_90",
        variants=("torch.compile", "torch.compile + kgen"),  # each the model it compiles (here: is)
        compile_mode="reduce-overhead",
        log=lambda _: None,
    )
    assert modes == ["reduce-overhead", "reduce-overhead"]
    assert "torch.compile + kgen ms" in result["rows"][0]
    table = write(result, tmp_path).read_text()
    assert (tmp_path / "e2e-qwen3-graphs.json").exists()
    assert "; torch.compile mode reduce-overhead." in table.splitlines()[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real thing: kgen bench --e2e")
def test_decode_past_its_cache_is_a_clear_error(reference_kernels, build_root):
    """Each decode step appends a token to a static cache sized for the calls the harness makes; one more is
    refused by name (on a GPU, the cache's index would assert in a kernel and take the whole run down)."""
    reference_kernels(kgen_transformers.OPS)
    kwargs = dict(root=build_root, arch="sm_90")
    models, workloads = BUILDERS["qwen3"](torch, "cpu", SMALL["qwen3"], kwargs, 2, lambda _: None)
    decode = workloads["Qwen3 decode step, batch 4, 16 tokens of context"]
    for model in models.values():
        decode(model)
        decode(model)
        with pytest.raises(KgenError, match="static cache holds 2 steps after its context"):
            decode(model)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA device")
def test_no_cuda_device_is_a_clear_error():
    with pytest.raises(KgenError, match="kgen bench --e2e needs a CUDA device"):
        run_e2e("qwen3")


def test_unknown_target_is_refused():
    targets = r"\['flux', 'llama', 'ltx', 'ltx-train', 'qwen3', 'qwen3-train', 'wan', 'wan-train'\]"
    with pytest.raises(KgenError, match=rf"--e2e takes one of {targets}, got 'gpt2'"):
        run_e2e("gpt2", device="cpu")


def test_a_full_size_model_off_the_gpu_is_refused():
    """Without a small config a target builds its real model (Llama-3-8B: 16 GB of bf16 weights, twice with
    the kgen copy): only on a CUDA device; on the host it would take the machine's memory."""
    for target in ("llama", "qwen3-train", "ltx"):
        with pytest.raises(
            KgenError,
            match=f"--e2e {target}: the full-size model runs on a CUDA device; elsewhere a small config",
        ):
            run_e2e(target, device="cpu")


def test_a_failed_profile_keeps_the_timings(monkeypatch, tmp_path):
    """--profile runs after every workload was timed: a profiled call that fails (on a GPU a kernel's assert
    takes the CUDA context down) is recorded in its row and in the report and ends the profiling; the
    timings are written, and `kgen bench --e2e` then exits with the failure named."""
    from typer.testing import CliRunner

    from kgen import cli
    from kgen.integrations import e2e

    calls, logged = [], []
    assert_message = "CUDA error: device-side assert triggered"

    def table(torch_, fn, grad):
        calls.append(fn)
        if len(calls) == 3:  # the second workload's first variant
            raise RuntimeError(f"{assert_message}\nCUDA kernel errors might be asynchronously reported")
        return {"matmul us": 1.0, "other us": 2.0, "span us": 4.0, "kernels": [["k", 1, 2.0]]}

    monkeypatch.setattr(e2e, "_kernel_table", table)
    rows = [{"workload": w, "eager ms": 1.0, "eager + kgen ms": 0.5} for w in "abc"]
    variants = ("eager", "eager + kgen")
    e2e._profile_rows(torch, rows, [lambda m: m] * 3, dict.fromkeys(variants), variants, False, logged.append)
    error = f"RuntimeError: {assert_message}"
    assert set(rows[0]["profile"]) == set(variants)
    assert "profile" not in rows[1] and rows[1]["profile error"] == error
    assert "profile" not in rows[2] and "profile error" not in rows[2]  # not tried after the failure
    assert logged == [f"b: the profiled call failed, the timings stand ({error})"]
    result = dict(target="qwen3", device="d", torch="t", date="x", rounds=1, repeats=1, goals={}, rows=rows)
    report = markdown(result)
    assert "| b | 1.00 | 0.50 |" in report
    assert f"No kernel table for b: the profiled call failed ({error})." in report
    monkeypatch.setattr(e2e, "run_e2e", lambda *args, **kwargs: result)
    out = CliRunner().invoke(cli.app, ["bench", "--e2e", "qwen3", "--profile", "--out", str(tmp_path)])
    assert out.exit_code != 0 and "--profile failed at b; the timings are in" in " ".join(out.output.split())
    assert json.loads((tmp_path / "e2e-qwen3.json").read_text())["rows"][1]["profile error"] == error


def test_profile_table_splits_matmul_from_the_rest():
    """The --profile report: per variant the matmul + attention time against the rest, and the costliest of
    the rest (names as the profiler gives them; the GPU run fills them, this checks the report of them)."""
    kernels = [
        ["nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 4, 900.0],
        ["void pytorch_flash::flash_fwd_kernel<...>", 2, 500.0],
        ["rmsnorm_kernel<__nv_bfloat16>", 8, 120.0],
        ["triton_poi_fused_add_mul_0", 3, 80.0],
        ["triton_red_fused__fused_rms_norm__scaled_dot_product_cudnn_attention_mul_20", 2, 60.0],
    ]
    table = {"matmul us": 1400.0, "other us": 200.0, "span us": 1750.0, "kernels": kernels}
    result = {
        "target": "wan",
        "device": "H200",
        "torch": "2",
        "date": "2026-12-02",
        "rounds": 1,
        "repeats": 1,
        "goals": {},
        "rows": [{"workload": "w", "eager ms": 2.0, "profile": {"eager": table}}],
    }
    text = markdown(result)
    # the kernels' span beyond their sum: time the GPU waited between them
    assert "| eager | 1.40 | 0.20 | 19 | 1.75 | 0.15 |" in text
    del table["span us"]  # results written before the span was recorded
    assert "| eager | 1.40 | 0.20 | 19 | n/a | n/a |" in markdown(result)
    rest = text.split("costliest kernels other than matmul and attention")[1]
    assert "nvjet" not in rest and "flash" not in rest
    assert rest.index("rmsnorm_kernel") < rest.index("triton_poi_fused_add_mul_0")
    assert "| `rmsnorm_kernel<__nv_bfloat16>` | 8 | 0.120 |" in rest
    # torch.compile's q/k norms fused in front of attention are named after it, but are not attention
    assert "_scaled_dot_product_cudnn_attention_mul_20` | 2 | 0.060 |" in rest


def test_profile_counts_compiles_fused_kernels_by_what_they_do():
    """A Triton kernel is a matmul only as a template; others are named after every op fused into them."""
    assert is_matmul("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN")
    assert is_matmul("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7")
    assert is_matmul("triton_tem_fused_addmm_0")
    assert not is_matmul("triton_red_fused__fused_rms_norm__scaled_dot_product_cudnn_attention__to_copy_20")
    assert not is_matmul("triton_poi_fused_cat_gelu_permute_view_21")
    assert not is_matmul("void kgen_rmsnorm::rmsnorm_kernel<__nv_bfloat16>")

"""`kgen bench OP --sweep` without a GPU: the shapes it times, the refusals, and its report and heatmap from a
result as `kgen.bench` writes one (times made up here, so each cell's verdict is known)."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from kgen.catalog import load_spec, op_names
from kgen.cli import app
from kgen.errors import UsageError
from kgen.sweep import HIDDEN, MAX_ELEMENTS, RANDOM_SHAPES, ROWS, heatmap, markdown, sweep_cases, sweepable


def test_the_grid_spans_every_size_within_the_memory_cap_and_the_random_shapes_are_seeded():
    cases = sweep_cases("rmsnorm")
    shapes = [c.shape for c in cases]
    assert all(len(s) == 3 and s[0] == 1 and math.prod(s) <= MAX_ELEMENTS for s in shapes)
    grid = {(r, h) for r in ROWS for h in HIDDEN if r * h <= MAX_ELEMENTS}
    assert {s[1:] for s in shapes[: len(grid)]} == grid
    assert {1, 32768} <= {s[1] for s in shapes} and {128, 4099, 65536} <= {s[2] for s in shapes}
    extra = shapes[len(grid) :]
    assert len(extra) == RANDOM_SHAPES == len(set(extra)) and not {s[1:] for s in extra} & grid
    assert [c.shape for c in sweep_cases("rmsnorm", seed=0)] == shapes  # the same seed, the same shapes
    assert [c.shape for c in sweep_cases("rmsnorm", seed=1)][len(grid) :] != extra
    assert not any(c.per_batch for c in cases)
    assert all(c.per_batch for c in sweep_cases("adaln_rmsnorm", per_batch=True))


def test_which_ops_a_sweep_covers():
    covered = {op for op in op_names() if sweepable(op)}
    assert {"rmsnorm", "gelu_tanh", "geglu", "residual_adaln_layernorm_fp32", "rope", "rope_apply"} <= covered
    assert all(any(p.integer for p in load_spec(op).params) for op in set(op_names()) - covered)
    assert {"rope_wan", "rope3d"} & covered == set()
    assert sweepable("adaln_layernorm", per_batch=True) and not sweepable("rmsnorm", per_batch=True)
    with pytest.raises(UsageError, match="integer params"):
        sweep_cases("rope_wan")
    with pytest.raises(UsageError, match="no broadcast inputs"):
        sweep_cases("gelu_tanh", per_batch=True)


def made_up_result(kgen_us: dict[tuple[int, int], float]) -> dict:
    """A result as run_bench writes it: the peer at 10 µs everywhere, kgen as given (default 8 µs), bytes
    from the shape (two bf16 tensors)."""
    rows = []
    for case in sweep_cases("gelu_tanh"):
        rows_, hidden = case.shape[1:]
        kgen = kgen_us.get((rows_, hidden), 8.0)
        rows.append(
            {
                "shape": list(case.shape),
                "label": case.label,
                "min_bytes": 4 * rows_ * hidden,
                "times_us": {"kgen": kgen, "F.gelu": 10.0},
                "best_peer_over_kgen": 10.0 / kgen,
            }
        )
    return {
        "op": "gelu_tanh",
        "dtype": "bfloat16",
        "device": "GPU",
        "arch": "sm_90",
        "torch": "2.11",
        "date": "2026-12-02",
        "rounds": 3,
        "repeats": 100,
        "rows": rows,
    }


def test_the_report_marks_misses_above_one_megabyte_and_leaves_small_points_unjudged(tmp_path):
    # 2048 × 8192 moves 67 MB (a miss at 10 / 12.5 = 0.8); 1 × 128 moves 512 B (slower, but not judged)
    result = made_up_result({(2048, 8192): 12.5, (1, 128): 20.0})
    text = markdown(result)
    table = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "**0.80** ✗" in table["2048"] and table["2048"].count("✗") == 1
    assert table["1"].split(" | ")[1] == "(0.50)"  # the first column is hidden 128
    judged = [r for r in result["rows"] if r["min_bytes"] > 1e6]
    assert f"at {len(judged) - 1} of {len(judged)} points" in text
    assert "worst 0.80 at 1×2048×8192" in text
    assert (
        text.count("random shape") == 1 and sum(line.count(" (F.gelu) |") for line in text.splitlines()) == 6
    )
    heatmap(result, tmp_path / "heat.png")
    assert (tmp_path / "heat.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_point_met_says_so():
    text = markdown(made_up_result({}))
    judged = [r for r in made_up_result({})["rows"] if r["min_bytes"] > 1e6]
    assert f"at {len(judged)} of {len(judged)} points" in text and "✗" not in text


def test_cli_refuses_what_a_sweep_cannot_time():
    runner = CliRunner()
    for args, message in [
        (["bench", "rmsnorm", "--sweep", "--graphs"], "drop --graphs and --backward"),
        (["bench", "rope_wan", "--sweep"], "integer params"),
        (["bench", "gelu_tanh", "--sweep", "--per-batch"], "no broadcast inputs"),
    ]:
        result = runner.invoke(app, args, env={"COLUMNS": "250"})
        assert result.exit_code == 2 and message in result.output, (args, result.output)


def test_run_sweep_writes_the_table_the_heatmap_and_the_bandwidth_plot(tmp_path, monkeypatch):
    """run_sweep around a stand-in for run_bench (which needs a GPU) that writes what run_bench writes."""
    import json

    import kgen.bench

    seen = {}

    def fake_run_bench(op, *, out, cases, stem, skip_refused, **options):
        seen.update(op=op, shapes=[c.shape for c in cases], stem=stem, options=options, skip=skip_refused)
        result = made_up_result({(64, 8192): 20.0})
        for suffix in ("json", "md", "png"):
            (out / f"{stem}.{suffix}").write_text("run_bench's")
        return result

    monkeypatch.setattr(kgen.bench, "run_bench", fake_run_bench)
    from kgen.sweep import run_sweep

    run_sweep("adaln_rmsnorm", out=tmp_path, per_batch=True, seed=3, repeats=5)
    assert seen["stem"] == "adaln_rmsnorm-sweep-per-batch" and seen["options"] == {"repeats": 5}
    assert seen["skip"]  # a point the op refuses (a rotary op's odd last dim) is left out, not fatal
    assert seen["shapes"] == [c.shape for c in sweep_cases("adaln_rmsnorm", True, 3)]
    stem = tmp_path / "adaln_rmsnorm-sweep-per-batch"
    saved = json.loads(stem.with_suffix(".json").read_text())
    assert saved["per_batch"] is True and saved["seed"] == 3 and len(saved["rows"]) == len(seen["shapes"])
    assert "**0.50** ✗" in stem.with_suffix(".md").read_text()
    assert stem.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "adaln_rmsnorm-sweep-per-batch-bandwidth.png").read_text() == "run_bench's"


def test_a_plot_is_the_same_bytes_whichever_matplotlib_draws_it(tmp_path, monkeypatch):
    """`kgen plot` and the heatmap rewrote tracked PNGs with new bytes for the same results: the PNG held
    matplotlib's version."""
    import json

    matplotlib = pytest.importorskip("matplotlib")
    result = made_up_result({(64, 8192): 20.0}) | {"large_copy_gbs": 3000.0}
    result["rows"] = [r | {"copy_same_us": 5.0} for r in result["rows"][:8]]
    (tmp_path / "gelu_tanh.json").write_text(json.dumps(result))
    drawn = []
    for version in ("3.9.0", "3.11.2"):
        monkeypatch.setattr(matplotlib, "__version__", version)
        assert CliRunner().invoke(app, ["plot", "gelu_tanh", "--results", str(tmp_path)]).exit_code == 0
        heatmap(result, tmp_path / "heat.png")
        drawn.append(((tmp_path / "gelu_tanh.png").read_bytes(), (tmp_path / "heat.png").read_bytes()))
    assert drawn[0] == drawn[1] and drawn[0][0][:8] == b"\x89PNG\r\n\x1a\n"

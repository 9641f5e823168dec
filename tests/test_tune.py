"""Without a GPU: `kgen tune`'s candidates respect the profile, a tuning table changes the plan,
the generated code and `kgen explain`, a bad table is refused, and the benchmark's bars and
summary read measured rows the way BENCHMARKS.md states the bars."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kgen.catalog
import kgen.cli
import kgen.tune
from kgen.bench import bars
from kgen.bench_report import markdown, summary
from kgen.builder import render_target
from kgen.catalog import load_profile, load_spec, load_tuning, suite
from kgen.cli import app
from kgen.errors import KgenError
from kgen.families import family_of
from kgen.families.base import DTYPE_BYTES
from kgen.families.row_reduce import row_values
from kgen.planner import plan_kernel, plan_launch
from kgen.profile import TunedChoice, TuningTable
from kgen.project import resolve_target
from kgen.tune import candidates, merge_and_write

OPS = ["rmsnorm", "fused_add_rmsnorm", "residual_adaln_rmsnorm", "layernorm", "geglu", "rope", "rope3d"]


def table(*choices: TunedChoice) -> TuningTable:
    return TuningTable(
        arch="sm_90", device="NVIDIA H200", date="2026-11-30", torch="2.11.0", choices=list(choices)
    )


def choice(op="rmsnorm", max_row_bytes=8192, threads=512, rule=256, dtype="bfloat16") -> TunedChoice:
    return TunedChoice(
        op=op,
        dtype=dtype,
        max_row_bytes=max_row_bytes,
        threads=threads,
        rule_threads=rule,
        shapes=["1×8192×4096"],
        rule_us=40.0,
        tuned_us=36.5,
    )


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_candidates_stay_within_the_profile(op, dtype):
    spec, profile = load_spec(op), load_profile("sm_90")
    found = candidates(op, "sm_90", dtype)
    assert found["rule"] == [] and len(found) > 1
    for name, choices in found.items():
        plan = plan_kernel(spec, profile, dtype, table(*choices))  # a bad candidate would raise here
        tuned = {c.max_row_bytes: c.threads for c in choices}
        tunable = family_of(spec).tunable(plan)
        assert tunable and all(b.vectorized for b in tunable)
        for b in plan.buckets:
            assert b.block_threads <= profile.max_threads_per_block
            if b in tunable:
                assert b.threads_per_row == tuned.get(b.max_row_bytes, b.threads_per_row), name
            if b.storage == "registers":
                access = b.elems_per_access * DTYPE_BYTES[dtype]
                assert (
                    b.max_accesses_per_thread * access * len(row_values(spec))
                    <= profile.family_facts("row_reduce")["row_register_bytes_per_thread"]
                )
                assert b.threads_per_row * access <= b.max_row_bytes  # every thread holds part of the row


def test_a_table_choice_changes_the_plan_the_code_and_explain(monkeypatch):
    spec, profile = load_spec("rmsnorm"), load_profile("sm_90")
    rule = plan_launch(spec, profile, "bfloat16", (8192, 4096))
    tuned = plan_launch(spec, profile, "bfloat16", (8192, 4096), table(choice()))
    assert (rule.bucket.threads_per_row, tuned.bucket.threads_per_row) == (256, 512)
    assert tuned.grid == rule.grid == 8192  # one row a block either way
    why = dict((c, w) for c, _, w in tuned.choices)["threads per row"]
    assert (
        "tuned on the NVIDIA H200 2026-11-30, instead of the rule's 256" in why
        and "36.5 µs, the rule 40.0 µs" in why
    )
    kept = plan_launch(spec, profile, "bfloat16", (8192, 4096), table(choice(threads=256)))
    assert kept.bucket.threads_per_row == 256
    assert "the rule's, confirmed by kgen tune" in dict((c, w) for c, _, w in kept.choices)["threads per row"]
    assert (
        "profile planner.row_reduce.one_reduction_threads_per_row"
        in dict((c, w) for c, _, w in rule.choices)["threads per row"]
    )
    other = plan_launch(
        spec, profile, "float16", (8192, 4096), table(choice())
    )  # another dtype keeps the rule
    assert other.bucket.threads_per_row == 256
    # measured against another rule (before a profile change): stale, the rule stands, the reason says so
    stale = plan_launch(spec, profile, "bfloat16", (8192, 4096), table(choice(threads=128, rule=128)))
    why = dict((c, w) for c, _, w in stale.choices)["threads per row"]
    assert stale.bucket.threads_per_row == 256 and why.startswith("256: rows up to 8192 B (profile")
    assert "here measured when the rule was 128 threads: stale, left out (re-run `kgen tune rmsnorm`)" in why
    assert "stale" not in dict((c, w) for c, _, w in rule.choices)["threads per row"]

    target = resolve_target("rmsnorm", "sm_90", ("bfloat16",))
    plain = render_target(dataclasses.replace(target, tuning=None))
    with_table = render_target(dataclasses.replace(target, tuning=table(choice())))
    assert plain["rmsnorm_cuda/rmsnorm.cu"] != with_table["rmsnorm_cuda/rmsnorm.cu"]
    assert "tuned on the NVIDIA H200" in with_table["rmsnorm_cuda/rmsnorm.cu"]

    monkeypatch.setattr(kgen.cli, "load_tuning", lambda arch, op: table(choice()))
    out = CliRunner().invoke(app, ["explain", "rmsnorm", "--shape", "8192x4096"])
    text = " ".join(out.output.replace("│", " ").split())
    assert out.exit_code == 0 and "1 choice(s) here from arch/tuning/sm_90.toml (of its 1 entries" in text
    assert "tuned on the" in text


def test_a_stale_block_entry_is_left_out_and_named():
    for op in ("silu_and_mul", "rope"):
        stale = table(choice(op=op, max_row_bytes=None, threads=512, rule=128))
        plan = plan_kernel(load_spec(op), load_profile("sm_90"), "bfloat16", stale)
        why = plan.buckets[0].reasons["threads_per_row"]
        assert plan.block_threads == 256 and "when the rule was 128 threads: stale, left out" in why


def test_elementwise_and_rotary_tune_their_block():
    """The tuned block size reaches the plan and the launcher of that dtype (the others keep the rule's)."""
    for op in ("silu_and_mul", "rope3d"):
        tuned = table(choice(op=op, max_row_bytes=None, threads=512, rule=256))
        plan = plan_kernel(load_spec(op), load_profile("sm_90"), "bfloat16", tuned)
        assert {b.block_threads for b in plan.buckets} == {512} and plan.block_threads == 512
        source = render_target(
            dataclasses.replace(resolve_target(op, "sm_90", ("float16", "bfloat16")), tuning=tuned)
        )[f"{op}_cuda/{op}.cu"]
        launchers = source.split("cudaError_t launch_")
        assert "constexpr int kBlockThreads = 512;" in next(p for p in launchers if p.startswith("bfloat16"))
        assert "constexpr int kBlockThreads = 256;" in next(p for p in launchers if p.startswith("float16"))


def test_a_table_over_the_register_budget_is_refused():
    with pytest.raises(KgenError, match="over the 128 B register budget; re-run `kgen tune`"):
        plan_kernel(
            load_spec("rmsnorm"),
            load_profile("sm_90"),
            "bfloat16",
            table(choice(max_row_bytes=32768, threads=64, rule=512)),
        )


def test_merge_and_write_round_trips_and_keeps_other_ops(tmp_path, monkeypatch):
    arch, data_dir = tmp_path / "arch", kgen.catalog.data_dir
    arch.mkdir()
    monkeypatch.setattr(kgen.catalog, "data_dir", lambda kind: arch if kind == "arch" else data_dir(kind))
    load_tuning.cache_clear()
    try:
        merge_and_write(table(choice(op="layernorm")), "layernorm", "bfloat16")
        merge_and_write(
            table(choice(), choice(max_row_bytes=4096, threads=128, rule=64)), "rmsnorm", "bfloat16"
        )
        merge_and_write(table(choice(threads=64)), "rmsnorm", "bfloat16")  # replaces rmsnorm's entries
        read = load_tuning("sm_90", "rmsnorm")
        assert [(c.op, c.max_row_bytes, c.threads) for c in read.choices] == [
            ("layernorm", 8192, 512),
            ("rmsnorm", 8192, 64),
        ]
        assert read.choices[1].shapes == ["1×8192×4096"] and read.device == "NVIDIA H200"
        assert (arch / "tuning" / "sm_90.toml").is_file() and read.file == "arch/tuning/sm_90.toml"
    finally:
        load_tuning.cache_clear()


def test_a_users_op_is_tuned_beside_its_spec(tmp_path, monkeypatch):
    """`kgen tune` of a spec on $KGEN_OPS_PATH writes tuning/<arch>.toml beside it, not into kgen's
    installation; builds and `kgen explain` read it from there, and kgen's own ops keep kgen's table."""
    ops = Path(__file__).resolve().parents[1] / "ops"
    (tmp_path / "my_norm.py").write_text(
        (ops / "rmsnorm.py").read_text().replace('name="rmsnorm"', 'name="my_norm"')
    )
    monkeypatch.setenv("KGEN_OPS_PATH", str(tmp_path))
    load_spec.cache_clear()
    load_tuning.cache_clear()
    ours = kgen.catalog.tuning_file("rmsnorm", "sm_90")[0]
    before = ours.read_bytes() if ours.is_file() else None
    try:
        path = merge_and_write(table(choice(op="my_norm")), "my_norm", "bfloat16")
        assert path == tmp_path / "tuning" / "sm_90.toml"
        assert (ours.read_bytes() if ours.is_file() else None) == before
        target = resolve_target("my_norm", "sm_90", ("bfloat16",))
        assert [c.op for c in target.tuning.choices] == ["my_norm"]
        source = render_target(target)["my_norm_cuda/my_norm.cu"]
        assert "instead of the rule's 256 ($KGEN_OPS_PATH/tuning/sm_90.toml)" in source
        out = CliRunner().invoke(app, ["explain", "my_norm", "--shape", "8192x4096"])
        text = " ".join(out.output.replace("│", " ").split())
        assert out.exit_code == 0 and "1 choice(s) here from $KGEN_OPS_PATH/tuning/sm_90.toml" in text
        assert not any(c.op == "my_norm" for c in (load_tuning("sm_90", "rmsnorm") or table()).choices)
    finally:
        load_spec.cache_clear()
        load_tuning.cache_clear()


def row(kgen, peers, mb, same_copy_us, large_gbs=4200.0):
    best = min(peers.values()) if peers else None
    min_bytes = int(mb * 1e6)
    return {
        "label": "s",
        "min_bytes": min_bytes,
        "times_us": {"kgen": kgen, **peers},
        "best_peer_over_kgen": best / kgen if best else None,
        "kgen_pct_large_copy": 100 * min_bytes / kgen / 1e3 / large_gbs,
        "kgen_pct_same_copy": 100 * same_copy_us / kgen,
    }


def test_bars_apply_by_size():
    large = row(100.0, {"torch.compile(e)": 101.0}, 400, 95.0)  # 400 MB in 100 µs: 4000 GB/s, 95 % of 4200
    assert bars(large, 4.2, "torch.compile(e)", None) == {"<= best peer": True, ">= 90 % of 4 GiB copy": True}
    mid = row(50.0, {"e": 49.0}, 100, 46.0)  # 92 % of a same-size copy, behind the peer
    assert bars(mid, 4.2, None, None) == {"<= best peer": False, ">= 95 % of same-size copy": False}
    small = row(4.8, {"e": 9.0}, 1, 4.5)
    assert bars(small, 4.2, None, None) == {"<= best peer": True, "<= 1.1x empty launch": False}
    assert bars(small, 4.4, None, None)["<= 1.1x empty launch"]
    between = row(10.0, {}, 10, 9.0)  # 4–32 MB and no peer: no bar applies
    assert bars(between, 4.2, None, None) == {}
    rope3d = row(40.0, {"t": 100.0}, 44, 20.0)
    assert (
        bars(rope3d, 4.2, "t", 0.45)["<= 0.45x torch.compile"]
        and not bars(rope3d, 4.2, "t", 0.35)["<= 0.35x torch.compile"]
    )


def test_summary_counts_the_shapes_that_meet_every_bar():
    rows = [row(100.0, {"c": 101.0}, 400, 95.0), row(50.0, {"c": 49.0}, 100, 46.0)]
    for r in rows:
        r["bars"] = bars(r, 4.2, None, None)
    text = summary(
        [
            {
                "op": "rmsnorm",
                "dtype": "bfloat16",
                "device": "H200",
                "arch": "sm_90",
                "torch": "2.11",
                "date": "2026-11-30",
                "mode": "events",
                "rounds": 3,
                "repeats": 100,
                "rows": rows,
            }
        ]
    )
    assert "Every bar met at 1 of 2 shapes." in text
    assert "| rmsnorm | s | 100.0 | 50.0 | 49.0 (c) | 0.98 |" in text
    assert "<= best peer; >= 95 % of same-size copy |" in text


def test_a_backward_report_has_its_gpu_time_beside_the_event_time():
    """Event timing of a backward carries the autograd engine's host time; the report adds each
    implementation's GPU time and kgen's share of a same-size copy measured by it."""
    r = row(46.3, {"F.rms_norm": 24.0}, 1.6, 5.0) | {
        "kgen_gbs": 34.6,
        "gpu_us": {"kgen": 7.8, "F.rms_norm": 12.5},
        "gpu_best_peer_over_kgen": 12.5 / 7.8,
        "kgen_gpu_pct_same_copy": 100 * 5.0 / 7.8,
        "fwd_bwd_us": {"kgen": 60.0, "F.rms_norm": 70.0},
        "fwd_bwd_best_peer_over_kgen": 70.0 / 60.0,
    }
    r["bars"] = bars(r, 4.2, None, None, backward=True)
    text = markdown(
        {
            "op": "rmsnorm",
            "dtype": "bfloat16",
            "device": "H200",
            "arch": "sm_90",
            "torch": "2.11",
            "date": "2026-12-02",
            "repeats": 50,
            "large_copy_us": 1010.0,
            "large_copy_gbs": 4250.0,
            "rows": [r],
        }
    )
    assert "| s | 1.6 | 46.3 | 24.0 |" in text  # event time (MB, then µs): the peer ahead
    assert "| s | 7.8 | 12.5 | 64 | 1.60 |" in text  # GPU time: kgen ahead, 64 % of the copy
    assert text.index("GPU time") < text.index("Forward + backward")
    result = {
        "op": "rmsnorm",
        "dtype": "bfloat16",
        "device": "H200",
        "arch": "sm_90",
        "torch": "2.11",
        "date": "2026-12-02",
        "mode": "events",
        "rounds": 1,
        "repeats": 50,
        "rows": [r],
    }
    line = next(x for x in summary([result]).splitlines() if x.startswith("| rmsnorm"))
    assert line.endswith("| 0.52 | 1 | 11 | 7.8 | 1.60 | <= best peer |"), line  # event bars, GPU ratio


def test_a_kept_rule_says_why_a_faster_candidate_lost():
    kept = TunedChoice(
        op="rmsnorm",
        dtype="bfloat16",
        max_row_bytes=8192,
        threads=128,
        rule_threads=128,
        shapes=["1×8192×4096"],
        rule_us=138.7,
        tuned_us=138.7,
        others={"64": 154.4, "256": 137.3},
    )
    why = table(kept).why(kept)
    assert (
        "the rule's, kept by kgen tune" in why
        and "256 measured faster but by less than its 2% noise margin" in why
    )
    assert "confirmed" not in why
    slower = kept.model_copy(update={"others": {"64": 154.4}})
    assert "the rule's, confirmed by kgen tune" in table(slower).why(slower)


def test_held_out_shapes_fall_in_the_tuned_configurations_and_are_not_the_suites():
    from kgen.tune import HELD_OUT, held_out_cases

    spec, profile = load_spec("rmsnorm"), load_profile("sm_90")
    buckets = [b.max_row_bytes for b in plan_kernel(spec, profile, "bfloat16").buckets if b.vectorized][3:6]
    cases = held_out_cases("rmsnorm", "sm_90", "bfloat16", buckets, seed=7)
    assert len(cases) == HELD_OUT * len(buckets)
    for case in cases:
        launch = plan_launch(spec, profile, "bfloat16", case.shape)
        assert launch.bucket.vectorized and launch.bucket.max_row_bytes in buckets
    assert sorted(launch_bucket(c) for c in cases) == sorted(b for b in buckets for _ in range(HELD_OUT))
    assert not {c.shape for c in cases} & {c.shape for c in suite("rmsnorm")}
    assert [c.shape for c in held_out_cases("rmsnorm", "sm_90", "bfloat16", buckets, seed=7)] == [
        c.shape for c in cases
    ]
    assert (
        held_out_cases("rope_wan", "sm_90", "bfloat16", [None]) == []
    )  # (rows, hidden) names no rope_wan shape


def launch_bucket(case):
    spec, profile = load_spec("rmsnorm"), load_profile("sm_90")
    return plan_launch(spec, profile, "bfloat16", case.shape).bucket.max_row_bytes


def test_a_candidate_must_also_win_on_the_held_out_shapes():
    from kgen.tune import choose

    measured = {128: 100.0, 64: 90.0, 256: 99.0}  # 64 threads 10 % faster than the rule's 128 on the suite
    assert choose(measured, 128, 0.02, {}) == 64  # nothing held out: the suite decides
    assert choose(measured, 128, 0.02, {128: 50.0, 64: 49.0, 256: 60.0}) == 64  # it holds
    assert choose(measured, 128, 0.02, {128: 50.0, 64: 51.0, 256: 40.0}) == 128  # slower held out: the rule
    assert choose({128: 100.0, 64: 99.0}, 128, 0.02, {128: 50.0, 64: 10.0}) == 128  # within the margin


def test_rounds_rotate_the_order():
    """The timer interleaves the implementations within a round and rotates their order round by round, so
    that none is always timed first (at 5-20 µs the position alone moved a build by up to 0.6 µs)."""
    from kgen.bench import Timer

    class Recording(Timer):
        def __init__(self):
            self.calls = []

        def median_us(self, fn, graphs=None):
            self.calls.append(fn())
            return float(len(self.calls))

    timer = Recording()
    times = timer.rounds_us({"a": lambda: "a", "b": lambda: "b", "c": lambda: "c"}, 4)
    assert timer.calls == list("abcbcacababc")
    assert times == {"a": [1.0, 6.0, 8.0, 10.0], "b": [2.0, 4.0, 9.0, 11.0], "c": [3.0, 5.0, 7.0, 12.0]}

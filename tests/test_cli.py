"""The command line as a user meets it: output, progress, and errors without tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kgen.catalog import arch_names, load_spec, op_names, suite
from kgen.cli import app
from kgen.families import family_of
from kgen.project import kernel_name

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args), env={"COLUMNS": "250"})


def test_list():
    result = run("list")
    assert result.exit_code == 0
    for word in ("rmsnorm", "single_rounding, transformers", "RMSNorm", "sm_75", "Tesla T4", "4800 GB/s"):
        assert word in result.output
    rows = {line.split(" | ")[0]: line for line in run("list").output.splitlines() if " | " in line}
    assert rows["geglu"].endswith(" | derived") and rows["rmsnorm"].endswith(" | derived")
    assert all(family_of(load_spec(op)).backward(load_spec(op)) is not None for op in op_names())
    assert all(row.endswith(" | derived") for op, row in rows.items() if op in set(op_names()))


def test_explain_prints_every_choice_and_the_roofline():
    result = run("explain", "rmsnorm", "--arch", "sm_90", "--dtype", "fp16", "--shape", "8192x4096")
    assert result.exit_code == 0, result.output
    for word in (
        "16 B (8 elements)",
        "threads per row",
        "256",
        "rows per block",
        "warp shuffle + one shared-memory exchange",
        "registers",
        "8192 blocks",
        "134.23 MB",
        "roofline on H200 SXM (4800 GB/s): 28.0 µs",
        "planner.row_reduce.one_reduction_threads_per_row",
        "every choice from rules",
    ):
        assert word in " ".join(result.output.replace("│", " ").split()), word


def test_explain_three_dim_shape_and_odd_hidden():
    result = run("explain", "rmsnorm", "--arch", "sm_80", "--dtype", "fp16", "--shape", "2x4096x3071")
    assert result.exit_code == 0, result.output
    assert "2 B (1 elements)" in result.output and "8192 rows" in result.output
    assert "fits the" not in result.output  # 100 MB moved: more than the A100's 40 MB L2
    small = run("explain", "rmsnorm", "--arch", "sm_80", "--shape", "64x4096")
    assert "it fits the 40 MB L2 of sm_80" in small.output


def test_explain_says_what_a_widened_row_holds():
    """A row the launcher spreads over more threads than its configuration's holds fewer accesses a thread
    than the configuration was sized for: explain says both (here 1 of 2), and only then."""
    widened = run("explain", "rmsnorm", "--arch", "sm_90", "--shape", "64x4096")
    text = " ".join(widened.output.replace("│", " ").split())
    assert "spreads each row over 512 threads" in text
    assert "1 × 16 B per thread at this row, of the configuration's 2 × 16 B per thread" in text
    plain = run("explain", "rmsnorm", "--arch", "sm_90", "--shape", "8192x4096")
    assert "at this row" not in plain.output and "2 × 16 B per thread" in plain.output


def test_explain_the_derived_backward():
    """The backward's plan: the column reduction's partition and the bytes a backward must move (the saved
    residual_out and both incoming gradients read, x's gradient written once for residual too: 4 × 8192 ×
    4096 × 2 B, and the weight and its gradient)."""
    result = run("explain", "fused_add_rmsnorm", "--backward", "--arch", "sm_90", "--shape", "8192x4096")
    assert result.exit_code == 0, result.output
    for words in (
        "fused_add_rmsnorm_backward on sm_90",
        "264 blocks",  # 1024 resident threads per SM × 132 SMs / 512-thread blocks
        "grad_residual_out, which only the outputs read, is loaded there, not held",
        "268.45 MB",
        # cp.async on sm_90: the next row's residual_out and both gradients (2 + 1 row inputs × 16 B, two
        # buffers, 1024 threads per SM)
        "staged",
        "96 KB per SM in two buffers",
    ):
        assert words in " ".join(result.output.replace("│", " ").split()), words
    # the T4 has no cp.async: the row is loaded into registers as it is reached
    t4 = run("explain", "fused_add_rmsnorm", "--backward", "--arch", "sm_75", "--dtype", "fp16")
    assert t4.exit_code == 0, t4.output
    assert "cp.async" not in t4.output and "registers: " in t4.output
    # residual AdaLN's four summed gradients: fewer resident threads, each with a larger register budget
    adaln = run("explain", "residual_adaln_rmsnorm", "--backward", "--shape", "2x2688x2048")
    assert adaln.exit_code == 0, adaln.output
    assert "halved to 512" in adaln.output and "264 blocks" in adaln.output


@pytest.mark.parametrize(
    "text", ["2x8064x2048", "2X8064X2048", "2×8064×2048", "2,8064,2048", "[2, 8064, 2048]"]
)
def test_shape_as_tables_and_torch_print_it(text):
    """--shape takes a shape as BENCHMARKS.md's tables write it (×) and as torch prints it, the same plan."""
    result = run("explain", "rope3d", "--shape", text)
    assert result.exit_code == 0, result.output
    assert "8064 tokens × 256 channel groups" in result.output.replace("\n", " ")


def test_user_errors_exit_2_with_a_message():
    cases = [
        (
            ("explain", "rmsnorm", "--arch", "sm_75", "--dtype", "bf16"),
            "sm_75 (Tesla T4) has no bfloat16 arithmetic",
        ),
        (("build", "rmsnorm", "--arch", "sm_75", "--dtype", "bfloat16"), "has no bfloat16 arithmetic"),
        (("explain", "rmsnorm", "--shape", "8192xabc"), "--shape must look like 8192x4096"),
        (("explain", "rmsnorm", "--shape", "8192x"), "--shape must look like 8192x4096"),
        (("explain", "rmsnorm", "--shape", "8192x0"), "--shape dims must be >= 1"),
        (("explain", "layernorm2"), "unknown op 'layernorm2'"),
        (("build", "rmsnorm", "--arch", "sm_101"), "unknown arch 'sm_101'"),
        (("build",), "give op names (`kgen list` shows them) or --all"),
        (("check",), "give op names (`kgen list` shows them) or --all"),
        (("build", "rmsnorm", "--all"), "give op names or --all, not both"),
        (("build", "rmsnorm", "--dtype", "bf17"), "unknown dtype 'bf17'"),
        (("explain", "rmsnorm", "--dtype", "int8"), "unknown dtype 'int8'"),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
        assert "Traceback" not in result.output


def test_explain_every_arch_leaves_out_those_without_the_dtype():
    """--arch all with the default bf16: the T4 (no bf16) is named and left out, every other arch planned."""
    result = run("explain", "rmsnorm", "--arch", "all", "--shape", "8192x4096")
    assert result.exit_code == 0, result.output
    assert (
        "sm_75: no bfloat16 arithmetic there, left out (its plans: --arch sm_75 --dtype fp16)"
        in result.output
    )
    planned = [line.split()[2] for line in result.output.splitlines() if line.startswith("rmsnorm on ")]
    assert planned == [arch for arch in arch_names() if arch != "sm_75"]


def test_explain_defaults_to_the_ops_first_benchmark_shape_and_takes_any_case_of_dtype():
    for op in ("rope", "rmsnorm"):
        first = suite(op)[0]
        result = run("explain", op, "--dtype", "BF16")
        assert result.exit_code == 0, result.output
        head = result.output.splitlines()[0]
        shown = "×".join(map(str, first.shape))
        assert f"shape {shown}" in head or f"hidden {first.shape[-1]}" in head, head
        assert ("(k heads 8)" in head) == (first.k_heads == 8), head


def test_build_all_writes_every_project_with_progress(tmp_path):
    result = run("build", "--all", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    expected = sorted(
        [kernel_name(op, arch) for op in op_names() for arch in arch_names()]
        + [op.replace("_", "-") for op in op_names()]
    )  # each op's every-arch project
    assert "rmsnorm-sm90" in expected and "layernorm-sm75" in expected
    assert sorted(p.name for p in tmp_path.iterdir()) == expected
    wrote = [line for line in result.output.splitlines() if line.startswith("wrote ")]
    assert len(wrote) == len(expected)  # a line per project as it is written (no terminal here)


def test_build_one_with_dtype(tmp_path):
    result = run("build", "rmsnorm", "--arch", "sm_75", "--dtype", "float16", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    cu = (tmp_path / "rmsnorm-sm75" / "rmsnorm_cuda" / "rmsnorm.cu").read_text()
    assert "dtypes: float16\n" in cu and "__nv_bfloat16 from_float" in cu and "launch_bfloat16" not in cu


def test_plot_from_committed_results(tmp_path):
    import shutil

    shutil.copy(Path(__file__).resolve().parents[1] / "bench" / "results" / "rmsnorm.json", tmp_path)
    result = run("plot", "rmsnorm", "--results", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "rmsnorm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = run("plot", "layernorm", "--results", str(tmp_path))
    assert missing.exit_code == 2 and "run `kgen bench layernorm` on a GPU first" in missing.output
    unknown = run("plot", "layernorn", "--results", str(tmp_path))
    assert unknown.exit_code == 2 and "unknown op 'layernorn' (did you mean 'layernorm'?)" in unknown.output


def test_build_several_ops_with_any_dtype_spelling(tmp_path):
    result = run(
        "build",
        "rmsnorm",
        "geglu",
        "--arch",
        "sm_90",
        "--dtype",
        "bf16",
        "--dtype",
        "torch.float16",
        "--out",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["geglu-sm90", "rmsnorm-sm90"]
    for project in tmp_path.iterdir():
        op = project.name.removesuffix("-sm90")
        assert "dtypes: bfloat16, float16\n" in (project / f"{op}_cuda" / f"{op}.cu").read_text()


def test_output_without_a_terminal_is_plain_and_complete(tmp_path):
    """CI logs: whole names (no '…' at 80 columns), no box drawing, each step on its own line as it
    happens."""
    listing = runner.invoke(app, ["list"], env={"COLUMNS": "80"})
    assert listing.exit_code == 0
    lines = listing.output.splitlines()
    assert any(line.startswith("residual_adaln_layernorm | ") for line in lines)
    assert "…" not in listing.output and not set("│┃━─┏") & set(listing.output)
    explained = runner.invoke(app, ["explain", "rope3d", "--shape", "2x8064x2048"], env={"COLUMNS": "80"})
    assert any(line.startswith("heads in flight | 2 | ") for line in explained.output.splitlines())
    built = run("build", "rmsnorm", "--arch", "sm_90", "--arch", "sm_80", "--out", str(tmp_path))
    assert built.output.splitlines() == [
        "writing rmsnorm-sm90",
        f"wrote {tmp_path / 'rmsnorm-sm90'}",
        "writing rmsnorm-sm80",
        f"wrote {tmp_path / 'rmsnorm-sm80'}",
    ]


@pytest.mark.toolchain
def test_a_rebuild_with_nothing_to_do_says_so_once(tmp_path):
    first = run("build", "rmsnorm", "--arch", "sm_90", "--dtype", "bf16", "--compile", "--out", str(tmp_path))
    assert first.exit_code == 0, first.output
    assert (
        first.output.splitlines()[-1].startswith("built: ")
        and "compiling rmsnorm's kernels for sm_90" in first.output
    )
    again = run("build", "rmsnorm", "--arch", "sm_90", "--dtype", "bf16", "--compile", "--out", str(tmp_path))
    assert again.exit_code == 0, again.output
    assert [line.split(":")[0] for line in again.output.splitlines()] == [
        "writing rmsnorm-sm90",
        f"wrote {tmp_path / 'rmsnorm-sm90'}",
        "up to date",
    ]


def test_explain_an_odd_hidden_of_dense_tensors_takes_the_flat_path():
    """gelu_tanh at hidden 12242 (not a multiple of 8): dense tensors are one row, read 16 bytes at a time;
    geglu's packed halves cannot be, and take the scalar path."""
    result = run("explain", "gelu_tanh", "--arch", "sm_90", "--dtype", "bf16", "--shape", "11672x12242")
    assert result.exit_code == 0, result.output
    assert "16 B (8 elements)" in result.output and "one row of rows × hidden" in result.output
    result = run("explain", "geglu", "--arch", "sm_90", "--dtype", "bf16", "--shape", "11672x12242")
    assert result.exit_code == 0, result.output
    assert "2 B (1 elements)" in result.output and "one row of rows" not in result.output


def test_explain_counts_k_heads_and_gives_the_launchers_grid():
    """Qwen3's q [1, 32, 2048, 128] and k with 8 heads: 40 heads in chunks until the threads fill a wave, as
    the generated launch_config splits them (as many chunks of ≤ 3 as hold a head: 14, where 17 would leave 3
    empty and 278528 (token, chunk) items for a wave of 270336 threads, some walking two); k's heads and its
    output's in the traffic (kgen bench counted 43.0 MB)."""
    result = run("explain", "qk_norm_rope", "--shape", "1x32x2048x128", "--k-heads", "8")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "shape 1×32×2048×128 (k heads 8)" in text
    assert "14 chunks of ≤ 3 of the 40 heads (32 + 8) = 229376 threads" in text, text
    assert "a thread walks" not in text and "at most one full wave (1056 blocks" in text
    assert "grid | 896 blocks |" in text
    assert "minimum traffic: 42.99 MB" in text, text  # kgen bench's 43.0 MB
    decode = " ".join(
        run("explain", "qk_norm_rope", "--shape", "64x32x1x128", "--k-heads", "8").output.split()
    )
    assert "40 chunks of ≤ 1 of the 40 heads (32 + 8) = 20480 threads" in decode and "80 blocks" in decode
    for args, message in [
        (["rmsnorm", "--shape", "8x4096"], "k heads are for a rotary op that rotates q and k"),
        (["qk_norm_rope", "--shape", "2048x128"], "with a [B, H, T, D] shape"),
    ]:
        refused = run("explain", *args, "--k-heads", "8")
        assert refused.exit_code != 0 and message in " ".join(refused.output.split()), refused.output


def test_explain_keeps_a_rotary_shape_whole():
    """A rotary op's leading dims are batch, heads and tokens: its positions are [B, 3, S], not a square of
    the flattened rows (146880 MB before)."""
    for op in ("rope_flux", "qk_norm_rope_flux"):
        result = run("explain", op, "--arch", "sm_90", "--dtype", "bf16", "--shape", "1x24x4608x128")
        assert result.exit_code == 0, result.output
        assert "minimum traffic: 113.30 MB" in result.output, result.output


def test_a_spec_of_ones_own_folder_builds_and_takes_its_shapes_from_beside_it(tmp_path, monkeypatch):
    """A user's spec on $KGEN_OPS_PATH: its generated files name it there (not as one of kgen's ops/), and its
    benchmark shapes come from a shapes.toml beside it; without them `kgen bench` says where they go (before
    it asks for a GPU)."""
    ops = Path(__file__).resolve().parents[1] / "ops"
    source = (ops / "gelu_tanh.py").read_text().replace('name="gelu_tanh"', 'name="my_gelu"')
    (tmp_path / "my_gelu.py").write_text(source)
    monkeypatch.setenv("KGEN_OPS_PATH", str(tmp_path))
    load_spec.cache_clear()
    try:
        result = run("bench", "my_gelu")
        assert result.exit_code == 2, result.output
        assert (
            "no benchmark shapes for 'my_gelu'" in result.output and "shapes.toml beside it" in result.output
        )
        (tmp_path / "shapes.toml").write_text("[my_gelu]\nshapes = [[3, 40], [2, 5, 8]]\n")
        assert [c.shape for c in suite("my_gelu")] == [(3, 40), (2, 5, 8)]
        assert suite("gelu_tanh")  # kgen's own shapes are still read

        out = tmp_path / "out"
        result = run("build", "my_gelu", "gelu_tanh", "--arch", "sm_90", "--out", str(out))
        assert result.exit_code == 0, result.output
        mine, own = (out / kernel_name(op, "sm_90") for op in ("my_gelu", "gelu_tanh"))
        assert "from $KGEN_OPS_PATH/my_gelu.py (spec " in (mine / "my_gelu_cuda" / "my_gelu.cu").read_text()
        assert "the op spec `$KGEN_OPS_PATH/my_gelu.py`" in (mine / "CARD.md").read_text()
        assert "from ops/gelu_tanh.py (spec " in (own / "gelu_tanh_cuda" / "gelu_tanh.cu").read_text()
        benchmark = "\n".join(p.read_text() for p in (mine / "benchmarks").iterdir())
        assert "{'x': (3, 40)}" in benchmark and "{'x': (2, 5, 8)}" in benchmark
    finally:
        load_spec.cache_clear()


def test_the_readmes_own_op_checks_and_builds(tmp_path, monkeypatch):
    """README's "An op of your own" example, as written there: its spec and shapes file in a folder of their
    own, `kgen check` and `kgen build` on them, the benchmark shapes read from beside the spec."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()

    def block(first_line: str) -> str:  # the fenced block that opens with this comment line
        start = readme.index(first_line + "\n")
        return readme[start : readme.index("```", start)]

    folder = tmp_path / "my_ops"
    folder.mkdir()
    (folder / "leaky_relu.py").write_text(block("# my_ops/leaky_relu.py"))
    (folder / "shapes.toml").write_text(block("# my_ops/shapes.toml"))
    monkeypatch.setenv("KGEN_OPS_PATH", str(folder))
    load_spec.cache_clear()
    try:
        result = run("check", "leaky_relu")
        assert result.exit_code == 0 and "DISAGREE" not in result.output, result.output
        result = run("build", "leaky_relu", "--arch", "sm_90", "--out", str(tmp_path / "generated"))
        assert result.exit_code == 0, result.output
        assert (tmp_path / "generated" / "leaky-relu-sm90" / "tests").is_dir()
        assert [c.shape for c in suite("leaky_relu")] == [(8192, 4096), (64, 14336), (1, 4096)]
    finally:
        load_spec.cache_clear()


def test_report_of_a_run_into_the_marked_region(tmp_path):
    """`kgen report` from the committed results (bench/results: <op>.json, <op>-backward.json, e2e-*.md): the
    summaries, each op's table with its peers; --into rewrites only the region between the marker lines (the
    same output twice), and refuses a file without them or a folder without results."""
    from kgen.bench_report import REPORT_BEGIN, REPORT_END

    results = Path(__file__).resolve().parents[1] / "bench" / "results"
    folder = tmp_path / "run"
    folder.mkdir()
    for path in [*results.glob("rmsnorm*.json"), *results.glob("geglu*.json"), *results.glob("e2e-*.md")]:
        (folder / path.name).write_text(path.read_text())
    result = run("report", str(folder))
    assert result.exit_code == 0, result.output
    text = (folder / "REPORT.md").read_text()
    assert text.startswith("### Summary\n") and "### Summary of the backward" in text
    assert "\n### rmsnorm\n\nPeers: eager (transformers): transformers' LlamaRMSNorm.forward" in text
    assert "torch.compile(eager (transformers)): compiled afresh per shape." in text
    assert (
        "| rmsnorm | 1×1024×2048 |" in text and "### geglu (backward)" in text and "### layernorm" not in text
    )
    assert "LTX-Video training step" in text  # e2e-ltx-train.md

    target = tmp_path / "BENCHMARKS.md"
    target.write_text(f"# before\n\n{REPORT_BEGIN}\nold\n{REPORT_END}\n\n# after\n")
    for _ in range(2):
        assert run("report", str(folder), "--into", str(target)).exit_code == 0
        written = target.read_text()
        assert written.startswith(f"# before\n\n{REPORT_BEGIN}\n\n### Summary\n") and "old" not in written
        assert written.endswith(f"{REPORT_END}\n\n# after\n") and written.count("### rmsnorm\n") == 1
    target.write_text("# no markers\n")
    result = run("report", str(folder), "--into", str(target))
    assert result.exit_code == 2 and "has no region to rewrite" in result.output
    assert run("report", str(tmp_path / "empty")).exit_code == 2


def test_explain_says_why_a_grid_passes_the_wave():
    """An odd count of channel groups (head dim 126: 63 of 2) rounds the grid past one wave to whole groups;
    the why says so rather than contradicting its own 'at most one full wave'."""
    for dim in (126, 128):
        result = run("explain", "rope", "--arch", "sm_90", "--shape", f"1x32x2048x{dim}")
        grid = next(line for line in result.output.splitlines() if line.startswith("grid | "))
        blocks, wave = (
            int(grid.split(" | ")[1].split()[0]),
            int(grid.split("at most one full wave (")[1].split()[0]),
        )
        assert (blocks > wave) == ("rounded up to a multiple of 63 blocks" in grid) == (dim == 126), grid


def test_explain_per_batch_counts_broadcast_inputs_once_a_batch():
    """--per-batch: the broadcast inputs per batch ([B, 1, C]) in the traffic and the roofline, as the suite's
    per-batch case (kgen bench moved 1341.9 MB for Wan's norm at 1×32760×5120), not per token (2012.82 MB);
    without --shape the op's first case keeps its per_batch; an op with no broadcast input refuses it."""
    from kgen.families.base import Case, min_bytes

    op, shape = "residual_layernorm_fp32", (1, 32760, 5120)
    spec = load_spec(op)
    assert Case(shape, per_batch=True) in suite(op)
    batch, token = (
        min_bytes(family_of(spec), spec, Case(shape, per_batch), 2) for per_batch in (True, False)
    )
    assert batch != token
    result = run("explain", op, "--shape", "1x32760x5120", "--per-batch")
    assert result.exit_code == 0, result.output
    assert "per batch" in result.output.splitlines()[0]
    assert f"minimum traffic: {batch / 1e6:.2f} MB" in result.output and "1341.91 MB" in result.output
    assert f"(3350 GB/s): {batch / 3350e3:.1f} µs" in result.output  # the roofline on the H100 SXM
    plain = run("explain", op, "--shape", "1x32760x5120")
    assert f"minimum traffic: {token / 1e6:.2f} MB" in plain.output
    assert "per batch" not in plain.output.splitlines()[0]
    for op in ("adaln_layernorm_fp32", "adaln_rmsnorm"):  # the first case is per batch
        first, spec = suite(op)[0], load_spec(op)
        assert first.per_batch
        default = run("explain", op)
        assert default.exit_code == 0, default.output
        assert "broadcast inputs per batch" in default.output.splitlines()[0]
        assert f"minimum traffic: {min_bytes(family_of(spec), spec, first, 2) / 1e6:.2f} MB" in default.output
    refused = run("explain", "rmsnorm", "--shape", "8x4096", "--per-batch")
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert "per batch: rmsnorm has no broadcast input" in " ".join(refused.output.split())


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("rope", "--shape", "1x32x128x127"),
            "rope: x's last dim holds pairs and must be even, got shape [1, 32, 128, 127]",
        ),
        (
            ("qk_norm_rope", "--shape", "1x32x128x96", "--k-heads", "8"),
            "qk_norm_rope: the norm before the rotation serves head sizes D = 16 · 2^k up to 4096 in "
            "bfloat16",
        ),
        (
            ("qk_norm_rope_flux", "--shape", "1x24x4608x96", "--backward"),
            "qk_norm_rope_flux_backward: the norm",
        ),
        (("rope3d", "--shape", "1x2x2688x2048"), "rope3d: x must be [B, S, C] with S = frames·height·width"),
        (
            (
                "rope3d",
                "--shape",
                "2x8064x2048",
                "--param",
                "frames=20",
                "--param",
                "height=16",
                "--param",
                "width=24",
            ),
            "rope3d: x has 8064 tokens per batch but frames·height·width = 20·16·24",
        ),
        (("rope3d", "--param", "frames=2"), "x has 2688 tokens per batch but frames·height·width = 2·16·24"),
        (
            ("rope3d", "--param", "frame=2"),
            "--param frame: rope3d has no param 'frame' (did you mean 'frames'?)",
        ),
        (("rope3d", "--param", "frames=2.5"), "--param frames: frames is an integer param (got 2.5)"),
        (("rope3d", "--param", "theta=-1"), "--param theta: theta must be > 0 (got -1.0)"),
        (("rope3d", "--param", "frames"), "--param 'frames': give NAME=VALUE, VALUE a number"),
    ],
)
def test_explain_refuses_a_shape_the_binding_refuses(args, message):
    """No plan for a shape the generated op refuses: a one-line error in its binding's words."""
    result = run("explain", *args)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert message in " ".join(result.output.split()), result.output


def test_explain_takes_the_suite_cases_params_and_given_ones():
    """Without --shape the suite case's params (a grid's sizes, checked against its tokens) come with its
    shape; --param gives them with --shape; without them the sizes are left to the binding."""
    default = " ".join(run("explain", "rope3d").output.split())
    assert default.startswith("rope3d on sm_90") and "(frames=7, height=16, width=24);" in default
    given = run(
        "explain",
        "rope3d",
        "--shape",
        "2x8064x2048",
        *"--param frames=21 --param height=16".split(),
        "--param",
        "width=24",
    )
    assert given.exit_code == 0 and "(frames=21, height=16, width=24);" in " ".join(given.output.split())
    assert run("explain", "rope3d", "--shape", "2x8064x2048").exit_code == 0


def test_explain_plans_the_shapes_the_binding_takes():
    """Head sizes the fused q/k norm serves, an even one off the vector path, geglu's odd hidden (its packed
    input [..., 2F] is even)."""
    for args in (
        ("qk_norm_rope", "--shape", "1x32x128x64", "--k-heads", "8"),
        ("qk_norm_rope_flux", "--shape", "1x24x4608x256"),
        ("rope", "--shape", "1x32x128x126"),
        ("geglu", "--shape", "8x4097"),
    ):
        result = run("explain", *args)
        assert result.exit_code == 0, (args, result.output)
        assert "minimum traffic:" in result.output

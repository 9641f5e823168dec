"""Planner decisions per arch, dtype and hidden size (table-driven), and the limits every
compiled configuration must respect on its profile."""

from __future__ import annotations

import re

import pytest

from kgen.catalog import arch_names, load_profile, load_spec
from kgen.errors import KgenError, PlanError
from kgen.families.base import DTYPE_BYTES
from kgen.families.row_reduce import reduction as reduction_of
from kgen.planner import plan_kernel, plan_launch

SPEC = load_spec("rmsnorm")

# arch, dtype, hidden -> bytes per access, threads/row, rows/block, storage, reduction
TABLE = [
    ("sm_90", "bfloat16", 128, 16, 16, 16, "registers", "warp shuffle"),
    ("sm_90", "bfloat16", 64, 16, 8, 32, "registers", "warp shuffle"),
    ("sm_90", "bfloat16", 2048, 16, 128, 2, "registers", "warp shuffle + one shared-memory exchange"),
    ("sm_90", "float16", 1024, 16, 32, 8, "registers", "warp shuffle"),
    ("sm_90", "bfloat16", 4096, 16, 256, 1, "registers", "warp shuffle + one shared-memory exchange"),
    ("sm_90", "float32", 4096, 16, 256, 1, "registers", "warp shuffle + one shared-memory exchange"),
    ("sm_90", "bfloat16", 32768, 16, 512, 1, "registers", "warp shuffle + one shared-memory exchange"),
    ("sm_90", "bfloat16", 65536, 16, 512, 1, "shared", "warp shuffle + one shared-memory exchange"),
    ("sm_90", "float32", 65536, 16, 512, 1, "global", "warp shuffle + one shared-memory exchange"),
    ("sm_90", "bfloat16", 4095, 2, 256, 1, "global", "warp shuffle + one shared-memory exchange"),
    ("sm_90", "float16", 1, 2, 8, 32, "global", "warp shuffle"),
    ("sm_80", "float32", 32768, 16, 512, 1, "shared", "warp shuffle + one shared-memory exchange"),
    ("sm_80", "float16", 65536, 16, 512, 1, "shared", "warp shuffle + one shared-memory exchange"),
    ("sm_75", "float16", 65536, 16, 512, 1, "global", "warp shuffle + one shared-memory exchange"),
    ("sm_75", "float16", 4096, 16, 128, 2, "registers", "warp shuffle + one shared-memory exchange"),
]


@pytest.mark.parametrize("arch,dtype,hidden,access,threads,rows,storage,reduction", TABLE)
def test_decisions(arch, dtype, hidden, access, threads, rows, storage, reduction):
    plan = plan_launch(SPEC, load_profile(arch), dtype, (100_000, hidden))
    b = plan.bucket
    got = (
        b.elems_per_access * DTYPE_BYTES[dtype],
        b.threads_per_row,
        b.rows_per_block,
        b.storage,
        reduction_of(b, plan.kernel.warp_size),
    )
    assert got == (access, threads, rows, storage, reduction)
    assert plan.grid == -(-100_000 // rows) and plan.widened is None
    assert plan.shared_bytes == (hidden * DTYPE_BYTES[dtype] if storage == "shared" else 0)
    assert all(b.reasons.get(k) for k in ("threads_per_row", "rows_per_block", "storage"))


@pytest.mark.parametrize(
    "rows,hidden,threads,grid",
    [
        (64, 4096, 512, 64),  # decode: 32 blocks of 128-thread rows would idle most SMs
        (1024, 2048, 128, 512),  # 256 blocks of 64-thread rows are under 2 per SM
        (8192, 2048, 64, 2048),  # enough rows: the ladder's choice stands
        (3, 16, 8, 1),  # a wider configuration would leave threads without an access
    ],
)
def test_grid_fill_widens_rows(rows, hidden, threads, grid):
    plan = plan_launch(load_spec("layernorm"), load_profile("sm_90"), "bfloat16", (rows, hidden))
    assert (plan.bucket.threads_per_row, plan.grid) == (threads, grid)
    assert (plan.widened is None) == (rows in (8192, 3))


@pytest.mark.parametrize(
    "op,dtype,threads",
    [
        ("rmsnorm", "bfloat16", (128, 256, 512)),  # one reduction: the one-reduction steps
        ("fused_add_rmsnorm", "float16", (128, 256, 512)),
        ("rmsnorm", "float32", (64, 128, 256)),  # 32-bit rows: the ladder (not measured wider)
        ("layernorm", "bfloat16", (64, 128, 256)),  # mean, then variance: two barriers a row
        ("adaln_layernorm_fp32", "bfloat16", (64, 128, 256)),  # float32 modulation
    ],
)
def test_one_reduction_rows_take_the_wider_steps(op, dtype, threads):
    plan = plan_kernel(load_spec(op), load_profile("sm_90"), dtype)
    got = {b.max_row_bytes: b.threads_per_row for b in plan.buckets if b.vectorized}
    assert (got[4096], got[8192], got[16384]) == threads
    assert (got[2048], got[32768]) == (32, 512)  # the other steps are the ladder's
    key = "one_reduction_threads_per_row" if threads[0] == 128 else "row_reduce.threads_per_row"
    assert key in next(b for b in plan.buckets if b.max_row_bytes == 8192).reasons["threads_per_row"]


def test_weight_is_loaded_with_the_row_while_it_fits():
    few = plan_launch(SPEC, load_profile("sm_90"), "bfloat16", (64, 4096))
    many = plan_launch(SPEC, load_profile("sm_90"), "bfloat16", (100_000, 4096))
    long = plan_launch(SPEC, load_profile("sm_90"), "bfloat16", (64, 32768))
    assert few.columns_early and not many.columns_early and not long.columns_early
    assert many.bucket.columns_fit and "fits the 128 B budget" in many.bucket.reasons["columns"]
    assert not long.bucket.columns_fit and "would exceed" in long.bucket.reasons["columns"]


def test_roofline():
    plan = plan_launch(SPEC, load_profile("sm_90"), "bfloat16", (8192, 4096))
    assert plan.min_bytes == 2 * (2 * 8192 * 4096) + 2 * 4096  # x read, out written, weight read
    assert plan.roofline_us(4800) == pytest.approx(plan.min_bytes / 4.8e12 * 1e6)  # 28 µs


@pytest.mark.parametrize("arch", arch_names())
def test_every_configuration_fits_its_profile(arch):
    profile = load_profile(arch)
    for dtype in profile.dtypes:
        plan = plan_kernel(SPEC, profile, dtype)
        assert plan.buckets[-1].max_row_bytes is None, "some configuration must take any hidden size"
        for b in plan.buckets:
            assert b.block_threads <= profile.max_threads_per_block
            assert b.block_threads % profile.warp_size == 0, "full-warp shuffles need whole warps"
            assert b.threads_per_row & (b.threads_per_row - 1) == 0
            if b.storage == "registers":
                held = b.max_accesses_per_thread * b.elems_per_access * DTYPE_BYTES[dtype]
                assert held <= profile.family_facts("row_reduce")["row_register_bytes_per_thread"]
                assert b.threads_per_row * held >= b.max_row_bytes, "the bucket's rows must fit"
            if b.storage == "shared":
                assert b.max_row_bytes <= profile.max_shared_memory_per_block


def test_bf16_refused_on_turing():
    with pytest.raises(
        KgenError, match=r"sm_75 \(Tesla T4\) has no bfloat16 arithmetic .*supported dtypes: float32, float16"
    ):
        plan_kernel(SPEC, load_profile("sm_75"), "bfloat16")


def test_unknown_dtype_and_bad_shape():
    with pytest.raises(KgenError, match="unknown dtype 'int8'"):
        plan_kernel(SPEC, load_profile("sm_90"), "int8")
    with pytest.raises(KgenError, match="rows >= 1 and hidden >= 1"):
        plan_launch(SPEC, load_profile("sm_90"), "float16", (0, 8))


@pytest.mark.parametrize(
    "op, heads",
    [("rope", 1), ("rope_interleaved", 2), ("rope3d", 2), ("qk_norm_rope_flux", 1), ("qk_norm_rope_wan", 2)],
)
def test_rotary_heads_in_flight(op, heads):
    """rotate_half threads hold cos and sin for both halves: one head in flight keeps their registers
    low enough for 3 blocks per SM; interleaved pairs keep two heads in flight (measured both ways); a norm
    over each head one (the profile's head_norm), over the token its pairing's two."""
    from kgen.builder import render_target
    from kgen.project import resolve_target

    plan = plan_kernel(load_spec(op), load_profile("sm_90"), "bfloat16")
    assert plan.heads_in_flight == heads
    assert plan.notes["heads in flight"].startswith(f"{heads} head")
    source = render_target(resolve_target(op, "sm_90"))[f"{op}_cuda/{op}.cu"]
    # two heads' accesses loaded in one statement, before either's math (in order, or the last read first)
    assert bool(re.search(r"h0 = fetch\([^;]*\), h1 = fetch\(", source)) == (heads == 2)


@pytest.mark.parametrize(
    "op, arch, blocks",
    [
        ("rope", "sm_90", 4),
        ("qk_norm_rope", "sm_90", 4),
        ("qk_norm_rope_backward", "sm_90", 1),
        ("rope", "sm_80", 1),
    ],
)
def test_rotary_resident_blocks(op, arch, blocks):
    """The resident blocks a rotary kernel asks of the compiler are the profile's forward_blocks_per_sm, for a
    forward or a backward without a norm; a backward through the norm asks nothing (it would spill)."""
    from kgen.builder import render_target
    from kgen.catalog import backward_spec
    from kgen.project import resolve_target

    forward = op.removesuffix("_backward")
    spec = backward_spec(forward) if op != forward else load_spec(op)
    plan = plan_kernel(spec, load_profile(arch), "bfloat16")
    assert plan.resident_blocks == blocks
    assert ("registers" in plan.notes) == (blocks > 1)
    source = render_target(resolve_target(forward, arch))[f"{forward}_cuda/{op}.cu"]
    bounds = [line for line in source.splitlines() if line.startswith("__global__ void __launch_bounds__")]
    asked = [line for line in bounds if f"? {blocks} : 1)" in line]
    assert bool(asked) == (blocks > 1) and len(bounds) >= 1


@pytest.mark.parametrize("op, split", [("qk_norm_rope", True), ("qk_norm_rope_flux", False)])
def test_rotary_split_shares(op, split):
    """A backward through a norm over each head of q and k splits its chunks by tensor (a thread keeps one
    weight's shares) where the profile's split_shares says so for the pairing: rotate_half (qk_norm_rope)
    yes, interleaved (qk_norm_rope_flux) no; the plan, the rendered kernel and explain's grid agree."""
    from kgen.builder import render_target
    from kgen.catalog import backward_spec
    from kgen.project import resolve_target

    spec, profile = backward_spec(op), load_profile("sm_90")
    plan = plan_kernel(spec, profile, "bfloat16")
    assert plan.split_shares == split and ("weight shares" in plan.notes) == split
    source = render_target(resolve_target(op, "sm_90"))[f"{op}_cuda/{op}_backward.cu"]
    assert ("constexpr int kShares = 1;" in source) == split
    assert ("constexpr int kShares = kWeights;" in source) == (not split)
    grid = {c[0]: c[2] for c in plan_launch(spec, profile, "bfloat16", (1, 24, 4608, 128)).choices}["grid"]
    assert ("no chunk straddles" in grid) == split


@pytest.mark.parametrize(
    "op, pass_, shares",
    [
        ("rope3d", "forward", True),
        ("rope3d", "backward", True),  # the rotation by -θ: the same angles
        ("rope3d_qk", "forward", True),
        ("qk_norm_rope3d", "forward", True),
        ("qk_norm_rope3d", "backward", False),  # the norm's backward sums per batch
        ("rope_wan", "forward", True),
        ("qk_norm_rope_wan", "forward", False),  # a norm over a token sums per batch
        ("rope3d_coords", "forward", False),  # coordinates given per batch
        ("rope_flux", "forward", False),
        ("rope", "forward", False),  # tables, no grid
    ],
)
def test_rotary_grid_angles_shared_by_the_batch(op, pass_, shares):
    """Where the grid angles depend on the token's place alone, a thread takes every batch's heads of its
    token (its angles computed once): the structure's rule, the rendered kernel's walk, the plan's note and
    explain's grid (half the walked tokens at B = 2) agree."""
    from kgen.builder import render_target
    from kgen.catalog import backward_spec
    from kgen.families import family_of
    from kgen.project import resolve_target

    spec = load_spec(op) if pass_ == "forward" else backward_spec(op)
    assert spec.structure.batch_shares_angles == shares
    name = op if pass_ == "forward" else f"{op}_backward"
    source = render_target(resolve_target(op, "sm_90"))[f"{op}_cuda/{name}.cu"]
    assert ("for (; b < Index(args.batch); ++b) {" in source) == shares
    profile = load_profile("sm_90")
    plan = plan_kernel(spec, profile, "bfloat16")
    assert ("by every batch" in plan.notes.get("angles", "")) == shares
    rest = family_of(spec).example_cases(spec)[0].shape[1:]  # a batch's shape
    walks = [
        {c[0]: c[2] for c in plan_launch(spec, profile, "bfloat16", (b, *rest)).choices}["grid"]
        for b in (1, 2)
    ]
    assert ("with its 2 batches' heads" in walks[1]) == shares
    assert (walks[0].split(" tokens")[0] == walks[1].split(" tokens")[0]) == shares


@pytest.mark.parametrize(
    "op, pass_, wave",
    [
        ("rope", "forward", "device_wave_threads()"),
        ("rope", "backward", "device_wave_threads()"),  # no weights: nothing summed across blocks
        ("rope_wan", "forward", "device_wave_threads()"),
        ("qk_norm_rope", "forward", "device_wave_threads()"),
        ("qk_norm_rope", "backward", "kMinThreads"),  # weights summed: the profile's wave, the same bits...
        ("qk_norm_rope_wan", "backward", "kMinThreads"),
    ],
)
def test_rotary_launchers_take_the_devices_wave(op, pass_, wave):
    """A rotary launcher's one full wave is the device's SMs × the arch's threads per SM (every board of an
    arch shares that, not its SM count: H100 PCIe 114 SMs, SXM 132); where blocks sum a weight's gradient
    the profile board's (the same bits on every board), and a head norm's backward grid stops at the row
    reductions' partition (132 SMs × 1024 threads: half a wave of partial rows); the explain grid says
    which."""
    from kgen.builder import render_target
    from kgen.catalog import backward_spec
    from kgen.project import resolve_target

    name = op if pass_ == "forward" else f"{op}_backward"
    source = render_target(resolve_target(op, "sm_90"))[f"{op}_cuda/{name}.cu"]
    assert f"const int64_t wave_threads = {wave};" in source
    assert source.count("const int64_t wave_threads = ") == 1
    assert "kMinThreads / BLOCK_THREADS" not in source and "ceil_div(kMinThreads" not in source
    spec = load_spec(op) if pass_ == "forward" else backward_spec(op)
    grid = {
        c[0]: c[2] for c in plan_launch(spec, load_profile("sm_90"), "bfloat16", (1, 12, 4096, 128)).choices
    }
    assert ("a launch counts its device's SMs" in grid["grid"]) == (wave == "device_wave_threads()")
    assert (
        "at most the weights' gradient partition" not in grid["grid"]
    )  # 12 heads × 128: narrow partial rows


def test_a_head_norm_backward_with_wide_partial_rows_stops_at_the_partition():
    """LTX-Video's q/k norm across every head (weights of 2048): a wave of partial rows would be 17 MB, past
    WIDE_PARTIAL_BYTES, so the grid stops at the row reductions' partition (528 blocks, the launcher's
    `wide`) and the wide column sum adds them; Qwen3's per-head weights (128) keep a wave and 8 slices."""
    from kgen.builder import render_target
    from kgen.catalog import backward_spec
    from kgen.families.rotary import WIDE_PARTIAL_BYTES
    from kgen.project import resolve_target

    source = render_target(resolve_target("qk_norm_rope3d", "sm_90"))[
        "qk_norm_rope3d_cuda/qk_norm_rope3d_backward.cu"
    ]
    assert f"constexpr int64_t kWidePartialBytes = {WIDE_PARTIAL_BYTES >> 20} << 20;" in source
    assert "(wide ? kPartialThreads : wave_threads) / BLOCK_THREADS" in source
    assert "kWeights * args.hidden, args.hidden, wide);" in source
    for op, shape, blocks, partition in (
        ("qk_norm_rope3d", (2, 2688, 2048), 528, True),
        ("qk_norm_rope3d", (2, 8064, 2048), 528, True),
        ("qk_norm_rope", (1, 32, 8192, 128), 1060, False),
    ):
        k_heads = 8 if op == "qk_norm_rope" else None
        plan = plan_launch(backward_spec(op), load_profile("sm_90"), "bfloat16", shape, k_heads=k_heads)
        grid = {c[0]: c for c in plan.choices}["grid"]
        assert grid[1] == f"{blocks} blocks", grid
        assert ("at most the weights' gradient partition (528 blocks" in grid[2]) == partition, grid


def test_row_grid_fill_counts_the_devices_sms():
    """The row launcher's grid-fill rule (min_blocks_per_sm) on the device's SM count, the profile board's
    only where the runtime cannot say."""
    from kgen.builder import render_target
    from kgen.project import resolve_target

    source = render_target(resolve_target("rmsnorm", "sm_90"))["rmsnorm_cuda/rmsnorm.cu"]
    plan = plan_kernel(load_spec("rmsnorm"), load_profile("sm_90"), "bfloat16")
    assert f"constexpr int kMinBlocksPerSm = {plan.min_blocks_per_sm};" in source
    assert plan.min_blocks == plan.min_blocks_per_sm * 132
    assert "int64_t(kMinBlocksPerSm) * sms : kMinBlocks;" in source
    assert "< min_blocks &&" in source and "< kMinBlocks &&" not in source


@pytest.mark.parametrize(
    "op, arch, shape, asked, blocks",
    [
        (
            "residual_adaln_rmsnorm",
            "sm_90",
            (8192, 4096),
            4,
            4,
        ),  # 256 threads, the weight after the reduction
        ("residual_adaln_rmsnorm", "sm_90", (1024, 2048), 4, 1),  # one wave: the weight held with the row
        ("residual_adaln_rmsnorm", "sm_90", (4096, 16384), 4, 1),  # 512 threads
        ("residual_adaln_rmsnorm", "sm_80", (8192, 4096), 1, 1),
        ("residual_layernorm_fp32", "sm_90", (8192, 4096), 1, 1),  # a float32 tensor: it spilled at 64
    ],
)
def test_row_resident_blocks(op, arch, shape, asked, blocks):
    """A row kernel asks the compiler for the profile's resident_blocks (1 for an op with a float32 tensor)
    where its block leaves a thread 64 registers at that count and does not hold the per-column inputs, else
    1: in the plan, the launcher's __launch_bounds__ and `kgen explain`'s choice."""
    from kgen.builder import render_target
    from kgen.project import resolve_target

    spec, profile = load_spec(op), load_profile(arch)
    plan = plan_kernel(spec, profile, "bfloat16")
    assert plan.resident_blocks == asked
    assert plan.resident_block_threads * plan.resident_blocks * 64 == profile.registers_per_sm
    choices = {c[0]: c[1] for c in plan_launch(spec, profile, "bfloat16", shape).choices}
    assert choices["resident blocks"] == str(blocks)
    source = render_target(resolve_target(spec.name, arch))[f"{spec.name}_cuda/{spec.name}.cu"]
    assert f"constexpr int kResidentBlocks = {asked};" in source
    assert "<= kResidentBlockThreads && !COLUMNS_IN_REGISTERS ? kResidentBlocks : 1)" in source


@pytest.mark.parametrize(
    "shape, grid, why, held, block",
    [
        (
            (1, 40, 32760, 128),
            528,
            "1 a block (a token's 80 heads: 16 channel groups × 16 chunks)",
            "5 held",
            "1 token a block, 256 threads a token",
        ),
        (
            (1, 12, 32760, 128),
            528,
            "2 a block (a token's 24 heads: 16 channel groups × 8 chunks)",
            "3 held",
            "2 tokens a block, 128 threads a token",
        ),
        (
            (2, 7, 64),
            1,
            "32 a block (a token's 2 heads: 8 channel groups × 1 chunks)",
            "2 held",
            "32 tokens a block, 8 threads a token",
        ),
        ((1, 48, 4608, 128), 288, "at most one full wave", "2", None),  # 96 heads: more than a block holds
    ],
)
def test_a_backward_through_a_token_norm_holds_each_token_in_a_block(shape, grid, why, held, block):
    """Wan's q/k norm backward: a token's q and k heads to one block's threads (chunks of 40 elements of
    each tensor per thread: 5 heads of 8 bf16), at most 528 blocks (132 SMs × 1024 threads / 256); 96 heads
    of 128 channels fit no block: the per-token kernel's grid."""
    from kgen.families import family_of
    from kgen.families.base import Case

    spec = load_spec("qk_norm_rope_wan")
    back = family_of(spec).backward(spec)
    kernel = plan_kernel(back, load_profile("sm_90"), "bfloat16")
    choices = {
        c[0]: c for c in family_of(back).launch(back, load_profile("sm_90"), kernel, Case(shape)).choices
    }
    assert choices["grid"][1] == f"{grid} blocks" and why in choices["grid"][2]
    assert choices["heads in flight"][1] == held  # the held kernel's, or the per-token kernel's two
    if block:  # 256 threads: the tokens a block holds, each token's threads
        assert choices["block"][2].endswith(block)


@pytest.mark.parametrize(
    "op, shape, per_batch, storage",
    [
        ("rmsnorm", (64, 8192), False, "staged"),
        ("rmsnorm", (65536, 128), False, "staged"),  # 8 rows a block, one partial row
        ("rmsnorm", (64, 8200), False, "split"),
        ("rmsnorm", (256, 65536), False, "split"),
        ("residual_adaln_rmsnorm", (3, 40, 4096), True, "staged"),
        ("residual_adaln_rmsnorm", (3, 40, 4104), True, "split"),
        ("adaln_layernorm_fp32", (1, 32760, 5120), True, "split"),
        ("layernorm", (7, 40000), False, "split"),
    ],
)
def test_rows_beyond_the_registers_split_into_row_groups(op, shape, per_batch, storage):
    """A backward row beyond the register budget splits into the sums kernel and the outputs kernel over
    column chunks × row groups: at least one group per batch and at most a batch's rows, groups never
    spanning batches, the chunks covering the row, one partial row per group. A row held on chip: one
    partial row per block (its row slots' added in shared memory), the blocks resident at once."""
    from kgen.catalog import backward_spec
    from kgen.families import family_of
    from kgen.families.base import Case

    spec, profile = backward_spec(op), load_profile("sm_90")
    kernel = plan_kernel(spec, profile, "bfloat16")
    plan = family_of(spec).launch(spec, profile, kernel, Case(shape, per_batch=per_batch))
    assert plan.bucket.storage == storage
    choices = {name: value for name, value, _ in plan.choices}
    rows, hidden = plan.rows, shape[-1]
    if storage != "split":  # one partial row per block, its row slots' added in shared memory
        assert "outputs grid" not in choices
        assert choices["partial rows"].startswith(f"{plan.grid} × {hidden} fp32")
        assert plan.grid * plan.bucket.block_threads <= profile.sm_count * kernel.resident_threads_per_sm
        return
    batches = shape[0] if per_batch else 1
    chunks, groups = kernel.split_grid(rows, hidden, plan.bucket.elems_per_access, batches)
    assert groups % batches == 0 and batches <= groups <= rows
    assert chunks * kernel.split_threads * plan.bucket.elems_per_access >= hidden
    assert (chunks - 1) * kernel.split_threads * plan.bucket.elems_per_access < hidden
    assert chunks * groups <= max(
        chunks, profile.sm_count * kernel.resident_threads_per_sm // kernel.split_threads
    )
    assert choices["outputs grid"] == f"{chunks} column chunks × {groups} row groups"
    assert choices["partial rows"].startswith(f"{groups} × {hidden} fp32")
    assert 1 <= kernel.split_rows <= 4


DIMS = "1 to 4 dims ([B, H, T, D], [B, S, C], [T, D] or [D])"


@pytest.mark.parametrize(
    "op, dtype, shape, message",
    [
        (
            "rope",
            "bfloat16",
            (1, 8, 16, 63),
            "x's last dim holds pairs and must be even, got shape [1, 8, 16, 63]",
        ),
        ("rope_interleaved", "float16", (7,), "x's last dim holds pairs and must be even, got shape [7]"),
        ("rope", "bfloat16", (2, 1, 8, 16, 64), f"x must have {DIMS}, got shape [2, 1, 8, 16, 64]"),
        (
            "qk_norm_rope",
            "bfloat16",
            (1, 8, 16, 96),
            "the norm before the rotation serves head sizes D = 16 · 2^k up to 4096 in bfloat16 (D / 16 "
            "lanes of one warp or whole warps of a 256-thread block sum a head), got D = 96 "
            "(shape [1, 8, 16, 96])",
        ),
        ("qk_norm_rope_flux", "bfloat16", (1, 8, 16, 4096), "head sizes D = 8 · 2^k up to 2048 in bfloat16"),
        ("qk_norm_rope3d", "float32", (2, 1, 2048), "D = 4 · 2^k up to 1024 in float32 (D / 4 lanes of one"),
        ("qk_norm_rope_wan", "float32", (1, 16, 24), "D = 4 · 2^k up to 128 in float32 (D / 4 lanes"),
        (
            "rope3d",
            "bfloat16",
            (1, 2, 24, 64),
            "x must be [B, S, C] with S = frames·height·width tokens in row-major order, got shape "
            "[1, 2, 24, 64]",
        ),
        (
            "rope_wan",
            "bfloat16",
            (24, 128),
            "x must be [B, S, C] or [B, H, S, D] with S = frames·height·width",
        ),
    ],
)
def test_launch_refuses_what_the_binding_refuses(op, dtype, shape, message):
    """A shape the generated binding refuses (TORCH_CHECK) is no plan, with the binding's words: odd rotary
    pairs, more than 4 dims, a grid op's [B, S, C] (or [B, H, S, D]) layout, head sizes a q/k norm's warp
    lanes cannot sum; its derived backward's too."""
    from kgen.catalog import backward_spec

    with pytest.raises(PlanError) as refused:
        plan_launch(load_spec(op), load_profile("sm_90"), dtype, shape)
    assert str(refused.value).startswith(f"{op}: ") and message in str(refused.value)
    with pytest.raises(PlanError, match=f"^{op}_backward: "):
        plan_launch(backward_spec(op), load_profile("sm_90"), dtype, shape)


@pytest.mark.parametrize("op", ["qk_norm_rope", "qk_norm_rope_flux", "qk_norm_rope_wan", "qk_norm_rope3d"])
def test_the_norms_head_sizes_are_the_bindings(op):
    """Every even head size to 600 and wider ones in each dtype: planned exactly where the rendered binding's
    condition (hidden % norm_elems == 0, norm_lanes = hidden / norm_elems a power of two up to its bound: 32
    lanes over a token, a 256-thread block's over a head) holds."""
    import re

    from kgen.builder import render_target
    from kgen.project import resolve_target

    binding = render_target(resolve_target(op, "sm_90"))["torch-ext/torch_binding.cpp"]
    access, pairs = map(
        int, re.search(r"norm_elems = (\d+) / int64_t\(x\.element_size\(\)\) \* (\d)", binding).groups()
    )
    most = int(re.search(r"norm_lanes <= (\d+) &&", binding).group(1))
    assert most == (32 if load_spec(op).structure.norm.over == "token" else 256)
    spec, profile = load_spec(op), load_profile("sm_90")
    for dtype in profile.dtypes:
        elems = access // DTYPE_BYTES[dtype] * pairs
        for hidden in [*range(2, 601, 2), 1024, 1040, 2048, 3072, 4096, 8192]:
            lanes = hidden // elems
            served = hidden % elems == 0 and 1 <= lanes <= most and lanes & (lanes - 1) == 0
            try:
                plan_launch(
                    spec, profile, dtype, (2, 1, hidden) if spec.structure.grid else (1, 4, 8, hidden)
                )
            except PlanError as err:
                assert not served and f"got D = {hidden}" in str(err), (dtype, hidden, err)
            else:
                assert served, (dtype, hidden)


def test_a_packed_input_is_twice_the_planned_hidden():
    """A two-halves op (geglu's [..., 2F]) is planned at its output's hidden: the input's last dim is always
    even, which is all its binding asks, so an odd hidden plans (the scalar path)."""
    from kgen.families import family_of
    from kgen.families.base import Case

    spec = load_spec("geglu")
    plan = plan_launch(spec, load_profile("sm_90"), "bfloat16", (8, 4097))
    assert plan.hidden == 4097 and plan.bucket.elems_per_access == 1
    assert family_of(spec).tensor_shape(spec, spec.lead, Case((8, 4097))) == (8, 8194)


def test_per_batch_counts_broadcast_inputs_once_a_batch():
    """Broadcast inputs per batch ([B, 1, C]) in the traffic where asked (Wan's modulation: the 1341.9 MB
    kgen bench moves), per token otherwise; refused for an op with no broadcast input."""
    from kgen.families import family_of
    from kgen.families.base import Case, min_bytes

    spec, profile, shape = load_spec("residual_layernorm_fp32"), load_profile("sm_90"), (1, 32760, 5120)
    family = family_of(spec)
    per_batch = plan_launch(spec, profile, "bfloat16", shape, per_batch=True)
    per_token = plan_launch(spec, profile, "bfloat16", shape)
    assert per_batch.min_bytes == min_bytes(family, spec, Case(shape, per_batch=True), 2) == 1_341_911_040
    assert per_token.min_bytes == min_bytes(family, spec, Case(shape), 2) > per_batch.min_bytes
    with pytest.raises(PlanError, match="per batch: rmsnorm has no broadcast input"):
        plan_launch(SPEC, profile, "bfloat16", (8, 4096), per_batch=True)


@pytest.mark.parametrize(
    "op, pass_, flat",
    [
        ("gelu_tanh", "forward", True),
        ("gelu_tanh", "backward", True),
        ("silu_mul", "forward", True),
        ("silu_mul", "backward", True),
        ("geglu", "forward", False),  # a packed input's halves sit a row apart: rows stay rows
        ("silu_and_mul", "backward", False),
    ],
)
def test_dense_elementwise_tensors_are_one_row_in_one_launch(op, pass_, flat):
    """Dense tensors of an op without packed halves are one row whatever the hidden size: its accesses at
    their index (the kernel's FLAT form, no row/column division) and the elements past the last whole
    access in the same launch (no second, scalar launch). The rendered launcher, the plan's note and
    explain's choice agree; a packed op keeps its rows, split without a division."""
    from kgen.builder import render_target
    from kgen.catalog import backward_spec
    from kgen.project import resolve_target

    spec = load_spec(op) if pass_ == "forward" else backward_spec(op)
    name = op if pass_ == "forward" else f"{op}_backward"
    source = render_target(resolve_target(op, "sm_90"))[f"{op}_cuda/{name}.cu"]
    launches = source.split("cudaError_t launch_bfloat16")[1].split("\n}\n")[0]
    assert launches.count("launch_config<") == (3 if flat else 2), launches
    assert ("kBlockThreads, true>(body, int(total - body.hidden)" in launches) == flat
    assert ("if (FLAT && tail > 0" in source) == flat
    assert "split.row(g) : g / per_row" in source  # rows that stay rows: a multiply and a shift below 2^31
    profile = load_profile("sm_90")
    plan = plan_kernel(spec, profile, "bfloat16")
    assert ("flat path" in plan.notes) == flat
    for hidden in (8192, 12242):  # a multiple of the 8-element access and not
        shape = (64, hidden * (2 if not flat and pass_ == "forward" else 1))
        accesses = {c[0]: c[2] for c in plan_launch(spec, profile, "bfloat16", shape).choices}["accesses"]
        assert ("one row of rows × hidden" in accesses) == flat, accesses

"""Arch profiles: the shipped ones load; broken ones fail naming the file and the field."""

from __future__ import annotations

import pytest

import kgen.catalog as catalog
from kgen.catalog import arch_names, data_dir, load_profile
from kgen.errors import KgenError


def test_shipped_profiles():
    assert arch_names() == ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]  # oldest first
    t4, a100, a10g, l40s, hopper, b200, rtx5090 = (load_profile(a) for a in arch_names())
    assert (t4.sm_count, t4.shared_memory_per_sm, t4.bf16) == (40, 64 * 1024, False)
    assert (a100.sm_count, a100.bf16, a100.clusters) == (108, True, False)
    assert (hopper.sm_count, hopper.clusters) == (132, True)
    assert [d.memory_bandwidth_gbs for d in hopper.devices] == [3350, 4800, 2000, 4000]
    assert t4.dtypes == ["float32", "float16"]
    assert (a10g.max_threads_per_sm, l40s.sm_count, rtx5090.max_shared_memory_per_block) == (
        1536,
        142,
        99 * 1024,
    )
    assert (b200.sm_count, b200.clusters, b200.tma, a10g.tma) == (148, True, True, False)
    assert [d.name for d in l40s.devices] == ["L40S", "L4", "RTX 4090"]
    assert "not measured" in a10g.planner.basis and "measured on the H200" in hopper.planner.basis


def test_rotary_head_sizes_assume_every_profiles_block():
    """The q/k norm head sizes the integrations choose by, and the rotary family's example heads, assume
    a block of 256 threads and 16-byte accesses: every shipped profile's (a launcher reads its own)."""
    from kgen.families import rotary
    from kgen.integrations import _rotary_fit

    for arch in arch_names():
        profile = load_profile(arch)
        assert profile.planner.block_threads == rotary.BLOCK_THREADS == _rotary_fit.BLOCK_THREADS, arch
        assert profile.max_access_bytes == rotary.ACCESS_BYTES == _rotary_fit.ACCESS_BYTES, arch


def test_every_number_has_a_source_comment():
    for path in data_dir("arch").glob("*.toml"):
        for line in path.read_text().splitlines():
            code = line.split("#")[0]
            if code.strip().startswith("{"):
                continue  # ladder rows: the comment above the array gives their source
            if "=" in code and code.split("=", 1)[1].strip()[:1].isdigit():
                assert "#" in line, f"{path.name}: no source for `{line.strip()}`"


@pytest.fixture
def arch_dir(tmp_path, monkeypatch):
    real = data_dir("arch")
    monkeypatch.setattr(catalog, "data_dir", lambda kind: tmp_path if kind == "arch" else real)
    load_profile.cache_clear()
    yield tmp_path, (real / "sm_90.toml").read_text()
    load_profile.cache_clear()


# (text in sm_90.toml, its replacement) -> what the message must say
@pytest.mark.parametrize(
    "old,new,fragment",
    [
        ("sm_count = 132", "", "ArchProfile.sm_count: Field required"),
        ("sm_count = 132", "sm_count = -1", "ArchProfile.sm_count: Input should be greater than 0"),
        ("bf16 = true", 'bf16 = "maybe"', "ArchProfile.bf16: Input should be a valid boolean"),
        (
            'compute_capability = "9.0"',
            'compute_capability = "8.0"',
            "does not match compute_capability '8.0'",
        ),
        ("threads = 16 }", "threads = 24 }", "threads must be a power of two, got 24"),
        ("max_row_bytes = 256,", "max_row_bytes = 64,", "max_row_bytes must increase step by step"),
        (
            "{ max_row_bytes = 8192, threads = 256 }",
            "{ max_row_bytes = 6144, threads = 256 }",
            "one_reduction_threads_per_row: 6144 B is not a step of threads_per_row",
        ),
        (
            "{ max_row_bytes = 16384, threads = 512 },\n]",
            "{ max_row_bytes = 16384, threads = 2048 },\n]",
            "one_reduction_threads_per_row asks for more threads than max_threads_per_block",
        ),
        (
            "min_blocks_per_sm = 2",
            "min_blocks_per_sm = 0",
            "ArchProfile.planner.row_reduce.min_blocks_per_sm: Input should be greater than or equal to 1",
        ),
        ("l2_bytes", "l2_size", "ArchProfile.l2_size: Extra inputs are not permitted"),
        ("max_access_bytes = 16", "", "ArchProfile.max_access_bytes: Field required"),
        ("[planner.rotary]", "[planner.rotray]", "[planner.rotray]: no structure family is named 'rotray'"),
        (
            "heads_in_flight = { half = 1, interleaved = 2, head_norm = 1 }",
            "",
            "ArchProfile.planner.rotary.heads_in_flight: Field required",
        ),
        (
            "row_register_bytes_per_thread = 128",
            "row_register_bytes_per_thread = 512",
            "row_register_bytes_per_thread: 512 B is more than half the 128 registers a thread of a "
            "512-thread block may hold",
        ),
    ],
)
def test_bad_profile_message(arch_dir, old, new, fragment):
    folder, text = arch_dir
    assert old in text
    (folder / "sm_90.toml").write_text(text.replace(old, new, 1))
    with pytest.raises(KgenError) as info:
        load_profile("sm_90")
    assert str(info.value).startswith(f"arch profile 'sm_90' ({folder / 'sm_90.toml'}) is invalid:")
    assert fragment in str(info.value)


def test_not_toml(arch_dir):
    folder, _ = arch_dir
    (folder / "sm_90.toml").write_text("name = \n")
    with pytest.raises(KgenError, match="is not valid TOML"):
        load_profile("sm_90")


def test_unknown_arch():
    with pytest.raises(
        KgenError,
        match=r"unknown arch 'sm_101' \(did you mean 'sm_100'\?\); known archs: sm_75, sm_80, sm_86, sm_89, "
        "sm_90, sm_100, sm_120",
    ):
        load_profile("sm_101")
    with pytest.raises(KgenError, match=r"unknown arch 'hopper'; known archs"):  # nothing close: no guess
        load_profile("hopper")

"""Arch profiles: the shipped ones load; broken ones fail naming the file and the field."""

from __future__ import annotations

import tomllib

import pytest

import kgen.catalog as catalog
from kgen.catalog import KgenError, arch_names, data_dir, load_profile


def test_shipped_profiles():
    assert arch_names() == ["sm_75", "sm_80", "sm_90"]
    t4, a100, hopper = (load_profile(a) for a in arch_names())
    assert (t4.sm_count, t4.shared_memory_per_sm, t4.bf16) == (40, 64 * 1024, False)
    assert (a100.sm_count, a100.bf16, a100.clusters) == (108, True, False)
    assert (hopper.sm_count, hopper.clusters) == (132, True)
    assert [d.memory_bandwidth_gbs for d in hopper.devices] == [3350, 4800]
    assert t4.dtypes == ["float32", "float16"]


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
    yield tmp_path, tomllib.loads((real / "sm_90.toml").read_text()), (real / "sm_90.toml").read_text()
    load_profile.cache_clear()


@pytest.mark.parametrize("edit,fragments", [
    (lambda p: p.pop("sm_count"), ["sm_count: Field required"]),
    (lambda p: p.update(sm_count=-1), ["sm_count: Input should be greater than 0"]),
    (lambda p: p.update(bf16="maybe"), ["bf16: Input should be a valid boolean"]),
    (lambda p: p.update(compute_capability="8.0"), ["does not match compute_capability '8.0'"]),
    (lambda p: p["planner"].update(threads_per_row=[{"max_row_bytes": 64, "threads": 24}]),
     ["threads must be a power of two, got 24"]),
    (lambda p: p["planner"].update(threads_per_row=[{"max_row_bytes": 64, "threads": 8},
                                                   {"max_row_bytes": 32, "threads": 16}]),
     ["max_row_bytes must increase"]),
    (lambda p: p.update(devices=[]), ["devices: List should have at least 1 item"]),
])
def test_bad_profile_message(arch_dir, edit, fragments):
    folder, data, _ = arch_dir
    edit(data)
    lines = []
    for key, value in data.items():
        if not isinstance(value, (dict, list)):
            lines.append(f"{key} = {value!r}".replace("True", "true").replace("False", "false").replace("'", '"'))
    text = "\n".join(lines) + "\n"
    for device in data.get("devices", []):
        text += f'\n[[devices]]\nname = "{device["name"]}"\nmemory_bandwidth_gbs = {device["memory_bandwidth_gbs"]}\n'
    if "devices" in data and not data["devices"]:
        text = "devices = []\n" + text
    planner = data["planner"]
    steps = ", ".join(f"{{ max_row_bytes = {s['max_row_bytes']}, threads = {s['threads']} }}"
                      for s in planner["threads_per_row"])
    text += (f"\n[planner]\nrow_register_bytes_per_thread = {planner['row_register_bytes_per_thread']}\n"
             f"threads_per_row = [{steps}]\nblock_threads = {planner['block_threads']}\n")
    (folder / "sm_90.toml").write_text(text)
    with pytest.raises(KgenError) as info:
        load_profile("sm_90")
    assert str(info.value).startswith(f"arch profile 'sm_90' ({folder / 'sm_90.toml'}) is invalid:")
    for fragment in fragments:
        assert fragment in str(info.value)


def test_not_toml(arch_dir):
    folder, _, _ = arch_dir
    (folder / "sm_90.toml").write_text("name = \n")
    with pytest.raises(KgenError, match="is not valid TOML"):
        load_profile("sm_90")


def test_unknown_arch():
    with pytest.raises(KgenError, match="unknown arch 'sm_100'; known archs: sm_75, sm_80, sm_90"):
        load_profile("sm_100")

"""A plain `pip install .` ships ops/, arch/, codegen_templates/ and the bench shapes in the wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_carries_the_data(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)], check=True
    )
    (wheel,) = tmp_path.glob("kgen-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in [
        "kgen/cli.py",
        "kgen/_data/ops/rmsnorm.py",
        "kgen/_data/arch/sm_90.toml",
        "kgen/_data/codegen_templates/row_reduce/kernel.cu.j2",
        "kgen/_data/bench/shapes.toml",
    ]:
        assert required in names, required
    for spec in (ROOT / "ops").glob("*.py"):
        assert f"kgen/_data/ops/{spec.name}" in names

"""kgen bench --e2e's clock samples (kgen.integrations.gpu_clock) without a GPU: a stand-in nvidia-smi that
prints what the real one prints with --format=csv,noheader,nounits, and the report's clock table."""

from __future__ import annotations

import sys
import time

import pytest

from kgen.integrations import gpu_clock
from kgen.integrations.e2e import markdown

# prints its samples every 10 ms: the SM clock 1980 ... 1940, the power cap's bit on every other one;
# a driver that does not know the reasons field says so and exits, as nvidia-smi does
FAKE = """#!{python}
import sys, time
query = next(a for a in sys.argv if a.startswith("--query-gpu="))
if "clocks_event_reasons" in query and {old_driver}:
    print('Field "clocks_event_reasons.active" is not a valid field to query.', flush=True)
    sys.exit(2)
for i in range(100000):
    reasons = (", 0x0000000000000004" if i % 2 else ", 0x0000000000000000") if "clocks_event" in query else ""
    print(f"{{1980 - 10 * (i % 5)}}, {{600 + i % 5}}.5" + reasons, flush=True)
    time.sleep(0.01)
"""


def fake_smi(tmp_path, old_driver: bool = False) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text(FAKE.format(python=sys.executable, old_driver=old_driver))
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("old_driver", [False, True])
def test_samples_inside_the_timed_windows(tmp_path, old_driver):
    with gpu_clock.ClockSampler(command=fake_smi(tmp_path, old_driver), period_ms=10) as clocks:
        begin = time.monotonic()
        time.sleep(0.3)
        end = time.monotonic()
    assert len(clocks.samples) >= 10
    seen = clocks.summary([(begin, end)])
    assert 1940 <= seen["SM MHz"] <= 1980 and 600.5 <= seen["W"] <= 604.5  # the samples printed
    if old_driver:  # the clock and power alone
        assert seen["power capped"] is None and all(s[3] is None for s in clocks.samples)
    else:  # every other sample capped
        assert 0.3 <= seen["power capped"] <= 0.7
    assert clocks.summary([(end + 1, end + 2)]) is None  # no sample there
    count = len(clocks.samples)
    time.sleep(0.05)
    assert len(clocks.samples) == count  # stopped with the context


def test_no_nvidia_smi_or_no_gpu_samples_nothing(tmp_path, monkeypatch):
    assert gpu_clock.sampler("cpu") is None
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi there
    assert gpu_clock.sampler("cuda") is None
    silent = tmp_path / "silent"  # a command that prints nothing it can read: no samples, no thread left
    silent.write_text("#!/bin/sh\nexit 0\n")
    silent.chmod(0o755)
    with gpu_clock.ClockSampler(command=str(silent)) as clocks:
        pass
    assert clocks.samples == [] and clocks.summary([(0, time.monotonic())]) is None


def test_the_report_has_each_variants_clock():
    clock = {"SM MHz": 1661.4, "W": 692.2, "power capped": 1.0}
    result = {
        "target": "ltx",
        "device": "NVIDIA H100 80GB HBM3",
        "torch": "2.11.0",
        "rounds": 3,
        "repeats": 20,
        "date": "2026-12-06",
        "goals": {},
        "rows": [
            {
                "workload": "LTX",
                "eager ms": 249.0,
                "eager + kgen ms": 172.7,
                "clocks": {"eager + kgen": clock},
            },
            {"workload": "LTX small", "eager ms": 75.0, "eager + kgen ms": 46.9},
        ],
    }
    table = markdown(result)
    assert "| workload | eager MHz, W, capped | eager + kgen MHz, W, capped |" in table
    assert "| LTX | n/a | 1661, 692, 100% |" in table
    assert "| LTX small |" not in table.split("SM clock and power")[1]  # a row without samples: not listed
    del result["rows"][0]["clocks"]
    assert "SM clock and power" not in markdown(result)

"""The GPU's SM clock and power draw while `kgen bench --e2e` times each variant, sampled by nvidia-smi every
100 ms. A board at its power limit lowers its SM clock the more densely a step computes: on an H100 (700 W)
the same GEMMs ran 6 % slower under torch.compile + kgen than in eager at an 8.7 % lower clock
(bench/results/batch-angles-clock-h100-2026-12-06). The timings alone do not show that; the report does.
Without nvidia-smi (or on a CPU) nothing is sampled and the report has no clock table."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time

PERIOD_MS = 100
POWER_CAP = 0x4  # nvidia-smi's clocks_event_reasons.active bit: the software power cap (the board's limit)
FIELDS = ("clocks.sm", "power.draw", "clocks_event_reasons.active")


class ClockSampler:
    """Samples (monotonic seconds, SM MHz, W, reasons bitmask) in a thread while the context is open; a driver
    without the reasons field is asked for the clock and power alone."""

    def __init__(self, device: str = "0", command: str = "nvidia-smi", period_ms: int = PERIOD_MS):
        self.samples: list[tuple[float, float, float, int | None]] = []
        self._args = [f"--id={device}", "--format=csv,noheader,nounits", f"--loop-ms={period_ms}"]
        self._command, self._process, self._thread = command, None, None

    def __enter__(self) -> ClockSampler:
        for fields in (FIELDS, FIELDS[:2]):
            process = subprocess.Popen(
                [self._command, f"--query-gpu={','.join(fields)}", *self._args],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            first = process.stdout.readline()
            if self._add(first):
                self._process = process
                self._thread = threading.Thread(target=self._read, daemon=True)
                self._thread.start()
                break
            process.kill()
            process.wait()
        return self

    def __exit__(self, *_) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait()
            self._thread.join(timeout=1)

    def _read(self) -> None:
        for line in self._process.stdout:
            self._add(line)

    def _add(self, line: str) -> bool:
        parts = [p.strip() for p in line.split(",")]
        try:
            clock, power = float(parts[0]), float(parts[1])
            reasons = int(parts[2], 16) if len(parts) > 2 else None
        except (ValueError, IndexError):
            return False
        self.samples.append((time.monotonic(), clock, power, reasons))
        return True

    def summary(self, windows: list[tuple[float, float]]) -> dict | None:
        """Mean SM clock and power of the samples inside the windows (monotonic seconds), and the share of
        them with the power cap active (None where the driver does not say); None without samples."""
        inside = [s for s in self.samples if any(start <= s[0] <= end for start, end in windows)]
        if not inside:
            return None
        reasons = [s[3] for s in inside if s[3] is not None]
        return {
            "SM MHz": statistics.mean(s[1] for s in inside),
            "W": statistics.mean(s[2] for s in inside),
            "power capped": sum(bool(r & POWER_CAP) for r in reasons) / len(reasons) if reasons else None,
        }


def sampler(device: str, smi_id: str = "0") -> ClockSampler | None:
    """A sampler for a CUDA device (nvidia-smi's --id: index or UUID) with nvidia-smi on PATH, else None."""
    return ClockSampler(smi_id) if device == "cuda" and shutil.which("nvidia-smi") else None

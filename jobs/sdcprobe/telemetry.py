"""What the device says about itself while it works: power, temperature, clocks.

On NVIDIA GPUs the figures come from NVML through ``nvidia-ml-py`` (module
``pynvml``) when it is importable; it is optional, and without it the figures are
*absent* (``None``, named in ``absent``), never zero: a zero would read as a device
drawing no power. On the CPU the current and maximum clock come from cpufreq in
sysfs where the kernel exposes it; power and temperature are absent there.
Reading is cheap (no device sync) and done at round boundaries by the compute
check and at check boundaries by the worker, so throttling shows as clocks that
fall during the run.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

#: The figures a sample may carry, in the order they are reported.
FIELDS = ("power_w", "power_limit_w", "temperature_c", "clock_mhz", "max_clock_mhz")


@dataclass
class Sample:
    """One reading; None where the device or the host does not tell."""

    at: float
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    clock_mhz: float | None = None
    max_clock_mhz: float | None = None

    def absent(self) -> list[str]:
        """The figures this sample lacks."""
        return [name for name in FIELDS if getattr(self, name) is None]


def _nvml() -> ModuleType | None:
    """``pynvml`` (from nvidia-ml-py), initialised; None when it is missing or NVML is not."""
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:  # not installed, no driver, no GPU: the figures are absent
        return None
    return nvml


@dataclass
class Telemetry:
    """Reads one device's figures; built once per worker."""

    backend: str
    index: int = 0
    uuid: str | None = None
    sysfs: Path = Path("/sys/devices/system/cpu")
    source: str | None = None
    _handle: Any = None
    _nvml: ModuleType | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.backend == "cuda":
            self._nvml = _nvml()
            if self._nvml is not None:
                with contextlib.suppress(Exception):
                    self._handle = (
                        self._nvml.nvmlDeviceGetHandleByUUID(self.uuid)
                        if self.uuid
                        else self._nvml.nvmlDeviceGetHandleByIndex(self.index)
                    )
            self.source = "nvml" if self._handle is not None else None
        elif self.backend == "cpu" and (self.sysfs / "cpu0" / "cpufreq").exists():
            self.source = "cpufreq"

    def read(self, at: float) -> Sample:
        """The figures now (``at``: the caller's clock, seconds)."""
        sample = Sample(at=at)
        if self._handle is not None and self._nvml is not None:
            nvml, handle = self._nvml, self._handle
            with contextlib.suppress(Exception):
                sample.power_w = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            with contextlib.suppress(Exception):
                sample.power_limit_w = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
            with contextlib.suppress(Exception):
                sample.temperature_c = float(
                    nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
                )
            with contextlib.suppress(Exception):
                sample.clock_mhz = float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
            with contextlib.suppress(Exception):
                sample.max_clock_mhz = float(
                    nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)
                )
        elif self.source == "cpufreq":
            cpu = self.sysfs / f"cpu{self.index}" / "cpufreq"
            if not cpu.exists():
                cpu = self.sysfs / "cpu0" / "cpufreq"
            sample.clock_mhz = _khz(cpu / "scaling_cur_freq")
            sample.max_clock_mhz = _khz(cpu / "cpuinfo_max_freq")
        return sample


def _khz(path: Path) -> float | None:
    try:
        return int(path.read_text().strip()) / 1000.0
    except (OSError, ValueError):
        return None


def summarise(samples: list[Sample]) -> dict[str, int | float | str | None]:
    """Metrics from a check's samples: power drawn against the limit (the mean over the
    last third of the samples, once the device has warmed), the hottest temperature,
    the clock range, when power and temperature settled, and which figures were absent
    (reported as null, never as zero)."""
    if not samples:
        return {}
    tail = samples[len(samples) * 2 // 3 :] or samples
    power = _mean([s.power_w for s in tail])
    limit = _mean([s.power_limit_w for s in tail])
    clocks = [s.clock_mhz for s in samples if s.clock_mhz is not None]
    temps = [s.temperature_c for s in samples if s.temperature_c is not None]
    absent = sorted({name for s in samples for name in s.absent()})
    out: dict[str, int | float | str | None] = {
        "power_w": _r(power),
        "power_limit_w": _r(limit),
        "power_ratio": _r(power / limit) if power is not None and limit else None,
        "temperature_c_max": _r(max(temps)) if temps else None,
        "clock_mhz_min": _r(min(clocks)) if clocks else None,
        "clock_mhz_max": _r(max(clocks)) if clocks else None,
        "max_clock_mhz": _r(_mean([s.max_clock_mhz for s in samples])),
        "settled_s": _r(settled_after(samples)),
        "telemetry_absent": ",".join(absent) if absent else None,
    }
    return out


def settled_after(
    samples: list[Sample], power_band: float = 0.05, temp_band: float = 2.0
) -> float | None:
    """Seconds from the first sample until power stayed within ``power_band`` of its final
    mean and temperature within ``temp_band`` degrees of its last value; None when the
    device reports neither, or never settled."""
    powers = [(s.at, s.power_w) for s in samples if s.power_w is not None]
    temps = [(s.at, s.temperature_c) for s in samples if s.temperature_c is not None]
    if not powers and not temps:
        return None
    start = samples[0].at
    since = start
    if powers:
        final = _mean([p for _, p in powers[len(powers) * 2 // 3 :]]) or 0.0
        for at, p in powers:
            if abs(p - final) > power_band * max(final, 1e-9):
                since = max(since, at)
    if temps:
        last = temps[-1][1]
        for at, t in temps:
            if abs(t - last) > temp_band:
                since = max(since, at)
    # Settled means a stretch of at least three samples after the last one out of band
    # (the final samples always agree with their own mean).
    after = sum(1 for s in samples if s.at > since)
    if since == start and after >= len(samples) - 1:
        return 0.0
    return since - start if after >= 3 else None


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _r(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None

"""Shared reporting for `python -m launch.benchmark`: a readable table, then one JSON line of figures."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from typing import Any, Callable, Sequence

from conductor import host_memory


@dataclasses.dataclass
class Report:
    """What a suite measured: table rows for people, figures (ratios and absolutes) for the JSON line."""

    suite: str
    columns: Sequence[str]
    rows: list[Sequence[Any]]
    figures: dict[str, Any]
    notes: list[str] = dataclasses.field(default_factory=list)


def _cpuinfo_fields(cpuinfo: str) -> dict[str, str]:
    """The first processor's `key: value` lines of /proc/cpuinfo (they hold for every processor); {} where the file
    cannot be read (not Linux)."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo) as lines:
            for line in lines:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return {}
    return fields


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU as the kernel names it, with its vendor, family and model numbers and whether it has AVX-512, e.g.
    "Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 167, avx512f)": XLA:CPU and torch rank differently on
    different CPUs, so every CPU figure needs it beside it."""
    fields = _cpuinfo_fields(cpuinfo)
    if not fields:
        return platform.processor() or platform.machine()
    avx512 = ", avx512f" if "avx512f" in fields.get("flags", "").split() else ""
    return (f"{fields.get('model name', platform.machine())} ({fields.get('vendor_id', '?')} family "
            f"{fields.get('cpu family', '?')} model {fields.get('model', '?')}{avx512})")


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        # What the entry points (and the e2e suite's training subprocess) do with freed memory: conductor/host_memory.py.
        "host_memory_retained": host_memory.requested(),
    }
    try:
        import jax

        info["jax_backend"] = jax.default_backend()
        info["jax_devices"] = [str(d) for d in jax.devices()]
    except ImportError:
        pass
    return info


def timed(fn: Callable[[], Any], *, repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of `repeats` calls of `fn` after `warmup` untimed calls. `fn` must block until done."""
    for _ in range(warmup):
        fn()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return seconds


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(str(c)), *(len(r[i]) for r in cells)) if cells else len(str(c)) for i, c in enumerate(columns)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells)
    return "\n".join(lines)


def emit(report: Report) -> None:
    print(f"== benchmark suite: {report.suite} ==")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores")
    print(format_table(report.columns, report.rows))
    for note in report.notes:
        print(note)
    print(json.dumps({"suite": report.suite, **report.figures, "machine": machine()}, sort_keys=True))

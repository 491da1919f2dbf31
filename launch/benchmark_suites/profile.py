"""Where a jitted step spends its device time: `jax.profiler` traces reduced to a table of kernels.

`kernel_table` reads the trace `jax.profiler.trace(directory)` wrote and sums the device time of each kernel (a
GPU's CUDA kernels, or on a CPU backend the XLA ops that XLA:CPU's runtime ran), grouped by name and by kind, so a
suite can print what dominates a step without TensorBoard.
"""

from __future__ import annotations

import collections
import pathlib
import re
from typing import Any, Callable, Iterable

import jax

# Kernel names by kind. cuBLAS/cuBLASLt and CUTLASS kernels are matmuls (nvjet is cuBLASLt's Hopper family; XLA's own
# Triton GEMMs carry "gemm" or "triton_gemm"); cuDNN's fused attention shows as "cudnn" or "fmha"/"flash"; copies and
# fills are the runtime's; everything else is an XLA fusion or a reduction.
KINDS = (
    # First: cuDNN's attention kernels carry matmul words too ("..._flash_bprop_wgmma_...").
    ("attention", re.compile(r"cudnn|fmha|flash|attention", re.IGNORECASE)),
    ("matmul", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|wgmma|sm\d+_.*(tensorop|mma)|dot", re.IGNORECASE)),
    ("copy", re.compile(r"memcpy|memset|copy", re.IGNORECASE)),
)


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "fusion or other"


def trace_file(directory: str | pathlib.Path) -> pathlib.Path:
    """The newest `*.xplane.pb` under `directory` (the profiler nests it in plugins/profile/<date>/)."""
    traces = sorted(pathlib.Path(directory).rglob("*.xplane.pb"), key=lambda path: path.stat().st_mtime)
    if not traces:
        raise FileNotFoundError(f"no *.xplane.pb under {directory}: was jax.profiler.trace given this directory?")
    return traces[-1]


def _device_events(profile: Any) -> Iterable[tuple[str, float, str]]:
    """(name, seconds, the XLA op that launched it or "") of each kernel on an accelerator's planes; on a CPU backend, of each event that carries an
    `hlo_op` (the ops XLA:CPU ran), since a CPU trace has no device plane."""
    device_planes = [plane for plane in profile.planes if plane.name.startswith("/device:")]
    if device_planes:
        for plane in device_planes:
            for line in plane.lines:
                # Derived lines ("XLA Modules", "XLA Ops", "Steps") repeat the kernels' time under other names.
                if line.name.startswith(("XLA", "Steps", "Framework", "Source")):
                    continue
                for event in line.events:
                    yield event.name, event.duration_ns * 1e-9, str(dict(event.stats).get("hlo_op", ""))
        return
    for plane in profile.planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" in stats:
                    yield str(stats["hlo_op"]), event.duration_ns * 1e-9, str(stats["hlo_op"])


def kernel_table(directory: str | pathlib.Path, *, top: int = 20) -> dict[str, Any]:
    """Device seconds per kernel kind and the `top` kernels by total time, with their share of all kernel time and
    the XLA op that launched each (its first launch's, where the trace names one)."""
    profile = jax.profiler.ProfileData.from_file(str(trace_file(directory)))
    seconds_by_name: dict[str, float] = collections.defaultdict(float)
    calls_by_name: dict[str, int] = collections.Counter()
    op_by_name: dict[str, str] = {}
    for name, seconds, op in _device_events(profile):
        seconds_by_name[name] += seconds
        calls_by_name[name] += 1
        op_by_name.setdefault(name, op)
    total = sum(seconds_by_name.values())
    if not total:
        raise ValueError(f"the trace under {directory} holds no kernel time")
    by_kind: dict[str, float] = collections.defaultdict(float)
    for name, seconds in seconds_by_name.items():
        by_kind[kind_of(name)] += seconds
    ranked = sorted(seconds_by_name.items(), key=lambda item: -item[1])[:top]
    return {
        "kernel_seconds": total,
        "kernels": len(seconds_by_name),
        "launches": sum(calls_by_name.values()),
        "by_kind": {kind: {"seconds": seconds, "share": seconds / total}
                    for kind, seconds in sorted(by_kind.items(), key=lambda item: -item[1])},  # fmt: skip
        "top": [{"name": name[:160], "xla_op": op_by_name[name][:160], "kind": kind_of(name), "calls": calls_by_name[name], "seconds": seconds,
                 "share": seconds / total} for name, seconds in ranked],  # fmt: skip
    }


def profile_calls(step: Callable[[], Any], directory: str | pathlib.Path, *, calls: int = 1,
                  top: int = 20) -> dict[str, Any]:  # fmt: skip
    """Runs `step` (which must block until its work is done) `calls` times under `jax.profiler.trace(directory)`
    and returns `kernel_table` of that trace, with seconds per call."""
    with jax.profiler.trace(str(directory)):
        for _ in range(calls):
            step()
    table = kernel_table(directory, top=top)
    table["calls_traced"] = calls
    table["kernel_seconds_per_call"] = table["kernel_seconds"] / calls
    return table

"""How many XLA programs this process has built, counted from JAX's own compile event.

JAX records `BACKEND_COMPILE_EVENT` (`jax.monitoring`) once for every program it hands to XLA: a `jax.jit` function at
a new shape, dtype or static argument, and each eager operation at a new shape. A program loaded from the persistent
compilation cache is timed under the same event (the cache is read inside it), so `programs` counts programs built
whichever way, and `cache_hits` how many of them came from the cache. The counts are for the whole process, every
thread; `rl.loop.TrainingLoop` logs their growth over each iteration as `compile/programs`, so a run that keeps
compiling after its first iterations (a new prompt or completion length, a new row count) shows it.
"""

from __future__ import annotations

import dataclasses
import threading

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


@dataclasses.dataclass(frozen=True)
class Compiles:
    """Programs built, those of them loaded from the persistent cache, and the seconds spent building them."""

    programs: int = 0
    cache_hits: int = 0
    seconds: float = 0.0

    def __sub__(self, other: "Compiles") -> "Compiles":
        return Compiles(self.programs - other.programs, self.cache_hits - other.cache_hits, self.seconds - other.seconds)


_lock = threading.Lock()
_totals = Compiles()
_installed = False


def _on_duration(event: str, seconds: float, **_) -> None:
    global _totals
    if event == BACKEND_COMPILE_EVENT:
        with _lock:
            _totals = dataclasses.replace(_totals, programs=_totals.programs + 1, seconds=_totals.seconds + seconds)


def _on_event(event: str, **_) -> None:
    global _totals
    if event == CACHE_HIT_EVENT:
        with _lock:
            _totals = dataclasses.replace(_totals, cache_hits=_totals.cache_hits + 1)


def totals() -> Compiles:
    """What this process has compiled since the first call (which starts the count: one listener per process)."""
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            jax.monitoring.register_event_listener(_on_event)
            _installed = True
        return _totals

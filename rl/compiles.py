"""How many XLA programs this process has built, counted from JAX's own compile event; JAX's persistent cache.

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


@dataclasses.dataclass(frozen=True)
class PersistentCacheConfig:
    """JAX's persistent compilation cache: programs a run compiles are written to `directory`, and a later run (or
    another process of this one) loads them instead of compiling them again.

    directory: where the entries go; "" turns the cache off.
    max_bytes: past it, the least recently used entries are deleted. A size limit is also what makes JAX take a file
      lock around each read and write, so that processes sharing the directory never read a half-written entry.
    """

    directory: str
    max_bytes: int = 4 << 30

    def __post_init__(self):
        if self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {self.max_bytes}")


def use_persistent_cache(config: PersistentCacheConfig) -> str | None:
    """Turns the persistent cache on for this process, before its first compile; returns the directory it uses.

    The user's own settings win: with `JAX_ENABLE_COMPILATION_CACHE=false` the cache stays off (None), and with
    `JAX_COMPILATION_CACHE_DIR` (or `jax_compilation_cache_dir`) set that directory is used. JAX's threshold stays
    as it is: only programs that took `jax_persistent_cache_min_compile_time_secs` (1 s) or more to compile are
    written.
    """
    if not config.directory or not jax.config.jax_enable_compilation_cache:
        return None
    directory = jax.config.jax_compilation_cache_dir or config.directory  # JAX read JAX_COMPILATION_CACHE_DIR
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_compilation_cache_max_size", config.max_bytes)
    return directory

"""JAX's persistent compilation cache for the entry points that compile (`rl.compiles.use_persistent_cache`)."""

from __future__ import annotations

from absl import flags

from models.zoo import cache_root
from rl.compiles import PersistentCacheConfig

_DIRECTORY = flags.DEFINE_string(
    "compilation_cache_dir", None,
    "JAX's persistent compilation cache: a later run loads the programs an earlier one compiled (default "
    "$XDG_CACHE_HOME/conductor-rl/jax, ~/.cache/conductor-rl/jax; '' turns it off). JAX_COMPILATION_CACHE_DIR, "
    "when set, is used instead; JAX_ENABLE_COMPILATION_CACHE=false turns it off.",
)
_MAX_GB = flags.DEFINE_float(
    "compilation_cache_max_gb", 4.0, "Size past which the cache deletes its least recently used programs (GiB).",
    lower_bound=0.001,
)


def from_flags() -> PersistentCacheConfig:
    directory = str(cache_root() / "jax") if _DIRECTORY.value is None else _DIRECTORY.value
    return PersistentCacheConfig(directory, max_bytes=int(_MAX_GB.value * (1 << 30)))

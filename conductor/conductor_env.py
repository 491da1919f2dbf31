"""The `ConductorEnv` a launcher runs: `EnvSpec` says what to build, `build_env` builds it."""

from __future__ import annotations

import dataclasses
import functools
import logging
from env.gym_env import ConductorEnv, EnvConfig
from env.workers.cache import ResponseCache
from env.worlds import WorldConfig, build_world

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """The world's config (one of `env.worlds`' configs), the env's (its reward included) and the SQLite response
    cache the workers' replies go through (None: no cache)."""

    world: WorldConfig
    config: EnvConfig = EnvConfig()
    cache_path: str | None = None


def build_env(spec: EnvSpec) -> ConductorEnv:
    world = build_world(spec.world, spec.config.reward, spec.config.max_steps)
    cache = ResponseCache(spec.cache_path) if spec.cache_path else None
    env = ConductorEnv(world, spec.config, cache)
    if env.sandbox_layer is not None:
        _log_sandbox_layer(env.sandbox_layer)
    return env


@functools.cache
def _log_sandbox_layer(layer: str) -> None:
    if layer == "none":
        log.warning(
            "--allow_unsandboxed_code: code tasks run generated programs WITHOUT a kernel sandbox (no bubblewrap, no "
            "user namespaces here); only resource limits and an audit hook stand between them and this machine"
        )
    else:
        log.info("code tasks run generated programs in the %s sandbox", layer)

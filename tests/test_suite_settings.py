"""The settings tests/conftest.py gives every process of a test run."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
from jax._src import compilation_cache


def test_no_process_of_the_run_uses_a_persistent_compilation_cache():
    """The cache's native serialisation and deserialisation are where the suite's workers segfaulted (conftest's
    `_compile_without_a_persistent_cache`): neither this process nor a subprocess it starts may reach them."""
    assert not jax.config.jax_enable_compilation_cache
    assert not compilation_cache.is_cache_used(jax.devices()[0].client)
    child = subprocess.run(
        [sys.executable, "-c", "import jax; from jax._src import compilation_cache as c; "
                               "print(jax.config.jax_enable_compilation_cache, c.is_cache_used(jax.devices()[0].client))"],
        capture_output=True, text=True, timeout=120, env=os.environ | {"JAX_COMPILATION_CACHE_DIR": "/tmp/a-users-cache"},
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["False", "False"]

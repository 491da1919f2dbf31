"""The default learner builds nothing at run time: a Conductor made from the default flags runs a forward and a
backward pass without starting a compiler or any other process, without opening a library through ctypes, and with
every shared object it maps installed beforehand (docs/decisions/031-mkl-matmul-on-intel-cpus.md: no C++ compiled on
first use, no private symbols read from another package's library)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter, so every library the default path maps is counted from an empty process. Records the
# argv of every process started, every library opened through ctypes once the imports are done (building the model
# and its first call are where a kernel would be compiled and loaded), then the mapped shared objects.
_DEFAULT_PATH = textwrap.dedent("""
    import ctypes, json, pathlib, subprocess, sys

    started, opened = [], []
    popen_init, cdll_init = subprocess.Popen.__init__, ctypes.CDLL.__init__

    def record_popen(self, args, *rest, **options):
        started.append(args if isinstance(args, str) else [str(arg) for arg in args])
        popen_init(self, args, *rest, **options)

    def record_cdll(self, name, *rest, **options):
        opened.append(str(name))
        cdll_init(self, name, *rest, **options)

    subprocess.Popen.__init__, ctypes.CDLL.__init__ = record_popen, record_cdll

    import jax, jax.numpy as jnp, torch, transformers  # the Conductor's tokenizer and its writer import both
    from absl import flags
    from flax import nnx
    from launch.flag_groups import conductor
    from conductor.model import load_conductor

    imported = len(opened)  # what the imports open (torch loads its own dependencies through ctypes)
    flags.FLAGS(["default"])
    model, _, _ = load_conductor(conductor.from_flags(), pathlib.Path(sys.argv[1]))
    graphdef, params = nnx.split(model)
    tokens = jnp.arange(2 * 16, dtype=jnp.int32).reshape(2, 16)
    positions = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), tokens.shape)

    def loss(params):
        decoder = nnx.merge(graphdef, params)
        return decoder.logits(decoder(tokens, positions, jnp.ones(tokens.shape, jnp.bool_))).mean()

    assert jax.device_count() == 1
    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    assert bool(jnp.isfinite(value)) and all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))
    maps = pathlib.Path("/proc/self/maps").read_text()
    print(json.dumps({"started": started, "opened_after_imports": opened[imported:], "maps": maps,
                      "installed": sorted({sys.prefix, sys.base_prefix, sys.exec_prefix})}))
""")

# Where a library that was installed, not built by the process, lives: the interpreter's prefixes and the system's.
_SYSTEM_LIBRARY_DIRS = ("/usr/", "/lib/", "/lib64/", "/lib32/", "/opt/")


def mapped_shared_objects(maps: str) -> set[str]:
    """The files `/proc/<pid>/maps` text maps that are shared objects (`.so` or `.so.N`)."""
    paths = set()
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        path = fields[5].removesuffix(" (deleted)") if len(fields) == 6 else ""
        if path.endswith(".so") or ".so." in path:
            paths.add(path)
    return paths


def built_at_run_time(libraries: set[str], installed: list[str]) -> list[str]:
    """The libraries outside the interpreter's install prefixes and the system's library directories."""
    roots = tuple(os.path.join(os.path.realpath(prefix), "") for prefix in installed) + _SYSTEM_LIBRARY_DIRS
    return sorted(path for path in libraries if not os.path.realpath(path).startswith(roots))


def test_the_default_forward_and_backward_build_and_load_no_kernel_of_their_own(tmp_path):
    # A user's process: one CPU device, not the eight host devices tests/conftest.py asks XLA for (LLVM's passes off
    # only to compile faster).
    environment = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0"}
    result = subprocess.run([sys.executable, "-c", _DEFAULT_PATH, str(tmp_path)], cwd=REPO, env=environment,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["started"] == []
    assert record["opened_after_imports"] == []
    libraries = mapped_shared_objects(record["maps"])
    assert any("xla_extension" in path or "jaxlib" in path for path in libraries)  # the maps were read
    assert built_at_run_time(libraries, record["installed"]) == []


def test_a_library_built_into_a_cache_is_told_apart_from_installed_ones():
    maps = "\n".join([
        "7f0000000000-7f0000001000 r-xp 00000000 08:01 1 /venv/lib/python3.12/site-packages/jaxlib/_jax.so",
        "7f0000001000-7f0000002000 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.33",
        "7f0000002000-7f0000003000 r-xp 00000000 08:01 3 /home/u/.cache/conductor-rl/kernels/mkl_matmul-4f75.so",
        "7f0000003000-7f0000004000 r-xp 00000000 08:01 4 /tmp/build/kernel.so (deleted)",
        "7f0000004000-7f0000005000 rw-p 00000000 00:00 0 [heap]",
        "7f0000005000-7f0000006000 r--p 00000000 08:01 5 /venv/lib/python3.12/site-packages/numpy/core/x.py",
    ])
    libraries = mapped_shared_objects(maps)
    assert libraries == {"/venv/lib/python3.12/site-packages/jaxlib/_jax.so",
                         "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.33",
                         "/home/u/.cache/conductor-rl/kernels/mkl_matmul-4f75.so", "/tmp/build/kernel.so"}
    assert built_at_run_time(libraries, ["/venv"]) == ["/home/u/.cache/conductor-rl/kernels/mkl_matmul-4f75.so",
                                                       "/tmp/build/kernel.so"]

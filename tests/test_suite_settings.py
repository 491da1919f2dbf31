"""The settings tests/conftest.py gives every process of a test run."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
from jax._src import compilation_cache

from models.zoo import cache_root
from tests.conftest import CHEAP_CODEGEN, SUBPROCESS_CACHE, with_default_codegen

CACHE_SETTINGS = ("import jax; from jax._src import compilation_cache as c; "
                  "print(jax.config.jax_enable_compilation_cache, c.is_cache_used(jax.devices()[0].client), "
                  "jax.config.jax_compilation_cache_dir, jax.config.jax_compilation_cache_max_size)")


def test_the_test_processes_compile_without_a_persistent_cache():
    """The workers compile thousands of programs each and once died inside the cache's native calls at the map limit
    (conftest's `_compile_in_process_without_a_persistent_cache`)."""
    assert not jax.config.jax_enable_compilation_cache
    assert not compilation_cache.is_cache_used(jax.devices()[0].client)


def test_the_runs_a_test_starts_share_one_locked_cache_of_this_run_and_not_the_users():
    directory = os.environ[SUBPROCESS_CACHE]
    assert pathlib.Path(directory).is_dir() and not pathlib.Path(directory).is_relative_to(cache_root())
    child = subprocess.run([sys.executable, "-c", CACHE_SETTINGS], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    enabled, used, child_directory, max_size = child.stdout.split()
    assert (enabled, used, child_directory) == ("True", "True", directory)
    assert int(max_size) > 0, "unbounded, JAX's LRUCache reads and writes without its file lock"


def test_the_runs_a_test_starts_compile_with_the_cheap_codegen():
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['XLA_FLAGS'])"], capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    flags = child.stdout.split()
    assert set(CHEAP_CODEGEN) <= set(flags), flags
    # A longer run a test starts as a user does keeps every other flag and compiles with XLA's default.
    default = with_default_codegen({"XLA_FLAGS": " ".join(flags), "PATH": "/bin"})
    assert default == {"XLA_FLAGS": " ".join(f for f in flags if f not in CHEAP_CODEGEN), "PATH": "/bin"}


def test_a_test_run_deletes_the_cache_it_created_and_keeps_one_it_was_given(tmp_path):
    """A pytest run of its own with this suite's settings: given a directory (as an xdist worker is), it uses and
    keeps it; given none, it creates one and deletes it at its end."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(f"import os\ndef test_probe():\n    print('CACHE=' + os.environ[{SUBPROCESS_CACHE!r}])\n")
    repo = pathlib.Path(__file__).resolve().parents[1]

    def run(environment):
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-c", str(repo / "pyproject.toml"), "--rootdir", str(tmp_path),
             "-p", "tests.conftest", "-n", "0", "-s", str(probe)],
            cwd=repo, env=environment, capture_output=True, text=True, timeout=300,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return next(line.split("CACHE=")[1].split()[0] for line in result.stdout.splitlines() if "CACHE=" in line)

    given = tmp_path / "given"
    given.mkdir()
    assert run(os.environ | {SUBPROCESS_CACHE: str(given)}) == str(given) and given.is_dir()
    created = run({k: v for k, v in os.environ.items() if k != SUBPROCESS_CACHE})
    assert created != str(given) and not pathlib.Path(created).exists()

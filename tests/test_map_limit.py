"""Issue 61's crash and its fix: a process at the kernel's memory-map limit dies in XLA's compile; the test plugin
`tests/map_limit.py` frees JAX's compiled programs before a test process gets there."""

from __future__ import annotations

import math
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.map_limit import max_map_count

REPO = pathlib.Path(__file__).resolve().parents[1]
LIMIT = max_map_count()

# Fills this process's map table to `headroom` maps below the limit, then compiles and runs a new program. JAX has
# compiled one program first, as in a test worker, so its imports are done and the compile is what needs new maps. Every other
# page of one anonymous region is made read-only: a page whose protection differs from its neighbours' is a map of
# its own, so each mprotect adds two.
FILL_THEN_COMPILE = textwrap.dedent("""
    import ctypes, mmap, sys
    import jax, jax.numpy as jnp
    jax.jit(lambda x: x + 1.0)(jnp.ones(2)).block_until_ready()  # JAX's lazy imports and lowering set up
    headroom = int(sys.argv[1])
    def maps():
        return open("/proc/self/maps", "rb").read().count(b"\\n")
    limit = int(open("/proc/sys/vm/max_map_count").read())
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    pages = 2 * (limit - maps()) + 4
    base = libc.mmap(None, pages * mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    count = maps()
    for page in range(1, pages, 2):
        if headroom and count + 2 > limit - headroom:
            break
        if libc.mprotect(ctypes.c_void_p(base + page * mmap.PAGESIZE), mmap.PAGESIZE, mmap.PROT_READ) != 0:
            break  # ENOMEM: the table is full
        count += 2
    # `count`, not a fresh read: reading the table allocates a buffer that needs a map of its own.
    print("maps before the compile:", count, "of", limit, flush=True)
    program = jax.jit(lambda x: jnp.tanh(x) @ x.T + 1.0)
    print("result", float(program(jnp.ones((64, 64))).sum()), flush=True)
""")


def _fill_then_compile(headroom: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", FILL_THEN_COMPILE, str(headroom)], capture_output=True, text=True, timeout=300,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.skipif(LIMIT is None or LIMIT > 1_000_000, reason="needs Linux's map limit, small enough to fill")
def test_xla_compile_kills_a_process_at_the_map_limit_and_compiles_with_room_to_spare():
    full = _fill_then_compile(headroom=0)
    assert full.returncode in (-signal.SIGABRT, -signal.SIGSEGV), (full.returncode, full.stdout, full.stderr[-2000:])
    assert f"of {LIMIT}" in full.stdout and "result" not in full.stdout
    # XLA's JIT cannot map the new program's code (then a segfault), or a thread's stack (then a failed check).
    assert "LLVM compilation error: Cannot allocate memory" in full.stderr or "pthread_create() failed" in full.stderr
    roomy = _fill_then_compile(headroom=5000)
    assert roomy.returncode == 0, roomy.stderr[-2000:]
    result = float(roomy.stdout.split("result ")[1])
    assert result == pytest.approx(64 * 64 * (64 * math.tanh(1.0) + 1.0), rel=1e-5)  # 64 x 64 entries
    before = int(roomy.stdout.split("maps before the compile: ")[1].split()[0])
    assert LIMIT - 5000 - 2000 <= before <= LIMIT - 5000


TWO_TESTS = textwrap.dedent("""
    import jax, jax.numpy as jnp

    program = jax.jit(lambda x: x * 2.0)

    def test_compiles():
        assert float(program(jnp.ones(3)).sum()) == 6.0
        assert program._cache_size() == 1

    def test_finds_the_program_cached():
        print("cached programs:", program._cache_size())
""")


def _run_two_tests(directory: pathlib.Path, share: str) -> str:
    (directory / "pytest.ini").write_text("[pytest]\n")
    (directory / "test_two.py").write_text(TWO_TESTS)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(directory / "pytest.ini"), "--rootdir", str(directory),
         "-p", "tests.map_limit", "-o", f"map_limit_share={share}", "-s", "-q", str(directory / "test_two.py")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


@pytest.mark.skipif(LIMIT is None, reason="needs Linux's /proc/sys/vm/max_map_count")
def test_the_plugin_frees_compiled_programs_once_a_process_passes_its_share_of_the_limit(tmp_path):
    kept = _run_two_tests(tmp_path, share="1")
    assert "cached programs: 1" in kept
    assert "JAX's caches cleared 0 times" in kept
    freed = _run_two_tests(tmp_path, share="0")
    assert "cached programs: 0" in freed
    assert "JAX's caches cleared 2 times" in freed
    peak = int(freed.split("map_limit: peak ")[1].split()[0])
    assert 100 < peak < LIMIT

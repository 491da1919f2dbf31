"""launch.host_memory: freed blocks stay in the process, so allocating them again costs no page faults."""

import os
import platform
import subprocess
import sys

import pytest

from launch import host_memory

# A fresh process (the arena limit binds only threads that have not allocated yet) frees a 256 MiB block, allocates
# it again and touches every page; it prints the minor page faults of that second round.
_FAULTS_OF_A_REUSED_BLOCK = """
import ctypes, resource
from launch.host_memory import retain_freed_memory
print(retain_freed_memory())
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 256 << 20
def touch_and_free():
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
touch_and_free()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
touch_and_free()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _reused_block_faults(opt_out: bool) -> tuple[str, int]:
    env = dict(os.environ)
    env.pop(host_memory.OPT_OUT_VARIABLE, None)
    env.pop("GLIBC_TUNABLES", None)
    if opt_out:
        env[host_memory.OPT_OUT_VARIABLE] = "0"
    result = subprocess.run([sys.executable, "-c", _FAULTS_OF_A_REUSED_BLOCK], env=env, capture_output=True,
                            text=True, check=True)  # fmt: skip
    applied, faults = result.stdout.split()
    return applied, int(faults)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_a_freed_block_is_reused_without_page_faults_and_the_opt_out_restores_glibc_defaults():
    pages = (256 << 20) // os.sysconf("SC_PAGE_SIZE")
    applied, retained_faults = _reused_block_faults(opt_out=False)
    assert applied == "True"
    assert retained_faults < pages // 100
    applied, default_faults = _reused_block_faults(opt_out=True)
    assert applied == "False"
    # glibc's default maps a block this large afresh, so every page faults again (huge pages would fault fewer).
    assert default_faults > pages // 600


def test_the_opt_out_variable_leaves_malloc_alone(monkeypatch):
    monkeypatch.setenv(host_memory.OPT_OUT_VARIABLE, "0")
    assert host_memory.retain_freed_memory() is False

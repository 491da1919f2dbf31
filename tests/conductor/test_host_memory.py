"""conductor.host_memory: freed blocks stay in the process, so allocating them again costs no page faults."""

import json
import os
import platform
import subprocess
import sys

import pytest

from conductor import host_memory

# A fresh process (the arena limit binds only threads that have not allocated yet, glibc reads its tunables only at
# start) frees a block, allocates it again and touches every page. It prints what `retain_freed_memory` returned,
# the tunables variables left in its environment, and the minor page faults of the second round.
_FAULTS_OF_A_REUSED_BLOCK = """
import ctypes, json, os, resource, sys
from conductor.host_memory import RESTARTED_VARIABLE, retain_freed_memory
applied = retain_freed_memory(restart=sys.argv[1] == "restart")
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = int(sys.argv[2])
def touch_and_free():
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
touch_and_free()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
touch_and_free()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"applied": applied, "faults": faults, "tunables": os.environ.get("GLIBC_TUNABLES"),
                  "restarted": os.environ.get(RESTARTED_VARIABLE)}))
"""

SMALL_BLOCK = 256 << 20
LARGE_BLOCK = (2 << 30) + (256 << 20)  # over the 2 GiB that mallopt can keep

glibc_only = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")


def _environment_without_settings() -> dict[str, str]:
    """This environment without the variables `conductor.host_memory` reads, as a user's shell would start a program."""
    settings = (host_memory.SETTING_VARIABLE, host_memory.RESTARTED_VARIABLE, "GLIBC_TUNABLES")
    return {name: value for name, value in os.environ.items() if name not in settings}


def _reused_block(size: int, *, restart: bool = False, opt_out: bool = False, tunables: str | None = None) -> dict:
    env = _environment_without_settings()
    if opt_out:
        env[host_memory.SETTING_VARIABLE] = "0"
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    mode = "restart" if restart else "in-process"
    result = subprocess.run([sys.executable, "-c", _FAULTS_OF_A_REUSED_BLOCK, mode, str(size)], env=env,
                            capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(result.stdout)


def _pages(size: int) -> int:
    return size // os.sysconf("SC_PAGE_SIZE")


@glibc_only
def test_a_freed_block_is_reused_without_page_faults_and_the_opt_out_restores_glibc_defaults():
    retained = _reused_block(SMALL_BLOCK)
    assert retained["applied"] is True
    assert retained["faults"] < _pages(SMALL_BLOCK) // 100
    default = _reused_block(SMALL_BLOCK, opt_out=True)
    assert default["applied"] is False
    # glibc's default maps a block this large afresh, so every page faults again (huge pages would fault fewer).
    assert default["faults"] > _pages(SMALL_BLOCK) // 600


@glibc_only
def test_an_entry_point_restarts_with_glibc_tunables_so_blocks_over_2_gib_are_reused_too():
    in_process = _reused_block(LARGE_BLOCK)
    assert in_process["applied"] is True
    assert in_process["faults"] > _pages(LARGE_BLOCK) // 600  # mallopt's int threshold cannot cover it
    restarted = _reused_block(LARGE_BLOCK, restart=True)
    assert restarted["applied"] is True
    assert restarted["faults"] < _pages(LARGE_BLOCK) // 100
    # The restarted process clears both variables, so the programs it starts begin with glibc's defaults.
    assert restarted["tunables"] is None and restarted["restarted"] is None


@glibc_only
def test_a_users_own_glibc_tunables_are_kept_and_the_opt_out_never_restarts():
    own = "glibc.malloc.arena_max=2"
    kept = _reused_block(SMALL_BLOCK, restart=True, tunables=own)
    assert kept["applied"] is True  # mallopt in the running process
    assert kept["tunables"] == own and kept["restarted"] is None
    opted_out = _reused_block(LARGE_BLOCK, restart=True, opt_out=True)
    assert opted_out["applied"] is False and opted_out["tunables"] is None
    assert opted_out["faults"] > _pages(LARGE_BLOCK) // 600


# A restarted entry point starts the block-reusing program above once inside `tunables_for_children()` and once after.
_PARENT_OF_TWO_CHILDREN = """
import json, subprocess, sys
from conductor import host_memory
host_memory.retain_freed_memory(restart=True)
def child():
    command = [sys.executable, "-c", sys.argv[1], "in-process", sys.argv[2]]
    return json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
with host_memory.tunables_for_children():
    inside = child()
print(json.dumps({"inside": inside, "after": child()}))
"""


@glibc_only
def test_a_child_started_inside_tunables_for_children_reuses_blocks_over_2_gib_as_its_parent_does():
    result = subprocess.run([sys.executable, "-c", _PARENT_OF_TWO_CHILDREN, _FAULTS_OF_A_REUSED_BLOCK, str(LARGE_BLOCK)],
                            env=_environment_without_settings(), capture_output=True, text=True, check=True)  # fmt: skip
    children = json.loads(result.stdout)
    inside, after = children["inside"], children["after"]
    assert inside["applied"] is True and inside["faults"] < _pages(LARGE_BLOCK) // 100
    assert inside["tunables"] is None and inside["restarted"] is None  # taken up and cleared, as a restart does
    assert after["applied"] is True and after["faults"] > _pages(LARGE_BLOCK) // 600  # mallopt only


def test_the_opt_out_variable_leaves_malloc_alone(monkeypatch):
    monkeypatch.setenv(host_memory.SETTING_VARIABLE, "0")
    assert host_memory.retain_freed_memory() is False
    assert host_memory.retain_freed_memory(restart=True) is False


@pytest.mark.parametrize(
    ("setting", "jax_platforms", "device_node", "expected"),
    [
        (None, None, False, True),
        (None, None, True, False),
        (None, "cpu", True, True),
        (None, "cuda", False, False),
        (None, "tpu,cpu", False, False),
        ("1", None, True, True),
        ("0", "cpu", False, False),
    ],
)
def test_freed_memory_is_retained_only_where_jax_computes_on_the_cpu_unless_the_user_says(
    monkeypatch, tmp_path, setting, jax_platforms, device_node, expected
):
    for name, value in ((host_memory.SETTING_VARIABLE, setting), ("JAX_PLATFORMS", jax_platforms)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    (tmp_path / "other").touch()
    if device_node:
        (tmp_path / "nvidia0").touch()
    monkeypatch.setattr(host_memory, "ACCELERATOR_DEVICE_PATTERNS", (str(tmp_path / "nvidia[0-9]*"),))
    assert host_memory.requested() is expected

"""Runs untrusted Python (generated code under test) in a separate, limited process.

Layers, from the strongest:
- a fresh network namespace (`unshare --net`) when the machine allows it: no interface but a down loopback, so
  no connection can leave; probed once per process (`network_isolation()` says which layer is active);
- when started as root, the child drops to a fresh unprivileged uid: it cannot read other users' files or
  `/proc/<pid>/environ`, signal our processes or write where the uid has no permission, and RLIMIT_NPROC
  (ignored for root) bounds its processes. Where the interpreter lives under a directory only root may enter
  (here /root/.pyenv), that uid can import only what was loaded before the switch
  (`sandbox_entry.PRELOAD_MODULES`, the standard library contest and test code uses; no numpy);
- kernel resource limits: CPU seconds, address space, process count, file size (which also bounds output,
  since stdout and stderr are files), open files; plus a wall-clock timeout enforced from here;
- a temporary working directory (also HOME and TMPDIR) and an environment with nothing but PATH and locale;
- an audit hook (sandbox_entry.py) refusing sockets, subprocesses, native libraries and writes outside the
  working directory. Where `unshare` is not permitted this hook is what blocks the network; Python audit hooks
  are not a security boundary against native code, which is why the kernel layers come first.
Afterwards the whole process group and every process of the sandbox uid are killed and the directory removed.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Mapping, Sequence

_ENTRY = Path(__file__).with_name("sandbox_entry.py")
_PROGRAM = "main.py"
# Sandbox uids: a block per parent process so concurrent graders (e.g. pytest-xdist workers) never share one.
_UID_BASE = 200_000 + (os.getpid() % 4096) * 1024
_uid_counter = itertools.count()
_uid_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    cpu_s: int = 10
    wall_s: float = 20.0
    memory_mb: int = 1024
    max_processes: int = 16
    max_file_mb: int = 16
    max_output_chars: int = 1_000_000

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"SandboxLimits.{field.name} must be a positive number, got {value!r}")
        if not isinstance(self.cpu_s, int):
            raise ValueError(f"SandboxLimits.cpu_s must be an int number of seconds, got {self.cpu_s!r}")


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@functools.lru_cache(maxsize=1)
def network_isolation() -> str:
    """"namespace" when `unshare --net` works here, else "audit-hook" (sockets refused inside Python only)."""
    if shutil.which("unshare") is None:
        return "audit-hook"
    try:
        probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "audit-hook"
    return "namespace" if probe.returncode == 0 else "audit-hook"


def run_python(
    source: str,
    *,
    stdin: str = "",
    files: Mapping[str, str] | None = None,
    argv: Sequence[str] = (),
    limits: SandboxLimits = SandboxLimits(),
) -> SandboxResult:
    """Runs `source` as `__main__` in a fresh sandbox with `files` (relative name -> text) in its working
    directory. Thread-safe; never raises for anything the program does."""
    for name in files or {}:
        if os.path.isabs(name) or ".." in Path(name).parts or name == _PROGRAM:
            raise ValueError(f"sandbox file name {name!r} must be a plain relative path other than {_PROGRAM}")
    uid = _next_uid() if os.getuid() == 0 else None
    workdir = Path(tempfile.mkdtemp(prefix="sandbox-"))
    private = Path(tempfile.mkdtemp(prefix="sandbox-io-"))
    try:
        _write(workdir / _PROGRAM, source)
        for name, text in (files or {}).items():
            _write(workdir / name, text)
        if uid is not None:
            for path in (workdir, *workdir.rglob("*")):
                os.chown(path, uid, uid)
        _write(private / "stdin", stdin)
        config = {
            "workdir": str(workdir),
            "uid": uid,
            "program": str(workdir / _PROGRAM),
            "argv": list(argv),
            "limits": dataclasses.asdict(limits),
        }
        command = [sys.executable, "-I", "-B", str(_ENTRY), json.dumps(config)]
        if network_isolation() == "namespace":
            command = ["unshare", "--net", "--", *command]
        return _run(command, workdir, private, uid, limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def _run(command: list[str], workdir: Path, private: Path, uid: int | None, limits: SandboxLimits) -> SandboxResult:
    environment = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    with open(private / "stdin", "rb") as stdin, open(private / "stdout", "wb") as stdout, open(
        private / "stderr", "wb"
    ) as stderr:
        process = subprocess.Popen(
            command,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cwd=workdir,
            env=environment,
            start_new_session=True,
            close_fds=True,
        )
        try:
            returncode: int | None = process.wait(timeout=limits.wall_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            returncode, timed_out = None, True
        finally:
            _kill_everything(process, uid)
    return SandboxResult(
        returncode=returncode,
        stdout=_read(private / "stdout", limits.max_output_chars),
        stderr=_read(private / "stderr", limits.max_output_chars),
        timed_out=timed_out,
    )


def _kill_everything(process: subprocess.Popen, uid: int | None) -> None:
    """Kills the session's process group and, with a sandbox uid, every process left under that uid (children
    that started their own session), until none is left."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
    if uid is None:
        return
    for _ in range(100):
        survivors = _processes_of(uid)
        if not survivors:
            return
        for pid in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _processes_of(uid: int) -> list[int]:
    """Live processes of `uid` (zombies are dead already and wait for their reaper)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state != b"Z":
            pids.append(int(entry.name))
    return pids


def _next_uid() -> int:
    with _uid_lock:
        return _UID_BASE + next(_uid_counter) % 1024


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _read(path: Path, max_chars: int) -> str:
    with open(path, "rb") as handle:
        return handle.read(max_chars).decode("utf-8", errors="replace")

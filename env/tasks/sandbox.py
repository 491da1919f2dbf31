"""Runs untrusted Python (generated code under test) in a separate, limited process.

Layers, from the strongest:
- a kernel sandbox, the first of `KERNEL_LAYERS` that works here (`isolation_layer()` says which; each is
  probed once per process by running a program through it):
  - "bwrap" (bubblewrap): fresh user (as an ordinary user), PID, network, IPC and UTS namespaces; a fresh /proc,
    a minimal /dev, the rest of the filesystem read-only and nosuid, no new privileges; empty read-only tmpfs
    over /home, /root, /run, /var/tmp and our home; a private /tmp and /dev/shm, size-capped; the interpreter
    and the entry script bound back read-only where they sit under a hidden directory; of the real filesystem
    only the working directory writable;
  - "unshare" (util-linux): the same namespaces and the same view of the filesystem, built by
    sandbox_entry.py itself inside the fresh mount namespace. As an ordinary user the namespaces belong to a
    user namespace (`unshare --user --map-root-user`) whose root builds the view and then enters a nested user
    namespace as the user again, so the program holds no capability anywhere;
  as root either layer ends with the program under a fresh unprivileged uid (a block of uids per process), so
  that RLIMIT_NPROC bounds it and it owns nothing outside its working directory. Where no kernel layer works,
  `run_python` refuses with `SandboxUnavailable`, which names the fix, unless `allow_unsandboxed_code()` was
  called (`EnvConfig.allow_unsandboxed_code`, the launchers' `--allow_unsandboxed_code`);
- kernel resource limits: CPU seconds, address space, process count, file size (which also bounds output,
  since stdout and stderr are files), open files; plus a wall-clock timeout enforced from here;
- a temporary working directory (also HOME and TMPDIR) and an environment with nothing but PATH and locale;
- an audit hook (sandbox_entry.py) refusing sockets, subprocesses, native libraries and writes outside the
  working directory. Python audit hooks are not a security boundary (a program can find and disarm the hook,
  or spawn processes through modules that raise no audit event), which is why the kernel layers come first;
  without them ("none", opted in) the hook and the limits are all there is, and as root the program's fresh
  uid must be able to read the interpreter to import anything.
Afterwards the PID namespace is torn down (every process of the program dies with it), every process left under
the sandbox uid is killed and the directory removed.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

_ENTRY = Path(__file__).with_name("sandbox_entry.py")
_PROGRAM = "main.py"
# Sandbox uids: a block per parent process so concurrent graders (e.g. pytest-xdist workers) never share one.
_UID_BASE = 200_000 + (os.getpid() % 4096) * 1024
_uid_counter = itertools.count()
_uid_lock = threading.Lock()
KERNEL_LAYERS = ("bwrap", "unshare")
# Covered by empty tmpfs inside the sandbox (the user's home is added); the first is the private, writable /tmp.
_HIDDEN_DIRS = ("/tmp", "/var/tmp", "/run", "/home", "/root")
_NAMESPACES = ("--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child")
_logger = logging.getLogger(__name__)
_unsandboxed = {"allowed": False, "warned": False}


class SandboxUnavailable(RuntimeError):
    """No kernel layer works here and running untrusted code without one was not allowed."""


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


def allow_unsandboxed_code(allowed: bool = True) -> None:
    """Process-wide: where no kernel layer works, run untrusted code anyway, with only the resource limits, the
    audit hook and (as root) a fresh uid. Off by default; meant for a machine whose every user is trusted."""
    _unsandboxed["allowed"] = allowed


@functools.lru_cache(maxsize=None)
def layer_works(layer: str) -> bool:
    """Whether the kernel layer `layer` runs a program here (a real sandboxed run, once per process)."""
    if layer not in KERNEL_LAYERS:
        raise ValueError(f"unknown sandbox layer {layer!r}; expected one of {KERNEL_LAYERS}")
    if shutil.which(layer) is None:
        return False
    probe = _run_python_in(layer, "print('sandboxed')", "", {}, (), SandboxLimits(wall_s=30.0))
    return probe.ok and probe.stdout == "sandboxed\n"


def isolation_layer() -> str:
    """The layer `run_python` uses here: the first of `KERNEL_LAYERS` that works, else "none"."""
    return next((layer for layer in KERNEL_LAYERS if layer_works(layer)), "none")


def check_available() -> str:
    """`isolation_layer()`, checked now rather than at the first program: raises `SandboxUnavailable` where it is
    "none" and `allow_unsandboxed_code()` was not called."""
    layer = isolation_layer()
    _check_allowed(layer)
    return layer


def _check_allowed(layer: str) -> None:
    if layer != "none":
        return
    if not _unsandboxed["allowed"]:
        raise SandboxUnavailable(
            "no kernel sandbox works on this machine for running generated code: install bubblewrap "
            "(apt-get install bubblewrap) or enable unprivileged user namespaces (sysctl "
            "kernel.unprivileged_userns_clone=1, or kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu); "
            "or, on a machine whose every user is trusted, opt in with EnvConfig.allow_unsandboxed_code "
            "(--allow_unsandboxed_code)"
        )
    if not _unsandboxed["warned"]:
        _unsandboxed["warned"] = True
        _logger.warning("running generated code WITHOUT a kernel sandbox: only resource limits and an audit hook")


def run_python(
    source: str,
    *,
    stdin: str = "",
    files: Mapping[str, str] | None = None,
    argv: Sequence[str] = (),
    limits: SandboxLimits = SandboxLimits(),
    layer: str | None = None,
) -> SandboxResult:
    """Runs `source` as `__main__` in a fresh sandbox with `files` (relative name -> text) in its working
    directory, under `layer` (default `isolation_layer()`). Thread-safe; never raises for anything the program
    does; raises `SandboxUnavailable` where no kernel layer works unless `allow_unsandboxed_code()` was called."""
    for name in files or {}:
        if os.path.isabs(name) or ".." in Path(name).parts or name == _PROGRAM:
            raise ValueError(f"sandbox file name {name!r} must be a plain relative path other than {_PROGRAM}")
    layer = isolation_layer() if layer is None else layer
    if layer not in (*KERNEL_LAYERS, "none"):
        raise ValueError(f"unknown sandbox layer {layer!r}; expected one of {(*KERNEL_LAYERS, 'none')}")
    _check_allowed(layer)
    return _run_python_in(layer, source, stdin, files or {}, argv, limits)


def _run_python_in(
    layer: str, source: str, stdin: str, files: Mapping[str, str], argv: Sequence[str], limits: SandboxLimits
) -> SandboxResult:
    uid = _next_uid() if os.getuid() == 0 else None
    workdir = Path(tempfile.mkdtemp(prefix="sandbox-"))
    private = Path(tempfile.mkdtemp(prefix="sandbox-io-"))
    try:
        _write(workdir / _PROGRAM, source)
        for name, text in files.items():
            _write(workdir / name, text)
        if uid is not None:
            for path in (workdir, *workdir.rglob("*")):
                os.chown(path, uid, uid)
        _write(private / "stdin", stdin)
        config = {
            "workdir": str(workdir),
            "program": str(workdir / _PROGRAM),
            "argv": list(argv),
            "limits": dataclasses.asdict(limits),
            "view": None,
            "drop": None if uid is None else {"uid": uid},
        }
        command = [sys.executable, "-I", "-B", str(_ENTRY)]
        if layer == "bwrap":
            command = [*_bwrap_command(_view(str(workdir), limits), str(workdir), as_root=uid is not None), *command]
        elif layer == "unshare":
            config["view"] = _view(str(workdir), limits)
            command.insert(2, "-S")  # the setup stage needs no site-packages; the run stage is a fresh exec
            if uid is None:
                command = ["unshare", "--user", "--map-root-user", *_NAMESPACES, "--", *command]
                config["drop"] = {"userns": [os.getuid(), os.getgid()]}
            else:
                command = ["unshare", *_NAMESPACES, "--", *command]
        command.append(json.dumps(config))
        return _run(command, workdir, private, uid, limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def _view(workdir: str, limits: SandboxLimits) -> dict:
    """What the sandbox sees: the directories to cover with empty tmpfs ("hide"; "tmp" the writable one), and the
    paths under them to bind back read-only ("expose": the interpreter and the entry script)."""
    candidates = [*_HIDDEN_DIRS, os.environ.get("HOME", "/")]
    try:
        candidates.append(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:  # a uid without a passwd entry (some containers)
        pass
    existing = [os.path.realpath(path) for path in candidates if os.path.isdir(path)]
    hide = _outermost([path for path in existing if path != "/"])
    interpreter = {sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, str(_ENTRY)}
    needed = interpreter | {os.path.realpath(path) for path in interpreter}
    expose = _outermost([path for path in needed if any(_is_under(path, hidden) for hidden in hide)])
    tmp = os.path.realpath(_HIDDEN_DIRS[0])
    return {"hide": hide, "tmp": tmp, "expose": expose, "tmp_bytes": limits.max_file_mb << 20}


def _bwrap_command(view: dict, workdir: str, as_root: bool) -> list[str]:
    """bwrap's arguments for `view`. As an ordinary user bwrap makes a user namespace and drops every capability
    itself; as root it makes no user namespace and keeps only CAP_SETUID and CAP_SETGID, which the entry script
    spends on switching to the sandbox uid (bwrap also sets no_new_privs and mounts everything nosuid)."""
    command = ["bwrap", "--die-with-parent", "--new-session"]
    if as_root:
        command += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                    "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        command += ["--unshare-all"]
    size = str(view["tmp_bytes"])
    command += ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"]
    for hidden in view["hide"]:
        if hidden == view["tmp"]:
            command += ["--perms", "1777", "--size", size, "--tmpfs", hidden]
        else:
            command += ["--perms", "0755", "--tmpfs", hidden]
    for path, how in [*((path, "--ro-bind") for path in view["expose"]), (workdir, "--bind")]:
        hidden = next((hidden for hidden in view["hide"] if _is_under(path, hidden)), None)
        if hidden is not None:
            for parent in reversed(Path(path).parents):
                if _is_under(str(parent), hidden) and str(parent) != hidden:
                    command += ["--perms", "0755", "--dir", str(parent)]
        command += [how, path, path]
    for hidden in view["hide"]:
        if hidden != view["tmp"]:
            command += ["--remount-ro", hidden]
    return [*command, "--remount-ro", "/dev", "--chdir", "/", "--"]


def _is_under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _outermost(paths: Sequence[str]) -> list[str]:
    """`paths` without duplicates and without those inside another of them, shortest first."""
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        if not any(_is_under(path, outer) for outer in kept):
            kept.append(path)
    return kept


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
    """Kills the sandbox: the init of its PID namespace (the child of bwrap or unshare; the whole namespace dies
    with it, and it is gone only once the rest is), the session's process group and, with a sandbox uid, every
    process left under that uid (children that started their own session), until none is left."""
    inits = _children_of(process.pid) if process.poll() is None else []
    for pid in inits:
        _sigkill(pid)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
    for _ in range(1000):
        if not any(_alive(pid) for pid in inits):
            break
        time.sleep(0.005)
    if uid is None:
        return
    for _ in range(100):
        survivors = _processes_of(uid)
        if not survivors:
            return
        for pid in survivors:
            _sigkill(pid)


def _sigkill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _children_of(parent: int) -> list[int]:
    return [pid for pid, ppid, _ in _process_table() if ppid == parent]


def _alive(pid: int) -> bool:
    return any(entry == pid and state != b"Z" for entry, _, state in _process_table(pid))


def _process_table(only: int | None = None) -> list[tuple[int, int, bytes]]:
    """(pid, parent pid, state) of every process, or of `only`."""
    names = [str(only)] if only is not None else [name for name in os.listdir("/proc") if name.isdigit()]
    table = []
    for name in names:
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        table.append((int(name), int(fields[1]), fields[0]))
    return table


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

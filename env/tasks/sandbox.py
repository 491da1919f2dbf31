"""Runs untrusted Python (generated code under test) in a separate, limited process.

Layers, from the strongest:
- a kernel sandbox, the first of `KERNEL_LAYERS` that works here (`isolation_layer()` says which; each is
  probed once per process by running a program through it):
  - "bwrap" (bubblewrap): fresh user (as an ordinary user), PID, network, IPC and UTS namespaces; a root of its
    own (a read-only tmpfs) holding nothing of the host but the interpreter, its standard library (site-packages
    covered by an empty tmpfs), the shared libraries they load, the dynamic linker's cache and the entry script,
    bound read-only and nosuid (`_interpreter_paths`); a fresh /proc, a minimal read-only /dev, and the working
    directory, /sandbox, a tmpfs of `workdir_mb`; no new privileges;
  - "unshare" (util-linux): the same namespaces and the same root, assembled by sandbox_entry.py itself inside
    the fresh mount namespace and entered with pivot_root (the host's root detached). As an ordinary user the
    namespaces belong to a user namespace (`unshare --user --map-root-user`) whose root builds the view and then
    enters a nested user namespace as the user again, so the program holds no capability anywhere;
  both with a seccomp filter (`_seccomp_program`) under which no socket of any family can be made (nor io_uring,
  which could make one); as root either layer ends with the program under a fresh unprivileged uid (a block of
  uids per process), so that RLIMIT_NPROC bounds it and it owns nothing outside its working directory. Where no
  kernel layer works, `run_python` refuses with `SandboxUnavailable`, which names the fix, unless
  `allow_unsandboxed_code()` was called (`EnvConfig.allow_unsandboxed_code`, the launchers' `--allow_unsandboxed_code`);
- kernel resource limits per process: CPU seconds, address space, process count, file size (which also bounds
  output, since stdout and stderr are files), open files; for the sandbox as a whole a watchdog here that kills it
  at the wall-clock limit or once its processes together hold more than `memory_mb` resident (looked at every
  `_WATCH_S`, so a fast allocation can overshoot for that long; the working directory's tmpfs, at most
  `workdir_mb`, comes on top); no cgroup (see docs/threat-model.md);
- an environment with nothing but PATH and locale, HOME and TMPDIR the working directory;
- an audit hook (sandbox_entry.py) refusing sockets, subprocesses, native libraries and writes outside the
  working directory. Python audit hooks are not a security boundary (a program can find and disarm the hook,
  or spawn processes through modules that raise no audit event), which is why the kernel layers come first;
  without them ("none", opted in) the hook and the limits are all there is: the program sees the host's files
  as its user may, has no seccomp filter and works in a directory of the host's temporary directory; as root
  its fresh uid must be able to read the interpreter to import anything.
Afterwards the PID namespace is torn down (every process of the program dies with it; the working directory's
tmpfs goes with its mount namespace), every process left under the sandbox uid is killed and the host directories
removed whatever modes the program left on them, with an error logged for anything that stays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import glob
import itertools
import json
import logging
import os
import shutil
import signal
import site
import struct
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
# The working directory inside a kernel layer: a size-capped tmpfs of the sandbox's own mount namespace.
_WORKDIR = "/sandbox"
# How often the watchdog looks at the running sandboxes (one /proc scan for all of them, about 1.5 ms here).
_WATCH_S = 0.025
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# Classic BPF for seccomp (<linux/filter.h>, <linux/seccomp.h>, <linux/audit.h>): per machine, the AUDIT_ARCH of
# its native system calls and the numbers to refuse: socket, socketpair, connect, bind, listen, accept, accept4,
# io_uring_setup, io_uring_enter, io_uring_register.
_SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, (41, 53, 42, 49, 50, 43, 288, 425, 426, 427)),
    "aarch64": (0xC00000B7, (198, 199, 203, 200, 201, 202, 242, 425, 426, 427)),
}
_BPF_LD_ABS, _BPF_JEQ, _BPF_JGE, _BPF_RET = 0x20, 0x15, 0x35, 0x06
_SECCOMP_DATA_NR, _SECCOMP_DATA_ARCH = 0, 4
_X32_SYSCALL_BIT = 0x40000000
_SECCOMP_RET_KILL_PROCESS, _SECCOMP_RET_ERRNO, _SECCOMP_RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
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
    workdir_mb: int = 64
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
    if shutil.which(layer) is None or os.uname().machine not in _SECCOMP_ARCHES:
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
    layer = _checked_layer(files or {}, layer)
    return _run_python_in(layer, source, stdin, files or {}, argv, limits)


def _checked_layer(files: Mapping[str, str], layer: str | None) -> str:
    """`layer` (default `isolation_layer()`) once it and the names of `files` are checked."""
    for name in files:
        if os.path.isabs(name) or ".." in Path(name).parts or name == _PROGRAM:
            raise ValueError(f"sandbox file name {name!r} must be a plain relative path other than {_PROGRAM}")
    layer = isolation_layer() if layer is None else layer
    if layer not in (*KERNEL_LAYERS, "none"):
        raise ValueError(f"unknown sandbox layer {layer!r}; expected one of {(*KERNEL_LAYERS, 'none')}")
    _check_allowed(layer)
    return layer


def _run_python_in(
    layer: str, source: str, stdin: str, files: Mapping[str, str], argv: Sequence[str], limits: SandboxLimits
) -> SandboxResult:
    sandboxed = _Sandboxed(layer, source, files, argv, limits, stdin)
    try:
        returncode = sandboxed.process.wait()
    finally:
        sandboxed.close()
    return SandboxResult(
        returncode=None if sandboxed.expired else returncode,
        stdout=sandboxed.output,
        stderr=sandboxed.stderr,
        timed_out=sandboxed.expired,
    )


def open_session(
    source: str,
    *,
    files: Mapping[str, str] | None = None,
    argv: Sequence[str] = (),
    limits: SandboxLimits = SandboxLimits(),
    layer: str | None = None,
) -> SandboxSession:
    """Starts `source` as `__main__` in a fresh sandbox as `run_python` does, but with pipes to its standard input
    and from its standard output, for a caller that talks to the program while it runs. Close it (or use it as a
    context manager) when done; it is killed at `limits.wall_s` after its start in any case."""
    layer = _checked_layer(files or {}, layer)
    return SandboxSession(_Sandboxed(layer, source, files or {}, argv, limits, None))


class SandboxSession:
    """A sandboxed program talking through pipes: `stdin` (buffered, flush after writing) and `stdout` read
    EOF once the program is dead, which it is at `close()` or `limits.wall_s` after its start, whichever is first
    (`expired` says it was the deadline). `close()` kills every process it started and removes its directories;
    `stderr` is its standard error (at most `max_output_chars`) once closed."""

    def __init__(self, sandboxed: _Sandboxed):
        self._sandboxed = sandboxed
        self.stdin = sandboxed.process.stdin
        self.stdout = sandboxed.process.stdout

    @property
    def expired(self) -> bool:
        return self._sandboxed.expired

    @property
    def stderr(self) -> str:
        return self._sandboxed.stderr

    def close(self) -> None:
        self._sandboxed.close()

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class _Sandboxed:
    """One sandboxed process, the mechanism under `run_python` and `SandboxSession`: its working directory (the
    program, `files`) and a private one (its standard streams); its standard input from a file holding `stdin` and
    its output to a file (`output` once closed), or, for `stdin=None`, both through pipes. A watchdog kills it at
    `limits.wall_s`; `close()` kills it earlier, reads its standard error and removes both directories."""

    def __init__(
        self,
        layer: str,
        source: str,
        files: Mapping[str, str],
        argv: Sequence[str],
        limits: SandboxLimits,
        stdin: str | None,
    ):
        self.limits = limits
        self.uid = _next_uid() if os.getuid() == 0 else None
        # Under a kernel layer the working directory is a tmpfs of the sandbox's own mount namespace (it vanishes
        # with it); only without one ("none") is it a directory of the host.
        self.workdir = Path(tempfile.mkdtemp(prefix="sandbox-")) if layer == "none" else None
        self.private = Path(tempfile.mkdtemp(prefix="sandbox-io-"))
        self.expired = False
        self.output = ""
        self.stderr = ""
        self._closed = False
        self._lock = threading.Lock()
        try:
            self.process = self._start(layer, source, files, argv, stdin)
        except BaseException:
            self._remove_directories()
            raise
        self.held_mb: float | None = None
        self.deadline = time.monotonic() + limits.wall_s
        _WATCHDOG.watch(self)

    def _start(
        self, layer: str, source: str, files: Mapping[str, str], argv: Sequence[str], stdin: str | None
    ) -> subprocess.Popen:
        uid, limits = self.uid, self.limits
        workdir = _WORKDIR if self.workdir is None else str(self.workdir)
        if self.workdir is not None and uid is not None:
            os.chown(self.workdir, uid, uid)
        config = {
            "workdir": workdir,
            "program": os.path.join(workdir, _PROGRAM),
            "files": {_PROGRAM: source, **files},
            "argv": list(argv),
            "limits": dataclasses.asdict(limits),
            "view": None,
            "seccomp": None,
            "drop": None if uid is None else {"uid": uid},
        }
        environment = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": workdir,
            "TMPDIR": workdir,
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        with contextlib.ExitStack() as files_here:
            inherited = []
            command = [_interpreter(), "-I", "-B", str(_ENTRY)]
            if layer == "bwrap":
                inherited.append(_memfd(files_here, _seccomp_program()))
                command = [*_bwrap_command(_view(limits), uid is not None, inherited[-1]), *command]
            elif layer == "unshare":
                config["view"] = {**_view(limits), "owner": uid}
                config["seccomp"] = _seccomp_program().hex()
                command.insert(2, "-S")  # the setup stage needs no site-packages; the run stage is a fresh exec
                if uid is None:
                    command = ["unshare", "--user", "--map-root-user", *_NAMESPACES, "--", *command]
                    config["drop"] = {"userns": [os.getuid(), os.getgid()]}
                else:
                    command = ["unshare", *_NAMESPACES, "--", *command]
            inherited.append(_memfd(files_here, json.dumps(config).encode()))
            command.append(str(inherited[-1]))
            if stdin is None:
                streams = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
            else:
                _write(self.private / "stdin", stdin)
                streams = {
                    "stdin": files_here.enter_context(open(self.private / "stdin", "rb")),
                    "stdout": files_here.enter_context(open(self.private / "stdout", "wb")),
                }
            stderr = files_here.enter_context(open(self.private / "stderr", "wb"))
            return subprocess.Popen(
                command, **streams, stderr=stderr, cwd="/", env=environment, start_new_session=True,
                close_fds=True, pass_fds=inherited,
            )

    def _kill(self, expired: bool = False, held_mb: float | None = None) -> None:
        with self._lock:
            if self._closed:
                return
            self.expired, self.held_mb = expired, held_mb
            _kill_everything(self.process, self.uid)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _WATCHDOG.forget(self)
        try:
            _kill_everything(self.process, self.uid)
            for pipe in (self.process.stdin, self.process.stdout):
                if pipe is not None:
                    try:
                        pipe.close()
                    except OSError:  # a write the program never read: its pipe broke when it died
                        pass
            if self.process.stdout is None:
                self.output = _read(self.private / "stdout", self.limits.max_output_chars)
            self.stderr = _read(self.private / "stderr", self.limits.max_output_chars)
            if self.held_mb is not None:
                self.stderr += (f"\nsandbox: killed: its processes held {self.held_mb:.0f} MB resident, over "
                                f"memory_mb={self.limits.memory_mb}\n")
        finally:
            self._remove_directories()

    def _remove_directories(self) -> None:
        for directory in (self.workdir, self.private):
            if directory is not None:
                _remove_tree(directory)


def _view(limits: SandboxLimits) -> dict:
    """What a kernel layer shows the program (`_interpreter_paths`) and the size of its working directory."""
    links, binds, covers = _interpreter_paths()
    return {"links": [list(link) for link in links], "binds": list(binds), "covers": list(covers),
            "workdir_bytes": limits.workdir_mb << 20}


def _interpreter() -> str:
    """The interpreter's real file: the sandbox binds it at that path, not the virtual environment's link to it."""
    return os.path.realpath(sys.executable)


@functools.lru_cache(maxsize=None)
def _interpreter_paths() -> tuple[tuple[tuple[str, str], ...], tuple[str, ...], tuple[str, ...]]:
    """What the program may see of the host, all read-only: (the symlinks on the way to each path below, as
    (link, target); the paths to bind: the interpreter, its standard library, the shared libraries those load, the
    dynamic linker's cache and the entry script; the site-packages directories inside the standard library, to
    cover with an empty tmpfs). Nothing else of the host: no /etc, no home, no /tmp, no other site-packages."""
    # The base interpreter's, not a virtual environment's: os is always a source module of the standard library.
    standard_library = {os.path.dirname(os.__file__), *(path for path in sys.path if path.endswith("lib-dynload"))}
    extensions = [path for directory in standard_library for path in glob.glob(os.path.join(directory, "*.so"))]
    native = [_interpreter(), *sorted(extensions)]
    wanted = [*native, *standard_library, *_shared_libraries(native), "/etc/ld.so.cache", str(_ENTRY)]
    links: dict[str, str] = {}
    real = []
    for path in wanted:
        if os.path.exists(path):
            chain, resolved = _symlink_chain(path)
            links.update(chain)
            real.append(resolved)
    binds = _outermost(real)
    covers = _outermost([
        os.path.realpath(path) for path in site.getsitepackages([sys.base_prefix, sys.base_exec_prefix])
        if os.path.isdir(path) and any(_is_under(os.path.realpath(path), bound) for bound in binds)
    ])
    kept_links = tuple(sorted((link, target) for link, target in links.items()
                              if not any(_is_under(link, bound) for bound in binds)))
    return kept_links, tuple(binds), tuple(covers)


def _shared_libraries(binaries: Sequence[str]) -> list[str]:
    """The shared libraries `binaries` load, as ldd finds them; without ldd, the system's library directories."""
    if shutil.which("ldd") is None:
        return [path for path in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(path)]
    listing = subprocess.run(["ldd", *binaries], capture_output=True, text=True, check=False).stdout
    return sorted({word for word in listing.split() if word.startswith("/") and not word.endswith(":")})


def _symlink_chain(path: str) -> tuple[dict[str, str], str]:
    """Every symlink met while resolving `path` (link -> its target as written), and the real path it ends at: the
    sandbox recreates the links so that the path, and any path the interpreter was told, still resolves inside."""
    links: dict[str, str] = {}
    pending = list(Path(os.path.abspath(path)).parts[1:])
    current = "/"
    for _ in range(4096):
        if not pending:
            return links, current
        part = pending.pop(0)
        candidate = os.path.join(current, part)
        if part == "..":
            current = os.path.dirname(current)
        elif os.path.islink(candidate):
            target = os.readlink(candidate)
            links[candidate] = target
            if os.path.isabs(target):
                current = "/"
            pending[:0] = [piece for piece in Path(target).parts if piece != "/"]
        elif part != ".":
            current = candidate
    raise OSError(f"too many symlinks resolving {path}")


@functools.lru_cache(maxsize=None)
def _seccomp_program() -> bytes:
    """A seccomp filter (classic BPF, struct sock_filter[]) for this machine's architecture: the socket system
    calls and io_uring (whose requests can open and connect sockets without them) fail with EPERM, x32 system
    calls on x86_64 too; a system call of any other architecture kills the process; everything else is allowed."""
    arch, blocked = _SECCOMP_ARCHES[os.uname().machine]
    # (code, jt, jf, k); jumps count instructions from the next one.
    checks = [(_BPF_JEQ, 0, 0, number) for number in blocked]
    if os.uname().machine == "x86_64":
        checks.insert(0, (_BPF_JGE, 0, 0, _X32_SYSCALL_BIT))
    program = [(_BPF_LD_ABS, 0, 0, _SECCOMP_DATA_ARCH), (_BPF_JEQ, 0, len(checks) + 3, arch),
               (_BPF_LD_ABS, 0, 0, _SECCOMP_DATA_NR)]
    program += [(code, len(checks) - index, 0, k) for index, (code, _, _, k) in enumerate(checks)]
    program += [(_BPF_RET, 0, 0, _SECCOMP_RET_ALLOW), (_BPF_RET, 0, 0, _SECCOMP_RET_ERRNO | errno.EPERM),
                (_BPF_RET, 0, 0, _SECCOMP_RET_KILL_PROCESS)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def _memfd(files_here: contextlib.ExitStack, data: bytes) -> int:
    """A file descriptor (closed with `files_here`) to read `data` from, for a sandbox to inherit."""
    fd = os.memfd_create("sandbox")
    files_here.callback(os.close, fd)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _bwrap_command(view: dict, as_root: bool, seccomp_fd: int) -> list[str]:
    """bwrap's arguments for `view`: a read-only tmpfs root with only `view`'s paths bound (read-only) and covered,
    a fresh /proc, bwrap's minimal /dev (read-only) and a size-capped tmpfs working directory, all in the sandbox's
    own mount namespace; the seccomp filter read from `seccomp_fd`. As an ordinary user bwrap makes a user namespace
    and drops every capability itself; as root it makes no user namespace and keeps only CAP_SETUID and
    CAP_SETGID, which the entry script spends on switching to the sandbox uid (bwrap also sets no_new_privs and
    mounts everything nosuid)."""
    command = ["bwrap", "--die-with-parent", "--new-session", "--seccomp", str(seccomp_fd)]
    if as_root:
        command += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                    "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        command += ["--unshare-all"]
    # bwrap would make the directories on the way to a bound path 0700 for root alone, and the sandbox uid must
    # pass them; they hold nothing but the way.
    ways = {str(parent) for path in (*view["binds"], *(link for link, _ in view["links"]))
            for parent in Path(path).parents if str(parent) != "/"}
    for directory in sorted(ways, key=lambda way: (way.count("/"), way)):
        command += ["--perms", "0755", "--dir", directory]
    for link, target in view["links"]:
        command += ["--symlink", target, link]
    for path in view["binds"]:
        command += ["--ro-bind", path, path]
    for path in view["covers"]:
        command += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
    # As root the entry script writes the program's files after switching uid, into a directory root made.
    command += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777" if as_root else "0700",
                "--size", str(view["workdir_bytes"]), "--tmpfs", _WORKDIR]
    return [*command, "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", _WORKDIR, "--"]


def _is_under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _outermost(paths: Sequence[str]) -> list[str]:
    """`paths` without duplicates and without those inside another of them, shortest first."""
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        if not any(_is_under(path, outer) for outer in kept):
            kept.append(path)
    return kept


def _remove_tree(path: Path) -> None:
    """Removes `path` whatever modes the program left on it (as an ordinary user, a directory it made 000 can be
    neither listed nor emptied until its owner gives the permissions back); logs an error if anything remains.
    Symlinks are never followed, so a link the program planted cannot turn the chmod onto a file outside."""
    if path.is_symlink() or not path.exists():
        return
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    # Top-down, each directory is opened for the permissions before the walk lists it.
    for directory, subdirectories, _ in os.walk(path):
        for name in subdirectories:
            child = os.path.join(directory, name)
            if not os.path.islink(child):
                with contextlib.suppress(OSError):
                    os.chmod(child, 0o700)
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        _logger.error("sandbox: could not remove %s; it stays on disk", path)


class _Watchdog:
    """One thread for every running sandbox, with one /proc scan a round however many there are: every `_WATCH_S`
    it kills each sandbox past its deadline (`expired`) and each whose processes together hold more than
    `limits.memory_mb` resident (`held_mb`; RLIMIT_AS bounds each process alone). It runs while any sandbox does."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: set[_Sandboxed] = set()
        self._running = False

    def watch(self, sandboxed: _Sandboxed) -> None:
        with self._lock:
            self._watched.add(sandboxed)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, daemon=True).start()

    def forget(self, sandboxed: _Sandboxed) -> None:
        with self._lock:
            self._watched.discard(sandboxed)

    def _run(self) -> None:
        while True:
            time.sleep(_WATCH_S)
            with self._lock:
                if not self._watched:
                    self._running = False
                    return
                watched = list(self._watched)
            tree = _process_tree()
            now = time.monotonic()
            for sandboxed in watched:
                held = _resident_bytes_under(sandboxed.process.pid, tree)
                if now >= sandboxed.deadline:
                    reason: dict = {"expired": True}
                elif held > sandboxed.limits.memory_mb << 20:
                    reason = {"held_mb": held / (1 << 20)}
                else:
                    continue
                self.forget(sandboxed)
                # Killing waits for the sandbox's processes to go; the other sandboxes stay watched meanwhile.
                threading.Thread(target=sandboxed._kill, kwargs=reason, daemon=True).start()


_WATCHDOG = _Watchdog()


def _resident_bytes_under(root: int, tree: tuple[dict[int, list[int]], dict[int, int]]) -> int:
    """Resident memory of `root` and every live descendant together in `tree` (`_process_tree`): a sandbox's
    processes; pages shared between them count once per process, so this errs high."""
    children, resident = tree
    total, pending = resident.get(root, 0), list(children.get(root, []))
    while pending:
        pid = pending.pop()
        total += resident.get(pid, 0)
        pending.extend(children.get(pid, []))
    return total * _PAGE_BYTES


def _process_tree() -> tuple[dict[int, list[int]], dict[int, int]]:
    """Every process's children, and its resident pages (0 for a zombie)."""
    children: dict[int, list[int]] = {}
    resident: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
        resident[int(name)] = int(fields[21]) if fields[0] != b"Z" else 0
    return children, resident


def _kill_everything(process: subprocess.Popen, uid: int | None) -> None:
    """Kills the sandbox: the init of its PID namespace (the child of bwrap or unshare; the whole namespace dies
    with it, and it is gone only once the rest is), the session's process group and, with a sandbox uid, every
    process left under that uid (children that started their own session), until none is left. bwrap and unshare
    get a moment to reap the init and exit first: killed before that, they would leave it a zombie of the host's
    pid 1, which in a container may never reap it."""
    inits = _children_of(process.pid) if process.poll() is None else []
    for pid in inits:
        _sigkill(pid)
    if inits:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=2.0)
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
            break
        for pid in survivors:
            _sigkill(pid)
    # The dead wait for their namespace's init to reap them, which it does on its way out (bwrap's may still be
    # going when bwrap has returned): a moment for that, so that nothing of the sandbox is left once this returns.
    for _ in range(400):
        if not _processes_of(uid, dead_too=True):
            return
        time.sleep(0.005)


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


def _processes_of(uid: int, dead_too: bool = False) -> list[int]:
    """Live processes of `uid`, and with `dead_too` its zombies (dead already, waiting for their reaper)."""
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
        if dead_too or state != b"Z":
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

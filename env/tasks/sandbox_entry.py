"""First code run inside a sandboxed child process (started by env/tasks/sandbox.py; not imported by the package).

Usage: python -I -B sandbox_entry.py CONFIG_FD. The JSON config comes through the inherited file descriptor CONFIG_FD
(the program and its files may be larger than one command-line argument can be), which is closed once read. Stages:
- setup, only where the config asks for it: under the `unshare` layer it builds the sandbox's view of the
  filesystem inside the fresh mount namespace (`view`: a tmpfs root holding only the paths it lists, bound read-only,
  a fresh /proc, a minimal /dev and a size-capped tmpfs working directory, entered with pivot_root so that nothing
  of the host's root stays reachable), installs the seccomp filter (`seccomp`), then leaves its privileges
  (`drop`): started as root it switches to the sandbox's uid; started as an ordinary user, who is root of a user
  namespace only for the setup, it enters a nested user namespace as that user again, so no capability survives
  the exec that follows;
- files: the program and its files are written into the working directory by the user that will run them;
- run: where the setup stage loaded ctypes, a fresh interpreter first (re-executing this file), so the program
  starts in one that has loaded nothing it could borrow; then kernel resource limits, an audit hook (a second layer
  that turns sockets, processes, native libraries and writes outside the working directory into a
  PermissionError), then the program as `__main__`.
"""

import json
import os
import resource
import sys

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {
    "os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1, "os.truncate": 1,
    "os.utime": 1, "shutil.rmtree": 1, "os.rename": 2, "os.link": 2, "os.symlink": 2,
}
_FORBIDDEN_EVENTS = {
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto",
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "os.kill", "os.killpg", "os.setuid", "ctypes.dlopen", "ctypes.dlsym", "sys.addaudithook",
}

# Linux ABI constants (<sys/mount.h>, <linux/mount.h>, <sched.h>, <linux/prctl.h>, <linux/seccomp.h>);
# mount_setattr(2) has the same number on every architecture, pivot_root(2) does not.
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _AT_RECURSIVE, _AT_FDCWD = 0x1, 0x2, 0x8000, -100
_MNT_DETACH = 0x2
_SYS_MOUNT_SETATTR = 442
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_CLONE_NEWUSER = 0x10000000
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, _PR_SET_NO_NEW_PRIVS = 22, 2, 38
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
# The new root is assembled on a tmpfs mounted here before pivot_root; any directory would do, since every path
# bound into it is held open (O_PATH) before anything is covered.
_STAGING = "/tmp"


def _native():
    """libc through ctypes, for the setup stage only (the run stage is a fresh interpreter), and an error check."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def check(result, what):
        if result != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"sandbox setup: {what}: {os.strerror(error)}")

    return ctypes, libc, check


def _build_view(view, workdir):
    """Inside a fresh mount and PID namespace, as (namespace) root: a new root on a tmpfs holding the symlinks in
    `view["links"]` and the paths in `view["binds"]` bound read-only and nosuid, empty read-only tmpfs over
    `view["covers"]`, a fresh /proc, a minimal read-only /dev and the working directory as a tmpfs of
    `view["workdir_bytes"]` (owned by `view["owner"]` where that is set); pivot_root into it, the old root detached,
    the new root read-only, no new privileges after."""
    ctypes, libc, check = _native()

    def mount(source, target, fstype, flags, data=None):
        def encode(text):
            return None if text is None else os.fsencode(text)

        check(libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)),
              f"mount {target}")

    def set_attributes(path, set_flags=0, clear_flags=0, recursive=False):
        attributes = (ctypes.c_uint64 * 4)(set_flags, clear_flags, 0, 0)  # struct mount_attr
        check(libc.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_long(_AT_FDCWD), os.fsencode(path),
                           ctypes.c_long(_AT_RECURSIVE if recursive else 0), attributes,
                           ctypes.c_long(ctypes.sizeof(attributes))), f"mount_setattr {path}")

    def bind(fd, target, is_dir):
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        if is_dir:
            os.makedirs(target, mode=0o755, exist_ok=True)
        elif not os.path.exists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
        mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND)

    os.umask(0o022)  # the directories on the way to each bound path must let the sandbox's user through
    sources = {path: os.open(path, os.O_PATH) for path in view["binds"]}
    devices = {name: os.open(f"/dev/{name}", os.O_PATH) for name in _DEVICES if os.path.exists(f"/dev/{name}")}
    mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    root = _STAGING
    mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")
    for link, target in view["links"]:
        os.makedirs(root + os.path.dirname(link), mode=0o755, exist_ok=True)
        os.symlink(target, root + link)
    for path, fd in sources.items():
        bind(fd, root + path, os.path.isdir(f"/proc/self/fd/{fd}"))
        set_attributes(root + path, _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID)
    for path in view["covers"]:
        mount("tmpfs", root + path, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=4k")
        set_attributes(root + path, _MOUNT_ATTR_RDONLY)

    os.mkdir(root + "/proc")
    mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    os.mkdir(root + "/dev")
    mount("tmpfs", root + "/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=64k")
    for name, fd in devices.items():
        bind(fd, f"{root}/dev/{name}", is_dir=False)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    set_attributes(root + "/dev", _MOUNT_ATTR_RDONLY)

    os.makedirs(root + workdir, mode=0o755)
    owner = "" if view["owner"] is None else f",uid={view['owner']},gid={view['owner']}"
    mount("tmpfs", root + workdir, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=0700,size={view['workdir_bytes']}{owner}")
    for fd in (*sources.values(), *devices.values()):
        os.close(fd)

    os.chdir(root)
    check(libc.syscall(ctypes.c_long(_SYS_PIVOT_ROOT[os.uname().machine]), b".", b"."), "pivot_root")
    check(libc.umount2(b".", _MNT_DETACH), "detach the old root")
    os.chdir("/")
    set_attributes("/", _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID)
    check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _install_seccomp(program):
    """Loads the classic BPF `program` (struct sock_filter[], built by sandbox.py) as this process's seccomp
    filter; every process it starts inherits it and none can remove it."""
    ctypes, libc, check = _native()

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    instructions = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(instructions))
    check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def _drop(drop):
    """Leaves root: a real one switches to the sandbox uid; the root of a user namespace enters a nested one that
    maps the ordinary user back, so the exec that follows clears every capability."""
    if "uid" in drop:
        os.setgroups([])
        os.setgid(drop["uid"])
        os.setuid(drop["uid"])
        return
    _, libc, check = _native()
    uid, gid = drop["userns"]
    check(libc.unshare(_CLONE_NEWUSER), "nested user namespace")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} 0 1"), ("gid_map", f"{gid} 0 1")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)


def _write_files(workdir, files):
    for name, text in files.items():
        path = os.path.join(workdir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


def _read_config(fd):
    with os.fdopen(fd, "rb") as handle:
        return json.loads(handle.read())


def _exec_run_stage(config):
    """Re-executes this file with `config` (through a memfd: no size limit, no pipe to fill before the exec)."""
    fd = os.memfd_create("sandbox-config", 0)
    os.write(fd, json.dumps(config).encode())
    os.lseek(fd, 0, os.SEEK_SET)
    os.execv(sys.executable, [sys.executable, "-I", "-B", __file__, str(fd)])


def _set_limits(limits):
    def cap(kind, soft, hard=None):
        resource.setrlimit(kind, (soft, soft if hard is None else hard))

    cap(resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1)
    cap(resource.RLIMIT_AS, limits["memory_mb"] << 20)
    cap(resource.RLIMIT_NPROC, limits["max_processes"])
    cap(resource.RLIMIT_FSIZE, limits["max_file_mb"] << 20)
    cap(resource.RLIMIT_NOFILE, 64)
    cap(resource.RLIMIT_CORE, 0)


def _install_audit_hook(workdir):
    inside = workdir.rstrip(os.sep) + os.sep

    def allowed(path):
        if isinstance(path, int):
            return True
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        absolute = os.path.normpath(os.path.join(os.getcwd(), os.fspath(path)))
        return absolute == workdir or absolute.startswith(inside)

    def hook(event, args):
        if event in _FORBIDDEN_EVENTS:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, _, flags = args
            if isinstance(path, (str, bytes)) and os.fsdecode(path).startswith("/proc/") and not os.fsdecode(
                path
            ).startswith("/proc/self/"):
                raise PermissionError("sandbox: reading other processes is not allowed")
            if flags & _WRITE_FLAGS and not allowed(path):
                raise PermissionError(f"sandbox: writing {path!r} outside the working directory is not allowed")
        elif event in _PATH_EVENTS:
            for path in args[: _PATH_EVENTS[event]]:
                if not allowed(path):
                    raise PermissionError(f"sandbox: {event} on {path!r} is not allowed")

    sys.addaudithook(hook)


def main():
    config = _read_config(int(sys.argv[1]))
    if config["view"]:
        _build_view(config["view"], config["workdir"])
    if config["seccomp"]:
        _install_seccomp(bytes.fromhex(config["seccomp"]))
    if config["drop"]:
        _drop(config["drop"])
    _write_files(config["workdir"], config["files"])
    if config["view"] or config["seccomp"] or (config["drop"] and "userns" in config["drop"]):
        _exec_run_stage({**config, "view": None, "seccomp": None, "drop": None, "files": {}})
    _set_limits(config["limits"])
    os.chdir(config["workdir"])
    _install_audit_hook(config["workdir"])
    sys.argv = [config["program"], *config["argv"]]
    sys.path.insert(0, config["workdir"])
    _run_as_main(config["program"])


def _run_as_main(path):
    """Runs the file at `path` as `__main__`, importing nothing (runpy would import pkgutil lazily, which a
    fresh uid cannot where it may not read the interpreter's directory)."""
    with open(path, "rb") as handle:
        code = compile(handle.read(), path, "exec")
    main = type(sys)("__main__")
    main.__file__ = path
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


if __name__ == "__main__":
    main()

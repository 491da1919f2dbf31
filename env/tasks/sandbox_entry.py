"""First code run inside a sandboxed child process (started by env/tasks/sandbox.py; not imported by the package).

Usage: python -I -B sandbox_entry.py CONFIG_JSON. In order it sets the resource limits, drops to an unprivileged
user id when started as root, installs an audit hook and then runs the program as `__main__`. The limits and the
user id are enforced by the kernel; the audit hook is a second layer that turns attempts to open sockets, start
processes, load native libraries or write outside the working directory into a PermissionError.
"""

import importlib
import json
import os
import resource
import runpy
import sys

# Imported before dropping privileges: where the interpreter lives in a directory only root may enter (here
# /root/.pyenv), the unprivileged uid cannot import anything not already loaded. This is the standard library a
# test program or a contest solution commonly uses.
PRELOAD_MODULES = (
    "abc", "array", "ast", "bisect", "calendar", "cmath", "collections", "collections.abc", "contextlib", "copy",
    "csv", "ctypes", "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions", "functools", "gc",
    "hashlib", "heapq", "io", "itertools", "json", "math", "numbers", "operator", "pkgutil", "pprint", "queue",
    "random", "re", "statistics", "string", "struct", "textwrap", "time", "traceback", "types", "typing",
    "unicodedata", "unittest", "warnings", "zlib",
)
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


def _set_limits(limits):
    def cap(kind, soft, hard=None):
        resource.setrlimit(kind, (soft, soft if hard is None else hard))

    cap(resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1)
    cap(resource.RLIMIT_AS, limits["memory_mb"] << 20)
    cap(resource.RLIMIT_NPROC, limits["max_processes"])
    cap(resource.RLIMIT_FSIZE, limits["max_file_mb"] << 20)
    cap(resource.RLIMIT_NOFILE, 64)
    cap(resource.RLIMIT_CORE, 0)


def _drop_privileges(uid):
    if os.getuid() == 0 and uid is not None:
        for module in PRELOAD_MODULES:
            importlib.import_module(module)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _install_audit_hook(workdir):
    inside = workdir.rstrip(os.sep) + os.sep

    def allowed(path):
        if isinstance(path, int):
            return True
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        absolute = os.path.normpath(os.path.join(workdir, os.fspath(path)))
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
    config = json.loads(sys.argv[1])
    _set_limits(config["limits"])
    _drop_privileges(config["uid"])
    _install_audit_hook(config["workdir"])
    sys.argv = [config["program"], *config["argv"]]
    sys.path.insert(0, config["workdir"])
    runpy.run_path(config["program"], run_name="__main__")


if __name__ == "__main__":
    main()

"""The sandbox: limits hold, malicious programs score 0, nothing is left behind, the caller survives."""

from __future__ import annotations

import concurrent.futures
import errno
import json
import logging
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from env.tasks import sandbox
from env.tasks.base import Task
from env.tasks.code import CodeTests, grade_code
from env.tasks.sandbox import KERNEL_LAYERS, SandboxLimits, SandboxUnavailable, run_python
from tests.env import unprivileged
from tests.env.unprivileged import SandboxJob

FAST = SandboxLimits(cpu_s=2, wall_s=5.0, memory_mb=512)


def _sandbox_processes() -> list[int]:
    """Processes under any uid this test process may hand to a sandbox."""
    pids = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and sandbox._UID_BASE <= entry.stat().st_uid < sandbox._UID_BASE + 1024:
                pids.append(int(entry.name))
        except FileNotFoundError:
            continue
    return pids


def _sandbox_dirs() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("sandbox-")}


@pytest.fixture
def leaves_nothing_behind():
    dirs_before = _sandbox_dirs()
    yield
    left = _sandbox_processes()
    assert left == [], [Path(f"/proc/{pid}/stat").read_text() for pid in left if Path(f"/proc/{pid}").exists()]
    # Other test processes (pytest-xdist workers) may be running sandboxes of their own in the same temporary
    # directory: theirs go within moments, a directory this test left stays.
    for _ in range(50):
        if _sandbox_dirs() <= dirs_before:
            break
        time.sleep(0.1)
    assert _sandbox_dirs() <= dirs_before


@pytest.fixture
def shared_dir():
    """A world-writable directory outside any sandbox: only the sandbox itself can keep programs out of it."""
    path = Path(tempfile.mkdtemp(prefix="sandbox-target-"))
    path.chmod(0o1777)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def _scores(program: str, expected_stdout: str = "ok\n", limits: SandboxLimits = FAST) -> float:
    """The grade of `program` on a stdin task whose only test expects `expected_stdout`, i.e. the score the
    program would get if its attack worked and it then printed the expected output."""
    task = Task(
        id="sandbox/attack",
        task_label="test",
        question="",
        gold=CodeTests(kind="stdin", cases=(("", expected_stdout),), limits=limits),
        grader=grade_code,
    )
    return task.grade(f"```python\n{program}\n```")


def test_a_normal_program_reads_stdin_and_writes_stdout(leaves_nothing_behind):
    result = run_python("name = input()\nprint(f'hello {name}')", stdin="sandbox\n", limits=FAST)
    assert result.ok and result.stdout == "hello sandbox\n" and result.stderr == ""
    assert _scores("print('ok')") == 1.0


def test_program_runs_in_its_own_working_directory_with_scrubbed_environment_and_no_root(leaves_nothing_behind):
    os.environ["SANDBOX_TEST_SECRET"] = "s3cret"
    try:
        result = run_python(
            "import os\nprint(os.getcwd())\nprint(sorted(os.environ))\nprint(os.getuid())\n"
            "open('scratch.txt', 'w').write('fine')\nprint(open('scratch.txt').read())",
            limits=FAST,
        )
    finally:
        del os.environ["SANDBOX_TEST_SECRET"]
    cwd, names, uid, scratch = result.stdout.splitlines()
    assert result.ok
    assert cwd == sandbox._WORKDIR and not Path(cwd).exists()
    assert "SANDBOX_TEST_SECRET" not in names and "PATH" in names
    assert scratch == "fine"
    if os.getuid() == 0:
        assert int(uid) != 0


def test_kernel_limits_are_set_in_the_child(leaves_nothing_behind):
    limits = SandboxLimits(cpu_s=3, wall_s=10.0, memory_mb=300, max_processes=7, max_file_mb=2)
    program = (
        "import resource\n"
        "for kind in ('CPU', 'AS', 'NPROC', 'FSIZE'):\n"
        "    print(resource.getrlimit(getattr(resource, 'RLIMIT_' + kind))[0])"
    )
    result = run_python(program, limits=limits)
    assert result.stdout.split() == [str(3), str(300 << 20), str(7), str(2 << 20)]


def test_infinite_loop_is_stopped_by_the_cpu_limit(leaves_nothing_behind):
    # The wall timeout is far beyond the CPU limit, so on a loaded host (where 1 s of CPU can take many seconds of
    # wall time) only the CPU limit can have stopped it.
    limits = SandboxLimits(cpu_s=1, wall_s=120.0)
    assert _scores("while True:\n    pass", limits=limits) == 0.0
    result = run_python("while True:\n    pass", limits=limits)
    assert result.returncode not in (0, None) and not result.timed_out


def test_sleeping_program_is_stopped_by_the_wall_timeout(leaves_nothing_behind):
    start = time.perf_counter()
    result = run_python("import time\ntime.sleep(60)", limits=SandboxLimits(cpu_s=5, wall_s=1.0))
    assert result.timed_out and not result.ok
    assert time.perf_counter() - start < 5.0


def test_fork_bomb_scores_zero(leaves_nothing_behind):
    program = "import os\nwhile True:\n    os.fork()\nprint('ok')"
    assert _scores(program) == 0.0
    program = "import subprocess, sys\nwhile True:\n    subprocess.Popen([sys.executable, '-c', 'while 1: pass'])"
    assert _scores(program) == 0.0


def test_10_gb_allocation_fails(leaves_nothing_behind):
    result = run_python("x = bytearray(10 * 1024 ** 3)\nprint('ok')", limits=FAST)
    assert not result.ok and "MemoryError" in result.stderr
    assert _scores("x = bytearray(10 * 1024 ** 3)\nprint('ok')") == 0.0


def test_writing_outside_the_temp_dir_fails_and_creates_nothing(leaves_nothing_behind, shared_dir):
    target = shared_dir / "planted.txt"
    assert _scores(f"open({str(target)!r}, 'w').write('x')\nprint('ok')") == 0.0
    assert _scores(f"import os\nos.mkdir({str(shared_dir / 'planted')!r})\nprint('ok')") == 0.0
    assert _scores(f"open('../{shared_dir.name}/planted.txt', 'w').write('x')\nprint('ok')") == 0.0
    assert list(shared_dir.iterdir()) == []
    assert not Path("planted.txt").exists()


def test_deleting_files_outside_the_temp_dir_fails(leaves_nothing_behind, shared_dir):
    victim = shared_dir / "victim.txt"
    victim.write_text("keep me")
    victim.chmod(0o666)
    for program in (
        f"import os\nos.remove({str(victim)!r})\nprint('ok')",
        f"import shutil\nshutil.rmtree({str(shared_dir)!r})\nprint('ok')",
        f"open({str(victim)!r}, 'w').close()\nprint('ok')",
    ):
        assert _scores(program) == 0.0
    assert victim.read_text() == "keep me"


def test_api_key_in_our_environment_is_unreadable(leaves_nothing_behind, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    assert _scores("import os\nprint(os.environ['OPENAI_API_KEY'])", "sk-test-not-a-real-key\n") == 0.0
    program = f"print(open('/proc/{os.getpid()}/environ').read().split('OPENAI_API_KEY=')[1].split(chr(0))[0])"
    assert _scores(program, "sk-test-not-a-real-key\n") == 0.0
    program = "print(open('/proc/' + str(__import__('os').getppid()) + '/environ').read())"
    assert _scores(program, "anything\n") == 0.0


def test_opening_a_socket_to_a_live_local_server_fails(leaves_nothing_behind, live_server):
    port, accepted = live_server
    program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('ok')"
    assert _scores(program) == 0.0
    assert accepted == []


def test_output_flood_is_cut_by_the_file_size_limit(leaves_nothing_behind):
    limits = SandboxLimits(cpu_s=5, wall_s=10.0, max_file_mb=1, max_output_chars=10_000)
    result = run_python("while True:\n    print('x' * 1000)", limits=limits)
    assert not result.ok and len(result.stdout) == 10_000


# Numbers from the kernel's system call tables (arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/
# unistd.h), written out here as the reference the filter is checked against.
_SYSCALLS = {
    "x86_64": {"arch": 0xC000003E, "refused": {"socket": 41, "connect": 42, "accept": 43, "bind": 49, "listen": 50,
                                               "socketpair": 53, "accept4": 288, "io_uring_setup": 425},
               "allowed": {"read": 0, "write": 1, "openat": 257, "clone": 56, "execve": 59, "exit_group": 231}},
    "aarch64": {"arch": 0xC00000B7, "refused": {"socket": 198, "socketpair": 199, "bind": 200, "listen": 201,
                                                "accept": 202, "connect": 203, "accept4": 242, "io_uring_setup": 425},
                "allowed": {"read": 63, "write": 64, "openat": 56, "clone": 220, "execve": 221, "exit_group": 94}},
}


def _seccomp_verdict(program: bytes, arch: int, number: int) -> int:
    """What the kernel's classic BPF interpreter returns for `program` on system call `number` of `arch`, for the
    instructions a seccomp filter of ours may hold (load a word of struct seccomp_data, jeq/jge a constant, return
    a constant)."""
    data = struct.pack("=iI", number, arch)  # struct seccomp_data starts with nr, then arch
    instructions = [struct.unpack_from("=HBBI", program, offset) for offset in range(0, len(program), 8)]
    accumulator, counter = 0, 0
    while True:
        code, jump_true, jump_false, constant = instructions[counter]
        counter += 1
        if code == 0x20:
            (accumulator,) = struct.unpack_from("=I", data, constant)
        elif code in (0x15, 0x35):
            taken = accumulator == constant if code == 0x15 else accumulator >= constant
            counter += jump_true if taken else jump_false
        elif code == 0x06:
            return constant
        else:
            raise AssertionError(f"unexpected BPF instruction {code:#x}")


@pytest.mark.parametrize("machine", sorted(_SYSCALLS))
def test_the_seccomp_filter_refuses_sockets_and_io_uring_and_kills_foreign_system_calls(machine, monkeypatch):
    monkeypatch.setattr(sandbox.os, "uname", lambda: os.uname_result(("Linux", "host", "6", "#1", machine)))
    program = sandbox._seccomp_program.__wrapped__()
    table = _SYSCALLS[machine]
    refused, allowed, killed = 0x00050000 | errno.EPERM, 0x7FFF0000, 0x80000000
    assert {name: _seccomp_verdict(program, table["arch"], number) for name, number in table["refused"].items()} == (
        dict.fromkeys(table["refused"], refused))
    assert {name: _seccomp_verdict(program, table["arch"], number) for name, number in table["allowed"].items()} == (
        dict.fromkeys(table["allowed"], allowed))
    other = next(entry for name, entry in _SYSCALLS.items() if name != machine)
    assert _seccomp_verdict(program, other["arch"], other["allowed"]["read"]) == killed
    assert _seccomp_verdict(program, 0x40000003, 359) == killed  # i386 (int 0x80): socket
    if machine == "x86_64":  # the x32 ABI: the same numbers with bit 30 set
        assert _seccomp_verdict(program, table["arch"], 0x40000000 | 41) == refused
        assert _seccomp_verdict(program, table["arch"], 0x40000000) == refused


def test_symlink_chain_records_every_link_on_the_way_and_ends_where_realpath_does(tmp_path):
    (tmp_path / "real" / "lib").mkdir(parents=True)
    (tmp_path / "real" / "lib" / "libx.so.1.2").write_text("")
    (tmp_path / "real" / "lib" / "libx.so.1").symlink_to("libx.so.1.2")
    (tmp_path / "lib").symlink_to("real/lib")
    (tmp_path / "lib64").symlink_to(tmp_path / "lib")
    path = str(tmp_path / "lib64" / "libx.so.1")
    links, real = sandbox._symlink_chain(path)
    assert real == os.path.realpath(path) == str(tmp_path / "real" / "lib" / "libx.so.1.2")
    base = os.path.realpath(tmp_path)
    assert {link.replace(base, ""): target.replace(base, "") for link, target in links.items()} == {
        "/lib64": "/lib", "/lib": "real/lib", "/real/lib/libx.so.1": "libx.so.1.2"}
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(OSError, match="too many symlinks"):
        sandbox._symlink_chain(str(tmp_path / "loop"))


def test_limits_are_validated():
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(ValueError, match="cpu_s must be an int"):
        SandboxLimits(cpu_s=1.5)
    with pytest.raises(ValueError, match="plain relative path"):
        run_python("pass", files={"../escape.py": ""})


def test_an_unknown_layer_is_refused():
    with pytest.raises(ValueError, match="unknown sandbox layer"):
        run_python("pass", layer="chroot")


# ------------------------------------------------------------------------------------------------- the kernel layers
# Each hostile program runs as root (this process; the sandbox switches to a fresh uid) and as an unprivileged
# user (nobody, through tests/env/unprivileged.py), under each kernel layer that works here. A program prints "ok"
# only when its attack got through. Where the audit hook would stop an attack, the program first disarms it (the
# hook is a Python function that gc.get_objects() finds), so what must hold is the kernel layer.

DISARM_AUDIT_HOOK = """\
import gc


def _disarm_audit_hooks():
    disarmed = 0
    for candidate in gc.get_objects():
        code = getattr(candidate, "__code__", None)
        if code is None or code.co_name != "hook" or code.co_argcount != 2:
            continue
        names = code.co_freevars
        source = "def outer():\\n" + "".join(f"    {name} = None\\n" for name in names)
        source += "    def hook(event, args):\\n" + "".join(f"        {name}\\n" for name in names)
        source += "        return None\\n    return hook\\n"
        scope = {}
        exec(source, scope)
        candidate.__code__ = scope["outer"]().__code__
        disarmed += 1
    assert disarmed, "no audit hook found"


_disarm_audit_hooks()
"""
SECRET = "sk-test-sandbox-secret"
# Prints {family: errno} for a socket of each family (and a connection to the host's listeners where the socket
# opens); "open" where the kernel gave one.
SOCKET_FAMILIES = """
import errno, json, socket
report = {{}}
attempts = {{
    'tcp': (socket.AF_INET, socket.SOCK_STREAM, ('127.0.0.1', {port})),
    'udp': (socket.AF_INET, socket.SOCK_DGRAM, ('127.0.0.1', {port})),
    'tcp6': (socket.AF_INET6, socket.SOCK_STREAM, ('::1', {port})),
    'unix path': (socket.AF_UNIX, socket.SOCK_STREAM, {unix}[0]),
    'unix abstract': (socket.AF_UNIX, socket.SOCK_STREAM, {unix}[1]),
    'netlink': (socket.AF_NETLINK, socket.SOCK_RAW, None),
}}
for name, (family, kind, address) in attempts.items():
    try:
        connection = socket.socket(family, kind)
        report[name] = 'open'
        if address is not None:
            connection.connect(address)
            report[name] = 'connected'
    except OSError as error:
        report.setdefault(name, error.errno)
try:
    socket.socketpair()
    report['socketpair'] = 'open'
except OSError as error:
    report['socketpair'] = error.errno
print(json.dumps(report))
"""
MEMORY_BOMB = """
import os, time
children = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        held = b'x' * (200 << 20)
        time.sleep(10)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print('ok')
"""
CHMOD_000 = """
import os
for directory in ('kept', 'kept/deeper'):
    os.mkdir(directory)
    for index in range(3):
        open(f'{directory}/data{index}', 'wb').write(bytes(1 << 20))
os.chmod('kept/deeper', 0)
os.chmod('kept', 0)
try:
    os.chmod('.', 0)
except PermissionError:  # as root under bwrap the working directory is root's (mode 1777)
    pass
"""
USERS = ("root", "nobody")


def _hostile_programs(outside: Path, marker: str, port: int, secrets: list[str], unix_paths: list[str]) -> dict:
    """Attacks that print "ok" when they get through; spawned shells carry `marker` in their command line and try
    to plant a file in `outside` (a directory anyone may write to, outside every sandbox directory). `secrets` are
    host files the sandbox's user could read were it not for the sandbox; `unix_paths` are listening unix sockets
    on the host (a path and an abstract name, starting with NUL)."""
    target = str(outside / "planted")
    shell = f"echo x > {target}; while :; do sleep 1; done"
    planted = f"import os, time\ntime.sleep(0.5)\nif os.path.exists({target!r}):\n    print('ok')\n"
    read_environments = f"""
import os
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        if {SECRET!r} in open(f'/proc/{{pid}}/environ').read():
            print('ok')
            break
    except OSError:
        pass
"""
    libc_open = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
if libc.open({target.encode()!r}, os.O_WRONLY | os.O_CREAT, 0o666) < 0:
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
print('ok')
"""
    fork_exec = f"""
import _posixsubprocess, os
read_end, write_end = os.pipe()
_posixsubprocess.fork_exec(
    [b'/bin/sh', b'-c', {shell.encode()!r}, {marker.encode()!r}], [b'/bin/sh'], True, (write_end,), None, None,
    -1, -1, -1, -1, -1, -1, read_end, write_end, True, True, -1, None, None, None, -1, None, False,
)
"""
    fork = f"""
import os
if os.fork() == 0:
    os.setsid()
    os.execv('/bin/sh', ['sh', '-c', {shell!r}, {marker!r}])
"""
    return {
        "infinite loop": SandboxJob("while True:\n    pass\nprint('ok')", SandboxLimits(cpu_s=1, wall_s=10.0)),
        "fork flood": SandboxJob(
            DISARM_AUDIT_HOOK + "import os\nwhile True:\n    os.fork()\n", SandboxLimits(cpu_s=2, wall_s=3.0)
        ),
        "10 GB allocation": SandboxJob("x = bytearray(10 * 1024 ** 3)\nprint('ok')"),
        "write outside the working directory": SandboxJob(
            DISARM_AUDIT_HOOK + f"open({target!r}, 'w').write('x')\nprint('ok')"
        ),
        "socket to a live local server": SandboxJob(
            DISARM_AUDIT_HOOK
            + f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('ok')"
        ),
        "the parent's environment": SandboxJob(DISARM_AUDIT_HOOK + read_environments),
        "ctypes: libc open": SandboxJob(DISARM_AUDIT_HOOK + libc_open),
        "ctypes: libc system": SandboxJob(
            DISARM_AUDIT_HOOK + f"import ctypes\nctypes.CDLL(None).system({f'sh -c {shell!r} {marker} &'.encode()!r})\n"
            + planted
        ),
        "sys.modules: preloaded modules to borrow": SandboxJob(
            "import sys\nif {'ctypes', '_ctypes', '_posixsubprocess'} & set(sys.modules):\n    print('ok')\n"
        ),
        "_posixsubprocess.fork_exec": SandboxJob(fork_exec + planted),
        "posix.posix_spawn": SandboxJob(
            DISARM_AUDIT_HOOK
            + f"import posix\nposix.posix_spawn('/bin/sh', ['sh', '-c', {shell!r}, {marker!r}], {{}}, setsid=True)\n"
            + planted
        ),
        "os.fork": SandboxJob(DISARM_AUDIT_HOOK + fork + planted),
        "read a host file the user may read": SandboxJob(DISARM_AUDIT_HOOK + f"""
for path in {secrets!r} + ['/etc/passwd', '/etc/hostname', '/proc/1/environ']:
    try:
        if {SECRET!r} in open(path).read() or path.startswith('/etc/'):
            print('ok')
    except OSError:
        pass
"""),
        "sockets of every family": SandboxJob(DISARM_AUDIT_HOOK + SOCKET_FAMILIES.format(port=port, unix=unix_paths)),
        "eight children of 200 MB under memory_mb=256": SandboxJob(
            DISARM_AUDIT_HOOK + MEMORY_BOMB, SandboxLimits(cpu_s=10, wall_s=30.0, memory_mb=256)
        ),
        "150 MB into a 32 MB working directory": SandboxJob(
            "for index in range(10):\n    open(f'part{index}', 'wb').write(bytes(15 << 20))\nprint('ok')",
            SandboxLimits(cpu_s=5, wall_s=20.0, memory_mb=512, workdir_mb=32),
        ),
        "chmod 000 to stay on disk": SandboxJob(DISARM_AUDIT_HOOK + CHMOD_000),
    }


@pytest.fixture(scope="module")
def nobody():
    runner, reason = unprivileged.start({"SANDBOX_TEST_SECRET": SECRET})
    if runner is None:
        pytest.skip(reason)
    yield runner
    unprivileged.stop(runner)


@pytest.fixture(scope="module")
def nobody_layers(nobody) -> dict[str, bool]:
    return nobody.layers()


@pytest.fixture
def outside():
    """A directory anyone may write to, on the host."""
    path = Path(tempfile.mkdtemp(prefix=".sandbox-target-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def secrets():
    """Host files holding SECRET that the sandbox's user could read were it not for the sandbox: one of nobody's
    own, mode 0600, and one anyone may read (the sandbox's fresh uid as root can read only those)."""
    directory = Path(tempfile.mkdtemp(prefix=".sandbox-secrets-"))
    directory.chmod(0o755)
    own, public = directory / "nobody.key", directory / "public.key"
    for path, mode in ((own, 0o600), (public, 0o644)):
        path.write_text(SECRET)
        path.chmod(mode)
    os.chown(own, unprivileged.NOBODY, unprivileged.NOBODY)
    yield [str(own), str(public)]
    shutil.rmtree(directory)


@pytest.fixture
def unix_listeners():
    """Listening unix sockets on the host, a path (anyone may connect) and an abstract name: (addresses, accepted)."""
    directory = Path(tempfile.mkdtemp(prefix=".sandbox-unix-"))
    directory.chmod(0o755)
    path_server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path_server.bind(str(directory / "listener"))
    (directory / "listener").chmod(0o777)
    abstract_server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract_server.bind(f"\0sandbox-test-{uuid.uuid4().hex}")
    servers = [path_server, abstract_server]
    accepted: list = []
    for server in servers:
        server.listen()
        server.setblocking(False)
    yield [server.getsockname() for server in servers], accepted
    for server in servers:
        try:
            accepted.append(server.accept())
        except BlockingIOError:
            pass
        server.close()
    shutil.rmtree(directory)


@pytest.fixture
def live_server():
    """A local TCP server that records every connection it accepts: (port, accepted)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list = []
    done = threading.Event()

    def accept_for_a_while():
        while not done.is_set():
            try:
                accepted.append(server.accept())
            except (socket.timeout, OSError):
                continue

    listener = threading.Thread(target=accept_for_a_while)
    listener.start()
    yield server.getsockname()[1], accepted
    done.set()
    listener.join()
    server.close()


def _runner_for(user: str, layer: str, request):
    return unprivileged.for_user(
        user, layer, lambda: (request.getfixturevalue("nobody"), request.getfixturevalue("nobody_layers"))
    )


def _run_jobs(runner, jobs: list[SandboxJob], layer: str) -> list[sandbox.SandboxResult]:
    if runner is None:
        return [
            run_python(job.source, stdin=job.stdin, files=job.files, limits=job.limits, layer=layer) for job in jobs
        ]
    return runner.run(jobs, layer)


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and text.encode() in Path(entry.path, "cmdline").read_bytes():
                pids.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return pids


@pytest.mark.parametrize("layer", KERNEL_LAYERS)
@pytest.mark.parametrize("user", USERS)
def test_hostile_programs_get_nothing_and_leave_nothing(
    user, layer, request, outside, live_server, secrets, unix_listeners, monkeypatch, leaves_nothing_behind
):
    runner = _runner_for(user, layer, request)
    monkeypatch.setenv("SANDBOX_TEST_SECRET", SECRET)
    port, accepted = live_server
    unix_paths, unix_accepted = unix_listeners
    marker = f"sandbox-marker-{uuid.uuid4().hex}"
    programs = _hostile_programs(outside, marker, port, secrets, unix_paths)
    results = dict(zip(programs, _run_jobs(runner, list(programs.values()), layer)))
    assert {name: result.stderr[-300:] for name, result in results.items() if "ok" in result.stdout.split()} == {}
    # The kernel, not the disarmed audit hook, is what refused: nothing of the host is there to write to.
    assert "No such file or directory" in results["write outside the working directory"].stderr
    assert "No such file or directory" in results["ctypes: libc open"].stderr
    # The seccomp filter: no socket of any family, whatever the address.
    assert "Operation not permitted" in results["socket to a live local server"].stderr.splitlines()[-1]
    sockets = results["sockets of every family"]
    assert json.loads(sockets.stdout) == dict.fromkeys(
        ["tcp", "udp", "tcp6", "unix path", "unix abstract", "netlink", "socketpair"], errno.EPERM
    ), sockets.stderr
    assert list(outside.iterdir()) == [] and accepted == [] and unix_accepted == []
    # The sandbox as a whole: eight processes of 200 MB are killed together, not 1.6 GB held under a 256 MB limit.
    bomb = results["eight children of 200 MB under memory_mb=256"]
    assert bomb.returncode != 0 and not bomb.timed_out
    assert "sandbox: killed: its processes held" in bomb.stderr and "over memory_mb=256" in bomb.stderr
    assert "No space left on device" in results["150 MB into a 32 MB working directory"].stderr
    chmod = results["chmod 000 to stay on disk"]
    assert chmod.ok, chmod.stderr
    assert _processes_mentioning(marker) == []
    if runner is not None:
        assert _processes_mentioning(str(runner.directory)) == []


@pytest.mark.parametrize("layer", KERNEL_LAYERS)
@pytest.mark.parametrize("user", USERS)
def test_the_program_sees_only_the_interpreter_and_its_working_directory(
    user, layer, request, leaves_nothing_behind
):
    runner = _runner_for(user, layer, request)
    program = DISARM_AUDIT_HOOK + """
import json, os, sys
visible = []
for directory, subdirectories, files in os.walk('/'):
    if directory in ('/proc', '/dev'):
        subdirectories.clear()
        continue
    visible += [os.path.join(directory, name) for name in files]
report = {'uid': os.getuid(), 'top': sorted(os.listdir('/')), 'visible': visible, 'executable': sys.executable,
          'stdlib': os.path.dirname(os.__file__), 'pids': sorted(int(p) for p in os.listdir('/proc') if p.isdigit()),
          'dev': sorted(os.listdir('/dev'))}
for directory in ('/', '/etc', os.path.dirname(os.__file__), '/dev'):
    try:
        open(os.path.join(directory, 'planted'), 'w')
    except OSError as error:
        report.setdefault('write errors', []).append(error.strerror)
print(json.dumps(report))
"""
    (result,) = _run_jobs(runner, [SandboxJob(program)], layer)
    assert result.ok, result.stderr
    report = json.loads(result.stdout)
    entry = str(Path(sandbox._ENTRY).resolve()) if user == "root" else str(runner.directory / "sandbox_entry.py")
    # Of the host: the interpreter, its standard library (site-packages covered by an empty tmpfs), the shared
    # libraries they load, the dynamic linker's cache and the entry script; no /tmp, /home, /etc/passwd or /run.
    # Top-level names are those of the files shown, wherever the checkout and the interpreter live on this host,
    # besides the kernel's mounts and merged-/usr links.
    shown = {Path(path).parts[1] for path in report["visible"]}
    assert set(report["top"]) - shown <= {"dev", "proc", "etc", "bin", "sbin", "lib", "lib32", "lib64"}

    def expected(path: str) -> bool:
        name = os.path.basename(path)
        return (path == report["executable"] or path == entry or path == "/etc/ld.so.cache"
                or sandbox._is_under(path, sandbox._WORKDIR)
                or (sandbox._is_under(path, report["stdlib"]) and "site-packages" not in path)
                or ((".so." in name or name.endswith(".so")) and os.path.isfile(path)))

    assert [path for path in report["visible"] if not expected(path)] == []
    assert os.path.realpath(report["executable"]) == report["executable"]
    assert f"{sandbox._WORKDIR}/main.py" in report["visible"]
    assert not any(sandbox._is_under(path, "/tmp") or sandbox._is_under(path, "/home")
                   for path in report["visible"] if path != entry)  # the unprivileged driver's copy is in /tmp
    assert report["write errors"] == ["Read-only file system"] * 4
    assert set(report["dev"]) <= {"null", "zero", "full", "random", "urandom", "tty", "fd", "stdin", "stdout",
                                  "stderr", "pts", "ptmx", "shm", "core"}
    assert max(report["pids"]) <= 2  # a fresh PID namespace: its init and the program
    if user == "root":
        assert sandbox._UID_BASE <= report["uid"] < sandbox._UID_BASE + 1024
    else:
        assert report["uid"] == unprivileged.NOBODY


@pytest.mark.parametrize("layer", KERNEL_LAYERS)
@pytest.mark.parametrize("user", USERS)
def test_processes_are_bounded_per_sandbox_not_per_user(user, layer, request, leaves_nothing_behind):
    """Three sandboxes at once, each forking as much as it can under max_processes=8: each gets the same number,
    however many the others hold. As root each sandbox has a uid of its own; as an ordinary user the count is per
    user namespace (Linux 5.14 and later), and each sandbox has one."""
    runner = _runner_for(user, layer, request)
    if user == "nobody" and tuple(int(part) for part in os.uname().release.split(".")[:2]) < (5, 14):
        pytest.skip("before Linux 5.14 RLIMIT_NPROC counts every process of the user")
    program = DISARM_AUDIT_HOOK + """
import os, time
made = 0
for _ in range(20):
    try:
        if os.fork() == 0:
            time.sleep(2)
            os._exit(0)
    except OSError:
        break
    made += 1
print(made)
"""
    jobs = [SandboxJob(program, SandboxLimits(cpu_s=5, wall_s=20.0, memory_mb=512, max_processes=8))] * 3
    if runner is None:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda job: run_python(job.source, limits=job.limits, layer=layer), jobs))
    else:
        results = runner.run(jobs, layer, workers=3)
    made = [int(result.stdout) for result in results]
    # The program and its children, and bwrap's init where it runs as the same user (bwrap as an ordinary user).
    assert made == [6 if (user, layer) == ("nobody", "bwrap") else 7] * 3, [result.stderr[-300:] for result in results]


def test_cleanup_removes_what_a_program_locked_with_chmod_000_as_an_ordinary_user(nobody, tmp_path):
    """Without a kernel layer the working directory is the host's: what the program made unreadable (000) is
    removed all the same, and a symlink it planted does not turn the cleanup's chmod onto the file it names."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    victim.chmod(0o600)
    os.chown(victim, unprivileged.NOBODY, unprivileged.NOBODY)
    tmp_path.chmod(0o755)
    script = f"""
import importlib.util, os, sys, tempfile
from pathlib import Path
spec = importlib.util.spec_from_file_location("sandbox", {str(nobody.directory / "sandbox.py")!r})
sandbox = importlib.util.module_from_spec(spec)
sys.modules["sandbox"] = sandbox
spec.loader.exec_module(sandbox)
workdir = tempfile.mkdtemp(prefix="sandbox-cleanup-")
os.makedirs(workdir + "/kept/deeper")
for directory in ("kept", "kept/deeper"):
    open(f"{{workdir}}/{{directory}}/data", "w").write("x")
os.symlink({str(victim)!r}, workdir + "/kept/deeper/link")
for directory in ("kept/deeper", "kept", ""):
    os.chmod(os.path.join(workdir, directory), 0)
sandbox._remove_tree(Path(workdir))
print(os.path.lexists(workdir))
"""
    completed = subprocess.run(
        ["setpriv", f"--reuid={unprivileged.NOBODY}", f"--regid={unprivileged.NOBODY}", "--clear-groups", "--",
         nobody.python, "-I", "-c", script], capture_output=True, text=True, cwd="/", timeout=60,
    )
    assert completed.stdout == "False\n", completed.stderr
    assert victim.stat().st_mode & 0o777 == 0o600 and victim.read_text() == "keep"


def test_the_strongest_layer_that_works_is_chosen(monkeypatch):
    if not sandbox.layer_works("unshare"):
        pytest.skip("namespaces do not work here")
    assert sandbox.isolation_layer() == ("bwrap" if sandbox.layer_works("bwrap") else "unshare")
    if shutil.which("bwrap"):
        assert sandbox.layer_works("bwrap")
    monkeypatch.setattr(sandbox, "layer_works", lambda layer: layer == "unshare")
    assert sandbox.isolation_layer() == "unshare"
    monkeypatch.setattr(sandbox, "layer_works", lambda layer: False)
    assert sandbox.isolation_layer() == "none"


def test_without_a_kernel_layer_untrusted_code_is_refused_unless_allowed(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "layer_works", lambda layer: False)
    with pytest.raises(SandboxUnavailable) as refusal:
        run_python("print('ok')", limits=FAST)
    for fix in ("bubblewrap", "kernel.unprivileged_userns_clone=1", "kernel.apparmor_restrict_unprivileged_userns=0",
                "--allow_unsandboxed_code"):
        assert fix in str(refusal.value)
    with pytest.raises(SandboxUnavailable):
        _scores("print('ok')")
    monkeypatch.setitem(sandbox._unsandboxed, "warned", False)
    sandbox.allow_unsandboxed_code()
    try:
        with caplog.at_level(logging.WARNING, logger=sandbox.__name__):
            result = run_python("print('ok')", limits=FAST)
    finally:
        sandbox.allow_unsandboxed_code(False)
    assert result.ok and result.stdout == "ok\n"
    assert "WITHOUT a kernel sandbox" in caplog.text
    with pytest.raises(SandboxUnavailable):
        run_python("print('ok')", limits=FAST)

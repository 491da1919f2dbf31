"""The sandbox: limits hold, malicious programs score 0, nothing is left behind, the caller survives."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from env.tasks import sandbox
from env.tasks.base import Task
from env.tasks.code import CodeTests, grade_code
from env.tasks.sandbox import SandboxLimits, network_isolation, run_python

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
    assert _sandbox_processes() == []
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
        domain="test",
        question="",
        gold=CodeTests(kind="stdin", cases=(("", expected_stdout),), limits=limits),
        grader=grade_code,
    )
    return task.grade(f"```python\n{program}\n```")


def test_a_normal_program_reads_stdin_and_writes_stdout(leaves_nothing_behind):
    result = run_python("name = input()\nprint(f'hello {name}')", stdin="sandbox\n", limits=FAST)
    assert result.ok and result.stdout == "hello sandbox\n" and result.stderr == ""
    assert _scores("print('ok')") == 1.0


def test_program_runs_in_its_own_temp_dir_with_scrubbed_environment_and_no_root(leaves_nothing_behind):
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
    assert Path(cwd).name.startswith("sandbox-") and not Path(cwd).exists()
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
    start = time.perf_counter()
    assert _scores("while True:\n    pass", limits=SandboxLimits(cpu_s=1, wall_s=10.0)) == 0.0
    assert time.perf_counter() - start < 9.0


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


def test_opening_a_socket_to_a_live_local_server_fails(leaves_nothing_behind):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []
    done = threading.Event()

    def accept_for_a_while():
        while not done.is_set():
            try:
                accepted.append(server.accept())
            except (socket.timeout, OSError):
                continue

    listener = threading.Thread(target=accept_for_a_while)
    listener.start()
    try:
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('ok')"
        assert _scores(program) == 0.0
    finally:
        done.set()
        listener.join()
        server.close()
    assert accepted == []


@pytest.mark.skipif(network_isolation() != "namespace", reason="network namespaces are not permitted here")
def test_network_namespace_alone_blocks_connections():
    """The kernel layer without the audit hook: plain Python in `unshare --net` cannot reach our server."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        probe = subprocess.run(
            ["unshare", "--net", sys.executable, "-c",
             f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"],
            capture_output=True, text=True, timeout=30,
        )
    finally:
        server.close()
    assert probe.returncode != 0
    assert "Errno" in probe.stderr or "unreachable" in probe.stderr.lower()


def test_output_flood_is_cut_by_the_file_size_limit(leaves_nothing_behind):
    limits = SandboxLimits(cpu_s=5, wall_s=10.0, max_file_mb=1, max_output_chars=10_000)
    result = run_python("while True:\n    print('x' * 1000)", limits=limits)
    assert not result.ok and len(result.stdout) == 10_000


def test_limits_are_validated():
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(ValueError, match="cpu_s must be an int"):
        SandboxLimits(cpu_s=1.5)
    with pytest.raises(ValueError, match="plain relative path"):
        run_python("pass", files={"../escape.py": ""})

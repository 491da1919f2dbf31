"""Runs sandbox jobs as an unprivileged user (nobody), for tests that check the sandbox holds for a user who is not
root: a small driver, started under `setpriv` with a Python that user can read, loads a copy of
env/tasks/sandbox.py (in a directory that user can read) and runs each job through `run_python`."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pytest

from env.tasks import sandbox
from env.tasks.sandbox import SandboxLimits, SandboxResult

NOBODY = 65534
_SANDBOX_FILES = (Path(sandbox.__file__), Path(sandbox.__file__).with_name("sandbox_entry.py"))
_DRIVER = """\
import concurrent.futures, dataclasses, importlib.util, json, sys
directory, request = sys.argv[1], json.load(sys.stdin)
spec = importlib.util.spec_from_file_location("sandbox", directory + "/sandbox.py")
sandbox = importlib.util.module_from_spec(spec)
sys.modules["sandbox"] = sandbox
spec.loader.exec_module(sandbox)
if request["probe"]:
    print(json.dumps({layer: sandbox.layer_works(layer) for layer in sandbox.KERNEL_LAYERS}))
else:
    def run(job):
        layer = {"layer": job["layer"]} if job["layer"] else {}
        limits = sandbox.SandboxLimits(**job["limits"])
        result = sandbox.run_python(job["source"], stdin=job["stdin"], files=job["files"], limits=limits, **layer)
        return dataclasses.asdict(result)
    with concurrent.futures.ThreadPoolExecutor(request["workers"]) as pool:
        print(json.dumps(list(pool.map(run, request["jobs"]))))
"""


@dataclasses.dataclass(frozen=True)
class SandboxJob:
    source: str
    limits: SandboxLimits = SandboxLimits(cpu_s=2, wall_s=5.0, memory_mb=512)
    stdin: str = ""
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)


class Unprivileged:
    """The driver's copy of the sandbox and the Python it runs with; `directory` appears in the command line of
    every sandboxed process it starts (the entry script's path)."""

    def __init__(self, python: str, directory: Path, environment: Mapping[str, str]):
        self.python = python
        self.directory = directory
        self.environment = dict(environment)

    def layers(self) -> dict[str, bool]:
        """Which kernel layers work for this user."""
        return self._drive({"probe": True})

    def run(self, jobs: Sequence[SandboxJob], layer: str | None = None, workers: int = 1) -> list[SandboxResult]:
        """The result of each job, run `workers` at a time under `layer` (default: the strongest that works)."""
        request = {
            "probe": False,
            "workers": workers,
            "jobs": [
                {"source": job.source, "stdin": job.stdin, "files": dict(job.files),
                 "limits": dataclasses.asdict(job.limits), "layer": layer}
                for job in jobs
            ],
        }
        return [SandboxResult(**result) for result in self._drive(request)]

    def _drive(self, request: dict):
        completed = subprocess.run(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
             self.python, "-I", "-c", _DRIVER, str(self.directory)],
            input=json.dumps(request), capture_output=True, text=True, cwd="/", env=self.environment, timeout=600,
        )
        if completed.returncode != 0:
            raise RuntimeError(f"the unprivileged driver failed:\n{completed.stderr}")
        return json.loads(completed.stdout)


def start(environment: Mapping[str, str] | None = None) -> tuple[Unprivileged | None, str]:
    """An `Unprivileged` runner, or None and why not. Needs root (to switch user) and a Python nobody can run."""
    if os.getuid() != 0:
        return None, "switching to an unprivileged user needs root"
    if shutil.which("setpriv") is None:
        return None, "setpriv (util-linux) is not installed"
    python = next((candidate for candidate in (sys.executable, "/usr/bin/python3") if _runs_as_nobody(candidate)), None)
    if python is None:
        return None, f"no Python that uid {NOBODY} can run (tried {sys.executable} and /usr/bin/python3)"
    directory = Path(tempfile.mkdtemp(prefix="unprivileged-driver-"))
    directory.chmod(0o755)
    for source in _SANDBOX_FILES:
        target = directory / source.name
        shutil.copyfile(source, target)
        target.chmod(0o644)
    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    return Unprivileged(python, directory, {**base, **(environment or {})}), ""


def stop(runner: Unprivileged) -> None:
    shutil.rmtree(runner.directory, ignore_errors=True)


def for_user(user: str, layer: str, unprivileged: Callable[[], tuple[Any, Mapping[str, bool]]]) -> Any:
    """What a test runs `layer` through as `user`: None for root (this process itself), else the first of what
    `unprivileged()` gives, with which layers work for nobody as the second (called only then, so a root-only run
    starts no driver). Skips where `layer` does not work for `user`."""
    if user == "root":
        if os.getuid() != 0:
            pytest.skip("this process is not root")
        if not sandbox.layer_works(layer):
            pytest.skip(f"the {layer} layer does not work here (is it installed?)")
        return None
    runner, layers = unprivileged()
    if not layers[layer]:
        pytest.skip(f"the {layer} layer does not work here for an unprivileged user (is it installed?)")
    return runner


def _runs_as_nobody(python: str) -> bool:
    try:
        probe = subprocess.run(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", python, "-I", "-c",
             "import dataclasses, json, resource, sys; open(sys.executable, 'rb').close()"],
            capture_output=True, cwd="/", timeout=60,
        )
    except OSError:
        return False
    return probe.returncode == 0

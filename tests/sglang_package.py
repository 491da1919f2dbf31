"""SGLang 0.5.23's own Python code, for conformance tests that need no GPU.

The full `sglang` install pulls CUDA torch, flashinfer and friends (gigabytes), so the tests install the package
WITHOUT its dependencies into a cache directory, plus the few small packages that its request, argument and HTTP
modules import at module level (`LIGHT_DEPENDENCIES`, pinned to what sglang 0.5.23 pins where it pins). That
directory is only ever put on `sys.path` of a separate process (`import_sglang`), never of the test process:
SGLang's modules import thousands of others and stand in for two GPU-only packages (below), which must not leak
into the other tests.

Two packages are never installed: `triton` (286 MB, GPU kernels) is replaced by SGLang's own stub, the one it
installs on Apple silicon where triton does not exist (`sglang._platform_stubs`); `torchvision` (whose PyPI
build only loads with CUDA torch) becomes an empty placeholder package, after transformers has recorded it as
absent, for the image-processing modules that `sglang.srt.configs` imports and no test calls.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import types
import unittest.mock

SGLANG_VERSION = "0.5.23"
LIGHT_DEPENDENCIES = (
    "msgspec==0.22.0",
    "pyzmq==27.3.0",
    "pybase64==1.5.1",
    "starlette==1.10.0",
    "fastapi==0.165.0",
    "uvicorn==0.54.0",
    "python-multipart==0.0.34",
    "apache-tvm-ffi==0.1.11",
    "sentencepiece==0.2.1",
    "compressed-tensors==0.18.0",
    "xgrammar==0.2.7",
    "loguru==0.7.3",
    "partial-json-parser==0.2.1.1.post7",
    "setproctitle==1.3.8",
    "einops==0.8.2",
    "soundfile==0.14.0",
    "orjson==3.13.0",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==0.30.0",
)
REQUIREMENTS = (f"sglang=={SGLANG_VERSION}", *LIGHT_DEPENDENCIES)
# pip's words for an index it could not reach, or that lists no sglang at all ("from versions: none"), as opposed
# to a package or version it could not install.
_UNREACHABLE = ("Failed to establish a new connection", "Temporary failure in name resolution",
                "Network is unreachable", "Connection refused", "ConnectTimeoutError", "ReadTimeoutError",
                "No route to host", "Max retries exceeded", "ProxyError",
                f"requirement sglang=={SGLANG_VERSION} (from versions: none)")


class IndexUnreachable(RuntimeError):
    """pip could not reach the package index."""


def cache_dir() -> pathlib.Path:
    """Where the packages go: one directory per requirement set, under $XDG_CACHE_HOME (else ~/.cache)."""
    root = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    digest = hashlib.sha256("\n".join(REQUIREMENTS).encode()).hexdigest()[:12]
    return root / "conductor-rl" / "test-sglang" / f"sglang-{SGLANG_VERSION}-{digest}"


def install(target: pathlib.Path | None = None) -> pathlib.Path:
    """The directory holding `REQUIREMENTS`, installed once (`pip install --no-deps --target`) and reused.

    The install lands in a temporary sibling and is renamed into place, so an interrupted install is never
    mistaken for a finished one; a lock file serialises concurrent test processes. Raises IndexUnreachable when
    pip cannot reach the index, RuntimeError (with pip's output) for any other failure.
    """
    target = target or cache_dir()
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_dir():
            return target
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        try:
            result = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-input",
                 "--disable-pip-version-check", "--target", str(staging), *REQUIREMENTS],
                capture_output=True, text=True, timeout=900,
            )
            if result.returncode != 0:
                output = (result.stdout + result.stderr).strip()
                error = IndexUnreachable if any(word in output for word in _UNREACHABLE) else RuntimeError
                raise error(f"pip install --no-deps {' '.join(REQUIREMENTS)} failed:\n{output[-2000:]}")
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


class _Placeholder(types.ModuleType):
    """A package with no contents: importing it and its submodules works, using any name in it does not."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__ = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)


class _PlaceholderFinder:
    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.package and not fullname.startswith(self.package + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _Placeholder(spec.name)

    def exec_module(self, module):
        pass


def _notebook_display_stand_in() -> None:
    """`sglang.utils` imports IPython's notebook display helpers at module level; no test displays anything, and
    IPython with its dependencies is not worth installing for that."""

    def unavailable(*args, **kwargs):
        raise RuntimeError("IPython is not installed in the SGLang test environment")

    ipython = types.ModuleType("IPython")
    ipython.__path__ = []
    display = types.ModuleType("IPython.display")
    display.HTML = display.display = unavailable
    ipython.display = display
    sys.modules["IPython"], sys.modules["IPython.display"] = ipython, display


def import_sglang(site: str | os.PathLike) -> None:
    """Makes `import sglang.srt...` work in this process, from the packages in `site`.

    Call it once, first thing, in a process of its own. `sglang/__init__.py` (the frontend language: it imports
    every model runtime) is skipped: `sglang` becomes a bare package over the installed directory, so only the
    modules a test names, and what they import, load.
    """
    site = str(site)
    sys.path.insert(0, site)
    package = types.ModuleType("sglang")
    package.__path__ = [os.path.join(site, "sglang")]
    sys.modules["sglang"] = package

    import torch
    import transformers.utils.import_utils as transformers_imports

    # Transformers caches what it finds installed; it must find torchvision absent before the placeholder exists.
    transformers_imports.is_torchvision_available()
    transformers_imports.is_torchvision_greater_or_equal("0")
    transformers_imports.is_torchvision_v2_available()
    from sglang import _platform_stubs

    # SGLang installs its triton stub only where it runs without triton (macOS on Apple silicon); the same stub
    # serves a CPU-only Linux host. The torch.mps shims it also installs are unused here.
    with contextlib.ExitStack() as patches:
        patches.enter_context(unittest.mock.patch.object(sys, "platform", "darwin"))
        patches.enter_context(unittest.mock.patch.object(platform, "machine", lambda: "arm64"))
        patches.enter_context(unittest.mock.patch.object(torch.backends.mps, "is_available", lambda: True))
        _platform_stubs.install_platform_stubs()
    sys.meta_path.insert(0, _PlaceholderFinder("torchvision"))
    if importlib.util.find_spec("IPython") is None:
        _notebook_display_stand_in()

import os
import shutil
import tempfile

import pytest

from conductor.host_memory import retain_freed_memory

# The directory of the cache the tests' subprocesses share (`_share_a_cache_between_the_runs_tests_start`).
SUBPROCESS_CACHE = "CONDUCTOR_TESTS_JAX_CACHE"
_CREATED_CACHE: str | None = None  # set in the process that created it, which deletes it

# Time limits with stacks (tests/fail_fast.py), `--cpu-durations` (tests/cpu_durations.py) and a bound on memory maps
# (tests/map_limit.py).
pytest_plugins = ["tests.fail_fast", "tests.cpu_durations", "tests.map_limit"]

# As the entry points do, before JAX and torch start their threads: XLA's freed buffers stay mapped between calls.
retain_freed_memory()

# Tests run on the CPU; eight host devices let the sharding tests build a real (fsdp, tp) mesh.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


CHEAP_CODEGEN = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def with_default_codegen(environment: dict[str, str]) -> dict[str, str]:
    """`environment` for a process that compiles with XLA's default codegen: a run long enough that its steps outweigh
    its compiles, started as a user starts it (the e2e test's; decision 032 has the measurements)."""
    flags = [flag for flag in environment.get("XLA_FLAGS", "").split() if flag not in CHEAP_CODEGEN]
    return {**environment, "XLA_FLAGS": " ".join(flags)}


def _compile_with_cheap_codegen() -> None:
    """Compiles with LLVM's optimisation off and XLA's older fusion emitters, in this process and in every process the
    tests start, and starts this process's CPU backend with them.

    The suite compiles thousands of small programs that then run for milliseconds, so compiling is most of its time.
    XLA:CPU's MLIR fusion emitters (its default) take about four times as long to compile a program as the older
    emitters (tests/rl/test_learner.py's 85 programs of one test: 33.9 s of XLA compile against 8.6 s), and LLVM's
    passes most of the rest. The runs the tests start are a few iterations long, so they too spend more on compiling
    than the slower steps cost them (decision 032). The README's main job, which CI runs as a user does, keeps XLA's
    default, and so does a longer run a test starts with `with_default_codegen`. Neither flag turns on fast-math or
    reassociation; the values the tests compare stay within their tolerances under both. XLA reads XLA_FLAGS once,
    when the backend starts, hence the start here."""
    os.environ["XLA_FLAGS"] = " ".join([os.environ["XLA_FLAGS"], *CHEAP_CODEGEN])
    import jax

    jax.devices()


def _compile_in_process_without_a_persistent_cache() -> None:
    """No persistent compilation cache in the test run's own processes (the master and the xdist workers).

    The suite once shared one cache directory between its processes. Workers then died of segfaults inside the
    cache's two native calls, XLA:CPU's executable deserialisation (`get_executable_and_time`) and serialisation
    (`put_executable_and_time`). The same crash came later with no cache, in XLA's compile, and its cause was found
    there (issue 61; tests/map_limit.py): a worker at the kernel's limit on memory maps, where whatever maps next
    fails; reading or writing an executable is likely one such call. A worker compiles thousands of programs, most in
    well under a second (JAX would write none of those), so its tests stay cold, as on CI, and a user's own cache is
    not used."""
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)


def _share_a_cache_between_the_runs_tests_start() -> None:
    """One persistent cache, new for each test run, for the programs the tests start (`launch.train`, `launch.compare`,
    the multi-host pair): run after run, they compile the same programs. JAX's threshold
    stays: only programs that took a second or more to compile are written.

    Set after this process's JAX has read its own settings, so only the subprocesses see it. The master creates the
    directory, its xdist workers inherit the variable, and the master deletes it when the run ends. Processes far
    below the map limit (a run starts, compiles a few dozen programs and ends) write and read it safely. A size bound
    is what makes JAX's LRUCache take its file lock around each read and write (unbounded, a reader can load the half
    written file of a concurrent writer), so it is set here for every subprocess, as `rl.compiles` sets it for the
    entry points."""
    global _CREATED_CACHE
    directory = os.environ.get(SUBPROCESS_CACHE)
    if not directory:
        directory = _CREATED_CACHE = tempfile.mkdtemp(prefix="conductor-tests-jax-")
        os.environ[SUBPROCESS_CACHE] = directory
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "true"
    os.environ["JAX_COMPILATION_CACHE_DIR"] = directory
    os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(8 << 30)


def _one_thread_each_where_the_workers_fill_the_cores() -> None:
    """With as many xdist workers as cores, one thread for torch, BLAS and XLA's Eigen kernels in each worker and in
    every process the tests start (`launch.train` as a user runs it), as `launch.compare` pins its runs
    (`sweeps.runner`): each core already has a worker, so a second thread per pool only contends with the other
    worker's. Measured beside two busy cores: the e2e test's run 169 CPU-s against 209 with the default pools, at the
    same wall time; tests/rl/test_learner.py 288 against 303."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < len(os.sched_getaffinity(0)):
        return
    from sweeps.runner import thread_environment

    os.environ.update(thread_environment(os.environ, 1))


_compile_in_process_without_a_persistent_cache()
_one_thread_each_where_the_workers_fill_the_cores()  # before this process's JAX reads XLA_FLAGS
_compile_with_cheap_codegen()
_share_a_cache_between_the_runs_tests_start()

GIB = 1 << 30
# A worker's process grows to 8 GiB over the suite (freed host memory stays mapped), and a training run it starts
# holds 2-3 GiB more.
WORKER_MEMORY = 10 * GIB


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core this process may use, as many as the available memory holds."""
    cores = len(os.sched_getaffinity(0))
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        available_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:"))
    return max(1, min(cores, available_kib * 1024 // WORKER_MEMORY))


def pytest_unconfigure(config):
    if _CREATED_CACHE:
        shutil.rmtree(_CREATED_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def sglang_site():
    """SGLang 0.5.23's package directory for the SGLang conformance tests (tests/sglang_package.py): installed
    without its dependencies into the user cache once per machine. A user offline skips them; CI (`CI` set, as
    `.ci/run` runs) must run them, so there an unreachable index is a failure."""
    from tests import sglang_package

    try:
        return sglang_package.install()
    except sglang_package.IndexUnreachable as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(
            f"SGLang conformance tests need sglang=={sglang_package.SGLANG_VERSION} from the package index: {error}"
        )


def pytest_collection_modifyitems(config, items):
    """Slow tests first, so the minutes-long files start before the short ones rather than after them. The sort is
    stable: the slow tests keep their order among themselves, and so do the rest. Under `--dist loadfile` the workers
    take files in this order only with `--no-loadscope-reorder` (pyproject's addopts); xdist's default hands out the
    files with the most tests first, which put the few-test, minutes-long files last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)

import os

import pytest

from launch.host_memory import retain_freed_memory

# As the entry points do, before JAX and torch start their threads: XLA's freed buffers stay mapped between calls.
retain_freed_memory()

# Tests run on the CPU; eight host devices let the sharding tests build a real (fsdp, tp) mesh.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


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

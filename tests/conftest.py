import os

from launch.host_memory import retain_freed_memory

# As the entry points do, before JAX and torch start their threads: XLA's freed buffers stay mapped between calls.
retain_freed_memory()

# Tests run on the CPU; eight host devices let the sharding tests build a real (fsdp, tp) mesh.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

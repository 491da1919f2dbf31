"""What an entry point's console shows (`conductor.console`)."""

from __future__ import annotations

from absl import flags

LIBRARY_LOGS = flags.DEFINE_boolean(
    "library_logs", False,
    "Show other libraries' INFO logs (orbax, JAX, transformers) and progress bars; absl's --verbosity=1 does too.",
)

"""What an entry point prints: the project's own progress at INFO, other libraries' chatter only when asked.

A training run's console is read by a person: the warm-start's progress, one line per iteration and the summary.
Libraries log far more than that at INFO (orbax's checkpoint internals, JAX's backend probing, transformers'
progress bars), so by default they speak only at WARNING and above. `library_logs` (the flag `--library_logs`), or
absl's own `--verbosity=1` and up, restores everything.
"""

from __future__ import annotations

import logging

from absl import logging as absl_logging

# `__main__` is the entry point itself, run as `python -m launch.NAME`.
OWN_LOGGERS = ("__main__", "conductor", "env", "launch", "models", "rl", "rollout")
# math-verify warns on every grader thread that its signal-based timeout is off; graders run in worker threads,
# where signals cannot interrupt, so that is the intended setting and the warning says nothing new.
_SILENCED_LOGGERS = ("math_verify",)


def configure(library_logs: bool) -> None:
    """Call first in an entry point's `main`: our packages log at INFO, libraries at WARNING unless `library_logs` or
    absl's verbosity is 1 and up."""
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    if library_logs or absl_logging.get_verbosity() >= 1:
        library_level = logging.DEBUG if absl_logging.get_verbosity() >= 1 else logging.INFO
        for name in ("", "absl"):
            logging.getLogger(name).setLevel(library_level)
        return
    # Orbax logs through absl's logger, whose level absl sets from --verbosity; our code never uses it.
    for name in ("", "absl"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in _SILENCED_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()

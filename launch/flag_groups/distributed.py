"""Multi-host flags: whether an entry point joins a multi-process run, and how (`conductor.distributed`)."""

from __future__ import annotations

from absl import flags

from conductor.distributed import DistributedConfig
from launch.flag_groups import field_choices, field_values

_FIELDS = {
    "mode": flags.DEFINE_enum(
        "distributed", "auto", field_choices(DistributedConfig, "mode"),
        "Join a multi-process run through jax.distributed.initialize: auto (when --coordinator_address, "
        "--num_processes or --process_id is given, or under a SLURM step or Open MPI job of several processes), on "
        "(always; JAX detects what the flags leave out, as on a TPU pod slice), off.",
    ),
    "coordinator_address": flags.DEFINE_string(
        "coordinator_address", None,
        "host:port of process 0, reachable from every process (jax.distributed.initialize's coordinator_address).",
    ),
    "num_processes": flags.DEFINE_integer(
        "num_processes", None, "Processes in the run, one per host.", lower_bound=1
    ),
    "process_id": flags.DEFINE_integer(
        "process_id", None, "This process's index, 0 .. num_processes - 1.", lower_bound=0
    ),
    "heartbeat_timeout_s": flags.DEFINE_integer(
        "distributed_heartbeat_timeout_s", 100,
        "Seconds without a process's heartbeat after which the coordination service ends every other process.",
        lower_bound=1,
    ),
    "init_timeout_s": flags.DEFINE_integer(
        "distributed_init_timeout_s", 300, "Seconds the processes wait for each other to start.", lower_bound=1
    ),
    "shutdown_timeout_s": flags.DEFINE_integer(
        "distributed_shutdown_timeout_s", 3600,
        "Seconds the processes wait at the end of a run for the last of them (launch.train's process 0 runs the "
        "end-of-run evaluation alone while the others wait), before the run fails.",
        lower_bound=1,
    ),
}


def from_flags() -> DistributedConfig:
    return DistributedConfig(**field_values(_FIELDS))

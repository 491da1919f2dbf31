"""Multi-host runs: one process per host, joined by JAX's own multi-controller runtime (`jax.distributed`).

`initialize()` is the first call of every entry point that runs the learner (`launch.train`, `launch.sft`,
`launch.benchmark`), before any JAX computation. Whether it joins a distributed run is `--distributed`:
- `auto` (default): when `--coordinator_address`, `--num_processes` or `--process_id` is given, or when the job is a
  SLURM step of several tasks (`srun`, SLURM_NTASKS > 1) or an Open MPI job of several ranks (`mpirun`,
  OMPI_COMM_WORLD_SIZE > 1); otherwise the run is one process.
- `on`: always; what the flags leave out JAX detects itself (Cloud TPU VM metadata, SLURM, Open MPI). A TPU pod slice
  needs `on`: its workers are found through the TPU metadata server, which `auto` does not query.
- `off`: never, whatever the environment.

Once joined, `jax.devices()` lists every process's devices, and the learner's mesh (`--mesh_fsdp` x `--mesh_tp`)
must cover all of them (`learner_mesh`). CPU collectives go through gloo, so CPU hosts (and the tests, two processes
on one machine) run the same code as GPU and TPU hosts.

A process that dies takes the run down: the coordination service stops hearing its heartbeat and, within
`--distributed_heartbeat_timeout_s`, ends every other process with JAX's "Terminating process because the JAX
distributed service detected fatal errors ... The following tasks are unhealthy (stopped sending heartbeats): <ids>"
(exit status 134). A process that never starts keeps the others waiting `--distributed_init_timeout_s` at startup,
then they fail with a connection error. Rerun the same commands on every host to resume from the last checkpoint.
At the end of `launch.train`, process 0 writes the final Conductor and evaluates it alone while the others wait for
it (`wait_for_every_process`), at most `--distributed_shutdown_timeout_s`.
"""

from __future__ import annotations

import logging
import os
import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import flags
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from models.sharding import make_mesh

_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "on", "off"],
    "Join a multi-process run through jax.distributed.initialize: auto (when --coordinator_address, --num_processes "
    "or --process_id is given, or under a SLURM step or Open MPI job of several processes), on (always; JAX detects "
    "what the flags leave out, as on a TPU pod slice), off.",
)
_COORDINATOR_ADDRESS = flags.DEFINE_string(
    "coordinator_address", None,
    "host:port of process 0, reachable from every process (jax.distributed.initialize's coordinator_address).",
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the run, one per host.", lower_bound=1)
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index, 0 .. num_processes - 1.", lower_bound=0)
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    "distributed_heartbeat_timeout_s", 100,
    "Seconds without a process's heartbeat after which the coordination service ends every other process.",
    lower_bound=1,
)
_INIT_TIMEOUT = flags.DEFINE_integer(
    "distributed_init_timeout_s", 300, "Seconds the processes wait for each other to start.", lower_bound=1
)
_SHUTDOWN_TIMEOUT = flags.DEFINE_integer(
    "distributed_shutdown_timeout_s", 3600,
    "Seconds the processes wait at the end of a run for the last of them (launch.train's process 0 runs the "
    "end-of-run evaluation alone while the others wait), before the run fails.",
    lower_bound=1,
)

log = logging.getLogger(__name__)


def _cluster_of_several_processes() -> bool:
    """A SLURM step or an Open MPI job with more than one process, the environments JAX reads its settings from."""
    slurm = "SLURM_JOB_ID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1
    open_mpi = "OMPI_MCA_orte_hnp_uri" in os.environ and int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
    return slurm or open_mpi


def requested() -> bool:
    """Whether `--distributed` and the environment ask for a multi-process run."""
    if _DISTRIBUTED.value != "auto":
        return _DISTRIBUTED.value == "on"
    given = (_COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    return any(value is not None for value in given) or _cluster_of_several_processes()


def initialize() -> None:
    """Joins the distributed run when one is requested (see the module docstring); call before any JAX computation."""
    if not requested():
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=_COORDINATOR_ADDRESS.value,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
        initialization_timeout=_INIT_TIMEOUT.value,
        heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT.value,
        shutdown_timeout_seconds=_SHUTDOWN_TIMEOUT.value,
    )
    log.info(
        "process %d of %d: %d local devices, %d in all", jax.process_index(), jax.process_count(),
        jax.local_device_count(), jax.device_count(),
    )


def wait_for_every_process(barrier: str) -> None:
    """Returns once every process has called it with the same `barrier` name (at once in a one-process run), or fails
    after `--distributed_shutdown_timeout_s`. The processes that finish first wait here, not at JAX's exit barrier:
    had they exited, that barrier's timeout would have ended the run, process 0's evaluation with it."""
    if jax.process_count() > 1:
        ocp.multihost.get_jax_distributed_client().wait_at_barrier(barrier, _SHUTDOWN_TIMEOUT.value * 1000)


def is_main_process() -> bool:
    """Process 0, the one that writes metrics, TensorBoard events, rollouts.jsonl, the final Conductor and reports."""
    return jax.process_index() == 0


def process_dir(directory: pathlib.Path) -> pathlib.Path:
    """Where this process writes what is its own (the generator's starting weights, disk-sync checkpoints):
    `directory` itself for process 0, `directory/process<p>` for the others, so that processes sharing a file system
    never write the same file."""
    return directory if is_main_process() else directory / f"process{jax.process_index()}"


def learner_mesh(fsdp: int, tp: int) -> Mesh | None:
    """The learner's `(fsdp, tp)` mesh over the devices of every process (None: one device, one process). In a
    multi-process run it must hold every device: a process with no device in the mesh would have no part in it."""
    if jax.process_count() > 1 and fsdp * tp != jax.device_count():
        raise ValueError(
            f"--mesh_fsdp={fsdp} x --mesh_tp={tp} must equal the {jax.device_count()} devices of all "
            f"{jax.process_count()} processes ({jax.local_device_count()} each)"
        )
    if fsdp * tp == 1:
        return None
    return make_mesh(fsdp=fsdp, tp=tp)


def share_process_zero_weights(model: nnx.Module) -> None:
    """Sets every process's copy of `model`'s parameters to process 0's (a no-op in one process). After a warm-start
    that each process ran on its own, the learner then shards one set of weights, whatever a worker pool's draws
    did on each host."""
    if jax.process_count() == 1:
        return
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(jax.numpy.asarray, multihost_utils.broadcast_one_to_all(params)))


def host_copy(model: nnx.Module) -> nnx.Module:
    """`model` with every parameter whole on this host, for writing it out (`models.hf_io.save`). A collective
    in a multi-process run: every process calls it, in the same order."""
    if jax.process_count() == 1:
        return model
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def whole(value: Any) -> Any:
        if isinstance(value, jax.Array) and not value.is_fully_addressable:
            return jax.numpy.asarray(multihost_utils.process_allgather(value, tiled=True))
        return value

    return nnx.merge(graphdef, jax.tree.map(whole, params), rest)

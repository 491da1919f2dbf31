"""Multi-host runs: one process per host, joined by JAX's own multi-controller runtime (`jax.distributed`).

`initialize()` is the first call of every entry point that runs the learner (`launch.train`, `launch.sft`,
`launch.benchmark`), before any JAX computation. Whether it joins a distributed run is `DistributedConfig.mode`
(`--distributed`; the flags of this module's settings are in launch/flag_groups/distributed.py):
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

import dataclasses
import logging
import os
import pathlib
from typing import Any, Literal, get_args

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from models.sharding import make_mesh

Mode = Literal["auto", "on", "off"]


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """Whether and how a process joins a multi-process run (the module docstring; launch's flags of the same names).

    `mode` auto, on or off; `coordinator_address` host:port of process 0, reachable from every process;
    `num_processes` in the run, one per host; `process_id` this process's index; the timeouts in seconds: a
    process's heartbeat, the processes' wait for each other at startup, and at the end of a run for the last of them.
    """

    mode: Mode = "auto"
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    heartbeat_timeout_s: int = 100
    init_timeout_s: int = 300
    shutdown_timeout_s: int = 3600

    def __post_init__(self) -> None:
        if self.mode not in get_args(Mode):
            raise ValueError(f"mode must be one of {get_args(Mode)}, got {self.mode!r}")
        if self.num_processes is not None and self.num_processes < 1:
            raise ValueError(f"num_processes must be at least 1, got {self.num_processes}")
        if self.process_id is not None and self.process_id < 0:
            raise ValueError(f"process_id must be at least 0, got {self.process_id}")
        if self.num_processes is not None and self.process_id is not None and self.process_id >= self.num_processes:
            raise ValueError(f"process_id {self.process_id} is not below num_processes {self.num_processes}")
        for name in ("heartbeat_timeout_s", "init_timeout_s", "shutdown_timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 second, got {getattr(self, name)}")


log = logging.getLogger(__name__)


def _cluster_of_several_processes() -> bool:
    """A SLURM step or an Open MPI job with more than one process, the environments JAX reads its settings from."""
    slurm = "SLURM_JOB_ID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1
    open_mpi = "OMPI_MCA_orte_hnp_uri" in os.environ and int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
    return slurm or open_mpi


def requested(config: DistributedConfig) -> bool:
    """Whether `config.mode` and the environment ask for a multi-process run."""
    if config.mode != "auto":
        return config.mode == "on"
    given = (config.coordinator_address, config.num_processes, config.process_id)
    return any(value is not None for value in given) or _cluster_of_several_processes()


def initialize(config: DistributedConfig) -> None:
    """Joins the distributed run when one is requested (see the module docstring); call before any JAX computation."""
    if not requested(config):
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=config.coordinator_address,
        num_processes=config.num_processes,
        process_id=config.process_id,
        initialization_timeout=config.init_timeout_s,
        heartbeat_timeout_seconds=config.heartbeat_timeout_s,
        shutdown_timeout_seconds=config.shutdown_timeout_s,
    )
    log.info(
        "process %d of %d: %d local devices, %d in all", jax.process_index(), jax.process_count(),
        jax.local_device_count(), jax.device_count(),
    )


def wait_for_every_process(barrier: str, timeout_s: int) -> None:
    """Returns once every process has called it with the same `barrier` name (at once in a one-process run), or fails
    after `timeout_s` (`DistributedConfig.shutdown_timeout_s`). The processes that finish first wait here, not at
    JAX's exit barrier: had they exited, that barrier's timeout would have ended the run, process 0's evaluation with
    it."""
    if jax.process_count() > 1:
        ocp.multihost.get_jax_distributed_client().wait_at_barrier(barrier, timeout_s * 1000)


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


def main_process_value(value: float) -> float:
    """Process 0's `value` on every process (itself in one process): a figure only process 0 computed, so that
    every process takes the same branch after it. A collective, as `host_copy`; sent as float32 (JAX's default
    precision), which every process, process 0 included, then reads alike."""
    if jax.process_count() == 1:
        return value
    return float(multihost_utils.broadcast_one_to_all(np.float32(value)))


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

"""`conductor.distributed`: when an entry point joins a multi-process run, what it hands `jax.distributed.initialize`,
and the checks a run of several processes makes before it starts; the flags that set it
(`launch.flag_groups.distributed`). (Two real processes: tests/launch/test_multihost.py.)
"""

from __future__ import annotations

import pathlib

import jax
import pytest
from absl.testing import flagsaver
from flax import nnx

from conductor import distributed
from conductor.distributed import DistributedConfig
from launch.flag_groups import distributed as distributed_flags
from models import ModelConfig, Transformer
from rl.learner import Learner, LearnerConfig
from rl.loop import LoopConfig, TrainingLoop
from tests.tiny_models import tiny_config

pytestmark = pytest.mark.usefixtures("parsed_flags")  # tests/launch/conftest.py

CLUSTER_VARIABLES = ("SLURM_JOB_ID", "SLURM_NTASKS", "OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE")


@pytest.fixture
def no_cluster(monkeypatch):
    for name in CLUSTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_auto_joins_when_a_process_setting_is_given_or_a_cluster_runs_several_processes(no_cluster):
    assert not distributed.requested(DistributedConfig())
    for field, value in (("coordinator_address", "10.0.0.1:8476"), ("num_processes", 2), ("process_id", 0)):
        assert distributed.requested(DistributedConfig(**{field: value})), field
    no_cluster.setenv("SLURM_JOB_ID", "17")
    no_cluster.setenv("SLURM_NTASKS", "1")
    assert not distributed.requested(DistributedConfig()), "a one-task SLURM job is one process"
    no_cluster.setenv("SLURM_NTASKS", "2")
    assert distributed.requested(DistributedConfig())
    no_cluster.delenv("SLURM_JOB_ID")
    no_cluster.setenv("OMPI_MCA_orte_hnp_uri", "1531576320.0;tcp://10.96.0.1:34911")
    no_cluster.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert distributed.requested(DistributedConfig())


def test_on_and_off_override_what_auto_would_decide(no_cluster):
    assert distributed.requested(DistributedConfig(mode="on"))  # a TPU pod slice: JAX finds its workers itself
    off = DistributedConfig(mode="off", coordinator_address="10.0.0.1:8476", num_processes=2, process_id=1)
    assert not distributed.requested(off)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"mode": "sometimes"}, "mode must be one of"),
        ({"num_processes": 0}, "num_processes must be at least 1"),
        ({"process_id": -1}, "process_id must be at least 0"),
        ({"num_processes": 2, "process_id": 2}, "process_id 2 is not below num_processes 2"),
        ({"shutdown_timeout_s": 0}, "shutdown_timeout_s must be at least 1 second"),
    ],
)
def test_a_config_that_cannot_describe_a_run_is_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        DistributedConfig(**settings)


def test_the_flags_set_the_config_field_by_field():
    with flagsaver.flagsaver(distributed="on", coordinator_address="10.0.0.1:8476", num_processes=2, process_id=1,
                             distributed_heartbeat_timeout_s=40, distributed_init_timeout_s=90,
                             distributed_shutdown_timeout_s=600):
        config = distributed_flags.from_flags()
    assert config == DistributedConfig(
        mode="on", coordinator_address="10.0.0.1:8476", num_processes=2, process_id=1, heartbeat_timeout_s=40,
        init_timeout_s=90, shutdown_timeout_s=600,
    )


def test_initialize_hands_jax_the_settings_and_timeouts_and_nothing_when_not_asked(no_cluster):
    calls = []
    no_cluster.setattr(jax.distributed, "initialize", lambda **settings: calls.append(settings))
    distributed.initialize(DistributedConfig())
    assert calls == []
    distributed.initialize(DistributedConfig(
        coordinator_address="10.0.0.1:8476", num_processes=2, process_id=1, heartbeat_timeout_s=40,
        init_timeout_s=90, shutdown_timeout_s=600,
    ))
    assert calls == [{
        "coordinator_address": "10.0.0.1:8476", "num_processes": 2, "process_id": 1, "initialization_timeout": 90,
        "heartbeat_timeout_seconds": 40, "shutdown_timeout_seconds": 600,
    }]
    assert jax.config.jax_cpu_collectives_implementation == "gloo"


def test_the_mesh_of_a_multi_process_run_must_hold_every_device(monkeypatch):
    assert distributed.learner_mesh(1, 1) is None
    assert distributed.learner_mesh(2, 2).devices.shape == (2, 2)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match=r"--mesh_fsdp=2 x --mesh_tp=2 must equal the 8 devices of all 2 processes"):
        distributed.learner_mesh(2, 2)
    assert distributed.learner_mesh(4, 2).devices.size == 8


def test_other_processes_write_their_own_files_under_the_directory(monkeypatch):
    assert distributed.process_dir(pathlib.Path("runs/x")) == pathlib.Path("runs/x")
    monkeypatch.setattr(jax, "process_index", lambda: 3)
    assert distributed.process_dir(pathlib.Path("runs/x")) == pathlib.Path("runs/x/process3")
    assert not distributed.is_main_process()


def test_a_multi_process_run_refuses_a_learner_off_the_mesh_and_questions_that_do_not_split(monkeypatch):
    model = Transformer(ModelConfig.from_hf(tiny_config("llama")), rngs=nnx.Rngs(0))
    monkeypatch.setattr(jax, "process_count", lambda: 3)
    with pytest.raises(ValueError, match="a learner in a run of 3 processes needs a mesh over all 8 devices"):
        Learner(model, LearnerConfig())
    with pytest.raises(ValueError, match="questions_per_iteration 4 does not split over 3 processes"):
        TrainingLoop(LoopConfig(iterations=1, questions_per_iteration=4), learner=None, sampler=None,
                     sampling_params=None, weight_sync=None, environment=None, pad_id=0)

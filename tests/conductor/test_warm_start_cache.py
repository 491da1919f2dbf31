"""A warm-start cache entry holds, bit for bit, what the warm-start makes; a different seed or setting has another key,
a different reward the same (`conductor.warm_start.cached_warm_start`, `warm_start_origin`)."""

from __future__ import annotations

import dataclasses
import logging
import threading

import jax
import numpy as np
import pytest
from flax import nnx

from conductor.conductor_env import EnvSpec, build_env
from conductor.loop_environment import TokenizedConductorEnv
from conductor.model import ConductorSpec, load_conductor
from conductor.teachers import TeacherConfig
from conductor.warm_start import cached_warm_start, warm_start, warm_start_key, warm_start_origin
from env.gym_env import ConductorEnv, EnvConfig
from env.rewards import RewardConfig
from env.worlds import SyntheticWorldConfig, build_world
from models.zoo import exclusive
from rl.learner import OptimizerConfig
from rl.supervised import SFTConfig

STEPS = 3
TRAINER = SFTConfig(optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=0, total_steps=STEPS), batch_size=4)
TEACHER = TeacherConfig()
WORLD = SyntheticWorldConfig(num_tasks=4)


def conductor(seed, tmp_path):
    spec = ConductorSpec(name="tiny", tiny_layers=1, tiny_width=32, seed=seed)
    model, tokenizer, _ = load_conductor(spec, tmp_path / f"init{seed}")
    return spec, model, TokenizedConductorEnv(ConductorEnv(build_world(WORLD)), tokenizer)


def params(model):
    return jax.tree.leaves(jax.device_get(nnx.state(model, nnx.Param)))


def test_a_stored_warm_start_loads_bit_for_bit(tmp_path, caplog):
    cache = tmp_path / "cache"
    spec, reference, environment = conductor(0, tmp_path)
    before = params(reference)
    warm_start(reference, environment, STEPS, TRAINER, TEACHER)
    expected = params(reference)
    assert any(not np.array_equal(a, b) for a, b in zip(before, expected))

    _, first, environment = conductor(0, tmp_path)
    with caplog.at_level(logging.INFO, logger="conductor.warm_start"):
        assert not cached_warm_start(first, environment, STEPS, TRAINER, TEACHER, (spec, WORLD), cache)
        _, second, environment = conductor(0, tmp_path)
        assert cached_warm_start(second, environment, STEPS, TRAINER, TEACHER, (spec, WORLD), cache)
    assert "warm-start stored in" in caplog.text and "warm-start loaded from" in caplog.text
    for model in (first, second):
        for got, want in zip(params(model), expected, strict=True):
            np.testing.assert_array_equal(got, want)
    [entry] = [path for path in cache.iterdir() if path.is_dir()]  # no partial directory left behind
    assert entry.name == warm_start_key(STEPS, TRAINER, TEACHER, "none", (spec, WORLD))
    assert (entry / "warm_start_key.json").exists()


@pytest.mark.parametrize("change", [
    {"steps": STEPS + 1}, {"trainer_config": dataclasses.replace(TRAINER, seed=1)},
    {"teacher": TeacherConfig(templates=("single",))}, {"token_masks": "ids"}, {"token_masks": "workflow"},
    {"origin": (ConductorSpec(name="tiny", seed=1), WORLD)},
    {"origin": (ConductorSpec(name="tiny"), SyntheticWorldConfig(num_tasks=5))},
])
def test_the_key_changes_with_everything_that_decides_the_warm_start(change):
    base = {"steps": STEPS, "trainer_config": TRAINER, "teacher": TEACHER, "token_masks": "none",
            "origin": (ConductorSpec(name="tiny"), WORLD)}
    assert warm_start_key(**base) == warm_start_key(**base)
    assert warm_start_key(**{**base, **change}) != warm_start_key(**base)


def test_runs_that_differ_in_their_reward_alone_share_a_key_unless_the_teacher_reads_the_reward():
    spec = ConductorSpec(name="tiny")

    def key(env_spec, teacher=TEACHER):
        return warm_start_key(STEPS, TRAINER, teacher, "none", warm_start_origin(spec, env_spec, teacher))

    penalised = EnvConfig(reward=RewardConfig(wrong=0.0, step_penalty=0.2, usd_penalty=10.0))
    assert key(EnvSpec(WORLD, penalised)) == key(EnvSpec(WORLD))
    assert key(EnvSpec(WORLD, EnvConfig(seed=1))) != key(EnvSpec(WORLD))
    assert key(EnvSpec(WORLD, EnvConfig(expected_grades=True))) != key(EnvSpec(WORLD))
    # The optimum teacher's targets are the best workflows under the run's reward.
    optimum = TeacherConfig(teacher="optimum")
    assert key(EnvSpec(WORLD, penalised), optimum) != key(EnvSpec(WORLD), optimum)


@pytest.mark.parametrize("teacher", [TeacherConfig(), TeacherConfig(teacher="world")])
def test_a_warm_start_is_the_same_under_another_reward(teacher, tmp_path):
    # What makes the shared key right: the world teacher executes and grades its routes, and still reads no reward.
    # Expected grades, as 0/1 draws from workers without a seed are fresh in each env.
    results = []
    for index, reward in enumerate([RewardConfig(), RewardConfig(wrong=0.0, step_penalty=0.3, usd_penalty=50.0)]):
        spec = ConductorSpec(name="tiny", tiny_layers=1, tiny_width=32, seed=0)
        model, tokenizer, _ = load_conductor(spec, tmp_path / f"init{index}")
        environment = TokenizedConductorEnv(build_env(EnvSpec(WORLD, EnvConfig(expected_grades=True, reward=reward))),
                                            tokenizer)
        before = params(model)
        warm_start(model, environment, STEPS, TRAINER, teacher)
        results.append(params(model))
        assert any(not np.array_equal(a, b) for a, b in zip(before, results[-1]))
    for got, want in zip(*results, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_run_waits_for_another_warming_up_the_same_key(tmp_path):
    # flock holds per open file, so two threads, each opening the lock itself, stand for two runs.
    lock_path = tmp_path / "key.lock"
    held, release, second_held = threading.Event(), threading.Event(), threading.Event()

    def first():
        with exclusive(lock_path):
            held.set()
            release.wait(30)

    def second():
        with exclusive(lock_path):
            second_held.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert held.wait(30)
    threads[1].start()
    assert not second_held.wait(0.5)
    release.set()
    assert second_held.wait(30)
    for thread in threads:
        thread.join(30)

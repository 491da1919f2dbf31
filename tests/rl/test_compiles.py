"""Counting XLA programs (`rl.compiles`): one per new shape, none for a shape already compiled, and the loop's
`compile/programs` adds up to what the process compiled; the persistent cache a later process loads them from."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from models.config import ModelConfig
from models.transformer import Transformer
from rl import compiles
from rl.learner import Learner, LearnerConfig, OptimizerConfig
from rl.losses import LossConfig
from tests.rl.helpers import RecordingLearner
from tests.rl.test_loop import ParityWorld, make_loop
from tests.tiny_models import tiny_config


def test_a_program_is_counted_once_per_new_shape_and_not_for_a_shape_compiled_before():
    triple = jax.jit(lambda x: x * 3 + 1)
    four, five = np.ones(4, np.float32), np.ones(5, np.float32)  # host arrays: no eager op compiles a program
    counts = [compiles.totals()]
    for x in (four, four, five):
        triple(x)
        counts.append(compiles.totals())
    steps = [later - earlier for earlier, later in zip(counts, counts[1:])]
    assert [step.programs for step in steps] == [1, 0, 1]
    assert steps[0].seconds > 0 and steps[1].seconds == 0
    assert all(step.cache_hits == 0 for step in steps), "the test run has no persistent cache"


def test_the_loop_logs_each_iterations_programs_and_they_add_up_to_the_process_count():
    # A learning rate no other test uses: the update's programs (the config is a static argument) are new here.
    model = Transformer(ModelConfig.from_hf(tiny_config("llama")), rngs=nnx.Rngs(0))
    optimizer = OptimizerConfig(learning_rate=3.25e-3, schedule="constant", total_steps=100)
    learner = RecordingLearner(model, LearnerConfig(loss=LossConfig(), optimizer=optimizer))
    loop, _ = make_loop(ParityWorld(), iterations=3, learner=learner)
    before = compiles.totals()
    history = loop.run()
    programs = [scalars["compile/programs"] for scalars in history]
    assert programs[0] > 0, "the first update compiles its programs"
    assert sum(programs) == (compiles.totals() - before).programs
    assert all(scalars["compile/seconds"] >= 0 and scalars["compile/cache_hits"] == 0 for scalars in history)



def test_a_mini_batch_without_gradient_compiles_nothing_new_the_learner_compiled_its_step_ahead():
    from tests.rl.test_learner import _batch_with_silent_groups, _model

    # A learning rate no other test uses, so that no program of this learner is compiled already.
    optimizer = OptimizerConfig(learning_rate=3.75e-3, schedule="constant", total_steps=100)
    before = compiles.totals()
    learner = Learner(_model(), LearnerConfig(loss=LossConfig(), optimizer=optimizer, mini_batch_size=4))
    assert (compiles.totals() - before).programs >= 1, "the learner compiles its zero-gradient step when built"
    # Mini-batches of one group each, the same completions in both updates: in the second the third group's rewards
    # agree, so its mini-batch has no gradient and takes the zero-gradient step, at the same shapes as before.
    learning = _batch_with_silent_groups([[0, 1, 1, 0]] * 4)
    assert learner.update(learning)["skipped_rows"] == 0.0
    after_first = compiles.totals()
    assert learner.update(_batch_with_silent_groups([[0, 1, 1, 0]] * 2 + [[1, 1, 1, 1], [0, 1, 1, 0]]))[
        "skipped_rows"] == 0.25
    assert (compiles.totals() - after_first).programs == 0


# One process of a run: turns the cache on as the entry points do, compiles one program, prints what it counted.
CACHED_PROGRAM = """
import json, sys
import jax, jax.numpy as jnp
from rl import compiles
directory = compiles.use_persistent_cache(compiles.PersistentCacheConfig(sys.argv[1]))
start = compiles.totals()
value = float(jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((32, 32))))
counted = compiles.totals() - start
print(json.dumps({"directory": directory, "value": value, "programs": counted.programs, "hits": counted.cache_hits}))
"""


def _compile_in_a_new_process(directory, **environment):
    # JAX writes only programs that took a second to compile; this one takes milliseconds.
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE") and
           k != "JAX_ENABLE_COMPILATION_CACHE"}
    env.update(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PLATFORMS="cpu", **environment)
    result = subprocess.run([sys.executable, "-c", CACHED_PROGRAM, str(directory)], capture_output=True, text=True,
                            env=env, timeout=300, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_program_the_first_wrote_to_the_persistent_cache(tmp_path):
    cold = _compile_in_a_new_process(tmp_path / "cache")
    warm = _compile_in_a_new_process(tmp_path / "cache")
    assert cold["directory"] == warm["directory"] == str(tmp_path / "cache")
    assert cold["hits"] == 0 and warm["hits"] == warm["programs"] >= 1
    assert warm["value"] == cold["value"] == pytest.approx(32 * 32 * np.tanh(32.0))
    assert any(path.name.endswith("-cache") for path in (tmp_path / "cache").iterdir())


def test_the_users_jax_settings_win_over_the_runs_cache_directory(tmp_path):
    theirs = _compile_in_a_new_process(tmp_path / "ours", JAX_COMPILATION_CACHE_DIR=str(tmp_path / "theirs"))
    assert theirs["directory"] == str(tmp_path / "theirs") and any((tmp_path / "theirs").iterdir())
    assert not (tmp_path / "ours").exists()
    off = _compile_in_a_new_process(tmp_path / "off", JAX_ENABLE_COMPILATION_CACHE="false")
    assert off["directory"] is None and not (tmp_path / "off").exists()


def test_an_empty_directory_turns_the_cache_off_and_a_size_must_be_positive():
    assert compiles.use_persistent_cache(compiles.PersistentCacheConfig("")) is None
    with pytest.raises(ValueError, match="max_bytes must be positive"):
        compiles.PersistentCacheConfig("/tmp/cache", max_bytes=0)

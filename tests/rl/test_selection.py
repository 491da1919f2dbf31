"""rl.selection.BestCheckpoint: the run's best-scoring state, kept across a resume and loaded back at the end."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from flax import nnx

from rl.selection import BestCheckpoint
from tests.rl.test_loop import ParityWorld, make_loop


def parameters(learner) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(nnx.state(learner.model, nnx.Param))]


def test_the_kept_state_is_the_best_scoring_one_and_a_tie_keeps_the_earlier(tmp_path):
    loop, _ = make_loop(ParityWorld(), iterations=3)
    best = BestCheckpoint(tmp_path / "selection")
    snapshots = {}
    for step, score in ((0, 0.25), (1, 0.5), (2, 0.5), (3, 0.125)):
        if step:
            loop.run_iteration()
        snapshots[step] = parameters(loop.learner)
        kept = best.consider(step, score, loop.learner, loop.rng_key, loop.loop_state())
        assert kept == (step in (0, 1)), step
    assert best.best_step == 1
    assert best.scores == {0: 0.25, 1: 0.5, 2: 0.5, 3: 0.125}
    assert json.loads((tmp_path / "selection" / "scores.json").read_text()) == {"0": 0.25, "1": 0.5, "2": 0.5,
                                                                                "3": 0.125}
    assert not np.array_equal(snapshots[1][0], snapshots[3][0]), "the updates moved the weights"

    assert best.restore(loop.learner) == 1
    for got, expected in zip(parameters(loop.learner), snapshots[1], strict=True):
        np.testing.assert_array_equal(got, expected)
    assert loop.learner.optimizer_step == 1, "the optimizer state comes back with the weights"
    best.close()


def test_a_resumed_selection_goes_on_choosing_against_the_scores_before_it(tmp_path):
    loop, _ = make_loop(ParityWorld(), iterations=2)
    first = BestCheckpoint(tmp_path / "selection")
    first.consider(0, 0.75, loop.learner, loop.rng_key, loop.loop_state())
    kept_weights = parameters(loop.learner)
    first.close()

    loop.run_iteration()
    resumed = BestCheckpoint(tmp_path / "selection")
    assert (resumed.best_step, resumed.scores) == (0, {0: 0.75})
    assert not resumed.consider(1, 0.5, loop.learner, loop.rng_key, loop.loop_state())
    resumed.restore(loop.learner)
    for got, expected in zip(parameters(loop.learner), kept_weights, strict=True):
        np.testing.assert_array_equal(got, expected)
    resumed.close()


def test_only_the_writing_process_writes_the_scores(tmp_path):
    loop, _ = make_loop(ParityWorld())
    silent = BestCheckpoint(tmp_path / "selection", write_scores=False)
    silent.consider(0, 0.5, loop.learner, loop.rng_key, loop.loop_state())
    assert silent.best_step == 0 and not (tmp_path / "selection" / "scores.json").exists()
    silent.close()


def test_bad_scores_and_steps_are_refused(tmp_path):
    loop, _ = make_loop(ParityWorld())
    best = BestCheckpoint(tmp_path / "selection")
    state = (loop.learner, loop.rng_key, loop.loop_state())
    with pytest.raises(ValueError, match="keeps no state"):
        best.restore(loop.learner)
    with pytest.raises(ValueError, match="finite"):
        best.consider(0, float("nan"), *state)
    best.consider(2, 0.5, *state)
    with pytest.raises(ValueError, match="already considered"):
        best.consider(2, 0.75, *state)
    with pytest.raises(ValueError, match="comes before"):
        best.consider(1, 0.75, *state)
    best.close()
    (tmp_path / "selection" / "scores.json").write_text("{}")
    with pytest.raises(ValueError, match="without its score"):
        BestCheckpoint(tmp_path / "selection")


def test_the_loop_calls_after_checkpoint_at_each_checkpoint_and_the_end_with_those_weights_synced(tmp_path):
    calls = []
    loop, syncs = make_loop(ParityWorld(), iterations=5, checkpoint_every=2)
    loop.after_checkpoint = lambda iteration: calls.append((iteration, syncs[-1], loop.learner.optimizer_step))
    loop.run()
    assert calls == [(2, 2, 2), (4, 4, 4), (5, 5, 5)]

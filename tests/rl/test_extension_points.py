"""rl's two extension points, used from this file alone: an advantage transform and an auxiliary loss term, each
registered here (docs/extending.md), acting on a tiny random model's update as a hand-computed reference says."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.config import ModelConfig
from models.logprobs import completion_predictors
from models.transformer import Transformer
from rl import advantages, auxiliary
from rl.auxiliary import TermConfig, TermInputs, TermSpec
from rl.learner import Learner, LearnerConfig
from rl.losses import LossConfig
from rl.supervised import marked_states
from rl.trajectories import build
from tests.rl.helpers import SGDConfig
from tests.tiny_models import tiny_config

CONFIG = ModelConfig.from_hf(tiny_config("llama", num_hidden_layers=1))
RATE = 1e-2


def negate(batch: advantages.AdvantageBatch, *, scale: float = 1.0) -> np.ndarray:
    """A' = -scale * A."""
    return -scale * batch.advantages


def flagged_state_mean(inputs: TermInputs, *, offset: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """value = sum_b [flag_b >= 0] (flag_b + offset) * mean_h s_b[h], s_b the state predicting row b's "mark" token."""
    flags = inputs.row_labels["flag"]
    read = (flags >= 0) & (inputs.positions["mark"] >= 0)
    means = inputs.states["mark"].astype(jnp.float32).mean(axis=-1)
    value = jnp.sum(jnp.where(read, (flags + offset) * means, 0.0))
    return value, {"flagged_state_mean": value}


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(advantages.ADVANTAGE_TRANSFORMS, "negate", negate)
    monkeypatch.setitem(
        auxiliary.AUXILIARY_TERMS, "flagged_state_mean",
        TermSpec(flagged_state_mean, token_positions=("mark",), row_labels=("flag",)),
    )


def _batch(advantage_values, flags=None, marks=None):
    rng = np.random.default_rng(3)
    rows = len(advantage_values)
    prompts = [list(rng.integers(3, 250, size=4)) for _ in range(rows)]
    completions = [list(rng.integers(3, 250, size=5)) for _ in range(rows)]
    extras = {}
    if flags is not None:
        extras = {"row_labels": {"flag": flags}, "token_positions": {"mark": marks}}
    return build(prompts, completions, [[-2.0] * 5] * rows, advantage_values, np.arange(rows) // 2, pad_id=0,
                 length_buckets=(16,), **extras)


def _moves(learner: Learner, batch) -> list[np.ndarray]:
    before = [np.asarray(x).copy() for x in jax.tree.leaves(learner.params)]
    metrics = learner.update(batch)
    return [np.asarray(x) - b for x, b in zip(jax.tree.leaves(learner.params), before)], metrics


def _sgd_learner(loss: LossConfig = LossConfig()) -> Learner:
    return Learner(Transformer(CONFIG, rngs=nnx.Rngs(0)),
                   LearnerConfig(loss=loss, optimizer=SGDConfig(learning_rate=RATE, max_grad_norm=None)))


def test_a_registered_transform_runs_with_its_options_and_reverses_the_update(registered):
    rewards = np.array([1.0, 0.0, 0.0, 1.0])
    estimated = advantages.compute("grpo", rewards, np.array([0, 0, 1, 1]))
    batch = advantages.AdvantageBatch(advantages=estimated, rewards=rewards, group_ids=np.array([0, 0, 1, 1]))
    transformed, scalings, metrics = advantages.apply_transforms(
        (advantages.TransformConfig("negate", {"scale": 2.0}), advantages.TransformConfig("negate")), batch
    )
    np.testing.assert_allclose(transformed, 2.0 * estimated, rtol=1e-6)
    assert scalings == [] and metrics == {}
    negated, _, _ = advantages.apply_transforms((advantages.TransformConfig("negate"),), batch)
    np.testing.assert_array_equal(negated, -estimated)

    # On its first step the update's ratio is 1, so its gradient is linear in the advantages: negated advantages
    # move every parameter by exactly the opposite amount.
    forward, _ = _moves(_sgd_learner(), _batch(estimated))
    backward, _ = _moves(_sgd_learner(), _batch(negated))
    largest = max(float(np.abs(move).max()) for move in forward)
    assert largest > 1e-4
    for ahead, back in zip(forward, backward):
        np.testing.assert_allclose(back, -ahead, rtol=0, atol=1e-4 * largest)


def test_a_transforms_options_are_checked_when_it_is_configured(registered):
    with pytest.raises(ValueError, match="unknown advantage transform 'negative'; known: .*'negate'"):
        advantages.TransformConfig("negative")
    with pytest.raises(ValueError, match="transform 'negate' takes no option 'scael'; it takes \\['scale'\\]"):
        advantages.TransformConfig("negate", {"scael": 2.0})
    with pytest.raises(ValueError, match="option 'scale' must be float, got 'big'"):
        advantages.TransformConfig("negate", {"scale": "big"})


def test_a_registered_term_reads_its_rows_and_its_gradient_reaches_the_parameters(registered):
    flags, marks = np.array([2, -1, 0, 1]), np.array([1, 3, -1, 4])
    # Zero advantages: no policy gradient, so the update is the term's alone; the rows it reads (0 and 3) still run,
    # the others (no flag, no mark) are skipped.
    batch = _batch(np.zeros(4), flags, marks)
    coef = 3.0
    term = TermConfig("flagged_state_mean", coef, options={"offset": 0.5})
    moves, metrics = _moves(_sgd_learner(LossConfig(auxiliary_terms=(term,))), batch)
    assert metrics["skipped_rows"] == 0.5 and metrics["flagged_state_mean_coef"] == coef

    model = Transformer(CONFIG, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def reference(params):
        predicting = completion_predictors(
            nnx.merge(graphdef, params, rest), jnp.asarray(batch.tokens), jnp.asarray(batch.positions),
            jnp.asarray(batch.attention_mask), batch.completion_start,
        )
        means = marked_states(predicting, jnp.asarray(np.maximum(marks, 0))).mean(axis=-1)
        return jnp.sum(jnp.asarray([2.5, 0.0, 0.0, 1.5]) * means)  # rows 0 and 3 are read: flag + offset

    value, gradient = jax.value_and_grad(reference)(params)
    np.testing.assert_allclose(metrics["flagged_state_mean"], float(value), rtol=1e-5)
    np.testing.assert_allclose(metrics["loss/flagged_state_mean"], coef * float(value), rtol=1e-5)
    expected = [-RATE * coef * np.asarray(g) for g in jax.tree.leaves(gradient)]
    largest = max(float(np.abs(move).max()) for move in expected)
    assert largest > 1e-4
    for got, move in zip(moves, expected):
        np.testing.assert_allclose(got, move, rtol=0, atol=1e-3 * largest)


def test_a_term_is_checked_when_configured_and_refuses_a_batch_without_what_it_reads(registered):
    with pytest.raises(ValueError, match="unknown auxiliary loss term 'flagged'"):
        TermConfig("flagged", 1.0)
    with pytest.raises(ValueError, match="term 'flagged_state_mean' takes no option 'offest'"):
        TermConfig("flagged_state_mean", 1.0, options={"offest": 1.0})
    with pytest.raises(ValueError, match="coef must be > 0"):
        TermConfig("flagged_state_mean", 0.0)
    term = TermConfig("flagged_state_mean", 1.0, decay_steps=4)
    assert [term.coef_at(step) for step in (0, 2, 4, 6)] == [1.0, 0.5, 0.0, 0.0]
    assert hash(LossConfig(auxiliary_terms=(term,))) == hash(LossConfig(auxiliary_terms=(term,)))
    learner = _sgd_learner(LossConfig(auxiliary_terms=(term,)))
    with pytest.raises(ValueError, match="read token position 'mark', row label 'flag', which the batch does not"):
        learner.update(_batch(np.ones(4)))

"""The Conductor's auxiliary loss terms (`conductor.losses`) in the learner's update, on tiny random models: each
term's value and gradient against a reference computed from the model's full rows, the decay, the rows they read."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conductor.advantages import ROUTE
from conductor.losses import task_state_overlap  # importing conductor.losses registers its terms
from models.config import ModelConfig
from models.logprobs import completion_predictors
from models.sharding import make_mesh
from models.transformer import Transformer
from rl import advantages
from rl.auxiliary import TermConfig
from rl.learner import Learner, LearnerConfig
from rl.loop import QUESTION_LABEL
from rl.losses import LossConfig
from rl.supervised import marked_states
from rl.trajectories import build
from tests.rl.helpers import SGDConfig, assert_same_training_state
from tests.tiny_models import tiny_config

CONFIG = ModelConfig.from_hf(tiny_config("llama", num_hidden_layers=1))
SGD_RATE = 1e-2  # as tests/rl/test_learner.py's


def _model(seed: int = 0) -> Transformer:
    return Transformer(CONFIG, rngs=nnx.Rngs(seed))


def _params_of(learner: Learner) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(learner.params)]


def _task_batch(seed: int = 4):
    """Four groups of four in tasks 0, 1, 0, 2, one row of group 1 without a route token and the last two groups'
    rewards all equal (a zero advantage, which no policy loss runs), each other row's route position inside its
    completion."""
    rng = np.random.default_rng(seed)
    groups, group_size = 4, 4
    rows = groups * group_size
    prompts = [list(rng.integers(3, 250, size=length)) for length in rng.integers(3, 12, size=groups)]
    completions = [list(rng.integers(3, 250, size=rng.integers(2, 9))) for _ in range(rows)]
    sampler = [list(-rng.uniform(3.0, 8.0, size=len(c))) for c in completions]
    group_ids = np.repeat(np.arange(groups), group_size)
    rewards = np.array([0, 1, 0, 1, 1, 0, 0, 1] + [1] * 8, dtype=np.float64)
    adv = advantages.compute("grpo", rewards, group_ids)
    tasks = np.repeat([0, 1, 0, 2], group_size)
    route_positions = np.array([rng.integers(0, len(c)) for c in completions])
    route_positions[5] = -1
    return build([prompts[g] for g in group_ids], completions, sampler, adv, group_ids, pad_id=0,
                 length_buckets=(32,), row_labels={QUESTION_LABEL: tasks}, token_positions={ROUTE: route_positions})


def _read(batch) -> np.ndarray:
    """The rows with loss tokens and a route token: those the terms read."""
    return np.asarray(batch.loss_mask).any(axis=1) & (np.asarray(batch.token_positions[ROUTE]) >= 0)


def _route_states(predicting, batch):
    return marked_states(predicting, jnp.asarray(np.maximum(batch.token_positions[ROUTE], 0)))


def _overlap_gradient(model, batch, rows: slice):
    """The tasks' state overlap of `batch`'s rows `rows`, and its gradient, from the model's full rows."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    part = batch.rows(rows)

    def overlap(params):
        predicting = completion_predictors(
            nnx.merge(graphdef, params, rest), jnp.asarray(part.tokens), jnp.asarray(part.positions),
            jnp.asarray(part.attention_mask), part.completion_start,
        )
        labels = np.where(_read(part), part.row_labels[QUESTION_LABEL], -1)
        return task_state_overlap(_route_states(predicting, part), jnp.asarray(labels))

    return jax.value_and_grad(overlap)(params)


@pytest.mark.parametrize("micro_batch_size", [None, 8])
def test_the_decorrelation_term_adds_the_tasks_state_overlap_gradient_to_the_update(micro_batch_size):
    batch = _task_batch()
    coef = 0.7

    def learner(decorrelation_coef: float) -> Learner:
        terms = (TermConfig("decorrelation", decorrelation_coef),) if decorrelation_coef else ()
        config = LearnerConfig(
            loss=LossConfig(auxiliary_terms=terms),
            optimizer=SGDConfig(learning_rate=SGD_RATE, max_grad_norm=None), micro_batch_size=micro_batch_size,
        )
        return Learner(_model(), config)

    plain, decorrelated = learner(0.0), learner(coef)
    plain_metrics, metrics = plain.update(batch), decorrelated.update(batch)
    # The silent groups carry no policy gradient, but their states are in the overlap: they run only with the term.
    assert plain_metrics["skipped_rows"] == 0.5 and metrics["skipped_rows"] == 0.0
    passes = [slice(0, 16)] if micro_batch_size is None else [slice(0, 8), slice(8, 16)]
    references = [_overlap_gradient(_model(), batch, rows) for rows in passes]
    expected_overlap = np.mean([float(value) for value, _ in references])
    assert 1e-3 < expected_overlap < 1.0
    np.testing.assert_allclose(metrics["state_overlap"], expected_overlap, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss/decorrelation"], coef * expected_overlap, rtol=1e-5)
    expected_moves = jax.tree.leaves(
        jax.tree.map(lambda *grads: -SGD_RATE * coef * sum(grads) / len(grads), *[g for _, g in references])
    )
    largest = max(float(np.abs(move).max()) for move in expected_moves)
    assert largest > 1e-4
    for got, without, move in zip(_params_of(decorrelated), _params_of(plain), expected_moves):
        np.testing.assert_allclose(got - without, np.asarray(move), rtol=0, atol=1e-3 * largest)


def _route_entropy_gradient(model, batch, temperature: float, token_ids: tuple[int, ...]):
    """The mean over rows with loss tokens of the entropy at each row's route token over `token_ids` (renormalised; 0
    for a row without one), from the log-softmax of the model's full rows, and its gradient."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    has_tokens = np.asarray(batch.loss_mask).any(axis=1)
    labelled = jnp.asarray(_read(batch))

    def mean_route_entropy(params):
        merged = nnx.merge(graphdef, params, rest)
        predicting = completion_predictors(
            merged, jnp.asarray(batch.tokens), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask),
            batch.completion_start,
        )
        states = _route_states(predicting, batch)
        log_probs = jax.nn.log_softmax(merged.logits(states)[:, jnp.asarray(token_ids)] / temperature)
        entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
        return jnp.sum(jnp.where(labelled, entropy, 0.0)) / has_tokens.sum()

    return jax.value_and_grad(mean_route_entropy)(params)


@pytest.mark.parametrize("micro_batch_size", [None, 8])
def test_the_route_entropy_bonus_adds_the_route_tokens_entropy_gradient_to_the_update(micro_batch_size):
    batch = _task_batch()
    # A large weight makes the bonus's move stand far above the float32 rounding of the parameters it is read from.
    coef, temperature, token_ids = 10.0, 0.7, (17, 40, 41, 99, 230)

    def learner(route_entropy_coef: float) -> Learner:
        if not route_entropy_coef:
            return Learner(_model(), LearnerConfig(
                temperature=temperature, optimizer=SGDConfig(learning_rate=SGD_RATE, max_grad_norm=None),
                micro_batch_size=micro_batch_size,
            ))
        terms = (TermConfig("route_entropy", route_entropy_coef, options={"token_ids": token_ids}),)
        config = LearnerConfig(
            loss=LossConfig(auxiliary_terms=terms), temperature=temperature,
            optimizer=SGDConfig(learning_rate=SGD_RATE, max_grad_norm=None), micro_batch_size=micro_batch_size,
        )
        return Learner(_model(), config)

    plain, bonused = learner(0.0), learner(coef)
    plain_metrics, metrics = plain.update(batch), bonused.update(batch)
    # The silent groups carry no policy gradient, but their route tokens carry the bonus: they run only with it.
    assert plain_metrics["skipped_rows"] == 0.5 and metrics["skipped_rows"] == 0.0
    expected_entropy, gradient = _route_entropy_gradient(_model(), batch, temperature, token_ids)
    assert 0.5 < float(expected_entropy) < np.log(len(token_ids))
    np.testing.assert_allclose(metrics["route_entropy"], float(expected_entropy), rtol=1e-5)
    np.testing.assert_allclose(metrics["loss/route_entropy"], -coef * float(expected_entropy), rtol=1e-5)
    expected_moves = jax.tree.leaves(jax.tree.map(lambda grad: SGD_RATE * coef * grad, gradient))
    largest = max(float(np.abs(move).max()) for move in expected_moves)
    assert largest > 1e-3
    for got, without, move in zip(_params_of(bonused), _params_of(plain), expected_moves):
        np.testing.assert_allclose(got - without, np.asarray(move), rtol=0, atol=1e-3 * largest)


def test_a_decayed_route_entropy_bonus_leaves_the_plain_update_and_skips_its_rows_again():
    batch = _task_batch()
    loss = LossConfig(auxiliary_terms=(
        TermConfig("route_entropy", 10.0, decay_steps=2, options={"token_ids": (17, 40, 41, 99, 230)}),
    ))
    optimizer = SGDConfig(learning_rate=SGD_RATE, max_grad_norm=None)
    # Two optimizer steps per update: the first update's are steps 0 and 1, at the full and at half the weight.
    decaying = Learner(_model(), LearnerConfig(loss=loss, optimizer=optimizer, mini_batch_size=8))
    first = decaying.update(batch)
    assert first["route_entropy_coef"] == pytest.approx(7.5) and first["skipped_rows"] == 0.0
    assert first["loss/route_entropy"] < 0.0

    # From step 2 on the bonus is zero: the update is the plain learner's from the same state, row for row.
    plain = Learner(_model(seed=123), LearnerConfig(optimizer=optimizer, mini_batch_size=8))
    plain.load_state(
        params=jax.tree.map(jnp.copy, decaying.params), opt_state=jax.tree.map(jnp.copy, decaying.opt_state),
        reference_params=None, step=decaying.step, optimizer_step=decaying.optimizer_step,
    )
    second, plain_second = decaying.update(batch), plain.update(batch)
    assert second["route_entropy_coef"] == 0.0 and second["loss/route_entropy"] == 0.0
    assert second["skipped_rows"] == plain_second["skipped_rows"] == 0.5
    for got, expected in zip(_params_of(decaying), _params_of(plain)):
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-7)


def test_a_sharded_decorrelated_update_matches_one_device():
    config = LearnerConfig(
        loss=LossConfig(auxiliary_terms=(TermConfig("decorrelation", 0.7),)),
        optimizer=SGDConfig(learning_rate=SGD_RATE, momentum=0.9),
        micro_batch_size=8,
    )
    single = Learner(_model(), config)
    sharded = Learner(_model(), config, mesh=make_mesh(fsdp=2, tp=2))
    for _ in range(2):
        single_metrics, sharded_metrics = single.update(_task_batch()), sharded.update(_task_batch())
    np.testing.assert_allclose(sharded_metrics["state_overlap"], single_metrics["state_overlap"], rtol=1e-5)
    assert_same_training_state(sharded, single)


@pytest.mark.parametrize(
    "term, missing",
    [
        (TermConfig("decorrelation", 0.5), "token position 'route', row label 'question'"),
        (TermConfig("route_entropy", 0.5, options={"token_ids": (3, 4)}), "token position 'route'"),
    ],
)
def test_the_terms_that_read_the_route_token_refuse_a_batch_without_it(term, missing):
    learner = Learner(_model(), LearnerConfig(loss=LossConfig(auxiliary_terms=(term,))))
    rng = np.random.default_rng(0)
    completions = [list(rng.integers(3, 250, size=4)) for _ in range(4)]
    batch = build([[5, 6]] * 4, completions, [[-1.0] * 4] * 4, [1.0, -1.0, 1.0, -1.0], [0, 0, 0, 0], pad_id=0,
                  length_buckets=(16,))
    with pytest.raises(ValueError, match=f"read {missing}, which the batch does not carry"):
        learner.update(batch)

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl.supervised import Example, SFTConfig, SupervisedTrainer, marked_states, negative_log_likelihood
from tests.rl.helpers import SGDConfig, assert_same_sgd_state
from tests.supervised_helpers import OPTIMIZER, log_softmax, tiny_model


def nll_and_reference_logprobs(examples, chunk_size):
    """The trainer's NLL of `examples` on a tiny model, the batch, and the model's float64 log-softmax at every
    position, to compute the NLL from."""
    model = tiny_model()
    trainer = SupervisedTrainer(model, SFTConfig(optimizer=OPTIMIZER, logprob_chunk_size=chunk_size))
    batch = trainer.batch(examples, pad_id=0)
    hidden = model(jnp.asarray(batch.tokens), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask))
    predicting = hidden[:, batch.completion_start - 1 : -1]
    nll = negative_log_likelihood(model, predicting, jax.tree.map(jnp.asarray, batch), chunk_size=chunk_size)
    return float(nll), batch, log_softmax(np.asarray(model.logits(hidden), np.float64))


@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0), (0.5, 2.0, 0.0)])
def test_nll_is_the_weighted_sum_over_completion_tokens_of_the_full_vocabulary_log_softmax_per_token(weights):
    rng = np.random.default_rng(0)
    examples = [
        Example(tuple(rng.integers(3, 256, size=p)), tuple(rng.integers(3, 256, size=c)), weight=w)
        for (p, c), w in zip(((5, 3), (9, 7), (2, 1)), weights)
    ]
    nll, batch, logprobs = nll_and_reference_logprobs(examples, chunk_size=4)
    expected, token_weights = [], []
    for row, example in enumerate(examples):
        for offset, token in enumerate(example.completion_ids):
            column = batch.completion_start + offset
            expected.append(-logprobs[row, column - 1, token])
            token_weights.append(example.weight)
    np.testing.assert_allclose(nll, np.dot(expected, token_weights) / len(expected), rtol=1e-5)


def test_a_constrained_examples_nll_is_that_of_the_distribution_renormalised_over_its_allowed_tokens():
    only = SimpleNamespace(token_ids=(7, 11, 40), only=True)
    all_but = SimpleNamespace(token_ids=tuple(range(3, 60)), only=False)
    examples = [Example((5, 6, 9), (11, 70, 7), constraints=(only, None, all_but)), Example((4, 2), (40, 3))]
    nll, batch, logprobs = nll_and_reference_logprobs(examples, chunk_size=2)
    vocabulary = np.arange(logprobs.shape[-1])
    expected = []
    for row, example in enumerate(examples):
        for offset, token in enumerate(example.completion_ids):
            row_logprobs = logprobs[row, batch.completion_start + offset - 1]
            constraint = example.constraints[offset] if example.constraints else None
            allowed = vocabulary if constraint is None else (
                np.asarray(constraint.token_ids) if constraint.only
                else np.setdiff1d(vocabulary, constraint.token_ids))
            expected.append(-(row_logprobs[token] - np.log(np.exp(row_logprobs[allowed]).sum())))
    np.testing.assert_allclose(nll, np.mean(expected), rtol=1e-5)
    with pytest.raises(ValueError, match="3 completion tokens but 1 constraints"):
        Example((1,), (2, 3, 4), constraints=(None,))


# One batch holds both answers, or each answer is a batch of its own: a batch's weights must not be normalised away
# (each answer would then count the same).
@pytest.mark.parametrize("batch_size, steps", [(2, 150), (1, 300)])
def test_weighted_fit_imitates_each_completion_in_proportion_to_its_weight(batch_size, steps):
    # Reward-weighted regression's optimum: one prompt, two answers weighted 3:1 -> probabilities 0.75 : 0.25.
    first, second, eos = 10, 11, 2
    examples = [Example((5, 6, 7), (first, eos), weight=0.6), Example((5, 6, 7), (second, eos), weight=0.2)]
    model = tiny_model()
    SupervisedTrainer(model, SFTConfig(optimizer=OPTIMIZER, batch_size=batch_size)).fit(examples, steps, pad_id=0)
    tokens = jnp.asarray([[5, 6, 7]])
    hidden = model(tokens, jnp.arange(3)[None], jnp.ones((1, 3), bool))
    probabilities = jax.nn.softmax(model.logits(hidden)[0, -1].astype(jnp.float32))
    assert float(probabilities[first] / (probabilities[first] + probabilities[second])) == pytest.approx(0.75, abs=0.02)
    assert float(probabilities[first] + probabilities[second]) > 0.95


def test_fit_lowers_the_nll_of_the_teacher_completion():
    examples = [Example((5, 6, 7, 8), (10, 11, 12, 2)), Example((9, 6, 7), (10, 11, 12, 2))]
    trainer = SupervisedTrainer(tiny_model(), SFTConfig(optimizer=OPTIMIZER, batch_size=2))
    history = trainer.fit(examples, steps=30, pad_id=0)
    assert history[0]["nll"] > 3.0
    assert history[-1]["nll"] < 0.1 * history[0]["nll"]
    assert set(history[-1]) == {"nll", "grad_norm"}


def _routes(prompts: int, routes: int, seed: int) -> list[Example]:
    """`routes` weighted completions of each of `prompts` prompts, a prompt's examples consecutive."""
    rng = np.random.default_rng(seed)
    return [
        Example(prompt, (int(token), 30 + route, 2), weight=float(rng.uniform(0, 1)))
        for prompt in (tuple(rng.integers(3, 256, size=int(rng.integers(3, 8)))) for _ in range(prompts))
        for token in rng.integers(3, 256, size=1)
        for route in range(routes)
    ]


def test_a_prompts_examples_are_shuffled_as_one_unit_and_batched_whole():
    examples = _routes(prompts=6, routes=4, seed=0)
    trainer = SupervisedTrainer(tiny_model(), SFTConfig(optimizer=OPTIMIZER, batch_size=8))
    batches = []
    trainer._fit_step = lambda chosen, pad_id: batches.append(chosen) or {"nll": 0.0}
    trainer.fit(examples, steps=6, pad_id=0)
    for chosen in batches:
        assert [e.prompt_ids for e in chosen[0::4]] == [e.prompt_ids for e in chosen[3::4]]
        assert chosen[0].prompt_ids != chosen[4].prompt_ids
        assert trainer.batch(chosen, pad_id=0).prompt_block_size(8) == 4
    # Two passes over the 6 prompts, each prompt once per pass, in a shuffled order.
    first_pass = [chosen[i].prompt_ids for chosen in batches[:3] for i in (0, 4)]
    assert sorted(first_pass) == sorted(e.prompt_ids for e in examples[::4])
    assert first_pass != [e.prompt_ids for e in examples[::4]]


def test_steps_with_a_shared_prompt_encoding_equal_steps_on_full_rows():
    examples = _routes(prompts=4, routes=4, seed=1)
    # SGD: the two encodings sum the gradients in other orders, which AdamW would lift to steps of order lr.
    optimizer = SGDConfig(learning_rate=1e-2, schedule="constant", total_steps=1)
    shared, full = (
        SupervisedTrainer(tiny_model(), SFTConfig(optimizer=optimizer, batch_size=8, share_prompts=share))
        for share in (True, False)
    )
    shared_history = shared.fit(examples, steps=4, pad_id=0)
    full_history = full.fit(examples, steps=4, pad_id=0)
    np.testing.assert_allclose([h["nll"] for h in shared_history], [h["nll"] for h in full_history], rtol=1e-5)
    start, trained = (jax.tree.leaves(nnx.state(model, nnx.Param)) for model in (tiny_model(), full.model))
    assert max(float(jnp.abs(a - b).max()) for a, b in zip(trained, start)) > 1e-3  # the steps did move the model
    assert_same_sgd_state(
        (nnx.state(shared.model, nnx.Param), shared.opt_state), (nnx.state(full.model, nnx.Param), full.opt_state),
        optimizer=optimizer, steps=4,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0},
        {"batch_size": -3},
    ],
)
def test_bad_sft_configs_are_rejected(kwargs):
    with pytest.raises(ValueError):
        SFTConfig(**kwargs)


def test_bad_examples_are_rejected():
    with pytest.raises(ValueError, match="together"):
        Example((1,), (2, 3), probe_index=1)
    with pytest.raises(ValueError, match="outside"):
        Example((1,), (2, 3), probe_index=2, probe_label=0)
    trainer = SupervisedTrainer(tiny_model(), SFTConfig(optimizer=OPTIMIZER))
    with pytest.raises(ValueError, match="no supervised examples"):
        trainer.fit([], steps=1, pad_id=0)
    for weight in (-0.5, float("nan")):
        with pytest.raises(ValueError, match="weight"):
            Example((1,), (2, 3), weight=weight)
    with pytest.raises(ValueError, match="weight 0"):
        trainer.fit([Example((1,), (2, 3), weight=0.0)], 1, 0)


class MeanStateHead:
    """A test head: a scale `a` times the mean over labelled rows of (label - a * mean_h state)^2."""

    def init(self, hidden_size, key):
        del hidden_size, key
        return {"a": jnp.float32(0.5)}

    def check_labels(self, labels):
        if not labels <= {0, 1}:
            raise ValueError(f"labels {sorted(labels)} outside {{0, 1}}")

    def loss(self, params, states, labels):
        labelled = labels >= 0
        error = jnp.where(labelled, labels - params["a"] * states.mean(axis=-1), 0.0)
        value = jnp.sum(error**2) / jnp.maximum(labelled.sum(), 1)
        return (2.0 * value,), {"head_loss": value}


def test_a_head_trains_its_own_parameters_on_the_marked_states_beside_the_nll():
    examples = [Example((3 + label, 40, 41), (20, 21, 2), probe_index=1, probe_label=label) for label in range(2)]
    optimizer = SGDConfig(learning_rate=1e-2, schedule="constant", total_steps=1, max_grad_norm=None)
    plain = SupervisedTrainer(tiny_model(), SFTConfig(optimizer=optimizer, batch_size=2))
    headed = SupervisedTrainer(tiny_model(), SFTConfig(optimizer=optimizer, batch_size=2, head=MeanStateHead()))
    [plain_step], [step] = plain.fit(examples, steps=1, pad_id=0), headed.fit(examples, steps=1, pad_id=0)

    model = tiny_model()
    batch = headed.batch(examples, pad_id=0)
    hidden = model(jnp.asarray(batch.tokens), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask))
    # The state that predicts completion token 1 sits at column completion_start (the token before it).
    states = np.asarray(hidden[:, batch.completion_start], np.float64)
    means = states.mean(axis=-1)
    expected = np.mean((np.array([0.0, 1.0]) - 0.5 * means) ** 2)
    assert step["head_loss"] == pytest.approx(expected, rel=1e-4)
    assert step["nll"] == pytest.approx(plain_step["nll"], rel=1e-6) and set(plain_step) == {"nll", "grad_norm"}
    # d/da of 2 * mean (y - a m)^2 = -4 mean (y - a m) m, one SGD step of rate 1e-2.
    expected_a = 0.5 + 1e-2 * 4 * np.mean((np.array([0.0, 1.0]) - 0.5 * means) * means)
    assert float(headed.head_params["a"]) == pytest.approx(expected_a, rel=1e-4)
    moved = [not np.allclose(a, b) for a, b in zip(jax.tree.leaves(nnx.state(headed.model, nnx.Param)),
                                                    jax.tree.leaves(nnx.state(plain.model, nnx.Param)))]
    assert any(moved)  # the head's loss reaches the model too
    np.testing.assert_allclose(
        np.asarray(marked_states(hidden[:, batch.completion_start - 1 :], jnp.asarray([1, 1]))), states, rtol=1e-6
    )


def test_a_heads_inputs_are_checked():
    trainer = SupervisedTrainer(tiny_model(), SFTConfig(optimizer=OPTIMIZER, head=MeanStateHead()))
    with pytest.raises(ValueError, match="no example has a probe label"):
        trainer.fit([Example((1,), (2, 3))], steps=1, pad_id=0)
    with pytest.raises(ValueError, match="outside"):
        trainer.fit([Example((1,), (2, 3), probe_index=0, probe_label=2)], steps=1, pad_id=0)
    with pytest.raises(ValueError, match="needs probe_indices"):
        trainer.step(trainer.batch([Example((1,), (2, 3))], pad_id=0))

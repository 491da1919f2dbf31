"""The learner on batches whose row count does not split into its mini-batches, micro-batches or devices.

With recursion rounds a batch holds the first rounds and however many follow-up rounds were valid, a number that
changes every iteration. Mini-batches are padded with rows that carry no loss (`Trajectories.padded`); each test
compares the padded update with the same rows run without padding, where such a run exists.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from models.config import ModelConfig
from models.sharding import make_mesh
from models.transformer import Transformer
from rl import advantages
from rl.learner import Learner, LearnerConfig, OptimizerConfig, optimizer_steps_per_update
from rl.loop import LoopConfig, Rollout, TrainingLoop
from rl.losses import LossConfig
from rl.trajectories import build
from rollout.types import SamplingParams
from tests.rl.helpers import RecordingLearner, SeededSampler
from tests.tiny_models import tiny_config

CONFIG = ModelConfig.from_hf(tiny_config("llama", num_hidden_layers=1))
# Padding changes the passes and devices the rows are summed over, so parameters agree to fp32 rounding, not bits.
# AdamW scales each coordinate by its own size, so a coordinate whose gradient is rounding noise can move by a
# fraction of the rate; at lr 5e-5 the tests here stay within 1e-6 (0.02 of the rate; measured: 2.5e-8 at most on an
# Intel Xeon host), the bound tests/rl/test_learner.py uses for reordered sums. A uniform rescaling of the gradient
# (a padding row counted in a denominator) would barely move AdamW's parameters, so loss and gradient norm are
# compared too, at rtol 1e-5 (atol 1e-7 for a loss whose terms nearly cancel).
LEARNING_RATE = 5e-5
METRICS = ("loss", "loss/policy", "grad_norm", "entropy", "ratio", "mismatch/k3")


def _model() -> Transformer:
    return Transformer(CONFIG, rngs=nnx.Rngs(0))


def _batch(rows: int, group_size: int, seed: int = 0):
    """A GRPO batch of `rows` rows in groups of `group_size` consecutive rows sharing a prompt (the last group may be
    shorter, as a round of follow-ups is)."""
    rng = np.random.default_rng(seed)
    group_ids = np.arange(rows) // group_size
    prompts = [list(rng.integers(3, 250, size=length)) for length in rng.integers(3, 12, size=group_ids[-1] + 1)]
    completions = [list(rng.integers(3, 250, size=rng.integers(1, 9))) for _ in range(rows)]
    sampler = [list(-rng.uniform(3.0, 8.0, size=len(c))) for c in completions]
    adv = advantages.compute("grpo", rng.integers(0, 2, size=rows).astype(np.float64), group_ids)
    return build([prompts[g] for g in group_ids], completions, sampler, adv, group_ids, pad_id=0, length_buckets=(32,))


def _config(**changes) -> LearnerConfig:
    return LearnerConfig(
        loss=LossConfig(clip_high=0.28), optimizer=OptimizerConfig(learning_rate=LEARNING_RATE, total_steps=20),
        temperature=0.7, **changes,
    )


def _train(learner: Learner, batch, updates: int = 2):
    metrics = [learner.update(batch) for _ in range(updates)]
    state = [np.asarray(x) for x in jax.tree.leaves(learner.params) + jax.tree.leaves(learner.opt_state)]
    return state, metrics


def _assert_same_update(padded, reference):
    (padded_state, padded_metrics), (reference_state, reference_metrics) = padded, reference
    for a, b in zip(padded_state, reference_state):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    for key in METRICS:
        np.testing.assert_allclose(padded_metrics[1][key], reference_metrics[1][key], rtol=1e-5, atol=1e-7)
    assert padded_metrics[1]["optimizer_steps"] == reference_metrics[1]["optimizer_steps"]


def _moved(state) -> float:
    start = [np.asarray(x) for x in jax.tree.leaves(Learner(_model(), _config()).params)]
    return max(float(np.abs(a - b).max()) for a, b in zip(state, start))


def test_optimizer_steps_per_update_count_a_shorter_last_mini_batch():
    assert optimizer_steps_per_update(32, 8, 1) == 4
    assert optimizer_steps_per_update(36, 8, 2) == 10  # 4 full mini-batches and one of 4 rows, twice
    assert optimizer_steps_per_update(5, None, 3) == 3
    assert optimizer_steps_per_update(5, 64, 1) == 1


@pytest.mark.parametrize(
    "changes",
    [
        {},
        # The padding rows run through the model as rows of their own.
        dict(skip_zero_gradient_rows=False, run_duplicates_once=False, share_prompts=False),
    ],
)
def test_rows_that_do_not_split_into_micro_batches_are_padded_with_the_same_update(changes):
    batch = _batch(rows=6, group_size=4)  # a group of 4 and one of 2
    padded = Learner(_model(), _config(micro_batch_size=4, ppo_epochs=2, **changes))
    padded_result = _train(padded, batch)
    assert padded_result[1][1]["padding_rows"] == pytest.approx(2 / 6)
    reference = _train(Learner(_model(), _config(ppo_epochs=2, **changes)), batch)  # one pass of the 6 rows
    assert reference[1][1]["padding_rows"] == 0.0
    _assert_same_update(padded_result, reference)
    assert _moved(reference[0]) > 2 * LEARNING_RATE
    # Log-probs of a batch that does not split into micro-batches are those of the rows run whole.
    whole_rows = Learner(padded.model, _config()).logprobs(batch)
    np.testing.assert_allclose(np.asarray(padded.logprobs(batch)), np.asarray(whole_rows), rtol=0, atol=2e-6)


def test_a_last_mini_batch_that_is_short_is_its_own_step_and_the_padding_content_does_not_matter():
    batch = _batch(rows=10, group_size=4)
    config = _config(mini_batch_size=4, micro_batch_size=2, skip_zero_gradient_rows=False)
    learner = Learner(_model(), config)
    padded = _train(learner, batch)
    assert padded[1][1]["optimizer_steps"] == 3 and learner.optimizer_step == 6
    assert padded[1][1]["padding_rows"] == pytest.approx(2 / 10)
    # The caller pads the same rows to 12 with rows of other tokens and no loss: mini-batches of 4 split evenly.
    others = batch.rows(np.array([0, 5]))
    random_tokens = np.random.default_rng(5).integers(3, 250, size=others.tokens.shape).astype(np.int32)
    others = others.replace(
        tokens=np.where(others.attention_mask, random_tokens, others.tokens),
        loss_mask=np.zeros_like(others.loss_mask), advantages=np.zeros_like(others.advantages),
    )
    explicit = jax.tree.map(lambda a, b: np.concatenate([a, b]), batch, others)
    assert explicit.batch_size == 12 and explicit.length == batch.length
    _assert_same_update(padded, _train(Learner(_model(), config), explicit))


def test_a_mini_batch_that_does_not_split_over_the_devices_is_padded_with_the_same_update():
    batch = _batch(rows=12, group_size=4)
    config = _config(mini_batch_size=6)
    sharded = Learner(_model(), config, mesh=make_mesh(fsdp=4, tp=2))  # mini-batches of 6 rows padded to 8
    sharded_result = _train(sharded, batch)
    assert sharded_result[1][1]["padding_rows"] == pytest.approx(4 / 12)
    assert len(sharded.model.layers[0].mlp.up_proj.kernel[...].sharding.device_set) == 8
    reference = _train(Learner(_model(), config), batch)
    _assert_same_update(sharded_result, reference)
    assert _moved(reference[0]) > 2 * LEARNING_RATE


class FollowUpsWhenEven:
    """A world whose first round is valid when its first token is even (reward 0.5 + 0.5 * [second token even]) and
    then gets a follow-up round; a format error (odd first token) scores 0 and ends the episode. The number of
    follow-up rows in an iteration is the number of valid first rounds, which varies."""

    num_questions = 3
    question_labels = None

    def prompt_ids(self, question):
        return [1, 2, question + 3]

    def score(self, questions, completions, contexts, sample_ids):
        rollouts = []
        for completion, context in zip(completions, contexts or [None] * len(completions)):
            own = float(completion[0] % 2 == 0) * (0.5 + 0.5 * float(completion[1] % 2 == 0))
            if context is not None:
                rollouts.append(Rollout(0.2 * context + 0.8 * own, {"correct": own}))
            else:
                valid = completion[0] % 2 == 0
                rollouts.append(Rollout(own, {"correct": own}, context=own if valid else None,
                                        followup_prompt_ids=[1, 2, 200 + completion[1]] if valid else None))
        return rollouts

    def decode(self, token_ids):
        return " ".join(map(str, token_ids))



def test_a_loop_whose_follow_up_rounds_vary_trains_every_iteration_with_any_batch_sizes():
    # 2 questions x 4 = 8 first rounds, then a row per valid one: 8 + F rows, F changing every iteration. Neither
    # mini-batches of 3 rows nor the 2 data-parallel devices divide every such count.
    learner = RecordingLearner(
        _model(), _config(mini_batch_size=3, micro_batch_size=3), mesh=make_mesh(fsdp=2, tp=1)
    )
    loop = TrainingLoop(
        LoopConfig(iterations=4, questions_per_iteration=2, group_size=4, recursion_rounds=1, length_buckets=(16,)),
        learner=learner, sampler=SeededSampler(), sampling_params=SamplingParams(max_new_tokens=3),
        weight_sync=lambda model, version: None, environment=FollowUpsWhenEven(), pad_id=0,
    )
    history = loop.run()
    rows = [batch.batch_size for batch in learner.batches]
    follow_ups = [int(h["recursion/round1_rows"]) for h in history]
    assert rows == [8 + f for f in follow_ups] and len(set(rows)) > 1, rows
    assert any(r % 3 for r in rows) and any(r % 2 for r in rows)
    for size, metrics in zip(rows, learner.metrics):
        assert metrics["optimizer_steps"] == -(-size // 3)
    assert learner.optimizer_step == sum(-(-size // 3) for size in rows)
    assert sum(h["recursion/round1_trained_rows"] for h in history) > 0

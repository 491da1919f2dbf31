"""The Learner on tiny random models: log-probs, exact micro-batching, sharding, resume, and a toy bandit."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.config import ModelConfig
from models.sharding import make_mesh
from models.transformer import Transformer
from rl import advantages
from rl.checkpoint import Checkpointer
import rl.learner
from rl.learner import Learner, LearnerConfig, OptimizerConfig
from rl.losses import LossConfig
from rl.trajectories import Trajectories, build
from tests.rl.helpers import SGDConfig, assert_same_training_state
from tests.tiny_models import tiny_config

# One layer keeps compilation, which dominates these tests on a CPU, short.
CONFIG = ModelConfig.from_hf(tiny_config("llama", num_hidden_layers=1))
# The rate of the SGD runs that compare two ways of computing an update (tests/rl/helpers.py): over a test the updates
# move parameters by more than 1e-3 (asserted), some 1e3 times the comparisons' tolerance of ~1e-7 per step.
SGD_RATE = 1e-2


def _model(seed: int = 0, config: ModelConfig = CONFIG) -> Transformer:
    return Transformer(config, rngs=nnx.Rngs(seed))


def _random_batch(seed: int, rows: int = 8):
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(3, 250, size=rng.integers(2, 7))) for _ in range(rows)]
    completions = [list(rng.integers(3, 250, size=rng.integers(1, 9))) for _ in range(rows)]
    sampler = [list(-rng.uniform(3.0, 8.0, size=len(c))) for c in completions]
    group_ids = np.repeat(np.arange(rows // 4), 4)
    rewards = rng.integers(0, 2, size=rows).astype(np.float64)
    adv = advantages.compute("grpo", rewards, group_ids)
    return build(prompts, completions, sampler, adv, group_ids, pad_id=0, length_buckets=(16,))


def _params_of(learner: Learner) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(learner.params)]


def test_logprobs_of_padded_rows_equal_unpadded_sequences():
    model = _model()
    batch = _random_batch(0)
    learner = Learner(model, LearnerConfig(temperature=0.7, logprob_chunk_size=5, micro_batch_size=4))
    got = np.asarray(learner.logprobs(batch))

    @nnx.jit
    def unpadded_logprobs(model, tokens):
        hidden = model(tokens, jnp.arange(tokens.shape[1])[None], jnp.ones_like(tokens, dtype=bool))
        logits = model.logits(hidden)[0, :-1] / 0.7
        return jax.nn.log_softmax(logits)[jnp.arange(tokens.shape[1] - 1), tokens[0, 1:]]

    start = batch.completion_start
    for row in (0, 3, 5):
        real = np.nonzero(batch.attention_mask[row])[0]
        expected = np.asarray(unpadded_logprobs(model, jnp.asarray(batch.tokens[row, real])[None]))
        completion = real[1:] >= start  # prompt columns carry no loss, so their logits are not computed
        np.testing.assert_allclose(got[row, real[1:][completion]], expected[completion], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[row, :start], 0.0)


@pytest.mark.parametrize("ppo_epochs, mini_batch_size", [(1, None), (2, 4)])
def test_micro_batch_split_does_not_change_parameters(ppo_epochs, mini_batch_size):
    rows = 8
    mini = mini_batch_size or rows
    batch = _random_batch(1, rows)
    loss = LossConfig(kl_coef=0.05, entropy_coef=0.01, clip_high=0.28, mismatch_correction="tis-token")
    results = []
    for micro_batches in (1, 2, 4):
        config = LearnerConfig(
            loss=loss,
            optimizer=SGDConfig(learning_rate=SGD_RATE, total_steps=10),
            ppo_epochs=ppo_epochs,
            mini_batch_size=mini_batch_size,
            micro_batch_size=mini // micro_batches,
        )
        learner = Learner(_model(), config)
        metrics = [learner.update(batch) for _ in range(2)]
        results.append((learner, metrics))
    reference, reference_metrics = results[0]
    assert reference_metrics[1]["kl"] > 0 and reference_metrics[0]["optimizer_steps"] == ppo_epochs * rows // mini
    for learner, metrics in results[1:]:
        assert_same_training_state(learner, reference)
        for key in ("loss", "kl", "entropy", "grad_norm", "mismatch/k3"):
            np.testing.assert_allclose(metrics[1][key], reference_metrics[1][key], rtol=1e-5, atol=1e-7)
    start = _params_of(Learner(_model(), config))
    moved = max(float(np.abs(a - b).max()) for a, b in zip(_params_of(reference), start))
    assert moved > 1e-3  # the updates did change the parameters


def test_mini_batches_trimmed_to_their_own_length_give_the_same_update():
    rng = np.random.default_rng(7)
    # The first group's prompts are long, the second's short: only the first mini-batch needs 32 columns.
    prompts = [list(rng.integers(3, 250, size=20)) for _ in range(4)] + [list(rng.integers(3, 250, size=4))] * 4
    completions = [list(rng.integers(3, 250, size=rng.integers(2, 9))) for _ in range(8)]
    sampler = [list(-rng.uniform(3.0, 8.0, size=len(c))) for c in completions]
    group_ids = np.repeat(np.arange(2), 4)
    adv = advantages.compute("grpo", rng.integers(0, 2, size=8).astype(np.float64), group_ids)
    trimmable, one_length = (
        build(prompts, completions, sampler, adv, group_ids, pad_id=0, length_buckets=buckets)
        for buckets in ((16, 32), (32,))
    )
    assert trimmable.length == one_length.length == 32
    assert trimmable.rows(slice(4, 8)).trimmed_columns() == (16, 32)
    assert one_length.rows(slice(4, 8)).trimmed_columns() == (0, 32)  # one bucket: nothing to trim
    config = LearnerConfig(optimizer=SGDConfig(learning_rate=SGD_RATE), ppo_epochs=2, mini_batch_size=4)
    trimmed, padded = Learner(_model(), config), Learner(_model(), config)
    trimmed.update(trimmable)
    padded.update(one_length)
    assert_same_training_state(trimmed, padded)


@pytest.mark.parametrize("length_buckets, steady_shapes", [((16, 32), False), ((32,), False), ((16, 32), True)])
def test_mini_batches_trimmed_to_their_own_longest_completion_give_the_same_update(
    monkeypatch, length_buckets, steady_shapes
):
    rng = np.random.default_rng(11)
    prompts = [list(rng.integers(3, 250, size=6))] * 4 + [list(rng.integers(3, 250, size=5))] * 4
    # The first group writes long completions, the second short ones: only the first mini-batch needs a block of 16.
    completions = [list(rng.integers(3, 250, size=size)) for size in rng.integers(9, 17, size=4)] + [
        list(rng.integers(3, 250, size=size)) for size in rng.integers(1, 4, size=4)
    ]
    sampler = [list(-rng.uniform(3.0, 8.0, size=len(c))) for c in completions]
    group_ids = np.repeat(np.arange(2), 4)
    adv = advantages.compute("grpo", np.array([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]), group_ids)
    trimmable, one_width = (
        build(prompts, completions, sampler, adv, group_ids, pad_id=0, length_buckets=length_buckets,
              completion_buckets=buckets)
        for buckets in ((4, 16), (16,))
    )
    assert trimmable.length == one_width.length == 32 and trimmable.completion_start == 16
    start, stop = trimmable.rows(slice(4, 8)).trimmed_columns()
    # A block of 4; with a 16-column bucket the prompt padding goes too, with one of 32 the row is padded on the left.
    assert (start, stop) == ((4, 20) if length_buckets == (16, 32) else (-12, 20))
    assert one_width.rows(slice(4, 8)).trimmed_columns() == (0, 32)
    config = LearnerConfig(
        optimizer=SGDConfig(learning_rate=SGD_RATE), ppo_epochs=2, mini_batch_size=4, old_logprobs="recompute",
        loss=LossConfig(aggregation="token-mean"), steady_shapes=steady_shapes,
    )
    shapes, train_step = [], rl.learner._train_step

    def recorded(*args, **kwargs):
        batch = args[4]
        shapes.append((batch.length, batch.length - batch.completion_start))
        return train_step(*args, **kwargs)

    monkeypatch.setattr(rl.learner, "_train_step", recorded)
    trimmed, whole = Learner(_model(), config), Learner(_model(), config)
    trimmed.update(trimmable)
    # (row length, completion block) of each optimizer step, over two passes of two mini-batches; with steady shapes
    # the second runs at the first's
    assert shapes == [(32, 16), (32, 16) if steady_shapes else (stop - start, 4)] * 2
    whole.update(one_width)
    assert shapes[4:] == [(32, 16)] * 4
    assert_same_training_state(trimmed, whole)



def test_steady_shapes_started_at_the_largest_lengths_run_every_step_at_one_shape_with_the_same_update(monkeypatch):
    rng = np.random.default_rng(5)

    def batch(prompt_length: int, completion_lengths: tuple[int, int], rewards: list[float]) -> Trajectories:
        prompts = [list(rng.integers(3, 250, size=prompt_length))] * 4 + [list(rng.integers(3, 250, size=3))] * 4
        completions = [list(rng.integers(3, 250, size=rng.integers(*completion_lengths))) for _ in range(8)]
        sampler = [list(-rng.uniform(3.0, 8.0, size=len(c))) for c in completions]
        group_ids = np.repeat(np.arange(2), 4)
        adv = advantages.compute("grpo", np.asarray(rewards), group_ids)
        return build(prompts, completions, sampler, adv, group_ids, pad_id=0, length_buckets=(16, 32, 64),
                     completion_buckets=(4, 8, 16))

    # Short then long completions and prompts; in the last batch the first group's rewards agree (no gradient).
    batches = [batch(4, (1, 4), [1, 0, 0, 1, 0, 1, 1, 0]), batch(11, (9, 17), [0, 1, 1, 0, 1, 0, 0, 1]),
               batch(6, (2, 6), [1, 1, 1, 1, 0, 1, 1, 0])]
    plain = LearnerConfig(optimizer=SGDConfig(learning_rate=SGD_RATE), mini_batch_size=8)
    steady = dataclasses.replace(plain, steady_shapes=True, steady_prompt_tokens=12, steady_completion_tokens=16)
    shapes, train_step = [], rl.learner._train_step

    def recorded(*args, **kwargs):
        rows = args[4]
        shapes.append((rows.batch_size, rows.length, rows.length - rows.completion_start))
        return train_step(*args, **kwargs)

    monkeypatch.setattr(rl.learner, "_train_step", recorded)
    learners = {}
    for name, config in (("plain", plain), ("steady", steady)):
        learners[name] = Learner(_model(), config)
        for each in batches:
            learners[name].update(each)
    plain_shapes, steady_shapes = shapes[:3], shapes[3:]
    assert len(set(plain_shapes)) == 3, plain_shapes
    # Every row, a completion block of 16 and the row length of 12 + 16 tokens' bucket, from the first step on.
    assert steady_shapes == [(8, 32, 16)] * 3
    assert_same_training_state(learners["steady"], learners["plain"])
    with pytest.raises(ValueError, match="both > 0, with steady_shapes"):
        dataclasses.replace(plain, steady_prompt_tokens=12, steady_completion_tokens=16)
    with pytest.raises(ValueError, match="both > 0, with steady_shapes"):
        dataclasses.replace(plain, steady_shapes=True, steady_completion_tokens=16)

def _grouped_batch(seed: int, groups: int = 3, group_size: int = 4):
    """A GRPO batch: each group's completions follow the same prompt, prompts of different lengths."""
    rng = np.random.default_rng(seed)
    rows = groups * group_size
    prompts = [list(rng.integers(3, 250, size=length)) for length in rng.integers(3, 12, size=groups)]
    completions = [list(rng.integers(3, 250, size=rng.integers(1, 9))) for _ in range(rows)]
    sampler = [list(-rng.uniform(3.0, 8.0, size=len(c))) for c in completions]
    group_ids = np.repeat(np.arange(groups), group_size)
    adv = advantages.compute("grpo", rng.integers(0, 2, size=rows).astype(np.float64), group_ids)
    return build([prompts[g] for g in group_ids], completions, sampler, adv, group_ids, pad_id=0, length_buckets=(32,))


@pytest.mark.parametrize("mini_batch_size, micro_batch_size, expected_block", [(None, None, 4), (6, 2, 2), (6, 3, 1)])
def test_prompts_shared_by_a_group_are_encoded_once_with_the_same_update(mini_batch_size, micro_batch_size,
                                                                        expected_block):  # fmt: skip
    batch = _grouped_batch(3)
    rows_per_pass = micro_batch_size or mini_batch_size or batch.batch_size
    # Aligned blocks of one prompt: 4 rows per group; a pass of 2 rows holds half a group; 3 rows straddle two.
    assert batch.prompt_block_size(rows_per_pass) == expected_block
    loss = LossConfig(kl_coef=0.05, entropy_coef=0.01, clip_high=0.28, mismatch_correction="tis-token")
    results = []
    for share_prompts in (True, False):
        config = LearnerConfig(
            loss=loss, optimizer=SGDConfig(learning_rate=SGD_RATE, total_steps=10), ppo_epochs=2,
            mini_batch_size=mini_batch_size, micro_batch_size=micro_batch_size, temperature=0.7,
            share_prompts=share_prompts,
        )
        learner = Learner(_model(), config)
        logprobs = np.asarray(learner.logprobs(batch))
        metrics = [learner.update(batch) for _ in range(2)]
        results.append((logprobs, learner, metrics))
    (shared_logprobs, shared, shared_metrics), (row_logprobs, by_row, row_metrics) = results
    assert np.abs(row_logprobs[batch.loss_mask]).min() > 0
    np.testing.assert_allclose(shared_logprobs, row_logprobs, rtol=0, atol=2e-5)
    assert_same_training_state(shared, by_row)
    for key in ("loss", "kl", "entropy", "grad_norm", "mismatch/k3"):
        np.testing.assert_allclose(shared_metrics[1][key], row_metrics[1][key], rtol=1e-5, atol=1e-7)


def _counting_logprob_passes(monkeypatch) -> list[int]:
    """Counts the learner's separate log-prob passes (old log-probs, reference log-probs)."""
    passes, original = [], rl.learner._batch_logprobs

    def counted(*args, **kwargs):
        passes.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(rl.learner, "_batch_logprobs", counted)
    return passes


@pytest.mark.parametrize("ppo_epochs, expected_passes", [(1, 3), (2, 4)])
def test_only_steps_after_the_first_recompute_old_logprobs(monkeypatch, ppo_epochs, expected_passes):
    passes = _counting_logprob_passes(monkeypatch)
    config = LearnerConfig(
        optimizer=OptimizerConfig(learning_rate=1e-3), ppo_epochs=ppo_epochs, mini_batch_size=2
    )
    metrics = Learner(_model(), config).update(_random_batch(4))
    # Four mini-batches: the first step's own forward pass is at the sampling weights; with a second pass over the
    # batch the first mini-batch needs its old log-probs again, after the weights moved.
    assert len(passes) == expected_passes and metrics["optimizer_steps"] == 4 * ppo_epochs


def test_sampler_old_logprobs_skip_the_recompute_and_make_the_sampler_the_behaviour_policy(monkeypatch):
    config = LearnerConfig(optimizer=OptimizerConfig(learning_rate=1e-3), mini_batch_size=2, temperature=0.7)
    batch = _random_batch(5)
    learner_logprobs = np.asarray(Learner(_model(), config).logprobs(batch))
    in_agreement = batch.replace(sampler_logprobs=learner_logprobs, old_logprobs=learner_logprobs)

    recomputed = Learner(_model(), config)
    recomputed.update(in_agreement)
    passes = _counting_logprob_passes(monkeypatch)
    from_sampler = Learner(_model(), dataclasses.replace(config, old_logprobs="sampler"))
    from_sampler.update(in_agreement)
    assert passes == []
    # A sampler that agrees with the learner gives the recomputing learner's update.
    for a, b in zip(_params_of(recomputed), _params_of(from_sampler)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)

    # One that does not is the behaviour policy of every step after the first, which alone measures the mismatch.
    shifted = learner_logprobs + np.where(batch.loss_mask, 0.3, 0.0).astype(np.float32)
    disagreeing = batch.replace(sampler_logprobs=shifted, old_logprobs=shifted)
    recomputed = Learner(_model(), config)
    from_sampler = Learner(_model(), dataclasses.replace(config, old_logprobs="sampler"))
    recomputed_metrics, sampler_metrics = recomputed.update(disagreeing), from_sampler.update(disagreeing)
    np.testing.assert_allclose(sampler_metrics["mismatch/abs_logprob_diff"], 0.3, rtol=1e-4)
    np.testing.assert_allclose(recomputed_metrics["mismatch/abs_logprob_diff"], 0.3, rtol=1e-4)
    assert recomputed_metrics["ratio"] == pytest.approx(1.0, abs=0.05)
    assert sampler_metrics["ratio"] == pytest.approx((1 + 3 * np.exp(-0.3)) / 4, abs=0.05)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(_params_of(recomputed), _params_of(from_sampler)))
    assert moved > 1e-4

    # Rows sampled under earlier weights (the pipeline, `LoopConfig.max_staleness`): the sampler is then the
    # behaviour policy of the first step too; a recomputing learner's update does not change.
    stale = Learner(_model(), dataclasses.replace(config, old_logprobs="sampler"))
    assert stale.update(disagreeing, sampled_by_current_weights=False)["ratio"] == pytest.approx(np.exp(-0.3), abs=0.05)
    recomputed_stale = Learner(_model(), config).update(disagreeing, sampled_by_current_weights=False)
    assert recomputed_stale["ratio"] == recomputed_metrics["ratio"]


def _batch_with_silent_groups(rewards_per_group, group_size: int = 4):
    """A grouped batch whose rewards are given per group: a group whose rewards all agree has zero advantages."""
    batch = _grouped_batch(11, groups=len(rewards_per_group), group_size=group_size)
    rewards = np.asarray(rewards_per_group, dtype=np.float64).reshape(-1)
    group_ids = np.asarray(batch.group_ids)
    row_advantages = advantages.compute("grpo", rewards, group_ids)
    return batch.replace(advantages=np.where(batch.loss_mask, row_advantages[:, None], 0.0).astype(np.float32))


# The first group's rewards agree, as do the third's; in the fourth, the two rows at the mean have advantage 0.
SILENT_GROUPS = [[1, 1, 1, 1], [0, 1, 1, 0], [0, 0, 0, 0], [0, 0.5, 1, 0.5]]


@pytest.mark.parametrize(
    "policy_loss, aggregation, mini_batch_size, micro_batch_size, ppo_epochs, expected_skipped",
    [
        # One step: groups 2 and 4 run, 1 and 3 are skipped.
        ("ppo", "seq-mean-token-mean", None, None, 1, 0.5),
        # A step per group: the first step runs its silent group (it measures the mismatch), the third's takes
        # AdamW's step on a zero gradient; in two passes, old log-probs are recomputed only for the rows run.
        ("ppo", "token-mean", 4, None, 2, 0.25),
        ("gspo", "seq-mean-token-sum", 8, 4, 1, 0.5),
        ("cispo", "token-mean", 8, 2, 1, 0.5),
    ],
)
def test_rows_without_gradient_are_skipped_with_the_same_update(
    policy_loss, aggregation, mini_batch_size, micro_batch_size, ppo_epochs, expected_skipped
):
    batch = _batch_with_silent_groups(SILENT_GROUPS)
    assert (np.abs(batch.advantages).sum(axis=1) == 0).tolist() == [True] * 4 + [False] * 4 + [True] * 4 + [
        False, True, False, True
    ]
    clips = dict(clip_low=3e-4, clip_high=4e-4) if policy_loss == "gspo" else dict(clip_high=0.28)
    results = []
    for skip in (True, False):
        config = LearnerConfig(
            loss=LossConfig(policy_loss=policy_loss, aggregation=aggregation, **clips),
            # Momentum: a skipped mini-batch's step must still decay the optimizer's state and move the parameters.
            optimizer=SGDConfig(learning_rate=SGD_RATE, total_steps=20, momentum=0.9),
            ppo_epochs=ppo_epochs, mini_batch_size=mini_batch_size, micro_batch_size=micro_batch_size,
            temperature=0.7, skip_zero_gradient_rows=skip,
        )
        learner = Learner(_model(), config)
        metrics = [learner.update(batch) for _ in range(2)]
        results.append((learner, metrics))
    (skipped, skipped_metrics), (full, full_metrics) = results
    assert skipped_metrics[1]["skipped_rows"] == expected_skipped and full_metrics[1]["skipped_rows"] == 0.0
    assert skipped_metrics[1]["optimizer_steps"] == full_metrics[1]["optimizer_steps"]
    assert_same_training_state(skipped, full)
    for key in ("loss", "loss/policy", "grad_norm"):
        np.testing.assert_allclose(skipped_metrics[1][key], full_metrics[1][key], rtol=1e-5, atol=1e-8)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(_params_of(full), _params_of(Learner(_model(), config))))
    assert moved > 1e-3


def test_a_kl_or_entropy_term_keeps_zero_advantage_rows_but_not_rows_without_loss_tokens():
    batch = _batch_with_silent_groups(SILENT_GROUPS)
    # Dynamic sampling takes the agreeing groups out of the loss mask: those rows carry no term at all.
    dropped = np.repeat([True, False, True, False], 4)
    filtered = batch.replace(loss_mask=batch.loss_mask & ~dropped[:, None])
    for loss, expected_skipped in (
        (LossConfig(kl_coef=0.05), 0.0),
        (LossConfig(entropy_coef=0.01), 0.0),
        (LossConfig(), 0.25),  # the first group runs: the update's first step always runs a unit
    ):
        config = LearnerConfig(loss=loss, optimizer=OptimizerConfig(learning_rate=5e-5), mini_batch_size=4)
        assert Learner(_model(), config).update(batch)["skipped_rows"] == expected_skipped
    learners = []
    for skip in (True, False):
        config = LearnerConfig(
            loss=LossConfig(kl_coef=0.05), optimizer=SGDConfig(learning_rate=SGD_RATE), skip_zero_gradient_rows=skip
        )
        learner = Learner(_model(), config)
        metrics = [learner.update(filtered) for _ in range(2)]
        assert metrics[1]["skipped_rows"] == (0.5 if skip else 0.0) and metrics[1]["kl"] > 0
        learners.append(learner)
    assert_same_training_state(*learners)


def _batch_with_repeated_completions(seed: int = 13):
    """Four groups of four whose completions repeat as a sharpening policy's do: 1, 2, 3 and 4 distinct per group.
    Every row keeps its own advantage and sampler log-probs. The advantages are not centred per group: under GRPO's,
    a group of one completion would have a zero gradient, and so would test nothing."""
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(3, 250, size=length)) for length in (5, 9, 3, 7)]
    patterns = [[0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 0, 2], [0, 1, 2, 3]]
    completions = []
    for pattern in patterns:
        choices = [list(rng.integers(3, 250, size=rng.integers(2, 9))) for _ in range(4)]
        completions += [choices[index] for index in pattern]
    sampler = [list(-rng.uniform(3.0, 8.0, size=len(c))) for c in completions]
    group_ids = np.repeat(np.arange(4), 4)
    adv = rng.normal(size=16)
    return build([prompts[g] for g in group_ids], completions, sampler, adv, group_ids, pad_id=0, length_buckets=(32,))


@pytest.mark.parametrize(
    "policy_loss, aggregation, mini_batch_size, micro_batch_size, share_prompts, changes, expected_model_rows",
    [
        # A step per group: 1, 2, 4 and 4 rows run (3 distinct rows pad to 4); KL and recomputed old log-probs too.
        ("ppo", "token-mean", 4, None, True, dict(ppo_epochs=2, kl_coef=0.05), 11 / 16),
        # Two groups per step, a pass per group: 2 + 2 rows, then 4 + 4.
        ("gspo", "seq-mean-token-sum", 8, 4, True, {}, 12 / 16),
        # Passes of two rows share a prompt pairwise: the first step's pairs are all twins.
        ("cispo", "token-mean", 8, 2, True, dict(old_logprobs="sampler", entropy_coef=0.01), 12 / 16),
        # No shared prompts: twins are matched within a whole pass, 3 distinct rows pad to 4, then 7 to 8.
        ("ppo", "seq-mean-token-mean", 8, None, False, {}, 12 / 16),
    ],
)
def test_duplicate_rows_run_once_with_the_same_update(
    policy_loss, aggregation, mini_batch_size, micro_batch_size, share_prompts, changes, expected_model_rows
):
    batch = _batch_with_repeated_completions()
    loss_changes = {key: changes[key] for key in ("kl_coef", "entropy_coef") if key in changes}
    clips = dict(clip_low=3e-4, clip_high=4e-4) if policy_loss == "gspo" else dict(clip_high=0.28)
    results = []
    for run_once in (True, False):
        config = LearnerConfig(
            loss=LossConfig(policy_loss=policy_loss, aggregation=aggregation, **clips, **loss_changes),
            optimizer=SGDConfig(learning_rate=SGD_RATE, total_steps=20, momentum=0.9),
            ppo_epochs=changes.get("ppo_epochs", 1), mini_batch_size=mini_batch_size,
            micro_batch_size=micro_batch_size, temperature=0.7, share_prompts=share_prompts,
            old_logprobs=changes.get("old_logprobs", "recompute"), run_duplicates_once=run_once,
        )
        learner = Learner(_model(), config)
        logprobs = np.asarray(learner.logprobs(batch))
        metrics = [learner.update(batch) for _ in range(2)]
        results.append((logprobs, learner, metrics))
    (once_logprobs, once, once_metrics), (all_logprobs, every_row, all_metrics) = results
    assert once_metrics[1]["model_rows"] == expected_model_rows and all_metrics[1]["model_rows"] == 1.0
    # Log-probs reach about -8, where a float32 ulp is 4.8e-7: rows run in other passes differ by a few ulps (one
    # measured on a Xeon), a twin given another row's log-probs by O(1).
    np.testing.assert_allclose(once_logprobs, all_logprobs, rtol=0, atol=2e-5)
    # Twins' gradients are summed in another order; a twin taking the wrong row's values would move parameters by
    # about a row's share of each step.
    assert_same_training_state(once, every_row)
    for key in ("loss", "loss/policy", "grad_norm", "entropy", "ratio") + ("kl",) * ("kl_coef" in changes):
        np.testing.assert_allclose(once_metrics[1][key], all_metrics[1][key], rtol=1e-5, atol=1e-8)
    start = _params_of(Learner(_model(), config))
    moved = max(float(np.abs(a - b).max()) for a, b in zip(_params_of(every_row), start))
    assert moved > 1e-3


def _silent_groups_batch(seed: int):
    del seed
    return _batch_with_silent_groups(SILENT_GROUPS)


# One pass per row; one per prompt; one per prompt with zero-gradient groups skipped; repeated completions run once.
@pytest.mark.parametrize(
    "make_batch", [_random_batch, _grouped_batch, _silent_groups_batch, _batch_with_repeated_completions]
)
def test_sharded_update_matches_single_device(make_batch):
    batch = make_batch(2)
    # SGD, not AdamW: across devices the gradients are summed in another order, which AdamW turned into a parameter
    # 1.03e-5 off at lr 1e-3 on a Xeon with AVX-512 (tests/rl/helpers.py); momentum keeps a sharded optimizer state.
    config = LearnerConfig(optimizer=SGDConfig(learning_rate=SGD_RATE, momentum=0.9), micro_batch_size=4)
    single = Learner(_model(), config)
    sharded = Learner(_model(), config, mesh=make_mesh(fsdp=2, tp=2))
    for _ in range(2):
        single_metrics = single.update(batch)
        sharded_metrics = sharded.update(batch)
    np.testing.assert_allclose(sharded_metrics["loss"], single_metrics["loss"], rtol=1e-4, atol=1e-6)
    for key in ("skipped_rows", "model_rows"):
        assert sharded_metrics[key] == single_metrics[key]
    assert_same_training_state(sharded, single)
    kernel = sharded.model.layers[0].mlp.up_proj.kernel[...]
    assert len(kernel.sharding.device_set) == 4


def test_reference_model_exists_only_with_kl():
    assert Learner(_model(), LearnerConfig()).reference_params is None
    with_kl = Learner(_model(), LearnerConfig(loss=LossConfig(kl_coef=0.1)))
    assert with_kl.reference_params is not None
    with_kl.update(_random_batch(3))
    # The reference stays at the starting weights while the policy moves.
    reference = [np.asarray(x) for x in jax.tree.leaves(with_kl.reference_params)]
    for a, b in zip(reference, _params_of(Learner(_model(), LearnerConfig()))):
        np.testing.assert_array_equal(a, b)


def test_resumed_run_is_bit_identical(tmp_path):
    config = LearnerConfig(
        loss=LossConfig(kl_coef=0.05),
        optimizer=OptimizerConfig(learning_rate=1e-3, warmup_steps=2, total_steps=8),
        ppo_epochs=2,
        mini_batch_size=4,
    )

    def run(learner, key, start, stop, checkpointer=None):
        for step in range(start, stop):
            key, batch_key = jax.random.split(key)
            learner.update(_random_batch(int(jax.random.randint(batch_key, (), 0, 10_000))))
            if checkpointer is not None:
                checkpointer.save(step + 1, learner, key, {"data_position": step + 1})
        return key

    uninterrupted = Learner(_model(), config)
    run(uninterrupted, jax.random.key(7), 0, 4)

    checkpointer = Checkpointer(tmp_path / "ckpt", keep=2)
    assert checkpointer.restore(Learner(_model(), config)) is None
    run(Learner(_model(), config), jax.random.key(7), 0, 2, checkpointer)
    checkpointer.close()

    resumed = Learner(_model(seed=123), config)  # different init: everything must come from the checkpoint
    step, key, loop_state = Checkpointer(tmp_path / "ckpt", keep=2).restore(resumed)
    assert (step, loop_state, resumed.step, resumed.optimizer_step) == (2, {"data_position": 2}, 2, 8)
    run(resumed, key, step, 4)
    for a, b in zip(_params_of(uninterrupted), _params_of(resumed)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(uninterrupted.opt_state), jax.tree.leaves(resumed.opt_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_checkpointer_keeps_only_the_last_n(tmp_path):
    learner = Learner(_model(), LearnerConfig())
    checkpointer = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        checkpointer.save(step, learner, jax.random.PRNGKey(step), {})
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["2", "3"]
    step, key, _ = checkpointer.restore(learner)
    assert step == 3
    np.testing.assert_array_equal(key, jax.random.PRNGKey(3))


def _sample_first_tokens(model, prompts, key, group_size):
    """Samples one token per rollout from the model itself; returns tokens and their log-probs."""
    tokens = jnp.asarray(prompts, jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    hidden = model(tokens, positions, jnp.ones_like(tokens, dtype=bool))
    log_probs = jax.nn.log_softmax(model.logits(hidden[:, -1]).astype(jnp.float32))
    log_probs = jnp.repeat(log_probs, group_size, axis=0)
    sampled = jax.random.categorical(key, log_probs)
    return np.asarray(sampled), np.asarray(jnp.take_along_axis(log_probs, sampled[:, None], axis=1)[:, 0]), log_probs


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_toy_bandit_learns_the_rewarded_token(estimator):
    vocab, target, group_size = 16, 11, 16
    model = _model(seed=1, config=CONFIG.replace(vocab_size=vocab))
    prompts = [[1, 5, 7], [1, 9, 3]]
    config = LearnerConfig(
        optimizer=OptimizerConfig(learning_rate=3e-3, schedule="constant", total_steps=100),
        loss=LossConfig(aggregation="token-mean"),
    )
    learner = Learner(model, config)
    key = jax.random.key(0)
    expected_rewards = []
    for _ in range(60):
        key, sample_key = jax.random.split(key)
        sampled, logprobs, all_log_probs = _sample_first_tokens(learner.model, prompts, sample_key, group_size)
        expected_rewards.append(float(np.exp(all_log_probs[:, target]).mean()))
        if expected_rewards[-1] > 0.9:
            break
        rewards = (sampled == target).astype(np.float64)
        group_ids = np.repeat(np.arange(len(prompts)), group_size)
        adv = advantages.compute(estimator, rewards, group_ids)
        batch = build(
            [prompts[g] for g in group_ids], [[int(t)] for t in sampled], [[float(lp)] for lp in logprobs],
            adv, group_ids, pad_id=0, length_buckets=(8,),
        )
        learner.update(batch)
    assert expected_rewards[0] < 0.2
    assert expected_rewards[-1] > 0.9, expected_rewards


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: LearnerConfig(ppo_epochs=0), "ppo_epochs"),
        (lambda: LearnerConfig(mini_batch_size=6, micro_batch_size=4), "multiple"),
        (lambda: LearnerConfig(micro_batch_size=0), "micro_batch_size"),
        (lambda: LearnerConfig(temperature=0.0), "temperature"),
        (lambda: LearnerConfig(old_logprobs="reference"), "old_logprobs"),
        (
            lambda: LearnerConfig(old_logprobs="sampler", loss=LossConfig(mismatch_correction="tis-token")),
            "would correct nothing",
        ),
        (lambda: OptimizerConfig(learning_rate=0.0), "learning_rate"),
        (lambda: OptimizerConfig(schedule="linear"), "schedule"),
        (lambda: OptimizerConfig(warmup_steps=20, total_steps=10), "warmup_steps"),
        (lambda: OptimizerConfig(max_grad_norm=0.0), "max_grad_norm"),
        (lambda: OptimizerConfig(eps=0.0), "eps"),
    ],
)
def test_bad_config_is_rejected(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_learning_rate_schedules():
    cosine = OptimizerConfig(learning_rate=1.0, warmup_steps=2, total_steps=10).learning_rate_schedule()
    np.testing.assert_allclose([float(cosine(s)) for s in (0, 1, 2, 6, 10)], [0, 0.5, 1, 0.5, 0], atol=1e-6)
    constant = OptimizerConfig(learning_rate=1.0, warmup_steps=4, schedule="constant").learning_rate_schedule()
    np.testing.assert_allclose([float(constant(s)) for s in (0, 2, 4, 500)], [0, 0.5, 1, 1], atol=1e-6)
    for schedule in ("cosine", "constant"):  # a warmup as long as the run: every step warms up, nothing decays
        whole_run = OptimizerConfig(learning_rate=1.0, warmup_steps=4, total_steps=4, schedule=schedule)
        rates = [float(whole_run.learning_rate_schedule()(s)) for s in range(4)]
        np.testing.assert_allclose(rates, [0, 0.25, 0.5, 0.75], atol=1e-6)

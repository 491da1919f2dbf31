"""The training loop's own logic, on a fake world and sampler: data order, dynamic sampling, recursion credit, resume.

(The whole path with real env, generator and Conductor is tests/launch/test_train_e2e.py.)
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.config import ModelConfig
from models.logprobs import ONLY
from models.transformer import Transformer
from rl import advantages, auxiliary
from rl.auxiliary import TermConfig, TermSpec
from rl.checkpoint import Checkpointer
from rl.learner import LearnerConfig, OptimizerConfig
from rl.loop import (
    QUESTION_LABEL, LoopConfig, Rollout, TrainingLoop, _regrouped, _Sampled, backfilled_groups, question_order,
)
from rl.losses import LossConfig
from rl.metrics import MetricsWriter
from rollout.types import SamplingParams, TokenConstraint
from tests.rl.helpers import RecordingLearner, SeededSampler
from tests.tiny_models import tiny_config

VOCAB = 256



@dataclasses.dataclass
class ParityWorld:
    """Reward 1 when the first completion token is even. With `followup`, every first round gets a second round
    whose reward is `second_reward`."""

    num_questions: int = 5
    constant_reward: float | None = None
    followup: bool = False
    second_reward: float = 0.75
    question_labels: tuple[str, ...] | None = None
    choices: int = 1  # a first round chooses (first completion token mod choices), its first token marked
    choice_name: str = "choice"  # the name of that label and marked token

    def prompt_ids(self, question):
        return [1, 2, question + 3]

    def score(self, questions, completions, contexts, sample_ids):
        rollouts = []
        for completion, context in zip(completions, contexts or [None] * len(completions)):
            if context is not None:
                rollouts.append(Rollout(self.second_reward, {"correct": self.second_reward}))
                continue
            reward = self.constant_reward if self.constant_reward is not None else float(completion[0] % 2 == 0)
            rollouts.append(Rollout(reward, {"correct": reward},
                                    labels={self.choice_name: (completion[0] % self.choices,)},
                                    marked_tokens={self.choice_name: (0,)},
                                    record={"choices": [completion[0] % self.choices]},
                                    histograms={"choices": (completion[0] % self.choices,)},
                                    context="first" if self.followup else None,
                                    followup_prompt_ids=[1, 2, 200] if self.followup else None))
        return rollouts

    def decode(self, token_ids):
        return " ".join(map(str, token_ids))



def make_learner(seed=0):
    model = Transformer(ModelConfig.from_hf(tiny_config("llama")), rngs=nnx.Rngs(seed))
    config = LearnerConfig(
        loss=LossConfig(), optimizer=OptimizerConfig(learning_rate=1e-2, schedule="constant", total_steps=100)
    )
    return RecordingLearner(model, config)


def make_loop(world, *, iterations=2, learner=None, checkpointer=None, writer=None, sampler=None, **config):
    syncs = []
    loop = TrainingLoop(
        LoopConfig(iterations=iterations, questions_per_iteration=2, group_size=4, length_buckets=(16,), **config),
        learner=learner or make_learner(),
        sampler=sampler or SeededSampler(),
        sampling_params=SamplingParams(max_new_tokens=3),
        weight_sync=lambda model, version: syncs.append(version),
        environment=world,
        pad_id=0,
        writer=writer,
        checkpointer=checkpointer,
    )
    return loop, syncs


def first_completion_tokens(batch) -> np.ndarray:
    loss_mask = np.asarray(batch.loss_mask)
    return np.asarray(batch.tokens)[np.arange(batch.batch_size), loss_mask.argmax(axis=1)]


def test_question_order_is_a_pure_function_of_the_data_position():
    whole = question_order(7, seed=3, position=0, count=21)
    assert question_order(7, 3, 0, 10) + question_order(7, 3, 10, 11) == whole
    for epoch in range(3):
        assert sorted(whole[7 * epoch : 7 * (epoch + 1)]) == list(range(7))
    assert whole[:7] != whole[7:14], "each epoch is reshuffled"
    with pytest.raises(ValueError, match="no questions"):
        question_order(0, 0, 0, 1)


def test_stratified_order_takes_the_labels_in_turn_and_each_label_through_all_its_questions():
    labels = ("b", "a", "c", "a", "b", "a", "c", "a", "b", "a")  # a: 5 questions, b: 3, c: 2
    whole = question_order(10, seed=3, position=0, count=30, labels=labels)
    assert question_order(10, 3, 0, 13, labels) + question_order(10, 3, 13, 17, labels) == whole
    assert [labels[q] for q in whole] == ["a", "b", "c"] * 10
    for label, size in (("a", 5), ("b", 3), ("c", 2)):
        stream = [q for q in whole if labels[q] == label]
        for epoch in range(len(stream) // size):
            assert sorted(stream[size * epoch : size * (epoch + 1)]) == [q for q in range(10) if labels[q] == label]
    # Without labels the stream is the one earlier runs used: a seeded permutation per epoch.
    assert question_order(10, 3, 0, 10) == [int(q) for q in np.random.default_rng([3, 0]).permutation(10)]
    with pytest.raises(ValueError, match="9 question labels for 10 questions"):
        question_order(10, 3, 0, 1, labels[:9])


def test_a_stratified_loop_asks_one_question_of_each_label_per_iteration():
    world = ParityWorld(num_questions=6, question_labels=("x", "x", "x", "x", "y", "y"))
    loop, _ = make_loop(world, iterations=3, stratify_questions=True)
    loop.run()
    for batch in loop.learner.batches:
        questions = {int(q) - 3 for q in np.asarray(batch.tokens)[:, batch.completion_start - 1]}
        assert sorted(world.question_labels[q] for q in questions) == ["x", "y"]
    with pytest.raises(ValueError, match="question_labels"):
        make_loop(ParityWorld(), stratify_questions=True)


def test_the_questions_labels_reach_the_estimator_and_label_scaling_gives_each_unit_variance():
    world = ParityWorld(num_questions=6, question_labels=("x", "x", "x", "y", "y", "y"))
    loop, _ = make_loop(world, iterations=4, stratify_questions=True, estimator_options={"std_scaling": "label"})
    loop.run()
    checked = 0
    for batch in loop.learner.batches:
        questions = np.asarray(batch.tokens)[:, batch.completion_start - 1] - 3
        row_labels = np.asarray([world.question_labels[q] for q in questions])
        for label in ("x", "y"):
            values = np.asarray(batch.advantages)[row_labels == label, batch.completion_start]
            if np.any(values != 0):
                assert np.std(values, ddof=1) == pytest.approx(1.0, abs=1e-3)
                checked += 1
    assert checked > 0
    with pytest.raises(ValueError, match="std_scaling='label' needs an environment with question_labels"):
        make_loop(ParityWorld(), estimator_options={"std_scaling": "label"})


def scale_marked(batch: advantages.AdvantageBatch, *, factor: float = 2.0) -> advantages.Transformed:
    """A test transform: every advantage plus one where the row's question is labelled "x" and its choice is 0, and
    each row's marked choice token's advantage times `factor`."""
    chosen = np.array([label == "x" and choice == (0,) for label, choice in
                       zip(batch.question_labels, batch.labels["choice"])])
    marked = batch.marked_tokens["choice"]
    return advantages.Transformed(
        batch.advantages + chosen, marked, [[factor] * len(tokens) for tokens in marked],
        {"chosen": float(chosen.sum())},
    )


def test_a_transform_reads_the_rollouts_labels_and_marked_tokens_and_scales_its_tokens(monkeypatch, tmp_path):
    monkeypatch.setitem(advantages.ADVANTAGE_TRANSFORMS, "scale_marked", scale_marked)
    world = ParityWorld(num_questions=4, choices=2, question_labels=("x", "y", "x", "y"))
    writer = MetricsWriter(tmp_path / "logs")
    loop, _ = make_loop(world, iterations=2, writer=writer,
                        advantage_transforms=(advantages.TransformConfig("scale_marked", {"factor": 3.0}),))
    history = loop.run()
    writer.close()
    rollouts = [json.loads(line) for line in (tmp_path / "logs" / "rollouts.jsonl").read_text().splitlines()]
    chosen_rows = 0
    for batch, scalars in zip(loop.learner.batches, history):
        values, start = np.asarray(batch.advantages), batch.completion_start
        first = first_completion_tokens(batch)
        questions = np.asarray(batch.tokens)[:, start - 1] - 3
        chosen = (np.asarray(world.question_labels)[questions] == "x") & (first % 2 == 0)
        assert scalars["advantage/chosen"] == chosen.sum()
        estimated = advantages.compute("grpo", (first % 2 == 0).astype(float), np.arange(8) // 4)
        np.testing.assert_allclose(values[:, start + 1], estimated + chosen, rtol=1e-6)
        # The marked (first) token carries factor x the row's final advantage, the others the advantage itself.
        np.testing.assert_allclose(values[:, start], 3.0 * values[:, start + 1], rtol=1e-6)
        chosen_rows += int(chosen.sum())
    assert chosen_rows > 0
    # The rollouts' records reach rollouts.jsonl.
    assert {tuple(r["choices"]) for r in rollouts} <= {(0,), (1,)} and len(rollouts) == 16


def test_the_rows_reach_the_learner_with_the_positions_and_labels_its_terms_read(monkeypatch):
    def reads(inputs):
        return jnp.float32(0.0), {}

    monkeypatch.setitem(
        auxiliary.AUXILIARY_TERMS, "reads", TermSpec(reads, token_positions=("choice",), row_labels=(QUESTION_LABEL,))
    )
    world = ParityWorld(num_questions=4, choices=2, question_labels=("y", "x", "z", "x"))
    model = Transformer(ModelConfig.from_hf(tiny_config("llama")), rngs=nnx.Rngs(0))
    learner = RecordingLearner(model, LearnerConfig(loss=LossConfig(auxiliary_terms=(TermConfig("reads", 1.0),))))
    loop, _ = make_loop(world, iterations=1, learner=learner)
    loop.run()
    [batch] = learner.batches
    questions = np.asarray(batch.tokens)[:, batch.completion_start - 1] - 3
    expected = ["xyz".index(world.question_labels[q]) for q in questions]
    np.testing.assert_array_equal(batch.row_labels[QUESTION_LABEL], expected)
    np.testing.assert_array_equal(batch.token_positions["choice"], 0)
    with pytest.raises(ValueError, match="row label 'question' needs an environment with question_labels"):
        make_loop(ParityWorld(), learner=learner)


def test_each_iteration_updates_syncs_a_new_version_and_advances_the_data():
    loop, syncs = make_loop(ParityWorld(), iterations=3)
    history = loop.run()
    assert syncs == [0, 1, 2, 3], "initial weights, then one sync per update"
    assert loop.data_position == 6 and loop.policy_version == 3
    assert len(loop.learner.batches) == 3
    batch = loop.learner.batches[0]
    assert batch.batch_size == 8 and np.asarray(batch.loss_mask).sum() == 8 * 3
    first_tokens = first_completion_tokens(batch)
    assert history[0]["reward/mean"] == pytest.approx(np.mean(first_tokens % 2 == 0))
    assert {"time/generate", "time/score", "time/learn", "time/sync", "learner/loss"} <= set(history[0])


class OnlyQuestionToken:
    """Question q's first completion token may only be q + 10; later tokens are free."""

    def __init__(self, question):
        self.question = question

    def constraint(self, completion_ids):
        return None if completion_ids else TokenConstraint((self.question + 10,), only=True)


class MaskedWorld(ParityWorld):
    def token_mask(self, question):
        return OnlyQuestionToken(question)


class MaskHonouringSampler(SeededSampler):
    """SeededSampler's completions with each first token replaced by the one its mask allows, and the constraints
    recorded on the completion, as a masked generator returns them."""

    def __init__(self):
        super().__init__()
        self.masks = []

    def generate(self, prompt_ids, params, n, token_masks=None):
        self.masks.append(token_masks)
        groups = super().generate(prompt_ids, params, n)
        if token_masks is None:
            return groups
        masked = []
        for group, mask in zip(groups, token_masks):
            constraints = tuple(mask.constraint(group[0].completion_ids[:k]) for k in range(3))
            masked.append([dataclasses.replace(c, completion_ids=(constraints[0].token_ids[0],) + c.completion_ids[1:],
                                               constraints=constraints) for c in group])
        return masked


@pytest.mark.parametrize("mask_tokens", [False, True])
def test_mask_tokens_samples_each_question_under_its_mask_and_the_batch_carries_the_constraints(mask_tokens):
    sampler = MaskHonouringSampler()
    loop, _ = make_loop(MaskedWorld(), iterations=1, sampler=sampler, mask_tokens=mask_tokens)
    loop.run()
    [batch] = loop.learner.batches
    if not mask_tokens:
        assert sampler.masks == [None] and batch.constraint_ids is None
        return
    [masks] = sampler.masks
    questions = np.asarray(batch.tokens)[:, batch.completion_start - 1] - 3
    assert sorted(mask.question for mask in masks) == sorted(set(questions.tolist()))
    np.testing.assert_array_equal(first_completion_tokens(batch), questions + 10)
    first = batch.completion_start
    np.testing.assert_array_equal(batch.constraint_kinds[:, first], ONLY)
    np.testing.assert_array_equal(batch.constraint_ids[:, first, 0], questions + 10)
    assert (batch.constraint_ids[:, first, 1:] == -1).all() and (batch.constraint_kinds[:, first + 1:] == 0).all()


def test_dynamic_sampling_skips_the_update_when_every_group_agrees():
    loop, syncs = make_loop(ParityWorld(constant_reward=1.0), iterations=1, dynamic_sampling="mask")
    scalars = loop.run()[0]
    assert scalars["dynamic_sampling/dropped_groups"] == 2
    assert loop.learner.batches == [] and syncs == [0] and loop.policy_version == 0


def test_dynamic_sampling_masks_only_the_groups_that_agree():
    world = ParityWorld()
    loop, _ = make_loop(world, iterations=1, dynamic_sampling="mask")
    loop.run()
    batch = loop.learner.batches[0]
    rewards = (first_completion_tokens(batch) % 2 == 0).astype(float)
    groups = np.asarray(batch.group_ids)
    for group in set(groups.tolist()):
        rows = groups == group
        expected_trains = len(set(np.asarray(rewards)[rows].tolist())) > 1
        assert np.asarray(batch.loss_mask)[rows].any() == expected_trains


@dataclasses.dataclass
class SplitWorld:
    """The questions in `agreeing` score 1 on every completion; any other scores a completion by its sample id's
    parity, so each of its groups (consecutive sample ids) holds both rewards."""

    num_questions: int = 7
    agreeing: frozenset[int] = frozenset({0, 1, 2, 3, 4})
    question_labels = None

    def prompt_ids(self, question):
        return [1, 2, question + 3]

    def score(self, questions, completions, contexts, sample_ids):
        return [Rollout(1.0 if q in self.agreeing else float(i % 2), {}) for q, i in zip(questions, sample_ids)]

    def decode(self, token_ids):
        return " ".join(map(str, token_ids))


def backfilled_batch(world: SplitWorld, position: int, groups: int, max_rounds: int, seed: int = 0):
    """A model of the batch backfill builds at data position `position`, from the question stream alone: its
    questions group by group, whether each group trains, the sampling rounds taken and the mean reward sampled
    (a differing group of an even size averages 0.5)."""
    stream = np.asarray(question_order(world.num_questions, seed, position, groups * max_rounds))
    differ = np.asarray([q not in world.agreeing for q in stream])
    rounds = next((r for r in range(1, max_rounds + 1) if differ[: r * groups].sum() >= groups), max_rounds)
    asked, asked_differ = stream[: rounds * groups], differ[: rounds * groups]
    order = np.concatenate([np.flatnonzero(asked_differ), np.flatnonzero(~asked_differ)])[:groups]
    return asked[order], asked_differ[order], rounds, float(np.where(asked_differ, 0.5, 1.0).mean())


def test_backfilled_groups_take_the_differing_groups_in_sampling_order_then_the_earliest_agreeing_ones():
    rng = np.random.default_rng(0)
    for _ in range(200):
        rounds, groups = rng.integers(1, 5), rng.integers(1, 6)
        differ = rng.random((rounds, groups)) < rng.random()
        flat = differ.ravel()
        expected = np.concatenate([np.flatnonzero(flat), np.flatnonzero(~flat)])[:groups]
        chosen = backfilled_groups(differ.tolist(), int(groups))
        assert chosen == [divmod(int(index), int(groups)) for index in expected]
    assert backfilled_groups([[False, True], [True, False]], 2) == [(0, 1), (1, 0)]
    assert backfilled_groups([[False, False], [False, True]], 2) == [(1, 1), (0, 0)]
    with pytest.raises(ValueError, match="3 groups sampled cannot fill a batch of 4"):
        backfilled_groups([[True, False, True]], 4)


def test_backfill_builds_the_batch_its_model_predicts_and_masks_agreeing_groups_only_when_rounds_run_out():
    world = SplitWorld()
    loop, _ = make_loop(world, iterations=2, dynamic_sampling="backfill", max_sampling_rounds=3)
    history = loop.run()
    position, shortfalls = 0, 0
    for batch, scalars in zip(loop.learner.batches, history, strict=True):
        questions, trains, rounds, reward = backfilled_batch(world, position, groups=2, max_rounds=3)
        position += 2 * rounds
        assert batch.batch_size == 8, "the batch keeps its row count"
        got_questions = np.asarray(batch.tokens)[::4, batch.completion_start - 1] - 3
        np.testing.assert_array_equal(got_questions, questions)
        np.testing.assert_array_equal(np.asarray(batch.loss_mask)[::4].any(axis=1), trains)
        np.testing.assert_array_equal(np.asarray(batch.group_ids), np.repeat([0, 1], 4))
        assert scalars["dynamic_sampling/oversampling"] == rounds
        assert scalars["dynamic_sampling/dropped_groups"] == (~trains).sum()
        assert scalars["reward/mean"] == pytest.approx(reward), "every group sampled, the ones left out too"
        shortfalls += int((~trains).sum())
    assert loop.data_position == position
    assert shortfalls == 1, "the second iteration runs out of rounds: the model covers both cases"


def test_backfill_regroups_every_recursion_round_of_the_groups_it_keeps():
    def sampled(tag, follow):
        """Two groups of two episodes; the episodes in `follow` get a second round."""
        first = _Sampled([10 * tag, 10 * tag, 10 * tag + 1, 10 * tag + 1], [0, 0, 1, 1],
                         [f"{tag}c{e}" for e in range(4)], [f"{tag}r{e}" for e in range(4)], [0, 1, 2, 3])
        second = _Sampled([first.questions[e] for e in follow], [2 + e // 2 for e in follow],
                          [f"{tag}c{e}'" for e in follow], [f"{tag}r{e}'" for e in follow], list(follow))
        return [first, second] if follow else [first]

    rounds = _regrouped([sampled(0, [1]), sampled(1, [0, 3])], [(1, 1), (0, 0)], group_size=2, groups=2)
    assert [r.completions for r in rounds] == [["1c2", "1c3", "0c0", "0c1"], ["1c3'", "0c1'"]]
    assert [r.questions for r in rounds] == [[11, 11, 0, 0], [11, 0]]
    assert [r.group_ids for r in rounds] == [[0, 0, 1, 1], [2, 3]]
    assert [r.episodes for r in rounds] == [[0, 1, 2, 3], [1, 3]]
    assert [r.rollouts for r in _regrouped([sampled(0, [])], [(0, 1)], group_size=2, groups=1)] == [["0r2", "0r3"]]


def test_recursion_trains_both_rounds_on_the_episode_reward():
    loop, _ = make_loop(ParityWorld(followup=True, second_reward=0.75), iterations=1, recursion_rounds=1)
    scalars = loop.run()[0]
    batch = loop.learner.batches[0]
    assert batch.batch_size == 16, "8 first rounds and their 8 second rounds"
    groups = np.asarray(batch.group_ids)
    assert len(set(groups[:8].tolist())) == 2 and len(set(groups[8:].tolist())) == 2
    assert not set(groups[:8].tolist()) & set(groups[8:].tolist())
    # Every row's reward is the episode's 0.75, so every group-relative advantage is zero.
    np.testing.assert_allclose(np.asarray(batch.advantages), 0.0, atol=1e-6)
    assert scalars["reward/mean"] == pytest.approx(0.75)


def test_killed_and_resumed_loop_ends_bit_identical_to_an_uninterrupted_one(tmp_path):
    uninterrupted, _ = make_loop(ParityWorld(), iterations=3)
    uninterrupted.run()

    checkpointer = Checkpointer(tmp_path / "ckpt", keep=2)
    writer = MetricsWriter(tmp_path / "logs")
    interrupted, _ = make_loop(ParityWorld(), iterations=3, checkpointer=checkpointer, writer=writer,
                               checkpoint_every=2)
    interrupted.run_iteration()
    interrupted.run_iteration()
    interrupted.save()
    interrupted.run_iteration()  # logged, then "killed" before its checkpoint
    writer.flush()

    resumed, syncs = make_loop(ParityWorld(), iterations=3, learner=make_learner(seed=1), checkpointer=checkpointer,
                               writer=writer)
    resumed.run()
    assert syncs[0] == 2, "the restored weights are pushed to the generator with their version"
    assert (resumed.data_position, resumed.policy_version) == (6, 3)
    expected = jax.tree.leaves(nnx.state(uninterrupted.learner.model, nnx.Param))
    actual = jax.tree.leaves(nnx.state(resumed.learner.model, nnx.Param))
    for a, b in zip(expected, actual):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    writer.close()
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]


def test_bad_loop_configs_are_rejected():
    with pytest.raises(ValueError, match="estimator"):
        LoopConfig(iterations=1, estimator="nope")
    with pytest.raises(ValueError, match="group_size"):
        LoopConfig(iterations=1, group_size=1)
    with pytest.raises(ValueError, match="iterations"):
        LoopConfig(iterations=0)
    with pytest.raises(ValueError, match="dynamic_sampling must be one of"):
        LoopConfig(iterations=1, dynamic_sampling=True)
    with pytest.raises(ValueError, match="max_sampling_rounds"):
        LoopConfig(iterations=1, dynamic_sampling="backfill", max_sampling_rounds=0)


def test_the_estimators_options_reach_it_through_the_loop():
    loop, _ = make_loop(ParityWorld(), iterations=1, estimator="grpo", estimator_options={"std_scaling": "none"})
    loop.run()
    batch = loop.learner.batches[0]
    rewards = (first_completion_tokens(batch) % 2 == 0).astype(float)
    groups = np.asarray(batch.group_ids)
    centred = rewards - np.array([rewards[groups == group].mean() for group in groups])
    assert np.abs(centred).max() > 0, "a group with mixed rewards, where scaling by the std would change the values"
    row_advantages = np.asarray(batch.advantages).max(axis=1, where=np.asarray(batch.loss_mask), initial=-np.inf)
    np.testing.assert_allclose(row_advantages, centred, atol=1e-6)


def test_a_loop_config_rejects_an_option_its_estimator_does_not_take():
    with pytest.raises(ValueError, match="estimator 'dr_grpo' takes no option 'std_scaling'"):
        LoopConfig(iterations=1, estimator="dr_grpo", estimator_options={"std_scaling": "none"})

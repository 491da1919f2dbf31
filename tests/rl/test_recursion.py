"""Recursion rounds in training: every round trains, each credited with its episode's reward as the env and the
evaluation credit it, and a later round alone in its group still gets a baseline."""

from __future__ import annotations

import dataclasses
import json
import zlib

import numpy as np
import pytest
from flax import nnx

from conductor.loop_environment import TokenizedConductorEnv, completion_text
from conductor.outcomes import conductor_outcomes
from env.gym_env import ConductorEnv, EnvConfig
from env.workflow import Step, Workflow
from env.worlds import SyntheticWorldConfig, build_world
from models import zoo
from models.config import ModelConfig
from models.tokenizer import load_tokenizer
from models.transformer import Transformer
from rl import advantages
from rl.learner import LearnerConfig, OptimizerConfig
from rl.loop import LoopConfig, Rollout, TrainingLoop
from rl.metrics import MetricsWriter
from rollout.types import Completion, SamplingParams
from tests.rl.helpers import RecordingLearner, SeededSampler
from tests.tiny_models import tiny_config

DISCOUNT = 0.2



def _learner(vocab_size: int = 256, **changes) -> RecordingLearner:
    config = ModelConfig.from_hf(tiny_config("llama", num_hidden_layers=1, vocab_size=vocab_size))
    learner_config = LearnerConfig(optimizer=OptimizerConfig(learning_rate=1e-3, schedule="constant"), **changes)
    return RecordingLearner(Transformer(config, rngs=nnx.Rngs(0)), learner_config)


def _loop(world, sampler, learner, *, writer=None, questions=2, group=4, **config) -> TrainingLoop:
    return TrainingLoop(
        LoopConfig(iterations=1, questions_per_iteration=questions, group_size=group, **config),
        learner=learner, sampler=sampler, sampling_params=SamplingParams(max_new_tokens=3, seed=0),
        weight_sync=lambda model, version: None, environment=world, pad_id=0, writer=writer,
    )


def _rollouts(logdir) -> list[dict]:
    return [json.loads(line) for line in (logdir / "rollouts.jsonl").read_text().splitlines()]


def _row_advantages(batch) -> np.ndarray:
    """Each row's advantage, read at its first loss token."""
    return np.asarray(batch.advantages)[np.arange(batch.batch_size), np.asarray(batch.loss_mask).argmax(axis=1)]


# -- the baseline of a later round alone in its group --------------------------------------------------------------


def _lone_round_batch():
    """Two questions of 4 episodes (rows 0-7). Round 1: question 0's episodes 0 and 2 (a group of two) and question
    1's episode 5 alone; round 2: question 0's episode 2 alone. Every row carries its episode's reward."""
    episode_rewards = np.array([0.6, 0.5, 1.0, 0.0, 0.5, 0.92, 0.0, 1.0])
    first_round_rows = np.array([0, 1, 2, 3, 4, 5, 6, 7, 0, 2, 5, 2])
    group_ids = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 4])
    return episode_rewards[first_round_rows], group_ids, first_round_rows


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_a_lone_later_round_is_baselined_by_its_questions_first_rounds(estimator):
    rewards, group_ids, first_round_rows = _lone_round_batch()
    plain = advantages.compute(estimator, rewards, group_ids)
    assert plain[10] == plain[11] == 0.0, "alone in its group, a group-relative estimator gives exactly 0"
    credited = advantages.credit_lone_later_rounds(plain, group_ids, first_round_rows)

    def expected(reward, peers, own_index):
        others = np.delete(peers, own_index)
        if estimator == "grpo":
            return (reward - peers.mean()) / (peers.std(ddof=1) + 1e-4)
        if estimator == "dr_grpo":
            return reward - peers.mean()
        return reward - others.mean()

    question_0, question_1 = rewards[0:4], rewards[4:8]
    np.testing.assert_allclose(credited[10], expected(rewards[10], question_1, 1), rtol=1e-6)  # episode 5
    np.testing.assert_allclose(credited[11], expected(rewards[11], question_0, 2), rtol=1e-6)  # episode 2
    assert abs(credited[10]) > 0.1 and abs(credited[11]) > 0.1
    # Rows with peers keep their own group's advantage: the first rounds, and round 1's pair on question 0.
    np.testing.assert_array_equal(credited[:10], plain[:10])
    pair = rewards[8:10]
    np.testing.assert_allclose(credited[8:10], [expected(r, pair, i) for i, r in enumerate(pair)], rtol=1e-6)


def test_lone_later_round_crediting_rejects_rows_that_are_not_first_rounds():
    rewards, group_ids, first_round_rows = _lone_round_batch()
    round_two_follows_round_one = first_round_rows.copy()
    round_two_follows_round_one[11] = 9  # row 9 is a round-1 row, not its episode's first round
    with pytest.raises(ValueError, match="first-round rows"):
        advantages.credit_lone_later_rounds(rewards, group_ids, round_two_follows_round_one)
    with pytest.raises(ValueError, match="equal-length"):
        advantages.credit_lone_later_rounds(rewards, group_ids[:-1], first_round_rows)


# -- the loop, on a world whose rewards are token parities -------------------------------------------------------


@dataclasses.dataclass
class ChainWorld:
    """A round is valid when its first token is even (otherwise a format error: reward 0, the episode ends); its own
    reward is then 0.5, or 1 when its second token is even too. A later round's reward blends the round before it in
    as the env does: DISCOUNT * previous + (1 - DISCOUNT) * own. A valid round gets a follow-up prompt while it is
    before round `rounds`."""

    rounds: int = 2
    num_questions: int = 3
    question_labels = None

    def prompt_ids(self, question):
        return [1, 2, question + 3]

    def score(self, questions, completions, contexts, sample_ids):
        rollouts = []
        for completion, context in zip(completions, contexts or [None] * len(completions)):
            valid = completion[0] % 2 == 0
            own = (0.5 + 0.5 * float(completion[1] % 2 == 0)) if valid else 0.0
            round_index, reward = (0, own) if context is None else (
                context[0] + 1, DISCOUNT * context[1] + (1 - DISCOUNT) * own
            )
            follow = valid and round_index < self.rounds
            rollouts.append(Rollout(reward, {"correct": own}, context=(round_index, reward),
                                    followup_prompt_ids=[1, 2, 100 + round_index * 10 + completion[2] % 10] if follow
                                    else None))  # fmt: skip
        return rollouts

    def decode(self, token_ids):
        return " ".join(map(str, token_ids))



def test_two_recursion_rounds_train_the_second_and_third_rounds_on_their_episodes_reward(tmp_path):
    learner = _learner()
    writer = MetricsWriter(tmp_path)
    # Seed 3 gives an iteration with rows in all three rounds and both valid and invalid second rounds.
    loop = _loop(ChainWorld(rounds=2), SeededSampler(), learner, writer=writer, recursion_rounds=2, seed=3,
                 length_buckets=(16,))
    scalars = loop.run()[0]
    writer.close()
    rows = _rollouts(tmp_path)
    counts = [sum(r["round"] == k for r in rows) for k in range(3)]
    assert counts[0] == 8 and counts[1] > 0 and counts[2] > 0 and counts[2] < counts[1], counts
    assert [scalars[f"recursion/round{k}_rows"] for k in range(3)] == counts
    # The batch the learner trained on holds every round's rows, each with loss tokens.
    batch = learner.batches[0]
    assert batch.batch_size == len(rows) == sum(counts)
    assert np.asarray(batch.loss_mask).any(axis=1).all()
    # An episode's reward is its last round's, and every round of it trains on that reward.
    last_round = {}
    for row in rows:
        last_round[row["episode"]] = row
    for row in rows:
        assert row["episode_reward"] == pytest.approx(last_round[row["episode"]]["reward"])
    # Rounds are grouped by question and round; rows whose episode reward differs from their group's get a gradient.
    group_ids = np.asarray(batch.group_ids)
    row_advantages = _row_advantages(batch)
    np.testing.assert_allclose(row_advantages, [row["advantage"] for row in rows], rtol=1e-6)
    for k in (1, 2):
        in_round = np.array([row["round"] == k for row in rows])
        assert set(group_ids[in_round].tolist()) <= set(range(2 * k, 2 * k + 2))
        trained = int((row_advantages[in_round] != 0).sum())
        assert trained > 0 and scalars[f"recursion/round{k}_trained_rows"] == trained
    assert learner.optimizer_step == 1


class OneValidFirstRound:
    """Each question's first completion writes a valid workflow, the others format errors: every question has one
    valid first round, so its second round is alone in its group."""

    def generate(self, prompt_ids, params, n, token_masks=None):
        groups = []
        for p in prompt_ids:
            rows = [(4 if j == 0 else 5, 3 + 2 * j + p[-1] % 2, 7) for j in range(n)]
            groups.append([Completion(tuple(p), row, (-1.0,) * 3, "length", 0) for row in rows])
        return groups


@pytest.mark.parametrize("dynamic_sampling", ["off", "mask"])
def test_a_second_round_alone_in_its_group_trains_with_its_episodes_first_round_advantage(dynamic_sampling):
    learner = _learner()
    loop = _loop(ChainWorld(rounds=1), OneValidFirstRound(), learner, recursion_rounds=1,
                 dynamic_sampling=dynamic_sampling, length_buckets=(16,))
    scalars = loop.run()[0]
    batch = learner.batches[0]
    assert batch.batch_size == 8 + 2, "two questions of four, one second round each"
    row_advantages = _row_advantages(batch)
    # Second rounds (rows 8, 9) follow the first completion of each question (rows 0 and 4).
    np.testing.assert_allclose(row_advantages[8:], row_advantages[[0, 4]], rtol=1e-6)
    assert (row_advantages[8:] > 0.5).all()
    assert np.asarray(batch.loss_mask)[8:].any(axis=1).all()
    assert scalars["recursion/round1_trained_rows"] == 2


# -- the credit agrees with the env's and the evaluation's ---------------------------------------------------------


class ScriptedConductor:
    """Writes, for a prompt and its row j, a one-step workflow to a worker drawn from the prompt and j, or (one draw
    in five) no workflow at all. The draw ignores a recursion prompt's previous answer, which training, the env and
    the evaluation each draw from workers seeded their own way, so the same episode gets the same completions."""

    def __init__(self, tokenizer, pool_size: int):
        self.tokenizer = tokenizer
        self.pool_size = pool_size

    def completion_ids(self, prompt, j: int) -> tuple[int, ...]:
        text = self.tokenizer.decode(list(prompt))
        answer = text.find("Its final answer was:")
        if answer >= 0:
            text = text[:answer] + text[text.index("\n\n", answer):]
        draw = (zlib.crc32(text.encode()) + 7 * j) % (5 * self.pool_size)
        if draw % 5 == 0:
            text = "\nI will not write lists."
        else:
            workflow = Workflow(steps=(Step(draw % self.pool_size, "Solve the question."),), reasoning="One step.")
            text = completion_text(workflow)
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def generate(self, prompt_ids, params, n, token_masks=None):
        return [
            [Completion(tuple(p), ids, (-1.0,) * len(ids), "stop", 0) for ids in
             (self.completion_ids(p, j) for j in range(n))]
            for p in prompt_ids
        ]


def test_the_rewards_credited_in_training_are_the_env_episodes_and_the_evaluations(tmp_path):
    tokenizer = load_tokenizer(zoo.smollm2_135m_instruct())
    world_config = SyntheticWorldConfig(num_workers=4, num_tasks=8)
    # Expected grades: a round's grade is its worker's probability of being right, the same whatever the draw, so
    # training, the gym episode and the evaluation (each with worker seeds of its own) grade a workflow alike.
    env_config = EnvConfig(recursion_rounds=2, expected_grades=True)
    env = ConductorEnv(build_world(world_config), env_config)
    world = TokenizedConductorEnv(env, tokenizer)
    conductor = ScriptedConductor(tokenizer, pool_size=4)
    writer = MetricsWriter(tmp_path)
    loop = _loop(world, conductor, _learner(vocab_size=len(tokenizer)), writer=writer, questions=2, group=3,
                 recursion_rounds=2)
    loop.run()
    writer.close()
    rows = _rollouts(tmp_path)
    episodes: dict[int, list[dict]] = {}
    for row in rows:
        episodes.setdefault(row["episode"], []).append(row)
    lengths = [len(rounds) for rounds in episodes.values()]
    assert len(episodes) == 6 and 1 in lengths and 3 in lengths, lengths

    # The gym env, stepped through each episode's completions, ends it where training did, with its reward.
    for rounds in episodes.values():
        env.reset(options={"task_id": world.tasks[rounds[0]["question"]].id})
        for index, row in enumerate(rounds):
            _, reward, terminated, _, _ = env.step(world.decode(row["completion_ids"]))
            assert reward == pytest.approx(row["reward"], abs=1e-9)
            assert terminated == (index == len(rounds) - 1)
        assert reward == pytest.approx(rounds[0]["episode_reward"], abs=1e-9)

    # The evaluation runs the same rounds for each question's first completion, with the same episode reward.
    outcomes = conductor_outcomes(conductor, world, SamplingParams(temperature=0.0, max_new_tokens=64), repeats=1)
    by_task = {outcome.task_id: outcome for outcome in outcomes}
    first_rows = [rounds for episode, rounds in sorted(episodes.items()) if episode % 3 == 0]
    assert max(len(rounds) for rounds in first_rows) > 1
    for rounds in first_rows:
        outcome = by_task[world.tasks[rounds[0]["question"]].id]
        assert outcome.metrics["rounds"] == len(rounds)
        assert outcome.metrics["reward"] == pytest.approx(rounds[0]["episode_reward"], abs=1e-9)
    env.close()

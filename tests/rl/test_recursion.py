"""Recursion rounds in training: a later round alone in its group still gets a baseline."""

from __future__ import annotations

import numpy as np
import pytest

from rl import advantages


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

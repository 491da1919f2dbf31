"""The pipeline suite's report: the speedups, the K=0 reward interval and the goal, from per-run figures."""

import numpy as np
import pytest
from scipy import stats

from launch.benchmark_suites import pipeline

REWARDS_K0 = {100: 0.70, 101: 0.78, 102: 0.74}


def _runs(reward_k1: float, questions_per_s_k1: float) -> dict:
    runs = {}
    for seed in pipeline.SEEDS:
        for k in pipeline.STALENESS:
            runs[seed, k] = {
                "questions_per_s": {0: 1.0, 1: questions_per_s_k1, 2: 3.0}[k],
                "learner_idle_share": 0.1 * k,
                "generator_idle_share": 0.2,
                "generate_execute_s": 4.0,
                "learn_s": 3.0,
                "reward": REWARDS_K0[seed] if k == 0 else reward_k1,
                "rows_dropped": float(k),
            }
    return runs


def test_reward_interval_is_the_student_t_interval_over_the_k0_seeds():
    figures = pipeline._report(_runs(reward_k1=0.75, questions_per_s_k1=2.0)).figures
    values = np.array([REWARDS_K0[seed] for seed in pipeline.SEEDS])
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    assert figures["reward_k0_interval"] == pytest.approx([values.mean() - half, values.mean() + half])
    assert figures["async_speedup_k1"] == pytest.approx(2.0)
    assert figures["reward_k1_within_k0_interval"] and figures["goal_met"]


@pytest.mark.parametrize(
    ("reward_k1", "questions_per_s_k1"),
    [(0.60, 2.0), (0.75, 1.5)],
    ids=["reward-outside-the-interval", "speedup-under-the-goal"],
)
def test_goal_fails_on_a_low_reward_or_a_low_speedup(reward_k1, questions_per_s_k1):
    assert not pipeline._report(_runs(reward_k1, questions_per_s_k1)).figures["goal_met"]

import math

import numpy as np
import pytest

from conductor import bandit
from env.orchestration import OrchestrationWorldConfig, context, load_tasks
from env.rewards import RewardConfig
from env.tasks.base import Task
from env.worlds import build_world

RECIPE_REWARD = RewardConfig(format_error=-1.0, wrong=0.0, correct=1.0, step_penalty=0.08, usd_penalty=10.0)


def tiny_problem() -> bandit.BanditProblem:
    """Two contexts of three arms; arm keys shared across contexts, so an unseen context can borrow."""
    p_right = np.asarray([[0.2, 0.8, 0.5], [0.9, 0.1, 0.4], [0.2, 0.8, 0.5]])
    return bandit.BanditProblem(
        contexts=("a", "b", "a"),
        p_right=p_right,
        reward_right=np.ones_like(p_right) - 0.1 * np.arange(3),
        reward_wrong=np.zeros_like(p_right) - 0.1 * np.arange(3),
        arm_keys=lambda c: ["x", "y", "z"] if c != "c" else ["z", "y", "w"],
        group=lambda c: "g",
    )


def numpy_ucb1(problem: bandit.BanditProblem, budget: int, seed: int) -> dict:
    """An independent transcription of UCB1 (Auer et al. 2002) with the same draws: each context's arms once in
    order, then argmax of mean + c sqrt(2 ln n / n_i)."""
    rng = np.random.default_rng(seed)
    questions = rng.integers(len(problem.contexts), size=budget)
    uniforms = rng.random(budget)
    c = problem.reward_range
    counts, sums = {}, {}
    for q, u in zip(questions, uniforms):
        key = problem.contexts[q]
        n = counts.setdefault(key, [0] * problem.arms)
        s = sums.setdefault(key, [0.0] * problem.arms)
        if 0 in n:
            arm = n.index(0)
        else:
            scores = [s[i] / n[i] + c * math.sqrt(2 * math.log(sum(n)) / n[i]) for i in range(problem.arms)]
            arm = max(range(problem.arms), key=lambda i: (scores[i], -i))
        n[arm] += 1
        s[arm] += problem.reward_right[q, arm] if u < problem.p_right[q, arm] else problem.reward_wrong[q, arm]
    return {key: (counts[key], sums[key]) for key in counts}


def test_ucb1_matches_an_independent_numpy_model_pull_for_pull():
    problem = tiny_problem()
    statistics = bandit.ucb1(problem, budget=500, seed=3)
    reference = numpy_ucb1(problem, 500, 3)
    assert set(statistics) == set(reference) == {"a", "b"}
    for key, (counts, sums) in reference.items():
        assert statistics[key].counts.tolist() == counts
        assert statistics[key].sums == pytest.approx(sums)
    # with enough pulls each context's choice is its best arm in expectation
    assert bandit.choose(problem, statistics, "a") == 1
    assert bandit.choose(problem, statistics, "b") == 0
    assert problem.reward_range == pytest.approx(1.2)


def test_an_unseen_context_borrows_its_groups_pooled_means_by_arm_key():
    problem = tiny_problem()
    statistics = {
        "a": bandit.ArmStatistics(np.asarray([2, 4, 1]), np.asarray([0.0, 3.0, 1.0])),  # means 0, 0.75, 1.0
        "b": bandit.ArmStatistics(np.asarray([2, 0, 3]), np.asarray([2.0, 0.0, 0.3])),  # means 1, -, 0.1
    }
    # "c" offers z, y, w: pooled z = (1.0 + 0.3) / 4, y = 3 / 4, w never seen
    assert bandit.choose(problem, statistics, "c") == 1
    statistics["a"].sums[2] = 4.0  # z pooled (4.0 + 0.3) / 4 > 0.75
    assert bandit.choose(problem, statistics, "c") == 0
    lonely = bandit.BanditProblem(problem.contexts, problem.p_right, problem.reward_right, problem.reward_wrong,
                                  arm_keys=lambda c: ["q", "r", "s"] if c == "c" else ["x", "y", "z"],
                                  group=lambda c: "g")  # fmt: skip
    assert bandit.choose(lonely, statistics, "c") == 0  # nothing to go on: arm 0


def test_bad_problems_and_budgets_are_rejected():
    problem = tiny_problem()
    with pytest.raises(ValueError, match="budget"):
        bandit.ucb1(problem, 0, 0)
    with pytest.raises(ValueError, match="shape"):
        bandit.BanditProblem(("a",), np.ones((1, 2)), np.ones((1, 3)), np.ones((1, 2)), lambda c: [], lambda c: c)
    with pytest.raises(ValueError, match="probabilities"):
        bandit.BanditProblem(("a",), np.full((1, 2), 1.5), np.ones((1, 2)), np.ones((1, 2)), lambda c: [], lambda c: c)


def test_the_orchestration_problem_holds_the_exact_table_and_pools_arms_by_worker():
    world = build_world(OrchestrationWorldConfig(split="train"), RECIPE_REWARD, max_steps=3)
    reference = world.orchestration
    tasks = world.tasks[:30]
    problem = bandit.orchestration_problem(reference, tasks)
    task = tasks[4]
    p_right, reward = reference.table(context(task)[2])
    row = reference.row(task)
    np.testing.assert_allclose(problem.p_right[4], p_right[row])
    expected = problem.p_right[4] * problem.reward_right[4] + (1 - problem.p_right[4]) * problem.reward_wrong[4]
    np.testing.assert_allclose(expected, reward[row], atol=1e-12)
    # a workflow's key names the offered workers, so the same workflow over other slots matches across pools
    keys = problem.arm_keys(("logic", "hard", (1, 3, 5)))
    assert keys[2] == ((5, ()),)
    assert problem.group(("logic", "hard", (1, 3, 5))) == ("logic", "hard")


def test_with_expected_grades_every_pull_sees_the_arms_exact_expected_reward():
    """A run with --expected_grades scores each sample by its exact expected reward; its bandit gets the same."""
    world = build_world(OrchestrationWorldConfig(split="train"), RECIPE_REWARD, max_steps=3)
    reference = world.orchestration
    tasks = world.tasks[:30]
    problem = bandit.orchestration_problem(reference, tasks, expected_grades=True)
    drawn = bandit.orchestration_problem(reference, tasks)
    _, reward = reference.table(context(tasks[4])[2])
    np.testing.assert_allclose(problem.reward_right[4], reward[reference.row(tasks[4])])
    np.testing.assert_allclose(problem.reward_wrong, problem.reward_right)
    assert np.all(drawn.reward_right - drawn.reward_wrong == pytest.approx(1.0))
    statistics = bandit.ucb1(problem, 400, seed=2)
    for index, task in enumerate(tasks):
        stats = statistics[context(task)]
        tried = stats.counts > 0
        np.testing.assert_allclose(stats.sums[tried] / stats.counts[tried], problem.reward_right[index][tried])


def test_the_replay_problem_reads_recorded_scores_and_the_env_reward():
    tasks = [Task(f"t{i}", "gsm8k", "q", "1", lambda r, g: 0.0, {"scores": {"m0": 0.3, "m1": 0.9}}) for i in range(2)]
    problem = bandit.replay_problem(tasks, ["m0", "m1"], RewardConfig(wrong=0.5, step_penalty=0.1))
    np.testing.assert_allclose(problem.p_right, [[0.3, 0.9], [0.3, 0.9]])
    np.testing.assert_allclose(problem.reward_right, 0.9)
    np.testing.assert_allclose(problem.reward_wrong, 0.4)
    statistics = bandit.ucb1(problem, 200, seed=0)
    assert bandit.choose(problem, statistics, "gsm8k") == 1


def test_the_bandit_given_a_run_budget_on_held_out_pools_is_scored_exactly():
    """The launch.eval path: trained on the training split, it answers test questions whose pools it never saw."""
    from conductor.baselines import bandit_choice
    from env.gym_env import ConductorEnv, EnvConfig

    world = build_world(OrchestrationWorldConfig(split="test"), RECIPE_REWARD, max_steps=3)
    env = ConductorEnv(world, EnvConfig(max_steps=3, reward=RECIPE_REWARD))
    try:
        choose = bandit_choice(env, budget=1920, seed=0)
    finally:
        env.close()
    reference = world.orchestration
    rewards = [reference.expected_reward(task, choose(task, 0)) for task in world.tasks]
    figures = reference.figures(world.tasks)
    assert figures["best_fixed_reward"] - 0.15 < np.mean(rewards) < figures["optimum_reward"]
    assert load_tasks(reference.config)[0].id == world.tasks[0].id


def test_launch_eval_reports_the_exact_figures_of_the_orchestration_baselines():
    from conductor.baselines import BaselineConfig, run_baselines
    from env.gym_env import ConductorEnv, EnvConfig

    world = build_world(OrchestrationWorldConfig(split="validation", validation_questions=24), RECIPE_REWARD, 3)
    env = ConductorEnv(world, EnvConfig(max_steps=3, reward=RECIPE_REWARD, expected_grades=True))
    try:
        results = run_baselines(env, BaselineConfig(baselines=("best_fixed", "optimum", "bandit"), bandit_budget=300),
                                repeats=1)  # fmt: skip
    finally:
        env.close()
    fixed = results["best fixed workflow per pool"]["orchestration"]
    optimum = results["per-question optimum"]["orchestration"]
    ucb = results["contextual UCB1 (300 pulls)"]["orchestration"]
    assert fixed["gap_closed"] == pytest.approx(0.0) and optimum["gap_closed"] == pytest.approx(1.0)
    assert optimum["reward"] == pytest.approx(world.orchestration.figures(world.tasks)["optimum_reward"])
    assert optimum["heldout_pools"] and ucb["reward"] < optimum["reward"]
    assert sum(optimum["shapes"].values()) == pytest.approx(1.0)


def replay_tasks(label: str, scores: dict[str, float], count: int) -> list[Task]:
    return [Task(f"{label}{i}", label, "q", "1", lambda r, g: 0.0, {"scores": scores}) for i in range(count)]


def test_a_replay_bandit_learns_on_the_training_questions_given_and_answers_each_question_by_its_task():
    """`launch.eval --bandit_tasks`: the bandit of a replay world learns from other questions (a run's training files)
    and answers the evaluated ones by their task; without them it learns on the evaluated questions themselves."""
    from conductor.baselines import bandit_choice
    from env.gym_env import ConductorEnv, EnvConfig
    from env.workers.replay import ReplayWorker
    from env.worlds import World

    evaluated = replay_tasks("gsm8k", {"m0": 0.9, "m1": 0.1}, 4) + replay_tasks("mmlu", {"m0": 0.2, "m1": 0.3}, 4)
    training = replay_tasks("gsm8k", {"m0": 0.1, "m1": 0.9}, 6) + replay_tasks("mmlu", {"m0": 0.8, "m1": 0.1}, 6)
    env = ConductorEnv(World("replay", [ReplayWorker("m0"), ReplayWorker("m1")], evaluated), EnvConfig(max_steps=1))
    try:
        learned = bandit_choice(env, budget=400, seed=0, training=training)
        in_sample = bandit_choice(env, budget=400, seed=0)
        with pytest.raises(ValueError, match="empty"):
            bandit_choice(env, budget=400, seed=0, training=[])
    finally:
        env.close()
    assert [learned(task, 0).steps[0].worker for task in evaluated] == [1] * 4 + [0] * 4
    assert [in_sample(task, 0).steps[0].worker for task in evaluated] == [0] * 4 + [1] * 4


def test_training_questions_are_refused_where_the_bandit_would_not_use_them():
    """The orchestration world's bandit learns on its own training split; a world without recorded scores has
    no bandit."""
    from conductor.baselines import bandit_choice
    from env.gym_env import ConductorEnv, EnvConfig
    from env.worlds import SyntheticWorldConfig

    for config, message in ((OrchestrationWorldConfig(split="validation", validation_questions=8), "own training"),
                            (SyntheticWorldConfig(num_tasks=8), "only on a replay world")):  # fmt: skip
        world = build_world(config, RECIPE_REWARD, 3)
        env = ConductorEnv(world, EnvConfig(max_steps=3, reward=RECIPE_REWARD))
        try:
            if isinstance(config, SyntheticWorldConfig):
                assert bandit_choice(env, budget=10, seed=0) is None
            with pytest.raises(ValueError, match=message):
                bandit_choice(env, budget=10, seed=0, training=world.tasks)
        finally:
            env.close()

import dataclasses
import itertools
import math

import numpy as np
import pytest

from env.executor import Execution, StepRecord, expected_grade
from env.gym_env import ConductorEnv, EnvConfig
from env.optimum import access_pattern, candidate_workflows, reward_table, shape_count
from env.orchestration import (
    DEFAULT_WORKERS, DIFFICULTIES, TASK_LABELS, SPLITS, DifficultyWorker, OrchestrationWorker,
    OrchestrationWorldConfig, context, gap_closed, load_tasks, pool_split, shape_shares,
)
from env.pools import named, positions
from env.rewards import RewardConfig
from env.workers.base import WorkerError
from env.workers.simulated import AnswerModel
from env.workflow import Step, Workflow, render_workflow
from env.worlds import build_world

# The reward of launch/configs/orchestration.cfg (tests/launch/test_orchestration_recipe.py checks the flagfile
# builds it).
RECIPE_REWARD = RewardConfig(format_error=-1.0, wrong=0.0, correct=1.0, step_penalty=0.08, usd_penalty=10.0)
ADOPT = AnswerModel(rule="adopt", adopt_rate=0.9)


def workflow(*steps: tuple[int, object]) -> Workflow:
    return Workflow(steps=tuple(Step(worker, "Solve.", access) for worker, access in steps))


def monte_carlo_p_correct(flow: Workflow, skills: np.ndarray, adopt_rate: float, draws: int, seed: int) -> float:
    """Brute force: every step of every draw right with its skill, or adopting a right answer it reads."""
    rng = np.random.default_rng(seed)
    right = np.zeros((draws, len(flow.steps)), dtype=bool)
    for index, step in enumerate(flow.steps):
        visible = list(step.visible_steps(index))
        reads_right = right[:, visible].any(axis=1) if visible else np.zeros(draws, dtype=bool)
        own = rng.random(draws) < skills[step.worker]
        adopts = rng.random(draws) < adopt_rate
        right[:, index] = own | (reads_right & adopts)
    return float(right[:, -1].mean())


@pytest.mark.parametrize("skills", [(0.4, 0.75, 0.1), (0.98, 0.3, 0.6)])
def test_the_reward_table_matches_monte_carlo_and_charges_steps_and_prices(skills):
    candidates = candidate_workflows(3, 3)
    assert len(candidates) == shape_count(3, 3) == 129
    costs = [0.002, 0.01, 0.002]
    p_right, reward = reward_table(candidates, np.asarray([skills]), costs, ADOPT, RECIPE_REWARD)
    draws = 40_000
    for index in (0, 4, 10, 60, 128):  # one step, two steps reading or not, three steps of several shapes
        flow = candidates[index]
        estimate = monte_carlo_p_correct(flow, np.asarray(skills), 0.9, draws, seed=index)
        p = p_right[0, index]
        assert abs(estimate - p) <= 4.5 * math.sqrt(p * (1 - p) / draws) + 1e-9, (access_pattern(flow), estimate, p)
        spent = sum(costs[step.worker] for step in flow.steps)
        assert reward[0, index] == pytest.approx(p - 0.08 * len(flow.steps) - 10.0 * spent)


def test_the_reward_table_refuses_a_token_penalty_and_mismatched_costs():
    candidates = candidate_workflows(2, 1)
    with pytest.raises(ValueError, match="token penalty"):
        reward_table(candidates, np.asarray([[0.5, 0.5]]), [0.0, 0.0], ADOPT, RewardConfig(token_penalty=0.1))
    with pytest.raises(ValueError, match="one per worker"):
        reward_table(candidates, np.asarray([[0.5, 0.5]]), [0.0], ADOPT, RECIPE_REWARD)
    with pytest.raises(ValueError, match=">= 0"):
        reward_table(candidates, np.asarray([[0.5, 0.5]]), [0.0, -1.0], ADOPT, RECIPE_REWARD)


def test_access_patterns_name_the_topology_apart_from_the_workers():
    assert access_pattern(workflow((2, ()))) == "[]"
    assert access_pattern(workflow((0, ()), (1, ()), (0, "all"))) == "[] [] [0,1]"
    assert access_pattern(workflow((1, ()), (1, "all"), (2, (1,)))) == "[] [0] [1]"
    assert shape_shares([workflow((0, ())), workflow((1, ())), None, workflow((0, ()), (0, "all"))]) == {
        "[]": 0.5, "[] [0]": 0.25, "invalid": 0.25,
    }


def test_the_held_out_pools_are_disjoint_from_training_deterministic_and_cover_every_pool():
    config = OrchestrationWorldConfig()
    split = pool_split(config)
    assert (len(split["train"]), len(split["validation"]), len(split["test"])) == (14, 3, 3)
    every = set(itertools.combinations(range(len(DEFAULT_WORKERS)), 3))
    assert set(split["train"]) | set(split["validation"]) | set(split["test"]) == every
    assert not set(split["train"]) & (set(split["validation"]) | set(split["test"]))
    assert not set(split["validation"]) & set(split["test"])
    assert pool_split(OrchestrationWorldConfig(split="test")) == split  # the split never depends on the questions
    assert pool_split(dataclasses.replace(config, split_seed=1)) != split
    # every worker is offered in training, so a held-out pool is a new combination of known workers
    assert set(itertools.chain(*split["train"])) == set(range(len(DEFAULT_WORKERS)))
    for name in SPLITS:
        tasks = load_tasks(dataclasses.replace(config, split=name))
        assert {context(task)[2] for task in tasks} <= set(split[name])


def test_questions_show_their_task_and_difficulty_the_prompt_the_offered_ids_and_the_contexts_balance():
    config = OrchestrationWorldConfig(split="validation")
    tasks = load_tasks(config)
    assert len(tasks) == 240
    task = tasks[5]
    task_label, difficulty, pool = context(task)
    assert task.question.startswith(f"Task domain: {task_label}. Difficulty: {difficulty}.\n\n")
    assert pool == tuple(sorted(pool)) and len(pool) == 3
    prompt = ConductorEnv(build_world(config, RECIPE_REWARD, max_steps=3), EnvConfig(max_steps=3)).observation(task)
    listed = [int(line.removeprefix("- Model id ")) for line in prompt["text"].splitlines()
              if line.startswith("- Model id ")]
    assert listed == list(pool)
    counts = {(d, h): 0 for d in TASK_LABELS for h in DIFFICULTIES}
    for task in tasks:
        counts[context(task)[:2]] += 1
    assert set(counts.values()) == {240 // 12}
    assert [t.question for t in load_tasks(OrchestrationWorldConfig(split="validation"))] == [t.question for t in tasks]


def test_a_worker_answers_with_its_skill_at_the_questions_difficulty_and_only_where_offered():
    config = OrchestrationWorldConfig(split="test")
    task = load_tasks(config)[0]
    task_label, difficulty, pool = context(task)
    for w in pool:
        worker = DifficultyWorker(w, config).at(task)
        assert worker.name == DEFAULT_WORKERS[w].name
        skill = DEFAULT_WORKERS[w].skills[TASK_LABELS.index(task_label)][DIFFICULTIES.index(difficulty)]
        assert worker.skill(task) == skill
        assert worker.price.cost(0, config.completion_tokens) == pytest.approx(DEFAULT_WORKERS[w].price_per_call)
    absent = next(w for w in range(len(DEFAULT_WORKERS)) if w not in pool)
    with pytest.raises(WorkerError, match="does not offer it"):
        DifficultyWorker(absent, config).at(task)


def test_the_expected_grade_of_an_answering_step_is_its_workers_skill_at_the_questions_difficulty():
    config = OrchestrationWorldConfig(split="test")
    world = build_world(config, RECIPE_REWARD, max_steps=3)
    task = world.tasks[0]
    task_label, difficulty, pool = context(task)
    for w in pool:
        step = StepRecord(index=0, worker=w, worker_name=f"W{w}", instruction="Answer.", visible=(), response="x",
                          error=None, prompt_tokens=1, completion_tokens=1, cost_usd=0.0, latency_s=0.0,
                          cached=False, started_s=0.0, finished_s=0.0)
        execution = Execution(final_answer="x", steps=(step,), calls=1, tokens=2, cost_usd=0.0, wall_s=0.0)
        skill = DEFAULT_WORKERS[w].skills[TASK_LABELS.index(task_label)][DIFFICULTIES.index(difficulty)]
        assert expected_grade(execution, task, world.pool) == pytest.approx(skill)


@pytest.mark.parametrize("split", SPLITS)
def test_adaptation_pays_on_every_split_by_at_least_a_tenth_with_three_shapes(split):
    world = build_world(OrchestrationWorldConfig(split=split), RECIPE_REWARD, max_steps=3)
    figures = world.orchestration.figures(world.tasks)
    assert figures["optimum_reward"] - figures["best_fixed_reward"] >= 0.10
    assert figures["best_fixed_reward"] < figures["per_task_reward"] < figures["optimum_reward"]
    assert set(figures["optimum_shapes"]) == {"[]", "[] [0]", "[] [] [0,1]"}
    assert figures["heldout_pools"] == (split != "train")
    # easy questions get one call, hard ones more
    for task in world.tasks[:24]:
        steps = len(world.orchestration.per_question(task).workflow.steps)
        if task.metadata["difficulty"] == "easy":
            assert steps == 1
        if task.metadata["difficulty"] == "hard":
            assert steps >= 2


def test_the_reference_policies_are_the_argmax_of_a_brute_force_search():
    world = build_world(OrchestrationWorldConfig(split="test"), RECIPE_REWARD, max_steps=3)
    reference = world.orchestration
    task = world.tasks[7]
    pool = context(task)[2]
    rewards = [reference.expected_reward(task, named(flow, pool)) for flow in reference.candidates]
    assert reference.per_question(task).expected_reward == pytest.approx(max(rewards))
    fixed = reference.fixed(task).workflow
    same_pool = [t for t in world.tasks if context(t)[2] == pool]
    # on the population (every context once) no candidate beats the fixed choice
    population = reference.table(pool)[1].mean(axis=0)
    assert population[reference.candidates.index(positions(fixed, pool))] == pytest.approx(population.max())
    assert {step.worker for step in fixed.steps} <= set(pool)  # the policies name model ids, as a Conductor does
    assert all(reference.fixed(t).workflow == fixed for t in same_pool)
    assert reference.expected_reward(task, None) == -1.0


def test_the_env_draws_rewards_whose_mean_is_the_exact_expected_reward():
    """Monte Carlo through the real env path: the offered workers executed and graded, 0/1 draws, the recipe's
    reward."""
    world = build_world(OrchestrationWorldConfig(split="test"), RECIPE_REWARD, max_steps=3)
    task = next(t for t in world.tasks if t.metadata["difficulty"] == "hard")
    pool = context(task)[2]
    flow = workflow((pool[0], ()), (pool[2], ()), (pool[1], "all"))
    env = ConductorEnv(world, EnvConfig(max_steps=3, reward=RECIPE_REWARD))
    draws = 300
    try:
        scored = env.score_batch_sync([task] * draws, ["\n" + render_workflow(flow)] * draws,
                                      sample_indices=list(range(draws)))  # fmt: skip
    finally:
        env.close()
    exact = world.orchestration.expected_reward(task, flow)
    rewards = np.asarray([s.reward for s in scored])
    assert abs(rewards.mean() - exact) <= 4.5 * rewards.std() / math.sqrt(draws)
    assert gap_closed(exact, exact - 0.1, exact + 0.1) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"split": "dev"}, "split must be"),
        ({"pool_size": 7}, "pool_size"),
        ({"validation_pools": 0}, "at least one validation pool"),
        ({"validation_pools": 10, "test_pools": 10}, "leave one for training"),
        ({"test_questions": 0}, "at least one question"),
        ({"completion_tokens": 0}, "completion_tokens"),
        ({"workers": (DEFAULT_WORKERS[0], DEFAULT_WORKERS[0])}, "distinct"),
    ],
)
def test_bad_configs_are_rejected(change, message):
    with pytest.raises(ValueError, match=message):
        OrchestrationWorldConfig(**change)


def test_bad_workers_are_rejected():
    with pytest.raises(ValueError, match="tasks x"):
        OrchestrationWorker("W", ((0.5,) * 3,) * 3, 0.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        OrchestrationWorker("W", ((0.5, 0.5, 1.5),) * 4, 0.0)
    with pytest.raises(ValueError, match="price_per_call"):
        OrchestrationWorker("W", ((0.5,) * 3,) * 4, -0.01)
    with pytest.raises(ValueError, match="token penalty"):
        build_world(OrchestrationWorldConfig(), RewardConfig(token_penalty=1.0), max_steps=3)

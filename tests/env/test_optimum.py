import math

import pytest

from env.executor import ExecutorConfig
from env.gym_env import ConductorEnv, EnvConfig
from env.optimum import best_fixed_workflow, expected_reward, final_p_correct, shape_count, workflow_shapes
from env.rewards import RewardConfig
from env.workers.simulated import AnswerModel
from env.workflow import Step, Workflow, render_workflow
from env.worlds import SYNTHETIC_TASK_LABELS, SyntheticWorldConfig, build_world, optimal_policy

ADOPT = AnswerModel(rule="adopt", adopt_rate=0.8)
# The world of launch/configs/workflows.cfg: three workers of moderate skill, the same on every task.
MODERATE = {task_label: [0.55, 0.5, 0.45] for task_label in SYNTHETIC_TASK_LABELS}
EVERY_TASK_LABEL = {task_label: 1.0 for task_label in SYNTHETIC_TASK_LABELS}
ACCURACY = RewardConfig(wrong=0.0)


def workflow(*steps: tuple[int, object]) -> Workflow:
    return Workflow(steps=tuple(Step(worker, "Solve.", access) for worker, access in steps))


def shape(workflow: Workflow) -> list[tuple[int, tuple[int, ...]]]:
    return [(step.worker, step.visible_steps(index)) for index, step in enumerate(workflow.steps)]


def test_one_step_is_right_with_its_workers_skill():
    assert final_p_correct(workflow((1, ())), [0.9, 0.3], ADOPT) == pytest.approx(0.3)


def test_two_steps_by_hand():
    s0, s1, a = 0.6, 0.3, 0.8
    reading = final_p_correct(workflow((0, ()), (1, "all")), [s0, s1], ADOPT)
    assert reading == pytest.approx(s0 * (1 - (1 - s1) * (1 - a)) + (1 - s0) * s1)
    # A last step that reads nothing is worth its own call, whatever came before.
    assert final_p_correct(workflow((0, ()), (1, ())), [s0, s1], ADOPT) == pytest.approx(s1)
    # Under "independent" reading earlier steps is worth nothing.
    assert final_p_correct(workflow((0, ()), (1, "all")), [s0, s1], AnswerModel()) == pytest.approx(s1)


def test_three_steps_by_hand_a_chain_and_a_fan_out():
    s, a = 0.5, 0.8
    adopted = 1 - (1 - s) * (1 - a)
    # Fan-out: steps 0 and 1 answer alone, step 2 reads both; some earlier step is right with 1 - (1 - s)^2.
    some_right = 1 - (1 - s) ** 2
    fan_out = final_p_correct(workflow((0, ()), (0, ()), (0, (0, 1))), [s], ADOPT)
    assert fan_out == pytest.approx(some_right * adopted + (1 - some_right) * s)
    # Chain: each step reads only the one before it, so step 2 sees a right answer when step 1 is right.
    step1 = s * adopted + (1 - s) * s
    chain = final_p_correct(workflow((0, ()), (0, (0,)), (0, (1,))), [s], ADOPT)
    assert chain == pytest.approx(step1 * adopted + (1 - step1) * s)
    # Reading only step 0 ignores step 1's call.
    skipping = final_p_correct(workflow((0, ()), (0, ()), (0, (0,))), [s], ADOPT)
    assert skipping == pytest.approx(s * adopted + (1 - s) * s)


def test_expected_reward_weights_the_tasks_and_charges_each_step():
    skills = {"a": [0.2], "b": [0.6]}
    config = RewardConfig(wrong=0.5, correct=1.0, format_bonus=0.1, step_penalty=0.05)
    two_steps = workflow((0, ()), (0, "all"))
    p = {d: final_p_correct(two_steps, skills[d], ADOPT) for d in skills}
    expected = 0.5 + 0.5 * (3 * p["a"] + p["b"]) / 4 + 0.1 - 2 * 0.05
    assert expected_reward(two_steps, skills, {"a": 3, "b": 1}, ADOPT, config) == pytest.approx(expected)


@pytest.mark.parametrize(
    "steps",
    [
        ((0, ()),),
        ((2, ()), (0, "all")),
        ((0, ()), (1, ()), (2, "all")),
        ((0, ()), (1, "all"), (2, ())),
    ],
    ids=["one step", "second reads first", "fan-out", "last reads nothing"],
)
def test_the_exact_value_matches_the_executors_sampled_answers(steps):
    """Each workflow run once on each of 2,000 questions through the env's executor with 0/1 grades: the mean reward
    lies within 4 binomial standard errors of the exact expected reward."""
    skills = ((0.55,) * 4, (0.5,) * 4, (0.45,) * 4)
    config = SyntheticWorldConfig(num_workers=3, num_tasks=2000, skills=skills, answer_model=ADOPT)
    world = build_world(config, max_steps=3)
    reward_config = RewardConfig(wrong=0.0, step_penalty=0.01)
    env = ConductorEnv(world, EnvConfig(max_steps=3, executor=ExecutorConfig(seed=7), reward=reward_config))
    chosen = workflow(*steps)
    scored = env.score_batch_sync(world.tasks, [render_workflow(chosen)] * len(world.tasks))
    env.close()
    sampled = sum(s.reward for s in scored) / len(scored)
    weights = {d: sum(t.task_label == d for t in world.tasks) for d in SYNTHETIC_TASK_LABELS}
    exact = expected_reward(chosen, MODERATE, weights, ADOPT, reward_config)
    p = exact + 0.01 * len(steps)
    assert sampled == pytest.approx(exact, abs=4 * math.sqrt(p * (1 - p) / len(scored)))


def test_with_adopt_and_moderate_skills_the_best_workflow_has_several_steps_the_last_reading_the_rest():
    best = best_fixed_workflow(MODERATE, EVERY_TASK_LABEL, ADOPT, ACCURACY, max_steps=3)
    assert shape(best.workflow) == [(0, ()), (0, ()), (0, (0, 1))]
    assert best.workflow.final_step_reads_every_step
    some_right = 1 - 0.45**2
    assert best.p_correct == pytest.approx(some_right * (1 - 0.45 * 0.2) + (1 - some_right) * 0.55)
    assert best.expected_reward == pytest.approx(best.p_correct)
    assert best.shapes_searched == shape_count(3, 3) == 3 + 9 * 2 + 27 * 4


def test_a_large_step_penalty_or_the_independent_rule_makes_one_call_to_the_best_worker_best():
    penalised = best_fixed_workflow(MODERATE, EVERY_TASK_LABEL, ADOPT, RewardConfig(wrong=0.0, step_penalty=0.3), 3)
    assert shape(penalised.workflow) == [(0, ())]
    assert penalised.expected_reward == pytest.approx(0.55 - 0.3)
    independent = best_fixed_workflow(MODERATE, EVERY_TASK_LABEL, AnswerModel(), ACCURACY, 3)
    assert shape(independent.workflow) == [(0, ())]


def test_the_search_finds_the_maximum_of_every_listed_shape():
    skills = {"a": [0.7, 0.2, 0.4], "b": [0.1, 0.8, 0.3]}
    weights = {"a": 2.0, "b": 1.0}
    config = RewardConfig(wrong=0.0, step_penalty=0.02)
    best = best_fixed_workflow(skills, weights, ADOPT, config, max_steps=3)
    values = [
        expected_reward(candidate, skills, weights, ADOPT, config)
        for steps in range(1, 4)
        for candidate in workflow_shapes(3, steps)
    ]
    assert len(values) == best.shapes_searched
    assert best.expected_reward == pytest.approx(max(values))


def test_fine_access_lists_do_no_better_than_all_or_nothing():
    """Reading more earlier steps never lowers a step's chance of being right, so the best fine-grained access lists
    are worth what the best binary ones are."""
    skills = {"a": [0.6, 0.3], "b": [0.2, 0.5]}
    binary = best_fixed_workflow(skills, {"a": 1, "b": 1}, ADOPT, ACCURACY, 4, "binary")
    fine = best_fixed_workflow(skills, {"a": 1, "b": 1}, ADOPT, ACCURACY, 4, "fine")
    assert fine.shapes_searched == shape_count(2, 4, "fine") == 2 + 4 * 2 + 8 * 8 + 16 * 64
    assert fine.expected_reward == pytest.approx(binary.expected_reward)


def test_per_task_the_search_agrees_with_the_worlds_oracle():
    """`env.worlds.optimal_policy` reasons its way to one plan shape; the search compares every shape."""
    skills = {"arithmetic": [0.7, 0.4, 0.2], "logic": [0.3, 0.35, 0.9]}
    config = RewardConfig(step_penalty=0.01)
    oracle = optimal_policy(skills, {"arithmetic": 1, "logic": 1}, ADOPT, config, 4)
    for task_label, plan in oracle.plans.items():
        best = best_fixed_workflow({task_label: skills[task_label]}, {task_label: 1}, ADOPT, config, 4)
        assert best.expected_reward == pytest.approx(plan.expected_reward)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="token or USD"):
        best_fixed_workflow(MODERATE, EVERY_TASK_LABEL, ADOPT, RewardConfig(usd_penalty=1.0), 3)
    with pytest.raises(ValueError, match="max_steps"):
        best_fixed_workflow(MODERATE, EVERY_TASK_LABEL, ADOPT, ACCURACY, 0)
    with pytest.raises(ValueError, match="access_mode"):
        best_fixed_workflow(MODERATE, EVERY_TASK_LABEL, ADOPT, ACCURACY, 2, "partial")
    with pytest.raises(ValueError, match="no skills"):
        expected_reward(workflow((0, ())), MODERATE, {"geometry": 1.0}, ADOPT, ACCURACY)
    with pytest.raises(ValueError, match="outside the pool"):
        final_p_correct(workflow((3, ())), [0.5, 0.5], ADOPT)
    with pytest.raises(ValueError, match="not earlier steps"):
        final_p_correct(workflow((0, ()), (0, (1,))), [0.5], ADOPT)
    with pytest.raises(ValueError, match="empty workflow"):
        final_p_correct(Workflow(steps=()), [0.5], ADOPT)

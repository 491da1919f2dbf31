import asyncio
import statistics

import pytest

from env.executor import ExecutorConfig, execute_async
from env.gym_env import ConductorEnv, EnvConfig
from env.rewards import RewardConfig
from env.workers.base import WorkerError
from env.workers.replay import ROUTERDC_MODELS
from env.workers.simulated import AnswerModel
from env.workflow import Step, Workflow, render_workflow
from env.worlds import (
    SYNTHETIC_TASK_LABELS,
    LocalWorldConfig,
    PaperWorldConfig,
    ReplayWorldConfig,
    SyntheticWorldConfig,
    build_world,
    optimal_policy,
    replay_grades_by_task,
    replay_reference_points,
)
from tests.env.fake_providers import FakeOpenAI
from tests.env.helpers import tiny_chat_model_dir


def mean_reward(world, workflow_for, config=EnvConfig(executor=ExecutorConfig(seed=0))) -> float:
    env = ConductorEnv(world, config)
    texts = [render_workflow(workflow_for(task)) for task in world.tasks]
    scored = env.score_batch_sync(world.tasks, texts)
    env.close()
    return statistics.fmean(s.reward for s in scored)


def test_the_default_synthetic_world_has_one_specialist_per_task():
    world = build_world(SyntheticWorldConfig(num_tasks=40, seed=3))
    assert [w.name for w in world.pool] == ["synthetic-0", "synthetic-1", "synthetic-2", "synthetic-3"]
    assert {task.task_label for task in world.tasks} == set(SYNTHETIC_TASK_LABELS) and len(world.tasks) == 40
    for index, worker in enumerate(world.pool):
        specialty = SYNTHETIC_TASK_LABELS[index]
        assert 0.75 <= worker.skills[specialty] <= 0.95
        assert all(0.1 <= s <= 0.5 for task_label, s in worker.skills.items() if task_label != specialty)
    assert {d: plan.final for d, plan in world.oracle.plans.items()} == dict(zip(SYNTHETIC_TASK_LABELS, range(4)))
    again = build_world(SyntheticWorldConfig(num_tasks=40, seed=3))
    assert [w.skills for w in again.pool] == [w.skills for w in world.pool]


def test_the_oracle_policy_earns_its_expected_reward_and_beats_a_fixed_worker():
    world = build_world(SyntheticWorldConfig(num_tasks=800, seed=1))
    oracle = world.oracle
    achieved = mean_reward(world, lambda task: oracle.plans[task.task_label].workflow())
    # standard error of a mean of 800 rewards in {0.5, 1} is at most 0.25 / sqrt(800) ~ 0.009
    assert achieved == pytest.approx(oracle.expected_reward, abs=0.035)
    fixed = mean_reward(world, lambda task: Workflow(steps=(Step(0, "Solve."),)))
    assert fixed < oracle.expected_reward - 0.1


def test_under_the_adopt_rule_the_oracle_uses_several_steps_and_the_simulator_agrees():
    skills = ((0.5, 0.5, 0.5, 0.5), (0.2, 0.2, 0.2, 0.2))
    answer_model = AnswerModel(rule="adopt", adopt_rate=0.8)
    config = SyntheticWorldConfig(num_workers=2, num_tasks=800, skills=skills, answer_model=answer_model)
    world = build_world(config, RewardConfig(step_penalty=0.02), max_steps=3)
    plan = world.oracle.plans["logic"]
    assert plan.earlier == (0, 0) and plan.final == 0
    # P(some earlier step right) = 1 - 0.5^2; then 1 - 0.5 * 0.2 if so, else 0.5
    assert plan.p_correct == pytest.approx(0.25 * 0.5 + 0.75 * 0.9)
    assert plan.expected_reward == pytest.approx(0.5 + 0.5 * 0.8 - 0.06)
    achieved = mean_reward(world, lambda task: world.oracle.plans[task.task_label].workflow(), EnvConfig(
        executor=ExecutorConfig(seed=1), reward=RewardConfig(step_penalty=0.02), max_steps=3))  # fmt: skip
    assert achieved == pytest.approx(world.oracle.expected_reward, abs=0.035)
    one_step = build_world(config, RewardConfig(step_penalty=0.3), max_steps=3).oracle.plans["logic"]
    assert one_step.earlier == ()  # a steep step penalty makes extra steps not worth it


def test_optimal_policy_rejects_what_it_cannot_compute():
    with pytest.raises(ValueError, match="token or USD"):
        optimal_policy({"a": [0.5]}, {"a": 1}, AnswerModel(), RewardConfig(token_penalty=0.1), 3)
    with pytest.raises(ValueError, match="max_steps"):
        optimal_policy({"a": [0.5]}, {"a": 1}, AnswerModel(), RewardConfig(), 0)


def test_replay_world_reproduces_the_recorded_reference_points():
    world = build_world(ReplayWorldConfig(files=("mmlu_test", "gsm8k-test")))
    assert [w.name for w in world.pool] == list(ROUTERDC_MODELS)
    mmlu = [t for t in world.tasks if t.task_label == "mmlu"]
    gsm8k = [t for t in world.tasks if t.task_label == "gsm8k"]
    assert (len(mmlu), len(gsm8k)) == (4213, 1319)
    # The MMLU and GSM8K rows of docs/design.md section 5's reference points (a multiple-choice score counts as right
    # when positive, as env.tasks.routerdc reads it; the mean raw score would understate MMLU).
    points = replay_reference_points(mmlu)
    assert points["best_single_model"] == "meta-llama/Meta-Llama-3-8B"
    assert round(100 * points["best_single"], 2) == 64.59 and round(100 * points["oracle"], 2) == 85.26
    points = replay_reference_points(gsm8k)
    assert points["best_single_model"] == "cognitivecomputations/dolphin-2.9-llama3-8b"
    assert round(100 * points["best_single"], 1) == 69.8 and round(100 * points["oracle"], 1) == 83.3


def test_replay_grades_by_task_hold_each_question_once_per_listing_with_workers_in_pool_order():
    world = build_world(ReplayWorldConfig(files=("cmmlu_test", "arc_challenge_test")))
    arc = [t for t in world.tasks if t.task_label == "arc_challenge"]
    grades = replay_grades_by_task(world.tasks + arc[:2])
    assert list(grades) == ["arc_challenge", "cmmlu"]
    assert grades["arc_challenge"].shape == (352 + 2, 7) and grades["cmmlu"].shape == (3475, 7)
    assert grades["arc_challenge"][-1].tolist() == [arc[1].metadata["scores"][model] for model in ROUTERDC_MODELS]
    # ARC-C's test best and second (BUILD_NOTES' replay rows): zephyr 57.95, dolphin-2.6 52.56.
    means = dict(zip(ROUTERDC_MODELS, replay_grades_by_task(arc)["arc_challenge"].mean(axis=0)))
    assert round(100 * means["HuggingFaceH4/zephyr-7b-beta"], 2) == 57.95
    assert round(100 * means["cognitivecomputations/dolphin-2.6-mistral-7b"], 2) == 52.56
    assert replay_grades_by_task([]) == {}


def test_a_one_step_replay_is_right_as_often_as_recorded():
    world = build_world(ReplayWorldConfig(files=("gsm8k-test",)))
    zephyr = ROUTERDC_MODELS.index("HuggingFaceH4/zephyr-7b-beta")
    recorded = statistics.fmean(t.metadata["scores"][ROUTERDC_MODELS[zephyr]] for t in world.tasks)

    async def grades() -> list[float]:
        workflow = Workflow(steps=(Step(zephyr, "Solve."),))
        executions = await asyncio.gather(
            *(execute_async(workflow, t, world.pool, config=ExecutorConfig(seed=2)) for t in world.tasks)
        )
        return [t.grade(e.final_answer) for t, e in zip(world.tasks, executions)]

    # 1319 Bernoulli draws: standard error <= 0.014
    assert statistics.fmean(asyncio.run(grades())) == pytest.approx(recorded, abs=0.045)


def test_paper_world_is_built_without_keys_and_fails_only_when_called(monkeypatch):
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    with FakeOpenAI() as server:
        urls = {
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B": server.base_url,
            "google/gemma-3-27b-it": server.base_url,
            "Qwen/Qwen3-32B": server.base_url,
        }
        world = build_world(PaperWorldConfig(tasks=(("synthetic", None),), limit_per_task=4, open_model_urls=urls))
        assert [(w.backend, w.model) for w in world.pool] == [
            ("google", "gemini-2.5-pro"),
            ("anthropic", "claude-sonnet-4-20250514"),
            ("openai", "gpt-5"),
            ("openai_compatible", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"),
            ("openai_compatible", "google/gemma-3-27b-it"),
            ("openai_compatible", "Qwen/Qwen3-32B"),
            ("openai_compatible", "Qwen/Qwen3-32B"),
        ]
        assert world.pool[2].reasoning_effort == "minimal"
        workflow = Workflow(steps=(Step(2, "a"), Step(6, "b"), Step(5, "c", "all")))
        env = ConductorEnv(world)
        scored = env.score_batch_sync(world.tasks[:1], [render_workflow(workflow)])[0]
        env.close()
    gpt, qwen_thinking, qwen = scored.execution.steps
    assert gpt.error == "gpt-5: environment variable OPENAI_API_KEY is not set"
    assert qwen_thinking.ok and qwen.ok and qwen.visible == (1,)
    assert [r["chat_template_kwargs"]["enable_thinking"] for r in server.requests] == [True, False]
    assert scored.reward in (0.5, 1.0) and scored.parse_error is None


def test_local_world_runs_a_real_transformers_model(tmp_path):
    model_dir = tiny_chat_model_dir(tmp_path / "tiny")
    world = build_world(LocalWorldConfig(model_dirs=(model_dir, model_dir), limit=2))
    assert [w.name for w in world.pool] == ["local-0", "local-1"] and len(world.tasks) == 2
    assert world.pool[0]._model is world.pool[1]._model  # one copy of the weights
    env = ConductorEnv(world, EnvConfig(executor=ExecutorConfig(max_tokens=6, temperature=0.0)))
    workflow = Workflow(steps=(Step(0, "Solve."), Step(1, "Check.", "all")))
    scored = env.score_batch_sync(world.tasks, [render_workflow(workflow)] * 2)
    env.close()
    for s in scored:
        assert all(
            step.ok and 0 < step.completion_tokens <= 6 and step.prompt_tokens > 20 for step in s.execution.steps
        )
        assert s.reward == 0.5  # a random model answers wrongly, but the workflow ran


def test_bad_world_configs_are_rejected():
    with pytest.raises(ValueError, match="skills must be 2 rows"):
        SyntheticWorldConfig(num_workers=2, skills=((0.5,) * 4,))
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        SyntheticWorldConfig(num_workers=1, skills=((1.5, 0, 0, 0),))
    with pytest.raises(ValueError, match="one entry per worker"):
        SyntheticWorldConfig(num_workers=2, prices=())
    with pytest.raises(ValueError, match="at least one RouterDC file"):
        ReplayWorldConfig(files=())
    with pytest.raises(FileNotFoundError, match="no RouterDC file"):
        build_world(ReplayWorldConfig(files=("no_such_file",)))
    with pytest.raises(ValueError, match="open_model_urls lacks"):
        PaperWorldConfig(open_model_urls={})
    with pytest.raises(FileNotFoundError):
        build_world(LocalWorldConfig(model_dirs=("/nonexistent/model",)))
    with pytest.raises(TypeError, match="not a world config"):
        build_world("synthetic")
    with pytest.raises(ValueError, match="rule"):
        AnswerModel(rule="majority")
    with pytest.raises(WorkerError, match="needs the task"):
        asyncio.run(build_world(SyntheticWorldConfig(num_tasks=4)).pool[0].complete(
            [], max_tokens=1, temperature=0.0, seed=None))  # fmt: skip

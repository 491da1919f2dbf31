import asyncio
import collections
import statistics
import threading
import time
import warnings

import gymnasium
import pytest
from gymnasium.envs.registration import EnvSpec
from gymnasium.utils.env_checker import check_env

from env import prompts
from env.executor import ExecutorConfig
from env.gym_env import ConductorEnv, EnvConfig, TextSpace
from env.rewards import RewardConfig
from env.tasks import load as load_tasks
from env.tasks import sandbox
from env.workflow import Step, Workflow, render_workflow
from env.workers.replay import ROUTERDC_MODELS
from env.workers.simulated import AnswerModel, SimulatedWorker
from env.worlds import ReplayWorldConfig, SyntheticWorldConfig, World, build_world
from tests.env.helpers import ScriptedWorker, exact_task

ONE_STEP = render_workflow(Workflow(steps=(Step(0, "Solve the question."),)))
KEEP = "model_id = []\nsubtasks = []\naccess_list = []"


def scripted_world(*workers, tasks=None) -> World:
    return World("test", list(workers), tasks or [exact_task(f"t{i}", question=f"q{i}") for i in range(4)])


def test_the_observation_is_the_conductor_prompt_and_task_id():
    world = build_world(SyntheticWorldConfig(num_tasks=8))
    env = ConductorEnv(world, EnvConfig(max_steps=4, access_mode="fine"))
    observation, info = env.reset(seed=1)
    task = next(task for task in world.tasks if task.id == observation["task_id"])
    assert observation["messages"] == prompts.conductor_messages(task.question, 4, 4, "fine")
    assert observation["prefix"] == prompts.CONDUCTOR_PREFIX
    assert observation["text"].startswith("system:\n") and observation["text"].endswith(prompts.CONDUCTOR_PREFIX)
    assert task.question in observation["text"] and info == {"task_id": task.id, "round": 0}
    assert env.observation_space.contains(observation) and env.action_space.contains(ONE_STEP)
    seen = {observation["task_id"]} | {env.reset()[0]["task_id"] for _ in range(7)}
    assert seen == {task.id for task in world.tasks}  # one pass visits every task once
    assert env.reset(seed=1)[0]["task_id"] == observation["task_id"]
    compact = ConductorEnv(world, EnvConfig(max_steps=4, access_mode="fine", conductor_prompt="compact"))
    assert compact.observation(task)["messages"] == prompts.conductor_messages(task.question, 4, 4, "fine", "compact")
    assert compact.observation(task, prompt="full")["messages"] == observation["messages"]
    compact.close()
    assert env.reset(options={"task_id": world.tasks[5].id})[0]["task_id"] == world.tasks[5].id
    env.close()


@pytest.mark.parametrize(("answer", "expected_reward"), [("42", 1.0), ("41", 0.5)])
def test_a_valid_workflow_is_executed_graded_and_rewarded(answer, expected_reward):
    env = ConductorEnv(scripted_world(ScriptedWorker("w", answer)))
    env.reset()
    observation, reward, terminated, truncated, info = env.step("I will ask model 0.\n" + ONE_STEP)
    assert (reward, terminated, truncated) == (expected_reward, True, False)
    assert info["grade"] == (1.0 if answer == "42" else 0.0) and info["parse_error"] is None
    assert info["workflow"].steps == (Step(0, "Solve the question."),)
    assert info["execution"].final_answer == f"<answer>{answer}</answer>"
    assert info["reward_components"]["total"] == expected_reward
    env.close()


def test_a_malformed_completion_is_a_scored_format_error_not_a_crash():
    env = ConductorEnv(scripted_world(ScriptedWorker("w")))
    env.reset()
    _, reward, terminated, _, info = env.step("model_id = [3]\nsubtasks = ['x']\naccess_list = [[]]")
    assert reward == 0.0 and terminated and info["execution"] is None and info["grade"] is None
    assert "3" in info["parse_error"] and info["reward_components"]["format_valid"] == 0.0
    env.reset()
    assert env.step("no lists at all")[1] == 0.0
    env.close()


def test_a_recursion_round_can_keep_or_replace_the_first_answer():
    pool = (ScriptedWorker("wrong", "41"), ScriptedWorker("right", "42"))
    env = ConductorEnv(scripted_world(*pool), EnvConfig(recursion_rounds=1))
    observation, _ = env.reset()
    task_id = observation["task_id"]
    observation, reward, terminated, _, info = env.step(ONE_STEP)
    assert reward == 0.5 and not terminated
    assert observation["messages"] == prompts.recursion_messages(
        next(t.question for t in env.world.tasks if t.id == task_id), 2, 5, ONE_STEP, "<answer>41</answer>"
    )
    fixed = render_workflow(Workflow(steps=(Step(1, "Check the previous answer 41."),)))
    _, reward, terminated, _, info = env.step(fixed)
    assert terminated and info["round"] == 1 and info["grade"] == 1.0
    assert reward == pytest.approx(0.2 * 0.5 + 0.8 * 1.0)

    env.reset()
    env.step(ONE_STEP)
    _, reward, terminated, _, info = env.step(KEEP)
    assert terminated and info["execution"].kept_previous and reward == pytest.approx(0.5)
    assert len(pool[0].calls) == 2 and len(pool[1].calls) == 1
    env.close()


def test_empty_lists_are_a_format_error_in_the_first_round():
    env = ConductorEnv(scripted_world(ScriptedWorker("w")), EnvConfig(recursion_rounds=1))
    env.reset()
    _, reward, terminated, _, info = env.step(KEEP)
    assert reward == 0.0 and terminated and info["parse_error"]
    env.close()


class ConcurrencyProbe(ScriptedWorker):
    def __init__(self) -> None:
        super().__init__("probe", latency_s=0.05)
        self.in_flight = 0
        self.max_in_flight = 0

    async def complete(self, messages, **kwargs):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await super().complete(messages, **kwargs)
        finally:
            self.in_flight -= 1


def test_score_batch_scores_thousands_concurrently_with_bounded_concurrency():
    probe = ConcurrencyProbe()
    tasks = [exact_task(f"t{i}", question=f"q{i}") for i in range(2000)]
    env = ConductorEnv(scripted_world(probe, tasks=tasks), EnvConfig(max_concurrency=500))
    texts = [ONE_STEP if i % 3 else "garbage" for i in range(2000)]
    start = time.perf_counter()
    scored = asyncio.run(env.score_batch(tasks, texts, sample_indices=list(range(2000))))
    elapsed = time.perf_counter() - start
    assert probe.max_in_flight == 500
    assert elapsed < 10.0  # serially: 1333 calls x 50 ms = 67 s
    assert [s.reward for s in scored] == [1.0 if i % 3 else 0.0 for i in range(2000)]
    assert [s.task_id for s in scored] == [t.id for t in tasks]
    env.close()


def test_grading_runs_in_the_grading_pool_not_on_the_event_loop():
    threads = []

    def grader(text, gold):
        threads.append(threading.current_thread().name)
        return 1.0

    from env.tasks.base import Task

    task = Task("g", "d", "q", "42", grader)
    env = ConductorEnv(scripted_world(ScriptedWorker("w"), tasks=[task]), EnvConfig(grading_threads=2))
    env.score_batch_sync([task] * 4, [ONE_STEP] * 4)
    assert len(threads) == 4 and all(name.startswith("grading") for name in threads)
    env.close()


def test_the_synthetic_world_runs_through_the_env_with_seeded_executions():
    world = build_world(SyntheticWorldConfig(num_workers=2, num_tasks=12, skills=((1.0,) * 4, (0.0,) * 4)))
    config = EnvConfig(executor=ExecutorConfig(seed=7), reward=RewardConfig(step_penalty=0.1))
    env = ConductorEnv(world, config)
    to_worker_1 = render_workflow(Workflow(steps=(Step(0, "a"), Step(1, "b", "all"))))
    scored = env.score_batch_sync(world.tasks, [ONE_STEP] * 6 + [to_worker_1] * 6)
    assert [s.reward for s in scored] == pytest.approx([0.9] * 6 + [0.3] * 6)
    env.close()


def test_a_seeded_executor_repeats_the_simulated_outcomes_and_another_seed_changes_them():
    world = build_world(SyntheticWorldConfig(num_workers=1, num_tasks=200, skills=((0.5,) * 4,)))

    def answers(seed: int) -> list[str]:
        env = ConductorEnv(world, EnvConfig(executor=ExecutorConfig(seed=seed)))
        scored = env.score_batch_sync(world.tasks, [ONE_STEP] * len(world.tasks))
        env.close()
        return [s.execution.final_answer for s in scored]

    first = answers(0)
    assert answers(0) == first and answers(1) != first


def test_bad_input_is_rejected():
    env = ConductorEnv(scripted_world(ScriptedWorker("w")))
    with pytest.raises(RuntimeError, match="reset"):
        env.step(ONE_STEP)
    env.reset()
    with pytest.raises(TypeError, match="completion text"):
        env.step([1, 2])
    with pytest.raises(ValueError, match="2 tasks but 1 completions"):
        env.score_batch_sync(env.world.tasks[:2], [ONE_STEP])
    bad_first_round = env.score_batch_sync(env.world.tasks[:1], ["garbage"])[0]
    with pytest.raises(ValueError, match="previous round with a valid workflow"):
        env.score_batch_sync(env.world.tasks[:1], [KEEP], previous=[bad_first_round])
    with pytest.raises(KeyError, match="nope"):
        env.reset(options={"task_id": "nope"})
    with pytest.raises(ValueError, match="access_mode"):
        EnvConfig(access_mode="coarse")
    with pytest.raises(ValueError, match="recursion_rounds"):
        EnvConfig(recursion_rounds=-1)
    with pytest.raises(ValueError, match="conductor_prompt"):
        EnvConfig(conductor_prompt="short")
    env.close()


def test_the_env_is_a_gymnasium_env():
    env = ConductorEnv(scripted_world(ScriptedWorker("w")))
    assert isinstance(env, gymnasium.Env)
    assert isinstance(env.unwrapped, ConductorEnv)
    env.close()


class WorkflowTextSpace(TextSpace):
    """The action space for `check_env`, which steps with `action_space.sample()`: the env's `TextSpace` samples "",
    a format error that ends every episode before a worker runs; these samples are random valid workflows."""

    def __init__(self, pool_size: int, max_steps: int) -> None:
        super().__init__()
        self.pool_size, self.max_steps = pool_size, max_steps

    def sample(self, mask=None, probability=None) -> str:
        count = int(self.np_random.integers(1, self.max_steps + 1))
        workers = self.np_random.integers(self.pool_size, size=count)
        steps = tuple(Step(int(w), f"Part {i} of the question.", "all" if i else ()) for i, w in enumerate(workers))
        return render_workflow(Workflow(steps=steps))


@pytest.mark.parametrize("recursion_rounds", [0, 1])
@pytest.mark.parametrize("executor_seed", [None, 3])
def test_gymnasium_check_env_passes(recursion_rounds, executor_seed):
    """gymnasium's `check_env`, every warning an error, with a spec that declares the env deterministic (so the
    seeded reset and step comparisons run; they hold with simulated workers, not with real LLMs) and random valid
    workflows as the actions.

    What it cannot check for text: the spaces' `contains` tests types only (a str; a list of role/content string
    dicts), so "the observation is in its space" says nothing of whether it is the right prompt (the tests above
    check that); the Box checks (bounds, dtype, normalisation) do not apply; random workflows reach execution,
    grading and the recursion round, but say nothing of what a model writes; the `Workflow` and `Execution` in the
    info are compared with `==` and not searched for shared objects (they are frozen). It found three defects, now
    fixed: `reset(seed=...)` did not seed the workers' draws, the info's execution differed between replays by its
    wall-clock times, and a second `close()` raised.
    """
    world = build_world(SyntheticWorldConfig(num_workers=3, num_tasks=8, skills=((0.5,) * 4,) * 3))
    config = EnvConfig(recursion_rounds=recursion_rounds, executor=ExecutorConfig(seed=executor_seed))

    def make() -> ConductorEnv:
        env = ConductorEnv(world, config)
        env.action_space = WorkflowTextSpace(len(world.pool), config.max_steps)
        return env

    env = make()
    env.spec = EnvSpec("Conductor-v0", entry_point=make, nondeterministic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env)
    env.close()


def test_a_seeded_reset_repeats_its_episodes_and_successive_episodes_draw_afresh():
    world = build_world(SyntheticWorldConfig(num_workers=1, num_tasks=1, skills=((0.5,) * 4,)))
    env = ConductorEnv(world)

    def answers(seed: int) -> list[str]:
        env.reset(seed=seed)
        episodes = [env.step(ONE_STEP)[4]["execution"].final_answer]
        for _ in range(15):
            env.reset()
            episodes.append(env.step(ONE_STEP)[4]["execution"].final_answer)
        return episodes

    first = answers(11)
    assert answers(11) == first and answers(12) != first
    assert len(set(first)) > 1  # one task, one workflow: only the episode's seed changes the draw
    env.close()


def _score(env: ConductorEnv, task, completion: str, sample_index: int = 0):
    return env._runner.run(env.score(task, completion, sample_index=sample_index))


def _one_step(worker: int) -> str:
    return render_workflow(Workflow(steps=(Step(worker, "Solve the question."),)))


def test_expected_grades_of_one_step_replays_are_the_recorded_fractions():
    world = build_world(ReplayWorldConfig(files=("gsm8k-test", "mmlu_test"), limit_per_file=20))
    expected = ConductorEnv(world, EnvConfig(expected_grades=True, executor=ExecutorConfig(seed=0)))
    drawn = ConductorEnv(world, EnvConfig(executor=ExecutorConfig(seed=0)))
    fractions, expected_grades, drawn_grades = [], [], []
    for task in world.tasks:
        for worker, model in enumerate(ROUTERDC_MODELS):
            scored = _score(expected, task, _one_step(worker))
            fractions.append(task.metadata["scores"][model])
            expected_grades.append(scored.grade)
            assert scored.reward == pytest.approx(0.5 + 0.5 * task.metadata["scores"][model])
            drawn_grades.append(_score(drawn, task, _one_step(worker)).grade)
    assert expected_grades == pytest.approx(fractions, abs=0.0)
    assert set(drawn_grades) == {0.0, 1.0}
    # 280 draws of the same fractions: standard error of their mean <= 0.03
    assert statistics.fmean(drawn_grades) == pytest.approx(statistics.fmean(fractions), abs=0.09)
    assert len(set(fractions)) > 2  # the fractions are not themselves 0/1
    expected.close()
    drawn.close()


def test_expected_grades_follow_the_answer_model_when_the_last_step_reads_earlier_work():
    adopt = AnswerModel(rule="adopt", adopt_rate=0.6)
    pool = [
        SimulatedWorker("planner", {}, default_skill=0.5, answer_model=adopt),
        SimulatedWorker("finisher", {}, default_skill=0.2, answer_model=adopt),
    ]
    task = load_tasks("synthetic", limit=1, seed=0)[0]
    env = ConductorEnv(World("adopt", pool, [task]), EnvConfig(expected_grades=True, executor=ExecutorConfig(seed=3)))
    reads_first = render_workflow(Workflow(steps=(Step(0, "Draft."), Step(1, "Check.", (0,)))))
    ignores_first = render_workflow(Workflow(steps=(Step(0, "Draft."), Step(1, "Check."))))
    seen = collections.Counter()
    for sample in range(40):
        scored = _score(env, task, reads_first, sample)
        first_right = task.grade(scored.execution.steps[0].response) == 1.0
        seen[first_right] += 1
        assert scored.grade == pytest.approx(1 - (1 - 0.2) * (1 - 0.6) if first_right else 0.2)
        assert _score(env, task, ignores_first, sample).grade == pytest.approx(0.2)
    assert seen[True] > 0 and seen[False] > 0  # both branches were exercised
    env.close()


def test_expected_grades_fall_back_to_grading_the_text():
    real = ConductorEnv(scripted_world(ScriptedWorker("w", "41")), EnvConfig(expected_grades=True))
    task = real.world.tasks[0]
    assert _score(real, task, ONE_STEP).grade == 0.0  # a real model's reply is graded on its text
    real.close()
    no_skill = SimulatedWorker("lost", {"other": 0.9})  # fails: no skill for the task's task
    failing = ConductorEnv(World("failing", [no_skill], [task]), EnvConfig(expected_grades=True))
    scored = _score(failing, task, ONE_STEP)
    assert scored.execution.steps[0].error is not None and scored.grade == 0.0
    failing.close()


def test_an_env_with_code_tasks_checks_the_sandbox_when_built_and_runs_unsandboxed_only_when_allowed(monkeypatch):
    humaneval = load_tasks("humaneval", limit=1)
    assert ConductorEnv(scripted_world(ScriptedWorker("w")), EnvConfig()).sandbox_layer is None
    assert ConductorEnv(scripted_world(ScriptedWorker("w"), tasks=humaneval)).sandbox_layer == sandbox.isolation_layer()
    monkeypatch.setattr(sandbox, "layer_works", lambda layer: False)
    monkeypatch.setitem(sandbox._unsandboxed, "allowed", False)
    monkeypatch.setitem(sandbox._unsandboxed, "warned", False)
    with pytest.raises(sandbox.SandboxUnavailable, match="bubblewrap"):
        ConductorEnv(scripted_world(ScriptedWorker("w"), tasks=humaneval), EnvConfig())
    assert ConductorEnv(scripted_world(ScriptedWorker("w")), EnvConfig()).sandbox_layer is None
    env = ConductorEnv(scripted_world(ScriptedWorker("w"), tasks=humaneval), EnvConfig(allow_unsandboxed_code=True))
    assert env.sandbox_layer == "none" and sandbox._unsandboxed["allowed"]

import asyncio

import pytest

from env import prompts
from env.executor import Execution, ExecutorConfig, execute, execute_async, step_seed
from env.workers.cache import ResponseCache
from env.workflow import Step, Workflow
from tests.env.helpers import ScriptedWorker, exact_task

FAN_IN = Workflow(steps=(Step(0, "solve it"), Step(1, "solve it differently"), Step(2, "combine the answers", "all")))


def test_independent_steps_run_in_parallel_and_the_aggregator_waits_for_both():
    pool = [ScriptedWorker(f"w{i}", latency_s=0.2) for i in range(3)]
    execution = execute(FAN_IN, exact_task(), pool)
    first, second, aggregator = execution.steps
    assert first.started_s < second.finished_s and second.started_s < first.finished_s  # overlapped
    assert aggregator.started_s >= max(first.finished_s, second.finished_s)
    assert 0.4 <= execution.wall_s < 0.55  # two latencies on the critical path, not three
    assert execution.final_answer == "<answer>42</answer>"


def test_a_step_starts_when_the_steps_it_reads_finish_not_when_all_earlier_steps_do():
    pool = [ScriptedWorker("fast", latency_s=0.05), ScriptedWorker("slow", latency_s=0.3), ScriptedWorker("reader")]
    workflow = Workflow(steps=(Step(0, "a"), Step(1, "b"), Step(2, "read a only", (0,)), Step(1, "last", (1, 2))))
    execution = execute(workflow, exact_task(), pool)
    fast, slow, reader, last = execution.steps
    assert reader.started_s >= fast.finished_s
    assert reader.finished_s < slow.finished_s
    assert last.started_s >= slow.finished_s
    assert last.visible == (1, 2)


def test_each_worker_sees_exactly_the_steps_its_access_allows():
    pool = [ScriptedWorker("a", "1"), ScriptedWorker("b", "2"), ScriptedWorker("c", "3")]
    workflow = Workflow(steps=(Step(0, "first"), Step(1, "second", ()), Step(2, "third", (1,)), Step(0, "end", "all")))
    task = exact_task()
    execution = execute(workflow, task, pool)
    assert pool[1].calls[0]["messages"] == prompts.worker_messages(task.question, [], "second")
    assert pool[2].calls[0]["messages"] == prompts.worker_messages(
        task.question, [("second", "<answer>2</answer>")], "third"
    )
    assert pool[0].calls[1]["messages"] == prompts.worker_messages(
        task.question,
        [("first", "<answer>1</answer>"), ("second", "<answer>2</answer>"), ("third", "<answer>3</answer>")],
        "end",
    )
    assert execution.final_answer == "<answer>1</answer>"
    assert [step.visible for step in execution.steps] == [(), (), (1,), (0, 1, 2)]


def test_a_failed_step_is_recorded_hidden_from_readers_and_does_not_stop_the_workflow():
    pool = [ScriptedWorker("ok", "7"), ScriptedWorker("broken", fail=True), ScriptedWorker("agg", "9")]
    execution = execute(FAN_IN, exact_task(), pool)
    ok, broken, aggregator = execution.steps
    assert ok.ok and not broken.ok and aggregator.ok
    assert broken.error == "broken: HTTP 500 after 3 attempt(s)" and broken.response == ""
    assert aggregator.visible == (0,)
    assert pool[2].calls[0]["messages"] == prompts.worker_messages(
        exact_task().question, [("solve it", "<answer>7</answer>")], "combine the answers"
    )
    assert execution.failed_steps == 1 and execution.final_answer == "<answer>9</answer>"


def test_a_failed_last_step_gives_an_empty_final_answer():
    pool = [ScriptedWorker("ok"), ScriptedWorker("broken", fail=True)]
    execution = execute(Workflow(steps=(Step(0, "a"), Step(1, "b", "all"))), exact_task(), pool)
    assert execution.final_answer == "" and execution.failed_steps == 1


def test_a_hung_worker_times_out_as_a_failed_step():
    pool = [ScriptedWorker("hung", hang=True), ScriptedWorker("ok")]
    config = ExecutorConfig(step_timeout_s=0.2)
    execution = execute(Workflow(steps=(Step(0, "a"), Step(1, "b"))), exact_task(), pool, config=config)
    hung, ok = execution.steps
    assert hung.error == "step timed out after 0.2s"
    assert 0.2 <= hung.finished_s < 0.5 and ok.ok


def test_tokens_cost_and_calls_are_summed_over_steps():
    pool = [ScriptedWorker("a", prompt_tokens=100, completion_tokens=20, cost_usd=0.25),
            ScriptedWorker("b", prompt_tokens=7, completion_tokens=3, cost_usd=0.5),
            ScriptedWorker("c", fail=True)]  # fmt: skip
    workflow = Workflow(steps=(Step(0, "x"), Step(1, "y"), Step(2, "z"), Step(0, "w", "all")))
    execution = execute(workflow, exact_task(), pool)
    assert execution.tokens == 2 * 120 + 10
    assert execution.cost_usd == pytest.approx(1.0)
    assert execution.calls == 4


def test_seeds_differ_per_step_and_sample_and_repeat_across_runs():
    pool = [ScriptedWorker("a")]
    workflow = Workflow(steps=(Step(0, "x"), Step(0, "x")))
    config = ExecutorConfig(seed=3)
    execute(workflow, exact_task(), pool, config=config, sample_index=0)
    execute(workflow, exact_task(), pool, config=config, sample_index=1)
    execute(workflow, exact_task(), pool, config=config, sample_index=0)
    seeds = [call["seed"] for call in pool[0].calls]
    assert len(set(seeds[:4])) == 4 and seeds[4:] == seeds[:2]
    assert set(seeds[:2]) == {step_seed(3, 0, 0), step_seed(3, 0, 1)} and step_seed(None, 0, 0) is None
    execute(workflow, exact_task(), pool)
    assert [call["seed"] for call in pool[0].calls[6:]] == [None, None]


def test_sampling_settings_reach_the_worker():
    pool = [ScriptedWorker("a")]
    execute(Workflow(steps=(Step(0, "x"),)), exact_task(), pool, config=ExecutorConfig(max_tokens=64, temperature=0.7))
    assert pool[0].calls[0]["max_tokens"] == 64 and pool[0].calls[0]["temperature"] == 0.7


def test_recursion_round_keeps_the_previous_answer_on_an_empty_workflow_and_runs_a_new_one_otherwise():
    pool = [ScriptedWorker("a", "1"), ScriptedWorker("b", "2")]
    first = execute(Workflow(steps=(Step(0, "x"),)), exact_task(), pool)
    kept = execute(Workflow(steps=()), exact_task(), pool, previous=first)
    assert kept.kept_previous and kept.final_answer == "<answer>1</answer>" and kept.previous is first
    assert kept.calls == 0 and kept.steps == () and len(pool[0].calls) == 1
    redone = execute(Workflow(steps=(Step(1, "check the answer 1"),)), exact_task(), pool, previous=first)
    assert redone.final_answer == "<answer>2</answer>" and redone.previous is first and not redone.kept_previous


def test_bad_input_is_rejected():
    pool = [ScriptedWorker("a")]
    with pytest.raises(ValueError, match="no previous round"):
        execute(Workflow(steps=()), exact_task(), pool)
    with pytest.raises(ValueError, match="outside the pool of 1"):
        execute(Workflow(steps=(Step(1, "x"),)), exact_task(), pool)
    with pytest.raises(ValueError, match="step_timeout_s"):
        ExecutorConfig(step_timeout_s=0)
    with pytest.raises(ValueError, match="max_tokens"):
        ExecutorConfig(max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        ExecutorConfig(temperature=-1)


def test_rerunning_through_the_cache_makes_no_worker_calls(tmp_path):
    pool = [ScriptedWorker(f"w{i}", answer=str(i), cost_usd=0.125) for i in range(3)]
    tasks = [exact_task(f"t{i}", question=f"q{i}") for i in range(5)]

    async def run_all(cache: ResponseCache) -> list[Execution]:
        return await asyncio.gather(
            *(execute_async(FAN_IN, task, pool, cache, sample_index=s) for task in tasks for s in range(2))
        )

    with ResponseCache(tmp_path / "cache.sqlite") as cache:
        first = asyncio.run(run_all(cache))
    calls_after_first = sum(len(worker.calls) for worker in pool)
    assert calls_after_first == 5 * 2 * 3
    with ResponseCache(tmp_path / "cache.sqlite") as cache:
        second = asyncio.run(run_all(cache))
        assert cache.hits == 30 and cache.misses == 0 and len(cache) == 30
    assert sum(len(worker.calls) for worker in pool) == calls_after_first
    assert [e.final_answer for e in second] == [e.final_answer for e in first]
    assert all(step.cached for e in second for step in e.steps) and all(e.calls == 0 for e in second)
    assert [e.cost_usd for e in second] == [e.cost_usd for e in first] == [0.375] * 10

import asyncio
import sqlite3
import threading

from env.executor import execute_async
from env.workers.api import RetryConfig
from env.workers.base import WorkerReply
from env.workers.cache import ResponseCache, cache_key
from env.workers.openai_api import OpenAICompatibleWorker
from env.workflow import Step, Workflow
from tests.env.fake_providers import FakeOpenAI
from tests.env.helpers import exact_task

MESSAGES = [{"role": "user", "content": "Wie viel ist 6 × 7? 答案"}]
BASE = dict(max_tokens=64, temperature=0.2, seed=1, sample=[0, 0])


def test_the_key_is_deterministic_and_changes_with_every_part_of_the_call():
    key = cache_key("openai", "gpt-5", MESSAGES, **BASE)
    assert key == cache_key("openai", "gpt-5", [dict(MESSAGES[0])], **BASE)
    variants = [
        cache_key("anthropic", "gpt-5", MESSAGES, **BASE),
        cache_key("openai", "gpt-5 [reasoning_effort=minimal]", MESSAGES, **BASE),
        cache_key("openai", "gpt-5", [{"role": "user", "content": "Wie viel ist 6 × 8? 答案"}], **BASE),
        cache_key("openai", "gpt-5", [{"role": "system", "content": MESSAGES[0]["content"]}], **BASE),
        cache_key("openai", "gpt-5", MESSAGES, **{**BASE, "max_tokens": 65}),
        cache_key("openai", "gpt-5", MESSAGES, **{**BASE, "temperature": 0.3}),
        cache_key("openai", "gpt-5", MESSAGES, **{**BASE, "seed": None}),
        cache_key("openai", "gpt-5", MESSAGES, **{**BASE, "sample": [1, 0]}),
        cache_key("openai", "gpt-5", MESSAGES, **{**BASE, "sample": [0, 1]}),
    ]
    assert len({key, *variants}) == len(variants) + 1


def test_replies_round_trip_and_persist_across_instances(tmp_path):
    reply = WorkerReply("<answer>42</answer> ✓", 11, 7, 8.375e-05, 0.25)
    with ResponseCache(tmp_path / "c.sqlite") as cache:
        assert asyncio.run(cache.get("k")) is None
        asyncio.run(cache.put("k", "openai", "gpt-5", reply))
        assert asyncio.run(cache.get("k")) == reply
        assert (cache.hits, cache.misses) == (1, 1)
    with ResponseCache(tmp_path / "c.sqlite") as cache:
        assert asyncio.run(cache.get("k")) == reply and len(cache) == 1
    assert sqlite3.connect(tmp_path / "c.sqlite").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_cache_in_a_directory_that_does_not_exist_yet_creates_it(tmp_path):
    path = tmp_path / "runs" / "eval" / "cache.sqlite"
    reply = WorkerReply("<answer>7</answer>", 3, 1, 0.0, 0.1)
    with ResponseCache(path) as cache:
        asyncio.run(cache.put("k", "openai", "gpt-5", reply))
    with ResponseCache(path) as cache:
        assert asyncio.run(cache.get("k")) == reply


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "c.sqlite"

    def writer(prefix: str) -> None:
        with ResponseCache(path) as cache:

            async def put_all():
                await asyncio.gather(
                    *(
                        cache.put(f"{prefix}{i}", "b", "m", WorkerReply(f"{prefix}{i}", i, i, 0.0, 0.0))
                        for i in range(300)
                    )
                )

            asyncio.run(put_all())

    threads = [threading.Thread(target=writer, args=(prefix,)) for prefix in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with ResponseCache(path) as cache:
        assert len(cache) == 900
        assert asyncio.run(cache.get("b299")) == WorkerReply("b299", 299, 299, 0.0, 0.0)


def test_rerunning_an_evaluation_makes_zero_requests_to_the_provider(tmp_path):
    tasks = [exact_task(f"t{i}", question=f"What is {i} + {i}?") for i in range(8)]
    workflow = Workflow(steps=(Step(0, "solve"), Step(1, "solve too"), Step(0, "combine", "all")))

    async def evaluate(base_url: str) -> list[str]:
        pool = [
            OpenAICompatibleWorker(name="qwen", model="Qwen/Qwen3-32B", base_url=base_url, enable_thinking=False),
            OpenAICompatibleWorker(name="qwen-think", model="Qwen/Qwen3-32B", base_url=base_url, enable_thinking=True),
        ]
        with ResponseCache(tmp_path / "eval.sqlite") as cache:
            executions = await asyncio.gather(*(execute_async(workflow, task, pool, cache) for task in tasks))
        for worker in pool:
            await worker.aclose()
        return [e.final_answer for e in executions]

    with FakeOpenAI() as server:
        first = asyncio.run(evaluate(server.base_url))
        assert server.request_count == 8 * 3
        # the thinking and non-thinking workers share a model name but never a cache entry
        assert {r["chat_template_kwargs"]["enable_thinking"] for r in server.requests} == {True, False}
        second = asyncio.run(evaluate(server.base_url))
        assert server.request_count == 8 * 3
    assert second == first


def test_failures_are_not_cached(tmp_path):
    workflow = Workflow(steps=(Step(0, "solve"),))

    async def run(base_url: str):
        worker = OpenAICompatibleWorker(name="q", model="m", base_url=base_url, retry=RetryConfig(max_attempts=1))
        with ResponseCache(tmp_path / "f.sqlite") as cache:
            execution = await execute_async(workflow, exact_task(), [worker], cache)
        await worker.aclose()
        return execution

    with FakeOpenAI() as server:
        server.script = ["500"]
        assert not asyncio.run(run(server.base_url)).steps[0].ok
        assert asyncio.run(run(server.base_url)).steps[0].ok
        assert server.request_count == 2

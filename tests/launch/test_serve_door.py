"""`launch.serve`'s door: the API key, the host it may open, the concurrency bound and its queue, the per-request
deadline, malformed bodies, request ids and hidden internals; and a loopback load test on the `local` world."""

from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import threading
import time

import httpx
import numpy as np
import openai
import pytest
from absl.testing import flagsaver

import env.workers.local
from env.workers.base import WorkerReply
from env.workflow import Step
from env.worlds import LocalWorldConfig, build_world
from launch import serve
from launch.serve import AccessConfig, ChatServer, ConductorService, ServeConfig
from tests.env.helpers import ScriptedWorker
from tests.launch.test_serve import (  # noqa: F401  (tokenizer: the fixture)
    ScriptedGenerator, ServerThread, synthetic_server, tokenizer, workflow_text,
)

KEY = "sk-conductor-test"
ASK = {"model": "conductor", "messages": [{"role": "user", "content": "What is 3 + 4?"}]}


def chat(running: ServerThread, body=ASK, key: str | None = None, headers: dict | None = None) -> httpx.Response:
    headers = headers or ({} if key is None else {"Authorization": f"Bearer {key}"})
    return httpx.post(f"{running.base_url}/chat/completions", json=body, headers=headers, timeout=30)


def assert_error(reply: httpx.Response, status: int, code: str | None, fragment: str) -> dict:
    """The error in OpenAI's shape with the request id of its header; returns the error object."""
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code", "request_id"}
    assert error["code"] == code and fragment in error["message"]
    assert error["request_id"] == reply.headers["x-request-id"] and error["request_id"].startswith("req_")
    return error


def one_step_server(tokenizer, pool, access: AccessConfig, delay_s: float = 0.0) -> ChatServer:
    generator = ScriptedGenerator(tokenizer, workflow_text(Step(0, "Solve it.")), delay_s)
    return ChatServer(ConductorService(generator, tokenizer, pool, ServeConfig(format_attempts=1)), access)


class CancellableWorker:
    """Answers `<answer>7</answer>` after `latency_s`, hanging on its first `hangs` calls; records calls whose
    awaiting request was cancelled."""

    def __init__(self, name: str, latency_s: float = 0.0, hangs: int = 0) -> None:
        self.name, self.latency_s, self.hangs = name, latency_s, hangs
        self.started = 0
        self.cancelled = 0
        self.in_flight = 0
        self.max_in_flight = 0

    async def complete(self, messages, *, max_tokens, temperature, seed, task=None) -> WorkerReply:
        self.started += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(3600 if self.started <= self.hangs else self.latency_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
        return WorkerReply("<answer>7</answer>", 10, 5, 0.0, self.latency_s)


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


# -- who may open it ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "conductor.example.com", ""])
def test_a_host_beyond_loopback_needs_a_key_or_an_explicit_opt_out(host):
    with pytest.raises(ValueError, match="listens beyond this machine and no API key is set.*--allow_unauthenticated"):
        AccessConfig(host=host)
    assert AccessConfig(host=host, api_key=KEY).api_key == KEY
    assert AccessConfig(host=host, allow_unauthenticated=True).api_key is None


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_hosts_serve_without_a_key(host):
    assert AccessConfig(host=host).api_key is None


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"api_key": ""}, "api_key must be a non-empty string"),
        ({"api_key": "sk two words"}, "without whitespace"),
        ({"max_concurrent_requests": 0}, "max_concurrent_requests must be >= 1"),
        ({"max_queued_requests": -1}, "max_queued_requests must be >= 0"),
        ({"request_timeout_s": 0.0}, "request_timeout_s must be a positive"),
        ({"request_timeout_s": float("inf")}, "request_timeout_s must be a positive"),
        ({"request_timeout_s": float("nan")}, "request_timeout_s must be a positive"),
        ({"max_request_bytes": 100}, "max_request_bytes must be >= 1024"),
    ],
)  # fmt: skip
def test_bad_access_configs_are_rejected(fields, message):
    with pytest.raises(ValueError, match=message):
        AccessConfig(**fields)


def test_the_key_comes_from_the_flag_or_else_the_environment(parsed_flags):
    with flagsaver.flagsaver(host="0.0.0.0"):
        assert serve.access_from_flags({"CONDUCTOR_API_KEY": "sk-env"}).api_key == "sk-env"
        with flagsaver.flagsaver(api_key="sk-flag"):
            assert serve.access_from_flags({"CONDUCTOR_API_KEY": "sk-env"}).api_key == "sk-flag"
        for environ in ({}, {"CONDUCTOR_API_KEY": ""}):  # an empty variable is no key
            with pytest.raises(ValueError, match="no API key is set"):
                serve.access_from_flags(environ)
        with flagsaver.flagsaver(allow_unauthenticated=True, max_concurrent_requests=3, request_timeout_s=9.0):
            access = serve.access_from_flags({})
    assert (access.host, access.api_key, access.max_concurrent_requests, access.request_timeout_s) == (
        "0.0.0.0", None, 3, 9.0
    )


def test_the_server_refuses_to_start_on_an_open_host_without_a_key(parsed_flags, monkeypatch):
    monkeypatch.delenv("CONDUCTOR_API_KEY", raising=False)
    monkeypatch.setattr(serve, "build_server", lambda access: pytest.fail("built a server behind an open door"))
    with flagsaver.flagsaver(host="0.0.0.0"), pytest.raises(SystemExit, match="--host='0.0.0.0' listens beyond"):
        serve.main(["serve"])


def test_only_the_right_bearer_key_is_served(tokenizer):
    server, tasks = synthetic_server(tokenizer, workflow_text(Step(0, "Solve it.")), skills=((1.0,) * 4,) * 4,
                                     access=AccessConfig(api_key=KEY))  # fmt: skip
    body = {"model": "conductor", "messages": [{"role": "user", "content": tasks[0].question}]}
    with ServerThread(server) as running:
        missing = chat(running, body)
        wrong = chat(running, body, key="sk-conductor-tesT")
        not_bearer = chat(running, body, headers={"Authorization": f"Basic {KEY}"})
        models_without = httpx.get(f"{running.base_url}/models")
        unknown_route_without = httpx.get(f"{running.base_url}/completions")  # the door comes before the routes
        right = chat(running, body, key=KEY)
        with openai.OpenAI(base_url=running.base_url, api_key="sk-wrong", max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError) as refused:
                client.chat.completions.create(**body)
        with openai.OpenAI(base_url=running.base_url, api_key=KEY, max_retries=0) as client:
            assert [model.id for model in client.models.list().data] == ["conductor"]
            served = client.chat.completions.with_raw_response.create(**body)
    assert_error(missing, 401, "invalid_api_key", "No API key provided")
    for reply in (models_without, unknown_route_without):
        assert_error(reply, 401, "invalid_api_key", "No API key provided")
    for reply in (wrong, not_bearer):
        assert_error(reply, 401, "invalid_api_key", "Incorrect API key provided")
    assert refused.value.code == "invalid_api_key" and refused.value.request_id.startswith("req_")
    assert right.status_code == 200 and right.headers["x-request-id"].startswith("req_")
    assert served.parse().choices[0].message.content == right.json()["choices"][0]["message"]["content"]
    assert served.headers["x-request-id"].startswith("req_")
    assert len(server.service.generator.prompts) == 2  # only the two keyed completions reached the Conductor


# -- how much it takes -------------------------------------------------------------------------------------------


def test_beyond_the_running_and_queued_requests_a_request_gets_429_with_retry_after(tokenizer):
    worker = CancellableWorker("slow", latency_s=1.0)
    access = AccessConfig(max_concurrent_requests=1, max_queued_requests=1)
    replies: dict[str, httpx.Response] = {}

    def ask(name):
        replies[name] = chat(running)

    with ServerThread(one_step_server(tokenizer, [worker], access)) as running:
        first = threading.Thread(target=ask, args=("running",))
        first.start()
        wait_for(lambda: worker.started == 1)
        second = threading.Thread(target=ask, args=("second",))
        second.start()
        time.sleep(0.3)  # the second is usually queued by now; if not, the third takes its place
        ask("third")
        first.join(30)
        second.join(30)
    assert replies["running"].status_code == 200
    # one of the two later requests waits in the one queue place and is answered, the other is refused
    queued, refused = sorted((replies["second"], replies["third"]), key=lambda reply: reply.status_code)
    assert queued.status_code == 200
    error = assert_error(refused, 429, "rate_limit_exceeded", "limit of 1 running and 1 queued")
    assert error["type"] == "requests" and int(refused.headers["Retry-After"]) >= 1
    assert worker.started == 2 and worker.max_in_flight == 1


def test_a_request_past_its_deadline_gets_504_and_its_worker_call_is_cancelled(tokenizer):
    worker = CancellableWorker("stuck-once", hangs=1)
    # one place in all: a slot the timed-out request kept would turn the next request into a 429
    access = AccessConfig(request_timeout_s=0.5, max_concurrent_requests=1, max_queued_requests=0)
    with ServerThread(one_step_server(tokenizer, [worker], access)) as running:
        with openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0) as client:
            started = time.perf_counter()
            with pytest.raises(openai.InternalServerError) as timed_out:
                client.chat.completions.create(**ASK)
            waited_s = time.perf_counter() - started
        wait_for(lambda: worker.cancelled == 1)
        after = chat(running)
    assert timed_out.value.status_code == 504 and timed_out.value.code == "request_timeout"
    assert timed_out.value.response.headers["x-should-retry"] == "false"
    assert "within the server's 0.5 s" in timed_out.value.message
    assert 0.5 <= waited_s < 5.0
    assert after.status_code == 200 and after.json()["choices"][0]["message"]["content"] == "<answer>7</answer>"


def test_a_generation_abandoned_at_the_deadline_is_never_overlapped_by_the_next(tokenizer):
    access = AccessConfig(request_timeout_s=0.3)
    server = one_step_server(tokenizer, [CancellableWorker("w")], access, delay_s=0.6)
    with ServerThread(server) as running:
        replies = [chat(running) for _ in range(2)]  # the second waits for the first's thread, then times out too
        wait_for(lambda: len(server.service.generator.params) == 2)  # both threads ran to their end
    for reply in replies:
        assert_error(reply, 504, "request_timeout", "did not finish")
    assert server.service.generator.max_in_flight == 1


# -- what it answers to bad input ------------------------------------------------------------------------------------


def _body(**extra) -> bytes:
    return json.dumps({**ASK, **extra}).encode()


@pytest.mark.parametrize(
    "raw, status, fragment",
    [
        (b"{not json", 400, "not valid JSON: Expecting property name"),
        (b"", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (_body()[:-1] + b', "seed": ' + b"9" * 5000 + b"}", 400, "an integer of more than 4300 digits"),
        (_body()[:-1] + b', "temperature": NaN}', 400, "NaN is not a JSON number"),
        (_body()[:-1] + b', "top_p": -Infinity}', 400, "-Infinity is not a JSON number"),
        (b"[" * 20_000 + b"]" * 20_000, 400, "nested deeper than 32 levels"),
        (_body()[:-1] + b', "conductor_options": ' + b"[" * 40 + b"]" * 40 + b"}", 400, "nested deeper than 32"),
        (b'{"model": "conductor\xff"}', 400, "not UTF-8"),
        (_body()[:-1] + b', "user": "\\ud800"}', 400, "lone surrogate"),
        (_body(seed=-1), 400, "seed must be an integer from 0 to 9223372036854775807"),
        (_body(seed=2**64), 400, "seed must be an integer from 0"),
        (_body(max_tokens=10**4000), 400, "max_tokens must be an integer from 1 to 1024"),
        (_body(messages=[{"role": "x" * 30_000, "content": "hi"}]), 400, "role must be one of"),
        (_body(conductor_options={"exclude_workers": ["w" * 30_000]}), 400, "is neither a pool id"),
        (_body(conductor_options={"y" * 30_000: 1}), 400, "unknown conductor_options"),
        (_body(model=["conductor"]), 400, "model is required and must be a string"),
        (_body(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400, "must be text parts"),
        (_body(stream=1), 400, "stream must be a boolean"),
        (b'{"model": "conductor", "messages": "' + b"x" * (64 * 1024) + b'"}', 413, "larger than the server's limit"),
    ],
    ids=lambda value: value.decode("utf-8", "replace")[:30] if isinstance(value, bytes) else str(value),
)  # fmt: skip
def test_every_malformed_body_is_a_4xx_that_quotes_little(tokenizer, raw, status, fragment):
    server, _ = synthetic_server(tokenizer, "no workflow here", access=AccessConfig(max_request_bytes=64 * 1024))
    with ServerThread(server) as running:
        reply = httpx.post(f"{running.base_url}/chat/completions", content=raw,
                           headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
    error = assert_error(reply, status, None, fragment)
    assert error["type"] == "invalid_request_error" and len(error["message"]) < 400
    assert server.service.generator.prompts == []


def test_an_unexpected_failure_is_a_500_that_names_the_request_and_hides_the_internals(tokenizer, caplog):
    class BrokenGenerator(ScriptedGenerator):
        def generate(self, prompt_ids, params, n, token_masks=None):
            raise RuntimeError("disk /srv/secret/weights.bin unreadable")

    service = ConductorService(BrokenGenerator(tokenizer, "x"), tokenizer, [CancellableWorker("w")])
    with caplog.at_level(logging.ERROR), ServerThread(ChatServer(service)) as running:
        reply = chat(running)
        with openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0) as client:
            with pytest.raises(openai.InternalServerError) as failed:
                client.chat.completions.create(**ASK)
    error = assert_error(reply, 500, None, "its log has the details under request id")
    assert error["type"] == "server_error" and error["request_id"] in error["message"]
    for text in (reply.text, failed.value.message):
        assert "secret" not in text and "RuntimeError" not in text and "Traceback" not in text
    logged = [record for record in caplog.records if error["request_id"] in record.getMessage()]
    assert len(logged) == 1 and "/srv/secret/weights.bin" in str(logged[0].exc_info[1])
    assert failed.value.request_id != error["request_id"]  # every request its own id


# -- load ----------------------------------------------------------------------------------------------------------


class FastLocalWorker(CancellableWorker):
    """Stands in for the local world's transformers worker: same construction, a 20 ms answer."""

    def __init__(self, model_dir: str, *, name: str | None = None, device: str = "cpu") -> None:
        super().__init__(name or pathlib.Path(model_dir).name, latency_s=0.02)


def _rss_mib() -> tuple[float, float]:
    """(resident, peak resident) MiB of this process, which runs the server."""
    fields = dict(line.split(":", 1) for line in pathlib.Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def test_64_concurrent_requests_on_the_local_world_each_get_200_or_429(tokenizer, monkeypatch):
    monkeypatch.setattr(env.workers.local, "TransformersWorker", FastLocalWorker)
    world = build_world(LocalWorldConfig(model_dirs=("smollm2-a", "smollm2-b"), limit=64))
    assert [worker.name for worker in world.pool] == ["local-0", "local-1"]
    generator = ScriptedGenerator(tokenizer, workflow_text(Step(1, "Solve it.")))
    access = AccessConfig(api_key=KEY, max_concurrent_requests=8, max_queued_requests=24, request_timeout_s=10.0)
    service = ConductorService(generator, tokenizer, world.pool, ServeConfig(format_attempts=1), tasks=world.tasks)
    questions = [task.question for task in world.tasks]
    assert len(questions) == 64

    async def load(base_url: str) -> list[tuple[int, float, httpx.Response]]:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=base_url, limits=limits, headers=headers, timeout=10) as client:
            async def ask(question):
                started = time.perf_counter()
                reply = await client.post("/chat/completions", json={
                    "model": "conductor", "messages": [{"role": "user", "content": question}],
                })  # fmt: skip
                return reply.status_code, time.perf_counter() - started, reply

            return await asyncio.wait_for(asyncio.gather(*(ask(q) for q in questions)), timeout=15)

    rss_before, _ = _rss_mib()
    with ServerThread(ChatServer(service, access)) as running:
        started = time.perf_counter()
        results = asyncio.run(load(running.base_url))
        wall_s = time.perf_counter() - started
        after = chat(running, key=KEY)  # nothing held: the server still answers
    rss_after, rss_peak = _rss_mib()
    statuses = [status for status, _, _ in results]
    assert len(results) == 64 and set(statuses) <= {200, 429}, statuses
    served = [reply for status, _, reply in results if status == 200]
    refused = [reply for status, _, reply in results if status == 429]
    assert len(served) >= 8
    assert all(reply.json()["choices"][0]["message"]["content"] == "<answer>7</answer>" for reply in served)
    assert all(int(reply.headers["Retry-After"]) >= 1 for reply in refused)
    assert len({reply.headers["x-request-id"] for _, _, reply in results}) == 64
    assert len(generator.prompts) == len(served) + 1  # a refused request never reached the Conductor
    assert world.pool[1].started == len(served) + 1 and world.pool[1].max_in_flight <= 8
    assert after.status_code == 200
    latencies = np.array([latency for _, latency, _ in results])
    print(
        f"\nload: 64 requests in {wall_s:.2f} s: {len(served)} x 200, {len(refused)} x 429; latency p50 "
        f"{np.percentile(latencies, 50) * 1e3:.0f} ms, p99 {np.percentile(latencies, 99) * 1e3:.0f} ms (200s: p50 "
        f"{np.percentile([l for s, l, _ in results if s == 200], 50) * 1e3:.0f} ms); process RSS {rss_before:.0f} -> "
        f"{rss_after:.0f} MiB (peak {rss_peak:.0f} MiB)"
    )

"""The OpenAI-compatible Conductor endpoint, exercised with the official `openai` client on localhost."""

import asyncio
import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from aiohttp import web

from env import tasks as task_library
from env.workflow import Step, Workflow, render_workflow
from env.worlds import SyntheticWorldConfig, build_world
from launch.serve import AccessConfig, ChatServer, ConductorService, ServeConfig, attempt_temperatures
from models import zoo
from tests.tiny_models import tiny_hf_model_dir
from models.tokenizer import load_tokenizer
from rollout.torch_generator import TorchGenerator
from rollout.types import Completion, SamplingParams
from tests.env.helpers import ScriptedWorker


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(zoo.smollm2_135m_instruct())


class ScriptedGenerator:
    """A `Generator` whose completions are `text` in the tokenizer's ids (a list: its texts in turn, across calls,
    the last repeating); records prompts, sampling params, completions asked for and how many generate calls
    overlapped."""

    def __init__(self, tokenizer, text: str | list[str], delay_s: float = 0.0) -> None:
        texts = [text] if isinstance(text, str) else text
        self.scripted = [tuple(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        self.ids = self.scripted[0]
        self.returned = 0
        self.counts: list[int] = []
        self.tokenizer = tokenizer
        self.delay_s = delay_s
        self.prompts: list[str] = []
        self.prompt_lengths: list[int] = []
        self.params: list[SamplingParams] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.closed = False
        self._lock = threading.Lock()

    def generate(self, prompt_ids, params, n, token_masks=None):
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(self.delay_s)
        with self._lock:
            self.in_flight -= 1
        self.prompts.extend(self.tokenizer.decode(list(p)) for p in prompt_ids)
        self.prompt_lengths.extend(len(p) for p in prompt_ids)
        self.params.append(params)
        self.counts.append(n)
        groups = []
        for p in prompt_ids:
            group = []
            for _ in range(n):
                ids = self.scripted[min(self.returned, len(self.scripted) - 1)]
                self.returned += 1
                group.append(Completion(tuple(p), ids, (0.0,) * len(ids), "stop", 0))
            groups.append(group)
        return groups

    def close(self):
        self.closed = True


class ServerThread:
    """Runs a `ChatServer` on 127.0.0.1 and a free port, on its own event loop in a background thread."""

    def __init__(self, server: ChatServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()

        async def start():
            runner = web.AppRunner(self.server.app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            return runner, site._server.sockets[0].getsockname()[1]

        self.runner, self.port = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.client = openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120)
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def workflow_text(*steps: Step) -> str:
    return render_workflow(Workflow(steps=steps, reasoning="Route it."))


def synthetic_server(tokenizer, text: str, *, skills=None, delay_s: float = 0.0, access=AccessConfig(), **config):
    """(server, the world's tasks): a scripted Conductor over a four-worker synthetic pool, behind `access`."""
    world = build_world(SyntheticWorldConfig(num_workers=4, num_tasks=20, skills=skills))
    service = ConductorService(ScriptedGenerator(tokenizer, text, delay_s), tokenizer, world.pool,
                               ServeConfig(**config), tasks=world.tasks)  # fmt: skip
    return ChatServer(service, access), world.tasks


PERFECT = ((1.0,) * 4,) * 4  # every synthetic worker always right


def test_models_lists_the_served_model(tokenizer):
    with ServerThread(synthetic_server(tokenizer, "x", model_name="my-conductor")[0]) as server:
        assert [model.id for model in server.client.models.list().data] == ["my-conductor"]


def test_a_completion_answers_with_the_executed_workflow_and_an_audit(tokenizer):
    server, tasks = synthetic_server(tokenizer, workflow_text(Step(2, "Solve it."), Step(1, "Check it.", "all")),
                                     skills=PERFECT)  # fmt: skip
    task = tasks[3]
    with ServerThread(server) as running:
        reply = running.client.chat.completions.create(
            model="conductor",
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": task.question}],
        )
    assert reply.choices[0].message.content == task_library.reference_response(task)
    assert task.grade(reply.choices[0].message.content) == 1.0
    audit = reply.model_extra["conductor"]
    assert [step["worker"] for step in audit["workflow"]] == [2, 1]
    assert [(s["worker_name"], s["visible"], s["error"]) for s in audit["steps"]] == [
        ("synthetic-2", [], None), ("synthetic-1", [0], None)
    ]
    assert audit["worker_calls"] == 2 and audit["failed_steps"] == 0
    assert audit["worker_tokens"] == sum(s["prompt_tokens"] + s["completion_tokens"] for s in audit["steps"])
    assert reply.usage.completion_tokens == len(server.service.generator.ids)
    assert reply.usage.prompt_tokens == server.service.generator.prompt_lengths[0]
    assert "Question:\n" + task.question in server.service.generator.prompts[0]


def test_streaming_sends_openai_chunks_ending_with_done(tokenizer):
    server, tasks = synthetic_server(tokenizer, workflow_text(Step(0, "Solve it.")), skills=PERFECT)
    task = tasks[0]
    messages = [{"role": "user", "content": task.question}]
    with ServerThread(server) as running:
        chunks = list(running.client.chat.completions.create(model="conductor", messages=messages, stream=True))
        raw = httpx.post(f"{running.base_url}/chat/completions",
                         json={"model": "conductor", "messages": messages, "stream": True}, timeout=60)  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == task_library.reference_response(task)
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"
    assert chunks[-1].model_extra["conductor"]["workflow"][0]["worker"] == 0
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert raw.headers["content-type"].startswith("text/event-stream")
    events = [line for line in raw.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]" and all(event.startswith("data: ") for event in events)
    assert json.loads(events[-2][len("data: "):])["usage"]["total_tokens"] > 0


def test_concurrent_requests_all_succeed_and_generation_is_serialised(tokenizer):
    server, tasks = synthetic_server(tokenizer, workflow_text(Step(3, "Solve it.")), skills=PERFECT, delay_s=0.05)
    tasks = tasks[:8]
    with ServerThread(server) as running:
        def ask(task):
            return running.client.chat.completions.create(
                model="conductor", messages=[{"role": "user", "content": task.question}]
            ).choices[0].message.content

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, tasks))
    assert answers == [task_library.reference_response(task) for task in tasks]
    assert server.service.generator.max_in_flight == 1 and len(server.service.generator.prompts) == 8
    assert server.service.generator.closed  # the server's cleanup closes the generator


def test_excluded_workers_are_hidden_and_the_rest_keep_their_ids(tokenizer):
    server, tasks = synthetic_server(tokenizer, workflow_text(Step(1, "Solve it."), Step(3, "Check it.", "all")))
    with ServerThread(server) as running:
        reply = running.client.chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": tasks[0].question}],
            extra_body={"conductor_options": {"exclude_workers": [0, "synthetic-2"]}},
        )  # fmt: skip
        capped = httpx.post(f"{running.base_url}/chat/completions", timeout=60, json={
            "model": "conductor", "messages": [{"role": "user", "content": "What is 2 + 2?"}],
            "conductor_options": {"max_steps": 1},
        })  # fmt: skip
    audit = reply.model_extra["conductor"]
    assert audit["excluded_workers"] == [0, 2]
    assert [s["worker_name"] for s in audit["steps"]] == ["synthetic-1", "synthetic-3"]
    first_prompt, *second_prompts = server.service.generator.prompts  # the second request: greedy, then samples
    second_prompt = second_prompts[0]
    assert second_prompts == [second_prompt] * 2
    assert "Model id 1" in first_prompt and "Model id 3" in first_prompt
    assert "Model id 0" not in first_prompt and "Model id 2" not in first_prompt
    assert "at most 1 step." in second_prompt
    assert capped.status_code == 422
    assert "more than the limit of 1" in capped.json()["error"]["message"]
    assert capped.json()["conductor"]["workflow"] is None


def test_a_failing_worker_degrades_the_answer_but_not_the_server(tokenizer):
    text = workflow_text(Step(0, "Solve it."), Step(1, "Use the earlier work if any.", "all"))
    pool = [ScriptedWorker("broken", fail=True), ScriptedWorker("fine", answer="7")]
    generator = ScriptedGenerator(tokenizer, text)
    server = ChatServer(ConductorService(generator, tokenizer, pool))
    with ServerThread(server) as running:
        replies = [
            running.client.chat.completions.create(model="conductor", messages=[{"role": "user", "content": "3 + 4?"}])
            for _ in range(2)
        ]
    for reply in replies:
        assert reply.choices[0].message.content == "<answer>7</answer>"
        steps = reply.model_extra["conductor"]["steps"]
        assert "HTTP 500" in steps[0]["error"] and steps[1]["error"] is None and steps[1]["visible"] == []
        assert reply.model_extra["conductor"]["failed_steps"] == 1


def test_a_conductor_that_writes_no_valid_workflow_gets_a_422_with_the_parse_error(tokenizer):
    server, _ = synthetic_server(tokenizer, "model_id = [0]\nsubtasks = [[]]", format_attempts=3,
                                 sampling=SamplingParams(temperature=0.7, max_new_tokens=64))  # fmt: skip
    body = {"model": "conductor", "messages": [{"role": "user", "content": "What is 17 + 25?"}]}
    with ServerThread(server) as running:
        plain = httpx.post(f"{running.base_url}/chat/completions", json=body, timeout=60)
        streamed = httpx.post(f"{running.base_url}/chat/completions", json={**body, "stream": True}, timeout=60)
        with pytest.raises(openai.UnprocessableEntityError, match="no valid workflow in 3 attempt"):
            running.client.chat.completions.create(**body)
    for reply in (plain, streamed):  # a stream sends no event before it knows there is an answer
        assert reply.status_code == 422 and reply.headers["content-type"].startswith("application/json")
        error = reply.json()["error"]
        assert error["code"] == "invalid_workflow" and error["type"] == "invalid_request_error"
        assert "at temperatures [0.0, 0.7, 0.7]" in error["message"] and "missing list" in error["message"]
        audit = reply.json()["conductor"]
        assert audit["workflow"] is None and audit["parse_error"] in error["message"]
        assert [a["temperature"] for a in audit["attempts"]] == [0.0, 0.7, 0.7]
    # greedy alone, then the two samples in one call, for each of the three requests
    assert [p.temperature for p in server.service.generator.params] == [0.0, 0.7] * 3
    assert server.service.generator.counts == [1, 2] * 3


def test_greedy_comes_first_and_a_sample_that_parses_is_answered(tokenizer):
    valid = workflow_text(Step(1, "Solve it."))
    server, tasks = synthetic_server(tokenizer, ["no workflow", valid, "no workflow"], skills=PERFECT,
                                     format_attempts=3,
                                     sampling=SamplingParams(temperature=0.7, max_new_tokens=64))  # fmt: skip
    with ServerThread(server) as running:
        reply = running.client.chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": tasks[0].question}]
        )
    assert reply.choices[0].message.content == task_library.reference_response(tasks[0])
    audit = reply.model_extra["conductor"]
    assert [(a["temperature"], a["parse_error"] is None) for a in audit["attempts"]] == [(0.0, False), (0.7, True)]
    assert audit["workflow"][0]["worker"] == 1
    generator = server.service.generator
    assert [p.temperature for p in generator.params] == [0.0, 0.7] and generator.counts == [1, 2]
    assert reply.usage.completion_tokens == sum(len(ids) for ids in generator.scripted)  # all three generated


@pytest.mark.parametrize(
    "requested, serving, attempts, expected",
    [
        (None, 0.7, 3, (0.0, 0.7, 0.7)),  # greedy, then the serving temperature
        (None, 0.7, 1, (0.0,)),
        (0.0, 0.7, 3, (0.0, 0.7, 0.7)),  # greedy asked for: still samples when greedy fails
        (0.4, 0.7, 3, (0.4, 0.4, 0.4)),  # the request's temperature throughout
        (None, 0.0, 3, (0.0,)),  # a greedy server has nothing new to try
    ],
)  # fmt: skip
def test_attempt_temperatures(requested, serving, attempts, expected):
    assert attempt_temperatures(requested, serving, attempts) == expected


def test_a_request_whose_answering_step_fails_gets_a_502_with_the_workers_errors(tokenizer):
    text = workflow_text(Step(0, "Solve it."), Step(1, "Check it.", "all"))
    pool = [ScriptedWorker("down-0", fail=True), ScriptedWorker("down-1", fail=True)]
    server = ChatServer(ConductorService(ScriptedGenerator(tokenizer, text), tokenizer, pool))
    body = {"model": "conductor", "messages": [{"role": "user", "content": "3 + 4?"}]}
    with ServerThread(server) as running:
        plain = httpx.post(f"{running.base_url}/chat/completions", json=body, timeout=60)
        streamed = httpx.post(f"{running.base_url}/chat/completions", json={**body, "stream": True}, timeout=60)
        with pytest.raises(openai.InternalServerError, match="answering step failed"):
            running.client.chat.completions.create(**body)
    for reply in (plain, streamed):
        assert reply.status_code == 502 and reply.headers["content-type"].startswith("application/json")
        error = reply.json()["error"]
        assert error["code"] == "workers_failed" and error["type"] == "server_error"
        assert "2 of 2 steps failed" in error["message"]
        assert "step 0 (down-0): down-0: HTTP 500" in error["message"]
        assert "step 1 (down-1): down-1: HTTP 500" in error["message"]
        assert reply.json()["conductor"]["failed_steps"] == 2


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"model": "conductor"}, 400, "messages must be a non-empty list"),
        ({"model": "conductor", "messages": []}, 400, "messages must be a non-empty list"),
        ({"model": "conductor", "messages": "hi"}, 400, "messages must be a non-empty list"),
        ({"model": "conductor", "messages": [{"role": "wizard", "content": "x"}]}, 400, "role must be one of"),
        ({"model": "conductor", "messages": [{"role": "system", "content": "x"}]}, 400, "no user message"),
        ({"model": "conductor", "messages": [{"role": "user", "content": 5}]}, 400, "content must be a string"),
        ({"model": "gpt-5", "messages": [{"role": "user", "content": "x"}]}, 404, "does not exist"),
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "model is required"),
        ({"model": "conductor", "messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "only n=1"),
        ({"model": "conductor", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400,
         "temperature must be a number"),
        ({"model": "conductor", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}, 400,
         "max_tokens must be an integer from 1 to 1024"),
        ({"model": "conductor", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400,
         "stream must be a boolean"),
        ({"model": "conductor", "messages": [{"role": "user", "content": "x"}], "conductor_options": {"speed": 1}},
         400, "unknown conductor_options ['speed']"),
        ({"model": "conductor", "messages": [{"role": "user", "content": "x"}],
          "conductor_options": {"exclude_workers": [9]}}, 400, "neither a pool id 0..3"),
        ({"model": "conductor", "messages": [{"role": "user", "content": "x"}],
          "conductor_options": {"exclude_workers": [0, 1, 2, 3]}}, 400, "excludes every worker"),
        ({"model": "conductor", "messages": [{"role": "user", "content": "x"}],
          "conductor_options": {"max_steps": 6}}, 400, "max_steps must be an integer from 1 to 5"),
        ({"model": "conductor", "messages": [{"role": "user", "content": "x"}], "conductor_options": [1]}, 400,
         "conductor_options must be an object"),
    ],
)  # fmt: skip
def test_bad_requests_get_a_4xx_in_openais_error_shape(tokenizer, body, status, message):
    server, _ = synthetic_server(tokenizer, "no workflow here")
    with ServerThread(server) as running:
        raw = httpx.post(f"{running.base_url}/chat/completions", json=body, timeout=30)
        assert raw.status_code == status
        error = raw.json()["error"]
        assert message in error["message"] and error["type"] == "invalid_request_error"
        if "messages" in body and "model" in body and "stream" not in body:
            expected = openai.NotFoundError if status == 404 else openai.BadRequestError
            standard = {key: value for key, value in body.items() if key != "conductor_options"}
            extra = {key: value for key, value in body.items() if key == "conductor_options"}
            with pytest.raises(expected, match=re.escape(message)):
                running.client.chat.completions.create(**standard, extra_body=extra)
    assert server.service.generator.prompts == []  # nothing bad reached the Conductor


def test_malformed_json_and_unknown_routes_get_json_errors(tokenizer):
    with ServerThread(synthetic_server(tokenizer, "x")[0]) as running:
        bad_json = httpx.post(f"{running.base_url}/chat/completions", content=b"{not json",
                              headers={"content-type": "application/json"})  # fmt: skip
        missing = httpx.get(f"{running.base_url}/completions")
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
    assert missing.status_code == 404 and missing.json()["error"]["message"].startswith("GET /v1/completions")


def test_a_conductor_trained_on_the_compact_prompt_is_served_the_compact_prompt(tokenizer):
    server, tasks = synthetic_server(tokenizer, workflow_text(Step(3, "Solve it.")), conductor_prompt="compact")
    with ServerThread(server) as running:
        reply = running.client.chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": tasks[0].question}],
            extra_body={"conductor_options": {"exclude_workers": [1]}},
        )  # fmt: skip
    [prompt] = server.service.generator.prompts
    assert f"Question:\n{tasks[0].question}\n\nModels: 0, 2, 3<|im_end|>" in prompt
    assert "Example" not in prompt and reply.model_extra["conductor"]["steps"][0]["worker_name"] == "synthetic-3"


def test_bad_serve_config_is_rejected():
    with pytest.raises(ValueError, match="conductor_prompt"):
        ServeConfig(conductor_prompt="short")
    with pytest.raises(ValueError, match="format_attempts"):
        ServeConfig(format_attempts=0)
    with pytest.raises(ValueError, match="max_steps"):
        ServeConfig(max_steps=0)
    with pytest.raises(ValueError, match="pool is empty"):
        ConductorService(None, None, [])


def test_a_tiny_torch_conductor_serves_plain_and_streaming_requests(tmp_path, tokenizer):
    model_dir = tiny_hf_model_dir(tmp_path / "tiny", "llama", vocab_size=len(tokenizer))
    tokenizer.save_pretrained(model_dir)
    world = build_world(SyntheticWorldConfig(num_tasks=10))
    config = ServeConfig(sampling=SamplingParams(temperature=1.0, max_new_tokens=24, seed=0))
    service = ConductorService(TorchGenerator(model_dir), tokenizer, world.pool, config, tasks=world.tasks)
    messages = [{"role": "user", "content": world.tasks[0].question}]
    with ServerThread(ChatServer(service)) as running:
        def ask(stream):
            return httpx.post(f"{running.base_url}/chat/completions", timeout=120,
                              json={"model": "conductor", "messages": messages, "max_tokens": 16, "stream": stream})

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            replies = list(pool.map(ask, [False, True, False]))
    for reply in replies:
        # a random model writes no workflow: greedy, then two samples, and the request is refused with the reason
        assert reply.status_code == 422 and reply.headers["content-type"].startswith("application/json")
        attempts = reply.json()["conductor"]["attempts"]
        assert [a["temperature"] for a in attempts] == [0.0, 1.0, 1.0]
        assert all(a["parse_error"].startswith("missing list") for a in attempts)
        assert attempts[-1]["parse_error"] in reply.json()["error"]["message"]


@pytest.mark.slow
def test_the_serve_command_answers_with_a_tiny_conductor(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "launch.serve", "--world=synthetic", "--synthetic_tasks=10", f"--port={port}",
               "--max_tokens=8", f"--logdir={tmp_path}", "--served_model_name=tiny-conductor"]  # fmt: skip
    environ = {**os.environ, "CONDUCTOR_API_KEY": "sk-served"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-served", max_retries=0, timeout=60)
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, process.stdout.read()[-3000:]
            try:
                models = client.models.list()
                break
            except openai.APIConnectionError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(1)
        assert [model.id for model in models.data] == ["tiny-conductor"]
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401  # the key came from the variable
        with pytest.raises(openai.UnprocessableEntityError, match="no valid workflow in 3 attempt"):
            client.chat.completions.create(model="tiny-conductor", messages=[{"role": "user", "content": "2+2?"}])
        client.close()
    finally:
        process.terminate()
        process.wait(30)

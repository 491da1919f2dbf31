"""An OpenAI-compatible endpoint that answers with a Conductor driving the world's worker pool.

    python -m launch.serve --conductor=runs/replay/conductor_final --world=synthetic --port=8000

`GET /v1/models` lists the one served model; `POST /v1/chat/completions` (plain or `"stream": true` server-sent
events ending in `data: [DONE]`) takes the last user message as the question, asks the Conductor for a workflow,
executes it over the pool and replies with the final answer. The Conductor has `--format_attempts` tries to write a
workflow that parses: the first greedy (at the request's `temperature` if it gives one), the rest sampled together at
the serving temperature (the one the Conductor was trained at, from `trained_sampling.json`, unless `--temperature`
is given; the request's if it gives one above 0); the first that parses runs. The extra response field `conductor` holds
what a user needs to audit the answer: the workflow, every step's worker, input visibility, response or error,
tokens, cost and timing. A request may carry `conductor_options`:

- `exclude_workers`: pool ids or worker names the workflow must not use. The Conductor is shown the remaining
  workers renumbered 0..k-1 (workers are anonymous ids to it), and its ids are mapped back before execution.
- `max_steps`: a tighter step limit than the server's, stated in the prompt and enforced by the parser.

Invalid requests get a 4xx in OpenAI's error shape. A worker failure is a failed step in the audit record and
degrades the answer. A request with no answer is an error in the same shape, with the audit record beside it as
`conductor`: 422 (`code` "invalid_workflow", the last parse error in `message`) when no attempt parses, 502 (`code`
"workers_failed") when the workflow's answering step (its last) fails, with every failed step's error. A streamed
request's events are all sent once the workflow has run, so these errors reach it as the same status and JSON body,
before any event.
"""

from __future__ import annotations

from launch.host_memory import retain_freed_memory

# First, before JAX and torch start their threads; run as a program, restart with glibc tunables
# (launch/host_memory.py).
retain_freed_memory(restart=__name__ == "__main__")

import asyncio
import dataclasses
import hashlib
import itertools
import json
import logging
import pathlib
import time
import uuid
from typing import Any, Mapping, Sequence

from absl import app, flags
from aiohttp import web

from env import prompts
from env.executor import Execution, ExecutorConfig, aclose_workers, execute_async
from env.tasks.base import Task
from env.workers.base import Worker
from env.workers.cache import ResponseCache
from env.workflow import AccessMode, Step, Workflow, WorkflowFormatError, check_settings, parse_workflow
from launch.conductor import load_conductor
from launch.conductor_env import build_env
from launch.flag_groups import conductor as conductor_flags
from launch.flag_groups import environment as environment_flags
from launch.flag_groups import generator as generator_flags
from launch.flag_groups import sampling as sampling_flags
from launch.generators import build_generator, share_gpu_with_torch_generator
from models.tokenizer import render_chat
from rollout.types import SamplingParams

_HOST = flags.DEFINE_string("host", "127.0.0.1", "Interface to listen on.")
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on.")
_MODEL_NAME = flags.DEFINE_string("served_model_name", "conductor", "The model id clients ask for.")
_WORK_DIR = flags.DEFINE_string("workdir", "runs/serve", "Where a 'tiny' Conductor is written.")
_FORMAT_ATTEMPTS = flags.DEFINE_integer(
    "format_attempts", 3,
    "Tries per request at a workflow that parses: the first greedy, the rest sampled at the serving temperature "
    "(--temperature, default the one the Conductor was trained at); the first that parses runs, and a request none "
    "parses for is answered 422.",
    lower_bound=1,
)

_ROLES = ("system", "developer", "user", "assistant", "tool")
_OPTION_NAMES = ("exclude_workers", "max_steps")


class RequestError(Exception):
    """A client error, answered as `{"error": {...}}` with `status`."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


class AnswerError(Exception):
    """A request the Conductor and its pool could not answer, answered as `{"error": {...}, "conductor": audit}`."""

    def __init__(self, message: str, *, status: int, code: str, audit: dict[str, Any]):
        super().__init__(message)
        self.message, self.status, self.code, self.audit = message, status, code, audit


def _error_response(
    status: int, message: str, param: str | None = None, code: str | None = None, **extra: Any
) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}, **extra},
                             status=status)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """`sampling` is the Conductor's default sampling, whose temperature is the serving temperature of the attempts
    after the first (`attempt_temperatures`); a request may change its temperature, top_p and token limit (never
    above `sampling.max_new_tokens`)."""

    model_name: str = "conductor"
    max_steps: int = 5
    access_mode: AccessMode = "binary"
    sampling: SamplingParams = SamplingParams(temperature=1.0, max_new_tokens=1024)
    executor: ExecutorConfig = ExecutorConfig()
    format_attempts: int = 3

    def __post_init__(self) -> None:
        check_settings(1, self.max_steps, self.access_mode)
        if not self.model_name:
            raise ValueError("model_name must not be empty")
        if self.format_attempts < 1:
            raise ValueError(f"format_attempts must be >= 1, got {self.format_attempts}")


@dataclasses.dataclass(frozen=True)
class RequestOptions:
    excluded: tuple[int, ...] = ()
    max_steps: int = 5


@dataclasses.dataclass(frozen=True)
class Answer:
    content: str
    audit: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int


def attempt_temperatures(requested: float | None, serving: float, attempts: int) -> tuple[float, ...]:
    """The temperature of each try at a workflow: the first greedy (or the request's temperature), the rest at the
    request's temperature if above 0, else the serving one. Greedy retries would repeat the first, so there are
    none."""
    first = 0.0 if requested is None else requested
    retry = requested if requested else serving
    return (first,) + (retry,) * (attempts - 1) if retry > 0 else (first,)


def _no_gold(response_text: str, gold: Any) -> float:
    raise ValueError("a served question has no gold answer to grade")


class ConductorService:
    """Turns a question into an answer: prompt, sample (one generation at a time: in-process generators are not
    thread-safe), parse, map ids to the pool, execute. `tasks` are questions the world's simulated workers can
    answer; a question that matches one exactly is executed as that task."""

    def __init__(
        self,
        generator: Any,
        tokenizer: Any,
        pool: Sequence[Worker],
        config: ServeConfig = ServeConfig(),
        *,
        cache: ResponseCache | None = None,
        tasks: Sequence[Task] = (),
    ) -> None:
        if not pool:
            raise ValueError("the worker pool is empty")
        self.generator = generator
        self.tokenizer = tokenizer
        self.pool = list(pool)
        self.config = config
        self.cache = cache
        self._tasks = {task.question: task for task in tasks}
        self._generation = asyncio.Lock()

    def worker_names(self) -> list[str]:
        return [worker.name for worker in self.pool]

    def options(self, raw: Any) -> RequestOptions:
        """Validated `conductor_options`."""
        if raw is None:
            return RequestOptions(max_steps=self.config.max_steps)
        if not isinstance(raw, dict):
            raise RequestError("conductor_options must be an object", param="conductor_options")
        unknown = sorted(set(raw) - set(_OPTION_NAMES))
        if unknown:
            raise RequestError(f"unknown conductor_options {unknown}; allowed: {list(_OPTION_NAMES)}",
                               param="conductor_options")  # fmt: skip
        names = self.worker_names()
        excluded = raw.get("exclude_workers", [])
        if not isinstance(excluded, list):
            raise RequestError("exclude_workers must be a list of worker ids or names", param="exclude_workers")
        ids = set()
        for entry in excluded:
            if isinstance(entry, int) and not isinstance(entry, bool) and 0 <= entry < len(names):
                ids.add(entry)
            elif isinstance(entry, str) and entry in names:
                ids.add(names.index(entry))
            else:
                raise RequestError(
                    f"exclude_workers entry {entry!r} is neither a pool id 0..{len(names) - 1} nor one of {names}",
                    param="exclude_workers",
                )
        if len(ids) == len(names):
            raise RequestError("exclude_workers excludes every worker in the pool", param="exclude_workers")
        max_steps = raw.get("max_steps", self.config.max_steps)
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or not 1 <= max_steps <= self.config.max_steps:
            raise RequestError(f"max_steps must be an integer from 1 to {self.config.max_steps}", param="max_steps")
        return RequestOptions(excluded=tuple(sorted(ids)), max_steps=max_steps)

    def _task(self, question: str) -> Task:
        if question in self._tasks:
            return self._tasks[question]
        digest = hashlib.sha256(question.encode()).hexdigest()[:16]
        return Task(id=f"request/{digest}", domain="request", question=question, gold=None, grader=_no_gold)

    async def answer(
        self, question: str, options: RequestOptions, sampling: SamplingParams, temperatures: Sequence[float]
    ) -> Answer:
        """The executed workflow's answer; `temperatures` are the tries at a workflow (`attempt_temperatures`).
        Raises `AnswerError` when no try parses or the answering step fails."""
        allowed = [w for w in range(len(self.pool)) if w not in options.excluded]
        messages = prompts.conductor_messages(question, len(allowed), options.max_steps, self.config.access_mode)
        prompt_ids = render_chat(self.tokenizer, messages, prompts.CONDUCTOR_PREFIX)
        workflow, text, attempts, completion_tokens = None, "", [], 0
        # Tries at one temperature are sampled in one call: one batch costs about what one row does.
        for temperature, tries in itertools.groupby(temperatures):
            params = dataclasses.replace(sampling, temperature=temperature)
            async with self._generation:
                groups = await asyncio.to_thread(self.generator.generate, [prompt_ids], params, len(list(tries)))
            completion_tokens += sum(len(completion.completion_ids) for completion in groups[0])
            for completion in groups[0]:
                text = self.tokenizer.decode(list(completion.completion_ids), skip_special_tokens=True)
                try:
                    workflow = parse_workflow(prompts.CONDUCTOR_PREFIX + text, len(allowed), options.max_steps,
                                              self.config.access_mode)  # fmt: skip
                    attempts.append({"temperature": temperature, "parse_error": None})
                    break
                except WorkflowFormatError as error:
                    attempts.append({"temperature": temperature, "parse_error": str(error)})
            if workflow is not None:
                break
        audit: dict[str, Any] = {
            "workers": self.worker_names(),
            "excluded_workers": list(options.excluded),
            "max_steps": options.max_steps,
            "attempts": attempts,
            "conductor_text": prompts.CONDUCTOR_PREFIX + text,
        }
        usage = (len(prompt_ids), completion_tokens)
        if workflow is None:
            audit.update(parse_error=attempts[-1]["parse_error"], workflow=None, steps=[], worker_calls=0,
                         worker_tokens=0, cost_usd=0.0, failed_steps=0)  # fmt: skip
            raise AnswerError(
                f"the Conductor wrote no valid workflow in {len(attempts)} attempt(s) at temperatures "
                f"{[a['temperature'] for a in attempts]}; the last: {attempts[-1]['parse_error']}",
                status=422, code="invalid_workflow", audit=audit,
            )
        # The Conductor saw the allowed workers as ids 0..k-1; run its steps on the pool members they stand for.
        pooled = Workflow(
            steps=tuple(Step(allowed[s.worker], s.instruction, s.access) for s in workflow.steps),
            reasoning=workflow.reasoning,
        )
        execution = await execute_async(pooled, self._task(question), self.pool, self.cache,
                                        config=self.config.executor)  # fmt: skip
        audit.update(parse_error=None, reasoning=workflow.reasoning, **_execution_audit(pooled, execution))
        if not execution.steps[-1].ok:
            failed = "; ".join(f"step {r.index} ({r.worker_name}): {r.error}" for r in execution.steps if not r.ok)
            raise AnswerError(
                f"the workflow's answering step failed ({execution.failed_steps} of {len(execution.steps)} steps "
                f"failed): {failed}",
                status=502, code="workers_failed", audit=audit,
            )
        return Answer(execution.final_answer, audit, *usage)


def _execution_audit(workflow: Workflow, execution: Execution) -> dict[str, Any]:
    return {
        "workflow": [
            {"worker": step.worker, "instruction": step.instruction,
             "access": step.access if step.access == "all" else list(step.access)}  # fmt: skip
            for step in workflow.steps
        ],
        "steps": [
            {
                "index": r.index, "worker": r.worker, "worker_name": r.worker_name, "instruction": r.instruction,
                "visible": list(r.visible), "response": r.response, "error": r.error,
                "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens, "cost_usd": r.cost_usd,
                "latency_s": r.latency_s, "cached": r.cached,
            }  # fmt: skip
            for r in execution.steps
        ],
        "worker_calls": execution.calls,
        "worker_tokens": execution.tokens,
        "cost_usd": execution.cost_usd,
        "failed_steps": execution.failed_steps,
        "wall_s": execution.wall_s,
    }


# -- the OpenAI wire format ----------------------------------------------------------------------------------------


def _content_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"messages[{index}].content parts must be text parts", param=f"messages[{index}]")
            parts.append(part["text"])
        return "".join(parts)
    if content is None:
        return ""
    raise RequestError(f"messages[{index}].content must be a string or a list of text parts",
                       param=f"messages[{index}].content")  # fmt: skip


def question_of(messages: Any) -> str:
    """The last user message's text, after checking the message list."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    question = None
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(f"messages[{index}] must be an object", param=f"messages[{index}]")
        role = message.get("role")
        if role not in _ROLES:
            raise RequestError(f"messages[{index}].role must be one of {list(_ROLES)}, got {role!r}",
                               param=f"messages[{index}].role")  # fmt: skip
        text = _content_text(message.get("content"), index)
        if role == "user":
            question = text
    if question is None or not question.strip():
        raise RequestError("messages has no user message with text: the last user message is the question",
                           param="messages")  # fmt: skip
    return question


def _number(body: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(f"{name} must be a number from {low} to {high}", param=name)
    return float(value)


def request_sampling(body: Mapping[str, Any], default: SamplingParams) -> SamplingParams:
    changes: dict[str, Any] = {}
    if (temperature := _number(body, "temperature", 0.0, 2.0)) is not None:
        changes["temperature"] = temperature
    if (top_p := _number(body, "top_p", 0.0, 1.0)) is not None:
        if top_p == 0.0:
            raise RequestError("top_p must be greater than 0", param="top_p")
        changes["top_p"] = top_p
    for name in ("max_completion_tokens", "max_tokens"):
        if body.get(name) is not None:
            value = body[name]
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= default.max_new_tokens:
                raise RequestError(f"{name} must be an integer from 1 to {default.max_new_tokens}", param=name)
            changes["max_new_tokens"] = value
            break
    if body.get("seed") is not None:
        if isinstance(body["seed"], bool) or not isinstance(body["seed"], int):
            raise RequestError("seed must be an integer", param="seed")
        changes["seed"] = body["seed"]
    return dataclasses.replace(default, **changes)


class ChatServer:
    """The aiohttp application around a `ConductorService`."""

    def __init__(self, service: ConductorService) -> None:
        self.service = service
        self.created = int(time.time())
        self.app = web.Application(middlewares=[self._errors], client_max_size=4 * 1024**2)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_post("/v1/chat/completions", self.chat_completions)
        self.app.on_cleanup.append(self._close)

    async def _close(self, app: web.Application) -> None:
        await aclose_workers(self.service.pool)
        self.service.generator.close()
        if self.service.cache is not None:
            self.service.cache.close()

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestError as error:
            return _error_response(error.status, error.message, error.param, error.code)
        except AnswerError as error:
            logging.warning("%s %s: %s", request.method, request.path, error.message)
            return _error_response(error.status, error.message, code=error.code, conductor=error.audit)
        except web.HTTPException as error:  # unknown route, wrong method, body too large
            return _error_response(error.status, f"{request.method} {request.path}: {error.reason}")
        except Exception as error:
            logging.exception("%s %s failed", request.method, request.path)
            return _error_response(500, f"{type(error).__name__}: {error}")

    @property
    def model_name(self) -> str:
        return self.service.config.model_name

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({
            "object": "list",
            "data": [{"id": self.model_name, "object": "model", "created": self.created, "owned_by": "conductor"}],
        })  # fmt: skip

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RequestError("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str):
            raise RequestError("model is required and must be a string", param="model")
        if model != self.model_name:
            raise RequestError(f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                               param="model", status=404, code="model_not_found")  # fmt: skip
        question = question_of(body.get("messages"))
        if body.get("n", 1) != 1:
            raise RequestError("only n=1 is supported", param="n")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("stream must be a boolean", param="stream")
        sampling = request_sampling(body, self.service.config.sampling)
        temperatures = attempt_temperatures(
            _number(body, "temperature", 0.0, 2.0), self.service.config.sampling.temperature,
            self.service.config.format_attempts,
        )
        options = self.service.options(body.get("conductor_options"))
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        answer = await self.service.answer(question, options, sampling, temperatures)
        if stream:
            return await self._stream(request, completion_id, answer)
        return web.json_response({
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": answer.content}, "finish_reason": "stop"}
            ],
            "usage": _usage(answer),
            "conductor": answer.audit,
        })  # fmt: skip

    async def _stream(self, request: web.Request, completion_id: str, answer: Answer) -> web.StreamResponse:
        """The answer as server-sent chunks. It exists only once the whole workflow has run, so nothing is sent
        before: a request without an answer gets its error status instead of a stream."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)

        async def send(payload: Any) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            await response.write(f"data: {data}\n\n".encode())

        def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
            return {
                "id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.model_name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra,
            }  # fmt: skip

        await send(chunk({"role": "assistant", "content": ""}))
        if answer.content:
            await send(chunk({"content": answer.content}))
        await send(chunk({}, "stop", usage=_usage(answer), conductor=answer.audit))
        await send("[DONE]")
        await response.write_eof()
        return response


def _usage(answer: Answer) -> dict[str, int]:
    """The Conductor's own tokens; the workers' are in the `conductor` audit field."""
    return {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": answer.completion_tokens,
        "total_tokens": answer.prompt_tokens + answer.completion_tokens,
    }


def build_server() -> ChatServer:
    """The server the flags describe: `--world`'s pool and cache, `--conductor` on `--generator`."""
    generation = generator_flags.from_flags()
    share_gpu_with_torch_generator(generation)  # before JAX's first computation
    env = build_env(environment_flags.from_flags())
    work_dir = pathlib.Path(_WORK_DIR.value)
    _, tokenizer, model_dir = load_conductor(conductor_flags.from_flags(), work_dir / "conductor")
    generator, _ = build_generator(generation, model_dir, work_dir)
    config = ServeConfig(
        model_name=_MODEL_NAME.value,
        max_steps=env.config.max_steps,
        access_mode=env.config.access_mode,
        sampling=sampling_flags.from_flags(trained_conductor=model_dir),
        executor=env.config.executor,
        format_attempts=_FORMAT_ATTEMPTS.value,
    )
    return ChatServer(ConductorService(generator, tokenizer, env.world.pool, config, cache=env.cache,
                                       tasks=env.world.tasks))  # fmt: skip


def main(argv: list[str]) -> None:
    del argv
    logging.getLogger().setLevel(logging.INFO)
    web.run_app(build_server().app, host=_HOST.value, port=_PORT.value)


if __name__ == "__main__":
    app.run(main)

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

The door (`AccessConfig`, docs/serving.md): with `--api_key` (or `CONDUCTOR_API_KEY`) every route wants
`Authorization: Bearer <key>` (401 otherwise), and a `--host` beyond loopback without a key refuses to start unless
`--allow_unauthenticated`; at most `--max_concurrent_requests` completions run and `--max_queued_requests` wait, the
rest get 429 with `Retry-After`; a completion past `--request_timeout_s` gets 504; a body over `--max_request_bytes`
gets 413 and any other malformed one 400. Every response carries `x-request-id`, every error body the same id as
`error.request_id`; an unexpected failure is a 500 whose details are only in the server log, under that id.
"""

from __future__ import annotations

from conductor.host_memory import retain_freed_memory

# First, before JAX and torch start their threads; run as a program, restart with glibc tunables
# (conductor/host_memory.py).
retain_freed_memory(restart=__name__ == "__main__")

import asyncio
import dataclasses
import hashlib
import hmac
import ipaddress
import itertools
import json
import logging
import math
import os
import sys
import time
import uuid
from typing import Any, Mapping, Sequence

from absl import app, flags
from aiohttp import web

from conductor.conductor_env import build_env
from conductor.generators import build_generator, share_gpu_with_torch_generator
from conductor.model import load_conductor, trained_sampling
from env import prompts
from env.executor import Execution, ExecutorConfig, aclose_workers, execute_async
from env.tasks.base import Task
from env.workers.base import Worker
from env.workers.cache import ResponseCache
from env.workflow import AccessMode, Workflow, WorkflowFormatError, check_settings, parse_workflow
from launch.flag_groups import conductor as conductor_flags
from launch.flag_groups import environment as environment_flags
from launch.flag_groups import field_values
from launch.flag_groups import generator as generator_flags
from launch.flag_groups import output as output_flags
from launch.flag_groups import sampling as sampling_flags
from models.tokenizer import render_chat
from rollout.types import SamplingParams

_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on.")
_API_KEY = flags.DEFINE_string(
    "api_key", None,
    "The key every request must carry as `Authorization: Bearer <key>`; unset, the CONDUCTOR_API_KEY environment "
    "variable (which, unlike a flag, other users of the machine cannot read in the process list).",
)
_ACCESS_FIELDS = {
    "host": flags.DEFINE_string(
        "host", "127.0.0.1",
        "Interface to listen on. One beyond loopback (0.0.0.0, ::, a name, an address) needs an API key or "
        "--allow_unauthenticated.",
    ),
    "allow_unauthenticated": flags.DEFINE_boolean(
        "allow_unauthenticated", False,
        "Serve a --host beyond loopback without an API key: anyone who reaches the port spends the pool's workers.",
    ),
    "max_concurrent_requests": flags.DEFINE_integer(
        "max_concurrent_requests", 8, "Chat completions that run at once; the next ones wait in the queue.",
        lower_bound=1,
    ),
    "max_queued_requests": flags.DEFINE_integer(
        "max_queued_requests", 32,
        "Chat completions that may wait for a running one to end; beyond them a request gets 429 with Retry-After.",
        lower_bound=0,
    ),
    "request_timeout_s": flags.DEFINE_float(
        "request_timeout_s", 600.0,
        "Seconds from a chat completion's arrival (queueing included) to its answer; past it the request gets 504 "
        "and its work is cancelled.",
    ),
    "max_request_bytes": flags.DEFINE_integer(
        "max_request_bytes", 1024**2, "The largest request body read (decompressed); a larger one gets 413.",
    ),
}
_MODEL_NAME = flags.DEFINE_string("served_model_name", "conductor", "The model id clients ask for.")
_FORMAT_ATTEMPTS = flags.DEFINE_integer(
    "format_attempts", 3,
    "Tries per request at a workflow that parses: the first greedy, the rest sampled at the serving temperature "
    "(--temperature, default the one the Conductor was trained at); the first that parses runs, and a request none "
    "parses for is answered 422.",
    lower_bound=1,
)

_ROLES = ("system", "developer", "user", "assistant", "tool")
_OPTION_NAMES = ("exclude_workers", "max_steps")
API_KEY_VARIABLE = "CONDUCTOR_API_KEY"
REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID = web.RequestKey("request_id", str)
# Deeper JSON than any chat request needs; json.loads alone would accept up to the interpreter's recursion limit,
# and echoing such a value in an error message could hit it again.
MAX_JSON_DEPTH = 32
_SEED_LIMIT = 2**63  # an int64, as OpenAI's seed is


class RequestError(Exception):
    """A request the server will not answer, answered as `{"error": {...}}` with `status` (and `headers`)."""

    def __init__(
        self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None,
        kind: str | None = None, headers: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code
        self.kind, self.headers = kind, dict(headers or {})


class AnswerError(Exception):
    """A request the Conductor and its pool could not answer, answered as `{"error": {...}, "conductor": audit}`."""

    def __init__(self, message: str, *, status: int, code: str, audit: dict[str, Any]):
        super().__init__(message)
        self.message, self.status, self.code, self.audit = message, status, code, audit


def _error_response(
    status: int, message: str, request_id: str, param: str | None = None, code: str | None = None, *,
    kind: str | None = None, headers: Mapping[str, str] | None = None, **extra: Any,
) -> web.Response:  # fmt: skip
    """OpenAI's error shape; `request_id` (also the `x-request-id` header) finds the request in the server log."""
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    error = {"message": message, "type": kind, "param": param, "code": code, "request_id": request_id}
    return web.json_response({"error": error, **extra}, status=status, headers=headers)


def is_loopback(host: str) -> bool:
    """Whether `host` listens on this machine alone. A name other than "localhost" counts as beyond it: what it
    resolves to can change, and "" means every interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class AccessConfig:
    """Who may use the server and how much of it at once. `request_timeout_s` runs from a completion's arrival, so
    it covers reading the body and the wait in the queue. Without `api_key`, only a loopback `host` is served,
    unless `allow_unauthenticated`."""

    host: str = "127.0.0.1"
    api_key: str | None = None
    allow_unauthenticated: bool = False
    max_concurrent_requests: int = 8
    max_queued_requests: int = 32
    request_timeout_s: float = 600.0
    max_request_bytes: int = 1024**2

    def __post_init__(self) -> None:
        if self.api_key is not None and (not self.api_key or any(c.isspace() for c in self.api_key)):
            raise ValueError("api_key must be a non-empty string without whitespace")
        if self.api_key is None and not self.allow_unauthenticated and not is_loopback(self.host):
            raise ValueError(
                f"--host={self.host!r} listens beyond this machine and no API key is set, so anyone who reaches the "
                f"port could spend the pool's workers. Give --api_key or the {API_KEY_VARIABLE} environment "
                "variable (clients send it as `Authorization: Bearer <key>`), listen on 127.0.0.1, or pass "
                "--allow_unauthenticated to serve openly anyway."
            )
        if self.max_concurrent_requests < 1:
            raise ValueError(f"max_concurrent_requests must be >= 1, got {self.max_concurrent_requests}")
        if self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {self.max_queued_requests}")
        if not 0 < self.request_timeout_s < math.inf:
            raise ValueError(f"request_timeout_s must be a positive number of seconds, got {self.request_timeout_s}")
        if self.max_request_bytes < 1024:
            raise ValueError(f"max_request_bytes must be >= 1024, got {self.max_request_bytes}")


def access_from_flags(environ: Mapping[str, str] = os.environ) -> AccessConfig:
    """The door's flags; `--api_key`, unset, comes from CONDUCTOR_API_KEY (an empty variable is unset)."""
    return AccessConfig(api_key=_API_KEY.value or environ.get(API_KEY_VARIABLE) or None,
                        **field_values(_ACCESS_FIELDS))  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """`sampling` is the Conductor's default sampling, whose temperature is the serving temperature of the attempts
    after the first (`attempt_temperatures`); a request may change its temperature, top_p and token limit (never
    above `sampling.max_new_tokens`)."""

    model_name: str = "conductor"
    max_steps: int = 5
    access_mode: AccessMode = "binary"
    conductor_prompt: prompts.ConductorPrompt = "full"
    sampling: SamplingParams = SamplingParams(temperature=1.0, max_new_tokens=1024)
    executor: ExecutorConfig = ExecutorConfig()
    format_attempts: int = 3

    def __post_init__(self) -> None:
        check_settings(1, self.max_steps, self.access_mode)
        prompts.check_conductor_prompt(self.conductor_prompt)
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
    answer; a question that matches one exactly is executed as that task. A cancelled `answer` (a request past its
    deadline) cancels its worker calls; a generation already running finishes in its thread, unread."""

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
            raise RequestError(f"unknown conductor_options {_shown(unknown)}; allowed: {list(_OPTION_NAMES)}",
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
                    f"exclude_workers entry {_shown(entry)} is neither a pool id 0..{len(names) - 1} nor one of "
                    f"{names}",
                    param="exclude_workers",
                )
        if len(ids) == len(names):
            raise RequestError("exclude_workers excludes every worker in the pool", param="exclude_workers")
        max_steps = raw.get("max_steps", self.config.max_steps)
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or not 1 <= max_steps <= self.config.max_steps:
            raise RequestError(f"max_steps must be an integer from 1 to {self.config.max_steps}", param="max_steps")
        return RequestOptions(excluded=tuple(sorted(ids)), max_steps=max_steps)

    async def _generate(self, prompt_ids: Sequence[int], params: SamplingParams, count: int) -> Any:
        """One `generate` call in a thread. A thread cannot be stopped, so the lock is released when the thread
        returns, not when the awaiting request is cancelled: the next generation never overlaps an abandoned one."""
        await self._generation.acquire()
        work = asyncio.get_running_loop().run_in_executor(None, self.generator.generate, [prompt_ids], params, count)
        work.add_done_callback(lambda _: self._generation.release())
        return await asyncio.shield(work)

    def _task(self, question: str) -> Task:
        if question in self._tasks:
            return self._tasks[question]
        digest = hashlib.sha256(question.encode()).hexdigest()[:16]
        return Task(id=f"request/{digest}", task_label="request", question=question, gold=None, grader=_no_gold)

    async def answer(
        self, question: str, options: RequestOptions, sampling: SamplingParams, temperatures: Sequence[float]
    ) -> Answer:
        """The executed workflow's answer; `temperatures` are the tries at a workflow (`attempt_temperatures`).
        Raises `AnswerError` when no try parses or the answering step fails."""
        # The workers left are offered by their pool ids, as a training run's offered pools are (`env.pools`).
        allowed = [w for w in range(len(self.pool)) if w not in options.excluded]
        messages = prompts.conductor_messages(
            question, allowed, options.max_steps, self.config.access_mode, self.config.conductor_prompt
        )
        prompt_ids = render_chat(self.tokenizer, messages, prompts.CONDUCTOR_PREFIX)
        workflow, text, attempts, completion_tokens = None, "", [], 0
        # Tries at one temperature are sampled in one call: one batch costs about what one row does.
        for temperature, tries in itertools.groupby(temperatures):
            params = dataclasses.replace(sampling, temperature=temperature)
            groups = await self._generate(prompt_ids, params, len(list(tries)))
            completion_tokens += sum(len(completion.completion_ids) for completion in groups[0])
            for completion in groups[0]:
                text = self.tokenizer.decode(list(completion.completion_ids), skip_special_tokens=True)
                try:
                    workflow = parse_workflow(prompts.CONDUCTOR_PREFIX + text, allowed, options.max_steps,
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
        execution = await execute_async(workflow, self._task(question), self.pool, self.cache,
                                        config=self.config.executor)  # fmt: skip
        audit.update(parse_error=None, reasoning=workflow.reasoning, **_execution_audit(workflow, execution))
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


def _shown(value: Any) -> str:
    """A request's value as an error message quotes it: short, whatever the client sent."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a `RequestError` for anything else: bytes that are not UTF-8 (JSON's
    only encoding, whatever the Content-Type says), invalid JSON, NaN or Infinity, integers over Python's 4,300-digit
    conversion limit, nesting deeper than `MAX_JSON_DEPTH`, or strings with lone surrogates (escaped `\\ud800`, which
    no tokenizer or hash can encode)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError("the request body is not UTF-8") from None
    try:
        body = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise RequestError(f"the request body is not valid JSON: {error}") from None
    except RecursionError:
        raise RequestError(f"the request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError:  # the only other one json raises: int() refusing a long digit string
        raise RequestError(f"the request body has an integer of more than {sys.get_int_max_str_digits()} "
                           "digits") from None  # fmt: skip
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    pending = [(body, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > MAX_JSON_DEPTH:
            raise RequestError(f"the request body is nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise RequestError("the request body has a string with a lone surrogate escape") from None
        elif isinstance(value, dict):
            pending.extend((item, depth + 1) for pair in value.items() for item in pair)
        elif isinstance(value, list):
            pending.extend((item, depth + 1) for item in value)
    return body


def _refuse_constant(name: str) -> Any:
    raise RequestError(f"the request body is not valid JSON: {name} is not a JSON number")


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
            raise RequestError(f"messages[{index}].role must be one of {list(_ROLES)}, got {_shown(role)}",
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
        seed = body["seed"]
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _SEED_LIMIT:
            raise RequestError(f"seed must be an integer from 0 to {_SEED_LIMIT - 1}", param="seed")
        changes["seed"] = body["seed"]
    return dataclasses.replace(default, **changes)


class ChatServer:
    """The aiohttp application around a `ConductorService`, behind the door `access` describes (its `host` is where
    `main` listens)."""

    def __init__(self, service: ConductorService, access: AccessConfig = AccessConfig()) -> None:
        self.service = service
        self.access = access
        self.created = int(time.time())
        self._api_key = None if access.api_key is None else access.api_key.encode()
        self._running = asyncio.Semaphore(access.max_concurrent_requests)
        self._admitted = 0  # running and queued completions
        self._mean_wall_s = 1.0  # of recent completions, for Retry-After
        self.app = web.Application(middlewares=[self._door], client_max_size=access.max_request_bytes)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_post("/v1/chat/completions", self.chat_completions)
        self.app.on_cleanup.append(self._close)

    async def _close(self, app: web.Application) -> None:
        await aclose_workers(self.service.pool)
        self.service.generator.close()
        if self.service.cache is not None:
            self.service.cache.close()

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        # compare_digest's time depends on the lengths alone, not on where a guess first differs
        given = key.strip().encode("utf-8", "surrogateescape")
        return scheme.lower() == "bearer" and hmac.compare_digest(given, self._api_key)

    @web.middleware
    async def _door(self, request: web.Request, handler: Any) -> web.StreamResponse:
        request_id = f"req_{uuid.uuid4().hex}"
        request[_REQUEST_ID] = request_id
        try:
            if self._api_key is not None and not self._authorized(request):
                given = "Authorization" in request.headers
                raise RequestError(
                    "Incorrect API key provided." if given else
                    "No API key provided: send it in an `Authorization: Bearer <key>` header.",
                    status=401, code="invalid_api_key",
                )  # fmt: skip
            response = await handler(request)
        except RequestError as error:
            response = _error_response(error.status, error.message, request_id, error.param, error.code,
                                       kind=error.kind, headers=error.headers)  # fmt: skip
        except AnswerError as error:
            logging.warning("%s %s %s: %s", request_id, request.method, request.path, error.message)
            response = _error_response(error.status, error.message, request_id, code=error.code,
                                       conductor=error.audit)  # fmt: skip
        except web.HTTPException as error:  # unknown route, wrong method
            response = _error_response(error.status, f"{request.method} {request.path}: {error.reason}", request_id)
        except Exception:
            logging.exception("%s %s %s failed", request_id, request.method, request.path)
            response = _error_response(
                500, f"The server failed on this request; its log has the details under request id {request_id}.",
                request_id,
            )
        if not response.prepared:  # a stream sets its own before its first event
            response.headers[REQUEST_ID_HEADER] = request_id
        return response

    def _retry_after_s(self) -> int:
        """About when a queue place frees: when one running completion ends, at the recent mean wall per completion
        shared among the running ones; at least 1 s, at most 60 (the longest the openai client waits)."""
        return min(60, max(1, math.ceil(self._mean_wall_s / self.access.max_concurrent_requests)))

    async def _answer(self, question: str, options: RequestOptions, sampling: SamplingParams,
                      temperatures: Sequence[float]) -> Answer:  # fmt: skip
        """The service's answer, admitted: at most `max_concurrent_requests` run and `max_queued_requests` wait;
        a request beyond them is refused with 429 at once."""
        access = self.access
        if self._admitted >= access.max_concurrent_requests + access.max_queued_requests:
            retry_after = self._retry_after_s()
            raise RequestError(
                f"the server is at its limit of {access.max_concurrent_requests} running and "
                f"{access.max_queued_requests} queued requests; retry after {retry_after} s",
                status=429, kind="requests", code="rate_limit_exceeded", headers={"Retry-After": str(retry_after)},
            )  # fmt: skip
        self._admitted += 1
        try:
            async with self._running:
                start = time.perf_counter()
                try:
                    return await self.service.answer(question, options, sampling, temperatures)
                finally:
                    self._mean_wall_s = 0.8 * self._mean_wall_s + 0.2 * (time.perf_counter() - start)
        finally:
            self._admitted -= 1

    @property
    def model_name(self) -> str:
        return self.service.config.model_name

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({
            "object": "list",
            "data": [{"id": self.model_name, "object": "model", "created": self.created, "owned_by": "conductor"}],
        })  # fmt: skip

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        deadline = asyncio.timeout(self.access.request_timeout_s)
        try:
            async with deadline:
                question, options, sampling, temperatures, stream = await self._request(request)
                answer = await self._answer(question, options, sampling, temperatures)
        except TimeoutError:
            if not deadline.expired():
                raise
            logging.warning("%s %s %s: past its deadline of %s s, cancelled", request[_REQUEST_ID], request.method,
                            request.path, self.access.request_timeout_s)  # fmt: skip
            # The official client retries a 5xx twice by default; a retry would spend the pool as long again.
            raise RequestError(f"the request did not finish within the server's {self.access.request_timeout_s} s",
                               status=504, code="request_timeout", headers={"x-should-retry": "false"}) from None
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
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

    async def _request(
        self, request: web.Request
    ) -> tuple[str, RequestOptions, SamplingParams, tuple[float, ...], bool]:
        """The request's question, options, sampling, attempt temperatures and whether it streams, or a
        `RequestError` saying what is wrong with it."""
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise RequestError(f"the request body is larger than the server's limit of "
                               f"{self.access.max_request_bytes} bytes", status=413) from None  # fmt: skip
        body = parse_body(raw)
        model = body.get("model")
        if not isinstance(model, str):
            raise RequestError("model is required and must be a string", param="model")
        if model != self.model_name:
            raise RequestError(f"the model {_shown(model)} does not exist; this server serves {self.model_name!r}",
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
        return question, self.service.options(body.get("conductor_options")), sampling, temperatures, stream

    async def _stream(self, request: web.Request, completion_id: str, answer: Answer) -> web.StreamResponse:
        """The answer as server-sent chunks. It exists only once the whole workflow has run, so nothing is sent
        before: a request without an answer gets its error status instead of a stream."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               REQUEST_ID_HEADER: request[_REQUEST_ID]})  # fmt: skip
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


def build_server(access: AccessConfig) -> ChatServer:
    """The server the flags describe: `--world`'s pool and cache, `--conductor` on `--generator`, behind `access`."""
    generation = generator_flags.from_flags()
    share_gpu_with_torch_generator(generation)  # before JAX's first computation
    work_dir = output_flags.logdir("runs/serve")  # a 'tiny' Conductor and the generator's files
    _, tokenizer, model_dir = load_conductor(conductor_flags.from_flags(), work_dir / "conductor")
    env = build_env(environment_flags.from_flags(trained=trained_sampling(model_dir)))  # the prompt it was trained on
    generator, _ = build_generator(generation, model_dir, work_dir)
    config = ServeConfig(
        model_name=_MODEL_NAME.value,
        max_steps=env.config.max_steps,
        access_mode=env.config.access_mode,
        conductor_prompt=env.config.conductor_prompt,
        sampling=sampling_flags.from_flags(trained_conductor=model_dir),
        executor=env.config.executor,
        format_attempts=_FORMAT_ATTEMPTS.value,
    )
    service = ConductorService(generator, tokenizer, env.world.pool, config, cache=env.cache, tasks=env.world.tasks)
    return ChatServer(service, access)


def main(argv: list[str]) -> None:
    del argv
    try:  # before loading anything: a refused door should not wait for the models
        access = access_from_flags()
    except ValueError as error:
        raise SystemExit(f"launch.serve: {error}") from None  # the reason alone, not absl's usage text before it
    logging.getLogger().setLevel(logging.INFO)
    web.run_app(build_server(access).app, host=access.host, port=_PORT.value)


if __name__ == "__main__":
    app.run(main)

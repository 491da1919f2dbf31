"""What every provider-backed worker shares: keys from the environment, retries, a concurrency limit, prices.

A backend subclass only says how to build its SDK client, how to make one request, and which failures are worth
retrying. Everything measured (retries, backoff, tokens, cost) happens here, with the SDKs' own retries disabled.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import os
import random
import time
import weakref
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

from env.workers.base import Message, WorkerError, WorkerReply

if TYPE_CHECKING:
    from env.tasks.base import Task

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Price:
    """List price of a model in US dollars per million input (prompt) and output (completion) tokens.

    Reasoning/thinking tokens are billed as output tokens by every provider here, so backends count them there.
    """

    input_usd_per_mtok: float
    output_usd_per_mtok: float

    def __post_init__(self) -> None:
        # `not 0 <= x < inf` also refuses NaN, which no comparison would catch and which would make every cost NaN.
        if not all(0 <= price < math.inf for price in (self.input_usd_per_mtok, self.output_usd_per_mtok)):
            raise ValueError(f"prices must be >= 0 and finite, got {self}")

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_usd_per_mtok + completion_tokens * self.output_usd_per_mtok) / 1e6


# Published list prices (standard tier, prompts under 200k tokens) of the API models of the paper's pool.
# Self-hosted open models have no per-token price; worlds give them one explicitly (zero unless told otherwise).
PRICES: Mapping[str, Price] = {
    "gpt-5": Price(1.25, 10.0),
    "claude-sonnet-4-20250514": Price(3.0, 15.0),
    "gemini-2.5-pro": Price(1.25, 10.0),
}

FREE = Price(0.0, 0.0)


def listed_price(model: str, price: Price | None) -> Price:
    """`price` if given, else the model's entry in `PRICES` (a clear error for an unlisted model)."""
    if price is not None:
        return price
    if model not in PRICES:
        raise ValueError(f"no price for {model!r} in PRICES; pass price=")
    return PRICES[model]


@dataclasses.dataclass(frozen=True)
class RetryConfig:
    """Per-attempt timeout, exponential backoff with jitter, and the per-worker concurrency limit.

    The delay before retry n (n = 1, 2, ...) is `min(max_backoff_s, initial_backoff_s * 2**(n-1))` scaled by a
    uniform factor in [1 - jitter, 1]; a server's Retry-After replaces it (capped at `max_backoff_s`).
    """

    timeout_s: float = 120.0
    max_attempts: int = 5
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    jitter: float = 0.5
    max_concurrency: int = 16

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError(
                f"need 0 <= initial_backoff_s <= max_backoff_s, got {self.initial_backoff_s}, {self.max_backoff_s}"
            )
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")

    def backoff_s(self, retry: int, rng: random.Random, retry_after_s: float | None = None) -> float:
        if retry_after_s is not None:
            return min(max(retry_after_s, 0.0), self.max_backoff_s)
        delay = min(self.max_backoff_s, self.initial_backoff_s * 2 ** (retry - 1))
        return delay * (1.0 - self.jitter * rng.random())


@dataclasses.dataclass(frozen=True)
class Failure:
    """A failed attempt as the retry loop sees it: whether to try again, and a short key-free reason."""

    retryable: bool
    reason: str
    retry_after_s: float | None = None


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """The Retry-After header in seconds (the delta-seconds form; the HTTP-date form is treated as absent)."""
    if not headers:
        return None
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def classify_common(error: BaseException) -> Failure | None:
    """Failures that look the same for every SDK: our own attempt timeout and undecodable response bodies."""
    if isinstance(error, TimeoutError):
        return Failure(True, "timeout")
    if isinstance(error, json.JSONDecodeError):
        return Failure(True, "malformed JSON response")
    return None


def status_failure(status: int, headers: Mapping[str, str] | None) -> Failure:
    """429 and 5xx are worth retrying (honouring Retry-After); any other status is the request's fault."""
    retryable = status == 429 or status >= 500
    return Failure(retryable, f"HTTP {status}", retry_after_seconds(headers) if retryable else None)


class ApiWorker(abc.ABC):
    """A worker behind a provider SDK. Subclasses implement `_make_client`, `_request` and `_classify`.

    The API key is read from `api_key_env` at call time, so a pool is constructible without keys and a call
    without one fails as a recorded step. The key lives only inside the SDK client; it is never stored on the
    worker, never part of its repr, and scrubbed from every error message this class produces.
    """

    backend: ClassVar[str]

    def __init__(
        self,
        *,
        name: str,
        model: str,
        price: Price,
        api_key_env: str | None,
        base_url: str | None = None,
        retry: RetryConfig = RetryConfig(),
    ) -> None:
        self.name = name
        self.model = model
        self.price = price
        self.api_key_env = api_key_env
        self.base_url = base_url
        self.retry = retry
        self._backoff_rng = random.Random()
        # SDK async clients and semaphores belong to one event loop; the sync and async APIs of the env may
        # drive the same worker from different loops, so each loop gets its own. The client is rebuilt when the
        # key in the environment changes, detected by the key's digest (the key itself is not kept here).
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[bytes, Any, asyncio.Semaphore]] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, model={self.model!r}, base_url={self.base_url!r})"

    def _settings(self) -> str:
        """Backend settings that change the model's answers (reasoning effort, thinking); "" if none."""
        return ""

    @property
    def cache_model(self) -> str:
        """The model as the response cache must tell it apart: the name plus answer-changing settings."""
        settings = self._settings()
        return f"{self.model} [{settings}]" if settings else self.model

    @abc.abstractmethod
    def _make_client(self, api_key: str) -> Any:
        """The SDK's async client with its own retries off and `self.retry.timeout_s` as its timeout."""

    @abc.abstractmethod
    async def _request(
        self, client: Any, messages: Sequence[Message], *, max_tokens: int, temperature: float, seed: int | None
    ) -> tuple[str, int, int]:
        """One attempt: (text, prompt_tokens, completion_tokens including any reasoning tokens)."""

    @abc.abstractmethod
    def _classify(self, error: Exception) -> Failure | None:
        """How to treat an exception from `_request`; None means it is a bug and must propagate."""

    async def _close_client(self, client: Any) -> None:
        await client.close()

    async def aclose(self) -> None:
        """Close the SDK client of the running event loop (each loop gets its own; see `_client_and_limit`)."""
        state = self._per_loop.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await self._close_client(state[1])

    def _api_key(self) -> str:
        if self.api_key_env is None:
            return "EMPTY"  # OpenAI-compatible servers without auth; the SDK insists on a non-empty string
        key = os.environ.get(self.api_key_env)
        if not key:
            raise WorkerError(f"{self.name}: environment variable {self.api_key_env} is not set")
        return key

    def _client_and_limit(self, api_key: str) -> tuple[Any, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        state = self._per_loop.get(loop)
        key_digest = hashlib.sha256(api_key.encode()).digest()
        if state is None or state[0] != key_digest:
            semaphore = state[2] if state is not None else asyncio.Semaphore(self.retry.max_concurrency)
            state = (key_digest, self._make_client(api_key), semaphore)
            self._per_loop[loop] = state
        return state[1], state[2]

    def _scrub(self, text: str, api_key: str) -> str:
        return text.replace(api_key, "[redacted]") if api_key and api_key != "EMPTY" else text

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        task: "Task | None" = None,
    ) -> WorkerReply:
        del task  # a real model answers from the messages alone
        api_key = self._api_key()
        client, limit = self._client_and_limit(api_key)
        async with limit:
            start = time.perf_counter()
            for attempt in itertools.count(1):
                try:
                    async with asyncio.timeout(self.retry.timeout_s):
                        text, prompt_tokens, completion_tokens = await self._request(
                            client, messages, max_tokens=max_tokens, temperature=temperature, seed=seed
                        )
                except Exception as error:  # noqa: BLE001 - classified below; unknown kinds re-raise
                    failure = self._classify(error)
                    if failure is None:
                        raise
                    reason = self._scrub(failure.reason, api_key)
                    if not failure.retryable or attempt == self.retry.max_attempts:
                        raise WorkerError(f"{self.name}: {reason} after {attempt} attempt(s)") from None
                    delay = self.retry.backoff_s(attempt, self._backoff_rng, failure.retry_after_s)
                    logger.warning("%s: attempt %d failed (%s); retrying in %.3fs", self.name, attempt, reason, delay)
                    await asyncio.sleep(delay)
                    continue
                return WorkerReply(
                    text=text,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    cost_usd=self.price.cost(prompt_tokens, completion_tokens),
                    latency_s=time.perf_counter() - start,
                )

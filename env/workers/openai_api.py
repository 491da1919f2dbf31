"""OpenAI (GPT-5 with `reasoning_effort`) and any OpenAI-compatible server (SGLang, vLLM) through the `openai` SDK."""

from __future__ import annotations

from typing import Any, Sequence

import openai

from env.workers.api import FREE, ApiWorker, Failure, Price, RetryConfig, classify_common, listed_price, status_failure
from env.workers.base import Message

REASONING_EFFORTS = ("minimal", "low", "medium", "high")


class MalformedResponse(ValueError):
    """The server answered 200 with a body that is not a chat completion."""


def classify_openai_error(error: Exception) -> Failure | None:
    common = classify_common(error)
    if common is not None:
        return common
    if isinstance(error, openai.APIStatusError):
        return status_failure(error.status_code, error.response.headers)
    if isinstance(error, openai.APITimeoutError):
        return Failure(True, "timeout")
    if isinstance(error, openai.APIConnectionError):
        return Failure(True, "connection error")
    if isinstance(error, (openai.APIResponseValidationError, MalformedResponse)):
        return Failure(True, "malformed response")
    return None


def parse_chat_completion(response: Any) -> tuple[str, int, int]:
    """(text, prompt_tokens, completion_tokens) of a chat completion; usage includes reasoning tokens."""
    if not isinstance(response, openai.types.chat.ChatCompletion) or not response.choices:
        raise MalformedResponse("not a chat completion")
    usage = response.usage
    prompt_tokens = usage.prompt_tokens if usage is not None else 0
    completion_tokens = usage.completion_tokens if usage is not None else 0
    return response.choices[0].message.content or "", prompt_tokens, completion_tokens


class _OpenAIClientWorker(ApiWorker):
    """What every worker reached through the official `openai` SDK shares: its client (SDK retries off, so ours
    are the ones that run) and its error classification."""

    def _make_client(self, api_key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(api_key=api_key, base_url=self.base_url, max_retries=0, timeout=self.retry.timeout_s)

    def _classify(self, error: Exception) -> Failure | None:
        return classify_openai_error(error)


class OpenAIWorker(_OpenAIClientWorker):
    """The OpenAI API. Reasoning models (GPT-5) take `reasoning_effort` and only their default temperature,
    so the temperature is sent only when no reasoning effort is set."""

    backend = "openai"

    def __init__(
        self,
        *,
        name: str,
        model: str,
        price: Price | None = None,
        reasoning_effort: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        base_url: str | None = None,
        retry: RetryConfig = RetryConfig(),
    ) -> None:
        if reasoning_effort is not None and reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(f"reasoning_effort must be one of {REASONING_EFFORTS}, got {reasoning_effort!r}")
        super().__init__(name=name, model=model, price=listed_price(model, price), api_key_env=api_key_env, base_url=base_url, retry=retry)
        self.reasoning_effort = reasoning_effort

    def _settings(self) -> str:
        return f"reasoning_effort={self.reasoning_effort}" if self.reasoning_effort is not None else ""

    async def _request(
        self, client: Any, messages: Sequence[Message], *, max_tokens: int, temperature: float, seed: int | None
    ) -> tuple[str, int, int]:
        kwargs: dict[str, Any] = {"model": self.model, "messages": list(messages), "max_completion_tokens": max_tokens}
        if seed is not None:
            kwargs["seed"] = seed
        if self.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.reasoning_effort
        else:
            kwargs["temperature"] = temperature
        return parse_chat_completion(await client.chat.completions.create(**kwargs))


class OpenAICompatibleWorker(_OpenAIClientWorker):
    """An OpenAI-compatible server (SGLang, vLLM) at `base_url`, e.g. serving Qwen3, Gemma 3 or R1 distills.

    `enable_thinking` toggles Qwen3's thinking through the chat template (`chat_template_kwargs`); None leaves
    the template's default. `api_key_env=None` is for servers that need no key.
    """

    backend = "openai_compatible"

    def __init__(
        self,
        *,
        name: str,
        model: str,
        base_url: str,
        price: Price = FREE,
        enable_thinking: bool | None = None,
        api_key_env: str | None = None,
        retry: RetryConfig = RetryConfig(),
    ) -> None:
        if not base_url:
            raise ValueError("an OpenAI-compatible worker needs a base_url")
        super().__init__(name=name, model=model, price=price, api_key_env=api_key_env, base_url=base_url, retry=retry)
        self.enable_thinking = enable_thinking

    def _settings(self) -> str:
        return f"enable_thinking={self.enable_thinking}" if self.enable_thinking is not None else ""

    async def _request(
        self, client: Any, messages: Sequence[Message], *, max_tokens: int, temperature: float, seed: int | None
    ) -> tuple[str, int, int]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        if seed is not None:
            kwargs["seed"] = seed
        if self.enable_thinking is not None:
            kwargs["extra_body"] = {"chat_template_kwargs": {"enable_thinking": self.enable_thinking}}
        return parse_chat_completion(await client.chat.completions.create(**kwargs))

"""Anthropic (Claude) through the `anthropic` SDK, with an optional extended-thinking budget."""

from __future__ import annotations

from typing import Any, Sequence

import anthropic

from env.workers.api import ApiWorker, Failure, Price, RetryConfig, classify_common, listed_price, status_failure
from env.workers.base import Message

MIN_THINKING_BUDGET = 1024  # the API's smallest extended-thinking budget


class AnthropicWorker(ApiWorker):
    """Claude via the Messages API. System messages become the `system` field.

    With `thinking_budget` set, extended thinking is on and `max_tokens` sent is the answer budget plus the
    thinking budget (the API counts thinking inside `max_tokens`); the API then fixes temperature at 1. Without
    it, the temperature is sent in the request body (this SDK version no longer types the field).
    """

    backend = "anthropic"

    def __init__(
        self,
        *,
        name: str,
        model: str,
        price: Price | None = None,
        thinking_budget: int | None = None,
        api_key_env: str = "ANTHROPIC_API_KEY",
        base_url: str | None = None,
        retry: RetryConfig = RetryConfig(),
    ) -> None:
        if thinking_budget is not None and thinking_budget < MIN_THINKING_BUDGET:
            raise ValueError(f"thinking_budget must be >= {MIN_THINKING_BUDGET} tokens, got {thinking_budget}")
        super().__init__(name=name, model=model, price=listed_price(model, price), api_key_env=api_key_env, base_url=base_url, retry=retry)
        self.thinking_budget = thinking_budget

    def _settings(self) -> str:
        return f"thinking_budget={self.thinking_budget}" if self.thinking_budget is not None else ""

    def _make_client(self, api_key: str) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            api_key=api_key, base_url=self.base_url, max_retries=0, timeout=self.retry.timeout_s
        )

    def _classify(self, error: Exception) -> Failure | None:
        common = classify_common(error)
        if common is not None:
            return common
        if isinstance(error, anthropic.APIStatusError):
            return status_failure(error.status_code, error.response.headers)
        if isinstance(error, anthropic.APITimeoutError):
            return Failure(True, "timeout")
        if isinstance(error, anthropic.APIConnectionError):
            return Failure(True, "connection error")
        if isinstance(error, anthropic.APIResponseValidationError):
            return Failure(True, "malformed response")
        return None

    async def _request(
        self, client: Any, messages: Sequence[Message], *, max_tokens: int, temperature: float, seed: int | None
    ) -> tuple[str, int, int]:
        del seed  # the Messages API has no seed
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        turns = [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "system"]
        kwargs: dict[str, Any] = {"model": self.model, "messages": turns, "max_tokens": max_tokens}
        if system:
            kwargs["system"] = system
        if self.thinking_budget is not None:
            kwargs["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
            kwargs["max_tokens"] = max_tokens + self.thinking_budget
        else:
            kwargs["extra_body"] = {"temperature": temperature}
        response = await client.messages.create(**kwargs)
        text = "".join(block.text for block in response.content if block.type == "text")
        return text, response.usage.input_tokens, response.usage.output_tokens

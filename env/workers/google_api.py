"""Google Gemini through the `google-genai` SDK, with a thinking budget."""

from __future__ import annotations

from typing import Any, Sequence

import httpx
import httpx2
import pydantic
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from env.workers.api import ApiWorker, Failure, Price, RetryConfig, classify_common, listed_price, status_failure
from env.workers.base import Message


class GoogleWorker(ApiWorker):
    """Gemini via `generateContent`. System messages become `system_instruction`; assistant turns are "model".

    `thinking_budget` is passed as-is (0 turns thinking off where the model allows; Gemini 2.5 Pro's minimum is
    128). Thought tokens are billed as output and counted as completion tokens.
    """

    backend = "google"

    def __init__(
        self,
        *,
        name: str,
        model: str,
        price: Price | None = None,
        thinking_budget: int | None = None,
        api_key_env: str = "GEMINI_API_KEY",
        base_url: str | None = None,
        retry: RetryConfig = RetryConfig(),
    ) -> None:
        if thinking_budget is not None and thinking_budget < 0:
            raise ValueError(f"thinking_budget must be >= 0, got {thinking_budget}")
        super().__init__(name=name, model=model, price=listed_price(model, price), api_key_env=api_key_env, base_url=base_url, retry=retry)
        self.thinking_budget = thinking_budget

    def _settings(self) -> str:
        return f"thinking_budget={self.thinking_budget}" if self.thinking_budget is not None else ""

    def _make_client(self, api_key: str) -> genai.Client:
        options = types.HttpOptions(
            base_url=self.base_url,
            api_version="v1beta",  # the public Gemini API path; the SDK's default changes when options are given
            timeout=int(self.retry.timeout_s * 1000),  # milliseconds
            retry_options=types.HttpRetryOptions(attempts=1),
        )
        return genai.Client(api_key=api_key, http_options=options)

    async def _close_client(self, client: Any) -> None:
        await client.aio.aclose()

    def _classify(self, error: Exception) -> Failure | None:
        common = classify_common(error)
        if common is not None:
            return common
        if isinstance(error, genai_errors.APIError):
            response = getattr(error, "response", None)
            return status_failure(error.code, getattr(response, "headers", None))
        if isinstance(error, (httpx.TimeoutException, httpx2.TimeoutException)):
            return Failure(True, "timeout")
        if isinstance(error, (httpx.TransportError, httpx2.TransportError)):
            return Failure(True, "connection error")
        if isinstance(error, pydantic.ValidationError):
            return Failure(True, "malformed response")
        return None

    async def _request(
        self, client: Any, messages: Sequence[Message], *, max_tokens: int, temperature: float, seed: int | None
    ) -> tuple[str, int, int]:
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        contents = [
            types.Content(role="model" if m["role"] == "assistant" else "user", parts=[types.Part(text=m["content"])])
            for m in messages
            if m["role"] != "system"
        ]
        config = types.GenerateContentConfig(
            system_instruction=system or None,
            max_output_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            thinking_config=(
                types.ThinkingConfig(thinking_budget=self.thinking_budget) if self.thinking_budget is not None else None
            ),
        )
        response = await client.aio.models.generate_content(model=self.model, contents=contents, config=config)
        usage = response.usage_metadata
        if usage is None:
            return response.text or "", 0, 0
        completion_tokens = (usage.candidates_token_count or 0) + (usage.thoughts_token_count or 0)
        return response.text or "", usage.prompt_token_count or 0, completion_tokens

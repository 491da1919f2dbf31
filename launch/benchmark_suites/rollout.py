"""`--suite=rollout`: TorchGenerator against plain `model.generate` on SmolLM2-135M-Instruct, side by side.

Both sample 32 sequences (8 chat prompts x 4) of exactly 128 new tokens at temperature 1 from the same model
object; the EOS stop is switched off for both so neither finishes early and the work is identical. The generator
also returns every token's log-prob; `model.generate` returns only ids. Runs alternate (generator, generate, ...)
so load from other processes hits both alike; the figure is the median. Each engine is warmed up on a short
run first; every timed run is logged as it finishes.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys

import torch
import transformers

from launch.benchmark_suites.common import Report, timed
from models.tokenizer import load_tokenizer, render_chat
from models.zoo import smollm2_135m_instruct
from rollout.torch_generator import TorchGenerator
from rollout.types import SamplingParams

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "What is 17 times 23?",
    "Name three prime numbers larger than 50.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
    "Summarise the plot of Hamlet.",
)
SAMPLES_PER_PROMPT = 4
NEW_TOKENS = 128
REPEATS = 3
WARMUP_TOKENS = 4


def run() -> Report:
    model_dir = smollm2_135m_instruct()
    tokenizer = load_tokenizer(model_dir)
    prompts = [render_chat(tokenizer, [{"role": "user", "content": question}]) for question in QUESTIONS]
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    generator = TorchGenerator(model)
    params = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=0)

    rows = [prompt for prompt in prompts for _ in range(SAMPLES_PER_PROMPT)]
    width = max(len(row) for row in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows])
    attention_mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])

    def with_generator(new_tokens: int = NEW_TOKENS) -> None:
        groups = generator.generate(prompts, dataclasses.replace(params, max_new_tokens=new_tokens), n=SAMPLES_PER_PROMPT)
        assert all(len(c.completion_ids) == new_tokens for group in groups for c in group)

    def with_model_generate(new_tokens: int = NEW_TOKENS) -> None:
        with torch.inference_mode():
            out = model.generate(
                input_ids, attention_mask=attention_mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=new_tokens, pad_token_id=pad,
            )
        assert out.shape == (len(rows), width + new_tokens)

    with_generator(WARMUP_TOKENS)
    with_model_generate(WARMUP_TOKENS)
    ours, theirs = [], []
    for repeat in range(REPEATS):
        ours += timed(with_generator, repeats=1, warmup=0)
        theirs += timed(with_model_generate, repeats=1, warmup=0)
        print(f"run {repeat}: TorchGenerator {ours[-1]:.1f}s, model.generate {theirs[-1]:.1f}s", file=sys.stderr)
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    tokens = len(rows) * NEW_TOKENS
    speedup = theirs_s / ours_s
    return Report(
        suite="rollout",
        columns=("engine", "median_s", "tokens_per_s", "returns_logprobs"),
        rows=[
            ("TorchGenerator", ours_s, tokens / ours_s, "yes"),
            ("model.generate", theirs_s, tokens / theirs_s, "no"),
        ],
        figures={
            "model": "SmolLM2-135M-Instruct",
            "sequences": len(rows),
            "new_tokens": NEW_TOKENS,
            "torch_generator_s": ours_s,
            "model_generate_s": theirs_s,
            "torch_generator_tokens_per_s": tokens / ours_s,
            "speedup_vs_model_generate": speedup,
            "goal_speedup": 1.0,
            "goal_met": speedup >= 1.0,
            "torch_threads": torch.get_num_threads(),
        },
        notes=[f"TorchGenerator / model.generate speed: {speedup:.2f}x (goal >= 1.0x, with log-probs)"],
    )

"""Forward throughput of SmolLM2-135M-Instruct: Flax NNX under jit vs transformers/torch eager, same run.

Batch 8 x 256 tokens, float32, logits included on both sides. Goal: Flax >= 1.2x torch tokens/s.
"""

from __future__ import annotations

import statistics
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

from launch.benchmark_suites.common import Report, timed
from models import hf_io, zoo

BATCH, LENGTH, REPEATS = 8, 256, 3
GOAL_RATIO = 1.2


def benchmark_tokens() -> np.ndarray:
    """The suite's input: BATCH x LENGTH token ids, the same on every run."""
    return np.random.default_rng(0).integers(0, 49152, size=(BATCH, LENGTH), dtype=np.int32)


def flax_forward_call(model_dir: str, tokens: np.ndarray) -> Callable[[], None]:
    """The Flax side of the suite: one jitted forward with logits over `tokens`, blocking until done."""
    graphdef, params = nnx.split(hf_io.load(model_dir))

    @jax.jit
    def flax_forward(params, tokens):
        decoder = nnx.merge(graphdef, params)
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
        return decoder.logits(decoder(tokens, positions, jnp.ones(tokens.shape, jnp.bool_)))

    jax_tokens = jnp.asarray(tokens)
    return lambda: flax_forward(params, jax_tokens).block_until_ready()


def torch_forward_call(model_dir: str, tokens: np.ndarray) -> Callable[[], None]:
    """The torch side of the suite: one eager forward with logits over `tokens`, in inference mode."""
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch_tokens = torch.as_tensor(tokens, dtype=torch.long)

    def run_torch():
        with torch.inference_mode():
            torch_model(input_ids=torch_tokens).logits

    return run_torch


def run() -> Report:
    model_dir = zoo.smollm2_135m_instruct()
    tokens = benchmark_tokens()
    n_tokens = BATCH * LENGTH
    flax_name, torch_name = "flax nnx (jax.jit)", "transformers (torch eager)"
    engines = {flax_name: flax_forward_call(model_dir, tokens), torch_name: torch_forward_call(model_dir, tokens)}

    # Alternate the engines so that all see the same background load on a shared machine.
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for repeat in range(REPEATS):
        for name, call in engines.items():
            seconds[name] += timed(call, repeats=1, warmup=1 if repeat == 0 else 0)

    tokens_per_s = {name: n_tokens / statistics.median(times) for name, times in seconds.items()}
    flax_tps, torch_tps = tokens_per_s[flax_name], tokens_per_s[torch_name]
    ratio = flax_tps / torch_tps
    rows = [[name, statistics.median(times), min(times), tokens_per_s[name]] for name, times in seconds.items()]
    return Report(
        suite="forward",
        columns=["engine", "median_s", "min_s", "tokens_per_s"],
        rows=rows,
        figures={
            "model": "SmolLM2-135M-Instruct",
            "batch": BATCH,
            "seq_len": LENGTH,
            "dtype": "float32",
            "flax_tokens_per_s": round(flax_tps, 1),
            "torch_tokens_per_s": round(torch_tps, 1),
            "flax_over_torch": round(ratio, 3),
            "goal_flax_over_torch": GOAL_RATIO,
            "goal_met": ratio >= GOAL_RATIO,
            "torch_threads": torch.get_num_threads(),
        },
        notes=[f"batch {BATCH} x {LENGTH} tokens, fp32, median of {REPEATS} interleaved runs after 1 warm-up each; "
               f"flax/torch = {ratio:.3f} (goal >= {GOAL_RATIO})"],
    )

"""The memory suite (`launch/benchmark_suites/memory.py`): what it compiles takes exactly the learner's state as
arguments, placed as the learner places it, and its extrapolation over layers is a straight line."""

from __future__ import annotations

import pytest

from launch.benchmark_suites import memory
from tests.tiny_models import tiny_config

TINY = tiny_config("qwen2", tie_word_embeddings=False)
BATCH = dict(questions=2, group_size=4, micro_batch=4, prompt_tokens=8, completion_tokens=8)
HIDDEN, INTERMEDIATE, Q, KV = 64, 128, 64, 32  # tiny_config: 4 heads and 2 key/value heads of 16


def _layer_params(lora_rank: int = 0) -> tuple[int, int]:
    """(matrix parameters, norm and bias parameters) of one tiny qwen2 layer, or of its adapters with a rank."""
    attention = [(HIDDEN, Q), (HIDDEN, KV), (HIDDEN, KV), (Q, HIDDEN)]
    shapes = attention + [(HIDDEN, INTERMEDIATE)] * 2 + [(INTERMEDIATE, HIDDEN)]
    if lora_rank:
        return sum(lora_rank * (fan_in + fan_out) for fan_in, fan_out in shapes), 0
    return sum(fan_in * fan_out for fan_in, fan_out in shapes), 2 * HIDDEN + Q + 2 * KV


def _one_layer_more(layout: memory.Layout) -> int:
    """The bytes of arguments per device a second layer adds to the compiled step."""
    at = {layers: memory.analyse(layout, layers, hf_config=TINY, batch=BATCH) for layers in (1, 2)}
    return at[2]["arguments"] - at[1]["arguments"]


def test_a_layer_adds_its_sharded_frozen_weights_and_its_adapters_with_their_adamw_moments():
    added = _one_layer_more(memory.Layout("lora", fsdp=2, remat=True, lora_rank=4))
    matrices, vectors = _layer_params()
    adapters, _ = _layer_params(lora_rank=4)
    # The float32 base: matrices split over the 2 devices, norms and biases replicated (`models.sharding`: biases
    # follow the tp axis alone). The adapters, replicated, each with AdamW's two moments: 3 float32 copies.
    assert added == 4 * (matrices // 2 + vectors) + 3 * 4 * adapters


def test_extrapolation_reads_each_figure_off_its_line_and_the_peak_counts_unaliased_outputs():
    at = {2: {"arguments": 10.0, "temporaries": 5.0, "outputs": 10.0, "aliased": 10.0},
          4: {"arguments": 14.0, "temporaries": 6.0, "outputs": 14.0, "aliased": 13.0}}
    estimate = memory.extrapolate(at, 28)
    assert estimate == {"arguments": 62.0, "temporaries": 18.0, "outputs": 62.0, "aliased": 49.0}
    assert memory.peak_bytes(estimate) == 62.0 + 18.0 + (62.0 - 49.0)
    with pytest.raises(ValueError):
        memory.extrapolate({2: at[2]}, 28)

"""What the supervised trainer's tests share, rl's own (tests/rl/test_supervised.py) and the Conductor's task probe
on top of it (tests/conductor/test_supervised.py): a tiny random Llama-family model, a constant-rate optimizer, and
numpy's log-softmax in float64 as the reference the trainer's losses are checked against."""

from __future__ import annotations

import numpy as np
from flax import nnx

from models.config import ModelConfig
from models.transformer import Transformer
from rl.learner import OptimizerConfig
from tests.tiny_models import tiny_config

CONFIG = ModelConfig.from_hf(tiny_config("llama"))
OPTIMIZER = OptimizerConfig(learning_rate=3e-3, schedule="constant", total_steps=1)


def tiny_model(seed: int = 0) -> Transformer:
    return Transformer(CONFIG, rngs=nnx.Rngs(seed))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))

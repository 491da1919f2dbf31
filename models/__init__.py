"""Flax NNX decoder models (Llama, Qwen2, Qwen3), HF checkpoint I/O, tokenizer and chat template, sharding."""

from models.config import ModelConfig
from models.transformer import Transformer

__all__ = ["ModelConfig", "Transformer"]

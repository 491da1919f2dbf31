"""Shared inputs for the models tests: tiny random HF checkpoints and a left-padded, mixed-length batch."""

from __future__ import annotations

import numpy as np
import pytest

from tests import tiny_models


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """`tiny_model_dir(family, **overrides)`: a cached random HF checkpoint of that tiny config."""
    built = {}

    def build(family: str, **overrides):
        key = (family, tuple(sorted(overrides.items())))
        if key not in built:
            path = tmp_path_factory.mktemp(f"tiny_{family}")
            built[key] = tiny_models.tiny_hf_model_dir(path, family, **overrides)
        return built[key]

    return build


def padded_batch(lengths, total, vocab_size, seed=0):
    """Left-padded rows of random tokens: (tokens, positions, attention_mask), int32/int32/bool numpy arrays.

    Padding slots hold token 0 and position 0; real tokens count positions from 0.
    """
    rng = np.random.default_rng(seed)
    tokens = np.zeros((len(lengths), total), np.int32)
    mask = np.zeros((len(lengths), total), bool)
    for row, length in enumerate(lengths):
        tokens[row, total - length:] = rng.integers(3, vocab_size, length)
        mask[row, total - length:] = True
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return tokens, positions, mask

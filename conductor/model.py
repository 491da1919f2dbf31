"""The Conductor a launcher starts from (`ConductorSpec`, `load_conductor`) and the sampling record it writes beside
a trained one (`save_trained_sampling`, `trained_sampling`)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Literal, get_args

import jax.numpy as jnp
from flax import nnx

from models import hf_io, zoo
from models.config import ModelConfig
from models.tokenizer import load_tokenizer
from models.transformer import Transformer
from rollout.types import SamplingParams

Dtype = Literal["float32", "bfloat16"]
TINY = "tiny"
SMOLLM2 = "smollm2-135m-instruct"


@dataclasses.dataclass(frozen=True)
class ConductorSpec:
    """Which Conductor to load: `name` is 'smollm2-135m-instruct' (the model zoo's), 'tiny' (a small random
    Llama-family model of `tiny_layers` x `tiny_width` with SmolLM2's tokenizer, initialised from `seed`) or a
    Hugging Face model directory; the learner computes in `dtype` and keeps parameters in `param_dtype`."""

    name: str = TINY
    tiny_layers: int = 2
    tiny_width: int = 128
    dtype: Dtype = "float32"
    param_dtype: Dtype = "float32"
    remat: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("the Conductor needs a name: 'tiny', 'smollm2-135m-instruct' or an HF directory")
        if self.tiny_layers < 1 or self.tiny_width < 1:
            raise ValueError(f"need tiny_layers >= 1 and tiny_width >= 1, got {self.tiny_layers}, {self.tiny_width}")
        for field, value in (("dtype", self.dtype), ("param_dtype", self.param_dtype)):
            if value not in get_args(Dtype):
                raise ValueError(f"{field} must be one of {get_args(Dtype)}, got {value!r}")


def tiny_conductor_config(vocab_size: int, layers: int, width: int) -> dict[str, Any]:
    """An HF config.json dict of a small Llama-family model (SmolLM2's shape, scaled down)."""
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab_size,
        "hidden_size": width,
        "intermediate_size": 3 * width,
        "num_hidden_layers": layers,
        "num_attention_heads": max(width // 32, 1),
        "num_key_value_heads": max(width // 64, 1),
        "head_dim": 32,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def load_conductor(spec: ConductorSpec, out_dir: pathlib.Path) -> tuple[Transformer, Any, pathlib.Path]:
    """(Flax model, tokenizer, HF directory the generator loads). A 'tiny' Conductor is initialised from the seed and
    written to `out_dir` (with SmolLM2's tokenizer) so the generator starts from the same weights."""
    dtype, param_dtype = jnp.dtype(spec.dtype), jnp.dtype(spec.param_dtype)
    if spec.name == TINY:
        tokenizer_dir = zoo.smollm2_135m_instruct_tokenizer()  # the weights are not read
        tokenizer = load_tokenizer(tokenizer_dir)
        hf_config = tiny_conductor_config(len(tokenizer), spec.tiny_layers, spec.tiny_width)
        config = ModelConfig.from_hf(hf_config, dtype=dtype, param_dtype=param_dtype, remat=spec.remat)
        model = Transformer(config, rngs=nnx.Rngs(spec.seed))
        model_dir = hf_io.save(model, out_dir)
        tokenizer.save_pretrained(model_dir)
        return model, tokenizer, model_dir
    model_dir = zoo.smollm2_135m_instruct() if spec.name == SMOLLM2 else pathlib.Path(spec.name)
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"--conductor={spec.name}: no config.json in {model_dir}")
    model = hf_io.load(model_dir, dtype=dtype, param_dtype=param_dtype, remat=spec.remat)
    return model, load_tokenizer(model_dir), model_dir


# Written beside a trained Conductor's weights: the completion limit and temperature it was trained with, and the
# prompt (`env.prompts.ConductorPrompt`) it read.
TRAINED_SAMPLING_FILE = "trained_sampling.json"


def save_trained_sampling(model_dir: pathlib.Path, params: SamplingParams, conductor_prompt: str) -> None:
    record = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "conductor_prompt": conductor_prompt,
    }
    (model_dir / TRAINED_SAMPLING_FILE).write_text(json.dumps(record) + "\n")


def trained_sampling(model_dir: pathlib.Path) -> dict[str, Any] | None:
    """The record `save_trained_sampling` wrote beside the Conductor in `model_dir`; None for one never trained."""
    path = model_dir / TRAINED_SAMPLING_FILE
    return json.loads(path.read_text()) if path.exists() else None

"""`ModelConfig`: the shape and numerics of a Llama / Qwen2 / Qwen3 decoder, read from and written to HF config.json."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

FAMILIES = ("llama", "qwen2", "qwen3")
ATTENTION_IMPLEMENTATIONS = ("auto", "einsum", "cudnn")

_SUPPORTED_ROPE_TYPES = (None, "default")
_SUPPORTED_ACTIVATIONS = ("silu",)


def _as_dtype(value: Any, field_name: str) -> np.dtype:
    try:
        dtype = jnp.dtype(value)
    except TypeError as error:
        raise ValueError(f"{field_name} must name a float dtype (float32, bfloat16, ...), got {value!r}") from error
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{field_name} must be a floating dtype, got {dtype}")
    return dtype


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only transformer in the Llama family.

    `attention_bias` adds biases to the q/k/v projections (Qwen2); `qk_norm` applies a per-head RMSNorm to
    queries and keys before RoPE (Qwen3). `param_dtype` is the storage dtype of the weights, `dtype` the dtype
    matmuls run in; norms, RoPE and softmax always run in float32. `remat` rematerialises each layer in the
    backward pass, trading compute for activation memory. `attention_implementation` is "einsum" (scores as
    explicit matmuls and a float32 softmax; every backend), "cudnn" (cuDNN's fused attention, NVIDIA GPUs only; calls
    with a prefix cache take the einsum path) or "auto" (cuDNN where it applies: a CUDA backend, a 16-bit compute
    dtype and a head_dim cuDNN takes; else einsum). Every matmul is XLA's dot: the model compiles and loads no kernel
    of its own (docs/decisions/031-mkl-matmul-on-intel-cpus.md says why).
    """

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 2048
    param_dtype: Any = "float32"
    dtype: Any = "float32"
    remat: bool = False
    attention_implementation: str = "auto"

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads}) for GQA"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        # Each HF family fixes these; allowing other combinations would build models no checkpoint can hold.
        if self.qk_norm != (self.family == "qwen3"):
            raise ValueError(f"qk_norm must be {self.family == 'qwen3'} for family {self.family!r}")
        if self.family == "qwen2" and not self.attention_bias:
            raise ValueError("qwen2 always has q/k/v biases; attention_bias must be True")
        if self.attention_implementation not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"attention_implementation must be one of {ATTENTION_IMPLEMENTATIONS}, "
                f"got {self.attention_implementation!r}"
            )
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        object.__setattr__(self, "param_dtype", _as_dtype(self.param_dtype, "param_dtype"))
        object.__setattr__(self, "dtype", _as_dtype(self.dtype, "dtype"))

    @property
    def num_query_groups(self) -> int:
        """How many query heads share one key/value head."""
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf(cls, dir_or_dict: str | os.PathLike | Mapping[str, Any], **overrides: Any) -> ModelConfig:
        """Reads a HF `config.json` (a model directory, the file itself, or its parsed dict).

        `overrides` set fields that HF configs don't carry (dtypes, remat) or replace ones they do.
        """
        hf = _read_hf_dict(dir_or_dict)
        family = hf.get("model_type")
        if family not in FAMILIES:
            raise ValueError(f"unsupported model_type {family!r}; supported: {FAMILIES}")
        activation = hf.get("hidden_act", "silu")
        if activation not in _SUPPORTED_ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {activation!r}; the MLP is SwiGLU (silu)")
        if hf.get("mlp_bias"):
            raise ValueError("mlp_bias=True is not supported (no Llama/Qwen checkpoint we target uses it)")
        if hf.get("use_sliding_window"):
            raise ValueError("sliding-window attention is not supported; set use_sliding_window=false")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type"))
        if rope_type not in _SUPPORTED_ROPE_TYPES:
            raise ValueError(f"unsupported RoPE scaling {rope_type!r}; only plain RoPE is implemented")
        rope_theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))

        num_heads = hf["num_attention_heads"]
        fields: dict[str, Any] = dict(
            family=family,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            rope_theta=float(rope_theta),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases (its config has no switch); Llama and Qwen3 read `attention_bias`.
            attention_bias=True if family == "qwen2" else bool(hf.get("attention_bias", False)),
            qk_norm=family == "qwen3",
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
        )
        fields.update(overrides)
        return cls(**fields)

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json dict that `transformers.AutoConfig` reads back into the same architecture."""
        architectures = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
        hf: dict[str, Any] = {
            "architectures": [architectures[self.family]],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": str(self.param_dtype),
        }
        if self.family == "llama":
            hf["attention_bias"] = self.attention_bias
            hf["mlp_bias"] = False
        elif self.family == "qwen2":
            hf["use_sliding_window"] = False
        else:
            hf["attention_bias"] = self.attention_bias
            hf["use_sliding_window"] = False
        return hf


def _read_hf_dict(dir_or_dict: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(dir_or_dict, Mapping):
        return dict(dir_or_dict)
    path = pathlib.Path(dir_or_dict)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no HF config.json at {path}")
    return json.loads(path.read_text())

"""Tiny random Hugging Face checkpoints of each supported family, for every package's tests."""

from __future__ import annotations

import pathlib
from typing import Any

from models.config import FAMILIES

_TINY_BASE: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

# Defaults mirror the real checkpoints of each family: SmolLM2 (llama) and Qwen3-0.6B tie the LM head to the
# embeddings, Qwen2.5-7B does not.
_FAMILY_FIELDS: dict[str, dict[str, Any]] = {
    "llama": {"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": True, "attention_bias": False,
              "mlp_bias": False},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "tie_word_embeddings": False, "use_sliding_window": False},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "tie_word_embeddings": True, "attention_bias": False,
              "use_sliding_window": False},
}


def tiny_config(family: str, **overrides: Any) -> dict[str, Any]:
    """An HF config.json dict of a two-layer GQA model of `family` (vocab 256, hidden 64)."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    config = {"model_type": family, **_TINY_BASE, **_FAMILY_FIELDS[family], "torch_dtype": "float32"}
    config.update(overrides)
    return config


def tiny_hf_model_dir(path: str | pathlib.Path, family: str, seed: int = 0, **overrides: Any) -> pathlib.Path:
    """Builds a random `transformers` model of `family`, saves it (config.json + safetensors) to `path`.

    Every parameter is redrawn at a scale where it matters (norm weights around 1, non-zero biases, matrices at
    1/sqrt(fan_in)), so a wrong name, transpose or missing bias in a loader shows up in the logits.
    """
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**tiny_config(family, **overrides))
    generator = torch.Generator().manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                param.copy_(0.2 * noise)
            elif "embed_tokens" in name:
                param.copy_(noise)
            else:
                param.copy_(noise * param.shape[1] ** -0.5)
    out_dir = pathlib.Path(path)
    model.save_pretrained(out_dir)
    return out_dir

"""`ModelConfig`: reading HF config.json of each family, writing it back, and rejecting what it can't build."""

from __future__ import annotations

import json

import jax.numpy as jnp
import pytest
import transformers

from models import ModelConfig
from tests import tiny_models


def test_reads_a_qwen2_config_in_the_older_top_level_rope_theta_format():
    # The shape of Qwen2.5-7B-Instruct's config.json.
    hf = {"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
          "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "rope_theta": 1000000.0,
          "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 32768,
          "hidden_act": "silu", "rope_scaling": None, "use_sliding_window": False}
    config = ModelConfig.from_hf(hf)
    assert (config.head_dim, config.num_query_groups, config.rope_theta) == (128, 7, 1e6)
    assert config.attention_bias and not config.qk_norm and not config.tie_word_embeddings


@pytest.mark.parametrize("family,bias,qk_norm", [("llama", False, False), ("qwen2", True, False),
                                                   ("qwen3", False, True)])
def test_reads_the_transformers_serialised_config_of_each_family(tmp_path, family, bias, qk_norm):
    hf_config = transformers.AutoConfig.for_model(**tiny_models.tiny_config(family, rope_theta=5000.0))
    hf_config.save_pretrained(tmp_path)
    config = ModelConfig.from_hf(tmp_path, dtype="bfloat16", remat=True)
    assert (config.family, config.attention_bias, config.qk_norm) == (family, bias, qk_norm)
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (2, 4, 2, 16)
    assert config.rope_theta == 5000.0
    assert config.dtype == jnp.bfloat16 and config.param_dtype == jnp.float32 and config.remat


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_to_hf_dict_round_trips_through_transformers(tmp_path, family):
    config = ModelConfig.from_hf(tiny_models.tiny_config(family, tie_word_embeddings=False, rope_theta=123.0))
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf_dict()))
    reread = transformers.AutoConfig.from_pretrained(tmp_path)
    assert reread.model_type == family
    assert ModelConfig.from_hf(reread.to_dict()) == config


@pytest.mark.parametrize("changes,message", [
    ({"family": "gpt2"}, "family"),
    ({"num_kv_heads": 3}, "multiple of num_kv_heads"),
    ({"head_dim": 15}, "even"),
    ({"qk_norm": True}, "qk_norm"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"dtype": "int32"}, "floating"),
    ({"param_dtype": "not-a-dtype"}, "param_dtype"),
])
def test_rejects_inconsistent_fields(changes, message):
    fields = dict(family="llama", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=4,
                  num_kv_heads=2, head_dim=4)
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{**fields, **changes})


@pytest.mark.parametrize("override,message", [
    ({"model_type": "mistral"}, "model_type"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "RoPE scaling"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"use_sliding_window": True}, "sliding-window"),
])
def test_from_hf_rejects_architectures_it_would_compute_wrongly(override, message):
    hf = tiny_models.tiny_config("qwen2")
    hf.pop("rope_parameters", None)
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf({**hf, **override})


def test_from_hf_reports_a_missing_config_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig.from_hf(tmp_path)

"""The Conductor's flags: which model, its size when 'tiny', and the learner's dtypes."""

from __future__ import annotations

from typing import get_args

from absl import flags

from conductor.model import ConductorSpec, Dtype
from launch.flag_groups import field_values, shared

_FIELDS = {
    "name": flags.DEFINE_string(
        "conductor", "tiny",
        "The Conductor: 'smollm2-135m-instruct' (the model zoo's SmolLM2-135M-Instruct), 'tiny' (a small random "
        "Llama-family model with SmolLM2's tokenizer, for fast CPU experiments), or a Hugging Face model directory.",
    ),
    "tiny_layers": flags.DEFINE_integer("tiny_layers", 2, "Decoder layers of the 'tiny' Conductor."),
    "tiny_width": flags.DEFINE_integer("tiny_width", 128, "Hidden size of the 'tiny' Conductor."),
    "dtype": flags.DEFINE_enum("dtype", "float32", get_args(Dtype), "Learner compute dtype."),
    "param_dtype": flags.DEFINE_enum("param_dtype", "float32", get_args(Dtype), "Learner parameter dtype."),
    "remat": flags.DEFINE_boolean("remat", False, "Rematerialise each decoder layer in the backward pass."),
}


def from_flags() -> ConductorSpec:
    return ConductorSpec(**field_values(_FIELDS), seed=shared.SEED.value)

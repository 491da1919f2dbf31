"""Hugging Face checkpoints in and out of the NNX `Transformer`.

`param_map` is the one table of (HF name, NNX attribute path, transpose) that loading, saving and learner ->
generator weight sync all go through.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from models import sharding
from models.config import ModelConfig
from models.lora import merged
from models.transformer import Transformer

_SAFETENSORS_FILE = "model.safetensors"
_SAFETENSORS_INDEX = "model.safetensors.index.json"


@dataclasses.dataclass(frozen=True)
class ParamEntry:
    """One parameter: its HF name, where it lives in the NNX model, and whether HF stores it transposed."""

    hf_name: str
    path: tuple[str | int, ...]
    transpose: bool


def param_map(config: ModelConfig) -> list[ParamEntry]:
    """Every parameter of a `Transformer(config)`, in HF checkpoint order."""
    entries = [ParamEntry("model.embed_tokens.weight", ("embed_tokens", "embedding"), False)]
    for index in range(config.num_layers):
        hf = f"model.layers.{index}."
        layer: tuple[str | int, ...] = ("layers", index)
        entries.append(ParamEntry(hf + "input_layernorm.weight", layer + ("input_layernorm", "weight"), False))
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            entries.append(ParamEntry(f"{hf}self_attn.{proj}.weight", layer + ("self_attn", proj, "kernel"), True))
            if config.attention_bias and proj != "o_proj":
                entries.append(ParamEntry(f"{hf}self_attn.{proj}.bias", layer + ("self_attn", proj, "bias"), False))
        if config.qk_norm:
            for norm in ("q_norm", "k_norm"):
                entries.append(ParamEntry(f"{hf}self_attn.{norm}.weight", layer + ("self_attn", norm, "weight"),
                                          False))
        entries.append(ParamEntry(hf + "post_attention_layernorm.weight",
                                  layer + ("post_attention_layernorm", "weight"), False))
        for proj in ("gate_proj", "up_proj", "down_proj"):
            entries.append(ParamEntry(f"{hf}mlp.{proj}.weight", layer + ("mlp", proj, "kernel"), True))
    entries.append(ParamEntry("model.norm.weight", ("norm", "weight"), False))
    if not config.tie_word_embeddings:
        entries.append(ParamEntry("lm_head.weight", ("lm_head", "kernel"), True))
    return entries


def variable_at(model: Transformer, path: tuple[str | int, ...]) -> nnx.Variable:
    """The `nnx.Param` at a `ParamEntry.path` (read with `[...]`, write with `set_value`)."""
    node: Any = model
    for key in path:
        node = node[key] if isinstance(key, int) else getattr(node, key)
    return node


def to_hf_tensors(model: Transformer) -> dict[str, jax.Array]:
    """The model's parameters under their HF names and in HF layout (`[out, in]` matrices).

    Tied models emit no `lm_head.weight`. Arrays keep their dtype and sharding; nothing is copied to the host. A
    model with LoRA adapters gives its merged weights (`models.lora.merged`).
    """
    model = merged(model)
    tensors = {}
    for entry in param_map(model.config):
        value = variable_at(model, entry.path)[...]
        tensors[entry.hf_name] = value.T if entry.transpose else value
    return tensors


def from_hf_tensors(model: Transformer, tensors: Mapping[str, Any]) -> None:
    """Assigns HF-named, HF-layout tensors into `model` in place (the inverse of `to_hf_tensors`).

    Values are cast to the parameter dtype and placed like the parameters they replace. Every parameter must be
    given; an unknown name is an error, except `lm_head.weight` of a tied model (HF state dicts list it as an
    alias of the embeddings).
    """
    entries = param_map(model.config)
    expected = {entry.hf_name for entry in entries}
    ignorable = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    missing = sorted(expected - set(tensors))
    unknown = sorted(set(tensors) - expected - ignorable)
    if missing or unknown:
        raise KeyError(f"tensors do not match the model: missing {missing[:5]}, unknown {unknown[:5]}")
    # Check every tensor before assigning any, so a bad one leaves the model untouched.
    updates = []
    for entry in entries:
        variable = variable_at(model, entry.path)
        current = variable[...]
        value = tensors[entry.hf_name]
        # Host arrays stay on the host until device_put sends each device only its own shard.
        value = value if isinstance(value, jax.Array) else np.asarray(value)
        if entry.transpose:
            value = value.T
        if value.shape != current.shape:
            raise ValueError(
                f"{entry.hf_name}: expected shape {current.shape} (after layout change), got {value.shape}")
        updates.append((variable, value.astype(current.dtype), current.sharding))
    for variable, value, placement in updates:
        variable.set_value(jax.device_put(value, placement))


class _SafetensorsDir:
    """Lazy, by-name access to the tensors of a HF directory (one file, or shards listed in the index)."""

    def __init__(self, model_dir: pathlib.Path):
        index_path = model_dir / _SAFETENSORS_INDEX
        if index_path.is_file():
            weight_map = json.loads(index_path.read_text())["weight_map"]
            self._file_of = {name: model_dir / file for name, file in weight_map.items()}
        elif (model_dir / _SAFETENSORS_FILE).is_file():
            from safetensors import safe_open

            single = model_dir / _SAFETENSORS_FILE
            with safe_open(single, framework="pt") as handle:
                self._file_of = {name: single for name in handle.keys()}
        else:
            raise FileNotFoundError(f"no {_SAFETENSORS_FILE} or {_SAFETENSORS_INDEX} in {model_dir}")
        self._handles: dict[pathlib.Path, Any] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The `index` block of tensor `name` as numpy (bfloat16 via ml_dtypes), reading only that block."""
        import torch

        block = self._slice(name)[index]
        if block.dtype == torch.bfloat16:
            return block.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return block.numpy()

    def _slice(self, name: str) -> Any:
        from safetensors import safe_open

        file = self._file_of[name]
        if file not in self._handles:
            self._handles[file] = safe_open(file, framework="pt")
        return self._handles[file].get_slice(name)


def load(
    model_dir: str | pathlib.Path,
    *,
    dtype: Any = jnp.float32,
    param_dtype: Any = jnp.float32,
    mesh: Mesh | None = None,
    remat: bool = False,
) -> Transformer:
    """Builds a `Transformer` from a HF directory (config.json + model.safetensors or a sharded index).

    With a `mesh`, each parameter is created directly with its `models.sharding` partition: every device reads
    only its own block of the tensor from disk, so no host ever holds a whole sharded matrix on one device.
    """
    model_dir = pathlib.Path(model_dir)
    config = ModelConfig.from_hf(model_dir, dtype=dtype, param_dtype=param_dtype, remat=remat)
    model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    checkpoint = _SafetensorsDir(model_dir)
    for entry in param_map(config):
        if entry.hf_name not in checkpoint:
            raise KeyError(f"{model_dir} has no tensor {entry.hf_name!r}")
        variable = variable_at(model, entry.path)
        shape = variable.get_value().shape
        hf_shape = checkpoint.shape(entry.hf_name)
        if (hf_shape[::-1] if entry.transpose else hf_shape) != shape:
            raise ValueError(f"{entry.hf_name}: checkpoint shape {hf_shape} does not fit parameter shape {shape}")
        if mesh is None:
            # This process's own first device: in a multi-process run jax.devices()[0] is process 0's.
            placement = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        else:
            placement = NamedSharding(mesh, sharding.partition_spec(entry.path, shape, mesh))
        variable.set_value(jax.make_array_from_callback(
            shape, placement, _block_reader(checkpoint, entry, config.param_dtype)))
    return model


def _block_reader(checkpoint: _SafetensorsDir, entry: ParamEntry, param_dtype: jnp.dtype):
    def read_block(index: tuple[slice, ...]) -> np.ndarray:
        if entry.transpose:
            return checkpoint.read(entry.hf_name, index[::-1]).T.astype(param_dtype)
        return checkpoint.read(entry.hf_name, index).astype(param_dtype)

    return read_block


def save(model: Transformer, out_dir: str | pathlib.Path) -> pathlib.Path:
    """Writes config.json + model.safetensors that `transformers.AutoModelForCausalLM.from_pretrained` loads."""
    import torch
    from safetensors.torch import save_file

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, value in to_hf_tensors(model).items():
        host = np.array(jax.device_get(value))  # a writable host copy, as torch.from_numpy wants
        if host.dtype == ml_dtypes.bfloat16:
            tensors[name] = torch.from_numpy(host.view(np.int16)).view(torch.bfloat16)
        else:
            tensors[name] = torch.from_numpy(host)
    save_file(tensors, out_dir / _SAFETENSORS_FILE, metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2) + "\n")
    return out_dir


"""Learner -> generator weight sync: the NNX model's parameters as HF-named tensors, handed to a generator.

Names, transposes and tied embeddings come from `models.hf_io.param_map`, the one parameter map. Transports:
- in-process: `sync(model, torch_generator, version)`: jax -> torch through DLPack (zero-copy when the array sits
  on one device torch can address; a sharded array is gathered to the host once), then one in-place copy into
  the live parameters;
- disk: `save_checkpoint(model, out_dir)` writes a safetensors checkpoint that appears atomically
  (`rollout.transport.write_checkpoint`), for generators in other processes or on other hosts;
- SGLang: `sync(model, sglang_generator, version)`, which sends through the generator's configured path
  (`/update_weights_from_disk`, or flattened NCCL buckets broadcast from this process), in the servers' dtype.

In a multi-process run (`jax.distributed`, one process per host) each process syncs its own generators, from a whole
copy of every parameter: its own replica of a replicated one (a norm), else one it gathers from all processes' shards
(`process_allgather`; the learner's fsdp/tp split puts most of every matrix elsewhere). The in-process generator
holds whole weights, and SGLang's update endpoints take whole tensors too (a server's tensor-parallel split is its
own, unrelated to the learner's mesh). The gather is a collective, so every process syncs at the same point of the
loop, which `rl.loop` does.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax
import ml_dtypes
import numpy as np
import torch
from jax.experimental import multihost_utils

from models.hf_io import param_map, variable_at
from models.lora import merged
from models.transformer import Transformer
from rollout.transport import write_checkpoint
from rollout.types import Generator


def jax_to_torch(array: jax.Array) -> torch.Tensor:
    """A torch tensor with the array's values: a DLPack view when the array lives on one device, else a host copy
    (gathered from every process when the array spans several: a collective)."""
    if len(array.sharding.device_set) == 1:
        return torch.from_dlpack(array)
    # Gathering makes a new host buffer anyway; jax hands it out read-only, torch wants it writable.
    if array.is_fully_addressable:
        host = np.array(jax.device_get(array))
    elif array.is_fully_replicated:
        host = np.array(array.addressable_data(0))
    else:
        host = np.array(multihost_utils.process_allgather(array, tiled=True))
    if host.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(host.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(host)


def hf_torch_tensors(model: Transformer, *, dtype: Any = None) -> dict[str, torch.Tensor]:
    """The model's parameters under HF names and in HF shapes, as torch tensors, optionally cast (bfloat16 for a
    bf16 server halves the bytes moved).

    Same names, transposes and tied-embedding rule as `models.hf_io.to_hf_tensors` (both read `param_map`), but
    a transposed matrix comes back as a transposed torch *view* of the NNX buffer instead of a transposed copy:
    the one copy happens where the tensor lands (an in-place `copy_`, a file, a bucket). A model with LoRA adapters
    sends its merged weights (`models.lora.merged`), so every transport carries them.
    """
    model = merged(model)
    tensors = {}
    for entry in param_map(model.config):
        value = variable_at(model, entry.path)[...]
        if dtype is not None:
            value = value.astype(dtype)
        tensor = jax_to_torch(value)
        tensors[entry.hf_name] = tensor.T if entry.transpose else tensor
    return tensors


def sync(model: Transformer, generator: Generator, version: int, *, dtype: Any = None) -> None:
    """Pushes the model's current parameters into `generator`, tagged with policy `version`.

    Without `dtype`, a generator that names a `weight_dtype` (an SGLangGenerator: its servers' dtype) gets its
    tensors cast to it here, on the learner's device, so only the cast bytes are copied out of JAX.
    """
    if dtype is None:
        dtype = getattr(generator, "weight_dtype", None)
    generator.update_weights(hf_torch_tensors(model, dtype=dtype), version)


def save_checkpoint(
    model: Transformer, out_dir: str | os.PathLike, *, config_dir: str | os.PathLike | None = None, dtype: Any = None
) -> pathlib.Path:
    """Writes the model's parameters to `out_dir` (new) so that a reader sees the whole checkpoint or nothing."""
    return write_checkpoint(hf_torch_tensors(model, dtype=dtype), out_dir, config_dir=config_dir)

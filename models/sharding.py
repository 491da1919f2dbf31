"""Device mesh with `fsdp` and `tp` axes, and the partition rule of every `Transformer` parameter.

Matrices are split along `tp` Megatron-style (column-parallel q/k/v, gate/up and LM head; row-parallel o/down;
vocab-parallel embeddings) and along `fsdp` on their other axis. Vectors (norms, biases) are small and stay
replicated except biases of column-parallel layers, which follow their columns. An axis that does not divide
evenly falls back to replication, so the same rules run on 1 CPU, 8 fake CPU devices, GPUs and TPUs.
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES = ("fsdp", "tp")

# Last path name of a parameter's module -> the mesh axis of each of its dimensions.
_MATRIX_RULES: dict[tuple[str, str], tuple[str, str]] = {
    ("embed_tokens", "embedding"): ("tp", "fsdp"),
    ("q_proj", "kernel"): ("fsdp", "tp"),
    ("k_proj", "kernel"): ("fsdp", "tp"),
    ("v_proj", "kernel"): ("fsdp", "tp"),
    ("o_proj", "kernel"): ("tp", "fsdp"),
    ("gate_proj", "kernel"): ("fsdp", "tp"),
    ("up_proj", "kernel"): ("fsdp", "tp"),
    ("down_proj", "kernel"): ("tp", "fsdp"),
    ("lm_head", "kernel"): ("fsdp", "tp"),
}
_COLUMN_BIASES = {"q_proj", "k_proj", "v_proj"}


def make_mesh(fsdp: int = 1, tp: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `(fsdp, tp)` mesh over the first `fsdp * tp` of `devices` (default: all devices)."""
    if fsdp < 1 or tp < 1:
        raise ValueError(f"fsdp and tp must be >= 1, got fsdp={fsdp}, tp={tp}")
    devices = list(jax.devices() if devices is None else devices)
    if fsdp * tp > len(devices):
        raise ValueError(f"a {fsdp}x{tp} mesh needs {fsdp * tp} devices, only {len(devices)} available")
    return Mesh(np.asarray(devices[: fsdp * tp]).reshape(fsdp, tp), AXES)


def partition_spec(path: Sequence[str | int], shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """The partition of the parameter at NNX attribute `path` (e.g. `("layers", 0, "mlp", "up_proj", "kernel")`)."""
    names = [key for key in path if isinstance(key, str)]
    module, leaf = names[-2] if len(names) > 1 else "", names[-1]
    if (module, leaf) in _MATRIX_RULES:
        axes: tuple[str | None, ...] = _MATRIX_RULES[(module, leaf)]
    elif leaf == "bias" and module in _COLUMN_BIASES:
        axes = ("tp",)
    else:
        axes = (None,) * len(shape)
    if len(axes) != len(shape):
        raise ValueError(f"parameter {'.'.join(map(str, path))} has shape {tuple(shape)}, expected rank {len(axes)}")
    return PartitionSpec(*(
        axis if axis is not None and size % mesh.shape[axis] == 0 else None for axis, size in zip(axes, shape)
    ))


def shard_model(model: nnx.Module, mesh: Mesh) -> None:
    """Moves every parameter of `model` onto `mesh` by the partition rules, in place."""
    for path, variable in nnx.iter_graph(model):
        if isinstance(variable, nnx.Param):
            value = variable[...]
            spec = partition_spec(path, value.shape, mesh)
            variable.set_value(jax.device_put(value, NamedSharding(mesh, spec)))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of `[batch, ...]` inputs: rows split over `fsdp` (data parallel), replicated over `tp`."""
    return NamedSharding(mesh, PartitionSpec("fsdp"))


def mesh_of(tree) -> Mesh | None:
    """The mesh of the first leaf of `tree` that lies on one; None if none does."""
    return next((s.mesh for s in shardings_of(tree) or () if s is not None), None)


def replicate_off_mesh(tree, mesh: Mesh):
    """`tree` with every leaf that is not on a mesh (an optimizer's step count, a head's parameters) replicated over
    `mesh`: state a step returns on the mesh then comes in on it, so the step's second call runs the first's program."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(
        lambda leaf: leaf if isinstance(leaf.sharding, NamedSharding) else jax.device_put(leaf, replicated), tree
    )


def shardings_of(tree) -> tuple[NamedSharding | None, ...] | None:
    """The mesh sharding of each leaf of `tree` (arrays, or `jax.ShapeDtypeStruct`s with shardings; None for a leaf
    on no mesh), as `keep_shardings` takes them (a hashable static argument of jit); None when no leaf is on a mesh."""
    shardings = tuple(
        leaf.sharding if isinstance(getattr(leaf, "sharding", None), NamedSharding) else None
        for leaf in jax.tree.leaves(tree)
    )
    return shardings if any(s is not None for s in shardings) else None


def keep_shardings(tree, shardings: tuple[NamedSharding | None, ...] | None):
    """`tree`, traced inside jit, constrained leaf by leaf to `shardings` (`shardings_of`'s; None: left alone).

    A jitted step otherwise returns its new state wherever XLA's sharding propagation puts it, which need not be where
    the state came in: after one optimizer step a norm's weight came out split over `fsdp`, where the rules above
    replicate it. The next step then compiled again for the new layout, and a run resumed from a checkpoint (restored
    to the rules' layout) ran other programs than the run it resumed."""
    if shardings is None:
        return tree
    leaves, structure = jax.tree.flatten(tree)
    if len(leaves) != len(shardings):
        raise ValueError(f"{len(leaves)} leaves but {len(shardings)} shardings")
    return structure.unflatten([
        leaf if sharding is None else jax.lax.with_sharding_constraint(leaf, sharding)
        for leaf, sharding in zip(leaves, shardings)
    ])

"""Moving HF-named torch tensors between processes: atomic safetensors checkpoints and flattened NCCL buckets.

Nothing here knows about Flax; `rollout.weight_sync` turns the learner's model into HF-named tensors and picks a
transport. The bucket layout is SGLang's `FlattenedTensorBucket` (each tensor's bytes, in order, no padding), so
a server rebuilding a bucket from the request's names / dtypes / shapes finds every tensor where we put it. The
receiver refuses a tensor that starts at a byte offset its element size does not divide
(`FlattenedTensorBucket.empty`), so a bucket holds its tensors largest element size first.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
import shutil
import tempfile
from typing import Any, Iterable, Mapping, Sequence

import safetensors.torch
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

CHECKPOINT_WEIGHTS_FILE = "model.safetensors"
# Files a server needs next to the weights to load a directory as a model (copied from the served model's dir).
CONFIG_FILES = ("config.json", "generation_config.json")


def as_torch(value: Any) -> torch.Tensor:
    """A torch view of a tensor from any framework that speaks DLPack (jax, numpy); torch tensors pass through.

    DLPack shares memory where the producer allows it, so this is zero-copy on a shared device.
    """
    return value if isinstance(value, torch.Tensor) else torch.from_dlpack(value)


def write_checkpoint(
    tensors: Mapping[str, torch.Tensor], out_dir: str | os.PathLike, *, config_dir: str | os.PathLike | None = None
) -> pathlib.Path:
    """Writes an HF checkpoint directory that appears whole or not at all.

    Everything is written into a hidden temporary sibling, flushed, then renamed onto `out_dir` (a rename within
    one filesystem is atomic), so a reader, or a crash midway, never sees half a checkpoint. `out_dir` must not
    exist yet: every policy version gets its own directory.
    """
    out_dir = pathlib.Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"checkpoint directory {out_dir} already exists; use a new directory per version")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        weights_path = staging / CHECKPOINT_WEIGHTS_FILE
        contiguous = {name: tensor.detach().contiguous().cpu() for name, tensor in tensors.items()}
        safetensors.torch.save_file(contiguous, os.fspath(weights_path), metadata={"format": "pt"})
        if config_dir is not None:
            for name in CONFIG_FILES:
                source = pathlib.Path(config_dir) / name
                if source.exists():
                    shutil.copyfile(source, staging / name)
        for path in staging.iterdir():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        os.rename(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def read_checkpoint(checkpoint_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(os.fspath(pathlib.Path(checkpoint_dir) / CHECKPOINT_WEIGHTS_FILE))


@dataclasses.dataclass(frozen=True)
class BucketEntry:
    """Where one tensor lives inside a flattened bucket (byte offsets into the uint8 buffer)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def plan_buckets(tensors: Mapping[str, torch.Tensor], bucket_bytes: int) -> list[list[str]]:
    """Groups tensor names, in order, into buckets of at most `bucket_bytes` (a bigger tensor travels alone)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[list[str]] = []
    current: list[str] = []
    current_bytes = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if current and current_bytes + size > bucket_bytes:
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(name)
        current_bytes += size
    if current:
        buckets.append(current)
    return buckets


def bucket_layout(named_specs: Iterable[tuple[str, torch.dtype, Sequence[int]]]) -> list[BucketEntry]:
    """Byte ranges of each tensor in a flattened bucket, as the receiver derives them from the request; a tensor
    whose offset is not a multiple of its element size is refused, as SGLang refuses it."""
    entries, offset = [], 0
    for name, dtype, shape in named_specs:
        element_size = dtype.itemsize
        if offset % element_size:
            raise ValueError(f"{name} ({dtype}) would start at byte {offset}, not a multiple of its element size "
                             f"{element_size}; put larger elements first")
        size = torch.Size(shape).numel() * element_size
        entries.append(BucketEntry(name=name, dtype=dtype, shape=tuple(int(d) for d in shape), start=offset, end=offset + size))
        offset += size
    return entries


def flatten_bucket(named_tensors: Sequence[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, list[BucketEntry]]:
    """One uint8 buffer holding every tensor's bytes back to back, largest element size first (element sizes are
    powers of two, so every tensor then starts aligned), and the layout to take them apart again."""
    if not named_tensors:
        raise ValueError("cannot flatten an empty bucket")
    ordered = sorted(named_tensors, key=lambda named: -named[1].element_size())
    layout = bucket_layout((name, tensor.dtype, tuple(tensor.shape)) for name, tensor in ordered)
    flat = torch.cat([tensor.contiguous().reshape(-1).view(torch.uint8) for _, tensor in ordered])
    return flat, layout


def unflatten_bucket(flat: torch.Tensor, layout: Sequence[BucketEntry]) -> dict[str, torch.Tensor]:
    """Each tensor inside a flattened bucket, as a view of it."""
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise ValueError(f"a flattened bucket is a 1-D uint8 tensor, got {flat.dtype} with shape {tuple(flat.shape)}")
    if layout and layout[-1].end != flat.numel():
        raise ValueError(f"bucket holds {flat.numel()} bytes but its layout describes {layout[-1].end}")
    return {entry.name: flat[entry.start : entry.end].view(entry.dtype).view(entry.shape) for entry in layout}


def dtype_name(dtype: torch.dtype) -> str:
    """The spelling SGLang parses with `getattr(torch, name)`: 'bfloat16', 'float32', ..."""
    return str(dtype).removeprefix("torch.")


def bucket_request(layout: Sequence[BucketEntry]) -> dict[str, list]:
    """The names / dtypes / shapes fields of SGLang's UpdateWeightsFromDistributedReqInput for one bucket."""
    return {
        "names": [entry.name for entry in layout],
        "dtypes": [dtype_name(entry.dtype) for entry in layout],
        "shapes": [list(entry.shape) for entry in layout],
    }


def layout_from_request(request: Mapping[str, Sequence]) -> list[BucketEntry]:
    """The receiver's side of `bucket_request` (what an SGLang server computes from the same fields)."""
    return bucket_layout(
        (name, getattr(torch, dtype), shape)
        for name, dtype, shape in zip(request["names"], request["dtypes"], request["shapes"], strict=True)
    )


def rendezvous_url(master_address: str, master_port: int) -> str:
    """The `tcp://` address both sides of the weight-update group rendezvous at, an IPv6 address in brackets as
    SGLang's servers write it (`NetworkAddress.to_tcp`)."""
    host = f"[{master_address}]" if ":" in master_address else master_address
    return f"tcp://{host}:{master_port}"


def join_weight_update_group(
    *,
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout: datetime.timedelta = datetime.timedelta(minutes=10),
) -> dist.ProcessGroup:
    """Joins a process group of its own, apart from any default group, the way SGLang's servers join theirs.

    SGLang's `/init_weights_update_group` rendezvouses over `tcp://master_address:master_port` and namespaces the
    store by `group_name`; the learner (rank 0) must do exactly the same for the two sides to meet. torch has no
    public call for an extra top-level group, so this uses the same c10d helpers SGLang uses.
    """
    store, rank, world_size = next(
        distributed_c10d.rendezvous(rendezvous_url(master_address, master_port), rank, world_size, timeout=timeout)
    )
    store.set_timeout(timeout)
    group, _ = distributed_c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        distributed_c10d.Backend(backend),
        distributed_c10d.PrefixStore(group_name, store),
        group_name=group_name,
        timeout=timeout,
    )
    distributed_c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def broadcast_bucket(flat: torch.Tensor, group: dist.ProcessGroup) -> None:
    """Sends one flattened bucket from rank 0 of `group` to every other rank."""
    dist.broadcast(flat, src=0, group=group)


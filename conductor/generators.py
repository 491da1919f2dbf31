"""The generator that samples the Conductor and the weight sync that keeps it on the learner's policy."""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
from typing import Any, Callable, Literal, get_args

from models.transformer import Transformer
from rollout import weight_sync
from rollout.sglang_generator import SGLangConfig, SGLangGenerator, WEIGHT_DTYPES
from rollout.torch_generator import TorchGenerator

Engine = Literal["torch", "sglang"]
Sync = Literal["inprocess", "disk", "nccl"]
# What --sync sends SGLang servers: "auto" (their own dtype) or one of the dtypes the client converts to.
WEIGHT_DTYPE_CHOICES = ("auto", *WEIGHT_DTYPES)
JAX_ALLOCATOR_VARIABLES = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    """The rollout engine and its weight sync. `engine="torch"` samples in this process on `device` and syncs
    in-process; `engine="sglang"` samples on the servers at `sglang_urls`, synced through a checkpoint on disk
    (`sync="disk"`, under `sync_dir`, default `<logdir>/sync`) or over a torch.distributed group (`sync="nccl"`, the
    `sglang_*` settings of `rollout.sglang_generator.SGLangConfig`; `sglang_weight_dtype="auto"` sends the servers'
    own dtype and `sglang_server_tp_sizes=None` reads their sizes from the servers)."""

    engine: Engine = "torch"
    device: str = "cpu"
    sync: Sync = "inprocess"
    sglang_urls: tuple[str, ...] = ()
    sync_dir: str | None = None
    sglang_weight_dtype: str = "auto"
    sglang_server_tp_sizes: tuple[int, ...] | None = None
    sglang_master_address: str | None = None
    sglang_master_port: int = 29600
    sglang_sync_backend: str = "nccl"  # SGLangConfig.backend
    sglang_rendezvous_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.engine not in get_args(Engine) or self.sync not in get_args(Sync):
            raise ValueError(f"unknown engine {self.engine!r} or sync {self.sync!r}")
        if self.sglang_weight_dtype not in WEIGHT_DTYPE_CHOICES:
            raise ValueError(
                f"sglang_weight_dtype must be one of {WEIGHT_DTYPE_CHOICES}, got {self.sglang_weight_dtype!r}"
            )
        if self.engine == "torch" and self.sync != "inprocess":
            raise ValueError("the torch generator lives in this process: use --sync=inprocess")
        if self.engine == "sglang" and not self.sglang_urls:
            raise ValueError("--generator=sglang needs --sglang_urls")
        if self.engine == "sglang" and self.sync == "inprocess":
            raise ValueError("SGLang servers are other processes: use --sync=disk or --sync=nccl")


def share_gpu_with_torch_generator(config: GeneratorConfig) -> None:
    """With the torch generator on a GPU, JAX allocates on demand instead of reserving 75% of the GPU's memory when
    its backend starts, which would leave the generator's weights and KV cache a quarter. Takes effect only before
    JAX's first computation (the launchers call it before loading the Conductor), and never overrides the user's own
    setting of JAX's allocator."""
    on_gpu = config.engine == "torch" and config.device.startswith("cuda")
    if on_gpu and not any(name in os.environ for name in JAX_ALLOCATOR_VARIABLES):
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"


def build_generator(
    config: GeneratorConfig, model_dir: pathlib.Path, log_dir: pathlib.Path
) -> tuple[Any, Callable[[Any, int], None]]:
    """(generator, weight_sync): `weight_sync(model, version)` pushes the learner's weights into the generator."""
    if config.engine == "torch":
        generator: Any = TorchGenerator(model_dir, device=config.device)
    else:
        generator = SGLangGenerator(sglang_config(config, model_dir, log_dir))
    return generator, functools.partial(_sync_into, generator)


def sglang_config(config: GeneratorConfig, model_dir: pathlib.Path, log_dir: pathlib.Path) -> SGLangConfig:
    """The SGLang client's config for `model_dir`, its disk checkpoints under `log_dir` unless `sync_dir` is set."""
    return SGLangConfig(
        urls=config.sglang_urls,
        weight_update="disk" if config.sync == "disk" else "distributed",
        checkpoint_root=config.sync_dir or str(log_dir / "sync"),
        model_dir=str(model_dir),
        server_tp_sizes=config.sglang_server_tp_sizes,
        master_address=config.sglang_master_address,
        master_port=config.sglang_master_port,
        backend=config.sglang_sync_backend,
        rendezvous_timeout_s=config.sglang_rendezvous_timeout_s,
        weight_dtype=None if config.sglang_weight_dtype == "auto" else config.sglang_weight_dtype,
    )


def _sync_into(generator: Any, model: Transformer, version: int) -> None:
    weight_sync.sync(model, generator, version)

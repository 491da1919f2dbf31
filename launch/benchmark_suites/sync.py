"""`--suite=sync`: Flax -> torch weight sync of SmolLM2-135M-Instruct against a plain memcpy of the same bytes.

In-process sync is `rollout.weight_sync.sync(model, generator, version)`: HF-named DLPack views of the NNX
parameters copied in place into a live TorchGenerator (after the first sync, which adopts the learner's memory
layout, see `TorchGenerator.update_weights`). The baseline copies one buffer of the model's size into another in
the same run. The disk path writes an atomic safetensors checkpoint and loads it into the generator, once in the
learner's float32 and once in the dtype an SGLang server started with `--dtype auto` holds this model in (SGLang's
rule applied to its config.json, `served_dtype`), the dtype `--sync=disk` and `--sync=nccl` send. Each row names
its dtype and the bytes it moved (for the disk rows, the checkpoint file's size).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from typing import Any

import jax
import torch

from launch.benchmark_suites.common import Report, timed
from models import hf_io
from models.transformer import Transformer
from models.zoo import smollm2_135m_instruct
from rollout.sglang_generator import served_dtype
from rollout.torch_generator import TorchGenerator
from rollout.transport import CHECKPOINT_WEIGHTS_FILE, read_checkpoint
from rollout.weight_sync import save_checkpoint, sync

REPEATS = 5


def in_process_seconds(
    model: Transformer, generator: TorchGenerator, *, dtype: Any = None, repeats: int = REPEATS
) -> tuple[list[float], list[float], int]:
    """(sync seconds, memcpy seconds, bytes): `repeats` in-process syncs of `model` into `generator` (cast to `dtype`
    on the learner's device first, when given) alternating with as many copies of one buffer of the generator's
    parameter bytes into another on the generator's device, after one untimed of each (the first sync adopts the
    learner's memory layout). On a GPU each timing waits for the device to finish."""
    total_bytes = sum(p.numel() * p.element_size() for p in generator.model.parameters())
    source = torch.ones(total_bytes, dtype=torch.uint8, device=generator.device)
    target = torch.empty_like(source)
    finish = torch.cuda.synchronize if generator.device.type == "cuda" else lambda: None

    def in_process() -> None:
        sync(model, generator, generator.policy_version + 1, dtype=dtype)
        finish()

    def memcpy() -> None:
        target.copy_(source)
        finish()

    jax.block_until_ready(jax.tree.leaves(model))
    in_process()
    memcpy()
    sync_s, memcpy_s = [], []
    for _ in range(repeats):
        sync_s += timed(in_process, repeats=1, warmup=0)
        memcpy_s += timed(memcpy, repeats=1, warmup=0)
    return sync_s, memcpy_s, total_bytes


def run() -> Report:
    model_dir = smollm2_135m_instruct()
    model = hf_io.load(model_dir)
    generator = TorchGenerator(model_dir)
    sync_s, memcpy_s, total_bytes = in_process_seconds(model, generator)
    versions = iter(range(generator.policy_version + 1, 1_000_000))

    learner_dtype = str(next(generator.model.parameters()).dtype).removeprefix("torch.")
    server_dtype = served_dtype("auto", json.loads((model_dir / "config.json").read_text()))
    disk_s, disk_bytes = {}, {}
    with tempfile.TemporaryDirectory() as root:
        for dtype in dict.fromkeys((learner_dtype, server_dtype)):
            def via_disk(dtype: str = dtype) -> None:
                version = next(versions)
                checkpoint = save_checkpoint(model, f"{root}/policy-{version}", config_dir=model_dir, dtype=dtype)
                disk_bytes[dtype] = (checkpoint / CHECKPOINT_WEIGHTS_FILE).stat().st_size
                generator.update_weights(read_checkpoint(checkpoint), version)

            disk_s[dtype] = statistics.median(timed(via_disk, repeats=2, warmup=1))

    sync_median, memcpy_median = statistics.median(sync_s), statistics.median(memcpy_s)
    ratio = sync_median / memcpy_median
    gigabytes = total_bytes / 1e9
    disk_rows = [
        (f"disk (atomic safetensors write + load){', as SGLang gets it' if dtype == server_dtype else ''}", dtype,
         disk_bytes[dtype], disk_s[dtype], disk_bytes[dtype] / 1e9 / disk_s[dtype])
        for dtype in disk_s
    ]
    return Report(
        suite="sync",
        columns=("path", "dtype", "bytes", "median_s", "GB_per_s"),
        rows=[
            ("in-process sync (Flax -> TorchGenerator)", learner_dtype, total_bytes, sync_median,
             gigabytes / sync_median),
            ("memcpy of the same bytes", "uint8", total_bytes, memcpy_median, gigabytes / memcpy_median),
            *disk_rows,
        ],
        figures={
            "model": "SmolLM2-135M-Instruct",
            "bytes": total_bytes,
            "in_process_sync_s": sync_median,
            "memcpy_s": memcpy_median,
            "disk_sync_s": disk_s[learner_dtype],
            "sglang_weight_dtype": server_dtype,
            "disk_bytes": disk_bytes,
            "disk_sync_s_by_dtype": disk_s,
            "sync_over_memcpy": ratio,
            "goal_sync_over_memcpy": 2.0,
            "goal_met": ratio <= 2.0,
        },
        notes=[
            f"in-process sync / memcpy: {ratio:.2f}x (goal <= 2x)",
            f"disk sync in SGLang's {server_dtype}: {disk_bytes[server_dtype]:,} bytes, "
            f"{disk_bytes[server_dtype] / disk_bytes[learner_dtype]:.2f}x the {learner_dtype} checkpoint's",
        ],
    )

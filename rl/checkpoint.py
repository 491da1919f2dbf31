"""Checkpoints of the learner and the loop, on orbax's CheckpointManager.

One checkpoint holds the trained parameters (every weight, or the LoRA adapters alone: the base weights are the
run's starting model, which a resumed run rebuilds), the optimizer state, the frozen reference parameters (when the KL term is on),
the learner's step counters, the loop's RNG key and an opaque JSON dict of loop state (for example the data
position). Restoring into a learner built the same way and continuing gives bit-identical parameters to a run that
was never interrupted.

In a multi-process run every process saves and restores (orbax's multi-host checkpointing, coordinated through
`jax.distributed`): each writes the shards of the sharded arrays it holds into the one directory, which every
process must see (a shared file system or a bucket), and process 0 writes the rest.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from rl.learner import Learner


def _abstract(tree):
    """Shapes, dtypes and shardings of `tree`, so orbax restores into the same structure and device layout."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def _lora_fields(learner: Learner | None) -> dict[str, Any]:
    """What decides the trained parameters' structure: rank 0 (every weight) or the adapters' rank and targets."""
    lora = learner.config.lora if learner is not None else None
    if lora is None or not lora.enabled:
        return {"rank": 0}
    return {"rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets)}


class Checkpointer:
    """`save(step, learner, rng_key, loop_state)` and `restore(learner)` of the latest step; keeps the last `keep`."""

    def __init__(self, directory: str | pathlib.Path, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = pathlib.Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, learner: Learner, rng_key: jax.Array, loop_state: dict[str, Any]) -> None:
        """Writes checkpoint `step` and waits until it is on disk. `loop_state` must be JSON-serialisable."""
        typed_key = jax.dtypes.issubdtype(rng_key.dtype, jax.dtypes.prng_key)
        # A host array: orbax writes it once, from process 0, where a device array would be one process's own.
        rng_data = np.asarray(jax.random.key_data(rng_key) if typed_key else rng_key)
        meta = {
            "learner_step": learner.step,
            "optimizer_step": learner.optimizer_step,
            "rng_impl": str(jax.random.key_impl(rng_key)) if typed_key else None,
            "rng_shape": list(rng_data.shape),
            "rng_dtype": str(rng_data.dtype),
            "loop_state": loop_state,
            "lora": _lora_fields(learner),
        }
        arrays = {
            "params": learner.params,
            "opt_state": learner.opt_state,
            "rng": rng_data,
        }
        if learner.reference_params is not None:
            arrays["reference_params"] = learner.reference_params
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(arrays),
                meta=ocp.args.JsonSave(meta),
            ),
        )
        self._manager.wait_until_finished()

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, learner: Learner) -> tuple[int, jax.Array, dict[str, Any]] | None:
        """Loads the latest checkpoint into `learner`; returns (step, rng_key, loop_state), or None if there is none."""
        step = self._manager.latest_step()
        if step is None:
            return None
        meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        # Checkpoints from before LoRA existed trained every weight.
        saved_lora = meta.get("lora", _lora_fields(None))
        if saved_lora != _lora_fields(learner):
            raise ValueError(
                f"checkpoint {step} in {self.directory} trained LoRA {saved_lora}, this learner "
                f"{_lora_fields(learner)}; resume with the run's own --lora_* flags"
            )
        targets = {
            "params": learner.params,
            "opt_state": learner.opt_state,
            "rng": np.zeros(tuple(meta["rng_shape"]), np.dtype(meta["rng_dtype"])),
        }
        if learner.reference_params is not None:
            targets["reference_params"] = learner.reference_params
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(_abstract(targets)))
        )["state"]
        learner.load_state(
            params=restored["params"],
            opt_state=restored["opt_state"],
            reference_params=restored["reference_params"] if "reference_params" in targets else None,
            step=meta["learner_step"],
            optimizer_step=meta["optimizer_step"],
        )
        rng = restored["rng"]
        if meta["rng_impl"] is not None:
            rng = jax.random.wrap_key_data(rng, impl=meta["rng_impl"])
        return step, rng, meta["loop_state"]

    def close(self) -> None:
        self._manager.close()

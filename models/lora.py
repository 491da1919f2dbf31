"""LoRA on the decoder's projections: low-rank adapters trained in place of the weights they adapt.

A targeted projection `y = x W (+ b)` becomes `y = x W (+ b) + scale * (x A) B` with `A [in, rank]`, `B [rank, out]`
and `scale = alpha / rank`, the parametrisation of Hu et al. (2021) and of PEFT's `LoraConfig(r, lora_alpha)`. A
starts as PEFT's default (uniform in +-1/sqrt(in), the bound of torch's kaiming-uniform with a = sqrt(5)), B at
zero, so an adapted model starts as its base. The adapters are `nnx.LoRAParam`s (a kind of `nnx.Param`), always
float32 whatever the base's dtype: they are what the optimizer moves, and they are small.

`apply_lora` swaps each targeted `nnx.Linear` for a `LoRALinear` that holds the same kernel and bias variables at
the same attribute paths, so the HF name map, the sharding rules and checkpoints of the base weights see nothing
new. `merged` is the plain `Transformer` a generator or a Hugging Face directory receives: each adapted kernel
replaced by `W + scale * A B`. `save_peft_adapter` writes the adapters as PEFT's `adapter_config.json` and
`adapter_model.safetensors`, which `peft.PeftModel.from_pretrained` loads over the base checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.transformer import Transformer

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
# The module under a decoder layer that holds each target, as in the HF module tree.
_PARENT = {name: "self_attn" for name in ATTENTION_TARGETS} | {name: "mlp" for name in MLP_TARGETS}


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """rank: the adapters' rank (0: no adapters, every weight trains). alpha: scale = alpha / rank. targets: the
    projections adapted in every layer, by their HF module names (every attention and MLP projection by default).
    seed: draws the A matrices."""

    rank: int = 0
    alpha: float = 16.0
    targets: tuple[str, ...] = ATTENTION_TARGETS + MLP_TARGETS
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 0:
            raise ValueError(f"LoRAConfig.rank must be an int >= 0 (0: full fine-tuning), got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise ValueError(f"LoRAConfig.alpha must be a number > 0, got {self.alpha!r}")
        object.__setattr__(self, "targets", tuple(self.targets))
        unknown = [name for name in self.targets if name not in _PARENT]
        if unknown:
            raise ValueError(f"LoRAConfig.targets: unknown projection(s) {unknown}; choose from {tuple(_PARENT)}")
        if not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"LoRAConfig.targets must name each projection once, at least one, got {self.targets}")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class LoRALinear(nnx.Linear):
    """An `nnx.Linear` plus `(alpha / rank) * (x A) B`: `kernel` and `bias` are the base's own variables, not
    copies."""

    def __init__(self, base: nnx.Linear, *, rank: int, alpha: float, rngs: nnx.Rngs):
        for name, value in vars(base).items():
            if not name.startswith("_"):
                setattr(self, name, nnx.data(value) if value is None else value)
        fan_in, fan_out = base.in_features, base.out_features
        bound = fan_in**-0.5
        self.lora_a = nnx.LoRAParam(
            jax.random.uniform(rngs.params(), (fan_in, rank), jnp.float32, -bound, bound)
        )
        self.lora_b = nnx.LoRAParam(jnp.zeros((rank, fan_out), jnp.float32))
        self.alpha = alpha
        self.scale = alpha / rank

    def __call__(self, inputs: jax.Array) -> jax.Array:
        out = super().__call__(inputs)
        dtype = out.dtype
        down = inputs.astype(dtype) @ self.lora_a[...].astype(dtype)
        return out + (down @ self.lora_b[...].astype(dtype)) * jnp.asarray(self.scale, dtype)

    def merged_kernel(self) -> jax.Array:
        """`W + scale * A B` in the kernel's dtype, summed in float32."""
        kernel = self.kernel[...]
        delta = self.scale * (self.lora_a[...] @ self.lora_b[...])
        return (kernel.astype(jnp.float32) + delta).astype(kernel.dtype)


def _layer_targets(model: Transformer, targets: tuple[str, ...]):
    """(layer index, target name, parent module) of every targeted projection."""
    for index, layer in enumerate(model.layers):
        for name in targets:
            yield index, name, getattr(layer, _PARENT[name])


def apply_lora(model: Transformer, config: LoRAConfig, *, rngs: nnx.Rngs) -> None:
    """Adapts `model`'s targeted projections in place (nothing when `config.rank` is 0)."""
    if not config.enabled:
        return
    if adapted(model):
        raise ValueError("the model already carries LoRA adapters")
    for index, name, parent in _layer_targets(model, config.targets):
        base = getattr(parent, name)
        if config.rank > min(base.in_features, base.out_features):
            raise ValueError(
                f"LoRA rank {config.rank} exceeds layers.{index}.{name}'s smaller side "
                f"({base.in_features} x {base.out_features})"
            )
        setattr(parent, name, LoRALinear(base, rank=config.rank, alpha=config.alpha, rngs=rngs))


def _adapted_modules(model: Transformer) -> list[tuple[tuple[Any, ...], LoRALinear]]:
    return [(path, node) for path, node in nnx.iter_graph(model) if isinstance(node, LoRALinear)]


def adapted(model: Transformer) -> bool:
    """Whether `model` carries LoRA adapters."""
    return bool(_adapted_modules(model))


def merged(model: Transformer) -> Transformer:
    """The plain `Transformer` whose forward pass is `model`'s: each adapted kernel merged (`W + scale * A B`,
    placed as W is), every other parameter the same array. `model` itself when it carries no adapters."""
    modules = dict(_adapted_modules(model))
    if not modules:
        return model
    plain = nnx.eval_shape(lambda: Transformer(model.config, rngs=nnx.Rngs(0)))
    for path, variable in nnx.iter_graph(plain):
        if not isinstance(variable, nnx.Param):
            continue
        owner = modules.get(tuple(path[:-1]))
        if owner is not None and path[-1] == "kernel":
            variable.set_value(owner.merged_kernel())
        else:
            node: Any = model
            for key in path:
                node = node[key] if isinstance(key, int) else getattr(node, key)
            variable.set_value(node[...])
    return plain


def lora_config_of(model: Transformer) -> LoRAConfig:
    """The `LoRAConfig` `model`'s adapters were built with (rank and targets from their shapes and places)."""
    modules = _adapted_modules(model)
    if not modules:
        return LoRAConfig()
    _, first = modules[0]
    targets = tuple(name for name in _PARENT if any(path[-1] == name for path, _ in modules))
    return LoRAConfig(rank=first.lora_a.shape[1], alpha=first.alpha, targets=targets)


def peft_tensors(model: Transformer) -> dict[str, np.ndarray]:
    """The adapters under PEFT's saved names and layouts: `...q_proj.lora_A.weight` is A^T `[rank, in]`,
    `...lora_B.weight` is B^T `[out, rank]`, float32 host arrays."""
    tensors = {}
    for path, module in _adapted_modules(model):
        name = "base_model.model.model." + ".".join(str(key) for key in path)
        tensors[f"{name}.lora_A.weight"] = np.asarray(jax.device_get(module.lora_a[...])).T
        tensors[f"{name}.lora_B.weight"] = np.asarray(jax.device_get(module.lora_b[...])).T
    return tensors


def save_peft_adapter(model: Transformer, out_dir: str | pathlib.Path, *, base_model: str = "") -> pathlib.Path:
    """Writes `adapter_config.json` and `adapter_model.safetensors`, PEFT's LoRA adapter directory, for the base
    checkpoint `base_model` names (a path or hub id; recorded, not read)."""
    from safetensors.numpy import save_file

    config = lora_config_of(model)
    if not config.enabled:
        raise ValueError("the model carries no LoRA adapters to save")
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {name: np.ascontiguousarray(value) for name, value in peft_tensors(model).items()}
    save_file(tensors, out_dir / "adapter_model.safetensors", metadata={"format": "pt"})
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "target_modules": list(config.targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "init_lora_weights": True,
        "inference_mode": True,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
    return out_dir

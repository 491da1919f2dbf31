"""Memory before hardware: XLA's memory analysis of the learner update for a model shape and a mesh, on fake devices.

`python -m launch.benchmark --suite=memory` compiles, and never runs, the learner's optimizer step (`rl.learner`'s
`_train_step`: forward, backward over every micro-batch, gradient accumulation, clipping and AdamW) for the
Qwen2.5-7B shape at `launch/configs/paper.cfg`'s batch (4 questions x 64 rollouts, micro-batches of 8, bfloat16
matmuls over float32 weights and AdamW state, no KL), and reports per device what `compiled.memory_analysis()` says
the program needs: its arguments (weights, optimizer state, the batch), outputs, temporaries, and their total less the
outputs that reuse donated argument buffers. Each layout compiles in a process of its own, with
`--xla_force_host_platform_device_count` fake CPU devices for its mesh. Nothing is ever materialised: the weights and
optimizer state are `jax.ShapeDtypeStruct`s carrying their `models.sharding` placement, so a 7B update compiles on a
laptop.

Compile time grows with the layer count (the decoder's layers are unrolled), and on a shared 2-core host one 28-layer
compile took six minutes; so each layout compiles at `LAYER_COUNTS` layers and every figure is extrapolated along
its straight line to the model's layer count. The arguments and outputs are exact sums over layers plus what does
not depend on them (embeddings, LM head, the batch); that the temporaries grow by the same amount per layer is the
assumption (every layer's buffers have the same sizes), not checked here against a 28-layer compile.

The analysis is XLA:CPU's. A GPU compile fuses differently and may hold other temporaries (cuDNN attention
workspaces, NCCL buffers): the arguments are exact, the temporaries an estimate.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from typing import Any

from launch.benchmark_suites.common import Report

log = logging.getLogger(__name__)

# Qwen2.5-7B's config.json (the shape; the weights are never read).
QWEN25_7B = {
    "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 32768,
}  # fmt: skip
# paper.cfg: 4 questions x 64 rollouts in one optimizer step, micro-batches of 8, completions of <= 1,024 tokens.
# Its prompts (system message, question, pool, example workflows) are assumed to fill a 1,024-token bucket too.
PAPER_BATCH = dict(questions=4, group_size=64, micro_batch=8, prompt_tokens=1024, completion_tokens=1024)
LAYER_COUNTS = (1, 2)
# Each card's memory as nvidia-smi totals it (81,559 and 143,771 MiB); the CUDA context and XLA's allocator keep
# a GiB or two of it.
CARDS_GIB = {"H100 80GB": 79.6, "H200 141GB": 140.4}
GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Layout:
    """One compile: the mesh (fsdp devices), per-layer remat, LoRA rank (0: every weight trains) and weight dtype."""

    name: str
    fsdp: int
    remat: bool
    lora_rank: int = 0
    param_dtype: str = "float32"


LAYOUTS = (
    Layout("lora16_1dev_remat", fsdp=1, remat=True, lora_rank=16),
    Layout("full_fsdp2_remat", fsdp=2, remat=True),
    Layout("full_fsdp8_remat", fsdp=8, remat=True),
    Layout("full_fsdp2", fsdp=2, remat=False),
    Layout("full_fsdp8", fsdp=8, remat=False),
    Layout("lora16_1dev_remat_bf16_base", fsdp=1, remat=True, lora_rank=16, param_dtype="bfloat16"),
)


def _abstract_training_state(hf_config: dict[str, Any], layout: Layout, learner_config, mesh):
    """(graphdef, trainable, frozen, opt_state) of the model as `jax.ShapeDtypeStruct`s placed on `mesh` by
    `models.sharding`, as `rl.learner.Learner` places them; nothing is allocated."""
    import jax
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    from models.config import ModelConfig
    from models.lora import apply_lora
    from models.sharding import partition_spec
    from models.transformer import Transformer

    config = ModelConfig.from_hf(hf_config, dtype="bfloat16", param_dtype=layout.param_dtype, remat=layout.remat)

    def build():
        model = Transformer(config, rngs=nnx.Rngs(0))
        apply_lora(model, learner_config.lora, rngs=nnx.Rngs(0))
        return model

    model = nnx.eval_shape(build)
    graphdef, trainable, frozen = nnx.split(model, nnx.LoRAParam if layout.lora_rank else nnx.Param, ...)

    def keys(path) -> tuple[Any, ...]:
        named = (getattr(key, "key", getattr(key, "idx", getattr(key, "name", None))) for key in path)
        return tuple(key for key in named if key != "value")

    def placed(path, leaf, spec=None):
        spec = partition_spec(keys(path), leaf.shape, mesh) if spec is None else spec
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))

    trainable = jax.tree_util.tree_map_with_path(placed, trainable)
    frozen = jax.tree_util.tree_map_with_path(placed, frozen)
    # AdamW's moments follow their parameters (their paths end in the parameter's), its step count is replicated.
    specs = {keys(path): leaf.sharding.spec for path, leaf in jax.tree_util.tree_flatten_with_path(trainable)[0]}

    def follow(path, leaf):
        key = keys(path)
        spec = next((specs[key[start:]] for start in range(len(key)) if key[start:] in specs), PartitionSpec())
        return placed(path, leaf, spec)

    opt_state = jax.eval_shape(learner_config.optimizer.make().init, trainable)
    return graphdef, trainable, frozen, jax.tree_util.tree_map_with_path(follow, opt_state)


def analyse(layout: Layout, layers: int, hf_config: dict[str, Any] = QWEN25_7B,
            batch: dict[str, int] = PAPER_BATCH) -> dict[str, float]:
    """Compiles one optimizer step of `layout` for `hf_config` cut to `layers` layers, on this process's devices
    (fake CPU devices: the caller sets XLA_FLAGS); returns XLA's memory analysis per device in bytes and the
    compile's wall seconds."""
    import numpy as np
    from flax import nnx

    from models.config import ModelConfig
    from models.lora import LoRAConfig
    from models.sharding import make_mesh, shardings_of
    from rl import learner as learner_module
    from rl.learner import Learner, LearnerConfig
    from rl.trajectories import build
    from models.transformer import Transformer

    mesh = make_mesh(fsdp=layout.fsdp)
    config = LearnerConfig(micro_batch_size=batch["micro_batch"], lora=LoRAConfig(rank=layout.lora_rank))
    graphdef, trainable, frozen, opt_state = _abstract_training_state(
        {**hf_config, "num_hidden_layers": layers}, layout, config, mesh
    )
    rows = batch["questions"] * batch["group_size"]
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(3, 1000, batch["prompt_tokens"])) for _ in range(batch["questions"])]
    completions = [list(rng.integers(3, 1000, batch["completion_tokens"])) for _ in range(rows)]
    trajectories = build(
        [prompts[row // batch["group_size"]] for row in range(rows)], completions,
        [[-1.0] * batch["completion_tokens"]] * rows, rng.normal(size=rows),
        np.repeat(np.arange(batch["questions"]), batch["group_size"]), pad_id=0,
    )
    # The learner's own host-side planning of the update's first step (its mini-batch, padding, the rows the model
    # runs, the prompts shared by a group) reads only its config and mesh: a learner of a one-layer model of width
    # 64 plans it, and the 7B program takes what it placed.
    planner_shape = dict(hf_config, num_hidden_layers=1, hidden_size=64, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=4, head_dim=16, vocab_size=1024)
    planner = Learner(Transformer(ModelConfig.from_hf(planner_shape), rngs=nnx.Rngs(0)), config, mesh=mesh)
    (mini_batch, real_rows), = planner._mini_batches(trajectories)
    step = planner._step(mini_batch, real_rows, first_step=True)
    start = time.perf_counter()
    compiled = learner_module._train_step.lower(
        graphdef, trainable, frozen, opt_state, step.batch, step.model_rows, step.token_weights, None,
        np.bool_(True), np.int32(0), config=config, state_shardings=shardings_of((trainable, opt_state)),
    ).compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    return {
        "arguments": memory.argument_size_in_bytes,
        "outputs": memory.output_size_in_bytes,
        "aliased": memory.alias_size_in_bytes,
        "temporaries": memory.temp_size_in_bytes,
        "compile_s": seconds,
    }


# XLA:CPU's default scheduler orders the program for concurrency and ignores memory: it ran every layer's remat
# recomputation ahead of the backward pass, so the analysis held every layer's attention scores at once (9.2 GiB a
# layer, against 1.7 GiB with this flag; docs/log/2026-12-05-lora-and-memory.md). A GPU compile schedules for memory.
_XLA_FLAGS = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def _analyse_in_subprocess(layout: Layout, layers: int) -> dict[str, float]:
    """`analyse` in a fresh Python with one fake CPU device per mesh device."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={layout.fsdp} {_XLA_FLAGS}")
    program = (
        "import dataclasses, json, sys\n"
        "from launch.benchmark_suites import memory\n"
        "layout = memory.Layout(**json.loads(sys.argv[1]))\n"
        "print(json.dumps(memory.analyse(layout, int(sys.argv[2]))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, json.dumps(dataclasses.asdict(layout)), str(layers)],
        env=env, capture_output=True, text=True, check=False,
    )
    if done.returncode:
        raise RuntimeError(f"memory analysis of {layout.name} at {layers} layers failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def extrapolate(at: dict[int, dict[str, float]], layers: int) -> dict[str, float]:
    """Each figure's straight line through its values at two layer counts, read at `layers`."""
    if len(at) != 2:
        raise ValueError(f"a line needs figures at two layer counts, got {sorted(at)}")
    (low, low_figures), (high, high_figures) = sorted(at.items())
    return {
        name: low_figures[name] + (high_figures[name] - low_figures[name]) * (layers - low) / (high - low)
        for name in low_figures
    }


def peak_bytes(figures: dict[str, float]) -> float:
    """What the program holds at once by XLA's account: arguments, temporaries, and the outputs that do not reuse a
    donated argument's buffer."""
    return figures["arguments"] + figures["temporaries"] + figures["outputs"] - figures["aliased"]


def run(layouts: tuple[Layout, ...] = LAYOUTS, layer_counts: tuple[int, int] = LAYER_COUNTS) -> Report:
    layers = QWEN25_7B["num_hidden_layers"]
    rows, figures, compile_s = [], {}, 0.0
    for layout in layouts:
        measured = {count: _analyse_in_subprocess(layout, count) for count in layer_counts}
        compile_s += sum(m["compile_s"] for m in measured.values())
        estimate = extrapolate(measured, layers)
        peak = peak_bytes(estimate) / GIB
        log.info("%s: %s at %s layers; %.1f GiB at %d", layout.name, measured, layer_counts, peak, layers)
        figures[f"peak_gib_{layout.name}"] = round(peak, 2)
        rows.append([
            layout.name, layout.fsdp, "yes" if layout.remat else "no", layout.lora_rank or "-", layout.param_dtype,
            f"{estimate['arguments'] / GIB:.1f}", f"{estimate['outputs'] / GIB:.1f}",
            f"{estimate['temporaries'] / GIB:.1f}", f"{peak:.1f}",
            *("yes" if peak <= capacity else "no" for capacity in CARDS_GIB.values()),
        ])
    batch = PAPER_BATCH
    return Report(
        suite="memory",
        columns=["layout", "fsdp", "remat", "lora rank", "weights", "arguments GiB", "outputs GiB",
                 "temporaries GiB", "peak GiB", *(f"fits {card}" for card in CARDS_GIB)],
        rows=rows,
        figures={
            **figures,
            "peak_gib_lora_1dev": figures.get("peak_gib_lora16_1dev_remat"),
            "peak_gib_full_fsdp2": figures.get("peak_gib_full_fsdp2_remat"),
            "model": "Qwen2.5-7B shape", "batch": batch, "layer_counts": list(layer_counts),
            "compile_s": round(compile_s, 1),
        },
        notes=[
            f"per device; one optimizer step of {batch['questions']} x {batch['group_size']} rows of "
            f"{batch['prompt_tokens']} + {batch['completion_tokens']} tokens in micro-batches of "
            f"{batch['micro_batch']}, bf16 matmuls; compiled at {layer_counts[0]} and {layer_counts[1]} layers on "
            f"fake CPU devices and extrapolated to {layers}",
            "XLA:CPU's analysis: a GPU's arguments are the same, its temporaries may differ (fusion, cuDNN attention)",
        ],
    )

"""One full GRPO update of SmolLM2-135M-Instruct: the Flax Learner under jit vs the same step in plain PyTorch eager.

The step: forward over 8 sequences x 256 tokens (128 prompt, 128 completion), log-softmax at the sampled tokens,
per-token entropy (a logged metric on both sides), the clipped policy loss with the GRPO aggregation, backward,
global-norm clipping and AdamW, all float32. Goal: Flax >= 1.2x torch tokens/s. Model-FLOPs utilisation is
reported against the float32 matmul rate measured in the same run.

The goal compares the same work: 8 different prompts. A second Flax engine runs the same update in micro-batches of 2
(exact: the learner sums per-token losses over the global denominator), so each XLA call's temporary buffer is under
2 GiB, against several GB for one micro-batch of 8. 2 GiB is what `conductor.host_memory` keeps mapped between calls when
the process cannot restart with glibc tunables (when the user set a `GLIBC_TUNABLES` of their own). A third runs the
update on the batch GRPO actually produces, 2 groups of 4 completions that share their group's prompt, which the
learner encodes once per group (`LearnerConfig.share_prompts`); its tokens/s counts the full rows, since the update
it computes is the same.

In a multi-process run (`conductor/distributed.py`: one process per host), the suite times the accelerator update
over a mesh of every process's devices, each device taking the single-device figure's rows (the global batch and
micro-batch grow with the device count); process 0 prints the report.

Every engine runs in a process of its own (`time_engines`), driven update by update from this one so the engines
alternate, and none shares its heap or caches with another (until 2026-11-27 the Flax engines shared this process
while torch had its own: docs/log/2026-11-27-learner-engines-in-their-own-processes.md). Each takes `WARMUP_UPDATES`
untimed updates. The one-micro-batch update faults its buffer in afresh on each of its first two calls; with one
warm-up, and beside torch in one glibc heap, some runs kept faulting and the headline figure was bimodal
(docs/decisions/011-how-the-learner-benchmark-measures.md; the current figures: BUILD_NOTES.md, Current results).
Every engine reports its first update's gradient norm, and the report says how far they are apart: the engines time
the same computation.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import statistics
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

from jax.sharding import Mesh

from conductor import host_memory
from launch.benchmark_suites import profile
from launch.benchmark_suites.common import Report, timed
from models import hf_io, zoo
from models.config import ModelConfig
from models.sharding import make_mesh
from models.transformer import Transformer, uses_fused_attention
from rl.learner import Learner, LearnerConfig, OptimizerConfig
from rl.losses import LossConfig
from rl.trajectories import build

BATCH, PROMPT, COMPLETION, REPEATS = 8, 128, 128, 3
# Untimed updates per engine before the timed ones. The first compiles; the first two both map and fault in fresh
# heap pages for their temporary buffers, several times slower than once glibc reuses the freed blocks
# (docs/decisions/011-how-the-learner-benchmark-measures.md).
WARMUP_UPDATES = 2
GROUPS = 2
MICRO_BATCH = 2
CLIP, LEARNING_RATE, MAX_GRAD_NORM = 0.2, 1e-6, 1.0
MATMUL_SIZE = 2048
GOAL_RATIO = 1.2

# On an accelerator: a bf16 update (bf16 matmuls, float32 weights and AdamW state) of a model shaped like
# Qwen2.5-1.5B (its config.json; random weights), 8 x (512 + 512) tokens.
QWEN25_1_5B = {
    "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
    "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "head_dim": 128,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 32768,
}  # fmt: skip
# One micro-batch of all 8 rows: the update's activations then fit a 80 GB H100 beside the weights and AdamW state
# (the figures report the peak), and the matmuls see 8192 rows rather than 2048.
ACCELERATOR_SHAPE = dict(batch=8, prompt=512, completion=512, micro_batch=8)
ACCELERATOR_MATMUL_SIZE = 8192
# One matmul per call would time the launch and the host's wait with it: an 8192^3 bf16 matmul takes about a
# millisecond on a current GPU, and one per call measured well under the peak seen through torch
# (docs/decisions/011-how-the-learner-benchmark-measures.md).
ACCELERATOR_CHAINED_MATMULS = 8


def _matmul_flops_per_s(dtype=jnp.float32, size: int = MATMUL_SIZE, chained: int = 1) -> float:
    """Best-of-3 square-matmul rate of the default device under XLA, `chained` dependent matmuls per call."""
    x = jax.random.normal(jax.random.key(0), (size, size), dtype)
    # Scaled so that a chain of products keeps its values near 1 instead of overflowing.
    w = (jax.random.normal(jax.random.key(1), (size, size), jnp.float32) / size**0.5).astype(dtype)
    chain = jax.jit(lambda x, w: functools.reduce(lambda y, _: y @ w, range(chained), x))
    seconds = timed(lambda: chain(x, w).block_until_ready(), repeats=3)
    return chained * 2 * size**3 / min(seconds)


def _peak_memory() -> dict[str, float]:
    """The default device's peak memory in use so far, in GiB, where its backend reports it (GPUs and TPUs do)."""
    stats = jax.devices()[0].memory_stats() or {}
    return {"peak_device_memory_gib": round(stats["peak_bytes_in_use"] / 2**30, 2)} if "peak_bytes_in_use" in stats else {}


def _random_batch(*, batch: int, prompt: int, completion: int, vocab: int, groups: int, shared_prompts: bool):
    """Random token rows of one length bucket, and their advantages [batch]; with `shared_prompts`, each group's
    rows carry its first prompt."""
    rng = np.random.default_rng(0)
    prompts = rng.integers(3, vocab, size=(batch, prompt)).tolist()
    completions = rng.integers(3, vocab, size=(batch, completion)).tolist()
    sampler_logprobs = (-rng.uniform(0.5, 8.0, size=(batch, completion))).tolist()
    advantages = rng.normal(size=batch).astype(np.float32)
    group_ids = np.repeat(np.arange(groups), batch // groups)
    if shared_prompts:
        prompts = [prompts[g] for g in group_ids]
    trajectories = build(prompts, completions, sampler_logprobs, advantages, group_ids, pad_id=2,
                         length_buckets=(prompt + completion,))  # fmt: skip
    return trajectories, advantages


def _learner_config(**changes) -> LearnerConfig:
    return LearnerConfig(
        loss=LossConfig(clip_low=CLIP, clip_high=CLIP, aggregation="seq-mean-token-mean"),
        optimizer=OptimizerConfig(learning_rate=LEARNING_RATE, schedule="constant", max_grad_norm=MAX_GRAD_NORM),
        **changes,
    )


def _update_flops(config: dict, tokens: int, length: int, head_tokens: int) -> float:
    """Forward + backward model FLOPs: 6 * matmul params * tokens plus causal-free attention (PaLM appendix B);
    the LM head (a matmul tied to the embedding) runs only on the `head_tokens` that carry a loss."""
    hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    head_dim = config["head_dim"]
    q_width, kv_width = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    per_layer = hidden * (2 * q_width + 2 * kv_width) + 3 * hidden * config["intermediate_size"]
    attention = 12 * layers * q_width * length * tokens
    return 6 * layers * per_layer * tokens + 6 * hidden * vocab * head_tokens + attention


def _torch_step(model, optimizer, tokens, attention_mask, loss_mask, advantages) -> float:
    """One update; returns the gradient's global norm before clipping."""
    optimizer.zero_grad(set_to_none=True)
    # Like the learner, vocabulary logits only where a loss can be: the positions predicting completion tokens.
    outputs = model(input_ids=tokens, attention_mask=attention_mask, logits_to_keep=COMPLETION + 1)
    logits = outputs.logits[:, :-1].float()
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, tokens[:, -COMPLETION:, None]).squeeze(-1)
    with torch.no_grad():
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    ratio = torch.exp(logp - logp.detach())
    adv = advantages[:, None]
    per_token = -torch.min(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv)
    mask = loss_mask[:, -COMPLETION:]
    loss = ((per_token * mask).sum(1) / mask.sum(1)).mean()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()
    (entropy * mask).sum().item()  # the logged metric, brought to the host as the learner's is
    return grad_norm.item()


def _torch_update(model_dir, shape: dict) -> Callable[[], float]:
    batch, advantages = _random_batch(**shape, shared_prompts=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    inputs = (
        torch.as_tensor(np.asarray(batch.tokens), dtype=torch.long),
        torch.as_tensor(np.asarray(batch.attention_mask), dtype=torch.long),
        torch.as_tensor(np.asarray(batch.loss_mask), dtype=torch.float32),
        torch.as_tensor(advantages),
    )
    return lambda: _torch_step(model, optimizer, *inputs)


def _flax_update(model_dir, shape: dict, *, micro_batch_size: int | None = None,
                 shared_prompts: bool = False) -> Callable[[], float]:
    batch, _ = _random_batch(**shape, shared_prompts=shared_prompts)
    if shared_prompts:
        assert batch.prompt_block_size(shape["batch"]) == shape["batch"] // shape["groups"]
    learner = Learner(hf_io.load(model_dir), _learner_config(micro_batch_size=micro_batch_size))
    return lambda: learner.update(batch)["grad_norm"]


# Each engine of the CPU comparison, built from a checkpoint and a batch shape; its update returns the gradient norm.
# All start from the same weights and rows, except that the shared-prompt engine's groups carry their first prompt.
ENGINES = {
    "flax": _flax_update,
    "flax_micro_batches": functools.partial(_flax_update, micro_batch_size=MICRO_BATCH),
    "flax_shared_prompts": functools.partial(_flax_update, shared_prompts=True),
    "torch": _torch_update,
}


def _engine_process(connection, engine: str, model_dir, shape: dict) -> None:
    """Child process: builds one engine, takes `WARMUP_UPDATES` untimed updates, sends what the first one took (wall
    seconds, compile included; gradient norm) and torch's thread count, then times one update per request (None ends
    it) and sends the wall seconds back."""
    update = ENGINES[engine](model_dir, shape)
    start = time.perf_counter()
    first_grad_norm = update()
    first_update_s = time.perf_counter() - start
    for _ in range(WARMUP_UPDATES - 1):
        update()
    connection.send({"first_update_s": first_update_s, "first_grad_norm": first_grad_norm,
                     "torch_threads": torch.get_num_threads()})
    while connection.recv() is not None:
        connection.send(timed(update, repeats=1, warmup=0)[0])


def time_engines(engines: Sequence[str], model_dir, shape: dict, repeats: int = REPEATS) -> dict[str, dict]:
    """Each engine in a process of its own, all started at once (spawned, with this process's malloc tunables:
    `conductor.host_memory`), then `repeats` rounds in which each times one update in turn, so that the engines see
    the same background load on a shared machine and none shares its heap or caches with another. Returns per
    engine its timed seconds and what its first update took."""
    spawn = multiprocessing.get_context("spawn")
    processes, connections = {}, {}

    def receive(engine: str):
        try:
            return connections[engine].recv()
        except EOFError:
            processes[engine].join(timeout=60)
            raise RuntimeError(f"the {engine!r} engine's process ended (exit code {processes[engine].exitcode}); its "
                               "error is printed above") from None

    try:
        with host_memory.tunables_for_children():
            for engine in engines:
                connections[engine], child_connection = spawn.Pipe()
                process = spawn.Process(target=_engine_process, args=(child_connection, engine, model_dir, shape))
                process.start()
                processes[engine] = process
                child_connection.close()  # the child's end lives on in the child only: its exit ends the pipe here
        results = {engine: receive(engine) | {"seconds": []} for engine in engines}
        for _ in range(repeats):
            for engine in engines:
                connections[engine].send(True)
                results[engine]["seconds"].append(receive(engine))
        for engine in engines:
            connections[engine].send(None)
    finally:
        for engine, process in processes.items():  # those started, should a later one fail to start
            connections[engine].close()  # an engine left waiting for a request sees the end of the pipe and exits
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    return results


def run() -> Report:
    """The torch comparison on a CPU; the bf16 Qwen2.5-1.5B-shaped update on an accelerator (torch here is a CPU
    build, so there is no like-for-like baseline beside a GPU or TPU); over every process's devices in a
    multi-process run."""
    if jax.process_count() > 1:
        devices = jax.device_count()
        shape = ACCELERATOR_SHAPE | {
            "batch": ACCELERATOR_SHAPE["batch"] * devices, "micro_batch": ACCELERATOR_SHAPE["micro_batch"] * devices
        }
        return accelerator_update(QWEN25_1_5B, **shape, mesh=make_mesh(fsdp=devices))
    if jax.default_backend() == "cpu":
        return cpu_comparison()
    return accelerator_update(QWEN25_1_5B, **ACCELERATOR_SHAPE)


def accelerator_update(
    hf_config: dict, *, batch: int, prompt: int, completion: int, micro_batch: int,
    matmul_size: int = ACCELERATOR_MATMUL_SIZE, mesh: Mesh | None = None, attention_implementation: str = "auto",
    profile_dir: str | None = None,
) -> Report:
    """Tokens/s and MFU of `Learner.update` with bf16 matmuls and float32 weights on the default device (on `mesh`,
    rows split over its devices), against the bf16 square-matmul rate measured in the same run (on one device, times
    the mesh's devices). With `profile_dir`, one more update runs under `jax.profiler.trace` there, and the figures
    carry its kernel table (`launch.benchmark_suites.profile`)."""
    config = ModelConfig.from_hf(
        hf_config, dtype="bfloat16", param_dtype="float32", attention_implementation=attention_implementation
    )
    learner = Learner(
        Transformer(config, rngs=nnx.Rngs(0)), _learner_config(micro_batch_size=micro_batch), mesh=mesh
    )
    devices = 1 if mesh is None else mesh.devices.size
    trajectories, _ = _random_batch(batch=batch, prompt=prompt, completion=completion, vocab=config.vocab_size,
                                    groups=1, shared_prompts=False)  # fmt: skip

    def update() -> None:
        learner.update(trajectories)
        jax.block_until_ready(learner.params)

    seconds = timed(update, repeats=REPEATS, warmup=WARMUP_UPDATES)
    kernels = None if profile_dir is None else profile.profile_calls(update, profile_dir)
    peak = _matmul_flops_per_s(jnp.bfloat16, matmul_size, ACCELERATOR_CHAINED_MATMULS) * devices
    n_tokens = batch * (prompt + completion)
    flops = _update_flops(hf_config, n_tokens, prompt + completion, batch * completion)
    median = statistics.median(seconds)
    device = str(jax.devices()[0].device_kind)
    return Report(
        suite="learner",
        columns=["engine", "median_s", "min_s", "tokens_per_s", "mfu"],
        rows=[["flax Learner.update, bf16", median, min(seconds), n_tokens / median, flops / median / peak]],
        figures={
            "device": device,
            "devices": devices,
            "processes": jax.process_count(),
            "model_shape": hf_config,
            "batch": batch,
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "micro_batch_size": micro_batch,
            "attention_implementation": attention_implementation,
            "fused_attention": uses_fused_attention(config),
            **_peak_memory(),
            "dtype": "bfloat16 matmuls, float32 weights",
            "flax_tokens_per_s": round(n_tokens / median, 1),
            "flax_mfu": round(flops / median / peak, 4),
            "update_tflops": float(f"{flops / 1e12:.6g}"),  # significant digits, not decimals: small shapes too
            "bf16_matmul_tflops_per_s": round(peak / 1e12, 1),
            **({} if kernels is None else {"kernels": kernels}),
        },
        notes=[
            f"{devices} x {device} ({jax.process_count()} processes): {batch} x ({prompt} prompt + {completion} "
            f"completion) tokens in micro-batches of "
            f"{micro_batch}, median of {REPEATS} updates after {WARMUP_UPDATES} untimed ones; MFU against the "
            f"{matmul_size}^3 bf16 matmul rate measured in this run on one device, {ACCELERATOR_CHAINED_MATMULS} "
            f"chained per call, times {devices} devices ({peak / 1e12:.1f} TFLOP/s)",
        ],
    )


def cpu_comparison() -> Report:
    model_dir = zoo.smollm2_135m_instruct()
    shape = dict(batch=BATCH, prompt=PROMPT, completion=COMPLETION, vocab=49152, groups=GROUPS)
    n_tokens = BATCH * (PROMPT + COMPLETION)
    # One round per Flax engine, each beside torch (a ratio is taken within its round), so that no more than two
    # engines hold memory at once: an engine process keeps its peak heap (`conductor.host_memory`).
    rounds = {engine: time_engines((engine, "torch"), model_dir, shape)
              for engine in ("flax", "flax_micro_batches", "flax_shared_prompts")}  # fmt: skip
    flax_seconds, torch_seconds = rounds["flax"]["flax"]["seconds"], rounds["flax"]["torch"]["seconds"]
    micro_seconds = rounds["flax_micro_batches"]["flax_micro_batches"]["seconds"]
    grouped_seconds = rounds["flax_shared_prompts"]["flax_shared_prompts"]["seconds"]
    micro_torch_s = statistics.median(rounds["flax_micro_batches"]["torch"]["seconds"])
    grouped_torch_s = statistics.median(rounds["flax_shared_prompts"]["torch"]["seconds"])
    # The same weights and rows give the same first gradient: a check that the engines time the same computation
    # (the shared-prompt batch has other prompts, so its gradient differs).
    grad_norms = {engine: rounds[engine][engine]["first_grad_norm"] for engine in ("flax", "flax_micro_batches")}
    grad_norms["torch"] = rounds["flax"]["torch"]["first_grad_norm"]
    grad_norm_spread = (max(grad_norms.values()) - min(grad_norms.values())) / grad_norms["torch"]
    peak = _matmul_flops_per_s()

    config = json.loads((model_dir / "config.json").read_text())
    flops = _update_flops(config, n_tokens, PROMPT + COMPLETION, BATCH * COMPLETION)
    flax_s, torch_s = statistics.median(flax_seconds), statistics.median(torch_seconds)
    grouped_s, micro_s = statistics.median(grouped_seconds), statistics.median(micro_seconds)
    flax_tps, torch_tps = n_tokens / flax_s, n_tokens / torch_s
    ratio = flax_tps / torch_tps
    flax_mfu, torch_mfu = flops / flax_s / peak, flops / torch_s / peak
    rows = [
        ["flax Learner.update (jax.jit)", flax_s, min(flax_seconds), flax_tps, flax_mfu],
        [f"flax, micro-batches of {MICRO_BATCH}", micro_s, min(micro_seconds), n_tokens / micro_s,
         flops / micro_s / peak],
        [f"flax, {GROUPS} groups sharing a prompt", grouped_s, min(grouped_seconds), n_tokens / grouped_s, "-"],
        ["plain torch eager step", torch_s, min(torch_seconds), torch_tps, torch_mfu],
    ]
    return Report(
        suite="learner",
        columns=["engine", "median_s", "min_s", "tokens_per_s", "mfu"],
        rows=rows,
        figures={
            "model": "SmolLM2-135M-Instruct",
            "batch": BATCH,
            "prompt_tokens": PROMPT,
            "completion_tokens": COMPLETION,
            "dtype": "float32",
            "flax_tokens_per_s": round(flax_tps, 1),
            "torch_tokens_per_s": round(torch_tps, 1),
            "flax_over_torch": round(ratio, 3),
            "flax_micro_batches_over_torch": round(micro_torch_s / micro_s, 3),
            "flax_shared_prompts_over_torch": round(grouped_torch_s / grouped_s, 3),
            "goal_flax_over_torch": GOAL_RATIO,
            "goal_met": ratio >= GOAL_RATIO,
            "flax_mfu": round(flax_mfu, 4),
            "torch_mfu": round(torch_mfu, 4),
            "update_tflops": float(f"{flops / 1e12:.6g}"),
            "fp32_matmul_gflops_per_s": round(peak / 1e9, 1),
            "flax_compile_and_first_update_s": round(rounds["flax"]["flax"]["first_update_s"], 1),
            "torch_threads": rounds["flax"]["torch"]["torch_threads"],
            "first_update_grad_norms": {engine: round(norm, 6) for engine, norm in grad_norms.items()},
            "first_update_grad_norm_relative_spread": float(f"{grad_norm_spread:.3g}"),
        },
        notes=[
            f"{BATCH} x ({PROMPT} prompt + {COMPLETION} completion) tokens, fp32, median of {REPEATS} interleaved "
            f"updates after {WARMUP_UPDATES} untimed ones each, every engine in its own process; flax/torch = "
            f"{ratio:.3f} (goal >= {GOAL_RATIO}); MFU against the {MATMUL_SIZE}^3 fp32 matmul rate measured in this "
            f"run ({peak / 1e9:.1f} GFLOP/s)",
            f"the same update in micro-batches of {MICRO_BATCH}, in its own round beside torch: flax/torch = "
            f"{micro_torch_s / micro_s:.3f}",
            f"with each group's prompt encoded once ({GROUPS} groups of {BATCH // GROUPS}, same update, less work "
            f"than torch does), in its own round beside torch: flax/torch = {grouped_torch_s / grouped_s:.3f}; no "
            f"MFU, the model FLOPs differ",
            f"first-update gradient norms of flax, its micro-batches and torch agree to {grad_norm_spread:.1e} "
            f"(relative)",
        ],
    )

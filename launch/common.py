"""Flags and builders shared by the entry points (train, sft, eval, serve).

Each `build_*` reads the flags of its group and returns the object the rest of the stack takes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import pathlib
from typing import Any, Callable, Sequence

import jax.numpy as jnp
from absl import flags
from flax import nnx

from env.executor import ExecutorConfig
from env.gym_env import ConductorEnv, EnvConfig
from env.rewards import RewardConfig
from env.tasks import data_files, routerdc
from env.workers.cache import ResponseCache
from env.workers.simulated import AnswerModel
from env.worlds import (
    LocalWorldConfig,
    PaperWorldConfig,
    ReplayWorldConfig,
    SyntheticWorldConfig,
    World,
    build_world,
)
from models import hf_io, zoo
from models.config import ModelConfig
from models.tokenizer import load_tokenizer
from models.transformer import Transformer
from rollout import weight_sync
from rollout.sglang_generator import SGLangConfig, SGLangGenerator
from rollout.torch_generator import TorchGenerator
from rollout.types import SamplingParams

log = logging.getLogger(__name__)

# -- the Conductor ------------------------------------------------------------------------------------------------

_CONDUCTOR = flags.DEFINE_string(
    "conductor", "tiny",
    "The Conductor: 'smollm2-135m-instruct' (the model zoo's SmolLM2-135M-Instruct), 'tiny' (a small random "
    "Llama-family model with SmolLM2's tokenizer, for fast CPU experiments), or a Hugging Face model directory.",
)
_TINY_LAYERS = flags.DEFINE_integer("tiny_layers", 2, "Decoder layers of the 'tiny' Conductor.")
_TINY_WIDTH = flags.DEFINE_integer("tiny_width", 128, "Hidden size of the 'tiny' Conductor.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Learner compute dtype.")
_PARAM_DTYPE = flags.DEFINE_enum("param_dtype", "float32", ["float32", "bfloat16"], "Learner parameter dtype.")
_REMAT = flags.DEFINE_boolean("remat", False, "Rematerialise each decoder layer in the backward pass.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of initialisation, data order and sampling.")

# -- the world ----------------------------------------------------------------------------------------------------

_WORLD = flags.DEFINE_enum("world", "synthetic", ["synthetic", "replay", "local", "paper"], "The worker pool and tasks.")
_TASKS = flags.DEFINE_list(
    "tasks", [],
    "Training tasks. replay: RouterDC file stems (e.g. mmlu_train,gsm8k-train); local: one env.tasks name; "
    "paper: name or name:path entries (math500, mmlu, rlpr, livecodebench). Empty: the world's default.",
)
_TASK_LIMIT = flags.DEFINE_integer("task_limit", None, "At most this many questions per task file.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None,
    "Data root searched first for the task files: <data_dir>/routerdc/ (replay world), <data_dir>/<name>/ (paper "
    "world). Then $CONDUCTOR_DATA_DIR, the user cache (~/.cache/conductor-rl/data, where `python -m launch.data "
    "fetch NAME` puts them) and the team copy; the RouterDC files are fetched into the cache on first use.",
)
_SYNTHETIC_WORKERS = flags.DEFINE_integer("synthetic_workers", 4, "Workers in the synthetic pool.")
_SYNTHETIC_SKILLS = flags.DEFINE_string(
    "synthetic_skills", None,
    "The synthetic skill matrix: one row per worker, rows separated by ';', each the worker's probability of being "
    "right on each domain (arithmetic, algebra, logic, trivia), comma-separated. Default: seeded specialists.",
)
_SYNTHETIC_TASKS = flags.DEFINE_integer("synthetic_tasks", 1000, "Questions generated for the synthetic world.")
_WORKER_LATENCY = flags.DEFINE_float("worker_latency_s", 0.0, "Simulated latency of synthetic and replay workers.")
_MULTI_STEP_RULE = flags.DEFINE_enum(
    "multi_step_rule", "independent", ["independent", "adopt"],
    "How simulated and replay workers use earlier steps: 'independent' (a workflow is worth its last step; exact "
    "for replayed data) or 'adopt' (a step that reads a correct answer adopts it with --adopt_rate; a model).",
)
_ADOPT_RATE = flags.DEFINE_float("adopt_rate", 0.5, "Adoption probability of the 'adopt' multi-step rule.")
_LOCAL_WORKERS = flags.DEFINE_integer("local_workers", 2, "SmolLM2-135M-Instruct workers in the local world.")
_STRATIFY = flags.DEFINE_boolean(
    "stratify_questions", False,
    "Questions take the task domains in turn: each training iteration holds one of each per run of as many "
    "questions as there are domains, and the world warm-start teacher draws the domains equally.",
)
_SHARE_PROMPTS = flags.DEFINE_boolean(
    "share_prompts", True,
    "Encode a prompt once per block of consecutive rows that carry it: a GRPO group in the learner, a question's "
    "routes in the world warm-start (the same update, less work).",
)
_MAX_STEPS = flags.DEFINE_integer("max_steps", 5, "Most steps a workflow may have.")
_ACCESS_MODE = flags.DEFINE_enum("access_mode", "binary", ["binary", "fine"], "Access-list format.")
_RECURSION_ROUNDS = flags.DEFINE_integer("recursion_rounds", 0, "Extra Conductor rounds on the first round's result.")
_MAX_CONCURRENCY = flags.DEFINE_integer("max_concurrency", 256, "Workflows executed at once.")
_WORKER_MAX_TOKENS = flags.DEFINE_integer("worker_max_tokens", 4096, "Token limit of each worker call.")
_WORKER_TEMPERATURE = flags.DEFINE_float("worker_temperature", 0.2, "Sampling temperature of worker calls.")
_CACHE = flags.DEFINE_string("cache", None, "SQLite response cache path (none: no cache).")
_EXPECTED_GRADES = flags.DEFINE_boolean(
    "expected_grades", False,
    "Grade a synthetic or replay worker's final answer by its probability of being right (for a replay worker, what "
    "its recorded outcome says) instead of a 0/1 draw: same expected reward and accuracy, no draw variance.",
)
_ALLOW_UNSANDBOXED_CODE = flags.DEFINE_boolean(
    "allow_unsandboxed_code", False,
    "Where no kernel sandbox works (neither bubblewrap nor user namespaces), run the generated programs of code "
    "tasks anyway, with only resource limits and a Python audit hook, which a program can get past: only on a "
    "machine whose every user and file you would trust that program with. Off: such a machine refuses code tasks.",
)

# -- the reward ---------------------------------------------------------------------------------------------------

_REWARD_FORMAT_ERROR = flags.DEFINE_float("reward_format_error", 0.0, "Reward of a completion that does not parse.")
_REWARD_WRONG = flags.DEFINE_float("reward_wrong", 0.5, "Reward of a valid workflow with a wrong answer.")
_REWARD_CORRECT = flags.DEFINE_float("reward_correct", 1.0, "Reward of a correct answer.")
_FORMAT_BONUS = flags.DEFINE_float("format_bonus", 0.0, "Added to every valid workflow's reward.")
_STEP_PENALTY = flags.DEFINE_float("step_penalty", 0.0, "Subtracted per workflow step.")
_TOKEN_PENALTY = flags.DEFINE_float("token_penalty", 0.0, "Subtracted per 1,000 worker tokens.")
_USD_PENALTY = flags.DEFINE_float("usd_penalty", 0.0, "Subtracted per US dollar of worker cost.")
_RECURSION_DISCOUNT = flags.DEFINE_float("recursion_discount", 0.2, "Weight of an earlier round's reward.")

# -- generation ---------------------------------------------------------------------------------------------------

_GENERATOR = flags.DEFINE_enum("generator", "torch", ["torch", "sglang"], "Rollout engine.")
_GENERATOR_DEVICE = flags.DEFINE_string("generator_device", "cpu", "Torch device of the in-process generator.")
_SGLANG_URLS = flags.DEFINE_list("sglang_urls", [], "SGLang server base URLs (generator=sglang).")
_SYNC = flags.DEFINE_enum(
    "sync", "inprocess", ["inprocess", "disk", "nccl"],
    "Weight sync transport: in-process (torch generator), disk (SGLang /update_weights_from_disk), "
    "nccl (SGLang /update_weights_from_distributed).",
)
_SYNC_DIR = flags.DEFINE_string("sync_dir", None, "Shared directory for disk sync (default: <logdir>/sync).")
_SGLANG_WEIGHT_DTYPE = flags.DEFINE_enum(
    "sglang_weight_dtype", "auto", ["auto", "float32", "bfloat16", "float16"],
    "dtype of the weights --sync=disk and --sync=nccl send to SGLang servers; auto: the servers' own (from their "
    "/server_info: --dtype, or for --dtype=auto the model's config dtype).",
)
_SGLANG_TP_SIZES = flags.DEFINE_list(
    "sglang_server_tp_sizes", [],
    "Tensor-parallel size of each --sglang_urls server, in order (--sync=nccl: the weight-update group has 1 + their "
    "sum ranks). Empty: read from each server's /server_info; given: checked against it.",
)
_SGLANG_MASTER_ADDRESS = flags.DEFINE_string(
    "sglang_master_address", None,
    "Address of this host that the SGLang servers dial for the --sync=nccl rendezvous. Default: 127.0.0.1 when "
    "every server is local, else this host's address on its route to the first remote server.",
)
_SGLANG_MASTER_PORT = flags.DEFINE_integer(
    "sglang_master_port", 29600, "Free port of this host for the --sync=nccl rendezvous, open to the servers."
)
_SGLANG_SYNC_BACKEND = flags.DEFINE_enum(
    "sglang_sync_backend", "nccl", ["nccl", "gloo"], "torch.distributed backend of --sync=nccl (gloo: CPU tensors)."
)
_SGLANG_RENDEZVOUS_TIMEOUT = flags.DEFINE_float(
    "sglang_rendezvous_timeout_s", 300.0,
    "--sync=nccl: seconds the servers and this process have to form the weight-update group before the update "
    "fails with what to check.",
)
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Conductor sampling temperature.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Conductor nucleus sampling.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Conductor top-k sampling (0: off).")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 1024, "Most tokens the Conductor writes per completion.")


def share_prompts() -> bool:
    return _SHARE_PROMPTS.value


def stratify_questions() -> bool:
    return _STRATIFY.value


def seed() -> int:
    return _SEED.value


def _dtype(name: str) -> jnp.dtype:
    return jnp.dtype(name)


def tiny_conductor_config(vocab_size: int, layers: int, width: int) -> dict[str, Any]:
    """An HF config.json dict of a small Llama-family model (SmolLM2's shape, scaled down)."""
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab_size,
        "hidden_size": width,
        "intermediate_size": 3 * width,
        "num_hidden_layers": layers,
        "num_attention_heads": max(width // 32, 1),
        "num_key_value_heads": max(width // 64, 1),
        "head_dim": 32,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


JAX_ALLOCATOR_VARIABLES = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)


def share_gpu_with_torch_generator() -> None:
    """With the torch generator on a GPU, JAX allocates on demand instead of reserving 75% of the GPU's memory when
    its backend starts, which would leave the generator's weights and KV cache a quarter. Takes effect only before
    JAX's first computation (`load_conductor` is the launchers' first), and never overrides the user's own setting
    of JAX's allocator."""
    on_gpu = _GENERATOR.value == "torch" and _GENERATOR_DEVICE.value.startswith("cuda")
    if on_gpu and not any(name in os.environ for name in JAX_ALLOCATOR_VARIABLES):
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"


def load_conductor(out_dir: pathlib.Path, spec: str | None = None) -> tuple[Transformer, Any, pathlib.Path]:
    """(Flax model, tokenizer, HF directory the generator loads). A 'tiny' Conductor is initialised from the seed and
    written to `out_dir` (with SmolLM2's tokenizer) so the generator starts from the same weights."""
    share_gpu_with_torch_generator()
    spec = spec or _CONDUCTOR.value
    dtype, param_dtype = _dtype(_DTYPE.value), _dtype(_PARAM_DTYPE.value)
    if spec == "tiny":
        tokenizer_dir = zoo.smollm2_135m_instruct_tokenizer()  # the weights are not read
        tokenizer = load_tokenizer(tokenizer_dir)
        hf_config = tiny_conductor_config(len(tokenizer), _TINY_LAYERS.value, _TINY_WIDTH.value)
        config = ModelConfig.from_hf(hf_config, dtype=dtype, param_dtype=param_dtype, remat=_REMAT.value)
        model = Transformer(config, rngs=nnx.Rngs(_SEED.value))
        model_dir = hf_io.save(model, out_dir)
        tokenizer.save_pretrained(model_dir)
        return model, tokenizer, model_dir
    model_dir = zoo.smollm2_135m_instruct() if spec == "smollm2-135m-instruct" else pathlib.Path(spec)
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"--conductor={spec}: no config.json in {model_dir}")
    model = hf_io.load(model_dir, dtype=dtype, param_dtype=param_dtype, remat=_REMAT.value)
    return model, load_tokenizer(model_dir), model_dir


# -- worlds -------------------------------------------------------------------------------------------------------


def reward_config() -> RewardConfig:
    return RewardConfig(
        format_error=_REWARD_FORMAT_ERROR.value,
        wrong=_REWARD_WRONG.value,
        correct=_REWARD_CORRECT.value,
        format_bonus=_FORMAT_BONUS.value,
        step_penalty=_STEP_PENALTY.value,
        token_penalty=_TOKEN_PENALTY.value,
        usd_penalty=_USD_PENALTY.value,
        recursion_discount=_RECURSION_DISCOUNT.value,
    )


def world_config(tasks: Sequence[str] | None = None) -> Any:
    """The config of `--world` with `tasks` (default `--tasks`) as its question set."""
    tasks = list(_TASKS.value if tasks is None else tasks)
    name, limit = _WORLD.value, _TASK_LIMIT.value
    answer_model = AnswerModel(rule=_MULTI_STEP_RULE.value, adopt_rate=_ADOPT_RATE.value)
    if name == "synthetic":
        skills = None
        if _SYNTHETIC_SKILLS.value:
            skills = tuple(tuple(float(v) for v in row.split(",")) for row in _SYNTHETIC_SKILLS.value.split(";"))
        return SyntheticWorldConfig(
            num_workers=len(skills) if skills else _SYNTHETIC_WORKERS.value, num_tasks=_SYNTHETIC_TASKS.value,
            seed=_SEED.value, skills=skills, latency_s=_WORKER_LATENCY.value, answer_model=answer_model,
        )
    if name == "replay":
        files = tuple(tasks) or ReplayWorldConfig.files
        routerdc_dir = str(routerdc.data_dir(_DATA_DIR.value) / "routerdc") if _DATA_DIR.value else None
        return ReplayWorldConfig(files=files, data_dir=routerdc_dir, limit_per_file=limit, seed=_SEED.value,
                                 latency_s=_WORKER_LATENCY.value, answer_model=answer_model)
    if name == "local":
        smollm2 = str(zoo.smollm2_135m_instruct())
        return LocalWorldConfig(model_dirs=(smollm2,) * _LOCAL_WORKERS.value, tasks=(tasks or ["synthetic"])[0],
                                limit=limit, seed=_SEED.value)
    entries = tuple((t.split(":", 1)[0], t.split(":", 1)[1] if ":" in t else None) for t in tasks)
    entries = tuple((task, path or _found(task)) for task, path in entries or PaperWorldConfig.tasks)
    return PaperWorldConfig(tasks=entries, limit_per_task=limit, seed=_SEED.value)


def _found(task: str) -> str | None:
    """`<task>/` in the first data root holding it, `--data_dir` searched first; None leaves the search to env.tasks
    (which then names the directories it tried)."""
    directory = data_files.find(task, _DATA_DIR.value) if _DATA_DIR.value else None
    return str(directory) if directory else None


def build_env(tasks: Sequence[str] | None = None) -> ConductorEnv:
    """The gym environment of `--world` over `tasks`, with the reward and executor flags."""
    rewards = reward_config()
    world: World = build_world(world_config(tasks), rewards, _MAX_STEPS.value)
    config = EnvConfig(
        max_steps=_MAX_STEPS.value,
        access_mode=_ACCESS_MODE.value,
        recursion_rounds=_RECURSION_ROUNDS.value,
        max_concurrency=_MAX_CONCURRENCY.value,
        seed=_SEED.value,
        expected_grades=_EXPECTED_GRADES.value,
        allow_unsandboxed_code=_ALLOW_UNSANDBOXED_CODE.value,
        executor=ExecutorConfig(
            max_tokens=_WORKER_MAX_TOKENS.value, temperature=_WORKER_TEMPERATURE.value, seed=_SEED.value
        ),
        reward=rewards,
    )
    cache = ResponseCache(_CACHE.value) if _CACHE.value else None
    env = ConductorEnv(world, config, cache)
    if env.sandbox_layer is not None:
        _log_sandbox_layer(env.sandbox_layer)
    return env


@functools.cache
def _log_sandbox_layer(layer: str) -> None:
    if layer == "none":
        log.warning(
            "--allow_unsandboxed_code: code tasks run generated programs WITHOUT a kernel sandbox (no bubblewrap, no "
            "user namespaces here); only resource limits and an audit hook stand between them and this machine"
        )
    else:
        log.info("code tasks run generated programs in the %s sandbox", layer)


def sampling_params() -> SamplingParams:
    return SamplingParams(
        temperature=_TEMPERATURE.value, top_p=_TOP_P.value, top_k=_TOP_K.value, max_new_tokens=_MAX_TOKENS.value,
        seed=_SEED.value,
    )


# Written beside a trained Conductor's weights: the completion limit and temperature it was trained with.
TRAINED_SAMPLING_FILE = "trained_sampling.json"


def save_trained_sampling(model_dir: pathlib.Path, params: SamplingParams) -> None:
    record = {"max_new_tokens": params.max_new_tokens, "temperature": params.temperature}
    (model_dir / TRAINED_SAMPLING_FILE).write_text(json.dumps(record) + "\n")


def conductor_sampling_params(model_dir: pathlib.Path) -> SamplingParams:
    """`sampling_params()` for the Conductor in `model_dir`. Unless `--max_tokens` (`--temperature`) is on the
    command line, its completion limit (temperature) is the one the Conductor was trained with: a small Conductor
    whose greedy completion never stops would otherwise hold every batch for the flag's default 1024 steps, and
    its format is reliable at the temperature it was trained at, not necessarily at the flag's default 1.0.
    Callers decode a trained Conductor greedily first (launch.eval, launch.serve); this temperature is for samples."""
    params = sampling_params()
    trained_path = model_dir / TRAINED_SAMPLING_FILE
    if not trained_path.exists():
        return params
    trained = json.loads(trained_path.read_text())
    if not _MAX_TOKENS.present:
        params = dataclasses.replace(params, max_new_tokens=int(trained["max_new_tokens"]))
    if not _TEMPERATURE.present and "temperature" in trained:
        params = dataclasses.replace(params, temperature=float(trained["temperature"]))
    return params


def build_generator(model_dir: pathlib.Path, log_dir: pathlib.Path) -> tuple[Any, Callable[[Any, int], None]]:
    """(generator, weight_sync): `weight_sync(model, version)` pushes the learner's weights into the generator."""
    if _GENERATOR.value == "torch":
        if _SYNC.value != "inprocess":
            raise ValueError("the torch generator lives in this process: use --sync=inprocess")
        generator: Any = TorchGenerator(model_dir, device=_GENERATOR_DEVICE.value)
    else:
        if not _SGLANG_URLS.value:
            raise ValueError("--generator=sglang needs --sglang_urls")
        if _SYNC.value == "inprocess":
            raise ValueError("SGLang servers are other processes: use --sync=disk or --sync=nccl")
        generator = SGLangGenerator(sglang_config(model_dir, log_dir))
    return generator, functools.partial(_sync_into, generator)


def sglang_config(model_dir: pathlib.Path, log_dir: pathlib.Path) -> SGLangConfig:
    """The SGLang client's config from `--sglang_urls`, `--sync` and the `--sglang_*` sync flags."""
    try:
        tp_sizes = tuple(int(size) for size in _SGLANG_TP_SIZES.value) or None
    except ValueError:
        raise ValueError(f"--sglang_server_tp_sizes takes integers, got {_SGLANG_TP_SIZES.value}") from None
    return SGLangConfig(
        urls=tuple(_SGLANG_URLS.value),
        weight_update="disk" if _SYNC.value == "disk" else "distributed",
        checkpoint_root=_SYNC_DIR.value or str(log_dir / "sync"),
        model_dir=str(model_dir),
        server_tp_sizes=tp_sizes,
        master_address=_SGLANG_MASTER_ADDRESS.value,
        master_port=_SGLANG_MASTER_PORT.value,
        backend=_SGLANG_SYNC_BACKEND.value,
        rendezvous_timeout_s=_SGLANG_RENDEZVOUS_TIMEOUT.value,
        weight_dtype=None if _SGLANG_WEIGHT_DTYPE.value == "auto" else _SGLANG_WEIGHT_DTYPE.value,
    )


def _sync_into(generator: Any, model: Transformer, version: int) -> None:
    weight_sync.sync(model, generator, version)

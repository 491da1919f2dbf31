"""The world's flags: the worker pool and the tasks (`env.worlds`)."""

from __future__ import annotations

from typing import Sequence, get_args

from absl import flags

from env.tasks import data_files, routerdc, zeroeval
from env.workers.api import Price
from env.workers.simulated import AnswerModel, MultiStepRule
from env.orchestration import OrchestrationWorldConfig
from env.workers.recorded import TOKENIZERS
from env.worlds import (
    LocalWorldConfig,
    PaperWorldConfig,
    ReplayWorldConfig,
    SyntheticWorldConfig,
    WorldConfig,
    ZeroEvalWorldConfig,
)
from launch.flag_groups import shared
from models import zoo

_TASKS = flags.DEFINE_list(
    "tasks", [],
    "Training tasks. replay: RouterDC file stems (e.g. mmlu_train,gsm8k-train); local: one env.tasks name; "
    "paper: name or name:path entries (math500, mmlu, rlpr, livecodebench); orchestration: one split (train, "
    "validation, test); zeroeval: ZeroEval tasks (gsm, math-l5, crux; default all) and one split (train, the "
    "default; test; all). Empty: the world's default.",
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
    "right on each task (arithmetic, algebra, logic, trivia), comma-separated. Default: seeded specialists.",
)
_SYNTHETIC_PRICES = flags.DEFINE_string(
    "synthetic_prices", None,
    "The synthetic workers' list prices, as the API workers' Price: one row per worker, rows separated by ';', each "
    "'input,output' US dollars per million prompt and completion tokens. Default: free.",
)
_SYNTHETIC_TASKS = flags.DEFINE_integer("synthetic_tasks", 1000, "Questions generated for the synthetic world.")
_WORKER_LATENCY = flags.DEFINE_float("worker_latency_s", 0.0, "Simulated latency of synthetic and replay workers.")
_WORKER_LATENCY_SIGMA = flags.DEFINE_float(
    "worker_latency_sigma", 0.0,
    "synthetic world: > 0 makes each worker call's latency lognormal, median --worker_latency_s and this log-std, "
    "as API latencies are (1: a tenth of calls take 3.6 times the median).",
    lower_bound=0.0,
)
_MULTI_STEP_RULE = flags.DEFINE_enum(
    "multi_step_rule", "independent", get_args(MultiStepRule),
    "How simulated and replay workers use earlier steps: 'independent' (a workflow is worth its last step; exact "
    "for replayed data) or 'adopt' (a step that reads a correct answer adopts it with --adopt_rate; a model).",
)
_ADOPT_RATE = flags.DEFINE_float("adopt_rate", 0.5, "Adoption probability of the 'adopt' multi-step rule.")
_LOCAL_WORKERS = flags.DEFINE_integer("local_workers", 2, "SmolLM2-135M-Instruct workers in the local world.")


_ZEROEVAL_SPLITS = ("train", "test", "all")
_ZEROEVAL_TOKENIZER = flags.DEFINE_enum(
    "zeroeval_tokenizer", "cl100k_base", list(TOKENIZERS),
    "zeroeval world: how the recorded prompts and outputs are counted into tokens for their cost.",
)
_O1_MINI_OUTPUT_FACTOR = flags.DEFINE_float(
    "o1_mini_output_factor", 1.0,
    "zeroeval world: multiplier of o1-mini's counted output tokens, for the hidden reasoning it is billed for but "
    "the records lack (docs/zeroeval.md).",
)

_ZEROEVAL_POOL_SIZES = flags.DEFINE_list(
    "zeroeval_pool_sizes", ["3", "9"],
    "zeroeval world with offered pools (a pools=... entry of --tasks): the smallest and the largest random pool.",
)


def _synthetic(tasks: Sequence[str], answer_model: AnswerModel) -> SyntheticWorldConfig:
    skills = _rows("synthetic_skills", _SYNTHETIC_SKILLS.value)
    prices = _rows("synthetic_prices", _SYNTHETIC_PRICES.value)
    if prices is not None:
        if any(len(row) != 2 for row in prices):
            raise ValueError(
                f"--synthetic_prices: each worker's row is 'input,output', got {_SYNTHETIC_PRICES.value!r}"
            )
        prices = tuple(Price(*row) for row in prices)
    return SyntheticWorldConfig(
        num_workers=len(skills) if skills else _SYNTHETIC_WORKERS.value, num_tasks=_SYNTHETIC_TASKS.value,
        seed=shared.SEED.value, skills=skills, latency_s=_WORKER_LATENCY.value,
        latency_sigma=_WORKER_LATENCY_SIGMA.value, prices=prices,
        answer_model=answer_model,
    )


def _rows(flag: str, text: str | None) -> tuple[tuple[float, ...], ...] | None:
    """A matrix flag's value: rows separated by ';', values by ','."""
    if not text:
        return None
    try:
        return tuple(tuple(float(value) for value in row.split(",")) for row in text.split(";"))
    except ValueError:
        raise ValueError(f"--{flag} takes numbers, ',' between values and ';' between rows, got {text!r}") from None


def _replay(tasks: Sequence[str], answer_model: AnswerModel) -> ReplayWorldConfig:
    files = tuple(tasks) or ReplayWorldConfig.files
    routerdc_dir = str(routerdc.data_dir(_DATA_DIR.value) / "routerdc") if _DATA_DIR.value else None
    return ReplayWorldConfig(files=files, data_dir=routerdc_dir, limit_per_file=_TASK_LIMIT.value,
                             seed=shared.SEED.value, latency_s=_WORKER_LATENCY.value, answer_model=answer_model)


def _local(tasks: Sequence[str], answer_model: AnswerModel) -> LocalWorldConfig:
    smollm2 = str(zoo.smollm2_135m_instruct())
    return LocalWorldConfig(model_dirs=(smollm2,) * _LOCAL_WORKERS.value, tasks=(list(tasks) or ["synthetic"])[0],
                            limit=_TASK_LIMIT.value, seed=shared.SEED.value)


def _paper(tasks: Sequence[str], answer_model: AnswerModel) -> PaperWorldConfig:
    entries = tuple((t.split(":", 1)[0], t.split(":", 1)[1] if ":" in t else None) for t in tasks)
    entries = tuple((task, path or _found(task)) for task, path in entries or PaperWorldConfig.tasks)
    return PaperWorldConfig(tasks=entries, limit_per_task=_TASK_LIMIT.value, seed=shared.SEED.value)


def _zeroeval(tasks: Sequence[str], answer_model: AnswerModel) -> ZeroEvalWorldConfig:
    """`tasks`: ZeroEval task names (default all three), at most one split name (train, the default; test; all),
    so that --tasks=train and --eval_tasks=test name the two halves, and at most one `pools=...` (the offered pools,
    `ZeroEvalWorldConfig.pools`: --tasks=train,pools=train --eval_tasks=test,pools=heldout)."""
    del answer_model  # a record answers the same whatever the call reads
    splits = [entry for entry in tasks if entry in _ZEROEVAL_SPLITS]
    if len(splits) > 1:
        raise ValueError(f"zeroeval: name at most one split of {', '.join(_ZEROEVAL_SPLITS)}, got {splits}")
    pools = [entry.removeprefix("pools=") for entry in tasks if entry.startswith("pools=")]
    if len(pools) > 1:
        raise ValueError(f"zeroeval: name at most one pools=..., got {pools}")
    names = tuple(e for e in tasks if e not in _ZEROEVAL_SPLITS and not e.startswith("pools=")) or (
        zeroeval.ZEROEVAL_TASKS)
    directory = str(zeroeval.data_dir(_DATA_DIR.value)) if _DATA_DIR.value else None
    sizes = tuple(int(size) for size in _ZEROEVAL_POOL_SIZES.value)
    if len(sizes) != 2:
        raise ValueError(f"--zeroeval_pool_sizes takes the smallest and the largest pool, got {sizes}")
    return ZeroEvalWorldConfig(
        tasks=names, split=splits[0] if splits else "train", data_dir=directory,
        limit_per_task=_TASK_LIMIT.value, seed=shared.SEED.value, tokenizer=_ZEROEVAL_TOKENIZER.value,
        o1_mini_output_factor=_O1_MINI_OUTPUT_FACTOR.value, latency_s=_WORKER_LATENCY.value,
        pools=pools[0] if pools else "all", pool_sizes=sizes,
    )


def _found(task: str) -> str | None:
    """`<task>/` in the first data root holding it, `--data_dir` searched first; None leaves the search to env.tasks
    (which then names the directories it tried)."""
    directory = data_files.find(task, _DATA_DIR.value) if _DATA_DIR.value else None
    return str(directory) if directory else None


def _orchestration(tasks: Sequence[str], answer_model: AnswerModel) -> OrchestrationWorldConfig:
    if len(tasks) > 1:
        raise ValueError(f"the orchestration world takes one split (train, validation or test), got {list(tasks)}")
    return OrchestrationWorldConfig(split=tasks[0] if tasks else "train", answer_model=answer_model)


_CONFIGS = {
    "synthetic": _synthetic, "replay": _replay, "local": _local, "paper": _paper, "orchestration": _orchestration,
    "zeroeval": _zeroeval,
}
_WORLD = flags.DEFINE_enum("world", "synthetic", list(_CONFIGS), "The worker pool and tasks.")


def from_flags(tasks: Sequence[str] | None = None) -> WorldConfig:
    """The config of `--world` with `tasks` (default `--tasks`) as its question set."""
    answer_model = AnswerModel(rule=_MULTI_STEP_RULE.value, adopt_rate=_ADOPT_RATE.value)
    return _CONFIGS[_WORLD.value](list(_TASKS.value if tasks is None else tasks), answer_model)

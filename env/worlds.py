"""Worlds: a worker pool plus the tasks it is asked about, built from typed configs (docs/design.md section 5).

- `synthetic`: a parametric pool (skill matrix workers x tasks, latency, price) on generated questions, with a
  known optimal policy and its expected reward (`OraclePolicy`), so training can be compared with the oracle.
- `replay`: the seven RouterDC models replaying their recorded per-question outcomes.
- `local`: real small transformers models (SmolLM2-135M-Instruct) running in-process.
- `zeroeval`: sixteen API and open models replaying their recorded outputs on GSM8K, MATH level 5 and CRUXEval, with
  list prices (`env.tasks.zeroeval`, `env.workers.recorded`; docs/zeroeval.md).
- `paper`: the reference's seven-worker pool (three provider APIs, four open models behind OpenAI-compatible
  servers). Constructible without keys or servers; a call fails (as a recorded step) only when made without them.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Mapping, Sequence

import numpy as np

from env import tasks as task_library
from env.tasks.zeroeval import ZEROEVAL_MODELS, ZEROEVAL_OPEN_MODELS, ZEROEVAL_TASKS, load_zeroeval
from env.orchestration import OrchestrationReference, OrchestrationWorldConfig
from env.orchestration import build as build_orchestration
from env.pools import draw_pool, offer, random_pools
from env.rewards import RewardConfig
from env.tasks.base import Task
from env.workers.api import FREE, Price, RetryConfig
from env.workers.base import Worker
from env.workers.recorded import TOKENIZERS, ZEROEVAL_PRICES, RecordedWorker, Tokenizer
from env.workers.replay import ROUTERDC_MODELS, ReplayWorker
from env.workers.simulated import AnswerModel, SimulatedWorker
from env.workflow import Step, Workflow

SYNTHETIC_TASK_LABELS = ("arithmetic", "algebra", "logic", "trivia")


@dataclasses.dataclass(frozen=True)
class OraclePlan:
    """The best workflow for one task: `earlier` steps by the task's most skilled worker that read nothing,
    then a final step by `final` that reads them all (no earlier steps: a single step)."""

    task_label: str
    earlier: tuple[int, ...]
    final: int
    p_correct: float
    expected_reward: float

    def workflow(self, instruction: str = "Solve the question.") -> Workflow:
        steps = [Step(worker, instruction) for worker in self.earlier]
        steps.append(Step(self.final, instruction, "all" if self.earlier else ()))
        return Workflow(steps=tuple(steps))


@dataclasses.dataclass(frozen=True)
class OraclePolicy:
    """Per-task optimal plans and the expected reward of following them on the world's task mix."""

    plans: Mapping[str, OraclePlan]
    expected_reward: float


def optimal_policy(
    skills: Mapping[str, Sequence[float]],
    task_weights: Mapping[str, float],
    answer_model: AnswerModel,
    reward_config: RewardConfig,
    max_steps: int,
) -> OraclePolicy:
    """The best workflow per task under the simulated workers' `AnswerModel`, by exhaustive search.

    `skills[task][w]` is worker w's probability of being right. The final answer is right with
    P = p_final when it reads no correct earlier response, else 1 - (1 - p_final)(1 - adopt_rate) under "adopt".
    Whether any earlier step is right does not depend on what the earlier steps read (a step that reads a correct
    response adds nothing to "some earlier step is right"), so for k steps the best plan is k - 1 calls of the
    most skilled worker and a final step, reading all, by whichever worker maximises the expected reward. Token
    and cost penalties depend on the text the policy writes, so they must be zero here.
    """
    if reward_config.token_penalty or reward_config.usd_penalty:
        raise ValueError("the oracle is exact only without token or USD penalties")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    plans: dict[str, OraclePlan] = {}
    for task_label, row in skills.items():
        best = max(range(len(row)), key=lambda w: row[w])
        candidates = []
        for steps in range(1, max_steps + 1):
            p_some_earlier_right = 1.0 - (1.0 - row[best]) ** (steps - 1)
            for final in range(len(row)):
                p_correct = (1.0 - p_some_earlier_right) * row[final] + p_some_earlier_right * (
                    answer_model.p_correct(row[final], reads_correct_response=True)
                )
                expected = (
                    reward_config.wrong
                    + (reward_config.correct - reward_config.wrong) * p_correct
                    + reward_config.format_bonus
                    - reward_config.step_penalty * steps
                )
                candidates.append(
                    (expected, -steps, OraclePlan(task_label, (best,) * (steps - 1), final, p_correct, expected))
                )
        plans[task_label] = max(candidates, key=lambda candidate: candidate[:2])[2]
    total_weight = sum(task_weights.values())
    expected = sum(plans[d].expected_reward * weight for d, weight in task_weights.items()) / total_weight
    return OraclePolicy(plans=plans, expected_reward=expected)


@dataclasses.dataclass
class World:
    """A pool and its tasks. `oracle` is set where the optimal policy is known (synthetic); `orchestration` holds the
    orchestration world's exact reference policies (`env.orchestration`)."""

    name: str
    pool: list[Worker]
    tasks: list[Task]
    oracle: OraclePolicy | None = None
    orchestration: OrchestrationReference | None = None

    def __post_init__(self) -> None:
        if not self.pool:
            raise ValueError(f"world {self.name!r} has an empty pool")
        if not self.tasks:
            raise ValueError(f"world {self.name!r} has no tasks")


@dataclasses.dataclass(frozen=True)
class SyntheticWorldConfig:
    """Workers x tasks skill matrix. Without `skills`, worker w specialises in task w mod 4 (skill drawn in
    [0.75, 0.95]) and is weaker elsewhere ([0.1, 0.5]), drawn from `seed`. `prices` gives one price per worker
    (default free)."""

    num_workers: int = 4
    num_tasks: int = 1000
    seed: int = 0
    skills: tuple[tuple[float, ...], ...] | None = None  # [worker][task], tasks in SYNTHETIC_TASK_LABELS order
    latency_s: float = 0.0
    latency_sigma: float = 0.0  # > 0: each call's latency is lognormal with median latency_s (`SimulatedWorker`)
    completion_tokens: int = 200
    prices: tuple[Price, ...] | None = None
    answer_model: AnswerModel = AnswerModel()

    def __post_init__(self) -> None:
        if self.num_workers < 1 or self.num_tasks < 1:
            raise ValueError(f"need >= 1 worker and task, got {self.num_workers}, {self.num_tasks}")
        if self.skills is not None:
            if len(self.skills) != self.num_workers or any(len(r) != len(SYNTHETIC_TASK_LABELS) for r in self.skills):
                raise ValueError(
                    f"skills must be {self.num_workers} rows (workers) of {len(SYNTHETIC_TASK_LABELS)} values "
                    f"(tasks {', '.join(SYNTHETIC_TASK_LABELS)})"
                )
            if any(not 0.0 <= s <= 1.0 for row in self.skills for s in row):
                raise ValueError("every skill must be in [0, 1]")
        if self.prices is not None and len(self.prices) != self.num_workers:
            raise ValueError(f"prices needs one entry per worker ({self.num_workers}), got {len(self.prices)}")

    def skill_matrix(self) -> tuple[tuple[float, ...], ...]:
        if self.skills is not None:
            return self.skills
        rng = random.Random(self.seed)
        return tuple(
            tuple(
                rng.uniform(0.75, 0.95) if d == w % len(SYNTHETIC_TASK_LABELS) else rng.uniform(0.1, 0.5)
                for d in range(len(SYNTHETIC_TASK_LABELS))
            )
            for w in range(self.num_workers)
        )


@dataclasses.dataclass(frozen=True)
class ReplayWorldConfig:
    """RouterDC files (stems in the data directory) replayed by the seven recorded models."""

    files: tuple[str, ...] = ("mmlu_test", "gsm8k-test", "arc_challenge_test", "humaneval_test", "MATH_prealgebra")
    data_dir: str | None = None  # default: env.tasks' data directory + "/routerdc"
    limit_per_file: int | None = None
    seed: int = 0
    latency_s: float = 0.0
    answer_model: AnswerModel = AnswerModel()

    def __post_init__(self) -> None:
        if not self.files:
            raise ValueError("a replay world needs at least one RouterDC file")


@dataclasses.dataclass(frozen=True)
class ZeroEvalWorldConfig:
    """ZeroEval's recorded outputs (`env.tasks.zeroeval`) replayed by `models` at `ZEROEVAL_PRICES`. `split` is the
    fixed half of each task (`split_indices`, drawn from `split_seed`): train for training, test for reporting.
    `o1_mini_output_factor` scales o1-mini's counted output tokens for its unrecorded hidden reasoning."""

    tasks: tuple[str, ...] = ZEROEVAL_TASKS
    split: str = "train"
    split_seed: int = 0
    data_dir: str | None = None  # the directory holding <task>/ (default: env.tasks.zeroeval.data_dir())
    limit_per_task: int | None = None
    seed: int = 0
    models: tuple[str, ...] = ZEROEVAL_MODELS
    tokenizer: Tokenizer = "cl100k_base"
    o1_mini_output_factor: float = 1.0
    latency_s: float = 0.0
    # Offered pools (`env.pools`): "all" offers none (every model, by id); "train" a random pool of `pool_sizes`
    # models per question, never a held-out one; a held-out pool's name ("open", "closed", "random-<i>") that pool;
    # "heldout" every held-out pool in turn (`zeroeval_heldout_pools`).
    pools: str = "all"
    pool_sizes: tuple[int, int] = (3, 9)
    heldout_random_pools: int = 20

    def __post_init__(self) -> None:
        if not self.tasks or set(self.tasks) - set(ZEROEVAL_TASKS):
            raise ValueError(f"zeroeval tasks must be some of {', '.join(ZEROEVAL_TASKS)}, got {self.tasks}")
        if not self.models or set(self.models) - set(ZEROEVAL_MODELS):
            raise ValueError(f"zeroeval models must be some of {', '.join(ZEROEVAL_MODELS)}, got {self.models}")
        if self.split not in ("train", "test", "all"):
            raise ValueError(f"split must be train, test or all, got {self.split!r}")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {', '.join(TOKENIZERS)}, got {self.tokenizer!r}")
        if not 1.0 <= self.o1_mini_output_factor < float("inf"):
            raise ValueError(f"o1_mini_output_factor must be finite and >= 1, got {self.o1_mini_output_factor}")
        if self.limit_per_task is not None and self.limit_per_task < 1:
            raise ValueError(f"limit_per_task must be >= 1, got {self.limit_per_task}")
        low, high = self.pool_sizes
        if self.pools != "all" and (not 1 <= low <= high <= len(self.models) or self.heldout_random_pools < 0):
            raise ValueError(f"pool_sizes must be 1 <= low <= high <= {len(self.models)} models and "
                             f"heldout_random_pools >= 0, got {self.pool_sizes}, {self.heldout_random_pools}")
        if self.pools not in ("all", "train", "heldout") and self.pools not in zeroeval_heldout_pools(self):
            raise ValueError(
                f"zeroeval pools must be all, train, heldout or a held-out pool's name "
                f"({', '.join(zeroeval_heldout_pools(self))}), got {self.pools!r}"
            )


def zeroeval_heldout_pools(config: ZeroEvalWorldConfig) -> dict[str, tuple[int, ...]]:
    """The pools no "train" question is offered, by name (indices into `config.models`): the open-weight models, the
    API-only ones, and `heldout_random_pools` random pools of `pool_sizes` models, drawn from `split_seed`."""
    open_models = tuple(i for i, model in enumerate(config.models) if model in ZEROEVAL_OPEN_MODELS)
    closed_models = tuple(i for i in range(len(config.models)) if i not in open_models)
    named = {"open": open_models, "closed": closed_models}
    named = {name: pool for name, pool in named.items() if pool}
    drawn = random_pools(len(config.models), config.pool_sizes, config.heldout_random_pools,
                         f"zeroeval held-out pools/{config.split_seed}", exclude=list(named.values()))
    return named | {f"random-{i}": pool for i, pool in enumerate(drawn)}


def _offered(config: ZeroEvalWorldConfig, tasks: list[Task]) -> list[Task]:
    """`tasks` offering the pools `config.pools` names (`env.pools`)."""
    heldout = zeroeval_heldout_pools(config)
    rng = random.Random(f"zeroeval offered pools/{config.split_seed}/{config.split}/{config.pools}/{config.seed}")
    if config.pools == "train":
        offers = [(draw_pool(len(config.models), config.pool_sizes, rng, exclude=list(heldout.values())), "train")
                  for _ in tasks]
    elif config.pools == "heldout":
        names = list(heldout)
        offers = [(heldout[names[i % len(names)]], names[i % len(names)]) for i in range(len(tasks))]
    else:
        offers = [(heldout[config.pools], config.pools)] * len(tasks)
    return [offer(task, pool, name) for task, (pool, name) in zip(tasks, offers)]


@dataclasses.dataclass(frozen=True)
class LocalWorldConfig:
    """In-process transformers workers; repeating a directory gives another worker sharing the loaded model."""

    model_dirs: tuple[str, ...]
    tasks: str = "synthetic"
    task_path: str | None = None
    limit: int | None = 100
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not self.model_dirs:
            raise ValueError("a local world needs at least one model directory")


@dataclasses.dataclass(frozen=True)
class PaperWorldConfig:
    """The reference's pool with its reasoning settings ("minimal reasoning") and its benchmarks.

    Open models are reached at `open_model_urls[model]` (OpenAI-compatible `/v1` endpoints; SGLang or vLLM);
    API keys are read from OPENAI_API_KEY, ANTHROPIC_API_KEY and GEMINI_API_KEY when a call is made.
    `tasks` lists (name, path) pairs for `env.tasks.load` (path None: the default data directory).
    """

    tasks: tuple[tuple[str, str | None], ...] = (
        ("math500", None),
        ("mmlu", None),
        ("rlpr", None),
        ("livecodebench", None),
    )
    limit_per_task: int | None = None
    seed: int = 0
    open_model_urls: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: {
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B": "http://127.0.0.1:30000/v1",
            "google/gemma-3-27b-it": "http://127.0.0.1:30001/v1",
            "Qwen/Qwen3-32B": "http://127.0.0.1:30002/v1",
        }
    )
    open_model_price: Price = FREE
    retry: RetryConfig = RetryConfig()

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("the paper world needs at least one task set")
        missing = set(PAPER_OPEN_MODELS) - set(self.open_model_urls)
        if missing:
            raise ValueError(f"open_model_urls lacks {sorted(missing)}")


PAPER_OPEN_MODELS = ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "google/gemma-3-27b-it", "Qwen/Qwen3-32B")

WorldConfig = (
    SyntheticWorldConfig | ReplayWorldConfig | LocalWorldConfig | PaperWorldConfig | OrchestrationWorldConfig
    | ZeroEvalWorldConfig
)


def build_world(config: WorldConfig, reward_config: RewardConfig = RewardConfig(), max_steps: int = 5) -> World:
    """The world a config describes. `reward_config` and `max_steps` only shape the synthetic oracle and the
    orchestration world's exact reference."""
    if isinstance(config, SyntheticWorldConfig):
        return _synthetic(config, reward_config, max_steps)
    if isinstance(config, OrchestrationWorldConfig):
        return build_orchestration(config, reward_config, max_steps)
    if isinstance(config, ReplayWorldConfig):
        return _replay(config)
    if isinstance(config, LocalWorldConfig):
        return _local(config)
    if isinstance(config, PaperWorldConfig):
        return _paper(config)
    if isinstance(config, ZeroEvalWorldConfig):
        return _zeroeval(config)
    raise TypeError(f"not a world config: {type(config).__name__}")


def _synthetic(config: SyntheticWorldConfig, reward_config: RewardConfig, max_steps: int) -> World:
    matrix = config.skill_matrix()
    prices = config.prices or (FREE,) * config.num_workers
    pool: list[Worker] = [
        SimulatedWorker(
            f"synthetic-{w}",
            dict(zip(SYNTHETIC_TASK_LABELS, matrix[w])),
            latency_s=config.latency_s,
            latency_sigma=config.latency_sigma,
            completion_tokens=config.completion_tokens,
            price=prices[w],
            answer_model=config.answer_model,
        )
        for w in range(config.num_workers)
    ]
    tasks = task_library.load("synthetic", limit=config.num_tasks, seed=config.seed)
    skills_by_task, weights = synthetic_skills_and_weights(config, tasks)
    oracle = None
    # Token and USD penalties depend on the text a policy writes, so no plan is known to be optimal under them.
    if not (reward_config.token_penalty or reward_config.usd_penalty):
        oracle = optimal_policy(skills_by_task, weights, config.answer_model, reward_config, max_steps)
    return World("synthetic", pool, tasks, oracle)


def synthetic_skills_and_weights(
    config: SyntheticWorldConfig, tasks: Sequence[Task]
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Each task's worker skills and its number of `tasks`: the mix `env.optimum` computes a synthetic world's exact
    expected rewards over."""
    matrix = config.skill_matrix()
    skills = {task_label: [matrix[w][d] for w in range(config.num_workers)] for d, task_label in enumerate(SYNTHETIC_TASK_LABELS)}
    weights = {task_label: sum(task.task_label == task_label for task in tasks) for task_label in SYNTHETIC_TASK_LABELS}
    return skills, weights


def _replay(config: ReplayWorldConfig) -> World:
    pool: list[Worker] = [
        ReplayWorker(model, latency_s=config.latency_s, answer_model=config.answer_model) for model in ROUTERDC_MODELS
    ]
    tasks: list[Task] = []
    for stem in config.files:
        tasks.extend(
            task_library.load(f"routerdc/{stem}", path=config.data_dir, limit=config.limit_per_file, seed=config.seed)
        )
    return World("replay", pool, tasks)


def replay_grades_by_task(tasks: Sequence[Task]) -> dict[str, np.ndarray]:
    """{task: grades[question, worker]} of replayed tasks, tasks sorted and workers in `ROUTERDC_MODELS` order;
    each grade is the worker's recorded chance of being right, and a task listed twice is two rows."""
    rows: dict[str, list[list[float]]] = {}
    for task in tasks:
        rows.setdefault(task.task_label, []).append([task.metadata["scores"][model] for model in ROUTERDC_MODELS])
    return {task_label: np.asarray(rows[task_label]) for task_label in sorted(rows)}


def replay_reference_points(tasks: Sequence[Task]) -> dict[str, float | str]:
    """Accuracy of the best single model and of the per-question oracle router on replayed one-step workflows."""
    totals = {model: sum(task.metadata["scores"][model] for task in tasks) for model in ROUTERDC_MODELS}
    best_model = max(totals, key=totals.__getitem__)
    oracle = sum(max(task.metadata["scores"].values()) for task in tasks)
    return {
        "best_single_model": best_model,
        "best_single": totals[best_model] / len(tasks),
        "oracle": oracle / len(tasks),
    }


def _zeroeval(config: ZeroEvalWorldConfig) -> World:
    pool: list[Worker] = [
        RecordedWorker(
            model,
            ZEROEVAL_PRICES[model],
            tokenizer=config.tokenizer,
            output_factor=config.o1_mini_output_factor if model == "o1-mini-2024-09-12" else 1.0,
            latency_s=config.latency_s,
        )
        for model in config.models
    ]
    tasks: list[Task] = []
    for name in config.tasks:
        loaded = load_zeroeval(name, config.data_dir, split=config.split, split_seed=config.split_seed,
                               models=config.models)
        if config.limit_per_task is not None and config.limit_per_task < len(loaded):
            kept = sorted(random.Random(config.seed).sample(range(len(loaded)), config.limit_per_task))
            loaded = [loaded[index] for index in kept]
        tasks.extend(loaded)
    if config.pools != "all":
        tasks = _offered(config, tasks)
    return World("zeroeval", pool, tasks)


def _local(config: LocalWorldConfig) -> World:
    from env.workers.local import TransformersWorker  # torch + transformers load only for this world

    pool: list[Worker] = [
        TransformersWorker(model_dir, name=f"local-{index}", device=config.device)
        for index, model_dir in enumerate(config.model_dirs)
    ]
    tasks = task_library.load(config.tasks, path=config.task_path, limit=config.limit, seed=config.seed)
    return World("local", pool, tasks)


def _paper(config: PaperWorldConfig) -> World:
    # The providers' SDKs take seconds to import; every entry point starts without them unless a world calls them.
    from env.workers.anthropic_api import AnthropicWorker
    from env.workers.google_api import GoogleWorker
    from env.workers.openai_api import OpenAICompatibleWorker, OpenAIWorker

    def open_model(name: str, model: str, enable_thinking: bool | None = None) -> OpenAICompatibleWorker:
        return OpenAICompatibleWorker(
            name=name,
            model=model,
            base_url=config.open_model_urls[model],
            price=config.open_model_price,
            enable_thinking=enable_thinking,
            retry=config.retry,
        )

    pool: list[Worker] = [
        GoogleWorker(name="gemini-2.5-pro", model="gemini-2.5-pro", thinking_budget=128, retry=config.retry),
        AnthropicWorker(name="claude-sonnet-4", model="claude-sonnet-4-20250514", retry=config.retry),
        OpenAIWorker(name="gpt-5", model="gpt-5", reasoning_effort="minimal", retry=config.retry),
        open_model("DeepSeek-R1-Distill-Qwen-32B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"),
        open_model("gemma-3-27b-it", "google/gemma-3-27b-it"),
        open_model("Qwen3-32B", "Qwen/Qwen3-32B", enable_thinking=False),
        open_model("Qwen3-32B-thinking", "Qwen/Qwen3-32B", enable_thinking=True),
    ]
    tasks: list[Task] = []
    for name, path in config.tasks:
        tasks.extend(task_library.load(name, path=path, limit=config.limit_per_task, seed=config.seed))
    return World("paper", pool, tasks)

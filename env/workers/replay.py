"""A replay worker: one of the RouterDC models, right with the probability recorded for it on this question.

The routerdc data (docs/design.md section 5) records, per question, whether each model's answer was right: the
fraction of its sampled answers that were right, or for a multiple-choice question whether its graded answer was
(`env.tasks.routerdc`). For a one-step workflow that is exactly the probability the model answers correctly. The
data says nothing about a model that reads other models' work, so multi-step behaviour comes from the same
explicit, switchable `AnswerModel` as the simulated worker (default "independent": reading changes nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from env.workers.api import FREE, Price
from env.workers.base import WorkerError
from env.workers.simulated import AnswerModel, SimulatedWorker

if TYPE_CHECKING:
    from env.tasks.base import Task

ROUTERDC_MODELS = (
    "mistralai/Mistral-7B-v0.1",
    "meta-math/MetaMath-Mistral-7B",
    "itpossible/Chinese-Mistral-7B-v0.1",
    "HuggingFaceH4/zephyr-7b-beta",
    "cognitivecomputations/dolphin-2.6-mistral-7b",
    "meta-llama/Meta-Llama-3-8B",
    "cognitivecomputations/dolphin-2.9-llama3-8b",
)


class ReplayWorker(SimulatedWorker):
    """Answers a routerdc task correctly with probability `task.metadata["scores"][model]`."""

    backend = "replay"

    def __init__(
        self,
        model: str,
        *,
        latency_s: float = 0.0,
        completion_tokens: int = 200,
        price: Price = FREE,
        answer_model: AnswerModel = AnswerModel(),
    ) -> None:
        super().__init__(
            model,
            {},
            latency_s=latency_s,
            completion_tokens=completion_tokens,
            price=price,
            answer_model=answer_model,
        )

    @property
    def cache_model(self) -> str:
        # The reply follows the recorded outcome, which is not in the prompt; naming how outcomes are read keeps
        # replies cached before multiple-choice scores were read as right/wrong (commit c47d110) from being reused.
        return f"{self.model} [replay, multiple choice right/wrong, {self.answer_model}]"

    def skill(self, task: "Task") -> float:
        scores = task.metadata.get("scores")
        if not scores or self.model not in scores:
            raise WorkerError(f"{self.name}: task {task.id} has no recorded score for this model")
        return float(scores[self.model])

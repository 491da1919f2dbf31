"""A supervised per-question router: how much of the per-question oracle the question text alone can recover.

Trained with full information (every model's recorded outcome on every training question), it is a ceiling for a
Conductor that sees only the question: one logistic regression per model over hashed word unigrams and bigrams of the
question plus the task label, predicting whether that model is right. It routes each test question to the model with
the highest predicted chance of being right minus `usd_weight` times the model's mean cost per question on that task
in the training split (a call's cost is not known before it is made). numpy only; seconds on a CPU.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from typing import Sequence

import numpy as np

from env.frontier import Outcomes
from env.tasks.base import Task

_WORD_RE = re.compile(r"\w+|[^\w\s]")


@dataclasses.dataclass(frozen=True)
class RouterConfig:
    """Hashed feature width, L2 weight, Adam steps and step size; `usd_weights` are the routing trade-offs swept."""

    feature_bits: int = 14
    l2: float = 1e-3
    steps: int = 300
    learning_rate: float = 0.05
    usd_weights: tuple[float, ...] = (0.0, 10.0, 20.0, 30.0, 50.0, 70.0, 100.0, 200.0, 300.0, 1000.0)

    def __post_init__(self) -> None:
        if not 4 <= self.feature_bits <= 20:
            raise ValueError(f"feature_bits must be in [4, 20], got {self.feature_bits}")
        if self.l2 < 0 or self.steps < 1 or self.learning_rate <= 0:
            raise ValueError(f"need l2 >= 0, steps >= 1 and learning_rate > 0, got {self}")
        if not self.usd_weights or any(w < 0 for w in self.usd_weights):
            raise ValueError(f"usd_weights must be >= 0 and not empty, got {self.usd_weights}")


def features(questions: Sequence[str], task_labels: Sequence[int], num_task_labels: int, bits: int) -> np.ndarray:
    """[question, 2**bits + num_task_labels]: binary hashed unigrams and bigrams (crc32, stable across runs), each row
    scaled to unit norm, then a one-hot task label."""
    width = 1 << bits
    x = np.zeros((len(questions), width + num_task_labels), dtype=np.float32)
    for row, (question, task_label) in enumerate(zip(questions, task_labels)):
        words = _WORD_RE.findall(question.lower())
        grams = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
        columns = {zlib.crc32(gram.encode()) & (width - 1) for gram in grams}
        if columns:
            x[row, sorted(columns)] = 1.0 / np.sqrt(len(columns))
        x[row, width + task_label] = 1.0
    return x


def fit(x: np.ndarray, y: np.ndarray, config: RouterConfig) -> tuple[np.ndarray, np.ndarray]:
    """Weights [features, models] and biases [models] of independent logistic regressions, by full-batch Adam on
    the mean log loss plus `l2` times the squared weights."""
    weights = np.zeros((x.shape[1], y.shape[1]), dtype=np.float64)
    bias = np.log((y.mean(axis=0) + 1e-3) / (1 - y.mean(axis=0) + 1e-3))
    moments = [np.zeros_like(weights), np.zeros_like(weights), np.zeros_like(bias), np.zeros_like(bias)]
    beta1, beta2 = 0.9, 0.999
    for step in range(1, config.steps + 1):
        p = _sigmoid(x @ weights + bias)
        residual = (p - y) / len(x)
        grads = (x.T @ residual + 2 * config.l2 * weights, residual.sum(axis=0))
        for index, (param, grad) in enumerate(zip((weights, bias), grads)):
            m, v = moments[2 * index], moments[2 * index + 1]
            m *= beta1
            m += (1 - beta1) * grad
            v *= beta2
            v += (1 - beta2) * grad**2
            param -= config.learning_rate * (m / (1 - beta1**step)) / (np.sqrt(v / (1 - beta2**step)) + 1e-8)
    return weights, bias


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))


def route(p: np.ndarray, expected_cost: np.ndarray, usd_weight: float) -> np.ndarray:
    """Per question, the model maximising p - usd_weight * expected cost (first on ties)."""
    return np.argmax(p - usd_weight * expected_cost, axis=1)


def ceiling(tasks: Sequence[Task], o: Outcomes, test: np.ndarray, config: RouterConfig = RouterConfig()) -> dict:
    """Train on `~test`, evaluate on `test` (a mask over `tasks`, the rows of `o`): the routed accuracy and cost at
    each `usd_weight`, and the test log loss against always predicting each model's training accuracy per task."""
    x = features([t.question for t in tasks], o.task_label_of, len(o.task_labels), config.feature_bits)
    train = ~test
    y = o.correct.astype(np.float64)
    weights, bias = fit(x[train], y[train], config)
    p = _sigmoid(x[test] @ weights + bias)
    base_rate = np.stack([y[train & (o.task_label_of == d)].mean(axis=0) for d in range(len(o.task_labels))])
    mean_cost = np.stack([o.cost_usd[train & (o.task_label_of == d)].mean(axis=0) for d in range(len(o.task_labels))])
    expected_cost = mean_cost[o.task_label_of[test]]
    rows = np.arange(int(test.sum()))
    points = []
    for usd_weight in config.usd_weights:
        chosen = route(p, expected_cost, usd_weight)
        points.append({
            "usd_weight": usd_weight,
            "accuracy": float(o.correct[test][rows, chosen].mean()),
            "cost_usd_per_question": float(o.cost_usd[test][rows, chosen].mean()),
        })
    return {
        "about": f"logistic regression per model on 2^{config.feature_bits} hashed uni/bigrams + task label, "
                 f"trained on {int(train.sum())} train questions, routed on {int(test.sum())} test questions",
        "test_log_loss": _log_loss(p, y[test]),
        "test_log_loss_task_base_rate": _log_loss(np.clip(base_rate[o.task_label_of[test]], 1e-6, 1 - 1e-6), y[test]),
        "points": points,
    }


def _log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())

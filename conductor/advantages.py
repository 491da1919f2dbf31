"""The Conductor's advantage transforms, registered in `rl.advantages.ADVANTAGE_TRANSFORMS` on import.

A route is the tuple of workers a workflow called (`ROUTE`, the environment's `Rollout.labels["route"]`; None for a
completion without a valid workflow), its route tokens the completion tokens that write those workers' ids
(`Rollout.marked_tokens["route"]`), and a task a question's label (`AdvantageBatch.question_labels`: its data set or
subject; "task label" names it throughout the Conductor's code, where older notes say domain or stratum).

    balance_routes   A'_i = A_i - lambda * mean_{j: route_j = route_i} A_j
    pool_routes      A'_i = (1 - lambda) A_i + lambda * mean_{j: task_j = task_i, route_j = route_i} A_j
    route_propensity each route token's advantage times min(cap, (1 / pi_t) / mean_s (1 / pi_s))

Each formula's reasons are in its function's docstring.
"""

from __future__ import annotations

import collections
from typing import Hashable, Sequence

import numpy as np

from rl.advantages import ADVANTAGE_TRANSFORMS, AdvantageBatch, Transformed

ROUTE = "route"


def _route_means(advantages, keys: Sequence[Hashable | None]) -> np.ndarray:
    """Each row's mean advantage over the rows that share its key; a row whose key is None keeps its own."""
    means = advantages.copy()
    rows_of = collections.defaultdict(list)
    for row, key in enumerate(keys):
        if key is not None:
            rows_of[key].append(row)
    for rows in rows_of.values():
        means[rows] = advantages[rows].mean()
    return means


def _checked_route_adjustment(advantages, routes: Sequence[Hashable | None], fraction: float) -> np.ndarray:
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"the fraction must lie in [0, 1], got {fraction}")
    advantages = np.asarray(advantages, dtype=np.float32)
    if advantages.ndim != 1 or len(routes) != advantages.size:
        raise ValueError(f"{len(routes)} routes for advantages of shape {advantages.shape}")
    return advantages


def balance_routes(advantages, routes: Sequence[Hashable | None], fraction: float = 1.0) -> np.ndarray:
    """Each completion's advantage minus a fraction of the mean advantage of its route over the batch.

    A'_i = A_i - lambda * mean_{j: route_j = route_i} A_j with lambda = `fraction` in [0, 1]; a completion without a
    route (`None`: no valid workflow) keeps A_i.
    Why: the policy's decision state has a part that every task shares, and that part is pushed towards each route
    by the sum of the route's advantages over the whole batch, so a route that pays well in one task is pushed up in
    all of them. Balanced, that sum is zero for every route: a task learns only how much more or less a route pays
    there than across the batch. The price: a route that is best everywhere is not learned as such, and a batch of
    one task learns nothing; a probe of the spillover between tasks, not a default.
    A fraction between 0 and 1 trades the two: with tasks whose decision states share a part rho of their direction,
    the push a route gets in one task from the others' advantages and the bias lambda puts on its own contrasts
    cancel at one lambda, which grows with rho (for F tasks of equal similarity, lambda = F rho / (1 + (F - 1) rho)).
    """
    advantages = _checked_route_adjustment(advantages, routes, fraction)
    routed = [route is not None for route in routes]
    return np.where(routed, advantages - fraction * _route_means(advantages, routes), advantages).astype(np.float32)


def pool_routes_by_task(
    advantages, routes: Sequence[Hashable | None], tasks: Sequence[Hashable], fraction: float = 1.0
) -> np.ndarray:
    """Each completion's advantage moved a fraction of the way to its route's mean advantage within its task.

    A'_i = (1 - lambda) A_i + lambda * mean_{j: task_j = task_i, route_j = route_i} A_j with lambda = `fraction`
    in [0, 1]; a completion without a route (`None`) keeps A_i.
    Why: a question's own advantage says which worker did best on that question, and a policy that routes question
    by question fits those per-question wins on the train file. Where two workers are near-equal over a task (its
    question label), the wins a question's draws give it are noise that does not carry to unseen questions, and the
    greedy routes of the test file end split between the two at random. Pooled (lambda = 1), every completion of a
    task that took a route carries that route's lead over the task's batch: the task moves as one, as a bandit over
    its workers would, and settles on one worker. A route's sum of advantages over the batch, and so the push on the
    part of the decision state that the tasks share, is the same as without pooling. The price: where the best
    worker differs from question to question within a task in a way the policy could learn, pooling hides it.
    """
    advantages = _checked_route_adjustment(advantages, routes, fraction)
    if len(tasks) != advantages.size:
        raise ValueError(f"{len(tasks)} task labels for advantages of shape {advantages.shape}")
    keys = [None if route is None else (task, route) for route, task in zip(routes, tasks)]
    return ((1.0 - fraction) * advantages + fraction * _route_means(advantages, keys)).astype(np.float32)


def inverse_propensity_route_weights(
    route_logprobs: Sequence[Sequence[float]], cap: float
) -> list[np.ndarray]:
    """Weights for the advantage on each token that writes a worker id: the inverse of the sampler's probability of
    that token, self-normalised over the batch's route tokens and capped.

        w_t = min(cap, (1 / pi_t) / mean_s (1 / pi_s)),   pi_t = exp(the sampler's log-prob of route token t)

    `route_logprobs[i]` holds row i's route tokens' sampler log-probs (none for a row without a workflow).
    Why: the expected policy-gradient step on a route's logit is pi(r) (A(r) - E_pi[A]), so a route the policy
    samples rarely moves slowly whatever it earns, and a good route the warm-start happens to disfavour can lose its
    share before it is sampled often enough to be told apart (softmax policy gradient's slow escape from a poor
    start, Mei et al. 2020). Weighted, a sampled route's token carries A(r) / pi(r), so in expectation every route's
    logit moves by its own advantage, as if the routes had been drawn uniformly. A policy near one route is still
    drawn back to it only if that route has the highest expected reward (a rarer, better route sampled there has a
    positive advantage, now weighted up). The self-normalisation sets the batch's mean weight to 1 before the cap,
    so the update's scale stays near that of the unweighted loss; the cap bounds the variance a very unlikely sample
    adds.
    """
    if not cap >= 1.0:
        raise ValueError(f"the route weight cap must be >= 1 (1 leaves every weight at most the mean), got {cap}")
    arrays = [np.asarray(row, dtype=np.float64).reshape(-1) for row in route_logprobs]
    every = np.concatenate(arrays) if arrays else np.zeros(0)
    if not np.all(np.isfinite(every)):
        raise ValueError("route tokens' sampler log-probs must be finite")
    if every.size == 0:
        return [np.zeros(0, dtype=np.float32) for _ in arrays]
    # In log space: a token sampled at a log-prob of -800 has an inverse probability no float holds.
    log_mean_inverse = np.logaddexp.reduce(-every) - np.log(every.size)
    return [np.exp(np.minimum(np.log(cap), -row - log_mean_inverse)).astype(np.float32) for row in arrays]


def _routes(batch: AdvantageBatch) -> list[Hashable | None]:
    return list(batch.labels.get(ROUTE, [None] * len(batch.advantages)))


def balance_routes_transform(batch: AdvantageBatch, *, fraction: float = 1.0) -> np.ndarray:
    """`balance_routes` on the batch's routes."""
    return balance_routes(batch.advantages, _routes(batch), fraction)


def pool_routes_transform(batch: AdvantageBatch, *, fraction: float = 1.0) -> np.ndarray:
    """`pool_routes_by_task` on the batch's routes and question labels (an environment with question labels)."""
    if batch.question_labels is None:
        raise ValueError("pool_routes needs an environment with question labels (a task per question)")
    return pool_routes_by_task(batch.advantages, _routes(batch), batch.question_labels, fraction)


def route_propensity_transform(batch: AdvantageBatch, *, cap: float = 5.0) -> Transformed:
    """`inverse_propensity_route_weights` on each row's route tokens, as factors of their advantage; logs the largest
    weight (`route_weight_max`) and the share at the cap (`route_weight_capped`)."""
    route_tokens = list(batch.marked_tokens.get(ROUTE, [()] * len(batch.advantages)))
    weights = inverse_propensity_route_weights(
        [[logprobs[t] for t in tokens] for logprobs, tokens in zip(batch.sampler_logprobs, route_tokens)], cap
    )
    every_weight = np.concatenate(weights) if weights else np.zeros(0)
    metrics = {}
    if every_weight.size:
        metrics = {
            "route_weight_max": float(every_weight.max()),
            "route_weight_capped": float(np.mean(every_weight >= cap)),
        }
    return Transformed(batch.advantages, route_tokens, weights, metrics)


ADVANTAGE_TRANSFORMS.update({
    "balance_routes": balance_routes_transform,
    "pool_routes": pool_routes_transform,
    "route_propensity": route_propensity_transform,
})

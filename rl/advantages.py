"""Advantage estimators for group-sampled outcome rewards.

Every estimator maps one scalar reward per completion to one advantage per completion. Completions that answer
the same prompt share a group id. Each estimator is a plain numpy function registered in `ESTIMATORS`; adding one
is one function and one registry line. `compute` is the single entry point the training loop uses.

An estimator's keyword-only parameters are its options (grpo's `std_scaling`, reinforce_pp's `whiten`): `compute`
takes them as a mapping and checks each against the estimator's signature, its name and its annotation (a `Literal`
lists the accepted values), so a hyperparameter is one keyword-only parameter with a default. `lengths` and `strata`
are not options but data: an estimator that declares one is given the completion lengths or the completions' strata
(a label per completion, its question's task domain), required unless the parameter defaults to None (the
REINFORCE++ estimators need lengths only to whiten per token, grpo needs strata only to scale per stratum).
"""

from __future__ import annotations

import collections
import inspect
import types
import typing
from typing import Any, Callable, Hashable, Literal, Mapping, Sequence, get_args

import numpy as np

StdScaling = Literal["group", "batch", "stratum", "none"]
Whitening = Literal["token", "sequence"]


def _group_index(group_ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense group index per sample (0..num_groups-1) and the number of groups."""
    _, index = np.unique(group_ids, return_inverse=True)
    return index, int(index.max()) + 1


def _group_mean(values: np.ndarray, index: np.ndarray, num_groups: int) -> np.ndarray:
    sums = np.bincount(index, weights=values, minlength=num_groups)
    counts = np.bincount(index, minlength=num_groups)
    return (sums / counts)[index]


def _group_std(values: np.ndarray, index: np.ndarray, num_groups: int) -> np.ndarray:
    """Unbiased (ddof=1) standard deviation of each sample's group, as torch.std and TRL use; 0 for singletons."""
    counts = np.bincount(index, minlength=num_groups)
    centred = values - _group_mean(values, index, num_groups)
    squares = np.bincount(index, weights=centred**2, minlength=num_groups)
    variance = squares / np.maximum(counts - 1, 1)
    return np.sqrt(variance)[index]


def _whiten(values: np.ndarray, whiten: Whitening, lengths: np.ndarray | None, eps: float) -> np.ndarray:
    """(v_i - mu) / sqrt(var + eps) with mu and the unbiased var weighted by w_i: each completion's tokens, or 1.

    mu = sum_i w_i v_i / W, var = sum_i w_i (v_i - mu)^2 / (W - 1), W = sum_i w_i: with w_i = l_i this is verl's
    `masked_whiten` over the response mask of a batch whose tokens all carry their completion's value.
    """
    if whiten == "token":
        if lengths is None:
            raise ValueError("whiten='token' needs completion lengths")
        if np.any(lengths < 0) or lengths.sum() <= 0:
            raise ValueError("whiten='token' needs non-negative completion lengths with a positive total")
        weights = lengths
    elif whiten == "sequence":
        weights = np.ones_like(values)
    else:
        raise ValueError(f"whiten must be 'token' or 'sequence', got {whiten!r}")
    total = weights.sum()
    mean = np.sum(weights * values) / total
    variance = np.sum(weights * (values - mean) ** 2) / max(total - 1, 1)  # a lone sample is centred to 0 anyway
    return (values - mean) / np.sqrt(variance + eps)


def grpo(
    rewards: np.ndarray,
    group_ids: np.ndarray,
    *,
    strata: np.ndarray | None = None,
    std_scaling: StdScaling = "group",
    eps: float = 1e-4,
):
    """GRPO (Shao et al. 2024): reward minus its group mean, divided by a standard deviation.

    c_i = r_i - mean_{j in g(i)} r_j, and A_i = c_i / (sigma + eps) with sigma as `std_scaling` says: the group's
    std of r ("group", the original), the whole batch's std of r ("batch": Hu et al. 2025 argue it is less biased
    towards easy/hard prompts), the std of c over the completions of i's stratum s(i) ("stratum"), or none (sigma = 1
    and no eps, "none"); every std unbiased (ddof=1).
    "stratum" gives every stratum (task domain) advantages of unit variance: a domain whose routes differ by a
    little, or where most groups agree, pushes as hard as one with large, consistent differences, instead of being
    outweighed by it through the parameters the domains share. It needs `strata`, a label per completion.
    """
    index, num_groups = _group_index(group_ids)
    centred = rewards - _group_mean(rewards, index, num_groups)
    if std_scaling == "group":
        return centred / (_group_std(rewards, index, num_groups) + eps)
    if std_scaling == "batch":
        std = rewards.std(ddof=1) if rewards.size > 1 else 0.0
        return centred / (std + eps)
    if std_scaling == "stratum":
        if strata is None:
            raise ValueError("std_scaling='stratum' needs the completions' strata (a label per completion)")
        stratum_index, num_strata = _group_index(np.asarray(strata))
        return centred / (_group_std(centred, stratum_index, num_strata) + eps)
    if std_scaling == "none":
        return centred
    raise ValueError(f"std_scaling must be one of {get_args(StdScaling)}, got {std_scaling!r}")


def dr_grpo(rewards: np.ndarray, group_ids: np.ndarray):
    """Dr. GRPO (Liu et al. 2025): reward minus its group mean, with no standard-deviation scaling."""
    index, num_groups = _group_index(group_ids)
    return rewards - _group_mean(rewards, index, num_groups)


def rloo(rewards: np.ndarray, group_ids: np.ndarray):
    """RLOO (Ahmadian et al. 2024): reward minus the mean reward of the *other* samples of its group.

    A group of one has no other samples, so its advantage is 0.
    """
    index, num_groups = _group_index(group_ids)
    sums = np.bincount(index, weights=rewards, minlength=num_groups)[index]
    counts = np.bincount(index, minlength=num_groups)[index]
    leave_one_out = (sums - rewards) / np.maximum(counts - 1, 1)
    return np.where(counts > 1, rewards - leave_one_out, 0.0)


def reinforce_pp(
    rewards: np.ndarray,
    group_ids: np.ndarray,
    *,
    lengths: np.ndarray | None = None,
    whiten: Whitening = "token",
    eps: float = 1e-8,
):
    """REINFORCE++ (Hu 2025) for outcome rewards: rewards whitened over the whole batch (groups ignored).

    A_i = (r_i - mu) / sqrt(var + eps). `whiten="token"` (the default, as verl and OpenRLHF do) counts every
    completion token once, so long completions weigh more: mu = sum_i l_i r_i / L and
    var = sum_i l_i (r_i - mu)^2 / (L - 1) over completion lengths l_i, L = sum_i l_i (verl's unbiased correction).
    `whiten="sequence"` counts every completion once: mu = mean_i r_i, var = sum_i (r_i - mu)^2 / (N - 1).
    """
    del group_ids  # a global baseline: the batch statistics replace per-prompt groups
    return _whiten(rewards, whiten, lengths, eps)


def reinforce_pp_baseline(
    rewards: np.ndarray,
    group_ids: np.ndarray,
    *,
    lengths: np.ndarray | None = None,
    whiten: Whitening = "token",
    eps: float = 1e-8,
):
    """REINFORCE++ with baseline: the group mean is removed first, then the result is whitened over the batch.

    c_i = r_i - mean_{j in g(i)} r_j (0 for a group of one, where verl keeps r_i), then
    A_i = (c_i - mu) / sqrt(var + eps), with mu and var of the c_i weighted per token (`whiten="token"`, the
    default: mu = sum_i l_i c_i / L, var = sum_i l_i (c_i - mu)^2 / (L - 1), L = sum_i l_i) or per completion
    (`whiten="sequence"`: mu = mean_i c_i, var = sum_i (c_i - mu)^2 / (N - 1)), as in `reinforce_pp`.
    """
    return _whiten(dr_grpo(rewards, group_ids), whiten, lengths, eps)


def opo(rewards: np.ndarray, group_ids: np.ndarray, *, lengths: np.ndarray):
    """OPO (Hao et al. 2025): the optimal baseline for sequence rewards, a length-weighted group mean.

    b_g = sum_i l_i r_i / sum_i l_i over the group, advantage r_i - b_g; it needs completion `lengths`.
    """
    index, num_groups = _group_index(group_ids)
    weighted = np.bincount(index, weights=lengths * rewards, minlength=num_groups)
    total = np.bincount(index, weights=lengths, minlength=num_groups)
    if np.any(total <= 0):
        raise ValueError("opo needs every group to have a positive total completion length")
    return rewards - (weighted / total)[index]


Estimator = Callable[..., np.ndarray]

ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
    "reinforce_pp_baseline": reinforce_pp_baseline,
    "opo": opo,
}


# Keyword-only parameters that `compute` fills from the batch rather than from options: what each holds (for its
# error) and the dtype it is given in (None: as passed).
_DATA_PARAMETERS = {"lengths": ("completion lengths", np.float64), "strata": ("the completions' strata", None)}


def accepted_options(name: str) -> dict[str, Any]:
    """The options estimator `name` takes (its keyword-only parameters but `lengths` and `strata`), each with its
    default."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ESTIMATORS)}")
    return {
        parameter.name: parameter.default
        for parameter in inspect.signature(ESTIMATORS[name]).parameters.values()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.name not in _DATA_PARAMETERS
    }


def _has_type(value: Any, annotation: Any) -> bool:
    """Whether `value` fits an option's annotation: a Literal's values, bool, int, float (an int fits), str, None,
    or a union of those."""
    if typing.get_origin(annotation) is Literal:
        return value in typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_has_type(value, member) for member in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation in (bool, str):
        return isinstance(value, annotation)
    raise TypeError(
        f"an estimator option annotated {annotation!r} cannot be checked; use a Literal, bool, int, float, str or None"
    )


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """Raises ValueError unless every option is one estimator `name` takes, with a value its annotation accepts."""
    accepted = accepted_options(name)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"advantage estimator {name!r} takes no option {', '.join(map(repr, unknown))}; it takes "
            f"{sorted(accepted) or 'none'}"
        )
    hints = typing.get_type_hints(ESTIMATORS[name])
    for option, value in options.items():
        if not _has_type(value, hints[option]):
            choices = typing.get_args(hints[option]) or getattr(hints[option], "__name__", hints[option])
            raise ValueError(
                f"advantage estimator {name!r}: option {option!r} must be {choices}, got {value!r}; it takes "
                f"{sorted(accepted)}"
            )


def options_for(name: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """Of `values` (every estimator option a caller can set, e.g. from flags), those estimator `name` takes.

    A key that no registered estimator takes is a ValueError: a misspelt option would otherwise be dropped silently.
    """
    everyone = {option for estimator in ESTIMATORS for option in accepted_options(estimator)}
    unknown = sorted(set(values) - everyone)
    if unknown:
        raise ValueError(
            f"no advantage estimator takes option {', '.join(map(repr, unknown))}; they take {sorted(everyone)}"
        )
    accepted = accepted_options(name)
    return {option: value for option, value in values.items() if option in accepted}


def compute(
    name: str,
    rewards,
    group_ids,
    *,
    lengths=None,
    strata=None,
    options: Mapping[str, Any] | None = None,
) -> np.ndarray:
    """Advantages[N] (float32) of estimator `name` for rewards[N] grouped by group_ids[N].

    `options` are the estimator's own keyword arguments (for example `{"std_scaling": "batch"}` for grpo), checked
    by `check_options`. `lengths[N]` (completion lengths) and `strata[N]` (a label per completion) reach the
    estimators that declare them.
    """
    options = dict(options or {})
    check_options(name, options)
    rewards = np.asarray(rewards, dtype=np.float64)
    group_ids = np.asarray(group_ids)
    if rewards.ndim != 1 or rewards.size == 0:
        raise ValueError(f"rewards must be a non-empty 1-D array, got shape {rewards.shape}")
    if group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids shape {group_ids.shape} != rewards shape {rewards.shape}")
    if not np.all(np.isfinite(rewards)):
        raise ValueError("rewards must be finite")
    estimator = ESTIMATORS[name]
    parameters = inspect.signature(estimator).parameters
    for data_name, value in (("lengths", lengths), ("strata", strata)):
        parameter = parameters.get(data_name)
        if parameter is None or (value is None and parameter.default is not inspect.Parameter.empty):
            continue
        description, dtype = _DATA_PARAMETERS[data_name]
        if value is None:
            raise ValueError(f"estimator {name!r} needs {description}")
        value = np.asarray(value, dtype=dtype)
        if value.shape != rewards.shape:
            raise ValueError(f"{data_name} shape {value.shape} != rewards shape {rewards.shape}")
        options[data_name] = value
    return np.asarray(estimator(rewards, group_ids, **options), dtype=np.float32)


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
    Why: the policy's decision state has a part that every stratum (task domain) shares, and that part is pushed
    towards each route by the sum of the route's advantages over the whole batch, so a route that pays well in one
    stratum is pushed up in all of them. Balanced, that sum is zero for every route: a stratum learns only how much
    more or less a route pays there than across the batch. The price: a route that is best everywhere is not learned
    as such, and a batch of one stratum learns nothing; a probe of the spillover between strata, not a default.
    A fraction between 0 and 1 trades the two: with strata whose decision states share a part rho of their direction,
    the push a route gets in one stratum from the others' advantages and the bias lambda puts on its own contrasts
    cancel at one lambda, which grows with rho (for F strata of equal similarity, lambda = F rho / (1 + (F - 1) rho)).
    """
    advantages = _checked_route_adjustment(advantages, routes, fraction)
    routed = [route is not None for route in routes]
    return np.where(routed, advantages - fraction * _route_means(advantages, routes), advantages).astype(np.float32)


def pool_routes_by_stratum(
    advantages, routes: Sequence[Hashable | None], strata: Sequence[Hashable], fraction: float = 1.0
) -> np.ndarray:
    """Each completion's advantage moved a fraction of the way to its route's mean advantage within its stratum.

    A'_i = (1 - lambda) A_i + lambda * mean_{j: stratum_j = stratum_i, route_j = route_i} A_j with lambda = `fraction`
    in [0, 1]; a completion without a route (`None`) keeps A_i.
    Why: a question's own advantage says which worker did best on that question, and a policy that routes question
    by question fits those per-question wins on the train file. Where two workers are near-equal over a stratum (a
    task domain), the wins a question's draws give it are noise that does not carry to unseen questions, and the
    greedy routes of the test file end split between the two at random. Pooled (lambda = 1), every completion of a
    stratum that took a route carries that route's lead over the stratum's batch: the stratum moves as one, as a
    bandit over its workers would, and settles on one worker. A route's sum of advantages over the batch, and so the
    push on the part of the decision state that the strata share, is the same as without pooling. The price: where
    the best worker differs from question to question within a stratum in a way the policy could learn, pooling
    hides it.
    """
    advantages = _checked_route_adjustment(advantages, routes, fraction)
    if len(strata) != advantages.size:
        raise ValueError(f"{len(strata)} strata for advantages of shape {advantages.shape}")
    keys = [None if route is None else (stratum, route) for route, stratum in zip(routes, strata)]
    return ((1.0 - fraction) * advantages + fraction * _route_means(advantages, keys)).astype(np.float32)


RouteWeighting = Literal["none", "inverse_propensity"]


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


def zero_variance_groups(rewards, group_ids) -> tuple[np.ndarray, int]:
    """Dynamic sampling (DAPO): which samples to keep, and how many groups were dropped.

    A group whose rewards are all equal gives every member a zero advantage under the group-relative estimators,
    so it only dilutes the batch; the returned boolean mask keeps the samples of every other group.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    group_ids = np.asarray(group_ids)
    if group_ids.shape != rewards.shape or rewards.ndim != 1:
        raise ValueError(f"rewards {rewards.shape} and group_ids {group_ids.shape} must be equal-length 1-D arrays")
    index, num_groups = _group_index(group_ids)
    highest = np.full(num_groups, -np.inf)
    lowest = np.full(num_groups, np.inf)
    np.maximum.at(highest, index, rewards)
    np.minimum.at(lowest, index, rewards)
    constant = highest == lowest
    return ~constant[index], int(constant.sum())


def credit_lone_later_rounds(values, group_ids, first_round_rows) -> np.ndarray:
    """Recursion rounds: a later-round row alone in its group takes the value of its episode's first-round row.

    With recursion rounds a batch holds episodes: a first-round row e and the later rounds that follow it, every one
    credited with the episode's reward R_e. Round k >= 1 of question q is grouped with the round-k rows of q's other
    episodes. When only one of q's episodes reached round k (the others ended, e.g. in a format error), its row is
    alone: a group-relative estimator (grpo, dr_grpo, rloo, opo) gives it exactly 0, so it would never train. It
    takes instead its episode's first-round advantage, whose group is q's first rounds F_q (G rows, each credited
    with its own episode's reward):

        grpo      A = (R_e - mean_{j in F_q} R_j) / (std_{j in F_q} R_j + eps)     (std as `std_scaling` says)
        dr_grpo   A =  R_e - mean_{j in F_q} R_j
        rloo      A =  R_e - mean_{j in F_q, j != e} R_j

    so its baseline is its question's mean episode reward (rloo: of the other episodes, so it stays independent of
    the row's own reward). An estimator that ignores groups already gives the row its first round's value (the same
    reward). `values` are advantages, or dynamic sampling's keep mask (a lone row trains when its question's first
    rounds do). `first_round_rows[i]` is the index of row i's episode's first-round row (i itself on the first
    round).
    """
    values = np.asarray(values)
    group_ids = np.asarray(group_ids)
    first_round_rows = np.asarray(first_round_rows)
    if values.ndim != 1 or group_ids.shape != values.shape or first_round_rows.shape != values.shape:
        raise ValueError(
            f"values {values.shape}, group_ids {group_ids.shape} and first_round_rows {first_round_rows.shape} must "
            "be equal-length 1-D arrays"
        )
    if values.size == 0:
        return values
    if np.any((first_round_rows < 0) | (first_round_rows >= values.size)):
        raise ValueError("first_round_rows must index rows of the batch")
    if np.any(first_round_rows[first_round_rows] != first_round_rows):
        raise ValueError("first_round_rows must point at first-round rows (each of which points at itself)")
    index, num_groups = _group_index(group_ids)
    alone = np.bincount(index, minlength=num_groups)[index] == 1
    later = first_round_rows != np.arange(values.size)
    return np.where(alone & later, values[first_round_rows], values)

"""Advantage estimators for group-sampled outcome rewards.

Every estimator maps one scalar reward per completion to one advantage per completion. Completions that answer
the same prompt share a group id. Each estimator is a plain numpy function registered in `ESTIMATORS`; adding one
is one function and one registry line. `compute` is the single entry point the training loop uses.

An estimator's keyword-only parameters are its options (grpo's `std_scaling`, reinforce_pp's `whiten`): `compute`
takes them as a mapping and checks each against the estimator's signature, its name and its annotation (a `Literal`
lists the accepted values; `rl.options`), so a hyperparameter is one keyword-only parameter with a default. `lengths`
and `labels` are not options but data: an estimator that declares one is given the completion lengths or the
completions' labels (one per completion, e.g. its question's task label), required unless the parameter defaults to
None (the REINFORCE++ estimators need lengths only to whiten per token, grpo needs labels only to scale per label).

Advantage transforms (`ADVANTAGE_TRANSFORMS`) run after the estimator, in the order a configuration lists them
(`TransformConfig`, `apply_transforms`): each maps the batch's advantages (and what else the batch carries,
`AdvantageBatch`) to new ones, and may scale the advantage on chosen completion tokens (`Transformed`). Options are
checked as an estimator's are. A package above `rl` registers its own: one function and one registry line.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Hashable, Literal, Mapping, Sequence, get_args

import numpy as np

from rl import options as option_checks

StdScaling = Literal["group", "batch", "label", "none"]
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
    labels: np.ndarray | None = None,
    std_scaling: StdScaling = "group",
    eps: float = 1e-4,
):
    """GRPO (Shao et al. 2024): reward minus its group mean, divided by a standard deviation.

    c_i = r_i - mean_{j in g(i)} r_j, and A_i = c_i / (sigma + eps) with sigma as `std_scaling` says: the group's
    std of r ("group", the original), the whole batch's std of r ("batch": Hu et al. 2025 argue it is less biased
    towards easy/hard prompts), the std of c over the completions that share i's label l(i) ("label"), or none
    (sigma = 1 and no eps, "none"); every std unbiased (ddof=1).
    "label" gives every label (a task, say) advantages of unit variance: a task whose completions differ by a little,
    or where most groups agree, pushes as hard as one with large, consistent differences, instead of being
    outweighed by it through the parameters the tasks share. It needs `labels`, one per completion.
    """
    index, num_groups = _group_index(group_ids)
    centred = rewards - _group_mean(rewards, index, num_groups)
    if std_scaling == "group":
        return centred / (_group_std(rewards, index, num_groups) + eps)
    if std_scaling == "batch":
        std = rewards.std(ddof=1) if rewards.size > 1 else 0.0
        return centred / (std + eps)
    if std_scaling == "label":
        if labels is None:
            raise ValueError("std_scaling='label' needs the completions' labels (one per completion)")
        label_index, num_labels = _group_index(np.asarray(labels))
        return centred / (_group_std(centred, label_index, num_labels) + eps)
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
_DATA_PARAMETERS = {"lengths": ("completion lengths", np.float64), "labels": ("the completions' labels", None)}


def accepted_options(name: str) -> dict[str, Any]:
    """The options estimator `name` takes (its keyword-only parameters but `lengths` and `labels`), each with its
    default."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ESTIMATORS)}")
    return option_checks.accepted_options(ESTIMATORS[name], _DATA_PARAMETERS)


def check_options(name: str, values: Mapping[str, Any]) -> None:
    """Raises ValueError unless every option is one estimator `name` takes, with a value its annotation accepts."""
    accepted_options(name)
    option_checks.check_options("advantage estimator", name, ESTIMATORS[name], values, _DATA_PARAMETERS)


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
    labels=None,
    options: Mapping[str, Any] | None = None,
) -> np.ndarray:
    """Advantages[N] (float32) of estimator `name` for rewards[N] grouped by group_ids[N].

    `options` are the estimator's own keyword arguments (for example `{"std_scaling": "batch"}` for grpo), checked
    by `check_options`. `lengths[N]` (completion lengths) and `labels[N]` (one per completion) reach the
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
    for data_name, value in (("lengths", lengths), ("labels", labels)):
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


# -- advantage transforms: (AdvantageBatch, **options) -> advantages [N] or Transformed. They run after the estimator
# (and after `credit_lone_later_rounds`), in the order `LoopConfig.advantage_transforms` lists them, each on the
# previous one's advantages.


@dataclasses.dataclass(frozen=True)
class AdvantageBatch:
    """What a transform reads, one entry per row of the iteration's batch.

    advantages: [N] float32, the estimator's (and the earlier transforms').
    rewards, group_ids: [N], what the estimator read.
    question_labels: [N], the label of each row's question (`rl.loop.Environment.question_labels`); None when the
        environment has none.
    labels: the environment's labels of each row by name (`rl.loop.Rollout.labels`): `labels[name][i]` is row i's,
        None where the row has none.
    marked_tokens: the completion tokens the environment marks in each row by name (`rl.loop.Rollout.marked_tokens`):
        `marked_tokens[name][i]` are indices into row i's completion (empty where it has none).
    sampler_logprobs: each row's sampler log-probs, one per completion token.
    """

    advantages: np.ndarray
    rewards: np.ndarray
    group_ids: np.ndarray
    question_labels: np.ndarray | None = None
    labels: Mapping[str, Sequence[Hashable | None]] = dataclasses.field(default_factory=dict)
    marked_tokens: Mapping[str, Sequence[Sequence[int]]] = dataclasses.field(default_factory=dict)
    sampler_logprobs: Sequence[Sequence[float]] = ()


@dataclasses.dataclass(frozen=True)
class Transformed:
    """A transform's result: the rows' new advantages [N], and optionally a factor for the advantage on chosen
    completion tokens (`token_indices[i][k]` of row i scaled by `token_factors[i][k]`, applied to the batch's final
    advantages: `rl.trajectories.Trajectories.scaled_token_advantages`) and scalars to log as `advantage/<name>`."""

    advantages: np.ndarray
    token_indices: Sequence[Sequence[int]] | None = None
    token_factors: Sequence[Sequence[float]] | None = None
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.token_indices is None) != (self.token_factors is None):
            raise ValueError("Transformed.token_indices and token_factors come together or not at all")


AdvantageTransform = Callable[..., "np.ndarray | Transformed"]

# Filled by the packages that define transforms (e.g. `conductor.advantages`); rl defines none of its own.
ADVANTAGE_TRANSFORMS: dict[str, AdvantageTransform] = {}


@dataclasses.dataclass(frozen=True)
class TransformConfig:
    """One advantage transform of a run: a name in `ADVANTAGE_TRANSFORMS` and its options (keyword-only parameters),
    checked here."""

    name: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in ADVANTAGE_TRANSFORMS:
            raise ValueError(f"unknown advantage transform {self.name!r}; known: {sorted(ADVANTAGE_TRANSFORMS)}")
        option_checks.check_options("advantage transform", self.name, ADVANTAGE_TRANSFORMS[self.name], self.options)


def apply_transforms(
    transforms: Sequence[TransformConfig], batch: AdvantageBatch
) -> tuple[np.ndarray, list[tuple[Sequence[Sequence[int]], Sequence[Sequence[float]]]], dict[str, float]]:
    """Runs `transforms` in order on `batch`: (the final advantages [N] float32, every token scaling the transforms
    asked for in order, their metrics)."""
    advantages = np.asarray(batch.advantages, dtype=np.float32)
    scalings, metrics = [], {}
    for transform in transforms:
        result = ADVANTAGE_TRANSFORMS[transform.name](dataclasses.replace(batch, advantages=advantages),
                                                      **transform.options)
        if not isinstance(result, Transformed):
            result = Transformed(result)
        advantages = np.asarray(result.advantages, dtype=np.float32)
        if advantages.shape != np.shape(batch.advantages):
            raise ValueError(
                f"advantage transform {transform.name!r} returned shape {advantages.shape} for "
                f"{np.shape(batch.advantages)} rows"
            )
        if result.token_indices is not None:
            scalings.append((result.token_indices, result.token_factors))
        metrics.update(result.metrics)
    return advantages, scalings, metrics


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

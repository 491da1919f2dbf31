"""The GRPO objective as pure functions of [batch, time] arrays.

Conventions: every per-token array is aligned with the token it scores (`logprobs[b, t]` is the log-probability
of `tokens[b, t]`); `loss_mask` marks completion tokens that train. The loss is always

    sum over tokens of token_weight * per_token_term,

where `aggregation_weights` computes the weights from the loss mask *of the whole mini-batch* (its token and
sequence counts). Splitting a mini-batch into micro-batches and summing their losses is then exact: each micro-batch
contributes its own per-token terms with the global weights.

Policy losses are registered by name in `POLICY_LOSSES`, each one function with its formula in its docstring:
adding one is one function and one registry line. Helpers come first; `grpo_loss` at the bottom composes the whole
objective on one screen.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np

from rl.auxiliary import TermConfig, TermInputs

Aggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLEstimator = Literal["k1", "k2", "k3", "k1+", "k2+", "k3+"]
MismatchCorrection = Literal["none", "tis-token", "tis-seq", "mask-token", "mask-seq"]

_AGGREGATIONS = get_args(Aggregation)
_KL_ESTIMATORS = get_args(KLEstimator)
_MISMATCH_CORRECTIONS = get_args(MismatchCorrection)


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Every choice in the objective.

    policy_loss: a name in `POLICY_LOSSES`: "ppo" (token ratio, clipped), "gspo" (sequence ratio, clipped) or
        "cispo" (REINFORCE weighted by the clipped, stop-gradient ratio); each formula is in its function.
    clip_low, clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high]; clip_high > clip_low is DAPO's
        clip-higher. For "gspo" use the paper's small values (about 3e-4, 4e-4).
    dual_clip: None, or c > 1: for negative advantages the PPO loss is capped at -c * A (Ye et al. 2020).
    aggregation: how per-token terms become one number.
        "token-mean": sum / tokens in the mini-batch (DAPO, TRL "dapo"/"bnpo").
        "seq-mean-token-mean": mean over sequences of each sequence's token mean (original GRPO, TRL "grpo").
        "seq-mean-token-sum": mean over sequences of each sequence's token sum.
        "seq-mean-token-sum-norm": token sum / (sequences * norm_length) (Dr. GRPO, TRL "dr_grpo").
    norm_length: the constant length of "seq-mean-token-sum-norm", normally the maximum completion length.
    kl_coef, kl_estimator: KL(policy || reference) penalty per token, with r = pi_ref / pi at the sampled token:
        "k1" = -log r, "k2" = (log r)^2 / 2, "k3" = r - 1 - log r (Schulman 2020). A "+" suffix is the
        straight-through variant: the estimator's value with the gradient of k2, whose expectation is the KL's
        gradient.
    entropy_coef: weight of the entropy bonus (subtracted from the loss).
    mismatch_correction: corrects for the sampler's log-probs differing from the learner's at the same weights,
        with w = pi_learner_old / pi_sampler: "tis-token" multiplies each token by min(w_t, cap), "tis-seq" each
        sequence by min(prod_t w_t, cap) (truncated importance sampling, Yao et al. 2025); "mask-token" drops tokens
        with w_t outside [1/cap, cap], "mask-seq" drops sequences whose geometric-mean w is outside [1/cap, cap].
    auxiliary_terms: further terms added to the loss in this order (`rl.auxiliary`: each a registered function
        with its coefficient, schedule and options; the package above rl that defines one registers it).
    """

    policy_loss: str = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    aggregation: Aggregation = "seq-mean-token-mean"
    norm_length: int | None = None
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    entropy_coef: float = 0.0
    mismatch_correction: MismatchCorrection = "none"
    mismatch_cap: float = 2.0
    auxiliary_terms: tuple[TermConfig, ...] = ()

    def __post_init__(self) -> None:
        def check_choice(name: str, choices: tuple[str, ...]) -> None:
            if getattr(self, name) not in choices:
                raise ValueError(f"LossConfig.{name} must be one of {choices}, got {getattr(self, name)!r}")

        check_choice("policy_loss", tuple(POLICY_LOSSES))
        check_choice("aggregation", _AGGREGATIONS)
        check_choice("kl_estimator", _KL_ESTIMATORS)
        check_choice("mismatch_correction", _MISMATCH_CORRECTIONS)
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(f"LossConfig.clip_low must be in [0, 1), got {self.clip_low}")
        if self.clip_high < 0.0:
            raise ValueError(f"LossConfig.clip_high must be >= 0, got {self.clip_high}")
        if self.dual_clip is not None and (self.policy_loss != "ppo" or self.dual_clip <= 1.0):
            raise ValueError(f"LossConfig.dual_clip needs policy_loss='ppo' and a value > 1, got {self.dual_clip}")
        if self.aggregation == "seq-mean-token-sum-norm" and (self.norm_length is None or self.norm_length < 1):
            raise ValueError("aggregation 'seq-mean-token-sum-norm' needs norm_length >= 1 (the max completion length)")
        if self.kl_coef < 0.0 or self.entropy_coef < 0.0:
            raise ValueError(f"kl_coef and entropy_coef must be >= 0, got {self.kl_coef}, {self.entropy_coef}")
        if self.mismatch_cap <= 1.0:
            raise ValueError(f"LossConfig.mismatch_cap must be > 1, got {self.mismatch_cap}")
        if not all(isinstance(term, TermConfig) for term in self.auxiliary_terms):
            raise ValueError(f"LossConfig.auxiliary_terms must be TermConfigs, got {self.auxiliary_terms!r}")
        names = [term.name for term in self.auxiliary_terms]
        if len(set(names)) != len(names):
            raise ValueError(f"LossConfig.auxiliary_terms names a term twice: {names}")

    def terms_on_at(self, step: int) -> tuple[TermConfig, ...]:
        """The auxiliary terms that weigh anything at optimizer step `step` (a host int) or after it."""
        return tuple(term for term in self.auxiliary_terms if term.is_on_at(step))

    @property
    def token_positions_read(self) -> tuple[str, ...]:
        """The token positions (`Trajectories.token_positions`) the auxiliary terms read, each once, in order."""
        return tuple(dict.fromkeys(name for term in self.auxiliary_terms for name in term.spec.token_positions))

    @property
    def row_labels_read(self) -> tuple[str, ...]:
        """The row labels (`Trajectories.row_labels`) the auxiliary terms read, each once, in order."""
        return tuple(dict.fromkeys(name for term in self.auxiliary_terms for name in term.spec.row_labels))


def aggregation_weights(loss_mask: jax.Array, config: LossConfig) -> jax.Array:
    """Per-token weights [B, T] such that sum(weights * per_token_term) is the configured aggregation.

    Call this on the whole mini-batch. Sequences without any loss token (batch padding) do not count. A numpy mask
    gets numpy weights, computed on the host: no XLA program is compiled for each new batch shape.
    """
    xp = np if isinstance(loss_mask, np.ndarray) else jnp
    mask = loss_mask.astype(xp.float32)
    tokens_per_sequence = mask.sum(axis=1, keepdims=True)
    num_sequences = xp.maximum((tokens_per_sequence > 0).sum(), 1).astype(xp.float32)
    if config.aggregation == "token-mean":
        return mask / xp.maximum(mask.sum(), xp.float32(1.0))
    if config.aggregation == "seq-mean-token-sum":
        return mask / num_sequences
    if config.aggregation == "seq-mean-token-mean":
        return mask / (xp.maximum(tokens_per_sequence, xp.float32(1.0)) * num_sequences)
    return mask / (num_sequences * xp.float32(config.norm_length))


def masked_sequence_mean(values: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Mean of `values` over each sequence's loss tokens, shape [B, 1]."""
    mask = loss_mask.astype(values.dtype)
    return (values * mask).sum(axis=1, keepdims=True) / jnp.maximum(mask.sum(axis=1, keepdims=True), 1.0)


def kl_penalty(logprobs: jax.Array, ref_logprobs: jax.Array, estimator: KLEstimator) -> jax.Array:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1, k2, k3; "+" = straight-through)."""
    log_ratio = ref_logprobs - logprobs
    k2 = 0.5 * log_ratio**2
    if estimator in ("k1", "k1+"):
        value = -log_ratio
    elif estimator in ("k2", "k2+"):
        value = k2
    else:
        value = jnp.exp(log_ratio) - 1.0 - log_ratio
    if estimator.endswith("+"):
        return k2 - jax.lax.stop_gradient(k2) + jax.lax.stop_gradient(value)
    return value


# -- policy losses: (logprobs, old_logprobs, advantages, loss_mask, config) -> (per-token loss [B, T], clip
# indicators {metric name: bool [B, T]}). Every one is a multiple of the advantage, token by token, so a row whose
# advantage is 0 adds nothing to the gradient (what `LearnerConfig.skip_zero_gradient_rows` relies on;
# tests/rl/test_losses.py checks every registered loss). r_t = pi(y_t) / pi_old(y_t), A the row's advantage.

PolicyLossFunction = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]


def _token_log_ratio(logprobs: jax.Array, old_logprobs: jax.Array, loss_mask: jax.Array) -> jax.Array:
    # Masked positions may hold arbitrary log-probs; zero their log-ratio so exp() cannot overflow into NaN.
    return jnp.where(loss_mask, logprobs - old_logprobs, 0.0)


def _clipped_surrogate(log_ratio: jax.Array, advantages: jax.Array, config: LossConfig):
    """PPO's clipped objective on the ratio exp(log_ratio), with its clip indicators and the dual clip."""
    ratio = jnp.exp(log_ratio)
    clipped_ratio = jnp.clip(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    loss = jnp.maximum(-advantages * ratio, -advantages * clipped_ratio)
    clips = {
        "clip/high": (ratio > 1.0 + config.clip_high) & (advantages > 0),
        "clip/low": (ratio < 1.0 - config.clip_low) & (advantages < 0),
    }
    if config.dual_clip is not None:
        dual_bound = -advantages * config.dual_clip
        clips["clip/dual"] = (advantages < 0) & (loss > dual_bound)
        loss = jnp.where(advantages < 0, jnp.minimum(loss, dual_bound), loss)
    return loss, clips


def ppo_loss(logprobs, old_logprobs, advantages, loss_mask, config: LossConfig):
    """PPO's clipped surrogate per token (Schulman et al. 2017):

        loss_t = max(-A r_t, -A clip(r_t, 1 - clip_low, 1 + clip_high))

    clip_high > clip_low is DAPO's clip-higher. With `dual_clip` c, a negative advantage's loss is capped:
    loss_t = min(loss_t, -c A) for A < 0 (Ye et al. 2020).
    """
    return _clipped_surrogate(_token_log_ratio(logprobs, old_logprobs, loss_mask), advantages, config)


def gspo_loss(logprobs, old_logprobs, advantages, loss_mask, config: LossConfig):
    """GSPO (Zheng et al. 2025): PPO's clipped surrogate on the sequence ratio s = exp(mean_t log r_t), shared by
    every token of the sequence:

        loss_t = max(-A s, -A clip(s, 1 - clip_low, 1 + clip_high))

    Use the paper's small clip ranges (about 3e-4, 4e-4).
    """
    log_ratio = masked_sequence_mean(_token_log_ratio(logprobs, old_logprobs, loss_mask), loss_mask)
    return _clipped_surrogate(jnp.broadcast_to(log_ratio, logprobs.shape), advantages, config)


def cispo_loss(logprobs, old_logprobs, advantages, loss_mask, config: LossConfig):
    """CISPO (MiniMax-M1 2025): REINFORCE on the log-probs, each token weighted by its clipped ratio:

        loss_t = -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) A log pi(y_t)

    sg is stop-gradient: the clipped ratio is only a weight, so every token keeps its gradient.
    """
    ratio = jnp.exp(_token_log_ratio(logprobs, old_logprobs, loss_mask))
    clipped_ratio = jnp.clip(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    loss = -jax.lax.stop_gradient(clipped_ratio) * advantages * logprobs
    return loss, {"clip/high": ratio > 1.0 + config.clip_high, "clip/low": ratio < 1.0 - config.clip_low}


POLICY_LOSSES: dict[str, PolicyLossFunction] = {
    "ppo": ppo_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
}


def mismatch_weights(
    old_logprobs: jax.Array, sampler_logprobs: jax.Array, loss_mask: jax.Array, config: LossConfig
) -> jax.Array:
    """Stop-gradient per-token weights [B, T] correcting for sampler/learner mismatch (ones when "none")."""
    log_w = jnp.where(loss_mask, old_logprobs - sampler_logprobs, 0.0)
    log_cap = jnp.log(config.mismatch_cap)
    kind = config.mismatch_correction
    if kind == "none":
        weights = jnp.ones_like(log_w)
    elif kind == "tis-token":
        weights = jnp.exp(jnp.minimum(log_w, log_cap))
    elif kind == "tis-seq":
        sequence_log_w = log_w.sum(axis=1, keepdims=True)
        weights = jnp.broadcast_to(jnp.exp(jnp.minimum(sequence_log_w, log_cap)), log_w.shape)
    elif kind == "mask-token":
        weights = (jnp.abs(log_w) <= log_cap).astype(log_w.dtype)
    else:
        sequence_log_w = masked_sequence_mean(log_w, loss_mask)
        weights = jnp.broadcast_to((jnp.abs(sequence_log_w) <= log_cap).astype(log_w.dtype), log_w.shape)
    return jax.lax.stop_gradient(weights)


def grpo_loss(
    config: LossConfig,
    *,
    logprobs: jax.Array,
    entropy: jax.Array,
    old_logprobs: jax.Array,
    sampler_logprobs: jax.Array,
    ref_logprobs: jax.Array | None,
    advantages: jax.Array,
    loss_mask: jax.Array,
    token_weights: jax.Array,
    num_tokens: jax.Array,
    term_inputs: TermInputs | None = None,
    step: jax.Array | int = 0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The whole objective on one micro-batch at optimizer step `step`: (loss, metrics), each a sum over this
    micro-batch's tokens.

    `token_weights` come from `aggregation_weights` and `num_tokens` is the loss-token count, both of the whole
    mini-batch, so summing loss and metrics over micro-batches gives the mini-batch values exactly. Metrics other
    than the loss parts are token means over the mini-batch, but the auxiliary terms' own, which each term defines.
    `term_inputs` (needed with `auxiliary_terms`) is what the terms read (`rl.auxiliary.TermInputs`); each adds
    coef_t * value to the loss, as `loss/<name>`, after the policy, KL and entropy parts.
    """
    # Padding positions may hold anything; zero them so no exp() there can overflow into inf * 0 = NaN.
    logprobs, entropy, old_logprobs, sampler_logprobs = (
        jnp.where(loss_mask, x, 0.0) for x in (logprobs, entropy, old_logprobs, sampler_logprobs)
    )
    if ref_logprobs is not None:
        ref_logprobs = jnp.where(loss_mask, ref_logprobs, 0.0)
    policy, clips = POLICY_LOSSES[config.policy_loss](logprobs, old_logprobs, advantages, loss_mask, config)
    correction = mismatch_weights(old_logprobs, sampler_logprobs, loss_mask, config)
    per_token = correction * policy
    parts = {"loss/policy": jnp.sum(token_weights * per_token)}
    if config.kl_coef:
        kl = kl_penalty(logprobs, ref_logprobs, config.kl_estimator)
        per_token = per_token + config.kl_coef * kl
        parts["loss/kl"] = config.kl_coef * jnp.sum(token_weights * kl)
    if config.entropy_coef:
        per_token = per_token - config.entropy_coef * entropy
        parts["loss/entropy"] = -config.entropy_coef * jnp.sum(token_weights * entropy)
    loss = jnp.sum(token_weights * per_token)
    term_metrics = {}
    for term in config.auxiliary_terms:
        if term_inputs is None:
            raise ValueError(f"the auxiliary loss term {term.name!r} needs term_inputs")
        value, own_metrics = term.spec.function(term_inputs, **term.kwargs)
        parts[f"loss/{term.name}"] = term.coef_at(step) * value
        loss = loss + parts[f"loss/{term.name}"]
        term_metrics.update(own_metrics)

    def token_mean(values: jax.Array) -> jax.Array:
        return jnp.sum(jnp.where(loss_mask, values, 0.0)) / num_tokens

    sampler_log_ratio = old_logprobs - sampler_logprobs
    metrics = {
        "loss": loss,
        **parts,
        **{name: token_mean(hit.astype(jnp.float32)) for name, hit in clips.items()},
        "entropy": token_mean(entropy),
        "ratio": token_mean(jnp.exp(logprobs - old_logprobs)),
        "mismatch/k3": token_mean(jnp.exp(sampler_log_ratio) - 1.0 - sampler_log_ratio),
        "mismatch/abs_logprob_diff": token_mean(jnp.abs(sampler_log_ratio)),
        "mismatch/weight": token_mean(correction),
    }
    if config.kl_coef:
        metrics["kl"] = token_mean(kl_penalty(logprobs, ref_logprobs, "k3"))
    return loss, metrics | term_metrics

"""The generator contract: what a rollout engine takes and returns (docs/design.md section 3)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Mapping, Protocol, Sequence

FinishReason = Literal["stop", "length", "abort"]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampling settings shared by every generator.

    `top_k <= 0` and `top_p == 1.0` disable those filters. Log-probs returned with a completion are always
    `log_softmax(logits / temperature)` of the unfiltered distribution, the quantity the learner recomputes.
    With a `seed`, row r of a `generate` call (prompt i's completion j, r = i * n + j) draws from its own stream,
    seeded with `seed + r`: a row's samples do not depend on the other prompts of the call, so a batch split over
    several calls samples what it would in one (`rl.loop` splits an iteration's questions over processes).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@dataclasses.dataclass(frozen=True)
class TokenConstraint:
    """Which next tokens a decoding step may write: `only` these ids, or any token except them (`only=False`)."""

    token_ids: tuple[int, ...]
    only: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", tuple(sorted({int(t) for t in self.token_ids})))
        if self.only and not self.token_ids:
            raise ValueError("a constraint that allows only an empty set of tokens leaves nothing to write")


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled continuation, in the generator's own token ids (never re-tokenised downstream). Decoded under a
    token mask, `constraints` holds the constraint each token was sampled under (None: unconstrained), which the
    learner applies to its log-probs (`rl.trajectories.build`); () when decoded without one."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    policy_version: int
    constraints: tuple[TokenConstraint | None, ...] = ()

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.logprobs):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but {len(self.logprobs)} log-probs"
            )
        if self.constraints and len(self.constraints) != len(self.completion_ids):
            raise ValueError(f"{len(self.completion_ids)} completion ids but {len(self.constraints)} constraints")


class TokenMask(Protocol):
    """A grammar over one prompt's completions: the constraint on the next token given the completion so far (None:
    any token). A generator samples from the distribution renormalised over the allowed tokens and reports that
    distribution's log-probs."""

    def constraint(self, completion_ids: Sequence[int]) -> TokenConstraint | None: ...


class Generator(Protocol):
    """A rollout engine: samples `n` completions per prompt and accepts new weights by name. `token_masks`, one per
    prompt (None: unconstrained), constrain its decoding where the engine supports it."""

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, n: int,
        token_masks: Sequence[TokenMask | None] | None = None,
    ) -> list[list[Completion]]: ...

    def update_weights(self, named_tensors: Mapping[str, Any], version: int) -> None: ...

    def close(self) -> None: ...

"""Pure sampling maths on one decoding step's logits, shared by the in-process generator and its tests.

Everything here is a function of tensors: no model, no cache, no state.
"""

from __future__ import annotations

from typing import Sequence

import torch

from rollout.types import TokenConstraint

# A random stream for the whole batch, or one per row (`row_generators`).
Generators = torch.Generator | Sequence[torch.Generator] | None


def sampler_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """`log_softmax(logits / T)` in float32 over the unfiltered vocabulary; greedy (T == 0) reports T = 1.

    This is the quantity the learner recomputes, so top-k / top-p never renormalise it.
    """
    scaled = logits.float()
    if temperature not in (0.0, 1.0):
        scaled = scaled / temperature
    return torch.log_softmax(scaled, dim=-1)


def constrain_logprobs(logprobs: torch.Tensor, constraints: Sequence[TokenConstraint | None]) -> torch.Tensor:
    """Log-probs `[N, V]` renormalised, row by row, over the tokens each row's constraint allows (None: the row as it
    is): the distribution a constrained row samples from, and the one whose log-probs it reports.

    Raises if a constraint leaves a row nothing to write (every allowed token outside the vocabulary or of
    probability zero), rather than sampling from an empty distribution.
    """
    if len(constraints) != logprobs.shape[0]:
        raise ValueError(f"{len(constraints)} constraints for {logprobs.shape[0]} rows")
    if all(constraint is None for constraint in constraints):
        return logprobs
    allowed = torch.ones(logprobs.shape, dtype=torch.bool, device=logprobs.device)
    vocab = logprobs.shape[-1]
    for row, constraint in enumerate(constraints):
        if constraint is None:
            continue
        ids = torch.tensor([t for t in constraint.token_ids if 0 <= t < vocab], dtype=torch.long)
        if constraint.only:
            allowed[row] = False
            allowed[row, ids.to(logprobs.device)] = True
        else:
            allowed[row, ids.to(logprobs.device)] = False
    masked = logprobs.masked_fill(~allowed, float("-inf"))
    normaliser = torch.logsumexp(masked, dim=-1, keepdim=True)
    empty = torch.isneginf(normaliser).squeeze(-1)
    if bool(empty.any()):
        row = int(torch.nonzero(empty)[0])
        raise ValueError(f"row {row}: its token constraint {constraints[row]} leaves no token to write")
    return masked - normaliser


def filter_logits(logits: torch.Tensor, *, top_k: int, top_p: float) -> torch.Tensor:
    """Masks (to -inf) every token outside the top-k and outside the smallest top-p nucleus, row by row.

    Works on tempered logits or on their log-probs alike (same order, same softmax). The most likely token
    always survives, so a row never becomes all -inf.
    """
    filtered = logits
    if 0 < top_k < logits.shape[-1]:
        kth_largest = torch.topk(filtered, top_k, dim=-1).values[..., -1:]
        filtered = filtered.masked_fill(filtered < kth_largest, float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_index = torch.sort(filtered, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # A token is dropped when the tokens strictly more likely than it already cover top_p.
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_index, drop_sorted)
        filtered = filtered.masked_fill(drop, float("-inf"))
    return filtered


def sample_next_tokens(
    logprobs: torch.Tensor,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: Generators,
) -> torch.Tensor:
    """One token per row of the sampler log-probs `[N, V]` (`sampler_logprobs`): argmax when temperature == 0,
    else a draw from their top-k / top-p filtered distribution.

    Sampling from the log-probs the caller reports anyway spares a second softmax per step.
    """
    if temperature == 0:
        return torch.argmax(logprobs, dim=-1)
    if top_k > 0 or top_p < 1.0:
        probs = torch.softmax(filter_logits(logprobs, top_k=top_k, top_p=top_p), dim=-1)
    else:
        probs = logprobs.exp()
    return inverse_cdf_draw(probs, generator)


def row_generators(seed: int, rows: int) -> list[torch.Generator]:
    """One CPU random stream per row, row r's seeded with `seed + r` (as SGLang seeds each request of a batch), so
    that a row draws the same tokens whichever other rows share its batch."""
    return [torch.Generator().manual_seed(seed + row) for row in range(rows)]


def inverse_cdf_draw(probs: torch.Tensor, generator: Generators) -> torch.Tensor:
    """One index per row of `probs[N, V]`, drawn with probability probs[n, i].

    One uniform per row, located in the row's cumulative distribution. (`torch.multinomial` draws one exponential
    per vocabulary entry on the CPU: with a 49k vocabulary that was most of a decoding step.) The uniform lies in
    (0, total], so the first index whose cumulative mass reaches it always has positive probability. With one
    generator per row, row n's uniform comes from the n-th.
    """
    cdf = probs.cumsum(dim=-1)
    if isinstance(generator, Sequence):
        if len(generator) != probs.shape[0]:
            raise ValueError(f"{len(generator)} generators for {probs.shape[0]} rows")
        draws = torch.cat([torch.rand(1, generator=row, dtype=cdf.dtype) for row in generator])
        uniform = 1.0 - draws.to(probs.device)[:, None]
    else:
        uniform = 1.0 - torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cdf.dtype)
    index = torch.searchsorted(cdf, uniform * cdf[:, -1:])
    return index.squeeze(-1).clamp(max=probs.shape[-1] - 1)

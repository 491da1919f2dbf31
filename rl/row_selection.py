"""Which rows of a mini-batch an optimizer step runs through the model, planned on the host from the batch alone.

Neither choice changes the update:
- Skipped rows (`LearnerConfig.skip_zero_gradient_rows`, `rows_to_run`): rows whose loss has no gradient are not
  run: rows without loss tokens, and, when there is no KL or entropy term, rows whose advantage is 0 (a GRPO group
  whose rewards all agree) unless an auxiliary term reads them (`rl.auxiliary`; a term decayed to zero reads none).
  Every policy loss is a multiple of the advantage
  (`rl.losses.POLICY_LOSSES`, each tested for it), so such rows add exactly nothing to the gradient; they still count
  in the aggregation's token and sequence totals, which come from the whole mini-batch. A mini-batch with nothing to
  run still takes its optimizer step, with a zero gradient, because AdamW's momentum moves the parameters anyway.
  Token-mean metrics (entropy, ratio, clip fractions, mismatch) are then over the rows that ran; the update's first
  step always runs, so the learner/sampler mismatch is measured every update.
- Duplicate rows (`LearnerConfig.run_duplicates_once`, `model_rows`): rows identical to an earlier row of their
  prompt block (the same prompt and completion: a sharpening Conductor often writes one workflow several times in a
  group) are not run either: they take that row's log-probs and entropies, and autodiff sums their loss gradients
  into its pass. Each row keeps its own advantage, old and sampler log-probs and aggregation weight.

Both round what they run up to a power of two (of prompt blocks, of distinct rows per block), so few shapes compile,
and both take a floor (`at_least`) that the learner raises to the largest it has run (`LearnerConfig.steady_shapes`).
The plan depends only on the batch and the floor, so every process of a multi-process run makes the same one.
"""

from __future__ import annotations

import math

import numpy as np

from rl.losses import LossConfig
from rl.trajectories import Trajectories


def zero_gradient_rows(batch: Trajectories, loss: LossConfig, step: int = 0) -> np.ndarray:
    """[rows] bool: rows without loss tokens, and, without a KL or entropy term, rows whose advantage is 0 and that no
    auxiliary term on at optimizer step `step` reads (a row holding every token position and row label the term
    declares; a decayed term stays off)."""
    loss_mask = np.asarray(batch.loss_mask)
    no_gradient = ~loss_mask.any(axis=1)
    if not (loss.kl_coef or loss.entropy_coef):
        zero_advantage = ~(loss_mask & (np.asarray(batch.advantages) != 0)).any(axis=1)
        for term in loss.terms_on_at(step):
            read = np.ones_like(zero_advantage)
            for name in term.spec.token_positions:
                read &= np.asarray(batch.token_positions[name]) >= 0
            for name in term.spec.row_labels:
                read &= np.asarray(batch.row_labels[name]) >= 0
            zero_advantage &= ~read
        no_gradient |= zero_advantage
    return no_gradient


def rows_to_run(
    no_gradient: np.ndarray, unit: int, micro_batch_size: int | None, *, first_step: bool, at_least: int = 0
) -> np.ndarray:
    """Indices of the mini-batch rows a step must run, in order, given which rows have no gradient: every unit of
    `unit` rows (a prompt block, widened to split over the data-parallel devices) holding a row with a gradient, then
    units without one up to a power-of-two number of passes (a pass: the lcm of the unit and the micro-batch) and to
    at least `at_least` rows, as far as the mini-batch has them. The update's first step runs at least one unit, to
    measure the learner/sampler mismatch; a step with no row to run runs none, whatever the floor."""
    rows = no_gradient.size
    smallest_run = math.lcm(unit, micro_batch_size or unit)
    has_gradient = ~no_gradient.reshape(-1, unit).all(axis=1)
    needed_rows = max(int(has_gradient.sum()), int(first_step)) * unit
    if needed_rows == 0:
        return np.arange(0)
    run_rows = smallest_run
    while run_rows < max(needed_rows, at_least):
        run_rows *= 2
    units_by_need = np.concatenate([np.flatnonzero(has_gradient), np.flatnonzero(~has_gradient)])
    units = np.sort(units_by_need[: min(run_rows, rows) // unit])
    return (units[:, None] * unit + np.arange(unit)).reshape(-1)


def distinct_rows(
    batch: Trajectories, block: int, rows_per_pass: int, row_multiple: int = 1, at_least: int = 1
) -> tuple[np.ndarray, np.ndarray, int]:
    """The rows a model pass must run so that every row's values come from an identical row (same tokens and
    padding), and where each row finds them. Identical rows have identical log-probs; a sharpening policy repeats
    its completions within a group often.

    Rows are matched within each aligned block of `block` rows (a shared prompt's rows, or a whole pass). Each
    block's distinct rows, in order of first appearance, are padded to `distinct_block` by repeating its first one:
    the smallest power of two, or `block` itself, that holds every block's and `at_least` rows and leaves each pass's
    share
    (`rows_per_pass // block * distinct_block` rows) split into `row_multiple` equal parts. Returns `rows`
    (`[batch_size // block * distinct_block]` indices into the batch), `source` (`[batch_size]`: where in its own
    pass's slice of `rows` each row's twin is) and `distinct_block`.
    """
    batch_size = batch.batch_size
    if block < 1 or rows_per_pass % block or batch_size % rows_per_pass:
        raise ValueError(f"{batch_size} rows do not split into passes of {rows_per_pass} rows in blocks of {block}")
    keyed = [batch.tokens, batch.attention_mask]
    if batch.constraint_ids is not None:  # rows sampled under different constraints have different log-probs
        keyed += [np.reshape(batch.constraint_ids, (batch_size, -1)), batch.constraint_kinds]
    row_keys = np.concatenate([np.asarray(array, dtype=np.int32) for array in keyed], axis=1)
    blocks, twin_in_block = [], np.empty(batch_size, dtype=np.int32)
    for start in range(0, batch_size, block):
        position: dict[bytes, int] = {}  # a row's contents -> their place among the block's distinct rows
        distinct = []
        for row in range(start, start + block):
            key = row_keys[row].tobytes()
            if key not in position:
                position[key] = len(distinct)
                distinct.append(row)
            twin_in_block[row] = position[key]
        blocks.append(distinct)
    largest = max(len(distinct) for distinct in blocks)
    blocks_per_pass = rows_per_pass // block
    sizes = [2**k for k in range(block.bit_length()) if 2**k < block] + [block]
    distinct_block = next(
        size for size in sizes
        if size >= max(largest, at_least) and blocks_per_pass * size % row_multiple == 0 or size == block
    )
    rows = np.concatenate([distinct + distinct[:1] * (distinct_block - len(distinct)) for distinct in blocks])
    block_in_pass = np.arange(batch_size) % rows_per_pass // block
    return rows, block_in_pass * distinct_block + twin_in_block, distinct_block


def model_rows(
    batch: Trajectories, rows_per_pass: int, prompt_block: int, data_parallel: int, *, run_duplicates_once: bool,
    at_least: int = 1,
) -> tuple[np.ndarray, np.ndarray, int]:
    """What the model runs for `batch`: (`run`, the batch rows it runs; `source`, for each batch row the index of
    the run row whose values it takes, within its own pass's slice of `run`; the prompt block of `run`, 1 when rows
    share no prompt). With `run_duplicates_once`, each distinct row of a prompt block (of a pass, when rows share no
    prompt) runs once, padded to at least `at_least` rows per block and so each pass splits over `data_parallel`
    devices; else every row runs."""
    if not run_duplicates_once:
        return np.arange(batch.batch_size), np.arange(batch.batch_size) % rows_per_pass, prompt_block
    block = prompt_block if prompt_block > 1 else rows_per_pass
    run, source, distinct_block = distinct_rows(batch, block, rows_per_pass, data_parallel, at_least)
    return run, source, distinct_block if prompt_block > 1 else 1

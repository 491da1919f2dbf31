"""Which rows an optimizer step runs: rows with no gradient skipped, each distinct row of a block run once."""

import jax.numpy as jnp
import numpy as np
import pytest

from rl import auxiliary, row_selection
from rl.auxiliary import TermConfig, TermSpec
from rl.losses import LossConfig
from rl.trajectories import build


def _two_groups(completions):
    return build(
        prompt_ids=[[1, 2]] * 4 + [[3]] * 4,
        completion_ids=completions,
        sampler_logprobs=[[-1.0] * len(c) for c in completions],
        advantages=[0.0] * 8,
        group_ids=[0] * 4 + [1] * 4,
        pad_id=0,
        length_buckets=(6,),
        completion_buckets=(3,),
    )


@pytest.mark.parametrize(
    "block, rows_per_pass, row_multiple, expected_rows, expected_source, expected_block",
    [
        # Group 0 holds two distinct completions, group 1 three: each is padded to 4 with its first row.
        (4, 8, 1, [0, 1, 0, 0, 4, 5, 7, 4], [0, 1, 0, 1, 4, 5, 4, 6], 4),
        # Passes of one group each: sources count from their own pass's first row.
        (4, 4, 1, [0, 1, 0, 0, 4, 5, 7, 4], [0, 1, 0, 1, 0, 1, 0, 2], 4),
        # Pairs: rows are matched only within their block, so rows 0 and 2, twins in different pairs, both run.
        (2, 8, 1, [0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6, 7], 2),
        # The whole pass as one block (no shared prompt): 5 distinct rows, padded to 8.
        (8, 8, 1, [0, 1, 4, 5, 7, 0, 0, 0], [0, 1, 0, 1, 2, 3, 2, 4], 8),
    ],
)
def test_distinct_rows_run_each_row_of_a_block_once_and_point_every_row_at_its_twin(
    block, rows_per_pass, row_multiple, expected_rows, expected_source, expected_block
):
    # The same completion after a different prompt ([9] after [3] in row 4, after [1, 2] in row 0) is a different row.
    batch = _two_groups([[9], [10, 11], [9], [10, 11], [9], [10], [9], [12]])
    rows, source, distinct_block = row_selection.distinct_rows(batch, block, rows_per_pass, row_multiple)
    assert (rows.tolist(), source.tolist(), distinct_block) == (expected_rows, expected_source, expected_block)
    tokens = np.asarray(batch.tokens)
    run_tokens = tokens[rows].reshape(8 // rows_per_pass, -1, tokens.shape[1])
    for row in range(8):
        np.testing.assert_array_equal(run_tokens[row // rows_per_pass, source[row]], tokens[row])


def test_distinct_rows_pad_each_block_so_that_passes_split_over_the_devices():
    batch = _two_groups([[9]] * 8)
    assert row_selection.distinct_rows(batch, 4, 4)[2] == 1  # one distinct row per group
    rows, source, distinct_block = row_selection.distinct_rows(batch, 4, 4, row_multiple=2)
    assert (rows.tolist(), source.tolist(), distinct_block) == ([0, 0, 4, 4], [0] * 8, 2)
    # A block of 3 identical rows over 2 devices runs 2 of them; over 3, nothing smaller than the block splits.
    three = batch.rows(slice(0, 3))
    assert row_selection.distinct_rows(three, 3, 3, row_multiple=2)[2] == 2
    assert row_selection.distinct_rows(three, 3, 3, row_multiple=3)[2] == 3
    # A floor of 2 rows per block pads each group's one distinct row to 2; no floor exceeds the block.
    rows, source, distinct_block = row_selection.distinct_rows(batch, 4, 4, at_least=2)
    assert (rows.tolist(), source.tolist(), distinct_block) == ([0, 0, 4, 4], [0] * 8, 2)
    assert row_selection.distinct_rows(batch, 4, 4, at_least=8)[2] == 4
    with pytest.raises(ValueError, match="do not split"):
        row_selection.distinct_rows(batch, 3, 8)
    with pytest.raises(ValueError, match="do not split"):
        row_selection.distinct_rows(batch, 4, 3)


def test_zero_gradient_rows_are_those_without_loss_tokens_and_without_kl_or_entropy_those_of_zero_advantage():
    batch = build(
        prompt_ids=[[1]] * 4,
        completion_ids=[[9], [9], [9], [9]],
        sampler_logprobs=[[-1.0]] * 4,
        advantages=[0.5, 0.0, -1.0, 0.0],
        group_ids=[0] * 4,
        pad_id=0,
        length_buckets=(4,),
        completion_buckets=(1,),
    )
    batch = batch.replace(loss_mask=np.asarray(batch.loss_mask) & np.array([[True], [True], [True], [False]]))
    assert row_selection.zero_gradient_rows(batch, LossConfig()).tolist() == [False, True, False, True]
    for loss in (LossConfig(kl_coef=0.1), LossConfig(entropy_coef=0.01)):
        assert row_selection.zero_gradient_rows(batch, loss).tolist() == [False, False, False, True]


def _reads_mark(inputs):
    return jnp.float32(0.0), {}


def _reads_mark_and_flag(inputs):
    return jnp.float32(0.0), {}


@pytest.mark.parametrize("reads_flag", [False, True])
def test_zero_advantage_rows_run_when_an_auxiliary_term_reads_them(monkeypatch, reads_flag):
    monkeypatch.setitem(auxiliary.AUXILIARY_TERMS, "reads_mark", TermSpec(_reads_mark, token_positions=("mark",)))
    monkeypatch.setitem(
        auxiliary.AUXILIARY_TERMS, "reads_mark_and_flag",
        TermSpec(_reads_mark_and_flag, token_positions=("mark",), row_labels=("flag",)),
    )
    name = "reads_mark_and_flag" if reads_flag else "reads_mark"
    batch = build(
        prompt_ids=[[1]] * 5,
        completion_ids=[[9]] * 5,
        sampler_logprobs=[[-1.0]] * 5,
        advantages=[0.0, 0.0, 0.5, 0.0, 0.0],
        group_ids=[0] * 5,
        pad_id=0,
        length_buckets=(4,),
        completion_buckets=(1,),
        row_labels={"flag": [0, 1, 1, 1, -1]},
        token_positions={"mark": [0, -1, 0, 0, 0]},
    )
    batch = batch.replace(loss_mask=np.asarray(batch.loss_mask) & np.array([[True], [True], [True], [False], [True]]))
    # Row 1 has no mark and no advantage; row 3 has no loss token at all; row 4 no flag (read without one).
    loss = LossConfig(auxiliary_terms=(TermConfig(name, 0.01),))
    expected = [False, True, False, True, reads_flag]
    assert row_selection.zero_gradient_rows(batch, loss).tolist() == expected
    assert row_selection.zero_gradient_rows(batch, LossConfig()).tolist() == [True, True, False, True, True]
    # Decaying to zero over 10 optimizer steps: read until step 10, not from then on.
    decaying = LossConfig(auxiliary_terms=(TermConfig(name, 0.01, decay_steps=10),))
    assert row_selection.zero_gradient_rows(batch, decaying, step=9).tolist() == expected
    assert row_selection.zero_gradient_rows(batch, decaying, step=10).tolist() == [True, True, False, True, True]


@pytest.mark.parametrize(
    "no_gradient, unit, micro_batch_size, first_step, expected",
    [
        # Units (pairs) 0 and 3 have a gradient: 4 rows, already a power of two.
        ("..xxxx.x", 2, None, False, [0, 1, 6, 7]),
        # Three rows with a gradient round up to four: the first unit without one is added.
        ("x.xx.x.x", 1, None, False, [0, 1, 4, 6]),
        # A pass is a whole micro-batch of 4 rows.
        ("x.xxxxxx", 1, 4, False, [0, 1, 2, 3]),
        # Rounding up past the mini-batch runs all of it.
        ("......", 2, None, False, [0, 1, 2, 3, 4, 5]),
        # Nothing to run, except on the update's first step, which runs one unit to measure the mismatch.
        ("xxxx", 2, None, False, []),
        ("xxxx", 2, None, True, [0, 1]),
    ],
)
def test_rows_to_run_are_the_units_with_a_gradient_rounded_up_to_a_power_of_two_of_passes(
    no_gradient, unit, micro_batch_size, first_step, expected
):
    mask = np.array([mark == "x" for mark in no_gradient])
    rows = row_selection.rows_to_run(mask, unit, micro_batch_size, first_step=first_step)
    assert rows.tolist() == expected


@pytest.mark.parametrize(
    "no_gradient, at_least, expected",
    [
        ("xx.xxxxx", 4, [0, 1, 2, 3]),  # one unit with a gradient, raised to the floor of 4 rows
        ("xx.xxxxx", 3, [0, 1, 2, 3]),  # a floor between passes rounds up to the next power of two
        ("..xxxx.x", 4, [0, 1, 6, 7]),  # already at the floor
        ("xx.xxxxx", 16, list(range(8))),  # no more than the mini-batch holds
        ("xxxxxxxx", 4, []),  # nothing to run stays nothing, whatever the floor
    ],
)
def test_a_floor_raises_the_rows_run_to_a_power_of_two_at_least_as_large(no_gradient, at_least, expected):
    mask = np.array([mark == "x" for mark in no_gradient])
    assert row_selection.rows_to_run(mask, 2, None, first_step=False, at_least=at_least).tolist() == expected


def test_model_rows_run_every_row_or_each_distinct_row_of_a_prompt_block_once():
    batch = _two_groups([[9], [10, 11], [9], [10, 11], [9], [10], [9], [12]])
    run, source, prompt_block = row_selection.model_rows(batch, 8, 4, 1, run_duplicates_once=False)
    assert (run.tolist(), source.tolist(), prompt_block) == (list(range(8)), list(range(8)), 4)
    run, source, prompt_block = row_selection.model_rows(batch, 4, 4, 1, run_duplicates_once=False)
    assert source.tolist() == [0, 1, 2, 3] * 2, "sources count within their own pass"
    run, source, prompt_block = row_selection.model_rows(batch, 8, 4, 1, run_duplicates_once=True)
    assert (run.tolist(), source.tolist(), prompt_block) == ([0, 1, 0, 0, 4, 5, 7, 4], [0, 1, 0, 1, 4, 5, 4, 6], 4)
    identical = _two_groups([[9]] * 8)
    run, source, prompt_block = row_selection.model_rows(identical, 8, 4, 1, run_duplicates_once=True)
    assert (run.tolist(), source.tolist(), prompt_block) == ([0, 4], [0] * 4 + [1] * 4, 1)
    # Rows that share no prompt are matched over the whole pass, and run whole (a prompt block of 1).
    run, source, prompt_block = row_selection.model_rows(identical, 8, 1, 1, run_duplicates_once=True)
    assert (run.tolist(), source.tolist(), prompt_block) == ([0, 4], [0] * 4 + [1] * 4, 1)

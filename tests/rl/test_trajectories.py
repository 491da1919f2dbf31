"""Building the padded learner batch from generator token ids."""

import re

import jax
import numpy as np
import pytest

from rl.trajectories import Trajectories, bucket_length, build


def _example():
    return build(
        prompt_ids=[[5, 6, 7], [8]],
        completion_ids=[[9, 10], [11, 12, 13, 14]],
        sampler_logprobs=[[-0.5, -1.5], [-0.1, -0.2, -0.3, -0.4]],
        advantages=[1.0, -2.0],
        group_ids=[3, 3],
        pad_id=0,
        length_buckets=(4, 8, 16),
        completion_buckets=(2, 4, 8),
    )


def test_layout_is_left_padded_prompt_then_a_bucketed_completion_block():
    batch = _example()
    # completions of up to 4 tokens -> block of 4; prompt width 3 + 4 = 7 -> bucket 8; block starts at column 4
    assert batch.completion_start == 4
    np.testing.assert_array_equal(batch.tokens, [[0, 5, 6, 7, 9, 10, 0, 0], [0, 0, 0, 8, 11, 12, 13, 14]])
    np.testing.assert_array_equal(batch.positions, [[0, 0, 1, 2, 3, 4, 0, 0], [0, 0, 0, 0, 1, 2, 3, 4]])
    np.testing.assert_array_equal(batch.attention_mask, [[0, 1, 1, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(batch.loss_mask, [[0, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1]])
    np.testing.assert_allclose(batch.sampler_logprobs[0], [0, 0, 0, 0, -0.5, -1.5, 0, 0])
    np.testing.assert_allclose(batch.sampler_logprobs[1], [0, 0, 0, 0, -0.1, -0.2, -0.3, -0.4])
    np.testing.assert_allclose(batch.old_logprobs, batch.sampler_logprobs)
    np.testing.assert_allclose(batch.advantages[0], [0, 0, 0, 0, 1, 1, 0, 0])
    np.testing.assert_allclose(batch.advantages[1], [0, 0, 0, 0, -2, -2, -2, -2])
    np.testing.assert_array_equal(batch.group_ids, [3, 3])
    assert batch.tokens.dtype == np.int32 and batch.positions.dtype == np.int32



def test_scaled_token_advantages_scale_only_the_named_completion_tokens():
    batch = _example()
    scaled = batch.scaled_token_advantages([[1], [0, 3]], [[3.0], [0.5, 2.0]])
    np.testing.assert_allclose(scaled.advantages[0], [0, 0, 0, 0, 1, 3, 0, 0])
    np.testing.assert_allclose(scaled.advantages[1], [0, 0, 0, 0, -1, -2, -2, -4])
    np.testing.assert_allclose(batch.advantages[0], [0, 0, 0, 0, 1, 1, 0, 0]), "the batch itself is unchanged"
    np.testing.assert_array_equal(scaled.tokens, batch.tokens)


@pytest.mark.parametrize(
    "indices, factors, message",
    [
        ([[2], []], [[2.0], []], "row 0: token 2 is not one of its completion's tokens"),
        ([[-1], []], [[2.0], []], "row 0: token -1 is not one of its completion's tokens"),
        ([[0], [4]], [[2.0], [2.0]], "row 1: token 4 is not one of its completion's tokens"),
        ([[0], [1]], [[2.0], []], "row 1: 1 token indices but 0 factors"),
        ([[0]], [[2.0]], "1 rows of token indices and 1 of factors for 2 rows"),
    ],
)
def test_scaled_token_advantages_refuse_tokens_outside_a_completion(indices, factors, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _example().scaled_token_advantages(indices, factors)

def test_is_a_pytree_and_rows_select_sub_batches():
    batch = _example()
    leaves = jax.tree.leaves(batch)
    assert len(leaves) == 8
    doubled = jax.tree.map(lambda x: x * 2, batch)
    assert isinstance(doubled, Trajectories)
    second = batch.rows(slice(1, 2))
    assert second.batch_size == 1 and second.length == 8 and second.completion_start == batch.completion_start
    np.testing.assert_array_equal(second.tokens, batch.tokens[1:2])


def _trimmed(batch: Trajectories) -> Trajectories:
    return batch.columns(*batch.trimmed_columns())


ARRAYS_2D = ("tokens", "positions", "attention_mask", "loss_mask", "old_logprobs", "sampler_logprobs", "advantages")


def test_trimmed_rows_drop_the_prompt_padding_only_a_longer_prompt_needed():
    batch = build(
        prompt_ids=[list(range(1, 11)), [5]],
        completion_ids=[[20, 21], [22]],
        sampler_logprobs=[[-1.0, -2.0], [-3.0]],
        advantages=[1.0, -1.0],
        group_ids=[0, 1],
        pad_id=0,
        length_buckets=(16, 4, 8),
        completion_buckets=(2,),
    )
    assert batch.length == 16 and batch.completion_start == 14 and batch.length_buckets == (4, 8, 16)
    short = _trimmed(batch.rows(slice(1, 2)))
    # prompt 1 + completion block 2 -> bucket 4: the 12 leading columns were padding in this row
    assert short.length == 4 and short.completion_start == 2 and short.length_buckets == batch.length_buckets
    for name in ARRAYS_2D:
        np.testing.assert_array_equal(getattr(short, name), getattr(batch, name)[1:2, 12:], err_msg=name)
    np.testing.assert_array_equal(short.tokens, [[0, 5, 22, 0]])
    np.testing.assert_array_equal(short.group_ids, [1])
    assert batch.trimmed_columns() == (0, 16) and _trimmed(batch) is batch  # the long row needs every column


def _long_and_short_completions(length_buckets):
    return build(
        prompt_ids=[[5, 6, 7], [8, 9, 10]],
        completion_ids=[[20, 21, 22, 23, 24, 25, 26], [27]],
        sampler_logprobs=[[-1.0] * 7, [-3.0]],
        advantages=[1.0, -1.0],
        group_ids=[0, 0],
        pad_id=0,
        length_buckets=length_buckets,
        completion_buckets=(2, 4, 8),
    )


def test_trimmed_rows_drop_the_completion_padding_only_a_longer_completion_needed():
    batch = _long_and_short_completions((8, 16))
    # completions up to 7 -> block 8; prompt 3 + 8 = 11 -> bucket 16; the block starts at column 8
    assert batch.length == 16 and batch.completion_start == 8
    short = _trimmed(batch.rows(slice(1, 2)))
    # one completion token -> block 2; prompt 3 + 2 = 5 -> bucket 8: columns [2, 10) of the row
    assert batch.rows(slice(1, 2)).trimmed_columns() == (2, 10)
    assert short.length == 8 and short.completion_start == 6 and short.completion_buckets == (2, 4, 8)
    for name in ARRAYS_2D:
        np.testing.assert_array_equal(getattr(short, name), getattr(batch, name)[1:2, 2:10], err_msg=name)
    np.testing.assert_array_equal(short.tokens, [[0, 0, 0, 8, 9, 10, 27, 0]])
    np.testing.assert_array_equal(short.loss_mask, [[0, 0, 0, 0, 0, 0, 1, 0]])


def test_a_narrower_completion_block_on_a_wider_length_bucket_is_padded_on_the_left():
    batch = _long_and_short_completions((16,))
    short_row = batch.rows(slice(1, 2))
    # block 2 after prompt 3 still takes the one bucket, 16 columns: the 10 it keeps and 6 of padding before them
    assert short_row.trimmed_columns() == (-6, 10)
    short = _trimmed(short_row)
    assert short.length == 16 and short.completion_start == 14
    np.testing.assert_array_equal(short.tokens, [[0] * 11 + [8, 9, 10, 27, 0]])
    np.testing.assert_array_equal(short.positions, [[0] * 11 + [0, 1, 2, 3, 0]])
    np.testing.assert_array_equal(short.attention_mask, [[0] * 11 + [1, 1, 1, 1, 0]])
    np.testing.assert_array_equal(short.loss_mask, [[0] * 14 + [1, 0]])
    np.testing.assert_allclose(short.advantages, [[0] * 14 + [-1, 0]])
    np.testing.assert_allclose(short.sampler_logprobs, [[0] * 14 + [-3, 0]])


def test_floors_widen_the_completion_block_on_the_right_and_lengthen_the_row_on_the_left():
    batch = _long_and_short_completions((8, 16, 32))
    short_row = batch.rows(slice(1, 2))
    assert short_row.trimmed_columns() == (2, 10)  # block 2, bucket 8: no floor
    # A block of at least 16 columns (8 past the batch's last) after prompt 3: bucket 32, 8 columns of it before the
    # batch's first.
    assert short_row.trimmed_columns(min_width=16) == (-8, 24)
    # A row of at least 16 columns keeps its block of 2.
    assert short_row.trimmed_columns(min_length=16) == (-6, 10)
    wide = short_row.columns(-8, 24)
    assert wide.length == 32 and wide.completion_start == 16
    np.testing.assert_array_equal(wide.tokens, [[0] * 13 + [8, 9, 10, 27] + [0] * 15])
    np.testing.assert_array_equal(wide.positions, [[0] * 13 + [0, 1, 2, 3] + [0] * 15])
    np.testing.assert_array_equal(wide.loss_mask, [[0] * 16 + [1] + [0] * 15])
    np.testing.assert_array_equal(wide.attention_mask, [[0] * 13 + [1] * 4 + [0] * 15])
    np.testing.assert_allclose(wide.sampler_logprobs, [[0] * 16 + [-3] + [0] * 15])


@pytest.mark.parametrize("start, stop", [(9, 16), (0, 8), (-2, 8)])
def test_columns_that_do_not_hold_the_completion_start_are_refused(start, stop):
    batch = _long_and_short_completions((8, 16))
    with pytest.raises(ValueError, match="do not hold the completion block's start 8"):
        batch.columns(start, stop)


@pytest.mark.parametrize(
    "prompts, rows_per_pass, expected",
    [
        ([[1, 2]] * 4 + [[3]] * 4, 8, 4),  # two groups of four
        ([[1, 2]] * 4 + [[3]] * 4, 2, 2),  # a pass of two rows holds half a group
        ([[1, 2]] * 2 + [[3]] * 6, 8, 2),  # aligned pairs share a prompt, aligned fours do not
        ([[1, 2]] * 3 + [[3]] * 5, 8, 1),  # groups of three are not aligned with any divisor of 8
        ([[0, 2], [2]] * 4, 8, 1),  # the same ids after padding ([0, 0, 2]), but one 0 is a real token
    ],
)
def test_prompt_block_is_the_largest_aligned_run_of_one_prompt(prompts, rows_per_pass, expected):
    batch = build(
        prompt_ids=prompts,
        completion_ids=[[9]] * 8,
        sampler_logprobs=[[-1.0]] * 8,
        advantages=[0.0] * 8,
        group_ids=[0] * 8,
        pad_id=0,
        length_buckets=(4,),
        completion_buckets=(1,),
    )
    assert batch.prompt_block_size(rows_per_pass) == expected
    with pytest.raises(ValueError, match="do not split"):
        batch.prompt_block_size(3)


def test_row_labels_and_token_positions_ride_with_their_rows_and_padding_rows_have_none():
    batch = build(
        prompt_ids=[[5, 6, 7], [8], [9, 9]],
        completion_ids=[[9, 10], [11, 12, 13, 14], [15]],
        sampler_logprobs=[[-0.5, -1.5], [-0.1, -0.2, -0.3, -0.4], [-0.7]],
        advantages=[1.0, -2.0, 0.5],
        group_ids=[3, 3, 4],
        pad_id=0,
        length_buckets=(8, 16),
        completion_buckets=(4, 8),
        row_labels={"kind": [2, 0, -1]},
        token_positions={"mark": [1, 3, -1], "other": [0, -1, 0]},
    )
    np.testing.assert_array_equal(batch.row_labels["kind"], [2, 0, -1])
    np.testing.assert_array_equal(batch.token_positions["mark"], [1, 3, -1])
    assert batch.token_positions["mark"].dtype == np.int32
    np.testing.assert_array_equal(batch.rows(np.array([1, 0])).row_labels["kind"], [0, 2])
    padded = batch.rows(slice(0, 2)).padded(4)
    np.testing.assert_array_equal(padded.row_labels["kind"], [2, 0, -1, -1])
    np.testing.assert_array_equal(padded.token_positions["mark"], [1, 3, -1, -1])
    np.testing.assert_array_equal(padded.token_positions["other"], [0, -1, -1, -1])
    # [batch] arrays keep their rows when the columns are trimmed.
    np.testing.assert_array_equal(batch.columns(*batch.trimmed_columns()).token_positions["mark"], [1, 3, -1])
    assert _example().row_labels == {} and _example().padded(3).token_positions == {}


def test_lengths_snap_to_buckets():
    assert bucket_length(5, (4, 8, 16)) == 8
    assert bucket_length(8, (16, 8)) == 8
    with pytest.raises(ValueError, match="largest length bucket"):
        bucket_length(17, (4, 8, 16))


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(prompt_ids=[[], [8]]), "empty prompt"),
        (dict(sampler_logprobs=[[-0.5], [-0.1, -0.2, -0.3, -0.4]]), "log-probs"),
        (dict(completion_ids=[[9, 10]]), "completion_ids"),
        (dict(advantages=[1.0]), "advantages"),
        (dict(advantages=[1.0, np.inf]), "finite"),
        (dict(group_ids=[[3, 3]]), "group_ids"),
        (dict(length_buckets=(4,)), "largest length bucket"),
        (dict(row_labels={"kind": [0, 1, 1]}), "row label 'kind' must have shape"),
        (dict(row_labels={"kind": [0, -2]}), "row label 'kind': labels are >= 0, or -1 for none"),
        (dict(token_positions={"mark": [0, 1, 1]}), "token position 'mark' must have shape"),
        (dict(token_positions={"mark": [2, 1]}), "row 0: token position 'mark' 2 is outside its 2-token completion"),
        (dict(token_positions={"mark": [0, -2]}), "row 1: token position 'mark' -2 is outside"),
    ],
)
def test_bad_input_is_rejected(changes, message):
    arguments = dict(
        prompt_ids=[[5, 6, 7], [8]],
        completion_ids=[[9, 10], [11, 12, 13, 14]],
        sampler_logprobs=[[-0.5, -1.5], [-0.1, -0.2, -0.3, -0.4]],
        advantages=[1.0, -2.0],
        group_ids=[3, 3],
        pad_id=0,
        length_buckets=(8, 16),
        completion_buckets=(4, 8),
    )
    arguments.update(changes)
    with pytest.raises(ValueError, match=message):
        build(**arguments)

"""Bucketing and flattening in SGLang's FlattenedTensorBucket layout, and atomic checkpoint directories."""

from __future__ import annotations

import pytest
import torch

from rollout.transport import (
    bucket_request,
    flatten_bucket,
    layout_from_request,
    plan_buckets,
    read_checkpoint,
    rendezvous_url,
    unflatten_bucket,
    write_checkpoint,
)


def test_plan_buckets_fills_in_order_and_lets_a_large_tensor_travel_alone():
    tensors = {
        "a": torch.zeros(10),  # 40 bytes
        "b": torch.zeros(10),  # 40
        "big": torch.zeros(50),  # 200, over the limit on its own
        "c": torch.zeros(5, dtype=torch.bfloat16),  # 10
        "d": torch.zeros(20),  # 80
    }
    assert plan_buckets(tensors, bucket_bytes=100) == [["a", "b"], ["big"], ["c", "d"]]
    assert plan_buckets(tensors, bucket_bytes=10_000) == [["a", "b", "big", "c", "d"]]
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(tensors, bucket_bytes=0)


def test_flattened_bucket_holds_each_tensors_bytes_back_to_back_largest_elements_first_and_round_trips():
    matrix = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    named = [("h", torch.tensor([1.5, -2.0, 0.25], dtype=torch.bfloat16)), ("m", matrix.T), ("i", torch.tensor([7])),
             ("g", torch.tensor([3.0], dtype=torch.bfloat16))]
    flat, layout = flatten_bucket(named)

    assert flat.dtype == torch.uint8 and flat.numel() == 3 * 2 + 6 * 4 + 8 + 2
    # In the given order "m" would start at byte 6 and "i" at 30, offsets SGLang's receiver refuses.
    assert [(e.name, e.start, e.end, e.shape) for e in layout] == [
        ("i", 0, 8, (1,)), ("m", 8, 32, (3, 2)), ("h", 32, 38, (3,)), ("g", 38, 40, (1,))
    ]
    torch.testing.assert_close(flat[8:32].view(torch.float32), matrix.T.contiguous().reshape(-1))
    request = bucket_request(layout)
    assert request == {"names": ["i", "m", "h", "g"], "dtypes": ["int64", "float32", "bfloat16", "bfloat16"],
                       "shapes": [[1], [3, 2], [3], [1]]}
    rebuilt = unflatten_bucket(flat.clone(), layout_from_request(request))
    for name, tensor in named:
        torch.testing.assert_close(rebuilt[name], tensor)


def test_bad_buckets_are_rejected():
    with pytest.raises(ValueError, match="empty bucket"):
        flatten_bucket([])
    flat, layout = flatten_bucket([("x", torch.zeros(4))])
    with pytest.raises(ValueError, match="holds 12 bytes"):
        unflatten_bucket(flat[:12], layout)
    with pytest.raises(ValueError, match="uint8"):
        unflatten_bucket(flat.view(torch.float32), layout)
    misaligned = {"names": ["h", "m"], "dtypes": ["bfloat16", "float32"], "shapes": [[3], [2]]}
    with pytest.raises(ValueError, match="m \\(torch.float32\\) would start at byte 6, not a multiple of its element size 4"):
        layout_from_request(misaligned)


def test_checkpoint_directory_appears_whole_and_is_never_overwritten(tmp_path):
    config_dir = tmp_path / "model"
    config_dir.mkdir()
    (config_dir / "config.json").write_text("{}")
    tensors = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3).T, "b": torch.ones(2, dtype=torch.bfloat16)}
    out = write_checkpoint(tensors, tmp_path / "ckpt" / "v1", config_dir=config_dir)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["v1"]
    loaded = read_checkpoint(out)
    for name, tensor in tensors.items():
        torch.testing.assert_close(loaded[name], tensor)
    with pytest.raises(FileExistsError, match="already exists"):
        write_checkpoint(tensors, out)


def test_the_rendezvous_url_brackets_an_ipv6_address_as_sglangs_servers_do():
    assert rendezvous_url("10.0.0.1", 29600) == "tcp://10.0.0.1:29600"
    assert rendezvous_url("learner.local", 29600) == "tcp://learner.local:29600"
    assert rendezvous_url("fd00::1", 29600) == "tcp://[fd00::1]:29600"

"""TensorBoard event files and metrics.jsonl, read back with TensorBoard's own EventAccumulator."""

import json

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from rl.metrics import MetricsWriter


def test_scalars_histograms_and_text_read_back(tmp_path):
    writer = MetricsWriter(tmp_path)
    samples = np.random.default_rng(0).normal(size=500)
    writer.log(1, {"loss": 0.5, "reward/mean": 0.25}, histograms={"advantages": samples}, texts={"sample": "hi"})
    writer.log(2, {"loss": 0.125, "reward/mean": float("nan")})
    writer.close()

    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    events.Reload()
    tags = events.Tags()["tensors"]
    assert {"loss", "reward/mean", "advantages", "sample"} <= set(tags)
    loss = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in events.Tensors("loss")]
    assert loss == [(1, 0.5), (2, 0.125)]
    assert events.SummaryMetadata("loss").plugin_data.plugin_name == "scalars"
    histogram = tensor_util.make_ndarray(events.Tensors("advantages")[0].tensor_proto)  # [bucket, (left, right, count)]
    assert events.SummaryMetadata("advantages").plugin_data.plugin_name == "histograms"
    assert histogram[:, 2].sum() == 500
    np.testing.assert_allclose(histogram[0, 0], samples.min())
    np.testing.assert_allclose(histogram[-1, 1], samples.max())
    text = tensor_util.make_ndarray(events.Tensors("sample")[0].tensor_proto)
    assert events.SummaryMetadata("sample").plugin_data.plugin_name == "text"
    assert text.item() == b"hi"

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 1 and records[0]["loss"] == 0.5 and records[0]["sample"] == "hi"
    np.testing.assert_allclose(records[0]["advantages/mean"], samples.mean())
    assert records[1] == {"step": 2, "loss": 0.125, "reward/mean": None}


def test_appends_to_existing_jsonl(tmp_path):
    for step in range(2):
        writer = MetricsWriter(tmp_path)
        writer.log(step, {"x": step})
        writer.close()
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_non_numeric_scalar_is_rejected(tmp_path):
    writer = MetricsWriter(tmp_path)
    with pytest.raises((TypeError, ValueError)):
        writer.log(0, {"loss": "high"})
    writer.close()

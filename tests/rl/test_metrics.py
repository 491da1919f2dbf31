"""TensorBoard event files and metrics.jsonl, read back with TensorBoard's own EventAccumulator."""

import json

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from rl.metrics import MetricsWriter, first_and_last_fifth, read_metrics


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


def test_read_metrics_returns_what_was_logged_in_step_order(tmp_path):
    writer = MetricsWriter(tmp_path)
    for step in (1, 2, 3):
        writer.log(step, {"reward/mean": step / 10})
    writer.close()
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(reversed(path.read_text().splitlines(keepends=True))))  # the reader must sort
    assert [(r["step"], r["reward/mean"]) for r in read_metrics(tmp_path)] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        read_metrics(tmp_path / "absent")


def test_first_and_last_fifth_average_a_fifth_of_the_run_and_at_least_one_value():
    assert first_and_last_fifth([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]) == (1.5, 9.5)
    assert first_and_last_fifth([4.0, 0.0, 8.0]) == (4.0, 8.0)
    assert first_and_last_fifth([2.5]) == (2.5, 2.5)
    with pytest.raises(ValueError, match="no values"):
        first_and_last_fifth([])

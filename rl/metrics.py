"""Training metrics to TensorBoard event files and to a JSON-lines file, with no TensorFlow.

Summaries are built with the TensorBoard plugins' own protobuf helpers and written with TensorBoard's
`EventFileWriter`, so `tensorboard --logdir` reads them as usual.
"""

from __future__ import annotations

import json
import math
import pathlib
import time
from typing import Mapping, Sequence

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.histogram import summary_v2 as histogram_summary
from tensorboard.plugins.scalar import summary_v2 as scalar_summary
from tensorboard.plugins.text import summary_v2 as text_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

HISTOGRAM_BUCKETS = 30


def _json_number(value: float) -> float | None:
    """JSON has no NaN or infinity; those are written as null."""
    return value if math.isfinite(value) else None


def read_metrics(logdir: str | pathlib.Path) -> list[dict[str, float | None]]:
    """The records `MetricsWriter` wrote to `<logdir>/metrics.jsonl`, in step order."""
    path = pathlib.Path(logdir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: has the run at {logdir} started?")
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted(records, key=lambda record: record["step"])


def first_and_last_fifth(values: Sequence[float]) -> tuple[float, float]:
    """Means of the first and of the last fifth (at least one value each) of per-iteration values: a run's
    before and after, less noisy than its first and last iteration."""
    if len(values) == 0:
        raise ValueError("no values")
    part = max(len(values) // 5, 1)
    return float(np.mean(values[:part])), float(np.mean(values[-part:]))


class MetricsWriter:
    """`log(step, scalars, histograms, texts)` appends to TensorBoard events and one JSON object to metrics.jsonl."""

    def __init__(self, logdir: str | pathlib.Path):
        self.logdir = pathlib.Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._events = EventFileWriter(str(self.logdir))
        fresh = not (self.logdir / "metrics.jsonl").exists()
        self._jsonl = open(self.logdir / "metrics.jsonl", "a", encoding="utf-8")
        if fresh:
            # TensorBoard takes a run's first SessionLog START as its opening and any later one (`discard_after`) as
            # a restart, on which it purges the orphaned events of the steps that will be logged again.
            self._session_log(0)
        self._rollouts = open(self.logdir / "rollouts.jsonl", "a", encoding="utf-8")

    def log(
        self,
        step: int,
        scalars: Mapping[str, float],
        histograms: Mapping[str, object] | None = None,
        texts: Mapping[str, str] | None = None,
    ) -> None:
        """Scalars are numbers; histograms are arrays of samples; texts are (markdown) strings."""
        histograms = histograms or {}
        texts = texts or {}
        scalar_values = {tag: float(value) for tag, value in scalars.items()}
        histogram_values = {tag: np.asarray(values, dtype=np.float64).ravel() for tag, values in histograms.items()}
        summary = summary_pb2.Summary()
        for tag, value in scalar_values.items():
            summary.MergeFrom(scalar_summary.scalar_pb(tag, value))
        for tag, values in histogram_values.items():
            summary.MergeFrom(histogram_summary.histogram_pb(tag, values, buckets=HISTOGRAM_BUCKETS))
        for tag, text in texts.items():
            summary.MergeFrom(text_summary.text_pb(tag, str(text)))
        self._events.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))
        record = {
            "step": int(step),
            **{tag: _json_number(value) for tag, value in scalar_values.items()},
            **{
                f"{tag}/mean": _json_number(float(values.mean())) if values.size else None
                for tag, values in histogram_values.items()
            },
            **{tag: str(text) for tag, text in texts.items()},
        }
        self._jsonl.write(json.dumps(record, sort_keys=True) + "\n")
        self._jsonl.flush()
        # A killed run must not lose what it logged: TensorBoard's writer would otherwise hold events for minutes.
        self._events.flush()

    def log_rollouts(self, step: int, records: list[dict]) -> None:
        """Appends one JSON object per rollout (each tagged with `step`) to logdir/rollouts.jsonl."""
        for record in records:
            self._rollouts.write(json.dumps({"step": int(step), **record}, sort_keys=True) + "\n")
        self._rollouts.flush()

    def discard_after(self, step: int) -> None:
        """Forgets everything logged for steps after `step`, so a run resumed from checkpoint `step` logs no step twice.

        The JSON-lines files are rewritten without those records; TensorBoard gets a SessionLog START event at
        `step + 1`, on which its readers purge the orphaned events of later steps written before the restart.
        """
        for name in ("metrics.jsonl", "rollouts.jsonl"):
            handle = self._jsonl if name == "metrics.jsonl" else self._rollouts
            handle.flush()
            path = self.logdir / name
            kept = [line for line in path.read_text(encoding="utf-8").splitlines(keepends=True)
                    if json.loads(line)["step"] <= step]
            path.write_text("".join(kept), encoding="utf-8")  # the append-mode handles write at the new end
        self._session_log(int(step) + 1)

    def _session_log(self, step: int) -> None:
        start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
        self._events.add_event(event_pb2.Event(wall_time=time.time(), step=step, session_log=start))
        self._events.flush()

    def flush(self) -> None:
        self._events.flush()
        self._jsonl.flush()
        self._rollouts.flush()

    def close(self) -> None:
        self._events.close()
        self._jsonl.close()
        self._rollouts.close()

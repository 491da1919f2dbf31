"""curves.png of a sweep: each value's mean curve over seeds with its 95% band, and each seed's figures."""

from __future__ import annotations

import pathlib
from typing import Any, Mapping, Sequence

import numpy as np

from sweeps.stats import CONFIDENCE, FIGURES, mean_interval


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to `window` values (the first points average what exists so far)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    sums = np.cumsum(np.concatenate([[0.0], values]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def curve_band(curves: Sequence[np.ndarray], window: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(mean, 95% half-width or None with one seed) per iteration over the seeds' smoothed curves, cut to the
    shortest so an unfinished seed does not skew the mean."""
    length = min(len(curve) for curve in curves)
    stacked = np.stack([moving_average(curve[:length], window) for curve in curves])
    if len(curves) == 1:
        return stacked[0], None
    return stacked.mean(axis=0), np.array([mean_interval(column, CONFIDENCE)["half_width"] for column in stacked.T])


def _padded_limits(values: Sequence[float]) -> tuple[float, float]:
    low, high = float(np.nanmin(values)), float(np.nanmax(values))
    pad = 0.1 * (high - low) or 0.05 * max(abs(high), 1e-3)
    return low - pad, high + pad


def plot(summary: Mapping[str, Any], curves: Mapping[str, Sequence[np.ndarray]], path: pathlib.Path,
         window: int) -> None:
    """Top: one panel per value, its mean curve over seeds with the 95% band, the other values' means in grey behind.
    Bottom: each seed's greedy score, last fifth and area (dots) with the mean and 95% interval (bar) per value. The
    axes span the seeds' own figures: a band or bar that leaves them is wider than anything the seeds showed."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    values = list(summary["values"])
    columns = min(len(values), 5)
    rows = -(-len(values) // columns)
    figure = pyplot.figure(figsize=(max(3.0 * columns, 9.0), 2.6 * rows + 3.2))
    width = len(FIGURES)  # grid columns per value: the bottom row holds one panel per figure, `columns` wide each
    grid = figure.add_gridspec(rows + 1, width * columns)
    bands = {value: curve_band(runs, window) for value, runs in curves.items() if runs}
    smoothed = [moving_average(curve, window) for runs in curves.values() for curve in runs]
    curve_limits = _padded_limits(np.concatenate(smoothed)) if smoothed else (0.0, 1.0)
    first_axis = None
    for index, value in enumerate(values):
        axis = figure.add_subplot(grid[index // columns, width * (index % columns):width * (index % columns + 1)],
                                  sharex=first_axis, sharey=first_axis)
        first_axis = first_axis or axis
        for other, (mean, _) in bands.items():
            if other != value:
                axis.plot(np.arange(1, len(mean) + 1), mean, color="0.75", linewidth=1)
        if value in bands:
            mean, half_width = bands[value]
            steps = np.arange(1, len(mean) + 1)
            axis.plot(steps, mean, color=f"C{index}", linewidth=2)
            if half_width is not None:
                axis.fill_between(steps, mean - half_width, mean + half_width, color=f"C{index}", alpha=0.25)
        seeds = len(curves.get(value, []))
        axis.set_title(f"{value} ({seeds} seed{'' if seeds == 1 else 's'})", fontsize=10)
        axis.grid(alpha=0.3)
        if index % columns == 0:
            axis.set_ylabel(summary["metric"] + (f", {window}-iteration mean" if window > 1 else ""), fontsize=8)
        if index // columns == rows - 1:
            axis.set_xlabel("iteration", fontsize=8)
    if first_axis is not None:
        first_axis.set_ylim(*curve_limits)
    labels = (f"greedy score ({summary['score']})", f"{summary['metric']}, last fifth",
              f"{summary['metric']}, mean over iterations")
    for panel, (figure_name, label) in enumerate(zip(FIGURES, labels)):
        axis = figure.add_subplot(grid[rows, panel * columns:(panel + 1) * columns])
        points_seen = []
        for index, value in enumerate(values):
            entry = summary["values"][value]
            points = [f[figure_name] for f in entry["seeds"].values() if f[figure_name] is not None]
            points_seen += points
            axis.scatter([index - 0.1] * len(points), points, color=f"C{index}", s=18, alpha=0.8)
            interval = entry[figure_name]
            if interval["mean"] is not None:
                axis.errorbar(index + 0.1, interval["mean"], yerr=interval["half_width"] or 0.0, fmt="o",
                              color="black", capsize=4, markersize=4)
        if points_seen:
            axis.set_ylim(*_padded_limits(points_seen))
        axis.set_xticks(range(len(values)), values, rotation=20, ha="right", fontsize=8)
        axis.set_title(label, fontsize=10)
        axis.grid(alpha=0.3, axis="y")
    figure.suptitle(f"--{summary['flag']} sweep: mean over seeds with its {100 * summary['confidence']:.0f}% t "
                    "interval; dots are seeds")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    pyplot.close(figure)

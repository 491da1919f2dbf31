"""What a sweep's finished runs show, per value over seeds: each figure's mean with its Student t interval, every
pair of values' Welch and paired t-tests with Holm's adjustment and the seeds a test would need to find the
difference the pair shows (`summarize`), and the markdown table of it all."""

from __future__ import annotations

import itertools
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np

from rl.metrics import first_and_last_fifth, read_metrics
from sweeps.grid import Run, Sweep
from sweeps.records import is_finished, run_record

CONFIDENCE = 0.95


def _sample_variance(values: Sequence[float]) -> float:
    """Exactly 0 for values equal up to rounding: numpy's variance of [0.7, 0.7, 0.7] is 1e-32, and differences like
    0.8 - 0.7 and 0.9 - 0.8 differ in their last bit, which would make a t statistic of 1e15."""
    spread = np.ptp(values)
    return 0.0 if spread <= 1e-12 * np.max(np.abs(values)) else float(np.var(values, ddof=1))


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> dict[str, Any]:
    """The mean of `values` (one per seed) with its two-sided Student t interval: mean ± t(confidence, n-1) · s/√n,
    s the sample standard deviation. With one value there is no interval (its bounds are None); with none, no mean."""
    from scipy import stats

    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "half_width": None, "low": None, "high": None}
    mean = float(np.mean(values))
    if n == 1:
        return {"n": 1, "mean": mean, "std": None, "half_width": None, "low": None, "high": None}
    std = float(np.sqrt(_sample_variance(values)))
    half_width = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * std / np.sqrt(n))
    return {"n": n, "mean": mean, "std": std, "half_width": half_width, "low": mean - half_width,
            "high": mean + half_width}


def welch_test(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Welch's two-sided t-test of equal means (no equal-variance assumption): `difference` is mean(a) - mean(b),
    `t` and `df` Welch's statistic and Welch-Satterthwaite degrees of freedom, `p` the two-sided p-value. `p` is
    None, with `note` saying why, where the test is undefined: fewer than two values in a group, or no variance in
    either."""
    from scipy import stats

    difference = float(np.mean(a) - np.mean(b)) if len(a) and len(b) else None
    if len(a) < 2 or len(b) < 2:
        return {"difference": difference, "t": None, "df": None, "p": None,
                "note": f"needs two or more values per group, has {len(a)} and {len(b)}"}
    var_a, var_b = _sample_variance(a) / len(a), _sample_variance(b) / len(b)
    if var_a + var_b == 0:
        return {"difference": difference, "t": None, "df": None, "p": None,
                "note": "no variance in either group"}
    t = difference / np.sqrt(var_a + var_b)
    df = (var_a + var_b) ** 2 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
    return {"difference": difference, "t": float(t), "df": float(df), "p": float(2 * stats.t.sf(abs(t), df)),
            "note": None}


def holm_adjusted(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (controls the chance of any false positive among them):
    the i-th smallest of m becomes max over j <= i of min(1, (m - j + 1) · p_(j)). None (an undefined test) stays None
    and does not count in m."""
    defined = sorted((p, index) for index, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(defined):
        running = max(running, min(1.0, (len(defined) - rank) * p))
        adjusted[index] = running
    return adjusted


def paired_test(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """The two-sided paired t-test of a[i] - b[i] = 0 (a and b matched: the same seed's run under two settings,
    which share the seed's world, warm start and draws until their policies part). `p` is None, with `note`, where
    there are fewer than two pairs or the differences do not vary."""
    from scipy import stats

    if len(a) != len(b):
        raise ValueError(f"paired samples need equal lengths, got {len(a)} and {len(b)}")
    differences = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    mean = float(differences.mean()) if len(differences) else None
    if len(differences) < 2:
        return {"difference": mean, "t": None, "df": None, "p": None,
                "note": f"needs two or more pairs, has {len(differences)}"}
    variance = _sample_variance(differences)
    if variance == 0:
        note = "equal in every pair" if mean == 0 else "the same difference in every pair"
        return {"difference": mean, "t": None, "df": None, "p": None, "note": note}
    t = mean / np.sqrt(variance / len(differences))
    df = len(differences) - 1
    return {"difference": mean, "t": float(t), "df": float(df), "p": float(2 * stats.t.sf(abs(t), df)), "note": None}


def seeds_for_power(effect_size: float, alpha: float, power: float = 0.8, limit: int = 10_000) -> int | None:
    """Seeds per value a two-sided two-sample t-test at level `alpha` needs to find a standardised difference
    `effect_size` (Cohen's d: difference of the means over the pooled standard deviation) with probability `power`:
    the smallest n >= 2 with P(|T| > t(1 - alpha/2, 2n - 2)) >= power, T noncentral t with 2n - 2 degrees of freedom
    and noncentrality d * sqrt(n / 2). None where d is 0 or n would pass `limit`."""
    from scipy import stats

    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha} and {power}")
    d = abs(effect_size)
    if not np.isfinite(d) or d == 0:
        return None

    def achieved(n: int) -> float:
        df, shift = 2 * n - 2, d * np.sqrt(n / 2)
        critical = stats.t.ppf(1 - alpha / 2, df)
        return float(stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift))

    low, high = 2, 2
    while achieved(high) < power:  # doubling, then bisection: power rises with n
        low, high = high, 2 * high
        if high > 2 * limit:
            return None
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if achieved(middle) < power else (low, middle)
    return high if high <= limit else None


def pooled_effect_size(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Cohen's d of two groups: (mean(a) - mean(b)) / the pooled sample standard deviation. None with fewer than two
    values in a group or no spread in either."""
    if len(a) < 2 or len(b) < 2:
        return None
    pooled = ((len(a) - 1) * _sample_variance(a) + (len(b) - 1) * _sample_variance(b)) / (len(a) + len(b) - 2)
    return None if pooled == 0 else float((np.mean(a) - np.mean(b)) / np.sqrt(pooled))


def read_curve(logdir: pathlib.Path, metric: str) -> np.ndarray:
    """The metric per iteration, in step order, from a run's metrics.jsonl."""
    records = read_metrics(logdir)
    if not records or metric not in records[0]:
        raise KeyError(f"{logdir / 'metrics.jsonl'} has no scalar {metric!r}")
    return np.asarray([np.nan if record[metric] is None else record[metric] for record in records], dtype=np.float64)


def summary_value(summary: Mapping[str, Any], dotted_key: str) -> float | None:
    """`summary["a"]["b"]` for `a.b`; None where a key is absent."""
    value: Any = summary
    for key in dotted_key.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    if isinstance(value, Mapping):
        raise ValueError(f"--score={dotted_key} names a group of the summary ({', '.join(value)}), not a number")
    return None if value is None else float(value)


def seed_figures(run: Run, score: str, metric: str) -> dict[str, Any]:
    """A finished run's figures: the greedy score, the first and last fifth of the metric, the area under its curve
    (its mean over the iterations: how fast a run got there as well as where), its iterations."""
    recorded = run_record(run)
    curve = read_curve(run.logdir, metric)
    first, last = first_and_last_fifth(curve)
    return {"score": summary_value(recorded["train_summary"], score), "first_fifth": first, "last_fifth": last,
            "area": float(np.nanmean(curve)), "iterations": len(curve), "wall_s": recorded["wall_s"]}


FIGURES = ("score", "last_fifth", "area")
POWER = 0.8


def summarize(sweep: Sweep, runs: Sequence[Run], score: str, metric: str, alpha: float) -> dict[str, Any]:
    """Per value: each finished seed's figures, the mean and 95% interval of each figure over seeds, the seeds not
    finished; per figure, every pair of values' tests (`pair_tests`)."""
    values: dict[str, Any] = {}
    for value in sweep.values:
        mine = [run for run in runs if run.value == value]
        per_seed = {run.seed: seed_figures(run, score, metric) for run in mine if is_finished(run)}
        values[value] = {
            "seeds": per_seed,
            "unfinished_seeds": [run.seed for run in mine if not is_finished(run)],
            **{figure: mean_interval([f[figure] for f in per_seed.values() if f[figure] is not None], CONFIDENCE)
               for figure in FIGURES},
        }
    pairs = {figure: pair_tests(sweep.values, values, figure, alpha) for figure in FIGURES}
    return {
        "flag": sweep.flag, "score": score, "metric": metric, "confidence": CONFIDENCE, "alpha": alpha,
        "interval": "two-sided Student t interval of the mean over seeds",
        "tests": {"welch": "Welch's two-sided t-test over each value's seeds",
                  "paired": "two-sided paired t-test over the seeds both values finished"},
        "adjustment": "Holm, over the pairs of values, per figure and test",
        "values": values, "pairs": pairs,
    }


def pair_tests(names: Sequence[str], values: Mapping[str, Any], figure: str, alpha: float) -> list[dict[str, Any]]:
    """Every pair of values' Welch test (the primary one) and paired test of `figure`, Holm-adjusted per test; and
    the pair's effect size (`pooled_effect_size`) with the seeds per value a t-test at alpha / pairs would need to
    find it with probability `POWER`, were it the true one (`seeds_for_power`)."""
    tests = []
    pairs = list(itertools.combinations(names, 2))
    for a, b in pairs:
        seeds_a, seeds_b = ({seed: f[figure] for seed, f in values[v]["seeds"].items() if f[figure] is not None}
                            for v in (a, b))
        shared = sorted(set(seeds_a) & set(seeds_b))
        d = pooled_effect_size(list(seeds_a.values()), list(seeds_b.values()))
        tests.append({
            "a": a, "b": b,
            "welch": welch_test(list(seeds_a.values()), list(seeds_b.values())),
            "paired": {**paired_test([seeds_a[s] for s in shared], [seeds_b[s] for s in shared]), "seeds": shared},
            # at alpha / pairs, the level Holm's first step tests at
            "effect_size": d, "seeds_for_power": None if d is None else seeds_for_power(d, alpha / len(pairs), POWER),
        })
    for kind in ("welch", "paired"):
        for test, adjusted in zip(tests, holm_adjusted([test[kind]["p"] for test in tests])):
            test[kind]["p_holm"] = adjusted
            test[kind]["significant"] = adjusted is not None and adjusted < alpha
    return tests


def _interval_text(interval: Mapping[str, Any]) -> str:
    if interval["mean"] is None:
        return "–"
    if interval["half_width"] is None:
        return f"{interval['mean']:.3f} (one seed: no interval)"
    return f"{interval['mean']:.3f} ± {interval['half_width']:.3f}"


def _p_text(test: Mapping[str, Any]) -> str:
    if test["p"] is None:
        return f"– ({test['note']})"
    return f"{test['p']:.3g} ({test['p_holm']:.3g}){' *' if test['significant'] else ''}"


def markdown_summary(summary: Mapping[str, Any]) -> str:
    flag, values = summary["flag"], summary["values"]
    lines = [
        f"| {flag} | seeds | greedy score `{summary['score']}` | `{summary['metric']}` first fifth | "
        f"`{summary['metric']}` last fifth |",
        "|---|---|---|---|---|",
    ]
    for value, entry in values.items():
        seeds = ",".join(str(seed) for seed in entry["seeds"]) or "none"
        if entry["unfinished_seeds"]:
            seeds += f" (unfinished: {','.join(map(str, entry['unfinished_seeds']))})"
        first = mean_interval([f["first_fifth"] for f in entry["seeds"].values()], summary["confidence"])
        lines.append(f"| {value} | {seeds} | {_interval_text(entry['score'])} | {_interval_text(first)} | "
                     f"{_interval_text(entry['last_fifth'])} |")
    lines += ["", f"Mean ± half-width of the {100 * summary['confidence']:.0f}% {summary['interval']}."]
    titles = {"score": "greedy score", "last_fifth": f"`{summary['metric']}` last fifth",
              "area": f"`{summary['metric']}` area (mean over iterations)"}
    for figure, title in titles.items():
        lines += ["", f"| pair | Δ {title} | Welch p (Holm) | paired p (Holm) | d | seeds for {POWER:.0%} power |",
                  "|---|---|---|---|---|---|"]
        for test in summary["pairs"][figure]:
            difference, d, seeds = test["welch"]["difference"], test["effect_size"], test["seeds_for_power"]
            lines.append(f"| {test['a']} − {test['b']} | {'–' if difference is None else f'{difference:+.3f}'} | "
                         f"{_p_text(test['welch'])} | {_p_text(test['paired'])} | "
                         f"{'–' if d is None else f'{d:+.2f}'} | {'–' if seeds is None else seeds} |")
    tests = summary["tests"]
    lines += ["", f"Δ: difference of the means. Welch: {tests['welch']}; paired: {tests['paired']} (runs of one seed "
                  f"share its world, warm start and draws until their policies part). p-values adjusted by "
                  f"{summary['adjustment']}; * significant at α = {summary['alpha']}. With a few seeds per value only "
                  "large differences can be detected: a difference that is not significant is not shown to be zero. "
                  "d: Cohen's d (the difference over the pooled standard deviation); seeds for power: per value, for "
                  "a two-sided t-test at α / pairs to find that d, were it the true one."]
    return "\n".join(lines) + "\n"

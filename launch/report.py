"""The report of every method's outcomes: `summarize` (accuracy per domain and on average with its standard error
over repeats, worker tokens, calls, USD and steps per question, format validity, the workers chosen), then markdown,
a plot and results.json (`write_report`); and the statistics of a figure over seeds (`mean_interval`, `welch_test`,
`paired_test`, `holm_adjusted`) that launch.compare reports."""

from __future__ import annotations

import collections
import json
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np

from launch.outcomes import Outcome


def _stderr(values: Sequence[float]) -> float | None:
    return float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else None


def summarize(outcomes: Sequence[Outcome], worker_names: Sequence[str]) -> dict[str, Any]:
    """The report of one method. Per domain: the mean of every metric over questions and repeats, and
    `correct_stderr`, the standard error of the domain's accuracy over repeats (None with one repeat). `average`:
    the unweighted mean of the domain means, `correct_stderr` over repeats of that average. `workers_chosen`: the
    fraction of all steps run by each worker; `workers_chosen_by_domain`: the same within each domain."""
    if not outcomes:
        raise ValueError("no outcomes to summarize")
    by_domain: dict[str, list[Outcome]] = collections.defaultdict(list)
    for outcome in outcomes:
        by_domain[outcome.domain].append(outcome)
    repeats = sorted({outcome.repeat for outcome in outcomes})
    names = sorted({name for outcome in outcomes for name in outcome.metrics})
    domains: dict[str, dict[str, Any]] = {}
    per_repeat_accuracy: dict[str, list[float]] = {}
    for domain, rows in sorted(by_domain.items()):
        domains[domain] = {name: float(np.mean([row.metrics.get(name, 0.0) for row in rows])) for name in names}
        per_repeat_accuracy[domain] = [
            float(np.mean([row.metrics["correct"] for row in rows if row.repeat == repeat])) for repeat in repeats
        ]
        domains[domain]["correct_stderr"] = _stderr(per_repeat_accuracy[domain])
        domains[domain]["questions"] = len(rows) // len(repeats)
    average = {name: float(np.mean([domains[d][name] for d in domains])) for name in names}
    average_by_repeat = np.mean([per_repeat_accuracy[d] for d in domains], axis=0)
    average["correct_stderr"] = _stderr(list(average_by_repeat))

    def shares(rows: Sequence[Outcome]) -> dict[str, float]:
        counts = collections.Counter(worker for outcome in rows for worker in outcome.workers)
        total_steps = sum(counts.values())
        return {worker_names[w]: counts[w] / total_steps for w in range(len(worker_names)) if counts[w]}

    return {
        "questions": len({outcome.task_id for outcome in outcomes}),
        "repeats": len(repeats),
        "domains": domains,
        "average": average,
        "average_accuracy": average["correct"],
        "average_accuracy_stderr": average["correct_stderr"],
        "workers_chosen": shares(outcomes),
        "workers_chosen_by_domain": {domain: shares(rows) for domain, rows in sorted(by_domain.items())},
    }


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def markdown_report(results: Mapping[str, Mapping[str, Any]], title: str) -> str:
    """Two tables: the averages with costs and workflow shape, then accuracy per task; then workers chosen."""
    domains = sorted({domain for report in results.values() for domain in report["domains"]})
    lines = [
        f"# {title}",
        "",
        "Accuracy in %, ± standard error over repeats; worker tokens, USD, steps (one worker call each) and "
        "provider calls (calls the response cache did not answer) are per question; averages are unweighted over "
        "tasks.",
        "",
        "| method | accuracy | tokens | USD | steps | provider calls | valid format |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, report in results.items():
        average = report["average"]
        stderr = average["correct_stderr"]
        accuracy = _percent(average["correct"]) + ("" if stderr is None else f" ± {_percent(stderr)}")
        lines.append(
            f"| {method} | {accuracy} | {average.get('tokens', 0.0):.0f} | {average.get('cost_usd', 0.0):.5f} | "
            f"{average['steps']:.2f} | {average.get('worker_calls', 0.0):.2f} | {_percent(average['valid_format'])} |"
        )
    lines += ["", "| method | " + " | ".join(domains) + " |", "|---|" + "---|" * len(domains)]
    for method, report in results.items():
        cells = [_percent(report["domains"][d]["correct"]) if d in report["domains"] else "–" for d in domains]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "Workers chosen (share of all steps, %):", ""]

    def listed(shares: Mapping[str, float]) -> str:
        return ", ".join(f"{name} {_percent(share)}" for name, share in shares.items()) or "no steps"

    for method, report in results.items():
        lines.append(f"- {method}: {listed(report['workers_chosen'])}")
        by_domain = report["workers_chosen_by_domain"]
        if len({listed(shares) for shares in by_domain.values()}) > 1:  # routing that differs between domains
            lines += [f"  - {domain}: {listed(shares)}" for domain, shares in by_domain.items()]
    return "\n".join(lines) + "\n"


def plot_accuracy_tokens(results: Mapping[str, Mapping[str, Any]], path: pathlib.Path, title: str) -> None:
    """Side-by-side horizontal bars per method: average accuracy (with standard error) and tokens per question."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    methods = list(results)
    accuracy = [100 * results[m]["average"]["correct"] for m in methods]
    errors = [100 * (results[m]["average"]["correct_stderr"] or 0.0) for m in methods]
    tokens = [results[m]["average"].get("tokens", 0.0) for m in methods]
    height = max(3.0, 0.4 * len(methods) + 1.5)
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(12, height), sharey=True)
    positions = np.arange(len(methods))
    left.barh(positions, accuracy, xerr=errors, color="tab:blue")
    left.set_xlabel("accuracy (%)")
    left.set_yticks(positions, methods)
    left.invert_yaxis()
    right.barh(positions, tokens, color="tab:orange")
    right.set_xlabel("worker tokens per question")
    left.set_xlim(0, 105)
    panels = ((left, accuracy, errors, "{:.1f}"), (right, tokens, [0.0] * len(tokens), "{:.0f}"))
    for axis, values, offsets, fmt in panels:
        for position, value, offset in zip(positions, values, offsets):
            axis.annotate(fmt.format(value), (value + offset, position), xytext=(3, 0), textcoords="offset points",
                          va="center", fontsize=8)  # fmt: skip
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def write_report(results: Mapping[str, Mapping[str, Any]], out_dir: pathlib.Path, title: str) -> dict[str, str]:
    """results.json, results.md and accuracy_tokens.png under `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "results.json",
        "markdown": out_dir / "results.md",
        "plot": out_dir / "accuracy_tokens.png",
    }
    paths["json"].write_text(json.dumps({"title": title, "methods": results}, indent=2, sort_keys=False))
    paths["markdown"].write_text(markdown_report(results, title))
    plot_accuracy_tokens(results, paths["plot"], title)
    return {kind: str(path) for kind, path in paths.items()}


# -- statistics over seeds ------------------------------------------------------------------------------------------


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

"""A linear model of the spillover between families on the replay world, and where `--balance_routes` cancels it.

    python -m scripts.replay_spillover_model [--c0=0.45,0.7]

The model: family f's decision state is h_f = s + u_f, a part s that all F families share (a fraction rho of the
squared norm) and a part u_f of its own, the u orthogonal; a route r's logit is read from h by one vector w_r. GRPO
with `--std_scaling=stratum` gives family f's completions on route r the advantage a_f(r) = (Q_f(r) - mean_r'
Q_f(r')) / sigma_f in expectation (Q the train file's mean grades, sigma_f the std of a grade minus its question's
mean grade); balanced by a fraction lambda, a_f(r) - lambda m(r) with m(r) = mean_f a_f(r). A step on w_r moves
family f's logit of r by (1 - rho) a_f(r) + rho sum_g A_g(r), which is proportional to

    a_f(r) + c m(r),   c = c0 - lambda (1 + c0),   c0 = F rho / (1 - rho),

so each family drifts towards argmax_r a_f(r) + c m(r). The script prints the train-best route of every family, the
interval of c over which each family keeps it, the test-file average of the routing the model predicts at each c, and
for each c0 given (what unbalanced runs suggest) the lambdas that put c where every family keeps its best route.
A sketch for choosing lambda, not a prediction of a run: deeper layers, Adam and sampling noise are left out.
"""

from __future__ import annotations

import argparse

import numpy as np

from env.workers.replay import ROUTERDC_MODELS
from scripts.routerdc_family_margins import TEST_FILES, TRAIN_FILES, family_grades

C_GRID = np.round(np.arange(-2.0, 2.0001, 0.05), 2)


def stratum_advantages(train: dict[str, np.ndarray]) -> tuple[list[str], np.ndarray]:
    """Families in order and a[f, r], each family's expected route advantage under stratum std scaling."""
    families = sorted(train)
    rows = []
    for family in families:
        grades = train[family]
        centred = grades - grades.mean(axis=1, keepdims=True)
        means = grades.mean(axis=0)
        rows.append((means - means.mean()) / centred.std(ddof=1))
    return families, np.asarray(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--c0", default="0.45,0.7", help="comma-separated c0 values to solve lambda for")
    args = parser.parse_args()
    train, test = family_grades(TRAIN_FILES), family_grades(TEST_FILES)
    families, advantages = stratum_advantages(train)
    shared = advantages.mean(axis=0)
    names = [model.split("/")[1][:14] for model in ROUTERDC_MODELS]
    best = advantages.argmax(axis=1)
    test_means = np.asarray([test[family].mean(axis=0) for family in families])
    print("m(r), the mean stratum advantage of each route over the families:")
    print("  " + "  ".join(f"{name} {value:+.3f}" for name, value in zip(names, shared)))

    preferred = (advantages[:, None, :] + C_GRID[None, :, None] * shared).argmax(axis=2)  # [family, c]
    keeps = preferred == best[:, None]
    print("\nfamily         train best      keeps it for c in")
    for f, family in enumerate(families):
        kept = C_GRID[keeps[f]]
        print(f"{family:14} {names[best[f]]:15} [{kept.min():+.2f}, {kept.max():+.2f}] (of {C_GRID[0]}..{C_GRID[-1]})")
    every = C_GRID[keeps.all(axis=0)]
    print(f"every family keeps its best for c in [{every.min():+.2f}, {every.max():+.2f}]")

    print("\n    c   predicted routes (test average)")
    for c in C_GRID[::5]:
        routes = (advantages + c * shared).argmax(axis=1)
        score = 100 * np.mean([test_means[f, r] for f, r in enumerate(routes)])
        chosen = ", ".join(f"{family} {names[r]}" for family, r in zip(families, routes))
        print(f"{c:+5.2f}   {chosen}  ({score:.2f})")

    for c0 in map(float, args.c0.split(",")):
        low, high = (c0 - every.max()) / (1 + c0), (c0 - every.min()) / (1 + c0)
        rho = c0 / (len(families) + c0)
        print(f"\nc0 = {c0:g} (rho = {rho:.3f}): lambda in [{max(low, 0):.2f}, {min(high, 1):.2f}] keeps every best")


if __name__ == "__main__":
    main()

"""Distinct completions per group and per iteration in a run's rollouts.jsonl: how many rows
`LearnerConfig.run_duplicates_once` leaves the model to run.
    python scripts/count_duplicate_completions.py [LOGDIR]     (default runs/quickstart)
Prints, per iteration, each group's distinct count, their sum and the iteration's row count. Used by
docs/log/2026-11-26-run-duplicates-once.md.
"""

import collections
import json
import sys
from pathlib import Path

logdir = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/quickstart")
rows = [json.loads(line) for line in (logdir / "rollouts.jsonl").read_text(encoding="utf-8").splitlines() if line]
groups = collections.defaultdict(list)
for row in rows:
    groups[(row["step"], row["question"], row["round"])].append(tuple(row["completion_ids"]))
for step in sorted({s for s, _, _ in groups}):
    sizes = [len(g) for (s, _, _), g in groups.items() if s == step]
    distinct = [len(set(g)) for (s, _, _), g in groups.items() if s == step]
    print(step, distinct, sum(distinct), "distinct of", sum(sizes))

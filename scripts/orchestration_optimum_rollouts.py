"""The per-question optimum's workflows on the orchestration world's training split, as a run log the rollouts
teacher reads: the full-information supervised Conductor, which bounds what RL can reach with the same model.

    python -m scripts.orchestration_optimum_rollouts --out=runs/optimum_rollouts.jsonl
    python -m launch.train --flagfile=launch/configs/orchestration.cfg --warm_start_teacher=rollouts \\
        --warm_start_rollouts=runs/optimum_rollouts.jsonl --iterations=1 --eval_warm_start --logdir=runs/ceiling

(the summary's warm_start_eval is the supervised Conductor's greedy figures on --eval_tasks). Each line is one
training question (its index in the split, as the run numbers them) with its optimum's completion token ids, with
launch/configs/orchestration.cfg's world, reward and step limit, and reward 1 so that every line is kept.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from conductor.loop_environment import completion_text
from env.orchestration import OrchestrationWorldConfig
from env.worlds import build_world
from models import zoo
from models.tokenizer import load_tokenizer
from scripts.orchestration_world import ANSWER_MODEL, MAX_STEPS, REWARD


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    world = build_world(OrchestrationWorldConfig(answer_model=ANSWER_MODEL, split="train"), REWARD, MAX_STEPS)
    tokenizer = load_tokenizer(zoo.smollm2_135m_instruct_tokenizer())  # the tiny Conductor's
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # runs/ in a fresh clone
    with open(args.out, "w", encoding="utf-8") as out:
        for question, task in enumerate(world.tasks):
            text = completion_text(world.orchestration.per_question(task).workflow, "binary")
            ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
            out.write(json.dumps({"question": question, "round": 0, "reward": 1.0, "completion_ids": ids}) + "\n")
    print(f"{len(world.tasks)} optimum workflows -> {args.out}")


if __name__ == "__main__":
    main()

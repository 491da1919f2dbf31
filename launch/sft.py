"""Supervised format warm-start of the Conductor: `python -m launch.sft [--flags]`.

Teachers: `templates` (single worker, plan -> solve -> verify, fan-out + aggregate, with workers drawn uniformly, so
the student writes valid workflows and routes at random), `rollouts` (rejection-sampling fine-tuning on the
high-reward completions a training run logged to its rollouts.jsonl) or `world` (rejection-sampling fine-tuning
against the world itself: template workflows executed and graded now, each weighted by its grade; see
`world_examples`). Before and after, it samples the Conductor on
a few questions and reports the fraction of completions that parse as workflows. The result is an HF directory
(`--sft_out`) that `--conductor` accepts. `launch.train --warm_start_steps=N` runs the same warm-start in-process.

`--sft_domain_probe_weight` > 0 trains, beside the likelihood, a linear probe (discarded afterwards) that predicts
the question's domain from the hidden state where the first worker id is chosen (see `rl.supervised`): the student still
routes uniformly, but its decision state carries the domain, so RL can learn per-domain routing from there.

Launched on several hosts as one job (`launch/distributed.py`), every process fits the same examples on one device
of its own (the supervised trainer has no mesh; a warm-start is small), the processes take process 0's result, and
process 0 writes it.
"""

from __future__ import annotations

from launch.host_memory import retain_freed_memory

# First, before JAX and torch start their threads; run as a program, restart with glibc tunables
# (launch/host_memory.py).
retain_freed_memory(restart=__name__ == "__main__")

import dataclasses
import json
import logging
import pathlib
import random
import re
from typing import Any, Mapping, Sequence

from absl import app, flags

from env.policies import TEMPLATES, random_template
from env.prompts import CONDUCTOR_PREFIX
from env.workflow import Workflow, WorkflowFormatError, parse_workflow, render_workflow
from launch import common, console, distributed
from launch.loop_environment import TokenizedConductorEnv
from models import hf_io
from rl.learner import OptimizerConfig
from rl.loop import question_order
from rl.supervised import Example, SFTConfig, SupervisedTrainer
from rollout.types import SamplingParams

_STEPS = flags.DEFINE_integer("sft_steps", 100, "Supervised steps.")
_LR = flags.DEFINE_float("sft_lr", 3e-4, "Supervised peak learning rate (reached after warmup; --sft_lr_schedule).")
_WARMUP = flags.DEFINE_integer("sft_warmup_steps", 10, "Linear warmup steps of the supervised learning rate.")
_LR_SCHEDULE = flags.DEFINE_enum(
    "sft_lr_schedule", "constant", ["constant", "cosine"],
    "After warmup: a constant rate, or a cosine decay to 0 at the last step (the student then settles on the "
    "teacher's average over many batches, e.g. uniform routing, rather than on the last few batches' draws).",
)
_BATCH = flags.DEFINE_integer("sft_batch_size", 8, "Supervised examples per step.")
_TEACHER = flags.DEFINE_enum(
    "sft_teacher", "templates", ["templates", "rollouts", "world"], "Where the targets come from."
)
_TEMPLATES = flags.DEFINE_list("sft_templates", list(TEMPLATES), "Template policies of the templates teacher.")
_ROLLOUTS = flags.DEFINE_string("sft_rollouts", None, "A run's rollouts.jsonl (teacher=rollouts).")
_MIN_REWARD = flags.DEFINE_float("sft_min_reward", 1.0, "Keep logged rollouts with at least this reward.")
_VALIDITY_SAMPLES = flags.DEFINE_integer("sft_validity_samples", 32, "Samples drawn to measure format validity.")
_DOMAIN_PROBE_WEIGHT = flags.DEFINE_float(
    "sft_domain_probe_weight", 0.0,
    "Weight of a discarded linear probe's domain cross-entropy at the first worker-id decision (0: no probe).",
    lower_bound=0.0,
)
_WORLD_WEIGHTS = flags.DEFINE_enum(
    "sft_world_weights", "grade", ["grade", "advantage"],
    "How the world teacher weights a route: by its grade, or by how far its grade exceeds the mean grade of the "
    "question's routes (routes at or under the mean get 0).",
)
_OUT = flags.DEFINE_string("sft_out", "runs/sft/conductor", "Where the warm-started Conductor is written (HF dir).")

log = logging.getLogger(__name__)


def completion_ids(tokenizer: Any, text: str) -> tuple[int, ...]:
    """The tokens of a target completion, ending with EOS so the Conductor learns to stop."""
    return tuple(tokenizer.encode(text, add_special_tokens=False)) + (tokenizer.eos_token_id,)


_FIRST_WORKER_RE = re.compile(r"model_id\s*=\s*\[\s*(\d)")


def first_worker_token(tokenizer: Any, ids: Sequence[int]) -> int | None:
    """Index of the completion token that holds the first worker id of `model_id = [...]` (None without one).

    Decoded prefixes only grow as tokens are added, so a binary search finds the first prefix that reaches the id.
    """
    match = _FIRST_WORKER_RE.search(tokenizer.decode(list(ids), skip_special_tokens=True))
    if match is None:
        return None
    low, high = 0, len(ids) - 1
    while low < high:
        middle = (low + high) // 2
        if len(tokenizer.decode(list(ids[: middle + 1]), skip_special_tokens=True)) > match.start(1):
            high = middle
        else:
            low = middle + 1
    return low


def domain_labels(world: TokenizedConductorEnv) -> dict[str, int]:
    """Each task domain of the world, numbered in sorted order (the probe's classes)."""
    return {domain: index for index, domain in enumerate(sorted({task.domain for task in world.tasks}))}


def make_example(
    world: TokenizedConductorEnv, question: int, ids: Sequence[int], labels: Mapping[str, int] | None
) -> Example:
    """A (prompt, completion) example; with `labels`, labelled with the question's domain at the first worker id."""
    prompt = tuple(world.prompt_ids(question))
    index = first_worker_token(world.tokenizer, ids) if labels is not None else None
    if index is None:
        return Example(prompt, tuple(ids))
    return Example(prompt, tuple(ids), index, labels[world.tasks[question].domain])


def template_examples(world: TokenizedConductorEnv, count: int, rng: random.Random, probe: bool = False) -> list[Example]:
    """`count` (prompt, uniformly routed template workflow) pairs over the world's questions.

    With recursion rounds (`--recursion_rounds` N), each example's round is drawn uniformly from the N + 1, so the
    student learns the format of every prompt an episode shows it: a later round's prompt follows a template
    workflow run in the world, and its target is a new template workflow or, half the time, the three empty lists
    that keep the answer (which to write is left to RL)."""
    pool_size = len(world.env.world.pool)
    access_mode = world.env.config.access_mode
    rounds = world.env.config.recursion_rounds
    labels = domain_labels(world) if probe else None
    examples, earlier_rounds, targets = [], [], []
    for _ in range(count):
        question = rng.randrange(world.num_questions)
        workflow = random_template(pool_size, rng, _TEMPLATES.value)
        ids = completion_ids(world.tokenizer, "\n" + render_workflow(workflow, access_mode))
        if rounds and rng.randrange(rounds + 1):
            kept = rng.random() < 0.5
            target = Workflow(steps=()) if kept else random_template(pool_size, rng, _TEMPLATES.value)
            earlier_rounds.append((question, ids))
            targets.append(completion_ids(world.tokenizer, "\n" + render_workflow(target, access_mode)))
        else:
            examples.append(make_example(world, question, ids, labels))
    if earlier_rounds:
        questions, ids = zip(*earlier_rounds)
        scored = world.score(questions, ids, None, range(len(questions)))
        examples += [Example(tuple(rollout.followup_prompt_ids), target) for rollout, target in zip(scored, targets)]
    return examples


def rollout_examples(world: TokenizedConductorEnv, path: str, min_reward: float, probe: bool = False) -> list[Example]:
    """Logged completions (the generator's own token ids) that earned at least `min_reward`."""
    labels = domain_labels(world) if probe else None
    examples = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            if record["reward"] >= min_reward and record["round"] == 0:
                examples.append(make_example(world, record["question"], record["completion_ids"], labels))
    if not examples:
        raise ValueError(f"{path} has no first-round rollout with reward >= {min_reward}")
    return examples


def world_examples(world: TokenizedConductorEnv, count: int, rng: random.Random, probe: bool = False) -> list[Example]:
    """About `count` template workflows, executed and graded in the world, each weighted by its grade
    (`--sft_world_weights`, `route_weights`).

    Questions come from `rl.loop.question_order` (the task domains in turn with `--stratify_questions`, so a small
    task file is not drowned by a large one); each gets one random template, run once with every pool worker as its
    final (answering) step, so every route's grade on the question is seen (a full-information sample of the routing
    decision). A weighted example counts as that many copies (rl.supervised), so with grade weights and 0/1 grades this
    keeps the right workflows (rejection sampling) and with `--expected_grades` it is reward-weighted regression:
    either way the student learns to route each question in proportion to each worker's chance of answering it, and
    greedy decoding picks the likeliest. A question's routes are consecutive examples, weight 0 included, so the
    trainer keeps them in one batch and encodes their prompt once (a batch of a multiple of the pool size holds
    whole questions).
    """
    pool_size = len(world.env.world.pool)
    access_mode = world.env.config.access_mode
    labels = domain_labels(world) if probe else None
    strata = world.question_strata if common.stratify_questions() else None
    questions, completions = [], []
    for question in question_order(world.num_questions, rng.randrange(2**31), 0, -(-count // pool_size), strata):
        workflow = random_template(pool_size, rng, _TEMPLATES.value)
        for final in range(pool_size):
            steps = (*workflow.steps[:-1], dataclasses.replace(workflow.steps[-1], worker=final))
            text = "\n" + render_workflow(dataclasses.replace(workflow, steps=steps), access_mode)
            questions.append(question)
            completions.append(completion_ids(world.tokenizer, text))
    rollouts = world.score(questions, completions, [None] * len(questions), range(len(questions)))
    grades = [rollout.metrics["correct"] for rollout in rollouts]
    weights = [
        weight
        for start in range(0, len(grades), pool_size)
        for weight in route_weights(grades[start : start + pool_size], _WORLD_WEIGHTS.value)
    ]
    if not any(weight > 0 for weight in weights):
        raise ValueError(f"no template workflow earned a {_WORLD_WEIGHTS.value} weight above 0 in this world")
    return [
        dataclasses.replace(make_example(world, question, ids, labels), weight=weight)
        for question, ids, weight in zip(questions, completions, weights)
    ]


def route_weights(grades: Sequence[float], mode: str) -> list[float]:
    """The world teacher's weights of one question's routes, from their grades.

    "grade" makes the weighted likelihood reward-weighted regression: the student routes a family's questions in
    proportion to each worker's mean grade, so when the workers of a family are close (MMLU: 0.57-0.66) the best
    leads by a log-probability of only ~0.04. "advantage" subtracts the question's mean grade and drops what is left
    under 0, the positive part of a baseline-subtracted reward: a question every worker answers alike then teaches
    nothing about routing, and the best worker's lead on the RouterDC train files grows 2.5-7.5x (BUILD_NOTES.md).
    """
    if mode == "grade":
        return list(grades)
    if mode == "advantage":
        mean = sum(grades) / len(grades)
        return [max(grade - mean, 0.0) for grade in grades]
    raise ValueError(f"unknown route weighting {mode!r}; expected 'grade' or 'advantage'")


def format_validity(generator: Any, world: TokenizedConductorEnv, questions: Sequence[int], samples: int,
                    params: SamplingParams) -> float:
    """Fraction of `samples` completions (spread over `questions`) that parse as a workflow."""
    per_question = -(-samples // len(questions))
    groups = generator.generate([world.prompt_ids(q) for q in questions], params, per_question)
    texts = [world.decode(c.completion_ids) for group in groups for c in group][:samples]
    config = world.env.config
    valid = 0
    for text in texts:
        try:
            parse_workflow(CONDUCTOR_PREFIX + text, len(world.env.world.pool), config.max_steps, config.access_mode)
            valid += 1
        except WorkflowFormatError:
            pass
    return valid / len(texts)


def sft_config(world: TokenizedConductorEnv, steps: int, seed: int) -> SFTConfig:
    """The supervised trainer's config from the flags, for `steps` steps."""
    optimizer = OptimizerConfig(
        learning_rate=_LR.value, schedule=_LR_SCHEDULE.value, warmup_steps=min(_WARMUP.value, steps),
        total_steps=max(steps, 1),
    )
    probe = _DOMAIN_PROBE_WEIGHT.value > 0
    return SFTConfig(
        optimizer=optimizer,
        batch_size=_BATCH.value,
        seed=seed,
        probe_classes=len(domain_labels(world)) if probe else 0,
        probe_weight=_DOMAIN_PROBE_WEIGHT.value,
        share_prompts=common.share_prompts(),
    )


def warm_start(model: Any, world: TokenizedConductorEnv, steps: int, seed: int) -> list[dict[str, float]]:
    """Fits the Conductor in place to the configured teacher for `steps` steps; returns per-step metrics."""
    rng = random.Random(seed)
    probe = _DOMAIN_PROBE_WEIGHT.value > 0
    if _TEACHER.value == "templates":
        examples = template_examples(world, steps * _BATCH.value, rng, probe)
    elif _TEACHER.value == "world":
        examples = world_examples(world, steps * _BATCH.value, rng, probe)
        pool_size = len(world.env.world.pool)
        log.info("world teacher: %d questions x %d routes, mean weight %.3f", len(examples) // pool_size, pool_size,
                 sum(e.weight for e in examples) / len(examples))
        if _BATCH.value % pool_size:
            log.warning("--sft_batch_size=%d is not a multiple of the pool size %d: batches split questions' routes, "
                        "whose prompts are then encoded once per route", _BATCH.value, pool_size)
    else:
        if not _ROLLOUTS.value:
            raise ValueError("--sft_teacher=rollouts needs --sft_rollouts")
        examples = rollout_examples(world, _ROLLOUTS.value, _MIN_REWARD.value, probe)
    trainer = SupervisedTrainer(model, sft_config(world, steps, seed))

    def report(index: int, metrics: dict[str, float]) -> None:
        if (index + 1) % 10 == 0 or index + 1 == steps:
            probe_part = (
                f" probe_loss {metrics['probe_loss']:.4f} probe_accuracy {metrics['probe_accuracy']:.2f}"
                if probe else ""
            )
            log.info("sft step %d/%d nll %.4f grad_norm %.3f%s", index + 1, steps, metrics["nll"],
                     metrics["grad_norm"], probe_part)

    history = trainer.fit(examples, steps, world.tokenizer.pad_token_id or 0, on_step=report)
    return history


def main(argv: list[str]) -> None:
    del argv
    console.configure()
    distributed.initialize()
    out = pathlib.Path(_OUT.value)
    model, tokenizer, model_dir = common.load_conductor(distributed.process_dir(out) / "init")
    world = TokenizedConductorEnv(common.build_env(), tokenizer)
    generator, sync = common.build_generator(model_dir, distributed.process_dir(out))
    probe = list(range(min(8, world.num_questions)))
    # Validity is measured at the sampling settings RL will use (--temperature, --top_p, --top_k, --max_tokens).
    params = common.sampling_params()
    before = format_validity(generator, world, probe, _VALIDITY_SAMPLES.value, params)
    log.info("valid workflows before warm-start: %.1f%% (temperature %g)", 100 * before, params.temperature)
    history = warm_start(model, world, _STEPS.value, common.seed())
    distributed.share_process_zero_weights(model)
    sync(model, 1)
    after = format_validity(generator, world, probe, _VALIDITY_SAMPLES.value, params)
    log.info("valid workflows after %d steps: %.1f%%", _STEPS.value, 100 * after)
    if not distributed.is_main_process():
        generator.close()
        return
    hf_io.save(model, out)
    tokenizer.save_pretrained(out)
    # Its format was checked at these settings, so eval and serve sample it at them (common.conductor_sampling_params).
    common.save_trained_sampling(out, params)
    generator.close()
    print(json.dumps({"valid_before": before, "valid_after": after, "temperature": params.temperature,
                      "final_nll": history[-1]["nll"], "steps": _STEPS.value, "out": str(out)}))


if __name__ == "__main__":
    app.run(main)

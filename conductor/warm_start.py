"""The supervised warm-start of a Conductor (`warm_start`), which `launch.sft` runs on its own and `launch.train
--warm_start_steps=N` before RL, and the format validity `launch.sft` measures before and after it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import random
import shutil
from typing import Any, Sequence

from flax import nnx

from conductor.conductor_env import EnvSpec
from conductor.loop_environment import TokenizedConductorEnv
from conductor.teachers import TeacherConfig, teacher_examples
from env.pools import offered_ids
from env.prompts import CONDUCTOR_PREFIX
from env.rewards import RewardConfig
from env.workflow import WorkflowFormatError, parse_workflow
from models import hf_io
from models.zoo import exclusive
from rl.supervised import Example, SFTConfig, SupervisedTrainer
from rollout.types import SamplingParams

log = logging.getLogger(__name__)


def format_validity(generator: Any, environment: TokenizedConductorEnv, questions: Sequence[int], samples: int,
                    params: SamplingParams) -> float:
    """Fraction of `samples` completions (spread over `questions`) that parse as a workflow."""
    per_question = -(-samples // len(questions))
    groups = generator.generate([environment.prompt_ids(q) for q in questions], params, per_question)
    texts = [(q, environment.decode(c.completion_ids)) for q, group in zip(questions, groups) for c in group][:samples]
    config, world = environment.env.config, environment.env.world
    valid = 0
    for question, text in texts:
        try:
            parse_workflow(CONDUCTOR_PREFIX + text, offered_ids(environment.tasks[question], len(world.pool)),
                           config.max_steps, config.access_mode)  # fmt: skip
            valid += 1
        except WorkflowFormatError:
            pass
    return valid / len(texts)


def masked_examples(environment: TokenizedConductorEnv, examples: Sequence[Example]) -> list[Example]:
    """`examples` with each completion token's constraint under its question's id mask
    (`TokenizedConductorEnv.token_mask`), found by the example's prompt; an example whose prompt is no question's
    first-round prompt (a recursion round's) is left unconstrained."""
    questions = {tuple(environment.prompt_ids(q)): q for q in range(environment.num_questions)}
    constraints: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[Any, ...]] = {}
    masked = []
    for example in examples:
        question = questions.get(tuple(example.prompt_ids))
        if question is None:
            masked.append(example)
            continue
        mask = environment.token_mask(question)
        key = (mask.ids, tuple(example.completion_ids))
        if key not in constraints:
            ids = example.completion_ids
            constraints[key] = tuple(mask.constraint(ids[:k]) for k in range(len(ids)))
        masked.append(dataclasses.replace(example, constraints=constraints[key]))
    return masked


def warm_start(
    model: Any, environment: TokenizedConductorEnv, steps: int, trainer_config: SFTConfig, teacher: TeacherConfig,
) -> list[dict[str, float]]:
    """Fits the Conductor in place to `teacher`'s examples for `steps` steps; returns per-step metrics. Where the
    environment decodes under token masks, each example is scored under its question's mask (`masked_examples`), as
    masked decoding samples."""
    rng = random.Random(trainer_config.seed)
    probe = trainer_config.head is not None
    batch_size = trainer_config.batch_size
    examples = teacher_examples(teacher, environment, steps * batch_size, rng, probe)
    if environment.masked:
        examples = masked_examples(environment, examples)
    if teacher.teacher == "world":
        pool_size = len(environment.env.world.pool)
        log.info("world teacher: %d questions x %d routes, mean weight %.3f", len(examples) // pool_size, pool_size,
                 sum(e.weight for e in examples) / len(examples))
        if batch_size % pool_size:
            log.warning("--warm_start_batch_size=%d is not a multiple of the pool size %d: batches split questions' "
                        "routes, whose prompts are then encoded once per route", batch_size, pool_size)
    trainer = SupervisedTrainer(model, trainer_config)

    def report(index: int, metrics: dict[str, float]) -> None:
        if (index + 1) % 10 == 0 or index + 1 == steps:
            probe_part = (
                f" probe_loss {metrics['probe_loss']:.4f} probe_accuracy {metrics['probe_accuracy']:.2f}"
                f" state_overlap {metrics['state_overlap']:.3f}"
                if probe else ""
            )
            log.info("warm-start step %d/%d nll %.4f grad_norm %.3f%s", index + 1, steps, metrics["nll"],
                     metrics["grad_norm"], probe_part)

    history = trainer.fit(examples, steps, environment.tokenizer.pad_token_id or 0, on_step=report)
    return history


def _key_parts(steps: int, trainer_config: SFTConfig, teacher: TeacherConfig, token_masks: str,
               origin: Sequence[Any]) -> dict[str, Any]:
    return {"steps": steps, "trainer": repr(trainer_config), "teacher": repr(teacher),
            "token_masks": token_masks, "origin": [repr(part) for part in origin]}


def warm_start_origin(conductor_spec: Any, env_spec: EnvSpec, teacher: TeacherConfig) -> tuple[Any, EnvSpec]:
    """The `origin` of a run's warm-start key: the Conductor's spec and the env's, its reward config set to the
    default unless the teacher reads the reward (`TeacherConfig.reads_reward`). No prompt shows the reward, so with the
    other teachers the runs of a reward-shaping sweep (`--usd_penalty`, `--step_penalty`) share their seed's
    warm-start."""
    if teacher.reads_reward:
        return conductor_spec, env_spec
    general = dataclasses.replace(env_spec.config, reward=RewardConfig())
    return conductor_spec, dataclasses.replace(env_spec, config=general)


def warm_start_key(steps: int, trainer_config: SFTConfig, teacher: TeacherConfig, token_masks: str,
                   origin: Sequence[Any]) -> str:
    """The sha256 of everything that decides a warm-start's result: its own settings and `origin`, the configs the
    model and the world it starts from were built from (the Conductor's spec with its seed, the world's spec). Not
    the code: a cache outlives no change to it that its user does not make on purpose. `token_masks` is the
    environment's (`TokenizedConductorEnv.token_masks`)."""
    parts = _key_parts(steps, trainer_config, teacher, token_masks, origin)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def cached_warm_start(
    model: Any, environment: TokenizedConductorEnv, steps: int, trainer_config: SFTConfig, teacher: TeacherConfig,
    origin: Sequence[Any], cache_dir: pathlib.Path,
) -> bool:
    """`warm_start`, through a directory of warm-started weights keyed by `warm_start_key`: where the key's entry
    exists its weights are loaded into `model` in place, bit for bit what the warm-start would have made (the runs of
    a sweep over an RL setting share their seed's warm-start); otherwise the warm-start runs and its weights are
    stored there. Runs that want the same key at once take turns: one computes, the others load. Returns True when
    loaded."""
    key = warm_start_key(steps, trainer_config, teacher, environment.token_masks, origin)
    cache_dir.mkdir(parents=True, exist_ok=True)
    entry = cache_dir / key
    with exclusive(cache_dir / f"{key}.lock"):  # one run warms up a key; the others then load it
        if (entry / "config.json").exists():
            config = model.config
            stored = hf_io.load(entry, dtype=config.dtype, param_dtype=config.param_dtype, remat=config.remat)
            nnx.update(model, nnx.state(stored, nnx.Param))
            log.info("warm-start loaded from %s", entry)
            return True
        warm_start(model, environment, steps, trainer_config, teacher)
        partial = cache_dir / f"{key}.partial.{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        hf_io.save(model, partial)
        parts = _key_parts(steps, trainer_config, teacher, environment.token_masks, origin)
        (partial / "warm_start_key.json").write_text(json.dumps(parts, indent=1, sort_keys=True) + "\n")
        os.replace(partial, entry)  # whole or absent: a run killed while saving leaves no entry to load
        log.info("warm-start stored in %s", entry)
        return False

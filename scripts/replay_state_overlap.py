"""The overlap of the task domains' decision states over a training run's checkpoints.

    python -m scripts.replay_state_overlap --flagfile=launch/configs/replay_rl.cfg --logdir=RUN_DIR [--questions=250]

For the run's own flagfile and logdir: the templates teacher's examples (one-step workflows, workers drawn uniformly,
`--questions` of them, domains drawn as the warm-start draws them) are encoded by the Conductor of each checkpoint in
`RUN_DIR/checkpoints`, and `rl.losses.domain_state_overlap` (the mean over pairs of domains of the squared cosine
between their mean states at the token that writes the first worker id, the quantity `--sft_domain_decorrelation_weight`
penalises) is printed per checkpoint over all examples at once, with the mean cosine between each state and its own
domain's mean. The random initial Conductor (`conductor_init`) is the first row. Whether GRPO kept the warm-start's
decorrelated states apart is what this reads.
"""

from __future__ import annotations

import pathlib
import random
import tempfile

import jax.numpy as jnp
import numpy as np
from absl import app, flags

from launch import train  # noqa: F401  (defines the flags the flagfile sets)
from launch.conductor import load_conductor
from launch.conductor_env import build_env
from launch.flag_groups import conductor as conductor_flags
from launch.flag_groups import environment as environment_flags
from launch.flag_groups import learner as learner_flags
from launch.flag_groups import loop as loop_flags
from launch.flag_groups import sampling as sampling_flags
from launch.flag_groups import teacher as teacher_flags
from launch.loop_environment import TokenizedConductorEnv
from launch.teachers import TeacherConfig, domain_labels, teacher_examples
from models.logprobs import completion_predictors
from rl.checkpoint import Checkpointer
from rl.learner import Learner
from rl.losses import domain_state_overlap, probed_states
from rl.supervised import SFTConfig, SupervisedTrainer

_QUESTIONS = flags.DEFINE_integer("questions", 250, "Teacher examples to encode per checkpoint.")
BATCH = 25


def decision_states(model, trainer: SupervisedTrainer, examples, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """[examples, hidden] states at each example's probe position, and their domain labels."""
    states, labels = [], []
    for start in range(0, len(examples), BATCH):
        chunk = examples[start : start + BATCH]
        batch = trainer.batch(chunk, pad_id)
        predicting = completion_predictors(
            model, jnp.asarray(batch.tokens), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask),
            batch.completion_start,
        )
        states.append(np.asarray(probed_states(predicting, jnp.asarray([e.probe_index for e in chunk]))))
        labels += [e.probe_label for e in chunk]
    return np.concatenate(states), np.array(labels)


def report(name: str, states: np.ndarray, labels: np.ndarray, classes: int) -> None:
    overlap = domain_state_overlap(jnp.asarray(states), jnp.asarray(labels))
    unit = states / np.linalg.norm(states, axis=-1, keepdims=True)
    own = [unit[labels == f] @ (m := unit[labels == f].mean(0)) / np.linalg.norm(m) for f in range(classes)
           if (labels == f).any()]
    print(f"{name:>12}  overlap {float(overlap):.3f}  cosine to own domain's mean {np.concatenate(own).mean():.3f}")


def main(argv: list[str]) -> None:
    del argv
    log_dir = pathlib.Path(flags.FLAGS.logdir)
    with tempfile.TemporaryDirectory() as scratch:
        model, tokenizer, _ = load_conductor(conductor_flags.from_flags(), pathlib.Path(scratch) / "init")
        env = build_env(environment_flags.from_flags())
        environment = TokenizedConductorEnv(env, tokenizer)
        teacher = teacher_flags.from_flags()
        teacher = TeacherConfig(teacher="templates", templates=teacher.templates,
                                stratify_questions=teacher.stratify_questions, reasoning=teacher.reasoning)
        classes = len(domain_labels(environment))
        examples = teacher_examples(teacher, environment, _QUESTIONS.value, random.Random(0), probe=True)
        examples = [e for e in examples if e.probe_label is not None]
        pad_id = tokenizer.pad_token_id or 0
        trainer = SupervisedTrainer(model, SFTConfig(probe_classes=classes, probe_weight=1.0))
        counts = np.bincount([e.probe_label for e in examples], minlength=classes)
        print(f"{len(examples)} examples, per domain {dict(zip(sorted(domain_labels(environment)), counts))}")
        report("init", *decision_states(model, trainer, examples, pad_id), classes)

        loop_config = loop_flags.from_flags(env.config.recursion_rounds)
        learner = Learner(model, learner_flags.from_flags(loop_config, sampling_flags.from_flags()))
        steps = sorted(int(p.name) for p in (log_dir / "checkpoints").iterdir() if p.name.isdigit())
        for step in steps:
            # A checkpointer restores its directory's latest step: give it a directory holding only this one.
            single = pathlib.Path(scratch) / f"only_{step}"
            single.mkdir()
            (single / str(step)).symlink_to((log_dir / "checkpoints" / str(step)).absolute())
            Checkpointer(single).restore(learner)
            report(f"iteration {step}", *decision_states(learner.model, trainer, examples, pad_id), classes)


if __name__ == "__main__":
    app.run(main)

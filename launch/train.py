"""GRPO training of the Conductor: `python -m launch.train --flagfile=launch/configs/quickstart.cfg`.

Builds the world (`--world`), the Conductor (`--conductor`, optionally warm-started with `--warm_start_steps`), the
generator and its weight sync (`--generator`, `--sync`), the learner (estimator, loss, optimizer flags) and runs
`rl.loop.TrainingLoop`. Writes TensorBoard events, metrics.jsonl and rollouts.jsonl to `--logdir`, checkpoints to
`--checkpoint_dir` (default `<logdir>/checkpoints`), and the trained Conductor as an HF directory to
`<logdir>/conductor_final` (what `launch.eval` and `launch.serve` take as `--conductor`). Rerunning the same
command resumes from the last checkpoint.

Several hosts run it as one job (`launch/distributed.py`: `--coordinator_address`, `--num_processes`,
`--process_id`, or a TPU pod, SLURM or Open MPI): one process per host, the learner's mesh over every host's devices,
each process sampling its share of every iteration's questions (`rl.loop`). Process 0 writes the logs, the final
Conductor and the summary; every process writes its part of each checkpoint, into the one `--checkpoint_dir`.
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

from absl import app, flags

from launch import common, console, distributed, sft
from launch.format_check import greedy_valid_format, held_out_questions
from launch.loop_environment import TokenizedConductorEnv
from launch.outcomes import conductor_outcomes
from launch.report import summarize
from models import hf_io
from rl.advantages import ESTIMATORS
from rl.checkpoint import Checkpointer
from rl.learner import Learner, LearnerConfig, OptimizerConfig, optimizer_steps_per_update
from rl.loop import LoopConfig, TrainingLoop
from rl.losses import LossConfig
from rl.metrics import MetricsWriter, first_and_last_fifth

# -- what researchers ablate -----------------------------------------------------------------------------------------
_ESTIMATOR = flags.DEFINE_enum("estimator", "grpo", sorted(ESTIMATORS), "Advantage estimator.")
_STD_SCALING = flags.DEFINE_enum("std_scaling", "group", ["group", "batch", "none"], "grpo's std scaling.")
_WHITEN = flags.DEFINE_enum(
    "whiten", "token", ["token", "sequence"],
    "reinforce_pp(_baseline)'s batch whitening: over tokens (verl, OpenRLHF; long completions weigh more) or over "
    "completions.",
)
_POLICY_LOSS = flags.DEFINE_enum("policy_loss", "ppo", ["ppo", "gspo", "cispo"], "Policy loss.")
_AGGREGATION = flags.DEFINE_enum(
    "aggregation", "seq-mean-token-mean",
    ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"], "Loss aggregation.",
)
_CLIP_LOW = flags.DEFINE_float("clip_low", 0.2, "Lower ratio clip (1 - clip_low).")
_CLIP_HIGH = flags.DEFINE_float("clip_high", 0.2, "Upper ratio clip (1 + clip_high); > clip_low is clip-higher.")
_DUAL_CLIP = flags.DEFINE_float("dual_clip", None, "Dual-clip constant c > 1 for negative advantages (off: unset).")
_KL_COEF = flags.DEFINE_float("kl_coef", 0.0, "KL penalty to the frozen initial policy (0: no reference model).")
_KL_ESTIMATOR = flags.DEFINE_enum("kl_estimator", "k3", ["k1", "k2", "k3", "k1+", "k2+", "k3+"], "KL estimator.")
_ENTROPY_COEF = flags.DEFINE_float("entropy_coef", 0.0, "Entropy bonus weight.")
_MISMATCH = flags.DEFINE_enum(
    "mismatch_correction", "none", ["none", "tis-token", "tis-seq", "mask-token", "mask-seq"],
    "Correction for sampler vs learner log-prob mismatch.",
)
_MISMATCH_CAP = flags.DEFINE_float("mismatch_cap", 2.0, "Cap of the mismatch importance weights.")
_DYNAMIC_SAMPLING = flags.DEFINE_boolean("dynamic_sampling", False, "Drop groups whose rewards all agree.")
_QUESTIONS = flags.DEFINE_integer("questions_per_step", 4, "Questions per iteration.")
_GROUP = flags.DEFINE_integer("group_size", 8, "Completions per question.")
_ITERATIONS = flags.DEFINE_integer("iterations", 20, "Training iterations.")
_PPO_EPOCHS = flags.DEFINE_integer(
    "ppo_epochs", 1, "Passes over each batch (mu in GRPO; --iterations counts the loop's iterations)."
)
# Kept only to stop an old flagfile: absl would suggest --iterations, which counts something else.
flags.DEFINE_integer("num_iterations", None, "Renamed --ppo_epochs; setting it is an error.")
flags.register_validator(
    "num_iterations", lambda value: value is None,
    "--num_iterations is now --ppo_epochs (passes over each batch); --iterations counts the training loop's iterations",
)
_MINI_BATCH = flags.DEFINE_integer("mini_batch_size", None, "Sequences per optimizer step (default: whole batch).")
_MICRO_BATCH = flags.DEFINE_integer("micro_batch_size", None, "Sequences per forward/backward pass.")
_OLD_LOGPROBS = flags.DEFINE_enum(
    "old_logprobs", "recompute", ["recompute", "sampler"],
    "Old log-probs of the optimizer steps after an update's first: the learner's from an extra forward pass, or the "
    "sampler's (no extra pass; the sampler becomes the behaviour policy; needs --mismatch_correction=none).",
)
_SKIP_ZERO_GRADIENT_ROWS = flags.DEFINE_boolean(
    "skip_zero_gradient_rows", True,
    "Do not run the learner on rows whose loss has no gradient (no loss tokens; or a zero advantage when there is no "
    "KL or entropy term): the same update, less work; token-mean metrics are then over the rows run.",
)
_RUN_DUPLICATES_ONCE = flags.DEFINE_boolean(
    "run_duplicates_once", True,
    "Run each distinct completion of a group through the learner once: a row identical to an earlier one of its group "
    "takes that row's log-probs, and keeps its own advantage and loss weight; the same update, less work.",
)
_LR = flags.DEFINE_float("lr", 1e-6, "Peak learning rate (AdamW).")
_SCHEDULE = flags.DEFINE_enum("lr_schedule", "cosine", ["cosine", "constant"], "Learning-rate schedule after warmup.")
_WARMUP_RATIO = flags.DEFINE_float("warmup_ratio", 0.03, "Fraction of optimizer steps spent warming up.")
_WEIGHT_DECAY = flags.DEFINE_float("weight_decay", 0.0, "AdamW weight decay.")
_ADAM_B1 = flags.DEFINE_float("adam_b1", 0.9, "AdamW first-moment decay.")
_ADAM_B2 = flags.DEFINE_float("adam_b2", 0.999, "AdamW second-moment decay.")
_ADAM_EPS = flags.DEFINE_float(
    "adam_eps", 1e-8,
    "AdamW epsilon. Raising it damps the update of parameters whose gradient is mostly noise; at 1e-8 Adam moves "
    "every parameter by about the learning rate each step, whatever its gradient's size.",
)
_MAX_GRAD_NORM = flags.DEFINE_float("max_grad_norm", 1.0, "Global gradient-norm clip.")
_MESH_FSDP = flags.DEFINE_integer(
    "mesh_fsdp", 1, "Devices on the fsdp mesh axis, counted over all processes (fsdp x tp: all of them, multi-host)."
)
_MESH_TP = flags.DEFINE_integer("mesh_tp", 1, "Devices on the tensor-parallel mesh axis, counted over all processes.")
_WARM_START_STEPS = flags.DEFINE_integer("warm_start_steps", 0, "Supervised format warm-start steps before RL.")
# -- run bookkeeping ---------------------------------------------------------------------------------------------------
_LOG_DIR = flags.DEFINE_string("logdir", "runs/train", "TensorBoard events, metrics.jsonl, rollouts.jsonl.")
_CHECKPOINT_DIR = flags.DEFINE_string("checkpoint_dir", None, "Checkpoints (default: <logdir>/checkpoints).")
_CHECKPOINT_EVERY = flags.DEFINE_integer("checkpoint_every", 10, "Iterations between checkpoints.")
_KEEP = flags.DEFINE_integer("keep_checkpoints", 3, "Checkpoints kept.")
_RESUME = flags.DEFINE_boolean("resume", True, "Resume from the latest checkpoint when one exists.")
_EVAL_TASKS = flags.DEFINE_list("eval_tasks", [], "Held-out task files evaluated after training (greedy).")
_FORMAT_CHECK_QUESTIONS = flags.DEFINE_integer(
    "format_check_questions", 64,
    "Questions the trained Conductor answers greedily at the end, as launch.eval and launch.serve first decode it; "
    "the fraction whose workflow parses is the summary's greedy_valid_format. Fresh questions on a synthetic task "
    "set, else a sample of the training questions (0: no check).",
    lower_bound=0,
)

log = logging.getLogger(__name__)


def estimator_options() -> dict[str, str]:
    """The chosen estimator's own options from their flags (an estimator takes only its own)."""
    if _ESTIMATOR.value == "grpo":
        return {"std_scaling": _STD_SCALING.value}
    if _ESTIMATOR.value in ("reinforce_pp", "reinforce_pp_baseline"):
        return {"whiten": _WHITEN.value}
    return {}


def learner_config(max_rows: int, max_completion_tokens: int) -> LearnerConfig:
    """The learner's config for batches of at most `max_rows` rows (`LoopConfig.max_rows`). With recursion rounds the
    row count varies, and so does the number of optimizer steps of an update; the learning-rate schedule is sized
    for the largest batch, so it never ends before the run does (`OptimizerConfig`)."""
    total_steps = _ITERATIONS.value * optimizer_steps_per_update(max_rows, _MINI_BATCH.value, _PPO_EPOCHS.value)
    loss = LossConfig(
        policy_loss=_POLICY_LOSS.value,
        clip_low=_CLIP_LOW.value,
        clip_high=_CLIP_HIGH.value,
        dual_clip=_DUAL_CLIP.value,
        aggregation=_AGGREGATION.value,
        norm_length=max_completion_tokens,
        kl_coef=_KL_COEF.value,
        kl_estimator=_KL_ESTIMATOR.value,
        entropy_coef=_ENTROPY_COEF.value,
        mismatch_correction=_MISMATCH.value,
        mismatch_cap=_MISMATCH_CAP.value,
    )
    optimizer = OptimizerConfig(
        learning_rate=_LR.value,
        b1=_ADAM_B1.value,
        b2=_ADAM_B2.value,
        eps=_ADAM_EPS.value,
        weight_decay=_WEIGHT_DECAY.value,
        warmup_steps=int(round(_WARMUP_RATIO.value * total_steps)),
        schedule=_SCHEDULE.value,
        total_steps=total_steps,
        max_grad_norm=_MAX_GRAD_NORM.value,
    )
    return LearnerConfig(
        loss=loss,
        optimizer=optimizer,
        ppo_epochs=_PPO_EPOCHS.value,
        mini_batch_size=_MINI_BATCH.value,
        micro_batch_size=_MICRO_BATCH.value,
        temperature=common.sampling_params().temperature,
        share_prompts=common.share_prompts(),
        old_logprobs=_OLD_LOGPROBS.value,
        skip_zero_gradient_rows=_SKIP_ZERO_GRADIENT_ROWS.value,
        run_duplicates_once=_RUN_DUPLICATES_ONCE.value,
    )


def main(argv: list[str]) -> None:
    del argv
    console.configure()
    distributed.initialize()
    log_dir = pathlib.Path(_LOG_DIR.value)
    checkpoint_dir = pathlib.Path(_CHECKPOINT_DIR.value or log_dir / "checkpoints")
    if not _RESUME.value and checkpoint_dir.exists() and any(checkpoint_dir.iterdir()):
        raise SystemExit(f"{checkpoint_dir} holds checkpoints and --noresume was given; choose a new --logdir")

    model, tokenizer, model_dir = common.load_conductor(distributed.process_dir(log_dir) / "conductor_init")
    env = common.build_env()
    world = TokenizedConductorEnv(env, tokenizer)
    checkpointer = Checkpointer(checkpoint_dir, keep=_KEEP.value)
    if _WARM_START_STEPS.value and checkpointer.latest_step() is None:
        sft.warm_start(model, world, _WARM_START_STEPS.value, common.seed())
    distributed.share_process_zero_weights(model)

    generator, weight_sync = common.build_generator(model_dir, distributed.process_dir(log_dir))
    sampling = common.sampling_params()
    mesh = distributed.learner_mesh(_MESH_FSDP.value, _MESH_TP.value)
    loop_config = LoopConfig(
        iterations=_ITERATIONS.value,
        questions_per_step=_QUESTIONS.value,
        group_size=_GROUP.value,
        estimator=_ESTIMATOR.value,
        estimator_options=estimator_options(),
        dynamic_sampling=_DYNAMIC_SAMPLING.value,
        stratify_questions=common.stratify_questions(),
        recursion_rounds=env.config.recursion_rounds,
        checkpoint_every=_CHECKPOINT_EVERY.value,
        seed=common.seed(),
    )
    learner = Learner(model, learner_config(loop_config.max_rows, sampling.max_new_tokens), mesh=mesh)
    writer = MetricsWriter(log_dir) if distributed.is_main_process() else None
    loop = TrainingLoop(
        loop_config,
        learner=learner,
        sampler=generator,
        sampling_params=sampling,
        weight_sync=weight_sync,
        environment=world,
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        writer=writer,
        checkpointer=checkpointer,
    )
    history = loop.run()
    final_model = distributed.host_copy(learner.model)
    checkpointer.close()
    if not distributed.is_main_process():
        generator.close()
        distributed.wait_for_every_process("launch.train: end of run")  # while process 0 evaluates and writes
        return
    final_dir = hf_io.save(final_model, log_dir / "conductor_final")
    tokenizer.save_pretrained(final_dir)
    common.save_trained_sampling(final_dir, sampling)
    summary = {"iterations": loop.iteration, "logdir": str(log_dir), "conductor_final": str(final_dir)}
    if history:
        first, last = first_and_last_fifth([h["reward/mean"] for h in history])
        summary["reward_first_fifth"], summary["reward_last_fifth"] = first, last
    if env.world.oracle is not None:
        summary["oracle_expected_reward"] = env.world.oracle.expected_reward
    if _FORMAT_CHECK_QUESTIONS.value:
        questions = held_out_questions(env.world.tasks, _FORMAT_CHECK_QUESTIONS.value, common.seed())
        validity = greedy_valid_format(
            generator, tokenizer, questions, pool_size=len(env.world.pool), max_steps=env.config.max_steps,
            access_mode=env.config.access_mode, max_new_tokens=sampling.max_new_tokens,
        )
        log.info("greedy valid format %d/%d%s", validity.valid, validity.questions,
                 "".join(f"\n  {question!r}: {error}" for question, error in validity.failures[:3]))
        summary["greedy_valid_format"] = validity.rate
    if _EVAL_TASKS.value:
        eval_env = common.build_env(_EVAL_TASKS.value)
        # Greedy, with the Conductor's own completion limit: a default one would hold a non-stopping small Conductor
        # for 1024 steps.
        outcomes = conductor_outcomes(generator, TokenizedConductorEnv(eval_env, tokenizer),
                                      dataclasses.replace(sampling, temperature=0.0), repeats=1)
        summary["eval"] = summarize(outcomes, [worker.name for worker in eval_env.world.pool])
    writer.close()
    generator.close()
    print(json.dumps(summary, sort_keys=True))
    distributed.wait_for_every_process("launch.train: end of run")


if __name__ == "__main__":
    app.run(main)

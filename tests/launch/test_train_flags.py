"""The flag groups' flags reach their configs (`launch.flag_groups`; the rest of the flags are exercised end to end)."""

from __future__ import annotations

import logging
import os
import re
from unittest import mock

import pytest
from absl import flags
from absl.testing import flagsaver

from conductor import conductor_env, generators
from env.gym_env import ConductorEnv
from env.tasks import sandbox
from env.workers.api import FREE, Price
from env.workflow import Step, Workflow, render_workflow
from env.worlds import SyntheticWorldConfig, build_world
from launch import sft, train  # noqa: F401  (define the renamed flags' new names, --logdir among them)
from conductor.loop_environment import TokenizedConductorEnv
from conductor.teachers import TeacherConfig, task_label_indices
from launch.flag_groups import environment as environment_flags
from launch.flag_groups import generator as generator_flags
from launch.flag_groups import learner as learner_flags
from launch.flag_groups import loop as loop_flags
from launch.flag_groups import renamed
from launch.flag_groups import sampling as sampling_flags
from launch.flag_groups import supervised as supervised_flags
from launch.flag_groups import teacher as teacher_flags
from models import zoo
from models.tokenizer import load_tokenizer
from rl.learner import LearnerConfig
from rl.loop import LoopConfig


pytestmark = pytest.mark.usefixtures("parsed_flags")  # tests/launch/conftest.py


def learner_config(recursion_rounds: int = 0, route_token_ids: tuple[int, ...] = ()) -> LearnerConfig:
    """The learner's config from the flags, for the loop's batches (by default 4 questions x 8 completions, so 32
    rows), sampled with at most 64 tokens."""
    with flagsaver.flagsaver(max_tokens=64):
        return learner_flags.from_flags(
            loop_flags.from_flags(recursion_rounds), sampling_flags.from_flags(), route_token_ids
        )


def build_env():
    return conductor_env.build_env(environment_flags.from_flags())


def test_optimizer_flags_reach_the_learner_config():
    with flagsaver.flagsaver(
        adam_b1=0.8, adam_b2=0.95, adam_eps=1e-5, weight_decay=0.01, learning_rate=3e-4,
        learning_rate_schedule="constant", warmup_ratio=0.1, iterations=10, mini_batch_size=8, ppo_epochs=2,
        max_grad_norm=0.5,
    ):
        config = learner_config()
    optimizer = config.optimizer
    assert (optimizer.b1, optimizer.b2, optimizer.eps, optimizer.weight_decay) == (0.8, 0.95, 1e-5, 0.01)
    assert (optimizer.learning_rate, optimizer.schedule, optimizer.max_grad_norm) == (3e-4, "constant", 0.5)
    # 32 completions in mini-batches of 8, two passes, ten iterations: 80 optimizer steps, 8 of them warmup.
    assert (optimizer.total_steps, optimizer.warmup_steps) == (80, 8)
    assert (config.mini_batch_size, config.ppo_epochs, config.loss.norm_length) == (8, 2, 64)


def test_the_entropy_flags_reach_the_loss_config_with_the_route_tokens_and_a_negative_route_bonus_is_refused():
    with flagsaver.flagsaver(entropy_coef=0.02, route_entropy_coef=0.01):
        loss = learner_config(route_token_ids=(32, 33, 34)).loss
        with pytest.raises(ValueError, match="route_entropy needs token_ids"):
            learner_config()
    [term] = loss.auxiliary_terms
    assert (loss.entropy_coef, term.name, term.coef) == (0.02, "route_entropy", 0.01)
    assert term.kwargs == {"token_ids": (32, 33, 34)}
    assert loss.token_positions_read == ("route",) and learner_config().loss.auxiliary_terms == ()
    with flagsaver.flagsaver(), pytest.raises(flags.IllegalFlagValueError, match="route_entropy_coef"):
        flags.FLAGS(["train", "--route_entropy_coef=-0.1"])


def test_the_route_entropy_decay_ratio_counts_the_runs_optimizer_steps():
    # 32 completions in mini-batches of 8, ten iterations: 40 optimizer steps, the bonus gone after 30 of them.
    with flagsaver.flagsaver(route_entropy_coef=0.01, route_entropy_decay_ratio=0.75, iterations=10, mini_batch_size=8):
        [term] = learner_config(route_token_ids=(32, 33)).loss.auxiliary_terms
    assert term.decay_steps == 30
    assert float(term.coef_at(15)) == pytest.approx(0.005) and term.coef_at(30) == 0.0
    with flagsaver.flagsaver(route_entropy_decay_ratio=0.5), pytest.raises(ValueError, match="decay_steps"):
        learner_config()
    with flagsaver.flagsaver(), pytest.raises(flags.IllegalFlagValueError, match="route_entropy_decay_ratio"):
        flags.FLAGS(["train", "--route_entropy_decay_ratio=1.5"])


def test_the_conductors_transform_and_term_flags_become_registered_transforms_and_terms_in_order():
    with flagsaver.flagsaver(pool_routes_by_task=0.5, balance_routes=0.25, route_weighting="inverse_propensity",
                             route_weight_cap=3.0, task_decorrelation_coef=0.2):
        loop = loop_flags.from_flags(0)
        loss = learner_config().loss
    assert [(t.name, dict(t.options)) for t in loop.advantage_transforms] == [
        ("pool_routes", {"fraction": 0.5}), ("balance_routes", {"fraction": 0.25}), ("route_propensity", {"cap": 3.0})
    ]
    assert [(t.name, t.coef) for t in loss.auxiliary_terms] == [("decorrelation", 0.2)]
    assert loop_flags.from_flags(0).advantage_transforms == ()


@pytest.mark.parametrize("old, new", sorted(renamed.RENAMED.items()))
def test_a_renamed_flag_is_refused_with_its_new_name(old, new):
    with flagsaver.flagsaver(), pytest.raises(flags.IllegalFlagValueError, match=f"--{old} is renamed to --{new}"):
        flags.FLAGS(["train", f"--{old}=4"])
    assert new in flags.FLAGS


def test_the_renamed_num_iterations_flag_is_refused_with_its_new_name():
    # absl alone would answer "Unknown command line flag 'num_iterations'. Did you mean: iterations ?", the loop's.
    with flagsaver.flagsaver(), pytest.raises(flags.IllegalFlagValueError, match="now --ppo_epochs"):
        flags.FLAGS(["train", "--num_iterations=2"])


@pytest.mark.parametrize("given", [("--warm_start_steps=8",), ("--eval_tasks=synthetic", "--warm_start_steps=0"),
                                   ("--eval_tasks=synthetic",)])
def test_evaluating_the_warm_start_needs_a_warm_start_and_eval_tasks(given):
    with flagsaver.flagsaver(), pytest.raises(flags.IllegalFlagValueError,
                                              match="give both --eval_tasks and --warm_start_steps"):
        flags.FLAGS(["train", "--eval_warm_start", *given])
    with flagsaver.flagsaver():
        flags.FLAGS(["train", "--eval_tasks=synthetic", "--warm_start_steps=8", "--eval_warm_start"])


def test_selection_and_evaluation_on_one_split_are_refused():
    with flagsaver.flagsaver(), pytest.raises(flags.IllegalFlagValueError, match="share a task file"):
        flags.FLAGS(["train", "--eval_tasks=validation,test", "--selection_tasks=test"])
    with flagsaver.flagsaver():
        flags.FLAGS(["train", "--eval_tasks=test", "--selection_tasks=validation"])


def test_with_recursion_rounds_the_schedule_spans_the_largest_batch():
    # 4 questions x 8 completions and two recursion rounds: at most 96 rows, 12 mini-batches of 8 (the last of a
    # smaller batch is shorter), so 20 iterations hold at most 240 optimizer steps.
    loop = LoopConfig(iterations=20, questions_per_iteration=4, group_size=8, recursion_rounds=2)
    assert loop.max_rows == 96
    with flagsaver.flagsaver(iterations=20, mini_batch_size=8, warmup_ratio=0.05):
        optimizer = learner_config(recursion_rounds=2).optimizer
    assert (optimizer.total_steps, optimizer.warmup_steps) == (240, 12)
    with flagsaver.flagsaver(iterations=20, mini_batch_size=7):  # 96 rows: 13 mini-batches of 7 and one of 5
        assert learner_config(recursion_rounds=2).optimizer.total_steps == 20 * 14


def test_old_logprobs_flag_reaches_the_learner_config():
    assert learner_config().old_logprobs == "recompute"
    with flagsaver.flagsaver(old_logprobs="sampler"):
        assert learner_config().old_logprobs == "sampler"
    with flagsaver.flagsaver(old_logprobs="sampler", mismatch_correction="tis-token"):
        with pytest.raises(ValueError, match="would correct nothing"):
            learner_config()


def test_estimator_option_flags_reach_only_their_estimator():
    assert loop_flags.from_flags(0).estimator_options == {"std_scaling": "group"}
    with flagsaver.flagsaver(estimator="reinforce_pp"):
        assert loop_flags.from_flags(0).estimator_options == {"whiten": "token"}
    with flagsaver.flagsaver(estimator="reinforce_pp_baseline", whiten="sequence", std_scaling="batch"):
        assert loop_flags.from_flags(0).estimator_options == {"whiten": "sequence"}
    with flagsaver.flagsaver(estimator="rloo", whiten="sequence"):
        assert loop_flags.from_flags(0).estimator_options == {}


def test_a_non_positive_adam_eps_is_rejected():
    with flagsaver.flagsaver(adam_eps=0.0), pytest.raises(ValueError, match="eps"):
        learner_config()


def test_synthetic_prices_price_each_worker_of_the_pool():
    two_workers = "0.9,0.9,0.9,0.9;0.8,0.3,0.3,0.3"
    with flagsaver.flagsaver(synthetic_skills=two_workers, synthetic_prices="15,75;0.1,0.4", synthetic_tasks=8):
        pool = build_env().world.pool
    assert [worker.price for worker in pool] == [Price(15.0, 75.0), Price(0.1, 0.4)]
    with flagsaver.flagsaver(synthetic_skills=two_workers, synthetic_tasks=8):
        assert all(worker.price == FREE for worker in build_env().world.pool)


def test_a_priced_pool_with_a_usd_penalty_charges_each_call_at_its_workers_price():
    """The exact oracle needs penalties that do not depend on the text written, so this world has none, and a
    workflow's reward loses the penalty times what its call cost: the prompt's and completion's tokens at the price."""
    with flagsaver.flagsaver(
        synthetic_skills="1,1,1,1;0,0,0,0", synthetic_prices="15,75;0.1,0.4", synthetic_tasks=8, usd_penalty=20.0,
        reward_wrong=0.0,
    ):
        env = build_env()
    assert env.world.oracle is None
    task = env.world.tasks[0]
    texts = [render_workflow(Workflow(steps=(Step(worker, "Solve the question."),))) for worker in (0, 1)]
    expensive, cheap = env.score_batch_sync([task, task], texts)
    for scored, price, right in ((expensive, Price(15.0, 75.0), 1.0), (cheap, Price(0.1, 0.4), 0.0)):
        (step,) = scored.execution.steps
        assert step.cost_usd == pytest.approx(price.cost(step.prompt_tokens, step.completion_tokens))
        assert scored.components["usd_penalty"] == pytest.approx(-20.0 * step.cost_usd)
        assert scored.reward == pytest.approx(right - 20.0 * step.cost_usd)
    assert expensive.execution.steps[0].cost_usd > 100 * cheap.execution.steps[0].cost_usd > 0


@pytest.mark.parametrize(
    "prices, error",
    [
        ("15,75", "one entry per worker"),
        ("15,75;0.1,0.4;1,1", "one entry per worker"),
        ("15;0.1,0.4", "each worker's row is 'input,output'"),
        ("15,75;cheap,0.4", "--synthetic_prices takes numbers"),
        ("15,75;-1,0.4", "prices must be >= 0"),
        ("15,75;nan,0.4", "prices must be >= 0 and finite"),
    ],
)
def test_malformed_synthetic_prices_are_refused_by_name(prices, error):
    with flagsaver.flagsaver(synthetic_skills="0.9,0.9,0.9,0.9;0.8,0.3,0.3,0.3", synthetic_prices=prices):
        with pytest.raises(ValueError, match=re.escape(error)):
            build_env()


def test_expected_grades_flag_reaches_the_env():
    assert not build_env().config.expected_grades
    with flagsaver.flagsaver(expected_grades=True):
        assert build_env().config.expected_grades


def test_allow_unsandboxed_code_reaches_the_env_and_is_logged_loudly_when_used(monkeypatch, caplog):
    with flagsaver.flagsaver(world="paper", tasks=["humaneval"], task_limit=1):
        conductor_env._log_sandbox_layer.cache_clear()
        with caplog.at_level(logging.INFO, logger=conductor_env.__name__):
            env = build_env()
        assert not env.config.allow_unsandboxed_code and env.sandbox_layer == sandbox.isolation_layer() != "none"
        assert f"in the {env.sandbox_layer} sandbox" in caplog.text
        monkeypatch.setattr(sandbox, "layer_works", lambda layer: False)
        monkeypatch.setitem(sandbox._unsandboxed, "allowed", False)
        monkeypatch.setitem(sandbox._unsandboxed, "warned", False)
        with pytest.raises(sandbox.SandboxUnavailable, match="--allow_unsandboxed_code"):
            build_env()
        with flagsaver.flagsaver(allow_unsandboxed_code=True), caplog.at_level(logging.WARNING):
            env = build_env()
    conductor_env._log_sandbox_layer.cache_clear()
    assert env.config.allow_unsandboxed_code and env.sandbox_layer == "none"
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("WITHOUT a kernel sandbox" in warning for warning in warnings)
    assert any(warning.startswith("--allow_unsandboxed_code") for warning in warnings)  # the entry point's


def test_share_prompts_reaches_the_learner_and_the_warm_start():
    world = TokenizedConductorEnv(ConductorEnv(build_world(SyntheticWorldConfig(num_tasks=4))),
                            load_tokenizer(zoo.smollm2_135m_instruct()))  # fmt: skip
    task_labels = len(task_label_indices(world))
    assert learner_config().share_prompts and supervised_flags.from_flags(10, task_labels).share_prompts
    with flagsaver.flagsaver(share_prompts=False):
        assert not learner_config().share_prompts
        assert not supervised_flags.from_flags(10, task_labels).share_prompts


@pytest.mark.parametrize(
    ("generator_settings", "user_setting", "expected"),
    [
        ({"generator_device": "cuda"}, {}, "false"),
        ({"generator_device": "cuda:1"}, {}, "false"),
        ({"generator_device": "cpu"}, {}, None),
        ({"generator": "sglang", "generator_device": "cuda", "sglang_urls": ["http://127.0.0.1:30000"], "sync": "disk"},
         {}, None),
        ({"generator_device": "cuda"}, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}, None),
        ({"generator_device": "cuda"}, {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}, "true"),
    ],
)
def test_jax_leaves_the_gpu_to_a_torch_generator_beside_it(generator_settings, user_setting, expected):
    # patch.dict restores the whole environment afterwards, the variable the function sets included, so the setting
    # does not leak into later tests.
    with mock.patch.dict(os.environ), flagsaver.flagsaver(**generator_settings):
        for name in generators.JAX_ALLOCATOR_VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(user_setting)
        generators.share_gpu_with_torch_generator(generator_flags.from_flags())
        preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")
    assert preallocate == expected


def test_teacher_flags_reach_the_teacher_config():
    assert teacher_flags.from_flags() == TeacherConfig()
    with flagsaver.flagsaver(warm_start_teacher="world", warm_start_templates=["single"],
                             warm_start_world_weights="advantage", stratify_questions=True):  # fmt: skip
        assert teacher_flags.from_flags() == TeacherConfig(
            teacher="world", templates=("single",), world_weights="advantage", stratify_questions=True
        )
    with (flagsaver.flagsaver(warm_start_teacher="rollouts"),
          pytest.raises(ValueError, match="needs --warm_start_rollouts")):
        teacher_flags.from_flags()

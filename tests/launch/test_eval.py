"""Evaluation against baselines: the accuracies each world implies, the reports, the cache, the command."""

import json
import math
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest

from conductor.baselines import BaselineConfig, prompted_conductor_outcomes, run_baselines, workflow_outcomes
from conductor.format_check import greedy_valid_format, held_out_questions
from conductor.loop_environment import TokenizedConductorEnv, completion_text
from conductor.outcomes import Outcome, conductor_outcomes
from conductor.report import markdown_report, summarize, write_report
from env import prompts
from env.executor import ExecutorConfig
from env.gym_env import ConductorEnv, EnvConfig
from env.policies import single
from env.tasks.synthetic import TASK_LABELS, load_synthetic
from env.workers.base import WorkerReply
from env.workers.cache import ResponseCache
from env.workers.openai_api import OpenAICompatibleWorker
from env.workers.replay import ROUTERDC_MODELS
from env.workflow import Step, Workflow, render_workflow
from env.worlds import ReplayWorldConfig, SyntheticWorldConfig, World, build_world, replay_reference_points
from models import zoo
from models.tokenizer import load_tokenizer
from rollout.types import Completion, SamplingParams
from tests.env.fake_providers import FakeOpenAI
from tests.env.helpers import exact_task


def within(measured: float, expected: float, samples: int, sigmas: float = 4.0) -> bool:
    """`measured` is a mean of `samples` draws whose expected value is `expected` (Bernoulli-bounded noise)."""
    return abs(measured - expected) <= sigmas * math.sqrt(max(expected * (1 - expected), 0.01) / samples)


@pytest.fixture(scope="module")
def replay_env():
    world = build_world(ReplayWorldConfig(files=("gsm8k-test", "arc_challenge_test"), limit_per_file=60))
    env = ConductorEnv(world, EnvConfig(executor=ExecutorConfig(seed=0)))
    yield env
    env.close()


def test_summary_means_and_standard_errors_match_numpy():
    def outcome(task, task_label, repeat, correct, tokens, workers):
        return Outcome(task, task_label, repeat, {"correct": correct, "tokens": tokens, "steps": len(workers)}, workers)

    outcomes = [
        outcome("a1", "a", 0, 1.0, 10, (0,)), outcome("a2", "a", 0, 0.0, 30, (1, 1)),
        outcome("a1", "a", 1, 1.0, 10, (0,)), outcome("a2", "a", 1, 1.0, 50, (1,)),
        outcome("b1", "b", 0, 0.0, 100, (0, 0, 1)), outcome("b1", "b", 1, 1.0, 100, ()),
    ]  # fmt: skip
    report = summarize(outcomes, ["w0", "w1"])
    assert report["questions"] == 3 and report["repeats"] == 2
    assert report["tasks"]["a"]["correct"] == pytest.approx(0.75)
    assert report["tasks"]["a"]["correct_stderr"] == pytest.approx(np.std([0.5, 1.0], ddof=1) / np.sqrt(2))
    assert report["tasks"]["a"]["tokens"] == pytest.approx(25.0)
    assert report["tasks"]["b"]["correct"] == pytest.approx(0.5)
    # the average is unweighted over tasks, and its standard error is over the repeats' averages
    assert report["average_accuracy"] == pytest.approx((0.75 + 0.5) / 2)
    per_repeat = [(0.5 + 0.0) / 2, (1.0 + 1.0) / 2]
    assert report["average_accuracy_stderr"] == pytest.approx(np.std(per_repeat, ddof=1) / np.sqrt(2))
    assert report["average"]["tokens"] == pytest.approx((25.0 + 100.0) / 2)
    assert report["workers_chosen"] == {"w0": pytest.approx(4 / 8), "w1": pytest.approx(4 / 8)}
    assert summarize(outcomes[:2], ["w0", "w1"])["average_accuracy_stderr"] is None  # one repeat: no spread
    with pytest.raises(ValueError, match="no outcomes"):
        summarize([], ["w0"])


def test_replay_single_workers_and_oracle_give_the_recorded_accuracies(replay_env):
    repeats = 3
    results = run_baselines(replay_env, BaselineConfig(baselines=("single", "oracle")), repeats)
    tasks = replay_env.world.tasks
    reference = replay_reference_points(tasks)
    for w, model in enumerate(ROUTERDC_MODELS):
        report = results[f"single {w}: {model}"]
        for task_label, measured in report["tasks"].items():
            scores = [t.metadata["scores"][model] for t in tasks if t.task_label == task_label]
            assert within(measured["correct"], float(np.mean(scores)), len(scores) * repeats), (model, task_label)
        assert report["workers_chosen"] == {model: 1.0}
        assert report["average"]["steps"] == 1.0 and report["average"]["valid_format"] == 1.0
    # The reference points weigh questions equally; both files have 60 questions, so the unweighted task
    # average is the same quantity.
    samples = len(tasks) * repeats
    best = results[f"single {ROUTERDC_MODELS.index(reference['best_single_model'])}: {reference['best_single_model']}"]
    assert within(best["average_accuracy"], reference["best_single"], samples)
    assert within(results["oracle routing"]["average_accuracy"], reference["oracle"], samples)
    assert results["oracle routing"]["average_accuracy"] > best["average_accuracy"]


def test_expected_grades_make_replay_accuracies_exact():
    world = build_world(ReplayWorldConfig(files=("gsm8k-test", "arc_challenge_test"), limit_per_file=60))
    env = ConductorEnv(world, EnvConfig(expected_grades=True, executor=ExecutorConfig(seed=0)))
    results = run_baselines(env, BaselineConfig(baselines=("single", "oracle")), repeats=2)
    for w, model in enumerate(ROUTERDC_MODELS):
        for task_label, measured in results[f"single {w}: {model}"]["tasks"].items():
            scores = [t.metadata["scores"][model] for t in world.tasks if t.task_label == task_label]
            assert measured["correct"] == pytest.approx(np.mean(scores), abs=1e-12), (model, task_label)
            assert measured["correct_stderr"] == 0.0  # no draws, so the repeats agree exactly
    best_per_question = {
        task_label: np.mean([max(t.metadata["scores"].values()) for t in world.tasks if t.task_label == task_label])
        for task_label in ("gsm8k", "arc_challenge")
    }
    oracle = results["oracle routing"]
    assert oracle["average_accuracy"] == pytest.approx(np.mean(list(best_per_question.values())), abs=1e-12)
    env.close()


def test_per_task_best_routes_each_task_to_its_best_single_worker(replay_env):
    results = run_baselines(replay_env, BaselineConfig(baselines=("single", "task_best")), repeats=2)
    routed = results["per-task best worker"]
    singles = [results[f"single {w}: {model}"] for w, model in enumerate(ROUTERDC_MODELS)]
    for task_label, measured in routed["tasks"].items():
        # Every method draws the same replayed outcome for a (question, repeat, worker): the per-task router's
        # accuracy on a task is its best single worker's, exactly.
        assert measured["correct"] == max(single["tasks"][task_label]["correct"] for single in singles)
    assert routed["average_accuracy"] >= max(single["average_accuracy"] for single in singles)
    # On these 60-question files the two tasks' best workers differ, so each runs half of the questions.
    assert sorted(routed["workers_chosen"].values()) == [0.5, 0.5]
    by_task = routed["workers_chosen_by_task"]
    assert sorted(by_task) == ["arc_challenge", "gsm8k"]
    assert all(list(shares.values()) == [1.0] for shares in by_task.values())
    assert by_task["arc_challenge"] != by_task["gsm8k"]
    report = markdown_report({"per-task best worker": routed, **{f"single {w}": singles[w] for w in range(2)}}, "t")
    for task_label, shares in by_task.items():  # task-dependent routing is listed per task, a single worker's not
        assert f"  - {task_label}: {next(iter(shares))} 100.0" in report
    assert report.count("  - ") == 2


def test_replay_multi_step_baselines_are_worth_their_last_worker_under_the_independent_rule(replay_env):
    # The replay data says nothing about reading earlier work; the default AnswerModel makes every call
    # independent, so a fixed workflow scores what its final worker scores alone.
    config = BaselineConfig(baselines=("moa", "self_reflection", "consensus", "random"), worker=5,
                            reflection_revisions=1, consensus_samples=2)  # fmt: skip
    results = run_baselines(replay_env, config, repeats=2)
    tasks = replay_env.world.tasks
    expected_final = float(np.mean([t.metadata["scores"][ROUTERDC_MODELS[5]] for t in tasks]))
    expected_random = float(np.mean([np.mean(list(t.metadata["scores"].values())) for t in tasks]))
    moa = results["MoA (1 layer, aggregator 5)"]
    assert moa["average"]["steps"] == 8.0 and moa["average"]["worker_calls"] == 8.0  # seven proposers + aggregator
    assert moa["workers_chosen"][ROUTERDC_MODELS[5]] == pytest.approx(2 / 8)
    for method in (moa, results["self-reflection (1 revisions, worker 5)"], results["consensus (2 samples, worker 5)"]):
        assert within(method["average_accuracy"], expected_final, len(tasks) * 2)
        assert method["average"]["tokens"] > results["random routing"]["average"]["tokens"]
    assert within(results["random routing"]["average_accuracy"], expected_random, len(tasks) * 2)


def test_synthetic_oracle_routing_achieves_the_worlds_optimal_accuracy():
    world = build_world(SyntheticWorldConfig(num_tasks=300, seed=1))
    env = ConductorEnv(world, EnvConfig(executor=ExecutorConfig(seed=0)))
    try:
        report = run_baselines(env, BaselineConfig(baselines=("oracle",)), repeats=2)["oracle routing"]
    finally:
        env.close()
    for task_label, plan in world.oracle.plans.items():
        count = sum(task.task_label == task_label for task in world.tasks)
        assert within(report["tasks"][task_label]["correct"], plan.p_correct, count * 2), task_label


class WorkflowWritingWorker:
    """A pool member that, asked anything, replies with the same rendered workflow (or answers a step)."""

    name = "writer"

    def __init__(self, workflow_text: str) -> None:
        self.workflow_text = workflow_text
        self.calls = 0

    async def complete(self, messages, *, max_tokens, temperature, seed, task=None):
        self.calls += 1
        conductor_prompt = messages[0]["role"] == "system"
        text = self.workflow_text if conductor_prompt else "<answer>42</answer>"
        return WorkerReply(text, 100, 20, 0.01, 0.0)


def test_a_worker_prompted_as_conductor_has_its_workflow_parsed_and_executed():
    writer = WorkflowWritingWorker(render_workflow(Workflow((Step(0, "Solve it."), Step(0, "Check it.", "all")))))
    world = World("scripted", [writer], [exact_task("t0"), exact_task("t1", gold="41")])
    env = ConductorEnv(world, EnvConfig())
    try:
        report = summarize(prompted_conductor_outcomes(env, 0, repeats=1), ["writer"])
    finally:
        env.close()
    assert report["tasks"]["math"]["correct"] == 0.5  # "42" is right for t0, wrong for t1
    assert report["average"]["valid_format"] == 1.0 and report["average"]["steps"] == 2.0
    assert report["average"]["conductor_tokens"] == 120.0
    assert report["average"]["cost_usd"] == pytest.approx(3 * 0.01)  # the Conductor call and two steps
    assert writer.calls == 2 * 3
    with pytest.raises(ValueError, match="outside the pool"):
        prompted_conductor_outcomes(env, 1, repeats=1)


def test_reports_are_written_as_json_markdown_and_a_png(tmp_path, replay_env):
    results = run_baselines(replay_env, BaselineConfig(baselines=("single", "oracle")), repeats=1)
    paths = write_report(results, tmp_path, "replay test")
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["title"] == "replay test" and set(saved["methods"]) == set(results)
    markdown = (tmp_path / "results.md").read_text()
    assert "| oracle routing | " in markdown and "| method | arc_challenge | gsm8k |" in markdown
    image = matplotlib.image.imread(paths["plot"])
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 1000


def test_a_rerun_through_the_cache_makes_no_provider_calls(tmp_path):
    tasks = [exact_task(f"t{i}", question=f"What is {i} + {i}?", gold=str(2 * i)) for i in range(3)]
    config = BaselineConfig(baselines=("single", "moa", "self_reflection", "prompted_conductor"), worker=1,
                            reflection_revisions=1, prompted_max_tokens=64)  # fmt: skip
    with FakeOpenAI() as server:
        def evaluate_once():
            pool = [OpenAICompatibleWorker(name=f"fake-{i}", model=f"m{i}", base_url=server.base_url) for i in range(2)]
            with ResponseCache(tmp_path / "cache.sqlite") as cache:
                env = ConductorEnv(World("fake", pool, tasks), EnvConfig(executor=ExecutorConfig(seed=0)), cache)
                try:
                    return run_baselines(env, config, repeats=2), cache.hits, cache.misses
                finally:
                    env.close()

        first, _, first_misses = evaluate_once()
        calls = server.request_count
        second, hits, misses = evaluate_once()
    assert calls == first_misses and calls > 0
    assert server.request_count == calls and misses == 0
    for method, report in first.items():
        # worker calls count only calls that reached a provider; everything else repeats exactly
        assert second[method]["average"].pop("worker_calls", 0.0) == 0.0
        assert report["average"].pop("worker_calls", 0.0) > 0.0 or method.startswith("prompted")
        assert report["average"] == second[method]["average"], method
        assert report["workers_chosen"] == second[method]["workers_chosen"]
    assert second["prompted Conductor: worker 0"]["average"]["valid_format"] == 0.0


def test_bad_baseline_config_is_rejected(replay_env):
    with pytest.raises(ValueError, match="unknown baselines"):
        BaselineConfig(baselines=("single", "smoothie"))
    with pytest.raises(ValueError, match="^domain_best is renamed to task_best$"):
        BaselineConfig(baselines=("single", "domain_best"))
    with pytest.raises(ValueError, match="moa_layers"):
        BaselineConfig(moa_layers=0)
    with pytest.raises(ValueError, match="outside the pool"):
        run_baselines(replay_env, BaselineConfig(baselines=("consensus",), worker=7), repeats=1)
    with pytest.raises(ValueError, match="repeats"):
        run_baselines(replay_env, BaselineConfig(baselines=("single",)), repeats=0)


def test_workflow_outcomes_score_the_chosen_workflow_per_question_and_repeat(replay_env):
    chosen = []

    def choose(task, repeat):
        chosen.append((task.id, repeat))
        return single(repeat % 7)

    outcomes = workflow_outcomes(replay_env, choose, repeats=2)
    assert len(outcomes) == 2 * len(replay_env.world.tasks) == len(set(chosen))
    assert {(o.repeat, o.workers) for o in outcomes} == {(0, (0,)), (1, (1,))}


class RoutingGenerator:
    """A stand-in Conductor that routes question q to worker q mod 7, a new completion per `generate` call."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prompts_seen = 0

    def routed(self, prompt, worker: int) -> list[Completion]:
        """The group of one completion that sends `prompt` to `worker`."""
        text = completion_text(Workflow(steps=(Step(worker, "Solve it."),)))
        ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
        return [Completion(tuple(prompt), ids, (0.0,) * len(ids), "stop", 0)]

    def generate(self, prompt_ids, params, n, token_masks=None):
        groups = [self.routed(prompt, (self.prompts_seen + index) % 7) for index, prompt in enumerate(prompt_ids)]
        self.prompts_seen += len(prompt_ids)
        return groups


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_greedy_conductor_is_generated_once_and_rescored_each_repeat(replay_env, temperature):
    world = TokenizedConductorEnv(replay_env, load_tokenizer(zoo.smollm2_135m_instruct()))
    generator = RoutingGenerator(world.tokenizer)
    params = SamplingParams(temperature=temperature, max_new_tokens=32)
    outcomes = conductor_outcomes(generator, world, params, repeats=3, batch_questions=16)
    questions = world.num_questions
    assert len(outcomes) == 3 * questions
    assert generator.prompts_seen == (questions if temperature == 0 else 3 * questions)
    by_repeat = [outcomes[r * questions : (r + 1) * questions] for r in range(3)]
    assert all(o.repeat == r for r in range(3) for o in by_repeat[r])
    # Greedy: every repeat runs the one completion; sampled: the stand-in writes a new one per generate call.
    same_routes = all(o.workers == (q % 7,) for rows in by_repeat for q, o in enumerate(rows))
    assert same_routes == (temperature == 0)
    correct = np.array([[o.metrics["correct"] for o in rows] for rows in by_repeat])
    assert not (correct == correct[0]).all()  # the workers' outcomes are drawn anew each repeat


class SeededGenerator(RoutingGenerator):
    """A stand-in sampler that, like the torch generator, draws each row from the call's seed: row i of a call
    routes to a worker drawn by `default_rng([seed, i])`."""

    def generate(self, prompt_ids, params, n, token_masks=None):
        return [
            self.routed(prompt, int(np.random.default_rng([params.seed, i]).integers(7)))
            for i, prompt in enumerate(prompt_ids)
        ]


def test_a_sampled_conductor_draws_each_batch_and_repeat_afresh_and_reproducibly(replay_env):
    world = TokenizedConductorEnv(replay_env, load_tokenizer(zoo.smollm2_135m_instruct()))
    params = SamplingParams(temperature=1.0, max_new_tokens=32, seed=0)
    outcomes = conductor_outcomes(SeededGenerator(world.tokenizer), world, params, repeats=2, batch_questions=20)
    routes = np.array([o.workers[0] for o in outcomes]).reshape(2, -1, 20)  # repeat, batch, row
    assert routes.shape[1] >= 2
    # With one seed for every call, the repeats and the batches would all route alike.
    assert (routes[0] != routes[1]).mean() > 0.5 and (routes[0, 0] != routes[0, 1]).mean() > 0.5
    again = conductor_outcomes(SeededGenerator(world.tokenizer), world, params, repeats=2, batch_questions=20)
    assert [o.workers for o in again] == [o.workers for o in outcomes]


@pytest.mark.slow
def test_eval_command_writes_the_table_for_a_tiny_conductor_and_baselines(tmp_path):
    out = tmp_path / "eval"
    command = [
        sys.executable, "-m", "launch.eval", "--world=synthetic", "--synthetic_tasks=8", "--repeats=2",
        "--methods=conductor,single,oracle,moa", "--max_tokens=8", f"--logdir={out}",
        f"--cache={tmp_path / 'cache.sqlite'}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    methods = json.loads((out / "results.json").read_text())["methods"]
    assert list(methods)[:2] == ["Conductor (tiny)", "single 0: synthetic-0"]
    assert methods["Conductor (tiny)"]["average"]["valid_format"] == 0.0  # a random model writes no workflow
    assert methods["oracle routing"]["repeats"] == 2 and (out / "accuracy_tokens.png").stat().st_size > 10_000
    bad = subprocess.run([sys.executable, "-m", "launch.eval", "--methods=single,smoothie"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert bad.returncode != 0 and "smoothie" in bad.stderr


@pytest.mark.slow
def test_eval_command_learns_the_replay_bandit_on_the_training_files_given(tmp_path):
    """`--bandit_tasks`: the bandit learns each task's worker on the training files and answers the test questions
    with it; where the training files' best worker leads by a clear margin, that is the worker it chooses."""
    train_files, limit = ("gsm8k-train", "arc_challenge_train"), 60
    command = [
        sys.executable, "-m", "launch.eval", "--world=replay", "--tasks=gsm8k-test,arc_challenge_test",
        f"--task_limit={limit}", "--max_workflow_steps=1", "--expected_grades", "--methods=bandit",
        "--bandit_budget=4000", f"--bandit_tasks={','.join(train_files)}", f"--logdir={tmp_path}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (name, report), = json.loads((tmp_path / "results.json").read_text())["methods"].items()
    assert name == f"contextual UCB1 (4000 pulls, learned on {2 * limit} other questions)"
    training = build_world(ReplayWorldConfig(files=train_files, limit_per_file=limit)).tasks
    for label in ("gsm8k", "arc_challenge"):
        scores = np.mean([[t.metadata["scores"][m] for m in ROUTERDC_MODELS] for t in training if t.task_label == label], 0)
        first, second = np.sort(scores)[::-1][:2]
        if first - second > 0.05:
            assert report["workers_chosen_by_task"][label] == {ROUTERDC_MODELS[int(np.argmax(scores))]: 1.0}, label


class ScriptedConductor:
    """A stand-in Conductor that answers each question (found in its prompt) with the text scripted for it."""

    def __init__(self, tokenizer, texts: dict[str, str]):
        self.tokenizer, self.texts = tokenizer, texts
        self.calls: list[tuple[SamplingParams, int, int]] = []  # (params, prompts, n)
        self.prompts: list[str] = []

    def generate(self, prompt_ids, params, n, token_masks=None):
        self.calls.append((params, len(prompt_ids), n))
        groups = []
        for prompt in prompt_ids:
            text = self.tokenizer.decode(list(prompt))
            self.prompts.append(text)
            (question,) = [q for q in self.texts if f"Question:\n{q}\n" in text]
            ids = tuple(self.tokenizer.encode(self.texts[question], add_special_tokens=False))
            groups.append([Completion(tuple(prompt), ids, (0.0,) * len(ids), "stop", 0)] * n)
        return groups


def test_greedy_valid_format_counts_the_questions_whose_greedy_workflow_parses():
    tokenizer = load_tokenizer(zoo.smollm2_135m_instruct())
    valid = completion_text(Workflow(steps=(Step(1, "Solve it."),)))
    texts = {
        "What is 17 + 25?": valid,
        "Name the capital of France.": "\nmodel_id = [0]\nsubtasks = [[]]",
        "Write a haiku about rain.": valid,
        "Who wrote Hamlet?": completion_text(Workflow(steps=(Step(2, "Solve it."),))),  # no worker 2 of 2
        "Is 91 prime?": valid,
    }
    generator = ScriptedConductor(tokenizer, texts)
    validity = greedy_valid_format(generator, tokenizer, list(texts), pool_size=2, max_steps=5,
                                   access_mode="binary", max_new_tokens=48, batch_questions=2)  # fmt: skip
    assert (validity.valid, validity.questions, validity.rate) == (3, 5, 0.6)
    assert [question for question, _ in validity.failures] == ["Name the capital of France.", "Who wrote Hamlet?"]
    assert validity.failures[0][1].startswith("missing list") and "outside the pool" in validity.failures[1][1]
    assert [(params.temperature, params.max_new_tokens, size, n) for params, size, n in generator.calls] == [
        (0.0, 48, 2, 1), (0.0, 48, 2, 1), (0.0, 48, 1, 1)
    ]
    # prompted as the server prompts: the pool of two, the assistant turn opened with the planning prefix
    assert all("Model id 1" in p and "Model id 2" not in p for p in generator.prompts)
    assert all(p.endswith(prompts.CONDUCTOR_PREFIX) for p in generator.prompts)
    with pytest.raises(ValueError, match="no questions"):
        greedy_valid_format(generator, tokenizer, [], pool_size=2, max_steps=5, access_mode="binary",
                            max_new_tokens=48)  # fmt: skip


def test_held_out_questions_are_fresh_synthetic_ones_or_a_sample_of_the_worlds_own(replay_env):
    training = load_synthetic(40, seed=0)
    fresh = held_out_questions(training, 16, seed=0)
    assert len(fresh) == len(set(fresh)) == 16
    assert not set(fresh) & {task.question for task in training}
    generated = {task.question: task.task_label for task in load_synthetic(40 + 32, seed=0)}
    assert sorted(generated[q] for q in fresh) == sorted(TASK_LABELS * 4)  # the generator's next questions, all tasks
    own = held_out_questions(replay_env.world.tasks, 16, seed=3)
    assert len(set(own)) == 16 and set(own) <= {task.question for task in replay_env.world.tasks}
    assert own == held_out_questions(replay_env.world.tasks, 16, seed=3) != held_out_questions(
        replay_env.world.tasks, 16, seed=4)
    assert len(held_out_questions(replay_env.world.tasks, 10**6, seed=0)) == len(
        {task.question for task in replay_env.world.tasks})

"""The Conductor's warm-start probe of the question's task (`conductor.supervised.TaskProbe`) in the supervised
trainer, on tiny random models."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conductor.supervised import TaskProbe, probe_cross_entropy
from rl.supervised import Example, SFTConfig, SupervisedTrainer, marked_states
from tests.supervised_helpers import OPTIMIZER, log_softmax, tiny_model


def test_probe_cross_entropy_matches_numpy_and_skips_unlabelled_rows():
    rng = np.random.default_rng(1)
    hidden = rng.normal(size=(4, 6, 8)).astype(np.float32)
    probe = {"kernel": rng.normal(size=(8, 3)).astype(np.float32), "bias": rng.normal(size=3).astype(np.float32)}
    positions = np.array([0, 5, 2, 3])
    labels = np.array([2, 0, -1, 1])
    states = marked_states(jnp.asarray(hidden), jnp.asarray(positions))
    loss, accuracy = probe_cross_entropy(probe, states, jnp.asarray(labels))

    logits = hidden[np.arange(4), positions] @ probe["kernel"] + probe["bias"]
    logp = log_softmax(logits.astype(np.float64))
    labelled = labels >= 0
    expected_loss = -logp[labelled, labels[labelled]].mean()
    expected_accuracy = (logits.argmax(-1) == labels)[labelled].mean()
    np.testing.assert_allclose(float(loss), expected_loss, rtol=1e-5)
    assert float(accuracy) == pytest.approx(expected_accuracy)


def test_decision_probe_learns_the_label_from_the_prompt_while_the_target_stays_label_blind():
    # Four "tasks" marked by one prompt token; every completion is the same, so only the probe can use the label.
    completion = (20, 21, 22, 2)
    examples = [
        Example((3 + label, 40, 41, 42, 43), completion, probe_index=2, probe_label=label)
        for label in range(4)
        for _ in range(2)
    ]
    model = tiny_model()
    config = SFTConfig(optimizer=OPTIMIZER, batch_size=8, head=TaskProbe(4, 1.0))
    trainer = SupervisedTrainer(model, config)
    before = {name: np.asarray(value).copy() for name, value in trainer.head_params.items()}
    history = trainer.fit(examples, steps=60, pad_id=0)

    assert history[0]["probe_accuracy"] < 0.75
    assert history[-1]["probe_accuracy"] == 1.0
    assert history[-1]["probe_loss"] < 0.1
    assert history[-1]["nll"] < 0.1
    assert not np.allclose(before["kernel"], trainer.head_params["kernel"])
    # The probe reads the state that predicts completion token 2 (column completion_start + 1): the same column
    # gives the same trained-probe accuracy when recomputed here.
    batch = trainer.batch(examples, pad_id=0)
    hidden = model(jnp.asarray(batch.tokens), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask))
    labels = jnp.asarray([e.probe_label for e in examples])
    positions = jnp.full(len(examples), batch.completion_start + 1)
    _, accuracy = probe_cross_entropy(trainer.head_params, marked_states(hidden, positions), labels)
    assert float(accuracy) == 1.0


def test_the_probe_gradient_reaches_the_model_only_when_the_probe_is_on():
    examples = [Example((3 + label, 40, 41), (20, 21, 2), probe_index=1, probe_label=label) for label in range(2)]
    plain = SupervisedTrainer(tiny_model(), SFTConfig(optimizer=OPTIMIZER, batch_size=2))
    probed_config = SFTConfig(optimizer=OPTIMIZER, batch_size=2, head=TaskProbe(2, 5.0))
    probed = SupervisedTrainer(tiny_model(), probed_config)
    plain.fit(examples, steps=1, pad_id=0)
    probed.fit(examples, steps=1, pad_id=0)
    plain_params = jax.tree.leaves(nnx.state(plain.model, nnx.Param))
    probed_params = jax.tree.leaves(nnx.state(probed.model, nnx.Param))
    assert any(not np.allclose(a, b) for a, b in zip(plain_params, probed_params))


def test_decorrelation_drives_the_tasks_decision_states_apart_and_the_loss_leaves_them_shared_without_it():
    # Four tasks whose prompts differ in their first token only: their states start nearly parallel.
    examples = [
        Example((3 + label, 40, 41, 42, 43), (20, 21, 22, 2), probe_index=2, probe_label=label)
        for label in range(4)
        for _ in range(2)
    ]

    def overlap_after(decorrelation_weight: float) -> tuple[float, float]:
        config = SFTConfig(optimizer=OPTIMIZER, batch_size=8, head=TaskProbe(4, 0.1, decorrelation_weight))
        history = SupervisedTrainer(tiny_model(), config).fit(examples, steps=60, pad_id=0)
        return history[0]["state_overlap"], history[-1]["state_overlap"]

    plain_first, plain_last = overlap_after(0.0)
    decorrelated_first, decorrelated_last = overlap_after(1.0)
    assert plain_first == pytest.approx(decorrelated_first)  # the same model and batch before any step
    assert plain_first > 0.5
    assert decorrelated_last < 0.05 < plain_last


@pytest.mark.parametrize("decorrelation_weight", [0.0, 1.0])
def test_batches_missing_some_tasks_train_to_finite_parameters(decorrelation_weight):
    examples = [Example((3 + label, 40, 41), (20, 21, 2), probe_index=1, probe_label=label) for label in range(4)]
    config = SFTConfig(optimizer=OPTIMIZER, batch_size=2, head=TaskProbe(4, 0.1, decorrelation_weight))
    trainer = SupervisedTrainer(tiny_model(), config)
    history = trainer.fit(examples, steps=3, pad_id=0)
    assert all(np.isfinite(list(step.values())).all() for step in history)
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(nnx.state(trainer.model, nnx.Param)))


@pytest.mark.parametrize(
    "args",
    [(1, 1.0), (-2, 1.0), (4, 0.0), (4, -1.0), (4, 1.0, -0.5), (4, 1.0, float("nan"))],
)
def test_bad_probes_are_rejected(args):
    with pytest.raises(ValueError, match="TaskProbe"):
        TaskProbe(*args)


def test_the_probes_labels_are_checked():
    trainer = SupervisedTrainer(tiny_model(), SFTConfig(optimizer=OPTIMIZER, head=TaskProbe(2, 1.0)))
    with pytest.raises(ValueError, match=r"probe labels \[2\] outside \[0, 2\)"):
        trainer.fit([Example((1,), (2, 3), probe_index=0, probe_label=2)], steps=1, pad_id=0)

"""Chunked per-token log-probs equal the full log-softmax, in value and gradient, and never build [B, T, V]."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import ModelConfig, Transformer
from models.logprobs import ALL_BUT, ONLY, UNCONSTRAINED, state_entropy, token_logprobs
from tests import tiny_models
from tests.models.conftest import padded_batch

BATCH, LENGTH, VOCAB = 3, 10, 256


def make_model(family="qwen2"):
    return Transformer(ModelConfig.from_hf(tiny_models.tiny_config(family)), rngs=nnx.Rngs(0))


def make_inputs(model):
    tokens, positions, mask = (jnp.asarray(x) for x in padded_batch((10, 6, 2), LENGTH, VOCAB))
    hidden = model(tokens, positions, mask) * 20.0  # sharper distributions than the N(0, 0.02) init gives
    targets = jnp.roll(tokens, -1, axis=1)
    return hidden, targets


def reference_logprobs(model, hidden, targets, temperature):
    logits = np.asarray(model.logits(hidden), np.float64) / temperature
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    chosen = np.take_along_axis(log_probs, np.asarray(targets)[..., None], axis=-1)[..., 0]
    entropy = -(np.exp(log_probs) * log_probs).sum(-1)
    return chosen, entropy


def logit_rounding(model, hidden, temperature) -> float:
    """A bound on the float32 rounding of any logit / temperature: a dot product of d terms rounds to within
    d * 2^-24 of the sum of the terms' absolute values, whatever order the CPU sums them in."""
    weight = model.embed_tokens.embedding[...].T if model.config.tie_word_embeddings else model.lm_head.kernel[...]
    terms = np.abs(np.asarray(hidden, np.float64)) @ np.abs(np.asarray(weight, np.float64))
    return weight.shape[0] * 2.0**-24 * float(terms.max()) / temperature


@pytest.mark.parametrize("chunk_size", [1, 3, 5, 10, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_entropy_equal_numpy_log_softmax(chunk_size, temperature):
    model = make_model()
    hidden, targets = make_inputs(model)
    logp, entropy = token_logprobs(model, hidden, targets, temperature=temperature, chunk_size=chunk_size,
                                   return_entropy=True)
    expected_logp, expected_entropy = reference_logprobs(model, hidden, targets, temperature)
    assert logp.dtype == jnp.float32 and logp.shape == (BATCH, LENGTH)
    assert expected_logp.min() < -1.0 and expected_entropy.max() > 0.5  # a real distribution, not uniform
    # Against float64: a log-softmax moves by at most twice its largest logit's error, an entropy H by at most 2H
    # times it (|dH/dz_i| = p_i |log p_i + H|); the sum over the vocabulary adds V * 2^-24 of its own. That bound
    # (3e-4 for the log-probs here, 30 times the largest error a Xeon gave) holds on any CPU; a misplaced chunk is
    # off by O(1).
    rounding = logit_rounding(model, hidden, temperature) + VOCAB * 2.0**-24
    np.testing.assert_allclose(np.asarray(logp), expected_logp, atol=2 * rounding)
    np.testing.assert_allclose(np.asarray(entropy), expected_entropy, atol=2 * expected_entropy.max() * rounding)
    np.testing.assert_array_equal(np.asarray(token_logprobs(model, hidden, targets, temperature=temperature,
                                                            chunk_size=chunk_size)), np.asarray(logp))


@pytest.mark.parametrize("family", ["qwen2", "llama"])  # untied and tied LM heads
def test_token_logits_are_the_vocabulary_logits_at_each_token(family):
    model = make_model(family)
    hidden, targets = make_inputs(model)
    flat_hidden, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    every_logit = np.asarray(model.vocab_major_logits(flat_hidden))
    expected = every_logit[np.asarray(flat_targets), np.arange(flat_targets.shape[0])]
    np.testing.assert_allclose(np.asarray(model.token_logits(flat_hidden, flat_targets)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen2", "llama"])  # untied and tied LM heads
def test_chunked_gradients_equal_unchunked_gradients(family):
    model = make_model(family)
    tokens, positions, mask = (jnp.asarray(x) for x in padded_batch((10, 6, 2), LENGTH, VOCAB))
    targets = jnp.roll(tokens, -1, axis=1)
    weights = jax.random.normal(jax.random.key(0), (BATCH, LENGTH)) * mask

    def loss(model, chunk_size):
        hidden = model(tokens, positions, mask)
        logp, entropy = token_logprobs(model, hidden, targets, chunk_size=chunk_size, temperature=0.9,
                                       return_entropy=True)
        return jnp.sum(weights * logp) + 0.1 * jnp.sum(weights * entropy)

    def full_softmax_loss(model):
        logits = model.logits(model(tokens, positions, mask)).astype(jnp.float32) / 0.9
        log_probs = jax.nn.log_softmax(logits)
        logp = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
        entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
        return jnp.sum(weights * logp) + 0.1 * jnp.sum(weights * entropy)

    # Compiled, not run op by op: eagerly, each operation of the backward pass is compiled on its own.
    reference = nnx.jit(nnx.grad(full_softmax_loss))(model)
    for chunk_size in (3, LENGTH):
        grads = nnx.jit(nnx.grad(loss), static_argnums=1)(model, chunk_size)
        flat_ref, flat = jax.tree.leaves(reference), jax.tree.leaves(grads)
        assert len(flat) == len(flat_ref) and max(float(jnp.abs(g).max()) for g in flat_ref) > 1e-3
        # Chunks sum the gradient in another order: an entry rounds in proportion to its leaf's largest entry (see
        # tests/models/test_prefix_cache.py), 1e-5 of which bounds it; a wrong chunk boundary changes entries by O(1).
        for got, want in zip(flat, flat_ref):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5 * float(np.abs(want).max()),
                                       rtol=1e-4)


@pytest.mark.parametrize("chunk_size", [3, LENGTH])
def test_entropy_without_gradient_has_the_same_values_and_adds_nothing_to_the_gradient(chunk_size):
    model = make_model("llama")
    graphdef, params = nnx.split(model)
    hidden, targets = make_inputs(model)
    weights = jax.random.normal(jax.random.key(0), (BATCH, LENGTH))

    def loss(params, entropy_gradient):
        logp, entropy = token_logprobs(nnx.merge(graphdef, params), hidden, targets, chunk_size=chunk_size,
                                       return_entropy=True, entropy_gradient=entropy_gradient)
        return jnp.sum(weights * (logp + entropy)), entropy

    def logp_only_loss(params):
        return jnp.sum(weights * token_logprobs(nnx.merge(graphdef, params), hidden, targets, chunk_size=chunk_size))

    (_, entropy), grads = jax.value_and_grad(loss, has_aux=True)(params, False)
    (_, reference_entropy), with_entropy = jax.value_and_grad(loss, has_aux=True)(params, True)
    np.testing.assert_array_equal(np.asarray(entropy), np.asarray(reference_entropy))
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(jax.grad(logp_only_loss)(params))):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=1e-5)
    # The entropy does carry a gradient when asked to, so the check above is not vacuous.
    assert not all(np.allclose(np.asarray(got), np.asarray(other))
                   for got, other in zip(jax.tree.leaves(grads), jax.tree.leaves(with_entropy)))


@pytest.mark.parametrize("family", ["qwen2", "llama"])  # untied and tied LM heads
def test_state_entropy_is_the_full_softmax_entropy_of_each_state_in_value_and_gradient(family):
    model = make_model(family)
    graphdef, params = nnx.split(model)
    hidden, targets = make_inputs(model)
    states = hidden[jnp.arange(BATCH), jnp.array([0, 4, 9])]  # one chosen position per row
    _, expected = reference_logprobs(model, states[:, None], targets[:, :1], 0.7)
    # The logits' rounding moves H by at most 2H times it (as above); the float32 sums over the vocabulary in
    # log Z - sum_i p_i z_i add at most V * 2^-24 * max |z| of their own. A wrong state or temperature is off by O(0.1).
    largest_logit = float(np.abs(np.asarray(model.logits(states))).max()) / 0.7
    bound = 2 * expected.max() * logit_rounding(model, states, 0.7) + VOCAB * 2.0**-24 * largest_logit
    np.testing.assert_allclose(np.asarray(state_entropy(model, states, temperature=0.7)), expected[:, 0], atol=bound)
    choices = np.array([3, 50, 51, 200])
    chosen = np.asarray(model.logits(states), np.float64)[:, choices] / 0.7
    chosen = chosen - chosen.max(-1, keepdims=True)
    log_q = chosen - np.log(np.exp(chosen).sum(-1, keepdims=True))
    restricted = np.asarray(state_entropy(model, states, temperature=0.7, token_ids=tuple(choices)))
    np.testing.assert_allclose(restricted, -(np.exp(log_q) * log_q).sum(-1), atol=bound)
    weights = jnp.array([0.5, -1.0, 2.0])
    # Gradients at the model's own scale, as in the test above: at the sharpened one both forms cancel large logits.
    states = states / 20.0

    def full_softmax_loss(params):
        log_probs = jax.nn.log_softmax(nnx.merge(graphdef, params).logits(states) / 0.7)
        return jnp.sum(weights * -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1))

    got = jax.grad(lambda p: jnp.sum(weights * state_entropy(nnx.merge(graphdef, p), states, temperature=0.7)))(params)
    want = jax.grad(full_softmax_loss)(params)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(want)) > 1e-3
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5 * float(np.abs(w).max()), rtol=1e-4)


def _all_shapes(jaxpr):
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            yield tuple(getattr(var.aval, "shape", ()))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _all_shapes(inner)


def test_full_logits_never_exist_in_forward_or_backward():
    model = make_model()
    graphdef, params = nnx.split(model)
    hidden, targets = make_inputs(model)

    def loss(params, hidden):
        return token_logprobs(nnx.merge(graphdef, params), hidden, targets, chunk_size=2).sum()

    shapes = list(_all_shapes(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(params, hidden).jaxpr))
    # A chunk's logits are [V, B * chunk]; anything with a vocabulary axis and more tokens than that would be
    # logits beyond one chunk. The LM head ([hidden, V] or [V, hidden]) has the hidden width where tokens would be.
    hidden_width = model.config.hidden_size
    vocab_sized = [s for s in shapes if VOCAB in s and s not in ((hidden_width, VOCAB), (VOCAB, hidden_width))]
    chunk_sized = [s for s in vocab_sized if s == (VOCAB, BATCH * 2)]
    assert chunk_sized, "the per-chunk logits should appear"
    assert all(np.prod(s) <= VOCAB * BATCH * 2 for s in vocab_sized), f"logits larger than one chunk: {vocab_sized}"


def test_rejects_bad_arguments():
    model = make_model()
    hidden, targets = make_inputs(model)
    with pytest.raises(ValueError, match="targets must have shape"):
        token_logprobs(model, hidden, targets[:, 1:])
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(model, hidden, targets, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(model, hidden, targets, chunk_size=0)
    with pytest.raises(ValueError, match="hidden must be"):
        token_logprobs(model, hidden[0], targets)


@pytest.mark.parametrize("chunk_size", [3, 64])
def test_constrained_logprobs_are_those_of_the_distribution_renormalised_over_the_allowed_tokens(chunk_size):
    model = make_model("llama")
    hidden, targets = make_inputs(model)
    rng = np.random.default_rng(0)
    kinds = rng.choice([UNCONSTRAINED, ONLY, ALL_BUT], size=targets.shape).astype(np.int8)
    ids = np.full(targets.shape + (8,), -1, dtype=np.int32)
    for b, t in np.ndindex(targets.shape):
        listed = rng.choice(VOCAB, size=rng.integers(1, 8), replace=False)
        target = int(targets[b, t])
        # ONLY lists the target among its tokens, ALL_BUT leaves it out: the sampled token was allowed.
        listed = np.append(listed[listed != target], target) if kinds[b, t] == ONLY else listed[listed != target]
        ids[b, t, : len(listed)] = listed
    logp = token_logprobs(model, hidden, targets, temperature=0.7, chunk_size=chunk_size,
                          constraint_ids=jnp.asarray(ids), constraint_kinds=jnp.asarray(kinds))
    logits = np.asarray(model.logits(hidden), np.float64) / 0.7
    expected = np.empty(targets.shape)
    for b, t in np.ndindex(targets.shape):
        listed = ids[b, t][ids[b, t] >= 0]
        allowed = {UNCONSTRAINED: np.arange(VOCAB), ONLY: listed,
                   ALL_BUT: np.setdiff1d(np.arange(VOCAB), listed)}[int(kinds[b, t])]
        row = logits[b, t]
        expected[b, t] = row[int(targets[b, t])] - np.log(np.exp(row[allowed] - row.max()).sum()) - row.max()
    rounding = logit_rounding(model, hidden, 0.7) + VOCAB * 2.0**-24
    np.testing.assert_allclose(np.asarray(logp), expected, atol=2 * rounding)
    # A renormalised distribution, not the whole one: no token loses probability, several gain much.
    gain = np.asarray(logp) - np.asarray(token_logprobs(model, hidden, targets, temperature=0.7))
    assert (gain > -2 * rounding).all() and (gain[kinds != UNCONSTRAINED] > 1.0).sum() >= 5

    def total(h):
        return token_logprobs(model, h, targets, chunk_size=chunk_size, constraint_ids=jnp.asarray(ids),
                              constraint_kinds=jnp.asarray(kinds)).sum()

    assert np.isfinite(np.asarray(jax.grad(total)(hidden))).all()
    with pytest.raises(ValueError, match="come together"):
        token_logprobs(model, hidden, targets, constraint_ids=jnp.asarray(ids))
    with pytest.raises(ValueError, match="constraints must have shapes"):
        token_logprobs(model, hidden, targets, constraint_ids=jnp.asarray(ids[:, :2]),
                       constraint_kinds=jnp.asarray(kinds[:, :2]))

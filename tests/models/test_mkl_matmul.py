"""The MKL matmul (`models.mkl_matmul`): op(a) @ op(b) against numpy for every transpose pair, its gradient against
autodiff of `jnp.matmul`, `dot_general` taking it only for float32 projections, a model on it against the model on
XLA's dot and against `transformers`, the "auto" choice, and a clear error where the kernel cannot be built."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import ModelConfig, Transformer, hf_io, mkl_matmul
from tests import tiny_models
from tests.models.conftest import padded_batch
from tests.models.test_hf_parity import flax_logits, torch_logits

REASON = mkl_matmul.unavailable_reason()
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"the MKL kernel cannot run here: {REASON}")

TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]
# (batch or None, rows, contracted, columns): a single row, a contraction longer than either side, and batches.
SHAPES = [(None, 1, 7, 5), (None, 33, 130, 17), (None, 64, 8, 96), (3, 5, 11, 4), (24, 19, 64, 40)]


def _operands(rng, batch, rows, inner, columns, transpose_a, transpose_b):
    """Random `a`, `b` stored so that op(a) is [rows, inner] and op(b) is [inner, columns], and their product."""
    lead = () if batch is None else (batch,)
    a = rng.standard_normal((*lead, rows, inner), dtype=np.float32)
    b = rng.standard_normal((*lead, inner, columns), dtype=np.float32)
    stored_a = np.swapaxes(a, -1, -2).copy() if transpose_a else a
    stored_b = np.swapaxes(b, -1, -2).copy() if transpose_b else b
    return stored_a, stored_b, np.matmul(a.astype(np.float64), b.astype(np.float64))


@needs_kernel
@pytest.mark.parametrize("transpose_a, transpose_b", TRANSPOSES)
@pytest.mark.parametrize("batch, rows, inner, columns", SHAPES)
def test_matmul_equals_numpy_for_every_transpose_pair(batch, rows, inner, columns, transpose_a, transpose_b):
    a, b, expected = _operands(np.random.default_rng(0), batch, rows, inner, columns, transpose_a, transpose_b)
    got = jax.jit(mkl_matmul.matmul, static_argnums=(2, 3))(a, b, transpose_a, transpose_b)
    assert got.shape == expected.shape and got.dtype == jnp.float32
    # float32 products summed over `inner` terms of unit variance: rounding of order sqrt(inner) * 2^-24 per term.
    np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=1e-5 * np.sqrt(inner) * 4)


@needs_kernel
@pytest.mark.parametrize("transpose_a, transpose_b", TRANSPOSES)
@pytest.mark.parametrize("batch, rows, inner, columns", [(None, 33, 130, 17), (24, 19, 64, 40)])
def test_matmul_gradients_equal_autodiff_of_jnp_matmul(batch, rows, inner, columns, transpose_a, transpose_b):
    rng = np.random.default_rng(1)
    a, b, expected = _operands(rng, batch, rows, inner, columns, transpose_a, transpose_b)
    cotangent = jnp.asarray(rng.standard_normal(expected.shape, dtype=np.float32))

    def reference(a, b):
        op_a = jnp.swapaxes(a, -1, -2) if transpose_a else a
        op_b = jnp.swapaxes(b, -1, -2) if transpose_b else b
        return jnp.sum(jnp.matmul(op_a, op_b, precision="highest") * cotangent)

    def on_kernel(a, b):
        return jnp.sum(mkl_matmul.matmul(a, b, transpose_a, transpose_b) * cotangent)

    got = jax.jit(jax.grad(on_kernel, argnums=(0, 1)))(a, b)
    want = jax.grad(reference, argnums=(0, 1))(a, b)
    for got_grad, want_grad, stored in zip(got, want, (a, b)):
        assert got_grad.shape == stored.shape
        np.testing.assert_allclose(np.asarray(got_grad), np.asarray(want_grad), rtol=0,
                                   atol=1e-5 * np.abs(np.asarray(want_grad)).max())


@needs_kernel
def test_matmul_of_an_empty_contraction_is_zero_and_of_no_rows_is_empty():
    zeros = mkl_matmul.matmul(jnp.ones((3, 0)), jnp.ones((0, 4)))
    np.testing.assert_array_equal(np.asarray(zeros), np.zeros((3, 4), np.float32))
    assert mkl_matmul.matmul(jnp.ones((0, 5)), jnp.ones((5, 4))).shape == (0, 4)


def test_matmul_refuses_operands_it_cannot_take():
    with pytest.raises(ValueError, match="float32"):
        mkl_matmul.matmul(jnp.ones((2, 3), jnp.bfloat16), jnp.ones((3, 4)))
    with pytest.raises(ValueError, match="2-D or two 3-D"):
        mkl_matmul.matmul(jnp.ones((2, 3)), jnp.ones((1, 3, 4)))
    with pytest.raises(ValueError, match="contracted sizes differ: 3 and 5"):
        mkl_matmul.matmul(jnp.ones((2, 3)), jnp.ones((5, 4)))
    with pytest.raises(ValueError, match="batch sizes differ"):
        mkl_matmul.matmul(jnp.ones((2, 2, 3)), jnp.ones((3, 3, 4)))


def _uses_kernel(function, *args) -> bool:
    return "ffi_call" in str(jax.make_jaxpr(function)(*args))


@needs_kernel
def test_dot_general_takes_the_kernel_for_float32_projections_and_xla_for_the_rest():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((2, 5, 6), dtype=np.float32))
    kernel = jnp.asarray(rng.standard_normal((6, 4), dtype=np.float32))
    rows_kernel = kernel.T  # an [out, in] weight contracted on its second axis (a tied output head)
    projection = (((2,), (0,)), ((), ()))
    against_rows = (((2,), (1,)), ((), ()))
    for rhs, numbers in ((kernel, projection), (rows_kernel, against_rows)):
        assert _uses_kernel(lambda x, w: mkl_matmul.dot_general(x, w, numbers), x, rhs)
        np.testing.assert_allclose(mkl_matmul.dot_general(x, rhs, numbers),
                                   jax.lax.dot_general(x, rhs, numbers, precision="highest"), rtol=1e-5, atol=1e-5)
    batched = (((2,), (1,)), ((0,), (0,)))
    stacked = jnp.asarray(rng.standard_normal((2, 6, 4), dtype=np.float32))
    assert not _uses_kernel(lambda x, w: mkl_matmul.dot_general(x, w, batched), x, stacked)
    assert not _uses_kernel(lambda x, w: mkl_matmul.dot_general(x, w, projection), x.astype(jnp.bfloat16),
                            kernel.astype(jnp.bfloat16))


@needs_kernel
@pytest.mark.parametrize("family, tie", [("llama", True), ("qwen2", False), ("qwen3", True)])
def test_a_model_on_mkl_gives_the_values_and_gradients_of_the_model_on_xla(family, tie):
    tokens, positions, mask = (jnp.asarray(x) for x in padded_batch((70, 41, 5), 70, vocab_size=256))

    def value_and_grads(implementation):
        config = ModelConfig.from_hf(tiny_models.tiny_config(family, tie_word_embeddings=tie),
                                     matmul_implementation=implementation)
        model = Transformer(config, rngs=nnx.Rngs(0))

        def loss(model):
            # Left-padding rows are read by no real token, and the two attentions fill them differently.
            hidden = jnp.where(mask[..., None], model(tokens, positions, mask), 0.0)
            head = model.vocab_major_logits(hidden.reshape(-1, hidden.shape[-1]))
            return jnp.sum(model.logits(hidden) * mask[..., None]) * 1e-2 + jnp.mean(head**2)

        return model, nnx.value_and_grad(loss)(model)

    on_mkl, (mkl_loss, mkl_grads) = value_and_grads("mkl")
    on_xla, (xla_loss, xla_grads) = value_and_grads("xla")
    assert on_mkl.on_mkl and not on_xla.on_mkl
    np.testing.assert_allclose(mkl_loss, xla_loss, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(nnx.state(mkl_grads)), jax.tree.leaves(nnx.state(xla_grads))):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(np.asarray(want)).max())


@needs_kernel
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_model_on_mkl_matches_transformers(tiny_model_dir, family):
    model_dir = tiny_model_dir(family)
    tokens, positions, mask = padded_batch((100, 71, 40, 5), 100, vocab_size=256)
    expected = torch_logits(model_dir, tokens, positions, mask)
    actual = flax_logits(hf_io.load(model_dir, matmul_implementation="mkl"), tokens, positions, mask)
    assert np.abs(actual - expected)[mask].max() < 1e-4


@pytest.mark.parametrize("vendor, dtype, devices, expected", [
    ("GenuineIntel", "float32", 1, "mkl"),
    ("AuthenticAMD", "float32", 1, "xla"),
    ("GenuineIntel", "bfloat16", 1, "xla"),
    ("GenuineIntel", "float32", 4, "xla"),
])
def test_auto_takes_mkl_only_for_a_float32_model_on_one_intel_cpu_device(monkeypatch, vendor, dtype, devices,
                                                                          expected):
    monkeypatch.setattr(mkl_matmul, "cpuinfo_fields", lambda: {"vendor_id": vendor})
    monkeypatch.setattr(mkl_matmul, "unavailable_reason", lambda: None)
    monkeypatch.setattr(jax, "device_count", lambda: devices)
    assert mkl_matmul.resolve("auto", dtype) == expected
    assert mkl_matmul.resolve("xla", dtype) == "xla"


def test_without_the_kernel_auto_takes_xla_and_mkl_fails_with_the_reason(monkeypatch):
    monkeypatch.setattr(mkl_matmul, "cpuinfo_fields", lambda: {"vendor_id": "GenuineIntel"})
    monkeypatch.setattr(jax, "device_count", lambda: 1)
    monkeypatch.setattr(mkl_matmul, "unavailable_reason", lambda: "no C++ compiler")
    assert mkl_matmul.resolve("auto", "float32") == "xla"
    with pytest.raises(RuntimeError, match="matmul_implementation='mkl' cannot run here: no C\\+\\+ compiler"):
        mkl_matmul.resolve("mkl", "float32")
    with pytest.raises(ValueError, match="matmul_implementation must be one of"):
        mkl_matmul.resolve("eigen", "float32")
    with pytest.raises(ValueError, match="matmul_implementation must be one of"):
        ModelConfig.from_hf(tiny_models.tiny_config("llama"), matmul_implementation="eigen")


@pytest.mark.parametrize("library", mkl_matmul._LIBRARIES, ids=lambda library: library.source)
def test_the_kernel_is_built_once_into_the_cache_and_a_missing_compiler_is_named(monkeypatch, tmp_path, library):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(mkl_matmul, "_compiler", lambda: None)
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        mkl_matmul._build_kernel(library)
    monkeypatch.undo()
    if mkl_matmul._compiler() is None:
        pytest.skip("no C++ compiler here")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = mkl_matmul._build_kernel(library)
    assert built.parent == tmp_path / "conductor-rl" / "kernels" and built.stat().st_size > 0
    assert not list(built.parent.glob(".build-*"))  # the staging directory is gone
    monkeypatch.setattr(mkl_matmul.subprocess, "run", lambda *args, **kwargs: pytest.fail("compiled twice"))
    assert mkl_matmul._build_kernel(library) == built

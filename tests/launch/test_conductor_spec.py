"""`--matmul_implementation` reaches the Conductor the learner trains, and a name the models do not know is refused
when the spec is built, before any model is loaded."""

from __future__ import annotations

import pytest

from launch.conductor import ConductorSpec, load_conductor
from models import mkl_matmul


@pytest.mark.parametrize("implementation", ["xla", "mkl"])
def test_the_spec_s_matmul_implementation_is_the_loaded_model_s(tmp_path, implementation):
    if implementation == "mkl" and mkl_matmul.unavailable_reason() is not None:
        pytest.skip(f"the MKL kernel cannot run here: {mkl_matmul.unavailable_reason()}")
    spec = ConductorSpec(name="tiny", tiny_layers=1, tiny_width=64, matmul_implementation=implementation)
    model, _, _ = load_conductor(spec, tmp_path)
    assert model.config.matmul_implementation == implementation
    assert model.on_mkl == (implementation == "mkl")


def test_an_unknown_matmul_implementation_is_refused():
    with pytest.raises(ValueError, match="matmul_implementation must be one of"):
        ConductorSpec(matmul_implementation="eigen")

"""Every flagfile shipped in launch/configs/ parses against the flags of `launch.train` and `launch.sft` (a renamed
flag breaks it): a training flagfile and a `launch.sft` one (one that sets --sft_out)."""

from __future__ import annotations

import pathlib

import pytest
from absl import flags
from absl.testing import flagsaver

# Every launcher is imported: importing one (for its functions, as tests do) must not make a flag of its own
# required in other programs' parses of the global FLAGS.
from launch import benchmark, sft, sglang_servers, train  # noqa: F401  (train and sft define the flagfiles' flags)

CONFIGS = sorted((pathlib.Path(__file__).resolve().parents[2] / "launch" / "configs").glob("*.cfg"))


def _settings(path: pathlib.Path) -> dict[str, str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return {name: value for name, _, value in (line[2:].partition("=") for line in lines if line.startswith("--"))}


def test_the_shipped_flagfiles_are_found():
    assert {path.name for path in CONFIGS} >= {
        "paper.cfg", "quickstart.cfg", "synthetic.cfg", "replay_routerdc.cfg", "serve_local.cfg"
    }


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_a_shipped_flagfile_parses_and_sets_its_values(path):
    settings = _settings(path)
    with flagsaver.flagsaver():
        flags.FLAGS(["train", f"--flagfile={path}"])
        assert flags.FLAGS["world"].value == settings["world"]
        if "sft_out" in settings:
            assert flags.FLAGS["sft_out"].value == settings["sft_out"]
            assert flags.FLAGS["sft_steps"].value == int(settings["sft_steps"])
        else:
            assert flags.FLAGS["logdir"].value == settings["logdir"]
            assert flags.FLAGS["iterations"].value == int(settings["iterations"])

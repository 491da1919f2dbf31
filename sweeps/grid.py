"""A sweep's grid of runs: one `launch.train` flag's values times seeds (`Sweep`, `Run`, `plan`), checked against
launch.train's flags before any run starts, and the command each run trains with."""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import pathlib
import re
import sys
from typing import Sequence

from absl import flags

# Set by the comparison for every run; a sweep over one of them would be overwritten.
RESERVED_FLAGS = frozenset({"seed", "logdir", "checkpoint_dir", "flagfile", "resume"})


@dataclasses.dataclass(frozen=True)
class Sweep:
    flag: str
    values: tuple[str, ...]

    def __post_init__(self):
        if not self.flag:
            raise ValueError("the sweep names no flag")
        if not self.values or any(not value for value in self.values):
            raise ValueError(f"--sweep={self.flag}=... needs one or more non-empty values, got {list(self.values)}")
        if len(set(self.values)) != len(self.values):
            raise ValueError(f"--sweep repeats a value: {list(self.values)}")
        names = [value_dirname(self.flag, value) for value in self.values]
        if len(set(names)) != len(names):
            raise ValueError(f"--sweep values {list(self.values)} map to the same directory names {names}")


@dataclasses.dataclass(frozen=True)
class Run:
    value: str
    seed: int
    logdir: pathlib.Path


def parse_sweep(spec: str, separator: str = ",") -> Sweep:
    """`FLAG=v1,v2,...` -> Sweep (a leading `--` on FLAG is allowed)."""
    flag, equals, values = spec.partition("=")
    if not equals:
        raise ValueError(f"--sweep={spec!r}: expected FLAG=v1{separator}v2{separator}...")
    return Sweep(flag.strip().removeprefix("--"), tuple(value.strip() for value in values.split(separator)))


def check_sweep(sweep: Sweep, train_flags: flags.FlagValues) -> None:
    """Raises ValueError, naming the problem, unless `sweep.flag` is a flag of launch.train that a sweep may set and
    every value parses as that flag's type (choices and bounds included)."""
    if sweep.flag in RESERVED_FLAGS:
        raise ValueError(f"--{sweep.flag} is set by the comparison for every run; it cannot be swept")
    if sweep.flag not in train_flags:
        close = difflib.get_close_matches(sweep.flag, list(train_flags), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"launch.train has no flag --{sweep.flag}{hint}")
    parser = train_flags[sweep.flag].parser
    for value in sweep.values:
        try:
            parser.parse(value)
        except (ValueError, TypeError) as error:
            raise ValueError(f"--{sweep.flag}={value} is not a valid value: {error}") from error


def check_train_args(args: Sequence[str], train_flags: flags.FlagValues) -> None:
    """Raises ValueError naming the first argument that launch.train would reject: a flag it does not define, a value
    its flag cannot parse, or a positional argument; or that would mix the runs: a `--checkpoint_dir`."""
    for arg in args:
        if not arg.startswith("-"):
            raise ValueError(f"launch.train takes no positional argument, got {arg!r}")
        name, equals, value = arg.lstrip("-").partition("=")
        if name == "checkpoint_dir":
            raise ValueError(f"{arg}: every run would write its checkpoints there and resume from another's; each "
                             "keeps them in its own --logdir")
        if name in train_flags:
            if equals:
                try:
                    train_flags[name].parser.parse(value)
                except (ValueError, TypeError) as error:
                    raise ValueError(f"{arg}: {error}") from error
            elif train_flags[name].boolean is False:
                raise ValueError(f"{arg} needs a value")
        elif not (name.startswith("no") and name[2:] in train_flags and train_flags[name[2:]].boolean and not equals):
            raise ValueError(f"launch.train has no flag {arg.split('=')[0]}")


def value_dirname(flag: str, value: str) -> str:
    """`FLAG=value` with every character a file name should not hold replaced by `_`."""
    return re.sub(r"[^A-Za-z0-9._=+,-]", "_", f"{flag}={value}")


def seeds_from_flags(seeds: Sequence[str] | None, num_seeds: int) -> list[int]:
    chosen = [int(seed) for seed in seeds] if seeds else list(range(num_seeds))
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"--seeds repeats a seed: {chosen}")
    return chosen


def plan(sweep: Sweep, seeds: Sequence[int], out: pathlib.Path, value_major: bool = False) -> list[Run]:
    """Every (value, seed) run, seed-major: with fewer runs at once than runs, each value has a seed done early.
    `value_major`: every seed of a value before the next value, so where the runs of a seed share its warm-start,
    the first runs at once warm up different seeds and the later ones find theirs made."""
    pairs = ((seed, value) for value, seed in itertools.product(sweep.values, seeds)) if value_major else (
        itertools.product(seeds, sweep.values))
    return [Run(value, seed, out / value_dirname(sweep.flag, value) / f"seed={seed}") for seed, value in pairs]


def train_command(train_args: Sequence[str], flag: str, run: Run) -> list[str]:
    """`launch.train` with the shared arguments; later flags win in absl, so the run's own override any given."""
    return [sys.executable, "-m", "launch.train", *train_args, f"--{flag}={run.value}", f"--seed={run.seed}",
            f"--logdir={run.logdir}"]


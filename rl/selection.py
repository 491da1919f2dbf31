"""The run's selected weights: of the states a run passes through, the one that scored best on held-out questions.

RL can carry a policy past its best held-out score while its training reward still rises (a warm-started policy that
already fits its training questions drifts on the questions it never saw), so a run may end on the weights that
scored best on a held-out split instead of its last ones: early stopping on a validation score, as verl's validation
pass and transformers' `load_best_model_at_end` do. The caller scores the policy (after the warm-start, at each
checkpoint: `TrainingLoop(after_checkpoint=...)`) and hands each score to `BestCheckpoint.consider`; the state that
scores strictly best is saved whole (an orbax checkpoint, `rl.checkpoint.Checkpointer`, keeping one), so a resumed run
still chooses among every score it saw, and `restore` loads it back into the learner at the end. A tie keeps the
earlier state, the one fewer updates away from where the run started.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

import jax

from rl.checkpoint import Checkpointer
from rl.learner import Learner


class BestCheckpoint:
    """`consider(step, score, learner, rng_key, loop_state)` keeps the highest-scoring state under `directory`;
    `scores` maps each step considered to its score, `best_step` is the step kept (None before any)."""

    def __init__(self, directory: str | pathlib.Path, *, write_scores: bool = True):
        self.directory = pathlib.Path(directory).absolute()
        self._checkpointer = Checkpointer(self.directory / "state", keep=1)
        self._scores_path = self.directory / "scores.json"
        # Every process of a multi-process run saves the state (a collective); one writes the scores file.
        self._write_scores = write_scores
        self.scores: dict[int, float] = {}
        if self._scores_path.exists():
            self.scores = {int(step): float(score) for step, score in json.loads(self._scores_path.read_text()).items()}
        self.best_step = self._checkpointer.latest_step()
        if self.best_step is not None and self.best_step not in self.scores:
            raise ValueError(f"{self.directory} keeps step {self.best_step} without its score in {self._scores_path}")

    def consider(self, step: int, score: float, learner: Learner, rng_key: jax.Array, loop_state: dict[str, Any]
                 ) -> bool:
        """Records `score` for `step`; saves the learner's state when it beats every earlier score. True if saved."""
        if not math.isfinite(score):
            raise ValueError(f"step {step} scored {score}: a selection score must be a finite number")
        if step in self.scores:
            raise ValueError(f"step {step} was already considered (score {self.scores[step]})")
        if self.scores and step < max(self.scores):
            raise ValueError(f"step {step} comes before step {max(self.scores)}, already considered")
        best = self.best_step is None or score > self.scores[self.best_step]
        self.scores[step] = score
        # The score before the state: a run killed between the two keeps the earlier state and every kept state's
        # score (orbax writes a checkpoint whole or not at all).
        if self._write_scores:
            self.directory.mkdir(parents=True, exist_ok=True)
            partial = self._scores_path.with_suffix(".partial")
            partial.write_text(json.dumps({str(s): v for s, v in sorted(self.scores.items())}))
            partial.replace(self._scores_path)
        if best:
            self._checkpointer.save(step, learner, rng_key, loop_state)
            self.best_step = step
        return best

    def restore(self, learner: Learner) -> int:
        """Loads the kept state into `learner`; returns its step."""
        restored = self._checkpointer.restore(learner)
        if restored is None:
            raise ValueError(f"{self.directory} keeps no state: consider() a score first")
        return restored[0]

    def close(self) -> None:
        self._checkpointer.close()

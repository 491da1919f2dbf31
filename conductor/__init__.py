"""The Conductor application: everything of this project's own above the general libraries `rl`, `env`, `rollout`
and `models`, and below the entry points in `launch` (docs/design.md section 1).

- Its research over the GRPO library: importing `conductor.advantages` registers its advantage transforms
  (balance_routes, pool_routes, route_propensity) and `conductor.losses` its auxiliary loss terms (route_entropy,
  decorrelation) in rl's registries; `conductor.supervised.TaskProbe` is the warm-start's probe of the question's
  task.
- What the entry points run: the Conductor model (`model`), its environment (`conductor_env`, `loop_environment`),
  generators, teachers and the warm-start, outcomes, baselines (`bandit` among them) and reports, and the process
  plumbing (`console`, `distributed`, `host_memory`). Each takes typed configs; `launch`'s flag groups build them.

The package itself imports none of them: `conductor.host_memory` must be importable before JAX starts.
"""

# Per-rollout metrics the one-line progress report shows, when the environment reports them (`LoopConfig`).
HEADLINE_METRICS = ("correct", "valid_format", "oracle_route", "steps", "worker_calls", "tokens", "cost_usd")

"""The Conductor's own research on top of the general GRPO library `rl`: what its routing needs of the learner.

Importing the package registers its advantage transforms (`conductor.advantages`: balance_routes, pool_routes,
route_propensity) and auxiliary loss terms (`conductor.losses`: route_entropy, decorrelation) in rl's registries;
`conductor.supervised.TaskProbe` is the warm-start's probe of the question's task. `launch` binds them to flags.
It sits above `rl`, `env`, `rollout` and `models` and below `launch` (docs/design.md section 1).
"""

from conductor import advantages, losses, supervised  # noqa: F401  (registers the transforms and terms)

# Per-rollout metrics the one-line progress report shows, when the environment reports them (`LoopConfig`).
HEADLINE_METRICS = ("correct", "valid_format", "oracle_route", "steps", "worker_calls", "tokens", "cost_usd")

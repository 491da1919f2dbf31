"""TorchGenerator's sampling time with a prompt's rows sharing one prefill, against every row encoding its prompt.

    python scripts/shared_prefill_ab.py [--prompts=20 --n=8 --repeats=3]

The replay recipe's shape (`launch/configs/replay_rl.cfg`): the tiny Conductor (2 layers x 128, SmolLM2's 49,152-token
vocabulary, random weights), 20 prompts of 380-560 tokens, 8 completions each, 60 new tokens (its completions' mean
length), temperature 0.7, no stop. Shared: `generate(prompts, n)`; per row: `generate(each prompt n times, 1)`, which
encodes every row as the generator did before the prefill was shared. Both draw from the same row seeds and must
return the same tokens (checked). Runs alternate so load from other processes hits both alike; medians printed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import transformers

from launch.conductor import tiny_conductor_config
from rollout.torch_generator import TorchGenerator
from rollout.types import SamplingParams

VOCAB = 49_152


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--new_tokens", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**tiny_conductor_config(VOCAB, layers=2, width=128))
    generator = TorchGenerator(transformers.LlamaForCausalLM(config))
    generator.model.generation_config.eos_token_id = None
    generator.model.config.eos_token_id = None
    rng = random.Random(0)
    prompts = [[rng.randrange(1_000, 40_000) for _ in range(rng.randint(380, 560))] for _ in range(args.prompts)]
    copies = [prompt for prompt in prompts for _ in range(args.n)]
    params = SamplingParams(temperature=0.7, max_new_tokens=args.new_tokens, seed=0)

    def shared() -> list[tuple[int, ...]]:
        return [c.completion_ids for group in generator.generate(prompts, params, args.n) for c in group]

    def per_row() -> list[tuple[int, ...]]:
        return [c.completion_ids for (c,) in generator.generate(copies, params, 1)]

    if shared() != per_row():
        raise SystemExit("the shared prefill sampled other tokens than the per-row prefill")
    times: dict[str, list[float]] = {"one_prefill": [], "per_row": []}
    for repeat in range(args.repeats):
        for name, run in (("one_prefill", shared), ("per_row", per_row)):
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
        print(f"run {repeat}: shared {times['one_prefill'][-1]:.2f}s, per row {times['per_row'][-1]:.2f}s")
    shared_s, per_row_s = statistics.median(times["one_prefill"]), statistics.median(times["per_row"])
    print(
        f"{args.prompts} prompts x {args.n}, {args.new_tokens} new tokens, {torch.get_num_threads()} threads: "
        f"shared prefill {shared_s:.2f}s, per-row prefill {per_row_s:.2f}s, {per_row_s / shared_s:.2f}x"
    )


if __name__ == "__main__":
    main()

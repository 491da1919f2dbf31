"""TorchGenerator on tiny random transformers models: sampler log-probs, greedy parity, seeds, stops, updates."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from rollout.sampling import constrain_logprobs, filter_logits, inverse_cdf_draw
from rollout.torch_generator import TorchGenerator
from rollout.types import SamplingParams, TokenConstraint
from tests.tiny_models import tiny_hf_model_dir

PROMPTS = [[5, 17, 33, 9], [100, 7], [64, 65, 66]]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_dir(request, tmp_path_factory):
    return tiny_hf_model_dir(tmp_path_factory.mktemp(request.param), request.param, seed=0)


def reference_logprobs(model, prompt, completion, temperature):
    """log_softmax(logits / T) of each completion token from one unpadded full forward pass."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_sampler_logprobs_are_unfiltered_tempered_logprobs_of_left_padded_rows(model_dir):
    generator = TorchGenerator(model_dir)
    params = SamplingParams(temperature=3.0, top_p=0.8, top_k=20, max_new_tokens=12, seed=3)
    groups = generator.generate(PROMPTS, params, n=2)

    assert [len(group) for group in groups] == [2, 2, 2]
    for prompt, group in zip(PROMPTS, groups):
        for completion in group:
            assert completion.prompt_ids == tuple(prompt)
            assert completion.policy_version == 0
            expected = reference_logprobs(generator.model, prompt, completion.completion_ids, 3.0)
            np.testing.assert_allclose(completion.logprobs, expected.numpy(), atol=1e-5)


def test_greedy_matches_transformers_generate_and_reports_temperature_one_logprobs(model_dir):
    generator = TorchGenerator(model_dir)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups = generator.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=10), n=1)
    for prompt, (completion,) in zip(PROMPTS, groups):
        expected = reference.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False, max_new_tokens=10, pad_token_id=0,
        )[0, len(prompt):].tolist()
        assert list(completion.completion_ids) == expected
        np.testing.assert_allclose(
            completion.logprobs, reference_logprobs(reference, prompt, expected, 1.0).numpy(), atol=1e-5
        )


def test_seed_makes_sampling_reproducible(model_dir):
    generator = TorchGenerator(model_dir)
    # The tiny random models are sharply peaked; a high temperature makes samples differ.
    params = SamplingParams(temperature=5.0, max_new_tokens=8, seed=11)
    first = generator.generate(PROMPTS, params, n=3)
    again = generator.generate(PROMPTS, params, n=3)
    other = generator.generate(PROMPTS, SamplingParams(temperature=5.0, max_new_tokens=8, seed=12), n=3)
    ids = lambda groups: [c.completion_ids for g in groups for c in g]
    assert ids(first) == ids(again)
    assert ids(first) != ids(other)
    assert len(set(ids(first)[:3])) > 1, "the n samples of one prompt should differ"


def test_a_row_samples_by_its_own_seed_whichever_prompts_share_its_call(model_dir):
    # Row r of a call draws from seed + r, so a prompt asked alone with its rows' seeds samples what it did in a call
    # with other prompts (and other left padding): rl.loop splits a batch over processes and relies on it.
    generator = TorchGenerator(model_dir)
    params = SamplingParams(temperature=5.0, max_new_tokens=8, seed=11)
    together = generator.generate(PROMPTS, params, n=2)
    for index, prompt in enumerate(PROMPTS):
        own_seeds = SamplingParams(temperature=5.0, max_new_tokens=8, seed=11 + 2 * index)
        (alone,) = generator.generate([prompt], own_seeds, n=2)
        assert [c.completion_ids for c in alone] == [c.completion_ids for c in together[index]]
        for mine, theirs in zip(alone, together[index]):
            np.testing.assert_allclose(mine.logprobs, theirs.logprobs, atol=1e-5)


def test_a_prompts_n_rows_share_one_prefill_and_sample_what_n_copies_of_it_sample(model_dir):
    # generate(prompts, n) encodes each prompt once and repeats its cache; the same prompts listed n times each
    # (n = 1) are encoded row by row. Row seeds agree (seed + row), so the two must sample the same completions.
    generator = TorchGenerator(model_dir)
    params = SamplingParams(temperature=5.0, max_new_tokens=8, seed=5)
    encoded_rows = []
    hook = generator.model.register_forward_pre_hook(
        lambda module, args, kwargs: encoded_rows.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    shared = [c for group in generator.generate(PROMPTS, params, n=3) for c in group]
    hook.remove()
    assert encoded_rows[0] == (len(PROMPTS), max(map(len, PROMPTS)))  # the prefill: one row per prompt
    assert all(shape == (3 * len(PROMPTS), 1) for shape in encoded_rows[1:])  # each decoding step: every row
    copies = [prompt for prompt in PROMPTS for _ in range(3)]
    separate = [c for (c,) in generator.generate(copies, params, n=1)]
    assert [c.completion_ids for c in shared] == [c.completion_ids for c in separate]
    assert len({c.completion_ids for c in shared[:3]}) > 1, "a prompt's rows should still sample apart"
    for mine, theirs in zip(shared, separate):
        assert mine.prompt_ids == theirs.prompt_ids and mine.finish_reason == theirs.finish_reason
        np.testing.assert_allclose(mine.logprobs, theirs.logprobs, atol=1e-5)


def test_each_sequence_stops_at_its_own_stop_token_and_keeps_it(model_dir):
    generator = TorchGenerator(model_dir)
    greedy = generator.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=10), n=1)
    free_run = list(greedy[0][0].completion_ids)
    stop_token = free_run[3]
    stopped = generator.generate(
        PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=10, stop_token_ids=(stop_token,)), n=1
    )
    first = stopped[0][0]
    assert list(first.completion_ids) == free_run[: free_run.index(stop_token) + 1]
    assert first.finish_reason == "stop"
    assert first.logprobs == pytest.approx(greedy[0][0].logprobs[: len(first.completion_ids)], abs=1e-6)
    for before, after in zip(greedy[1:], stopped[1:]):
        full = list(before[0].completion_ids)
        if stop_token in full:
            assert list(after[0].completion_ids) == full[: full.index(stop_token) + 1]
        else:
            assert list(after[0].completion_ids) == full and after[0].finish_reason == "length"


def test_model_eos_stops_generation(tmp_path):
    model_dir = tiny_hf_model_dir(tmp_path, "llama", seed=0)
    probe = TorchGenerator(model_dir).generate([[5, 17]], SamplingParams(temperature=0.0, max_new_tokens=6), n=1)
    free_run = list(probe[0][0].completion_ids)
    eos = free_run[2]
    generator = TorchGenerator(tiny_hf_model_dir(tmp_path / "eos", "llama", seed=0, eos_token_id=eos))
    (completion,), = generator.generate([[5, 17]], SamplingParams(temperature=0.0, max_new_tokens=6), n=1)
    assert list(completion.completion_ids) == free_run[: free_run.index(eos) + 1]
    assert completion.finish_reason == "stop"


def test_update_weights_copies_in_place_bumps_version_and_changes_outputs(tmp_path):
    generator = TorchGenerator(tiny_hf_model_dir(tmp_path / "a", "llama", seed=0))
    donor = transformers.AutoModelForCausalLM.from_pretrained(tiny_hf_model_dir(tmp_path / "b", "llama", seed=1))
    pointers = {name: p.data_ptr() for name, p in generator.model.named_parameters()}
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    before = generator.generate(PROMPTS, params, n=1)

    generator.update_weights(dict(donor.state_dict()), version=5)

    assert {name: p.data_ptr() for name, p in generator.model.named_parameters()} == pointers
    assert generator.model.lm_head.weight.data_ptr() == generator.model.model.embed_tokens.weight.data_ptr()
    after = generator.generate(PROMPTS, params, n=1)
    assert all(group[0].policy_version == 5 for group in after)
    for prompt, (completion,) in zip(PROMPTS, after):
        expected = reference_logprobs(donor, prompt, completion.completion_ids, 1.0)
        np.testing.assert_allclose(completion.logprobs, expected.numpy(), atol=1e-5)
    assert [c.logprobs for g in before for c in g] != [c.logprobs for g in after for c in g]


def test_update_weights_rejects_unknown_names_and_wrong_shapes_without_touching_the_model(tmp_path):
    generator = TorchGenerator(tiny_hf_model_dir(tmp_path, "llama", seed=0))
    original = {name: p.clone() for name, p in generator.model.state_dict().items()}
    with pytest.raises(KeyError, match="not parameters"):
        generator.update_weights({"model.norm.weight": torch.zeros(64), "model.typo.weight": torch.zeros(1)}, 1)
    with pytest.raises(ValueError, match=r"model.norm.weight: got shape \(3,\)"):
        generator.update_weights({"model.embed_tokens.weight": torch.zeros(256, 64), "model.norm.weight": torch.zeros(3)}, 1)
    for name, value in generator.model.state_dict().items():
        torch.testing.assert_close(value, original[name])
    assert generator.policy_version == 0


def test_bad_generate_input_and_closed_generator(tmp_path):
    generator = TorchGenerator(tiny_hf_model_dir(tmp_path, "llama", seed=0))
    with pytest.raises(ValueError, match="n must be"):
        generator.generate([[1]], SamplingParams(), n=0)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generator.generate([[1], []], SamplingParams(), n=1)
    assert generator.generate([], SamplingParams(), n=2) == []
    generator.close()
    with pytest.raises(RuntimeError, match="closed"):
        generator.generate([[1]], SamplingParams(), n=1)


def reference_filter(logits: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Row-by-row numpy top-k then top-p (keep the smallest prefix of sorted tokens whose mass reaches top_p)."""
    out = logits.copy()
    for row in out:
        if top_k > 0:
            row[row < np.sort(row)[-top_k]] = -np.inf
        order = np.argsort(-row, kind="stable")
        probs = np.exp(row[order] - row[order][0])
        probs /= probs.sum()
        keep = np.searchsorted(np.cumsum(probs), top_p) + 1
        row[order[keep:]] = -np.inf
    return out


@pytest.mark.parametrize("top_k,top_p", [(0, 0.5), (5, 1.0), (8, 0.7), (1, 0.9)])
def test_filter_logits_matches_numpy_reference(top_k, top_p):
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(top_k))
    filtered = filter_logits(logits, top_k=top_k, top_p=top_p)
    np.testing.assert_array_equal(filtered.numpy(), reference_filter(logits.numpy(), top_k, top_p))
    assert torch.isfinite(filtered).any(dim=-1).all()


def test_inverse_cdf_draw_samples_the_distribution_and_never_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    draws = torch.stack([inverse_cdf_draw(probs, torch.Generator().manual_seed(seed)) for seed in range(20000)])
    frequencies = torch.stack([torch.bincount(draws[:, row], minlength=6) for row in range(2)]).double() / 20000
    # Three standard errors of a Bernoulli frequency with p <= 0.5 over 20,000 draws is about 0.011.
    np.testing.assert_allclose(frequencies.numpy(), probs.double().numpy(), atol=0.011)
    assert frequencies[0, [0, 2, 5]].sum() == 0 and frequencies[1, 5] == 1


class EvenAfterOdd:
    """A grammar over a prompt's completions: after a token of odd id, only even tokens below 40; else anything but
    tokens 0-9."""

    def __init__(self):
        self.calls = []

    def constraint(self, completion_ids):
        self.calls.append(tuple(completion_ids))
        if completion_ids and completion_ids[-1] % 2:
            return TokenConstraint(tuple(range(0, 40, 2)), only=True)
        return TokenConstraint(tuple(range(10)), only=False)


def test_constrain_logprobs_renormalises_each_row_over_its_allowed_tokens_as_numpy_does():
    logprobs = torch.log_softmax(torch.randn(3, 12, generator=torch.Generator().manual_seed(0)), -1)
    constraints = [TokenConstraint((2, 5, 7), only=True), None, TokenConstraint((0, 1, 11), only=False)]
    masked = constrain_logprobs(logprobs, constraints).numpy()
    reference = logprobs.numpy().astype(np.float64)
    for row, keep in ((0, [2, 5, 7]), (2, [t for t in range(12) if t not in (0, 1, 11)])):
        expected = np.full(12, -np.inf)
        expected[keep] = reference[row, keep] - np.log(np.exp(reference[row, keep]).sum())
        np.testing.assert_allclose(masked[row], expected, atol=1e-6)
    np.testing.assert_array_equal(masked[1], logprobs[1].numpy())
    with pytest.raises(ValueError, match="leaves no token"):
        constrain_logprobs(logprobs, [TokenConstraint((99,), only=True), None, None])
    with pytest.raises(ValueError, match="2 constraints for 3 rows"):
        constrain_logprobs(logprobs, [None, None])
    with pytest.raises(ValueError, match="empty set"):
        TokenConstraint((), only=True)


@pytest.mark.parametrize("temperature", [0.0, 2.0])
def test_token_masks_constrain_every_step_and_logprobs_are_the_masked_distributions(model_dir, temperature):
    generator = TorchGenerator(model_dir)
    mask = EvenAfterOdd()
    params = SamplingParams(temperature=temperature, max_new_tokens=10, seed=1)
    groups = generator.generate(PROMPTS, params, n=2, token_masks=[mask, None, mask])
    unconstrained_first = groups[1][0]
    for prompt, group, masked in zip(PROMPTS, groups, (True, False, True)):
        for completion in group:
            tokens = list(completion.completion_ids)
            full = reference_logprobs(generator.model, prompt, tokens, temperature or 1.0)
            expected = []
            for step, token in enumerate(tokens):
                constraint = EvenAfterOdd().constraint(tokens[:step]) if masked else None
                if constraint is None:
                    expected.append(float(full[step]))
                    continue
                allowed = [t for t in range(generator.model.config.vocab_size)
                           if (t in constraint.token_ids) == constraint.only]
                assert token in allowed
                ids = torch.tensor([list(prompt) + tokens[:step]])
                with torch.no_grad():
                    logits = generator.model(ids).logits[0, -1].float() / (temperature or 1.0)
                expected.append(float(logits[token] - torch.logsumexp(logits[allowed], -1)))
            np.testing.assert_allclose(completion.logprobs, expected, atol=1e-4)
    if temperature == 0:  # masks on other prompts leave an unmasked prompt's greedy completion as it is alone
        assert unconstrained_first.completion_ids == generator.generate([PROMPTS[1]], params, n=1)[0][0].completion_ids
    assert mask.calls and all(len(call) < 10 for call in mask.calls)
    with pytest.raises(ValueError, match="1 token masks for 3 prompts"):
        generator.generate(PROMPTS, params, n=1, token_masks=[mask])

"""Real SmolLM2-135M-Instruct weights (from the zoo): Flax and transformers agree on a real chat prompt."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from models import hf_io, zoo
from models.decode import greedy_decode
from models.tokenizer import load_tokenizer, render_chat

pytestmark = pytest.mark.slow

MESSAGES = [
    {"role": "system", "content": "You are a careful assistant. Answer in one short sentence."},
    {"role": "user", "content": "Which planet in our solar system is closest to the Sun?"},
]


@pytest.fixture(scope="module")
def smollm2():
    model_dir = zoo.smollm2_135m_instruct()
    tokenizer = load_tokenizer(model_dir)
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model_dir, tokenizer, torch_model


def test_chat_prompt_has_no_extra_bos(smollm2):
    _, tokenizer, _ = smollm2
    ids = render_chat(tokenizer, MESSAGES, assistant_prefix="The planet")
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    # SmolLM2's BOS *is* <|im_start|>: the template's own first token, and it must not be doubled.
    assert tokenizer.bos_token == "<|im_start|>"
    assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id
    assert ids.count(tokenizer.bos_token_id) == text.count("<|im_start|>") == 3
    assert tokenizer.decode(ids) == text + "The planet"


def test_flax_logits_and_greedy_tokens_match_transformers_on_a_chat_prompt(smollm2):
    model_dir, tokenizer, torch_model = smollm2
    ids = render_chat(tokenizer, MESSAGES)
    with torch.no_grad():
        expected = torch_model(torch.tensor([ids])).logits[0].numpy()
    model = hf_io.load(model_dir)
    positions = jnp.arange(len(ids), dtype=jnp.int32)[None]
    hidden = model(jnp.asarray([ids], jnp.int32), positions, jnp.ones((1, len(ids)), bool))
    actual = np.asarray(model.logits(hidden)[0])
    assert np.abs(actual - expected).max() < 1e-3
    np.testing.assert_array_equal(actual.argmax(-1), expected.argmax(-1))

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        torch_tokens = torch_model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False,
                                            eos_token_id=eos, pad_token_id=eos)[0, len(ids):].tolist()
    flax_tokens = greedy_decode(model, ids, max_new_tokens=20, eos_token_ids=[eos])
    assert flax_tokens == torch_tokens
    # A well-formed chat prompt makes the model answer and close its turn, not ramble to the token limit.
    assert 5 < len(flax_tokens) < 20 and flax_tokens[-1] == eos

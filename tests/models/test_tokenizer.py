"""`render_chat`: chat template, open assistant turn, prefix continued, and BOS only where the template puts it."""

from __future__ import annotations

import pytest
import tokenizers
import transformers
from tokenizers import pre_tokenizers, processors

from models.tokenizer import load_tokenizer, render_chat

WORDS = ["<unk>", "<s>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant", "\n", "Be", "brief.",
         "Add", "2", "and", "3.", "Plan:", "step", "1"]
ID = {word: index for index, word in enumerate(WORDS)}
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 2 and 3."}]


def word_tokenizer(template: str, *, tokenizer_adds_bos: bool):
    """A word-level tokenizer over WORDS whose own encode() may prepend <s>, like many Llama tokenizers."""
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(ID, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", behavior="isolated"), pre_tokenizers.Split(" ", behavior="removed")])
    if tokenizer_adds_bos:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", ID["<s>"])])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tokenizer.chat_template = template
    return tokenizer


CHAT_IDS = [ID[w] for w in ["<|im_start|>", "system", "\n", "Be", "brief.", "<|im_end|>", "\n",
                            "<|im_start|>", "user", "\n", "Add", "2", "and", "3.", "<|im_end|>", "\n",
                            "<|im_start|>", "assistant", "\n"]]


def test_renders_the_template_with_an_open_assistant_turn_and_no_bos_it_does_not_write():
    tokenizer = word_tokenizer(CHATML, tokenizer_adds_bos=True)
    assert tokenizer("Be")["input_ids"][0] == ID["<s>"]  # the tokenizer alone would prepend a BOS
    assert render_chat(tokenizer, MESSAGES) == CHAT_IDS


def test_a_template_that_writes_bos_gets_exactly_one():
    tokenizer = word_tokenizer("{{ bos_token }}" + CHATML, tokenizer_adds_bos=True)
    assert render_chat(tokenizer, MESSAGES) == [ID["<s>"]] + CHAT_IDS


def test_assistant_prefix_continues_the_open_turn():
    tokenizer = word_tokenizer(CHATML, tokenizer_adds_bos=False)
    assert render_chat(tokenizer, MESSAGES, assistant_prefix="Plan: step 1") == CHAT_IDS + [
        ID["Plan:"], ID["step"], ID["1"]]


def test_rejects_empty_or_malformed_messages_and_templateless_tokenizers():
    tokenizer = word_tokenizer(CHATML, tokenizer_adds_bos=False)
    with pytest.raises(ValueError, match="must not be empty"):
        render_chat(tokenizer, [])
    with pytest.raises(ValueError, match="'role'"):
        render_chat(tokenizer, [{"content": "hi"}])
    with pytest.raises(ValueError, match="string 'content'"):
        render_chat(tokenizer, [{"role": "user", "content": None}])
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        render_chat(tokenizer, MESSAGES)


def test_load_tokenizer_reads_a_saved_directory(tmp_path):
    word_tokenizer(CHATML, tokenizer_adds_bos=False).save_pretrained(tmp_path)
    assert render_chat(load_tokenizer(tmp_path), MESSAGES, assistant_prefix="Plan:") == CHAT_IDS + [ID["Plan:"]]

"""Tokenizer loading and chat prompts that the model continues from a given assistant prefix."""

from __future__ import annotations

import pathlib
from typing import Any, Mapping, Sequence


def load_tokenizer(model_dir: str | pathlib.Path) -> Any:
    """The `transformers` tokenizer saved in a HF model directory."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


def render_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]], assistant_prefix: str = "") -> list[int]:
    """Token ids of `messages` in the chat template, an open assistant turn, and `assistant_prefix` in it.

    The template text is tokenised with `add_special_tokens=False`: a BOS appears only if the template itself
    writes one (Llama-3 style), never a second one from the tokenizer (SmolLM2 and Qwen templates have none).
    """
    if not messages:
        raise ValueError("messages must not be empty")
    for message in messages:
        if not {"role", "content"} <= set(message) or not isinstance(message.get("content"), str):
            raise ValueError(f"each message needs a 'role' and a string 'content', got {dict(message)!r}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template")
    text = tokenizer.apply_chat_template(
        [dict(message) for message in messages], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(text + assistant_prefix, add_special_tokens=False)["input_ids"])

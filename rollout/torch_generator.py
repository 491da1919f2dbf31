"""In-process generation with a transformers causal LM (CPU or GPU), with sampler log-probs and live weight updates."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from rollout.sampling import constrain_logprobs, row_generators, sample_next_tokens, sampler_logprobs
from rollout.transport import as_torch
from rollout.types import Completion, SamplingParams, TokenConstraint, TokenMask


def _model_eos_token_ids(model: PreTrainedModel) -> set[int]:
    """The ids the model itself ends a turn with (generation config first, then model config)."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(t) for t in (eos if isinstance(eos, (list, tuple)) else [eos])}


def _dense(tensor: torch.Tensor) -> bool:
    """Whether the tensor's elements fill its memory exactly once, in some order of dimensions."""
    if tensor.is_contiguous():
        return True
    return tensor.dim() == 2 and tensor.t().is_contiguous()


class TorchGenerator:
    """A transformers model sampling `n` completions per prompt in one left-padded, KV-cached batch.

    Each prompt is encoded once and its keys and values repeated for its `n` rows (SGLang shares a prompt's prefix
    the same way), so the prefill costs one row per prompt, not per completion.
    A sequence stops at any of `params.stop_token_ids` or the model's own EOS ids (as SGLang and `model.generate`
    do); the stop token is kept in the completion with its log-prob, so the learner also learns to stop.
    A prompt's `token_masks` entry constrains each of its rows' steps (`rollout.sampling.constrain_logprobs`).
    """

    def __init__(
        self,
        model_dir_or_hf_model: str | os.PathLike | PreTrainedModel,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        policy_version: int = 0,
    ) -> None:
        if isinstance(model_dir_or_hf_model, PreTrainedModel):
            model = model_dir_or_hf_model
        else:
            model = AutoModelForCausalLM.from_pretrained(os.fspath(model_dir_or_hf_model), dtype=dtype)
        self.device = torch.device(device)
        self.model: PreTrainedModel | None = model.to(device=self.device, dtype=dtype).eval().requires_grad_(False)
        self.policy_version = int(policy_version)
        self._eos_token_ids = _model_eos_token_ids(model)
        pad = model.config.pad_token_id
        # Padding sits under a zero attention mask, so any in-vocabulary id works when the model names none.
        self._pad_token_id = int(pad) if pad is not None else 0
        # `remove_duplicate=False` also lists aliases (a tied `lm_head.weight`), so either HF name reaches the
        # one shared storage.
        self._params_by_name = dict(model.named_parameters(remove_duplicate=False))

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, n: int,
        token_masks: Sequence[TokenMask | None] | None = None,
    ) -> list[list[Completion]]:
        """Samples `n` completions for every prompt; result[i][j] is the j-th completion of prompt i."""
        model = self._live_model()
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if token_masks is not None and len(token_masks) != len(prompt_ids):
            raise ValueError(f"{len(token_masks)} token masks for {len(prompt_ids)} prompts")
        prompts = [tuple(int(t) for t in prompt) for prompt in prompt_ids]
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {index} is empty; every prompt needs at least one token")
        if not prompts:
            return []
        rows = [prompt for prompt in prompts for _ in range(n)]
        with torch.inference_mode():
            tokens, logprobs, lengths, stopped, constraints = self._decode(model, prompts, n, params, token_masks)
        completions = [
            Completion(
                prompt_ids=row,
                completion_ids=tuple(tokens[i][: lengths[i]]),
                logprobs=tuple(logprobs[i][: lengths[i]]),
                finish_reason="stop" if stopped[i] else "length",
                policy_version=self.policy_version,
                constraints=tuple(constraints[i][: lengths[i]]),
            )
            for i, row in enumerate(rows)
        ]
        return [completions[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _decode(
        self, model: PreTrainedModel, prompts: list[tuple[int, ...]], n: int, params: SamplingParams,
        token_masks: Sequence[TokenMask | None] | None = None,
    ) -> tuple[list[list[int]], list[list[float]], list[int], list[bool], list[list[TokenConstraint | None]]]:
        """Row `i * n + j` is prompt i's j-th completion; its constraints are [] without masks."""
        num_rows, prompt_len = len(prompts) * n, max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), prompt_len), self._pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), prompt_len), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            input_ids[i, prompt_len - len(prompt) :] = torch.tensor(prompt)
            attention_mask[i, prompt_len - len(prompt) :] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        # Explicit positions make a left-padded row compute exactly what it would alone.
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)

        generator = None if params.seed is None else row_generators(params.seed, num_rows)
        stop_ids = torch.tensor(sorted(self._eos_token_ids | set(params.stop_token_ids)), dtype=torch.long)
        stop_ids = stop_ids.to(self.device)

        cache = DynamicCache(config=model.config)
        outputs = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = outputs.logits[:, -1, :]
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            attention_mask = attention_mask.repeat_interleave(n, dim=0)
            positions = positions.repeat_interleave(n, dim=0)
        next_position = positions[:, -1:] + 1
        finished = torch.zeros(num_rows, dtype=torch.bool, device=self.device)
        lengths = torch.full((num_rows,), params.max_new_tokens, dtype=torch.long, device=self.device)
        step_tokens, step_logprobs = [], []
        row_masks = None if token_masks is None else [token_masks[row // n] for row in range(num_rows)]
        written: list[list[int]] = [[] for _ in range(num_rows)]
        row_constraints: list[list[TokenConstraint | None]] = [[] for _ in range(num_rows)]
        for step in range(params.max_new_tokens):
            logprobs = sampler_logprobs(logits, params.temperature)
            if row_masks is not None:
                done = finished.tolist()
                constraints = [
                    None if mask is None or done[row] else mask.constraint(written[row])
                    for row, mask in enumerate(row_masks)
                ]
                logprobs = constrain_logprobs(logprobs, constraints)
            token = sample_next_tokens(
                logprobs, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, generator=generator
            )
            token = torch.where(finished, self._pad_token_id, token)
            logprob = logprobs.gather(-1, token[:, None]).squeeze(-1)
            step_tokens.append(token)
            step_logprobs.append(logprob)
            if row_masks is not None:
                for row, value in enumerate(token.tolist()):
                    written[row].append(value)
                    row_constraints[row].append(constraints[row])
            just_stopped = torch.isin(token, stop_ids) & ~finished
            lengths = torch.where(just_stopped, step + 1, lengths)
            finished |= just_stopped
            if step + 1 == params.max_new_tokens or bool(finished.all()):
                break
            attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
            outputs = model(
                input_ids=token[:, None],
                attention_mask=attention_mask,
                position_ids=next_position,
                past_key_values=cache,
                use_cache=True,
            )
            logits = outputs.logits[:, -1, :]
            next_position = next_position + 1
        tokens = torch.stack(step_tokens, dim=1).cpu().tolist()
        logprobs = torch.stack(step_logprobs, dim=1).cpu().tolist()
        return tokens, logprobs, lengths.cpu().tolist(), finished.cpu().tolist(), row_constraints

    def update_weights(self, named_tensors: Mapping[str, Any], version: int) -> None:
        """Copies tensors (HF names; torch tensors or anything with `__dlpack__`) into the live parameters in place.

        Every name and shape is checked before the first copy, so a bad update leaves the model untouched.
        A subset of the parameters may be sent (bucketed sync); the version is bumped after the copies. Storage
        is reused from one update to the next; only a first update in a new memory layout allocates.
        """
        self._live_model()
        unknown = sorted(set(named_tensors) - set(self._params_by_name))
        if unknown:
            raise KeyError(f"{len(unknown)} tensors are not parameters of this model, e.g. {unknown[:3]}")
        sources = {name: as_torch(value) for name, value in named_tensors.items()}
        for name, source in sources.items():
            expected = tuple(self._params_by_name[name].shape)
            if tuple(source.shape) != expected:
                raise ValueError(f"{name}: got shape {tuple(source.shape)}, the model has {expected}")
        with torch.no_grad():
            for name, source in sources.items():
                param = self._params_by_name[name]
                if param.stride() != source.stride() and _dense(source):
                    # Adopt the sender's memory layout once (the learner keeps matrices as [in, out], which HF
                    # sees as transposed views): every later update is then a straight memcpy instead of a
                    # transpose, and matmuls read a transposed weight natively.
                    param.data = torch.empty_strided(
                        param.shape, source.stride(), dtype=param.dtype, device=param.device
                    )
                param.copy_(source)
        self.policy_version = int(version)

    def close(self) -> None:
        self.model = None
        self._params_by_name = {}

    def _live_model(self) -> PreTrainedModel:
        if self.model is None:
            raise RuntimeError("this TorchGenerator was closed")
        return self.model

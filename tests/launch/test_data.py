"""`python -m launch.data`: list, where and fetch against a local HTTP server; the registry's sources; `--data_dir`
of the launchers feeding the lookup."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from absl import app
from absl.testing import flagsaver

from env.tasks import zeroeval
from env.tasks.data_files import DATA_DIR_ENV, RemoteDataset, team_root
from env.worlds import PaperWorldConfig
from launch import data
from launch.flag_groups import world as world_flags
from tests.env.test_data_files import (  # noqa: F401 (server: a fixture, used by name)
    PAYLOADS,
    FileServer,
    server,
    tiny_dataset,
)

TEAM_ZEROEVAL = team_root() / "zeroeval"


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """An empty cache and no $CONDUCTOR_DATA_DIR."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    return tmp_path / "xdg" / "conductor-rl" / "data"


def run(*args, **kwargs) -> tuple[int, str]:
    out = io.StringIO()
    status = data.run(*args, out=out, progress=None, **kwargs)
    return status, out.getvalue()


def test_fetch_into_the_cache_then_again_downloads_nothing(server, isolated):
    registry = {"tinyset": tiny_dataset(server.url)}
    status, text = run("fetch", ["tinyset"], registry=registry)
    assert status == 0
    assert text == f"tinyset: 3 files in {isolated / 'tinyset'} (downloaded 3, 1.0 MB; already there 0)\n"
    status, text = run("fetch", ["all"], registry=registry)
    assert status == 0 and "(downloaded 0, 0.0 MB; already there 3)" in text and len(server.requests) == 3
    status, text = run("where", ["tinyset"], registry=registry)
    assert status == 0
    assert text.splitlines() == [
        f"tinyset: {isolated / 'tinyset'}", "  first.json: ok", "  second.bin: ok", "  third.txt: unpinned"
    ]


def test_fetch_into_data_dir_and_a_failed_fetch_exits_non_zero(server, isolated, tmp_path):
    registry = {"tinyset": tiny_dataset(server.url)}
    assert run("fetch", ["tinyset"], registry=registry, data_dir=str(tmp_path / "team"))[0] == 0
    assert (tmp_path / "team" / "tinyset" / "third.txt").read_bytes() == PAYLOADS["third.txt"]
    assert not isolated.exists()
    server.corrupt.add("first.json")
    status, text = run("fetch", ["tinyset"], registry=registry)
    assert status == 1 and text.startswith("tinyset: fetch failed: ") and "differs from the pinned" in text


def test_base_url_fetches_from_a_mirror(server, isolated):
    dataset = RemoteDataset("tinyset", "http://127.0.0.1:9/unreachable", tiny_dataset(server.url).files)
    assert run("fetch", ["tinyset"], registry={"tinyset": dataset}, base_url=server.url)[0] == 0


def test_where_and_list_say_when_nothing_is_found(isolated):
    registry = {"tinyset": tiny_dataset("http://127.0.0.1:9")}
    status, text = run("where", ["tinyset"], registry=registry)
    assert status == 1 and str(isolated / "tinyset") in text and "`python -m launch.data fetch tinyset`" in text
    status, text = run("list", registry=registry)
    assert status == 0
    assert text.splitlines() == [
        "tinyset: 3 files, 1.0 MB, sha256 pinned for 2/3", "  from the test's server", "  not found locally"
    ]


def test_bad_commands_and_names_are_usage_errors():
    with pytest.raises(app.UsageError, match="unknown command 'get'"):
        data.run("get", ["routerdc"])
    with pytest.raises(app.UsageError, match="needs data set names"):
        data.run("fetch", [])
    with pytest.raises(app.UsageError, match=r"unknown data sets \['nope'\]"):
        data.run("fetch", ["nope"])


def test_the_registry_states_each_paper_task_source_at_a_pinned_revision():
    assert set(data.DATASETS) == {"routerdc", "zeroeval"} | {name for name, _ in PaperWorldConfig.tasks}
    for name, dataset in data.DATASETS.items():
        assert dataset.name == name
        on_github = name in ("routerdc", "zeroeval")
        revision = dataset.base_url.split("/")[5] if on_github else dataset.base_url.rsplit("/", 1)[-1]
        assert len(revision) == 40 and revision in dataset.source
    assert data.DATASETS["mmlu"].url(data.DATASETS["mmlu"].files[0]) == (
        "https://huggingface.co/datasets/cais/mmlu/resolve/c30699e8356da336a370243923dbaf21066bb9fe/"
        "all/test-00000-of-00001.parquet"
    )
    assert data.DATASETS["routerdc"].url(data.DATASETS["routerdc"].files[0]) == (
        "https://raw.githubusercontent.com/shuhao02/RouterDC/0e63989c5bf4363330b8a4616386e3f7f116d9f8/"
        "datasets/split2_model7/MATH_prealgebra.json"
    )
    # env.tasks.datasets reads a directory's files whose names hold the split ("test" by default).
    for name in ("math500", "mmlu", "livecodebench"):
        assert all("test" in file.name for file in data.DATASETS[name].files)
    unpinned = {name: [f.name for f in d.files if not f.pinned] for name, d in data.DATASETS.items()}
    assert {name: files for name, files in unpinned.items() if files} == {
        "math500": ["test.jsonl"], "rlpr": ["rlpr_train.parquet"]
    }


def test_the_program_runs_as_a_module(isolated):
    result = subprocess.run(
        [sys.executable, "-m", "launch.data", "where", "nope"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1 and "unknown data sets ['nope']" in result.stderr + result.stdout


@pytest.mark.usefixtures("parsed_flags")
def test_data_dir_feeds_the_replay_and_paper_worlds(tmp_path, isolated):
    (tmp_path / "routerdc").mkdir()
    (tmp_path / "routerdc" / "tiny_test.json").write_text(json.dumps([{"question": "Q", "scores": {"m": 1}}]))
    (tmp_path / "math500").mkdir()
    with flagsaver.flagsaver(world="replay", data_dir=str(tmp_path)):
        assert world_flags.from_flags(["tiny_test"]).data_dir == str(tmp_path / "routerdc")
    with flagsaver.flagsaver(world="paper", data_dir=str(tmp_path)):
        assert world_flags.from_flags(["math500", "mmlu:/elsewhere/mmlu.parquet", "rlpr"]).tasks == (
            ("math500", str(tmp_path / "math500")), ("mmlu", "/elsewhere/mmlu.parquet"), ("rlpr", None)
        )
    with flagsaver.flagsaver(world="replay"):
        assert world_flags.from_flags(["tiny_test"]).data_dir is None  # env.tasks searches when the world is built


@pytest.fixture
def zeroeval_mirror():
    """The team's copy served under the pinned files' remote paths (`@` percent-encoded, as GitHub is asked)."""
    served = FileServer({f.remote_path or f.name: (TEAM_ZEROEVAL / f.name).read_bytes()
                         for f in zeroeval.ZEROEVAL_FILES.files})
    yield served
    served.close()


@pytest.mark.skipif(not TEAM_ZEROEVAL.is_dir(), reason="no team copy of the zeroeval files on this machine")
def test_fetch_zeroeval_checks_every_file_and_the_cache_then_comes_before_the_team_copy(zeroeval_mirror, isolated):
    status, text = run("fetch", ["zeroeval"], base_url=zeroeval_mirror.url)
    size = sum(f.size for f in zeroeval.ZEROEVAL_FILES.files)
    assert status == 0
    assert text == (
        f"zeroeval: 51 files in {isolated / 'zeroeval'} (downloaded 51, {size / 1e6:,.1f} MB; already there 0)\n"
    )
    assert "gsm/Meta-Llama-3.1-405B-Instruct%40hyperbolic.json" in zeroeval_mirror.requests
    assert zeroeval.data_dir() == isolated / "zeroeval"  # the cache, searched before the team copy
    status, text = run("where", ["zeroeval"])
    assert status == 0 and text.count(": ok\n") == 51


@pytest.mark.skipif(not TEAM_ZEROEVAL.is_dir(), reason="no team copy of the zeroeval files on this machine")
def test_a_zeroeval_file_that_differs_from_its_pin_fails_the_fetch_loudly(zeroeval_mirror, isolated):
    zeroeval_mirror.corrupt.add("crux.summary.json")
    status, text = run("fetch", ["zeroeval"], base_url=zeroeval_mirror.url)
    assert status == 1
    assert text.startswith("zeroeval: fetch failed: ") and "crux.summary.json: sha256 " in text
    assert "differs from the pinned 6940bbee51fc" in text
    assert not (isolated / "zeroeval").exists()  # nothing unverified left behind


@pytest.mark.usefixtures("parsed_flags")
def test_data_dir_feeds_the_zeroeval_world(tmp_path, isolated):
    (tmp_path / "zeroeval").mkdir()
    with flagsaver.flagsaver(world="zeroeval", data_dir=str(tmp_path)):
        config = world_flags.from_flags(["gsm", "test", "crux"])
    assert (config.tasks, config.data_dir, config.split) == (("gsm", "crux"), str(tmp_path / "zeroeval"), "test")
    with flagsaver.flagsaver(world="zeroeval", o1_mini_output_factor=5.0):
        config = world_flags.from_flags([])
    assert config.tasks == zeroeval.ZEROEVAL_TASKS and config.data_dir is None and config.split == "train"
    assert config.o1_mini_output_factor == 5
    with flagsaver.flagsaver(world="zeroeval"), pytest.raises(ValueError, match="at most one split"):
        world_flags.from_flags(["train", "test"])

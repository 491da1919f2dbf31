"""Task data files: download with pinned size and sha256 from a local HTTP server, the lookup order of the data roots,
the offline error, and the pinned RouterDC checksums against the team's copy."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import socket
import threading
from pathlib import Path

import pytest

from env.tasks import data_files, load, routerdc
from env.tasks.data_files import (
    DATA_DIR_ENV,
    ChecksumError,
    DataNotFoundError,
    DownloadError,
    RemoteDataset,
    RemoteFile,
    fetch,
    find,
    locate,
    verify,
)
from env.tasks.routerdc import ROUTERDC_FILES

PAYLOADS = {
    "first.json": json.dumps([{"question": "Q0", "scores": {"m1": 1.0}}]).encode(),
    "sub/second.bin": bytes(range(256)) * 4096,  # 1 MiB: more than one read chunk
    "third.txt": b"not pinned, but its size is\n",
}


PAYLOADS_NAMES = ("first.json", "second.bin", "third.txt")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FileServer:
    """Serves `files` (URL path -> bytes) on 127.0.0.1, counting requests; a path in `corrupt` gets other bytes of
    the same length, one in `drop` gets half its bytes before the connection closes."""

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.corrupt: set[str] = set()
        self.drop: set[str] = set()
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.lstrip("/")
                server.requests.append(path)
                if path not in server.files:
                    self.send_error(404)
                    return
                body = server.files[path]
                if path in server.corrupt:
                    body = bytes(b ^ 0xFF for b in body)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if path in server.drop:
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    served = FileServer(PAYLOADS)
    yield served
    served.close()


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """Empty flag, env, cache and team roots, with XDG_CACHE_HOME and $CONDUCTOR_DATA_DIR pointing at theirs."""
    paths = {name: tmp_path / name for name in ("flag", "env", "xdg", "team")}
    for path in paths.values():
        path.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(paths["xdg"]))
    monkeypatch.setenv(DATA_DIR_ENV, str(paths["env"]))
    paths["cache"] = paths["xdg"] / "conductor-rl" / "data"
    return paths


def tiny_dataset(base_url: str, paths=tuple(PAYLOADS)) -> RemoteDataset:
    files = []
    for path in paths:
        data = PAYLOADS[path]
        name = path.rsplit("/", 1)[-1]
        if path == "third.txt":
            files.append(RemoteFile(name, sha256=None, size=len(data)))
        else:
            files.append(RemoteFile(name, sha256(data), len(data), remote_path=path))
    return RemoteDataset("tinyset", base_url, tuple(files), source="the test's server")


def files_under(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file())


def test_a_fetch_lands_every_file_verified_and_no_temporary_file(server, tmp_path):
    dataset = tiny_dataset(server.url)
    progress = io.StringIO()
    report = fetch(dataset, tmp_path / "data", progress=progress)
    directory = tmp_path / "data" / "tinyset"
    assert report.directory == directory
    assert report.downloaded == ("first.json", "second.bin", "third.txt") and report.already_present == ()
    assert report.bytes_downloaded == sum(len(data) for data in PAYLOADS.values())
    for path, data in PAYLOADS.items():
        assert (directory / path.rsplit("/", 1)[-1]).read_bytes() == data
    assert files_under(tmp_path) == sorted(directory / name for name in ("first.json", "second.bin", "third.txt"))
    assert verify(dataset, directory) == {"first.json": "ok", "second.bin": "ok", "third.txt": "unpinned"}
    assert sorted(server.requests) == sorted(PAYLOADS)
    lines = progress.getvalue().splitlines()
    assert len(lines) == 3 and lines[1].startswith("second.bin [") and "1.0/1.0 MB" in lines[1]


def test_a_second_fetch_downloads_nothing(server, tmp_path):
    dataset = tiny_dataset(server.url)
    fetch(dataset, tmp_path)
    requests = len(server.requests)
    report = fetch(dataset, tmp_path)
    assert report.downloaded == () and report.already_present == ("first.json", "second.bin", "third.txt")
    assert report.bytes_downloaded == 0 and len(server.requests) == requests == 3


def test_recheck_downloads_again_a_file_changed_on_disk(server, tmp_path):
    dataset = tiny_dataset(server.url)
    fetch(dataset, tmp_path)
    (tmp_path / "tinyset" / "first.json").write_text("[]")
    assert verify(dataset, tmp_path / "tinyset")["first.json"].startswith("size ")
    assert fetch(dataset, tmp_path).downloaded == ()  # presence alone is trusted: files land only once verified
    assert fetch(dataset, tmp_path, recheck=True).downloaded == ("first.json",)
    assert (tmp_path / "tinyset" / "first.json").read_bytes() == PAYLOADS["first.json"]


def test_a_corrupted_file_raises_a_checksum_error_and_leaves_nothing(server, tmp_path):
    server.corrupt.add("sub/second.bin")
    with pytest.raises(ChecksumError, match=f"sha256 .* differs from the pinned {sha256(PAYLOADS['sub/second.bin'])}"):
        fetch(tiny_dataset(server.url, ["sub/second.bin"]), tmp_path)
    assert files_under(tmp_path) == [] and not (tmp_path / "tinyset").exists()


def test_a_corrupted_file_keeps_the_verified_ones_and_the_next_fetch_gets_only_it(server, tmp_path):
    dataset = tiny_dataset(server.url)
    server.corrupt.add("sub/second.bin")
    with pytest.raises(ChecksumError):
        fetch(dataset, tmp_path)
    assert files_under(tmp_path) == [tmp_path / "tinyset" / "first.json"]
    server.corrupt.clear()
    server.requests.clear()
    assert fetch(dataset, tmp_path).downloaded == ("second.bin", "third.txt")
    assert server.requests == ["sub/second.bin", "third.txt"]


def test_an_unpinned_file_of_the_wrong_size_is_refused(server, tmp_path):
    dataset = RemoteDataset("tinyset", server.url, (RemoteFile("third.txt", sha256=None, size=3),))
    with pytest.raises(ChecksumError, match="got 28 bytes, the pinned size is 3"):
        fetch(dataset, tmp_path)
    assert files_under(tmp_path) == []


def test_a_connection_dropped_mid_file_raises_and_leaves_nothing(server, tmp_path):
    server.drop.add("sub/second.bin")
    with pytest.raises(DownloadError, match="closed after 524288 of 1048576 bytes"):
        fetch(tiny_dataset(server.url, ["sub/second.bin"]), tmp_path)
    assert files_under(tmp_path) == [] and not (tmp_path / "tinyset").exists()


def test_files_kept_in_folders_land_there_and_a_failed_one_leaves_no_empty_folder(server, tmp_path):
    data = PAYLOADS["sub/second.bin"]
    dataset = RemoteDataset("tinyset", server.url, (
        RemoteFile("a/first.json", sha256(PAYLOADS["first.json"]), remote_path="first.json"),
        RemoteFile("b/c/second.bin", sha256(data), len(data), remote_path="sub/second.bin"),
    ))
    fetch(dataset, tmp_path)
    assert files_under(tmp_path) == [tmp_path / "tinyset" / "a" / "first.json", tmp_path / "tinyset" / "b" / "c" /
                                     "second.bin"]
    assert verify(dataset, tmp_path / "tinyset") == {"a/first.json": "ok", "b/c/second.bin": "ok"}
    server.corrupt.add("sub/second.bin")
    with pytest.raises(ChecksumError, match="differs from the pinned"):
        fetch(dataset, tmp_path / "again")
    assert [p.relative_to(tmp_path) for p in sorted((tmp_path / "again").rglob("*"))] == [
        Path("again/tinyset"), Path("again/tinyset/a"), Path("again/tinyset/a/first.json")
    ]


def test_a_missing_file_on_the_server_is_an_http_error(server, tmp_path):
    dataset = RemoteDataset("tinyset", server.url, (RemoteFile("absent.json", "0" * 64),))
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(dataset, tmp_path)
    assert files_under(tmp_path) == []


def make_dataset_dir(root: Path, files=("first.json", "second.bin", "third.txt")) -> Path:
    directory = root / "tinyset"
    directory.mkdir(parents=True)
    for name in files:
        (directory / name).write_bytes(b"x")
    return directory


def test_lookup_order_is_flag_then_env_then_cache_then_team(roots):
    dataset = tiny_dataset("http://127.0.0.1:9")  # never reached: every case finds a directory
    names = [file.name for file in dataset.files]
    expected = [make_dataset_dir(roots[name]) for name in ("flag", "env", "cache", "team")]
    for directory in expected:
        assert find("tinyset", roots["flag"], roots["team"], names) == directory
        assert locate(dataset, roots["flag"], team=roots["team"], progress=None) == directory
        for path in directory.iterdir():
            path.unlink()
        directory.rmdir()
    assert find("tinyset", roots["flag"], roots["team"], names) is None


def test_a_user_directory_counts_as_it_is_but_an_incomplete_cache_does_not(roots, server):
    dataset = tiny_dataset(server.url)
    names = [file.name for file in dataset.files]
    make_dataset_dir(roots["cache"], files=["first.json"])
    team = make_dataset_dir(roots["team"], files=[])
    assert find("tinyset", None, roots["team"], names) == team
    team.rmdir()
    assert locate(dataset, team=roots["team"], progress=None) == roots["cache"] / "tinyset"
    assert server.requests == ["sub/second.bin", "third.txt"]  # finishes the cache, keeps first.json
    env_copy = make_dataset_dir(roots["env"], files=["first.json"])
    assert find("tinyset", None, roots["team"], names) == env_copy


def test_nothing_found_fetches_into_the_cache_with_progress(roots, server):
    progress = io.StringIO()
    directory = locate(tiny_dataset(server.url), team=roots["team"], progress=progress)
    assert directory == roots["cache"] / "tinyset"
    assert (directory / "second.bin").read_bytes() == PAYLOADS["sub/second.bin"]
    assert [line.split(" ")[0] for line in progress.getvalue().splitlines()] == list(PAYLOADS_NAMES)


def test_offline_with_nothing_found_names_the_fetch_command_and_the_directories_tried(roots):
    with socket.socket() as probe:  # a port that nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    make_dataset_dir(roots["team"], files=[]).rmdir()
    with pytest.raises(DataNotFoundError) as raised:
        locate(tiny_dataset(f"http://127.0.0.1:{closed_port}"), roots["flag"], team=roots["team"], progress=None)
    message = str(raised.value)
    assert isinstance(raised.value, FileNotFoundError)
    assert "python -m launch.data fetch tinyset" in message and "Fetching it failed" in message
    for name in ("flag", "env", "cache", "team"):
        assert f"  {roots[name] / 'tinyset'}\n" in message
    assert files_under(roots["cache"].parent.parent) == []


def test_the_cache_honours_xdg_cache_home_and_defaults_to_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_files.cache_root() == tmp_path / "xdg" / "conductor-rl" / "data"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_files.cache_root() == tmp_path / "home" / ".cache" / "conductor-rl" / "data"


def test_bad_file_specs_are_rejected():
    with pytest.raises(ValueError, match="64 lower-case hex"):
        RemoteFile("a.json", "ABC")
    for name in ("/a.json", "sub//a.json", "../a.json", "sub/.a.json", ""):
        with pytest.raises(ValueError, match="plain name"):
            RemoteFile(name, None)
    with pytest.raises(ValueError, match="names a file twice"):
        RemoteDataset("d", "http://x", (RemoteFile("a", None), RemoteFile("a", None)))


def test_routerdc_tasks_load_from_the_first_root_holding_them(roots):
    (roots["flag"] / "routerdc").mkdir()
    (roots["flag"] / "routerdc" / "tiny_test.json").write_text(json.dumps([{"question": "Q", "scores": {"m": 1}}]))
    (roots["env"] / "routerdc").mkdir()
    assert routerdc.data_dir(roots["flag"]) == roots["flag"]
    assert routerdc.data_dir() == roots["env"]
    assert [task.id for task in load("routerdc/tiny_test", path=routerdc.data_dir(roots["flag"]) / "routerdc")] == [
        "routerdc/tiny_test/0"
    ]


def test_paper_task_files_are_found_by_the_same_lookup(roots):
    (roots["cache"] / "aime").mkdir(parents=True)
    (roots["cache"] / "aime" / "test.jsonl").write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    assert [task.gold for task in load("aime")] == ["2"]
    with pytest.raises(DataNotFoundError, match="(?s)no data file or directory.*launch.data fetch math500"):
        load("math500")


TEAM_ROUTERDC = data_files.team_root() / "routerdc"


@pytest.mark.skipif(not TEAM_ROUTERDC.is_dir(), reason="no team copy of the RouterDC files on this machine")
def test_the_pinned_routerdc_checksums_match_the_team_copy():
    assert sorted(path.name for path in TEAM_ROUTERDC.glob("*.json")) == sorted(f.name for f in ROUTERDC_FILES.files)
    assert verify(ROUTERDC_FILES, TEAM_ROUTERDC) == {file.name: "ok" for file in ROUTERDC_FILES.files}


@pytest.mark.skipif(not TEAM_ROUTERDC.is_dir(), reason="no team copy of the RouterDC files on this machine")
def test_the_routerdc_files_fetched_from_a_mirror_of_the_team_copy_pass_the_pins(tmp_path):
    served = FileServer({path.name: path.read_bytes() for path in TEAM_ROUTERDC.glob("*.json")})
    try:
        report = fetch(ROUTERDC_FILES, tmp_path, base_url=served.url)
    finally:
        served.close()
    assert len(report.downloaded) == 16 and report.bytes_downloaded == sum(f.size for f in ROUTERDC_FILES.files)
    assert [task.task_label for task in load("routerdc/gsm8k-test", path=tmp_path / "routerdc", limit=2)] == ["gsm8k"] * 2

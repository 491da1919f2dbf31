"""Task data files: where they are found, and their download into the user cache, each checked against a pinned size
and sha256.

A data root holds one directory per data set (`<root>/routerdc/mmlu_test.json`, `<root>/math500/test.jsonl`). The
roots are searched in this order, and the first that holds the data set's directory is used:
1. the directory the caller names (the launchers' `--data_dir`);
2. `$CONDUCTOR_DATA_DIR`;
3. the user cache, `$XDG_CACHE_HOME/conductor-rl/data` (default `~/.cache/conductor-rl/data`), where `fetch` writes;
4. a team copy: `shared/data` in the directory that holds the repository, for machines without internet.

The cache is this module's own: a data set there counts as found only when every one of its files is. The other roots
are the user's, and a data set's directory there is taken as it is (it may hold a subset, or files of one's own).

A download goes to a temporary name in the data set's directory and is moved into place (`os.replace`) only once its
size and sha256 match the pinned ones, so a file under its final name is always a verified one and an interrupted or
corrupted download leaves nothing behind. `RemoteFile.sha256 = None` means the file is not pinned: its sha256 could not
be learned where the registry was written, so only its size (where known) and the server's Content-Length are checked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from http.client import HTTPException
from pathlib import Path
from typing import IO, Sequence

DATA_DIR_ENV = "CONDUCTOR_DATA_DIR"
FETCH_COMMAND = "python -m launch.data fetch"
_CHUNK = 1 << 20
_TIMEOUT_S = 60.0
_USER_AGENT = "conductor-rl-data"


class DataNotFoundError(FileNotFoundError):
    """No searched root holds the data set, and it could not be fetched."""


class DownloadError(OSError):
    """A transfer failed: no connection, an HTTP error, or a connection that closed before the file's end."""


class ChecksumError(ValueError):
    """A downloaded file is not the pinned one (its size or sha256 differs)."""


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    """One file of a data set: saved as `name` (a plain name, or a relative path such as `gsm/model.json` for a data
    set kept in folders), downloaded from `<base_url>/<remote_path or name>`."""

    name: str
    sha256: str | None  # None: not pinned, see the module docstring
    size: int | None = None
    remote_path: str | None = None

    def __post_init__(self) -> None:
        if not self.name or any(not part or part.startswith(".") for part in self.name.split("/")):
            raise ValueError(f"a file name must be a plain name or a relative path of plain names, got {self.name!r}")
        if self.sha256 is not None and (len(self.sha256) != 64 or set(self.sha256) - set("0123456789abcdef")):
            raise ValueError(f"{self.name}: sha256 must be 64 lower-case hex digits, got {self.sha256!r}")
        if self.size is not None and self.size < 0:
            raise ValueError(f"{self.name}: size must be >= 0, got {self.size}")

    @property
    def pinned(self) -> bool:
        return self.sha256 is not None


@dataclasses.dataclass(frozen=True)
class RemoteDataset:
    """A data set's files, saved under `<data root>/<name>/`; `source` says where they come from, for people."""

    name: str
    base_url: str
    files: tuple[RemoteFile, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"a data set name must be a plain directory name, got {self.name!r}")
        if not self.files:
            raise ValueError(f"data set {self.name} has no files")
        names = [file.name for file in self.files]
        if len(set(names)) != len(names):
            raise ValueError(f"data set {self.name} names a file twice: {sorted(names)}")

    def url(self, file: RemoteFile, base_url: str | None = None) -> str:
        return f"{(base_url or self.base_url).rstrip('/')}/{file.remote_path or file.name}"


@dataclasses.dataclass(frozen=True)
class FetchReport:
    directory: Path
    downloaded: tuple[str, ...]
    already_present: tuple[str, ...]
    bytes_downloaded: int


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/conductor-rl/data`, `~/.cache/conductor-rl/data` where XDG_CACHE_HOME is unset or empty."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "conductor-rl" / "data"


def team_root() -> Path:
    """The team's offline copy: `../shared/data` beside the repository (machines without internet)."""
    return Path(__file__).resolve().parents[3] / "shared" / "data"


def search_roots(configured: str | os.PathLike | None = None, team: Path | None = None) -> list[Path]:
    """The data roots in lookup order: `configured`, `$CONDUCTOR_DATA_DIR`, the cache, the team copy (`team`,
    default `team_root()`; listed only where it exists)."""
    roots = [Path(configured)] if configured else []
    if os.environ.get(DATA_DIR_ENV):
        roots.append(Path(os.environ[DATA_DIR_ENV]))
    roots.append(cache_root())
    team = team_root() if team is None else team
    if team.is_dir():
        roots.append(team)
    return roots


def find(
    name: str,
    configured: str | os.PathLike | None = None,
    team: Path | None = None,
    files: Sequence[str] = (),
) -> Path | None:
    """`<root>/<name>` of the first search root that holds data set `name`, or None. In the cache, the data set
    counts as held only when all of `files` are there (a fetch that was cut short is finished, not used)."""
    cache = cache_root()
    for root in search_roots(configured, team):
        directory = root / name
        if not directory.is_dir():
            continue
        if root == cache and not all((directory / file).is_file() for file in files):
            continue
        return directory
    return None


def not_found_message(name: str, roots: Sequence[Path], reason: str = "") -> str:
    tried = "\n".join(f"  {root / name}" for root in roots)
    because = f"\n{reason}" if reason else ""
    return (
        f"no data file or directory for data set {name!r}; looked in:\n{tried}\n"
        f"Fetch it with `{FETCH_COMMAND} {name}` (into {cache_root() / name}), or point --data_dir or "
        f"${DATA_DIR_ENV} at a directory holding {name}/.{because}"
    )


def locate(
    dataset: RemoteDataset,
    configured: str | os.PathLike | None = None,
    *,
    base_url: str | None = None,
    team: Path | None = None,
    progress: IO[str] | None = sys.stderr,
    timeout_s: float = _TIMEOUT_S,
) -> Path:
    """The directory of `dataset` by the lookup order; where no root holds it, it is fetched into the cache first
    (progress on `progress`). Raises DataNotFoundError, naming the fetch command and the directories tried, when the
    fetch cannot reach the server, and ChecksumError when it gets a file other than the pinned one."""
    names = [file.name for file in dataset.files]
    found = find(dataset.name, configured, team, names)
    if found is not None:
        return found
    try:
        return fetch(dataset, cache_root(), base_url=base_url, progress=progress, timeout_s=timeout_s).directory
    except DownloadError as error:
        roots = search_roots(configured, team)
        raise DataNotFoundError(not_found_message(dataset.name, roots, f"Fetching it failed: {error}")) from error


def fetch(
    dataset: RemoteDataset,
    root: str | os.PathLike | None = None,
    *,
    base_url: str | None = None,
    progress: IO[str] | None = None,
    timeout_s: float = _TIMEOUT_S,
    recheck: bool = False,
) -> FetchReport:
    """Downloads the files of `dataset` that `<root>/<name>/` lacks (root: the cache), verifying each before it is
    moved into place. `base_url` replaces the data set's own (a mirror). `recheck`: hash the files already there too
    and download again any whose pinned sha256 differs. A failure raises DownloadError or ChecksumError and leaves
    the files verified so far; the failed file leaves no trace, nor does a directory the fetch created and left
    empty."""
    directory = Path(root if root is not None else cache_root()) / dataset.name
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    downloaded, present, total = [], [], 0
    try:
        for file in dataset.files:
            target = directory / file.name
            if target.is_file() and not (recheck and file.pinned and sha256_of(target) != file.sha256):
                present.append(file.name)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            total += _download(dataset.url(file, base_url), file, target, progress, timeout_s)
            downloaded.append(file.name)
    finally:
        _remove_empty_folders(directory, remove_top=created)
    return FetchReport(directory, tuple(downloaded), tuple(present), total)


def _remove_empty_folders(directory: Path, remove_top: bool) -> None:
    """Removes the empty folders a failed fetch leaves under `directory` (and `directory` itself if `remove_top`)."""
    for folder in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(folder.iterdir()):
            folder.rmdir()
    if remove_top and not any(directory.iterdir()):
        directory.rmdir()


def verify(dataset: RemoteDataset, directory: str | os.PathLike) -> dict[str, str]:
    """Each file's state in `directory`: 'ok' (size and pinned sha256 match), 'unpinned' (size matches or is not
    known; no sha256 to check), 'missing', or 'size <n> != <m>' / 'sha256 <x> != <y>'."""
    states = {}
    for file in dataset.files:
        path = Path(directory) / file.name
        if not path.is_file():
            states[file.name] = "missing"
        elif file.size is not None and path.stat().st_size != file.size:
            states[file.name] = f"size {path.stat().st_size} != {file.size}"
        elif not file.pinned:
            states[file.name] = "unpinned"
        else:
            digest = sha256_of(path)
            states[file.name] = "ok" if digest == file.sha256 else f"sha256 {digest} != {file.sha256}"
    return states


def sha256_of(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(url: str, file: RemoteFile, target: Path, progress: IO[str] | None, timeout_s: float) -> int:
    handle = tempfile.NamedTemporaryFile(
        dir=target.parent, prefix=f".{Path(file.name).name}.", suffix=".part", delete=False
    )
    temporary = Path(handle.name)
    try:
        with handle:
            size, digest = _transfer(url, file, handle, progress, timeout_s)
        if file.size is not None and size != file.size:
            raise ChecksumError(f"{url}: got {size} bytes, the pinned size is {file.size}")
        if file.pinned and digest != file.sha256:
            raise ChecksumError(f"{url}: sha256 {digest} differs from the pinned {file.sha256}")
        os.replace(temporary, target)
        return size
    finally:
        temporary.unlink(missing_ok=True)


def _transfer(url: str, file: RemoteFile, out: IO[bytes], progress: IO[str] | None, timeout_s: float):
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    digest, size = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            length = response.headers.get("Content-Length")
            expected = int(length) if length is not None else file.size
            bar = _ProgressBar(progress, file.name, expected)
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                bar.update(size)
            bar.close(size)
    except urllib.error.HTTPError as error:
        raise DownloadError(f"{url}: HTTP {error.code} {error.reason}") from error
    except urllib.error.URLError as error:
        raise DownloadError(f"{url}: {error.reason}") from error
    except (HTTPException, OSError) as error:
        raise DownloadError(f"{url}: {type(error).__name__}: {error}") from error
    if length is not None and size != int(length):
        raise DownloadError(f"{url}: the connection closed after {size} of {length} bytes")
    return size, digest.hexdigest()


class _ProgressBar:
    """One line per file on `stream`: redrawn in place on a terminal, written once at the end elsewhere (logs)."""

    _WIDTH = 30
    _EVERY_S = 0.1

    def __init__(self, stream: IO[str] | None, name: str, total: int | None):
        self.stream, self.name, self.total = stream, name, total
        self.live = stream is not None and getattr(stream, "isatty", lambda: False)()
        self.start = self.last = time.monotonic()

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self.live and now - self.last >= self._EVERY_S:
            self.last = now
            self.stream.write("\r" + self._line(done, now))
            self.stream.flush()

    def close(self, done: int) -> None:
        if self.stream is not None:
            self.stream.write(("\r" if self.live else "") + self._line(done, time.monotonic()) + "\n")
            self.stream.flush()

    def _line(self, done: int, now: float) -> str:
        rate = done / max(now - self.start, 1e-6) / 1e6
        if not self.total:
            return f"{self.name}: {done / 1e6:.1f} MB ({rate:.1f} MB/s)"
        filled = int(self._WIDTH * min(done / self.total, 1.0))
        bar = "#" * filled + "." * (self._WIDTH - filled)
        return f"{self.name} [{bar}] {done / 1e6:.1f}/{self.total / 1e6:.1f} MB ({rate:.1f} MB/s)"

"""The task data files: where each data set comes from, and their download into the user cache.

    python -m launch.data list                 # every data set: source, size, pinning, where it is found
    python -m launch.data fetch routerdc       # the replay world's files (also fetched on first use)
    python -m launch.data fetch zeroeval       # the zeroeval world's 51 files (ZeroEval's records and summaries)
    python -m launch.data fetch math500 mmlu   # paper-world files; `fetch all` for every data set
    python -m launch.data where routerdc       # the directory the launchers would read, and each file's check

Files go to `$XDG_CACHE_HOME/conductor-rl/data/<name>/` (default `~/.cache/conductor-rl/data/<name>/`), or under
`--data_dir` when given. Each is verified against its pinned size and sha256 before it is moved into place; a file
whose sha256 is not pinned (`sha256=None`: it could not be learned where this registry was written) is checked by
size and Content-Length only. The launchers look for a data set in `--data_dir`, then `$CONDUCTOR_DATA_DIR`, then the
cache, then a team copy (`env.tasks.data_files`).
"""

from __future__ import annotations

import sys
from typing import IO, Sequence

from absl import app, flags

from env.tasks.data_files import (
    ChecksumError,
    DownloadError,
    RemoteDataset,
    RemoteFile,
    fetch,
    find,
    search_roots,
    verify,
)
from env.tasks.routerdc import ROUTERDC_FILES
from env.tasks.zeroeval import ZEROEVAL_FILES
from launch.flag_groups.own_flags import own_flags_parser

# Own FlagValues: the launchers' global --data_dir (launch.flag_groups.world) is not redefined, and nothing here leaks into
# their flags.
DATA_FLAGS = flags.FlagValues()
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Fetch into this data root instead of the user cache; `where` and `list` search it first.",
    flag_values=DATA_FLAGS,
)
_RECHECK = flags.DEFINE_boolean(
    "recheck", False, "Hash the files already present too, and download again any whose pinned sha256 differs.",
    flag_values=DATA_FLAGS,
)

COMMANDS = ("list", "where", "fetch")


def hugging_face(
    name: str, repo: str, revision: str, config: str, split: str, files: Sequence[RemoteFile]
) -> RemoteDataset:
    """Files of Hugging Face dataset `repo` at commit `revision` (its `config` and `split`, in the schema that
    `env.tasks.datasets` reads), from `https://huggingface.co/datasets/<repo>/resolve/<revision>/<path>`."""
    return RemoteDataset(
        name=name,
        base_url=f"https://huggingface.co/datasets/{repo}/resolve/{revision}",
        files=tuple(files),
        source=f"Hugging Face dataset {repo}, config {config}, split {split}, revision {revision}",
    )


# The paper world's benchmarks. A file's sha256 is pinned where it could be confirmed for that revision (the LFS
# object ids listed for these revisions); sha256=None where it could not, from a machine without internet.
DATASETS: dict[str, RemoteDataset] = {
    "routerdc": ROUTERDC_FILES,
    "zeroeval": ZEROEVAL_FILES,
    "math500": hugging_face(
        "math500", "HuggingFaceH4/MATH-500", "ff5b20257d8185524591543f8ff5993951537bb8", "default", "test",
        # Not pinned: a plain git blob (not LFS), whose sha256 is not published.
        [RemoteFile("test.jsonl", sha256=None)],
    ),
    "mmlu": hugging_face(
        "mmlu", "cais/mmlu", "c30699e8356da336a370243923dbaf21066bb9fe", "all", "test",
        [RemoteFile(
            "test-00000-of-00001.parquet", "74a41822ce7d3def56e1682f958469c04642a5336a5ce912fa375fdb90fb25d7",
            remote_path="all/test-00000-of-00001.parquet",
        )],
    ),
    "rlpr": hugging_face(
        "rlpr", "openbmb/RLPR-Train-Dataset", "922eeb37157ebce90c1ee8233cdf04f04fbad728", "default", "train",
        # Not pinned: its LFS sha256 was not found for this revision.
        [RemoteFile("rlpr_train.parquet", sha256=None)],
    ),
    "livecodebench": hugging_face(
        "livecodebench", "livecodebench/code_generation_lite", "0fe84c3912ea0c4d4a78037083943e8f0c4dd505",
        "release_v6", "test",
        [
            RemoteFile("test.jsonl", "2bd02b38beb48e8c46b5b9987095d999ff38cd8efc255ea5d58974317c48f63f", 1252609773),
            RemoteFile("test2.jsonl", "095df7c5daf15f882c51a9deb84085cff1e073495a5dbcf95015a564d485f3a3", 713377060),
            RemoteFile("test3.jsonl", "28ed26cc83363ce3f1fe2d5fad9f8393077beb1907b167a31bd3b32f80801b79", 623360766),
            RemoteFile("test4.jsonl", "d711138ddaebfcf5f8ec6a4283ee677298c0f5c5d374a235af92aaf0584510da", 1204644685),
            RemoteFile("test5.jsonl", "7f77571c2a6df0c2a72a3277650309f67e01e0008e18117e624633df53f81214", 557699297),
            RemoteFile("test6.jsonl", "bb4c364f71921c4495a6ad15abe1a927350b720009f4933e2e71f8af0f6fd1f5", 134303240),
        ],
    ),
}


def run(
    command: str,
    names: Sequence[str] = (),
    *,
    data_dir: str | None = None,
    recheck: bool = False,
    base_url: str | None = None,
    registry: dict[str, RemoteDataset] | None = None,
    out: IO[str] = sys.stdout,
    progress: IO[str] | None = sys.stderr,
) -> int:
    """One command of the program; the exit status. `base_url` fetches from a mirror holding the same paths."""
    registry = DATASETS if registry is None else registry
    if command not in COMMANDS:
        raise app.UsageError(f"unknown command {command!r}; commands: {', '.join(COMMANDS)}")
    if command == "list":
        names = names or list(registry)
    elif not names:
        raise app.UsageError(f"`{command}` needs data set names ({', '.join(registry)}, or all)")
    if list(names) == ["all"]:
        names = list(registry)
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise app.UsageError(f"unknown data sets {unknown}; known: {', '.join(registry)}")
    status = 0
    for name in names:
        dataset = registry[name]
        if command == "list":
            _describe(dataset, data_dir, out)
        elif command == "where":
            status |= _where(dataset, data_dir, out)
        else:
            status |= _fetch(dataset, data_dir, recheck, base_url, out, progress)
    return status


def _describe(dataset: RemoteDataset, data_dir: str | None, out: IO[str]) -> None:
    sizes = [file.size for file in dataset.files]
    size = f"{sum(sizes) / 1e6:,.1f} MB" if None not in sizes else "size not pinned"
    pinned = sum(file.pinned for file in dataset.files)
    found = find(dataset.name, data_dir, files=[file.name for file in dataset.files])
    out.write(
        f"{dataset.name}: {len(dataset.files)} files, {size}, sha256 pinned for {pinned}/{len(dataset.files)}\n"
        f"  from {dataset.source}\n  {'found in ' + str(found) if found else 'not found locally'}\n"
    )


def _where(dataset: RemoteDataset, data_dir: str | None, out: IO[str]) -> int:
    found = find(dataset.name, data_dir, files=[file.name for file in dataset.files])
    if found is None:
        tried = ", ".join(str(root / dataset.name) for root in search_roots(data_dir))
        out.write(f"{dataset.name}: not found (tried {tried}); `python -m launch.data fetch {dataset.name}`\n")
        return 1
    states = verify(dataset, found)
    out.write(f"{dataset.name}: {found}\n")
    for name, state in states.items():
        out.write(f"  {name}: {state}\n")
    return int(any(state not in ("ok", "unpinned") for state in states.values()))


def _fetch(
    dataset: RemoteDataset,
    data_dir: str | None,
    recheck: bool,
    base_url: str | None,
    out: IO[str],
    progress: IO[str] | None,
) -> int:
    try:
        report = fetch(dataset, data_dir, base_url=base_url, progress=progress, recheck=recheck)
    except (DownloadError, ChecksumError) as error:
        out.write(f"{dataset.name}: fetch failed: {error}\n")
        return 1
    out.write(
        f"{dataset.name}: {len(dataset.files)} files in {report.directory} (downloaded {len(report.downloaded)}, "
        f"{report.bytes_downloaded / 1e6:,.1f} MB; already there {len(report.already_present)})\n"
    )
    return 0


parse_flags = own_flags_parser(DATA_FLAGS, __doc__)


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise app.UsageError(f"give a command: {', '.join(COMMANDS)}")
    sys.exit(run(argv[1], argv[2:], data_dir=_DATA_DIR.value, recheck=_RECHECK.value))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)

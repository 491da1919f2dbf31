"""A response cache in SQLite, so re-running an evaluation makes no provider calls.

A reply is keyed by everything that determines it: backend, model, messages, sampling parameters and the
sample's identity (two samples of the same prompt are different calls). All access goes through one thread
holding one connection, so writes from many concurrent coroutines are serialised there; WAL mode lets other
processes read the same file while it is written.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import pathlib
import sqlite3
import time
from typing import Any, Sequence

from env.workers.base import Message, WorkerReply

_SCHEMA = """
CREATE TABLE IF NOT EXISTS replies (
    key TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    model TEXT NOT NULL,
    text TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_usd REAL NOT NULL,
    latency_s REAL NOT NULL
)
"""


def cache_key(
    backend: str,
    model: str,
    messages: Sequence[Message],
    *,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    sample: Any,
) -> str:
    """SHA-256 of the canonical JSON of the call; `sample` is any JSON value naming which sample this is."""
    payload = {
        "backend": backend,
        "model": model,
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "sample": sample,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


OPEN_TIMEOUT_S = 30.0


class ResponseCache:
    """`await get(key)` / `await put(key, ...)` over an SQLite file; also usable as a context manager."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        pathlib.Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.hits = 0
        self.misses = 0
        self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-cache")
        self._connection: sqlite3.Connection = self._thread.submit(self._open).result()

    def _open(self) -> sqlite3.Connection:
        deadline = time.monotonic() + OPEN_TIMEOUT_S
        while True:
            connection = sqlite3.connect(self.path, timeout=OPEN_TIMEOUT_S)
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=NORMAL")
                connection.execute(_SCHEMA)
                connection.commit()
                return connection
            except sqlite3.OperationalError as error:
                connection.close()
                # Several processes opening a new file at once race to switch it to WAL; SQLite answers "locked"
                # at once there instead of waiting out its busy timeout, so wait and try again.
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def __repr__(self) -> str:
        return f"ResponseCache({self.path!r})"

    def _get(self, key: str) -> WorkerReply | None:
        row = self._connection.execute(
            "SELECT text, prompt_tokens, completion_tokens, cost_usd, latency_s FROM replies WHERE key = ?", (key,)
        ).fetchone()
        return WorkerReply(*row) if row is not None else None

    def _put(self, key: str, backend: str, model: str, reply: WorkerReply) -> None:
        self._connection.execute(
            "INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (key, backend, model, *dataclasses.astuple(reply)),
        )
        self._connection.commit()

    async def get(self, key: str) -> WorkerReply | None:
        reply = await asyncio.get_running_loop().run_in_executor(self._thread, self._get, key)
        if reply is None:
            self.misses += 1
        else:
            self.hits += 1
        return reply

    async def put(self, key: str, backend: str, model: str, reply: WorkerReply) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._put, key, backend, model, reply)

    def __len__(self) -> int:
        return self._thread.submit(
            lambda: self._connection.execute("SELECT COUNT(*) FROM replies").fetchone()[0]
        ).result()

    def close(self) -> None:
        self._thread.submit(self._connection.close).result()
        self._thread.shutdown()

    def __enter__(self) -> "ResponseCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Local HTTP servers that speak the OpenAI, Anthropic and Google GenAI wire formats, with scripted faults.

Each server runs its own event loop in a background thread on 127.0.0.1 and a random port, counts requests,
records their JSON bodies and headers, and answers each request according to the next scripted fault (or
normally once the script is used up): "400", "429" (with Retry-After), "500", "hang" (accepts, never answers) or
"malformed" (200 with a body that is not JSON).
"""

from __future__ import annotations

import abc
import asyncio
import json
import threading
from typing import Any, Callable

from aiohttp import web

FAULTS = ("400", "429", "500", "hang", "malformed")


def reply_text(body: dict[str, Any]) -> str:
    """The deterministic answer every fake model gives: echoes the length of the request body's messages."""
    return f"<answer>{len(json.dumps(body, sort_keys=True))}</answer>"


class FakeProvider(abc.ABC):
    """Base class: subclasses give the route and the success body in their provider's schema."""

    route: str

    def __init__(self, retry_after_s: float = 0.05, delay_s: float = 0.0) -> None:
        self.retry_after_s = retry_after_s
        self.delay_s = delay_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.script: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    @property
    def request_count(self) -> int:
        return len(self.requests)

    @property
    @abc.abstractmethod
    def base_url(self) -> str:
        """What the provider's SDK takes as `base_url`."""

    @abc.abstractmethod
    def success_body(self, request_body: dict[str, Any], path_model: str | None) -> dict[str, Any]:
        """A normal response in the provider's schema."""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        fault = self.script.pop(0) if self.script else None
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._respond(body, fault, request.match_info.get("model"))
        finally:
            self.in_flight -= 1

    async def _respond(self, body: dict[str, Any], fault: str | None, path_model: str | None) -> web.StreamResponse:
        await asyncio.sleep(self.delay_s)
        if fault == "429":
            return web.json_response(
                {"error": {"message": "rate limited", "type": "rate_limit_error", "code": 429}},
                status=429,
                headers={"retry-after": str(self.retry_after_s)},
            )
        if fault == "400":
            return web.json_response({"error": {"message": "bad request", "type": "invalid_request_error"}}, status=400)
        if fault == "500":
            return web.json_response({"error": {"message": "boom", "type": "server_error", "code": 500}}, status=500)
        if fault == "hang":
            await asyncio.sleep(3600)
        if fault == "malformed":
            return web.Response(status=200, text='{"choices": [', content_type="application/json")
        return web.json_response(self.success_body(body, path_model))

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post(self.route, self._handle)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._runner = runner
        self._started.set()
        self._loop.run_forever()
        self._loop.close()

    async def _shutdown(self) -> None:
        """Cancel handlers still hanging on a scripted "hang", then close the server."""
        hanging = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in hanging:
            task.cancel()
        await asyncio.gather(*hanging, return_exceptions=True)
        await self._runner.cleanup()

    def __enter__(self) -> "FakeProvider":
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class FakeOpenAI(FakeProvider):
    route = "/v1/chat/completions"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def success_body(self, request_body: dict[str, Any], path_model: str | None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": request_body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply_text(request_body)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }


class FakeAnthropic(FakeProvider):
    route = "/v1/messages"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def success_body(self, request_body: dict[str, Any], path_model: str | None) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if "thinking" in request_body:
            content.append({"type": "thinking", "thinking": "let me think", "signature": "sig"})
        content.append({"type": "text", "text": reply_text(request_body)})
        return {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": request_body["model"],
            "content": content,
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 13, "output_tokens": 5},
        }


class FakeGoogle(FakeProvider):
    route = "/v1beta/models/{model:[^/]+}"  # the segment is "<model>:generateContent"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def success_body(self, request_body: dict[str, Any], path_model: str | None) -> dict[str, Any]:
        return {
            "candidates": [
                {
                    "content": {"role": "model", "parts": [{"text": reply_text(request_body)}]},
                    "finishReason": "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": {
                "promptTokenCount": 17,
                "candidatesTokenCount": 3,
                "thoughtsTokenCount": 4,
                "totalTokenCount": 24,
            },
            "modelVersion": path_model.split(":")[0] if path_model else None,
        }


FAKES: dict[str, Callable[[], FakeProvider]] = {"openai": FakeOpenAI, "anthropic": FakeAnthropic, "google": FakeGoogle}

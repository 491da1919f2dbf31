"""A stand-in SGLang server speaking the native HTTP API's request and response schema, for client tests.

It runs in a thread (HTTP behaviour) or as its own process (`python -m tests.rollout.fake_sglang --port P`), where
`/init_weights_update_group` really joins a gloo group and `/update_weights_from_distributed` really receives the
flattened bucket broadcast, as an SGLang server does over NCCL, and like SGLang 0.5.23 only between
`/begin_weight_update` and `/end_weight_update`.

`GET /server_info` (and its old name `/get_server_info`) answers `server_args`, the few `ServerArgs` fields the
client reads. A fake with `join_update_group = False` holds `/init_weights_update_group` until it stops, as a
server whose ranks never reach the rendezvous.

Its "model" is a fixed rule: token k of a row is (sum(prompt) + seed + 7k) mod vocab, with log-prob
-(k + 1) / 10 - version / 100, so tests can tell which row, seed and weight version produced a completion.
"""

from __future__ import annotations

import argparse
import http.server
import json
import threading

import torch
import torch.distributed as dist

from rollout.transport import join_weight_update_group, layout_from_request, read_checkpoint, unflatten_bucket

VOCAB = 1000


class FakeSGLang:
    def __init__(self, *, port: int = 0, weight_version: str = "0", dtype: str = "auto") -> None:
        self.weight_version = weight_version
        self.server_args = {"model_path": "/fake/model", "tp_size": 1, "pp_size": 1, "dp_size": 1,
                            "enable_dp_attention": False, "dtype": dtype}
        self.join_update_group = True
        self._stopped = threading.Event()
        self.events: list[tuple[str, object]] = []
        self.weights: dict[str, torch.Tensor] = {}
        self.generate_requests = 0
        self.fail_updates_with: str | None = None
        self.fail_generate_with_status: int | None = None
        self.paused = False
        self.update_session_open = False
        self._group = None
        self._lock = threading.Lock()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> "FakeSGLang":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self.server.shutdown()
        self.server.server_close()

    def paths(self) -> list[str]:
        with self._lock:
            return [path for path, _ in self.events]

    def handle(self, method: str, path: str, body: dict | None) -> tuple[int, object]:
        with self._lock:
            self.events.append((path, body))
        if path == "/health" and method == "GET":
            return 200, ""
        if path in ("/server_info", "/get_server_info") and method == "GET":
            return 200, {**self.server_args, "version": "fake"}
        if path == "/generate":
            return self._generate(body)
        if path == "/pause_generation":
            self.paused = True
            return 200, "Generation paused."
        if path == "/continue_generation":
            self.paused = False
            return 200, "Generation continued."
        if path == "/flush_cache":
            return 200, "Cache flushed."
        if path == "/update_weights_from_disk":
            if self.fail_updates_with:
                return 400, {"success": False, "message": self.fail_updates_with, "num_paused_requests": 0}
            self.weights = dict(read_checkpoint(body["model_path"]))
            self._set_version(body)
            return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        if path == "/init_weights_update_group":
            if not self.join_update_group:
                self._stopped.wait()
                return 503, {"success": False, "message": "fake server stopped"}
            self._group = join_weight_update_group(
                master_address=body["master_address"],
                master_port=body["master_port"],
                rank=body["rank_offset"],
                world_size=body["world_size"],
                group_name=body["group_name"],
                backend=body["backend"],
            )
            return 200, {"success": True, "message": "Succeeded to initialize custom process group."}
        if path == "/begin_weight_update":
            if self.update_session_open:
                return 400, {"success": False, "message": "a weight-update session is already open"}
            self.update_session_open = True
            return 200, {"success": True, "message": "Success"}
        if path == "/end_weight_update":
            if not self.update_session_open:
                return 400, {"success": False, "message": "no weight-update session is open"}
            self.update_session_open = False
            return 200, {"success": True, "message": "Success"}
        if path == "/update_weights_from_distributed":
            if not self.update_session_open:
                return 400, {"success": False, "message": "update_weights_from_distributed must run between "
                                                          "begin_weight_update() and end_weight_update()"}
            if body.get("load_format") != "flattened_bucket":
                return 400, {"success": False, "message": f"unsupported load_format {body.get('load_format')}"}
            layout = layout_from_request(body)
            flat = torch.empty(layout[-1].end, dtype=torch.uint8)
            dist.broadcast(flat, src=0, group=self._group)
            if self.fail_updates_with:
                return 400, {"success": False, "message": self.fail_updates_with}
            self.weights.update({name: t.clone() for name, t in unflatten_bucket(flat, layout).items()})
            self._set_version(body)
            return 200, {"success": True, "message": "Succeeded to update parameter online."}
        if path == "/fake/weights":
            return 200, {name: t.float().tolist() for name, t in self.weights.items()}
        if path == "/fake/weight_dtypes":
            return 200, {name: str(t.dtype).removeprefix("torch.") for name, t in self.weights.items()}
        if path == "/fake/events":
            with self._lock:
                return 200, [[event_path, event_body] for event_path, event_body in self.events]
        return 404, {"detail": "Not Found"}

    def _set_version(self, body: dict) -> None:
        if body.get("weight_version") is not None:
            self.weight_version = body["weight_version"]

    def _generate(self, body: dict) -> tuple[int, object]:
        self.generate_requests += 1
        if self.fail_generate_with_status is not None:
            return self.fail_generate_with_status, {"error": {"message": "fake server failure"}}
        input_ids, sampling = body["input_ids"], body["sampling_params"]
        if not input_ids or not isinstance(input_ids[0], list):
            return 400, {"error": {"message": "fake server expects a batch of input_ids"}}
        version = int(self.weight_version) if self.weight_version.isdigit() else 0
        answers = []
        for row, params in zip(input_ids, sampling, strict=True):
            if params.get("temperature", 1.0) < 0:
                return 400, {"error": {"message": "temperature must be non-negative"}}
            seed = params.get("sampling_seed", 0)
            stop = set(params.get("stop_token_ids") or [])
            tokens, finish = [], {"type": "length", "length": params["max_new_tokens"]}
            for k in range(params["max_new_tokens"]):
                token = (sum(row) + seed + 7 * k) % VOCAB
                tokens.append(token)
                if token in stop:
                    finish = {"type": "stop", "matched": token}
                    break
            logprobs = [[-(k + 1) / 10 - version / 100, token, None] for k, token in enumerate(tokens)]
            answers.append(
                {
                    "text": "",
                    "output_ids": tokens,
                    "meta_info": {
                        "id": f"req-{self.generate_requests}-{len(answers)}",
                        "finish_reason": finish,
                        "prompt_tokens": len(row),
                        "weight_version": self.weight_version,
                        "completion_tokens": len(tokens),
                        "cached_tokens": 0,
                        "output_token_logprobs": logprobs,
                    },
                }
            )
        return 200, answers

    def _handler_class(self):
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                status, payload = fake.handle(method, self.path, body)
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def log_message(self, *args) -> None:
                pass

        return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fail-updates-with", default=None)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    fake = FakeSGLang(port=args.port, dtype=args.dtype)
    fake.fail_updates_with = args.fail_updates_with
    print("ready", flush=True)
    fake.server.serve_forever()


if __name__ == "__main__":
    main()

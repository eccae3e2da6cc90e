"""``scope serve``: a local model as an OpenAI-compatible ``/v1/chat/completions`` endpoint.

Concurrent requests are batched: a worker thread takes whatever requests are waiting (up to
``max_batch``), groups them by sampling settings and generates each group in one call. The server
binds to 127.0.0.1 unless told otherwise. ``fail_rate`` makes that share of requests answer 503
(seeded), for fault-injection tests of clients.
"""
from __future__ import annotations

import json
import queue
import random
import threading
import time
import uuid
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..types import SamplingParams
from .local import LocalBackend


class Batcher:
    def __init__(self, backend: LocalBackend, max_batch: int = 32, window_s: float = 0.005):
        self.backend, self.max_batch, self.window_s = backend, max_batch, window_s
        self.q: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def submit(self, prompt: list[int], sp: SamplingParams) -> Future:
        f: Future = Future()
        self.q.put((prompt, sp, f))
        return f

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                first = self.q.get(timeout=0.1)
            except queue.Empty:
                continue
            items = [first]
            deadline = time.time() + self.window_s
            while len(items) < self.max_batch:
                try:
                    items.append(self.q.get(timeout=max(0.0, deadline - time.time())))
                except queue.Empty:
                    break
            groups: dict[tuple, list] = {}
            for it in items:
                sp = it[1]
                groups.setdefault((sp.temperature, sp.top_p, sp.max_new_tokens, sp.stop), []).append(it)
            for group in groups.values():
                try:
                    outs = self.backend.generate([g[0] for g in group], group[0][1])
                    for g, o in zip(group, outs):
                        g[2].set_result(o)
                except Exception as e:  # noqa: BLE001
                    for g in group:
                        g[2].set_exception(e)


def _sampling(body: dict[str, Any]) -> SamplingParams:
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    mt = body.get("max_completion_tokens", body.get("max_tokens", 256))
    sp = SamplingParams(temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                        max_new_tokens=int(mt), stop=tuple(str(s) for s in stop))
    if sp.max_new_tokens < 1 or sp.temperature < 0 or not 0 < sp.top_p <= 1:
        raise ValueError("max_tokens must be >= 1, temperature >= 0, 0 < top_p <= 1")
    return sp


def make_server(backend: LocalBackend, host: str = "127.0.0.1", port: int = 8000, model_name: str = "scope",
                fail_rate: float = 0.0, seed: int = 0, max_batch: int = 32) -> ThreadingHTTPServer:
    batcher = Batcher(backend, max_batch=max_batch)
    rng = random.Random(seed)
    rng_lock = threading.Lock()
    tok = backend.tokenizer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _send(self, code: int, obj: dict[str, Any]) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, code: int, msg: str, typ: str = "invalid_request_error") -> None:
            self._send(code, {"error": {"message": msg, "type": typ, "code": code}})

        def do_GET(self):
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [{"id": model_name, "object": "model",
                                                              "owned_by": "scope"}]})
            elif self.path.rstrip("/") in ("/health", "/v1/health"):
                self._send(200, {"status": "ok"})
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self):
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self._error(404, f"no route {self.path}")
                return
            try:
                n = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(n) or b"{}")
                msgs = body["messages"]
                if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m for m in msgs):
                    raise ValueError("messages must be a list of {role, content}")
                sp = _sampling(body)
                if int(body.get("n", 1)) != 1:
                    raise ValueError("only n=1 is supported")
            except (KeyError, ValueError, TypeError, json.JSONDecodeError) as e:
                self._error(400, f"bad request: {e}")
                return
            with rng_lock:
                fail = fail_rate > 0 and rng.random() < fail_rate
            if fail:
                self._error(503, "injected failure", "server_error")
                return
            try:
                text = tok.apply_chat_template([{"role": m["role"], "content": m.get("content") or ""}
                                                for m in msgs], tokenize=False, add_generation_prompt=True)
                prompt = tok(text, add_special_tokens=False)["input_ids"]
                c = batcher.submit(prompt, sp).result()
            except Exception as e:  # noqa: BLE001
                self._error(500, f"generation failed: {type(e).__name__}: {e}", "server_error")
                return
            self._send(200, {
                "id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", model_name),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text},
                             "finish_reason": "length" if c.finish_reason == "length" else "stop"}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(c.token_ids),
                          "total_tokens": len(prompt) + len(c.token_ids)}})

    srv = ThreadingHTTPServer((host, port), Handler)
    srv.daemon_threads = True
    srv.batcher = batcher  # type: ignore[attr-defined]
    return srv


def serve_in_thread(backend: LocalBackend, port: int = 0, **kw: Any) -> tuple[ThreadingHTTPServer, str]:
    """Start a server on 127.0.0.1 in a background thread; return it and its base URL (for tests)."""
    srv = make_server(backend, host="127.0.0.1", port=port, **kw)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"

"""``scope serve``: a local model as an OpenAI-compatible ``/v1/chat/completions`` endpoint.

A FastAPI app served by uvicorn. Concurrent requests are batched: a worker thread takes whatever
requests are waiting (up to ``max_batch``), groups them by sampling settings and generates each group in
one call. Limits a client cannot lift:

- it binds to 127.0.0.1 unless told otherwise, and any other address needs an API key (then every
  request must carry ``Authorization: Bearer <key>``);
- ``max_tokens`` is capped by the room the model's context leaves after the prompt (a prompt that fills
  the context is refused), so no request reserves memory beyond one full context;
- request bodies are capped in size (``max_body_bytes``, 1 MiB by default): 413 beyond it; a body that
  is not strict JSON (NaN, Infinity, nesting too deep) or holds a setting of the wrong type (``n: 1.5``,
  ``temperature: NaN``) answers 400;
- a prompt with more bytes than the context could hold at the vocabulary's longest token, or more than
  ``MAX_MESSAGES`` messages, is refused before it is tokenised, and tokenising runs off the event loop;
- no client holds the server: a connection that has not sent a whole request head within
  ``HEADER_SECONDS`` is closed, a body that stalls ``BODY_SECONDS`` answers 408, connections past
  ``MAX_CONNECTIONS`` make room by closing the one that has waited longest for its head (the descriptor
  limit raised above it at start-up), and a
  request whose client went away is not generated for (cancelled while it waits; a stream stops at the
  next token).

``fail_rate`` makes that share of requests answer 503 (seeded), for fault-injection tests of clients.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import math
import queue
import random
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Any

from fastapi import FastAPI, Request  # module level: the route signatures' annotations are resolved here
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..types import SamplingParams
from .backend import LocalBackend

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_BODY_BYTES = 1 << 20
MAX_MESSAGES = 512
"""Messages of one chat request, at most: more are refused before any is read (a 780 KB body can hold 60,000)."""
HEADER_SECONDS = 10.0
"""A connection that has not sent a whole request head this long after it opened (or after its last response)
is closed: half-open connections cannot hold the server's descriptors."""
BODY_SECONDS = 30.0
"""A request body that stalls this long between two chunks is refused (408)."""
MAX_CONNECTIONS = 1000
"""Open connections at most (the descriptor limit is raised above it at start-up where the hard limit allows);
one more makes room by closing the connection that has waited longest for its request head."""


class Batcher:
    def __init__(self, backend: LocalBackend, max_batch: int = 32, window_s: float = 0.005):
        self.backend, self.max_batch, self.window_s = backend, max_batch, window_s
        self.q: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.skipped = 0  # requests cancelled before they were generated (their clients were gone)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def submit(self, prompt: list[int], sp: SamplingParams) -> Future:
        f: Future = Future()
        self.q.put((prompt, sp, f))
        return f

    def submit_streaming(self, prompt: list[int], sp: SamplingParams, on_text,
                         gone: threading.Event | None = None) -> Future:
        """As ``submit``; ``on_text(text so far)`` is called from the generating thread after each token (the
        request is generated in a group of its own: its callback is its own); once ``gone`` is set (its client
        went away) the generation stops at the next token."""
        def watch(text: str) -> bool:
            on_text(text)
            return gone is not None and gone.is_set()

        return self.submit(prompt, dataclasses.replace(sp, stop_fn=watch))

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
            # a request whose client went away was cancelled while it waited: it is not generated
            live = [it for it in items if it[2].set_running_or_notify_cancel()]
            self.skipped += len(items) - len(live)
            items = live
            groups: dict[tuple, list] = {}
            for it in items:
                sp = it[1]
                key = (sp.temperature, sp.top_p, sp.max_new_tokens, sp.stop, id(sp.stop_fn) if sp.stop_fn else None)
                groups.setdefault(key, []).append(it)
            for group in groups.values():
                try:
                    outs = self.backend.generate([g[0] for g in group], group[0][1])
                    for g, o in zip(group, outs):
                        g[2].set_result(o)
                except Exception as e:  # noqa: BLE001
                    for g in group:
                        g[2].set_exception(e)


class BadRequest(ValueError):
    pass


def _number(body: dict[str, Any], key: str, default: float) -> float:
    v = body.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadRequest(f"{key} must be a finite number, got {v!r}")
    return float(v)


def _integer(body: dict[str, Any], key: str, default: int) -> int:
    v = body.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"{key} must be an integer, got {v!r}")
    return v


MAX_STOPS, MAX_STOP_CHARS = 16, 256
"""Stop strings per request, and characters per stop string, at most: every decode step looks for each of them
in the newest text, so 90,000 of them held every other request for most of a minute."""


def _sampling(body: dict[str, Any]) -> SamplingParams:
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise BadRequest("stop must be a string or a list of strings")
    if len(stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS or not s for s in stop):
        raise BadRequest(f"stop: at most {MAX_STOPS} strings of 1 to {MAX_STOP_CHARS} characters")
    mt = _integer(body, "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens", 256)
    sp = SamplingParams(temperature=_number(body, "temperature", 1.0), top_p=_number(body, "top_p", 1.0),
                        max_new_tokens=mt, stop=tuple(stop))
    if sp.max_new_tokens < 1 or sp.temperature < 0 or not 0 < sp.top_p <= 1:
        raise BadRequest("max_tokens must be >= 1, temperature >= 0, 0 < top_p <= 1")
    return sp


def _no_constant(name: str):
    raise BadRequest(f"{name} is not JSON")  # json accepts NaN and Infinity unless told otherwise


def max_token_bytes(tok) -> int:
    """The most UTF-8 bytes one token of the vocabulary stands for (an upper bound: byte-level BPE's marker
    characters count two bytes each), so that ``len(text) > context * this`` cannot fit without tokenising."""
    vocab = tok.get_vocab() if hasattr(tok, "get_vocab") else {}
    return max((len(t.encode("utf-8", "surrogatepass")) for t in vocab), default=0) or 64


def context_length(backend: LocalBackend) -> int:
    cfg = backend.model.config
    return int(getattr(cfg, "max_position_embeddings", 0) or 4096)


class Guard:
    """The API key and the declared body size, checked before a request reaches a route. A plain ASGI middleware
    (not ``@app.middleware``, whose wrapping of ``receive`` hides a client's disconnect from the route)."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int):
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            refuse = None
            if self.api_key is not None and not hmac.compare_digest(
                    headers.get("authorization", "").encode(), f"Bearer {self.api_key}".encode()):
                refuse = (401, "missing or wrong API key", "authentication_error")
            n = headers.get("content-length")
            if refuse is None and n is not None and (not n.isdigit() or int(n) > self.max_body_bytes):
                refuse = (413, f"request body over {self.max_body_bytes} bytes", "invalid_request_error")
            if refuse is not None:
                code, msg, typ = refuse
                body = JSONResponse({"error": {"message": msg, "type": typ, "code": code}}, status_code=code)
                await body(scope, receive, send)
                return
        await self.app(scope, receive, send)


def make_app(backend: LocalBackend, model_name: str = "scope", fail_rate: float = 0.0, seed: int = 0,
             max_batch: int = 32, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
             body_seconds: float = BODY_SECONDS):
    app = FastAPI(title="scope serve", docs_url=None, redoc_url=None, openapi_url=None)
    batcher = Batcher(backend, max_batch=max_batch)
    app.state.batcher = batcher
    rng, rng_lock = random.Random(seed), threading.Lock()
    tok, ctx = backend.tokenizer, context_length(backend)
    max_prompt_bytes = ctx * max_token_bytes(tok)  # a longer prompt cannot fit: refused before tokenising

    def tokenise(msgs: list[dict[str, str]]) -> list[int]:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return tok(text, add_special_tokens=False)["input_ids"]

    def error(code: int, msg: str, typ: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse({"error": {"message": msg, "type": typ, "code": code}}, status_code=code)

    app.add_middleware(Guard, api_key=api_key, max_body_bytes=max_body_bytes)

    async def read_body(request: Request) -> bytes:
        data = bytearray()
        chunks = request.stream().__aiter__()
        while True:  # a body without Content-Length is capped as it arrives; one that stalls is refused
            try:
                chunk = await asyncio.wait_for(chunks.__anext__(), body_seconds)
            except StopAsyncIteration:
                return bytes(data)
            data += chunk
            if len(data) > max_body_bytes:
                raise OverflowError

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "scope"}]}

    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat(request: Request):
        try:
            raw = await read_body(request)
        except OverflowError:
            return error(413, f"request body over {max_body_bytes} bytes")
        except asyncio.TimeoutError:
            return error(408, f"the request body stalled for {body_seconds:g} s")
        try:
            body, msgs, sp, stream = _chat_request(raw)
            n_bytes = sum(len(m["content"].encode("utf-8", "surrogatepass")) for m in msgs)
            if n_bytes > max_prompt_bytes:
                raise BadRequest(f"the prompt ({n_bytes} bytes) cannot fit the model's context ({ctx} tokens)")
            # off the event loop: a long prompt does not stall the other requests while it is tokenised
            prompt = await asyncio.to_thread(tokenise, msgs)
        except (BadRequest, json.JSONDecodeError, TypeError, ValueError, RecursionError) as e:
            return error(400, f"bad request: {e}")
        room = ctx - len(prompt)
        if room < 1:
            return error(400, f"bad request: the prompt ({len(prompt)} tokens) fills the model's context ({ctx})")
        sp = SamplingParams(temperature=sp.temperature, top_p=sp.top_p, max_new_tokens=min(sp.max_new_tokens, room),
                            stop=sp.stop)
        with rng_lock:
            fail = fail_rate > 0 and rng.random() < fail_rate
        if fail:
            return error(503, "injected failure", "server_error")
        if stream:
            return StreamingResponse(_stream(batcher, prompt, sp, body.get("model", model_name)),
                                     media_type="text/event-stream")
        fut = batcher.submit(prompt, sp)
        waiting = asyncio.wrap_future(fut)
        while not waiting.done():  # a client that went away is not generated for (cancelled while it waits)
            await asyncio.wait({waiting}, timeout=0.25)
            if not waiting.done() and await request.is_disconnected():
                fut.cancel()
                return Response(status_code=499)
        try:
            c = waiting.result()
        except Exception as e:  # noqa: BLE001
            return error(500, f"generation failed: {type(e).__name__}: {e}", "server_error")
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", model_name),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text},
                         "finish_reason": "length" if c.finish_reason == "length" else "stop"}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(c.token_ids),
                      "total_tokens": len(prompt) + len(c.token_ids)}}

    return app


def _chat_request(raw: bytes) -> tuple[dict[str, Any], list[dict[str, str]], SamplingParams, bool]:
    """A chat-completions body read and checked: the body, its messages as plain strings, the sampling settings
    and whether to stream. Anything malformed is a :class:`BadRequest` naming what is wrong."""
    try:
        body = json.loads(raw or b"{}", parse_constant=_no_constant)
    except RecursionError:
        raise BadRequest("the body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    msgs = body.get("messages")
    if isinstance(msgs, list) and len(msgs) > MAX_MESSAGES:
        raise BadRequest(f"{len(msgs)} messages: at most {MAX_MESSAGES}")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m for m in msgs):
        raise BadRequest("messages must be a non-empty list of {role, content}")
    sp = _sampling(body)
    if _integer(body, "n", 1) != 1:
        raise BadRequest("only n=1 is supported")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false")
    return body, [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in msgs], sp, stream



async def _stream(batcher: Batcher, prompt: list[int], sp: SamplingParams, model: str):
    """OpenAI's streaming format: one ``chat.completion.chunk`` per new piece of text as it is generated
    (the tail that could still become a stop string is held back), then the finish reason and [DONE]."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    gone = threading.Event()
    fut = batcher.submit_streaming(prompt, sp, lambda text: loop.call_soon_threadsafe(q.put_nowait, text), gone)
    fut.add_done_callback(lambda _: loop.call_soon_threadsafe(q.put_nowait, None))
    try:
        async for event in _events(q, fut, sp, model):
            yield event
    finally:  # the client went away (the response is cancelled) or the stream ended: stop generating
        gone.set()
        fut.cancel()


async def _events(q: asyncio.Queue, fut: Future, sp: SamplingParams, model: str):
    cid, created = f"chatcmpl-{uuid.uuid4().hex[:16]}", int(time.time())
    hold = max((len(x) for x in sp.stop), default=0)

    def chunk(delta: dict, finish: str | None = None) -> str:
        return "data: " + json.dumps({"id": cid, "object": "chat.completion.chunk", "created": created,
                                      "model": model, "choices": [{"index": 0, "delta": delta,
                                                                   "finish_reason": finish}]}) + "\n\n"

    yield chunk({"role": "assistant", "content": ""})
    sent = 0
    while True:
        text = await q.get()
        if text is None:
            break
        upto = max(sent, len(text) - hold)
        if upto > sent:
            yield chunk({"content": text[sent:upto]})
            sent = upto
    try:
        c = fut.result()
    except Exception as e:  # noqa: BLE001 - the stream has begun: the error is its last event
        yield "data: " + json.dumps({"error": {"message": f"generation failed: {type(e).__name__}: {e}",
                                               "type": "server_error"}}) + "\n\n"
        return
    if len(c.text) > sent:
        yield chunk({"content": c.text[sent:]})
    yield chunk({}, "length" if c.finish_reason == "length" else "stop")
    yield "data: [DONE]\n\n"


def check_bind(host: str, api_key: str | None) -> None:
    if host not in LOOPBACK and not api_key:
        raise ValueError(f"serving on {host} (not loopback) needs an API key: set --api-key-env to a variable "
                         "that holds one")


def guarded_protocol(header_seconds: float = HEADER_SECONDS, max_connections: int = MAX_CONNECTIONS):
    """uvicorn's h11 protocol with two guards it lacks: a connection waiting for a request head (a new one, or
    one kept alive after a response) is closed once it has waited ``header_seconds`` with the head incomplete
    (uvicorn's keep-alive timer stops at the first byte, so half a head would hold it forever), and past
    ``max_connections`` a new connection closes the one that has waited longest for its head (or itself, when
    every other is in a request)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Guarded(H11Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._waiting_since: float | None = time.monotonic()
            if len(self.connections) > max_connections:  # make room: the one that has waited longest for its
                # request head goes (a half-open one, most likely), else this one
                since = {c: t for c in self.connections if c is not self and not c.transport.is_closing()
                         and (t := getattr(c, "_waiting_since", None)) is not None}
                if not since:
                    transport.close()
                    return
                min(since, key=since.__getitem__).transport.close()
            self._guard = self.loop.call_later(header_seconds, self._check_head)

        def _check_head(self) -> None:
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                self._waiting_since = None  # a request is under way: the app's own timeouts hold
            elif self._waiting_since is None:
                self._waiting_since = time.monotonic()
            if self._waiting_since is not None and time.monotonic() - self._waiting_since >= header_seconds:
                self.transport.close()
                return
            self._guard = self.loop.call_later(header_seconds / 4, self._check_head)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._waiting_since = time.monotonic()  # waiting for the next request head from now

        def connection_lost(self, exc) -> None:
            guard = getattr(self, "_guard", None)
            if guard is not None:
                guard.cancel()
            super().connection_lost(exc)

    return Guarded


def raise_descriptor_limit(want: int) -> int:
    """The soft limit on open descriptors raised to ``want`` where the hard limit allows; the soft limit after."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    return soft


class Server:
    """A uvicorn server for the app, run in this thread (``serve_forever``) or a background one."""

    def __init__(self, app, host: str, port: int, header_seconds: float = HEADER_SECONDS,
                 max_connections: int = MAX_CONNECTIONS):
        import uvicorn

        self.app = app
        limit = raise_descriptor_limit(max_connections + 256)
        max_connections = min(max_connections, max(16, limit - 128))  # room for the model's own files
        self.config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                     lifespan="off", http=guarded_protocol(header_seconds, max_connections))
        self.server = uvicorn.Server(self.config)
        self.thread: threading.Thread | None = None

    @property
    def server_address(self) -> tuple[str, int]:
        sock = self.server.servers[0].sockets[0]
        return sock.getsockname()[:2]

    def serve_forever(self) -> None:
        self.server.run()

    def start(self) -> "Server":
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            if not self.thread.is_alive() or time.time() - t0 > 30:
                raise RuntimeError("scope serve: the server did not start")
            time.sleep(0.01)
        return self

    def wait(self) -> None:
        """Block until the server stops; Ctrl-C shuts it down."""
        assert self.thread is not None, "start() the server first"
        try:
            while self.thread.is_alive():
                self.thread.join(0.5)
        except KeyboardInterrupt:
            self.shutdown()

    def shutdown(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)
        batcher = getattr(self.app.state, "batcher", None)  # apps other than scope serve have none
        if batcher is not None:
            batcher.stop.set()


def make_server(backend: LocalBackend, host: str = "127.0.0.1", port: int = 8000, model_name: str = "scope",
                fail_rate: float = 0.0, seed: int = 0, max_batch: int = 32, api_key: str | None = None,
                max_body_bytes: int = MAX_BODY_BYTES, header_seconds: float = HEADER_SECONDS,
                body_seconds: float = BODY_SECONDS, max_connections: int = MAX_CONNECTIONS) -> Server:
    check_bind(host, api_key)
    app = make_app(backend, model_name=model_name, fail_rate=fail_rate, seed=seed, max_batch=max_batch,
                   api_key=api_key, max_body_bytes=max_body_bytes, body_seconds=body_seconds)
    return Server(app, host, port, header_seconds=header_seconds, max_connections=max_connections)


def serve_in_thread(backend: LocalBackend, port: int = 0, **kw: Any) -> tuple[Server, str]:
    """Start a server on 127.0.0.1 in a background thread; return it and its base URL (for tests)."""
    srv = make_server(backend, host="127.0.0.1", port=port, **kw).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"

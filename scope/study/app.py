"""``scope study serve``: the participant page and its API (FastAPI, served by uvicorn).

Participant flow: the recruitment URL (``/?PROLIFIC_PID=..&STUDY_ID=..&SESSION_ID=..``) loads the page,
which calls ``POST /api/start``: a new participant is assigned a cell and a task, a returning one gets
their session back. Every session request carries the session's owner token (``X-Session-Token``,
an HMAC of the session id). ``POST /api/session/{id}/message`` answers with a stream of server-sent
events (the agent's reply is stored first, then streamed in chunks). The condition never leaves the
server. ``/api/admin/...`` needs ``Authorization: Bearer <admin token>``.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import os
import re
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from . import store
from .config import ID_PATTERN
from .service import StudyError, StudyService

PAGE = os.path.join(os.path.dirname(__file__), "page.html")
_ID = re.compile(ID_PATTERN)


def make_app(service: StudyService, admin_token: str | None = None) -> FastAPI:
    """The app: a body-size and header guard, StudyError as JSON, the participant routes and the admin ones."""
    app = FastAPI(title="scope study", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    cap = service.cfg.study.max_body_bytes

    @app.middleware("http")
    async def guard(request: Request, call_next):
        n = request.headers.get("content-length")
        if n is not None and (not n.isdigit() or int(n) > cap):
            return _error(413, f"request body over {cap} bytes")
        response = await call_next(request)
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.exception_handler(StudyError)
    async def _study_error(request: Request, e: StudyError):
        return _error(e.status, e.message)

    _participant_routes(app, service)
    _admin_routes(app, service, admin_token)
    return app


def _error(code: int, msg: str) -> JSONResponse:
    return JSONResponse({"error": msg}, status_code=code)


async def _body(request: Request, cap: int) -> dict[str, Any]:
    """The request's JSON object, read up to ``cap`` bytes (a longer body is a 413 whatever its header says)."""
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > cap:
            raise StudyError(413, f"request body over {cap} bytes")
    try:
        obj = json.loads(data or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise StudyError(400, "the body is not JSON") from None
    if not isinstance(obj, dict):
        raise StudyError(400, "the body must be a JSON object")
    return obj


def _participant_routes(app: FastAPI, service: StudyService) -> None:
    from starlette.concurrency import run_in_threadpool

    cap = service.cfg.study.max_body_bytes
    with open(PAGE) as f:
        page = f.read()

    def owned(request: Request, sid: str) -> store.StudySession:
        return service.check_owner(sid, request.headers.get("x-session-token"))

    @app.get("/", response_class=HTMLResponse)
    def index():
        return HTMLResponse(page, headers={"Content-Security-Policy": "default-src 'self'; style-src 'self' "
                                           "'unsafe-inline'; script-src 'self' 'unsafe-inline'"})

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.post("/api/start")
    async def start(request: Request):
        b = await _body(request, cap)
        ids: list[Any] = [b.get("participant_id"), b.get("study_id"), b.get("session_id")]
        if not all(isinstance(x, str) and _ID.fullmatch(x) for x in ids):  # fullmatch: no trailing newline
            raise StudyError(400, "participant_id, study_id and session_id are required (letters, digits, "
                                  "'_', '.', '-'; at most 64)")
        sess = await run_in_threadpool(service.start, *ids)
        await run_in_threadpool(service.catch_up, sess)  # P4G: the agent writes first
        return {"token": service.token(sess.id)} | await run_in_threadpool(service.state, sess)

    @app.get("/api/session/{sid}")
    def state(sid: str, request: Request):
        sess = owned(request, sid)
        service.catch_up(sess)  # a reply lost to a restart is made now
        return service.state(sess)

    @app.post("/api/session/{sid}/message")
    async def message(sid: str, request: Request):
        sess = owned(request, sid)
        b = await _body(request, cap)
        if not isinstance(b.get("text"), str):
            raise StudyError(400, "text is required")
        text = service.check_message(b["text"])  # a bad message is a 4xx before the stream begins
        if text.lower() != "/stop" and store.stored_session(service.engine, sess.id).status != "active":
            raise StudyError(409, "this chat has ended")
        if text.lower() == "/stop":
            events = await run_in_threadpool(service.end, sess)
            return StreamingResponse(iter([sse(ev) for ev in events] + [sse({"type": "done"})]),
                                     media_type="text/event-stream")
        service.claim(sess)  # a second message while one is answered is a 409 (429 when busy), not a stream
        return StreamingResponse(_reply_stream(service, sess, text), media_type="text/event-stream")

    @app.post("/api/session/{sid}/end")
    def end(sid: str, request: Request):
        sess = owned(request, sid)
        service.end(sess)
        return service.state(sess)

    @app.post("/api/session/{sid}/survey")
    async def survey(sid: str, request: Request):
        sess = owned(request, sid)
        b = await _body(request, cap)
        return await run_in_threadpool(service.survey, sess, b.get("answers"), b.get("free_text"))


def _reply_stream(service: StudyService, sess: store.StudySession, text: str) -> AsyncIterator[str]:
    """The agent's turn as server-sent events, each sent as it happens in a worker thread (started now, on the
    event loop, whether or not the stream is read); an error after the stream has begun is its last event."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()

    def emit(ev: dict | None) -> None:  # from the worker thread, as each event happens (None: the end)
        loop.call_soon_threadsafe(q.put_nowait, ev)

    def work() -> None:
        try:
            service.message(sess, text, emit=emit, claimed=True)  # each turn is stored whole when it ends
        except StudyError as e:
            emit({"type": "error", "status": e.status, "message": e.message})
        except Exception as e:  # noqa: BLE001 - the stream has begun: the error is its last event
            emit({"type": "error", "status": 500, "message": f"{type(e).__name__}: {e}"})
        finally:
            emit(None)

    task = loop.run_in_executor(None, work)

    async def stream() -> AsyncIterator[str]:
        while True:
            ev = await q.get()
            if ev is None:
                break
            yield sse(ev)
        await task
        yield sse({"type": "done"})

    return stream()


def _admin_routes(app: FastAPI, service: StudyService, admin_token: str | None) -> None:
    def admin(request: Request) -> None:
        got = request.headers.get("authorization", "")
        if not admin_token or not hmac.compare_digest(got.encode(), f"Bearer {admin_token}".encode()):
            raise StudyError(403, "admin token required")

    @app.get("/api/admin/cells")
    def cells(request: Request):
        admin(request)
        return {"cells": [{"condition": c, "task_type": t, "n": n}
                          for (c, t), n in sorted(store.cell_counts(service.engine).items())]}

    @app.get("/api/admin/export/{table}.csv")
    def export(table: str, request: Request):
        admin(request)
        if table not in store.EXPORTS:
            raise StudyError(404, f"no table {table!r}; have {sorted(store.EXPORTS)}")
        return Response(store.csv_text(service.engine, table), media_type="text/csv")


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"

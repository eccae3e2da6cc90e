"""`scope serve` against clients that hold it: half-open connections, requests abandoned mid-wait, and bodies that
cost work before they are refused: real sockets against `scope serve` in a process of its own, or a uvicorn server
in a thread of this one where the test changes the model."""
import json
import socket
import subprocess
import sys
import threading
import time

import httpx

from scope.models.server import MAX_MESSAGES, serve_in_thread


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_half_open_connections_are_closed_and_do_not_starve_the_rest():
    """Against `scope serve` in a process of its own (a head timeout of 1 s, a cap of 40 connections)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "scope.cli", "serve", "--model", "tiny-random", "--port", str(port),
                             "--header-seconds", "1", "--max-connections", "40"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    socks = []
    try:
        assert f"127.0.0.1:{port}" in proc.stdout.readline()
        host = "127.0.0.1"
        for _ in range(60):  # each sends half a request head and waits
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        t0 = time.monotonic()
        r = httpx.get(f"http://{host}:{port}/health", timeout=10)
        assert r.status_code == 200 and time.monotonic() - t0 < 3.0
        time.sleep(2.0)  # past the head timeout: the server has closed every one of them
        closed = 0
        for s in socks:
            s.settimeout(2)
            try:
                closed += s.recv(1) == b""
            except (ConnectionResetError, socket.timeout):
                closed += 1
        assert closed == len(socks)
        r = httpx.get(f"http://{host}:{port}/health", timeout=10)
        assert r.status_code == 200
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait(timeout=10)


def test_requests_whose_clients_left_are_not_generated_for(tiny, monkeypatch):
    gen = tiny.generate

    def slow(prompts, sp):  # a generation that takes its time, one request at a time
        time.sleep(0.4)
        return gen(prompts, sp)

    monkeypatch.setattr(tiny, "generate", slow)
    srv, url = serve_in_thread(tiny, max_batch=1)
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    try:
        def abandon():
            try:
                httpx.post(f"{url}/chat/completions", json=body, timeout=0.3)
            except httpx.TimeoutException:
                pass

        threads = [threading.Thread(target=abandon) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(0.6)
        t0 = time.monotonic()
        r = httpx.post(f"{url}/chat/completions", json=body, timeout=60)
        waited = time.monotonic() - t0
        assert r.status_code == 200
        # 20 abandoned requests at 0.4 s each would be 8 s; what was waiting when its client left is skipped
        assert waited < 3.0, waited
        assert srv.app.state.batcher.skipped >= 15
        with httpx.stream("POST", f"{url}/chat/completions", json={**body, "stream": True, "max_tokens": 64},
                          timeout=60) as s:
            next(s.iter_lines())  # the stream began; the client goes away now
    finally:
        srv.shutdown()


def test_a_request_of_too_many_messages_is_refused_before_it_is_read(tiny):
    srv, url = serve_in_thread(tiny)
    try:
        raw = json.dumps({"model": "x", "messages": [{"role": "u"}] * 60_000}, separators=(",", ":"))
        assert len(raw) < 800_000  # under the body cap: what used to cost seconds of work before its 400
        t0 = time.monotonic()
        r = httpx.post(f"{url}/chat/completions", content=raw, timeout=30, headers={"content-type": "application/json"})
        assert r.status_code == 400 and f"at most {MAX_MESSAGES}" in r.json()["error"]["message"]
        assert time.monotonic() - t0 < 1.0
    finally:
        srv.shutdown()

"""A judge server on the loopback address for the remote judge's tests, served by a thread of the test.

It scores each request with ``scorer`` (default: 1.0 when the response contains the ground truth, else 0.0, and
``length``, the response's length, as an extra field). It records every request's JSON body and the most requests
it had in flight at once, and can answer the first ``fail_first`` requests 503, hold each request ``delay_s``
(those whose response contains ``slow_when``, when set; with ``gather``, only until that many are in flight
together) and then ``hold_s`` more, or answer every request with ``body`` and ``status``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator


class JudgeServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a held request must not hold up the test's end

    def __init__(
        self, fail_first=0, delay_s=0.0, slow_when=None, body=None, status=200, scorer=None, gather=0, hold_s=0
    ):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fail_first, self.delay_s, self.slow_when = fail_first, delay_s, slow_when
        self.gather, self.hold_s = gather, hold_s
        self.body, self.status = body, status
        self.scorer = scorer or contains_ground_truth
        self.scores: list[float] = []  # in the order answered
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        self.released = threading.Event()  # set at the end, or once ``gather`` requests are in flight together

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/score"

    def arrived(self, sample: dict) -> int:
        """Record a request as it arrives; its number, from 1."""
        with self.lock:
            self.requests.append(sample)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self.gather and self.in_flight >= self.gather:
                self.released.set()
            return len(self.requests)

    def answer(self, sample: dict, number: int) -> tuple[int, bytes]:
        if number <= self.fail_first:
            return 503, b"busy"
        if self.body is not None:
            return self.status, self.body
        answer = self.scorer(sample)
        with self.lock:
            self.scores.append(answer["score"])
        return self.status, json.dumps(answer).encode()


def contains_ground_truth(sample: dict) -> dict:
    """1.0 when the response contains the ground truth, else 0.0; ``length``: the response's length."""
    return {"score": float(str(sample["ground_truth"]) in sample["response"]), "length": len(sample["response"])}


class _Handler(BaseHTTPRequestHandler):
    server: JudgeServer

    def do_POST(self) -> None:
        server = self.server
        sample = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        number = server.arrived(sample)
        try:
            if server.slow_when is None or server.slow_when in sample["response"]:
                server.released.wait(server.delay_s)
            time.sleep(server.hold_s)
            status, body = server.answer(sample, number)
        finally:
            # Counted out before the answer is written: once the client reads it, its next request may arrive
            # on another thread before this one would get past the write.
            with server.lock:
                server.in_flight -= 1
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on a held request

    def log_message(self, format: str, *args) -> None:
        pass  # quiet: pytest shows failures, not each request


@contextlib.contextmanager
def judge_server(**behaviour) -> Iterator[JudgeServer]:
    """A running :class:`JudgeServer` on a free loopback port, shut down and closed at the end."""
    server = JudgeServer(**behaviour)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.released.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def dead_url() -> str:
    """A loopback URL nobody listens on: a port the system just handed out and took back."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/score"

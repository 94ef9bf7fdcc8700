"""A loopback HTTP proxy in front of the moto S3 server: counts requests, injects faults.

s3fs and botocore talk to the proxy exactly as they would to S3 (real HTTP, real retries);
the proxy forwards each request to moto unless a :class:`Rule` matches it::

    proxy = S3Proxy(moto_endpoint).start()
    proxy.add(Rule("GET", "/bucket/ds/_feedline.json", status=503))   # a persistent 503
    ...                                   # storage_options with endpoint_url=proxy.endpoint
    proxy.count("GET", "_feedline.json")  # requests that reached the "server"
    proxy.stop()

A rule matches requests with its method (or one of its methods) whose path, or body, holds
its ``path`` text (a bulk delete names its keys in the body). It answers ``times`` matching
requests (``None``: all of them, a persistent fault) with
``status`` and an S3 error document (``code``); with ``after=True`` the request reaches the
server first and only its response is replaced by the error (a response lost after the
request took effect). With ``hold=True`` it lets them through only once
:meth:`Rule.release` is called (``rule.arrived`` is set when one is waiting), so a test can
act while a request is in flight.
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

__all__ = ["Rule", "S3Proxy"]

#: headers that belong to one connection, not to the request or response
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection"})


@dataclass
class Rule:
    """Answer matching requests with an error (or hold them); see the module docstring."""

    method: str | tuple[str, ...]
    path: str
    status: int = 503
    code: str = "ServiceUnavailable"
    times: int | None = None
    hold: bool = False
    after: bool = False
    arrived: threading.Event = field(default_factory=threading.Event)
    _go: threading.Event = field(default_factory=threading.Event)
    _used: int = 0

    def matches(self, method: str, path: str, body: bytes) -> bool:
        methods = (self.method,) if isinstance(self.method, str) else self.method
        where = self.path in path or self.path.encode() in body
        return method in methods and where and (self.times is None or self._used < self.times)

    def release(self) -> None:
        """Let a held request (and any later one) through to the server."""
        self._go.set()


class S3Proxy:
    """A threaded HTTP proxy on 127.0.0.1 forwarding to ``upstream`` (see the module docstring)."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rules: list[Rule] = []
        self.requests: list[tuple[str, str]] = []
        #: the paths of the server-side copies requested (``PUT`` with ``x-amz-copy-source``)
        self.copies: list[str] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                return

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> S3Proxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        for rule in self.rules:
            rule.release()
        self._server.shutdown()
        self._server.server_close()

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def count(self, method: str, path: str) -> int:
        """Requests with ``method`` whose path contains ``path`` that reached the proxy."""
        with self._lock:
            return sum(1 for m, p in self.requests if m == method and path in p)

    # ------------------------------------------------------------------ one request

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        method, path = handler.command, handler.path
        body = _read_body(handler)
        with self._lock:
            self.requests.append((method, path))
            if handler.headers.get("x-amz-copy-source"):
                self.copies.append(path)
            rule = next((r for r in self.rules if r.matches(method, path, body)), None)
            if rule is not None:
                rule._used += 1
        if rule is not None and rule.hold:
            rule.arrived.set()
            rule._go.wait(60)
        elif rule is not None and not rule.after:
            _answer_error(handler, rule)
            return
        status, reason, headers, data = self._forward(method, path, handler, body)
        if rule is not None and rule.after:
            _answer_error(handler, rule)
            return
        handler.send_response(status, reason)
        for name, value in headers:
            if name.lower() not in _HOP and (method == "HEAD" or name.lower() != "content-length"):
                handler.send_header(name, value)
        if method != "HEAD":
            handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if method != "HEAD":
            handler.wfile.write(data)

    def _forward(
        self, method: str, path: str, handler: BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP}
            headers["Content-Length"] = str(len(body))
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
            return response.status, response.reason, response.getheaders(), data
        finally:
            connection.close()


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(handler.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def _answer_error(handler: BaseHTTPRequestHandler, rule: Rule) -> None:
    document = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{rule.code}</Code><Message>injected by the test proxy</Message>"
        "<RequestId>feedline-proxy</RequestId></Error>"
    ).encode()
    handler.send_response(rule.status)
    handler.send_header("Content-Type", "application/xml")
    handler.send_header("Content-Length", "0" if handler.command == "HEAD" else str(len(document)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(document)

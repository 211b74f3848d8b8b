"""A fake Hugging Face hub (and CDN, and plain mirror) on 127.0.0.1 for download tests.

It answers what ``huggingface_hub`` (0.2x and 1.x) calls for ``hf_hub_download`` and ``HfApi.get_paths_info``:

- ``HEAD/GET /{repo}/resolve/{revision}/{path}``: a small (non-LFS) file answers 200 with ``X-Repo-Commit`` and
  ``ETag``; an LFS file answers 302 to the CDN host with ``X-Repo-Commit``, ``X-Linked-Etag`` (its sha256),
  ``X-Linked-Size`` and ``Location``, like the real hub.
- ``GET /cdn/{sha256}`` (on ``localhost``, a different host name, so the client does not follow the HEAD
  redirect and reads the metadata from the 302 itself): the bytes, honouring ``Range``.
- ``POST /api/models/{repo}/paths-info/{revision}``: the JSON list with ``size`` and ``lfs.oid``.
- ``GET /mirror/{name}``: plain HTTP files with Range support (the "URL" sources).

Faults: ``cut_once[path] = n`` sends the full ``Content-Length`` but only ``n`` bytes on the first GET, then
closes the connection; a file that is not registered answers 404 with ``X-Error-Code: EntryNotFound`` (or
``RepoNotFound`` for an unknown repository); ``html[path]`` serves a web page with status 200 instead.
Every request is recorded in ``requests`` (method, path, Range header, whether an Authorization header came).
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Serve files; use as a context manager. ``url`` is the endpoint to put in ``HF_ENDPOINT``."""

    def __init__(self, lfs_threshold: int = 1024):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.mirror: dict[str, bytes] = {}
        self.cut_once: dict[str, int] = {}
        self.html: set[str] = set()
        self.requests: list[dict] = []
        self.lfs_threshold = lfs_threshold
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._handle(self, head=True)

            def do_GET(self):
                hub._handle(self, head=False)

            def do_POST(self):
                hub._handle_post(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cdn = f"http://localhost:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # -- setup ----------------------------------------------------------------------------------------------
    def add(self, repo: str, path: str, data: bytes) -> None:
        self.repos.setdefault(repo, {})[path] = data

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def count(self, method: str | None = None, contains: str = "") -> int:
        with self._lock:
            return sum(1 for r in self.requests if (method is None or r["method"] == method)
                       and contains in r["path"])

    # -- serving --------------------------------------------------------------------------------------------
    def _record(self, h: BaseHTTPRequestHandler, method: str) -> None:
        with self._lock:
            self.requests.append({"method": method, "path": urllib.parse.unquote(h.path),
                                  "range": h.headers.get("Range"), "auth": "Authorization" in h.headers,
                                  "host": h.headers.get("Host", "")})

    def _by_sha(self, sha: str) -> bytes | None:
        for files in [*self.repos.values(), self.mirror]:
            for data in files.values():
                if hashlib.sha256(data).hexdigest() == sha:
                    return data
        return None

    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        method = "HEAD" if head else "GET"
        self._record(h, method)
        path = urllib.parse.unquote(urllib.parse.urlsplit(h.path).path)
        if path.startswith("/cdn/"):
            data = self._by_sha(path[len("/cdn/"):])
            return self._send_bytes(h, data, head, key=path)
        if path.startswith("/mirror/"):
            name = path[len("/mirror/"):]
            if name in self.html:
                return self._send_html(h, head)
            return self._send_bytes(h, self.mirror.get(name), head, key=path)
        parts = path.lstrip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, rel = f"{parts[0]}/{parts[1]}", "/".join(parts[4:])
            if repo not in self.repos:
                return self._error(h, 401, "RepoNotFound", f"Repository {repo} not found")
            data = self.repos[repo].get(rel)
            if data is None:
                return self._error(h, 404, "EntryNotFound", f"{rel} does not exist on main")
            if f"{repo}/{rel}" in self.html:
                return self._send_html(h, head)
            sha = hashlib.sha256(data).hexdigest()
            if len(data) >= self.lfs_threshold:
                h.send_response(302)
                h.send_header("X-Repo-Commit", COMMIT)
                h.send_header("X-Linked-Etag", f'"{sha}"')
                h.send_header("ETag", '"deadbeef"')
                h.send_header("X-Linked-Size", str(len(data)))
                h.send_header("Location", f"{self.cdn}/cdn/{sha}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return None
            h.send_response(200)
            h.send_header("X-Repo-Commit", COMMIT)
            h.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
            return self._finish_bytes(h, data, head, key=f"{repo}/{rel}", status_sent=True)
        return self._error(h, 404, "EntryNotFound", f"unknown path {path}")

    def _handle_post(self, h: BaseHTTPRequestHandler) -> None:
        self._record(h, "POST")
        path = urllib.parse.unquote(urllib.parse.urlsplit(h.path).path)
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length).decode()
        parts = path.lstrip("/").split("/")
        if len(parts) >= 6 and parts[0] == "api" and parts[4] == "paths-info":
            repo = f"{parts[2]}/{parts[3]}"
            if repo not in self.repos:
                return self._error(h, 401, "RepoNotFound", f"Repository {repo} not found")
            form = urllib.parse.parse_qs(body)
            out = []
            for rel in form.get("paths", []):
                data = self.repos[repo].get(rel)
                if data is None:
                    continue
                item = {"type": "file", "path": rel, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                if len(data) >= self.lfs_threshold:
                    item["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 132}
                out.append(item)
            raw = json.dumps(out).encode()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(raw)))
            h.end_headers()
            h.wfile.write(raw)
            return None
        return self._error(h, 404, "EntryNotFound", f"unknown API path {path}")

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        raw = json.dumps({"error": message}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(raw)

    def _send_html(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        raw = b"<!DOCTYPE html><html><head><title>Google Drive - Quota exceeded</title></head><body>x</body></html>"
        h.send_response(200)
        h.send_header("Content-Type", "text/html; charset=utf-8")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        if not head:
            h.wfile.write(raw)

    def _send_bytes(self, h: BaseHTTPRequestHandler, data: bytes | None, head: bool, key: str) -> None:
        if data is None:
            return self._error(h, 404, "EntryNotFound", "no such blob")
        return self._finish_bytes(h, data, head, key=key, status_sent=False)

    def _finish_bytes(self, h: BaseHTTPRequestHandler, data: bytes, head: bool, key: str,
                      status_sent: bool) -> None:
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and not status_sent:
            start = int(rng[len("bytes="):].split("-")[0] or 0)
            if start >= len(data):
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{len(data)}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return None
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        elif not status_sent:
            h.send_response(200)
        body = data[start:]
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if head:
            return None
        with self._lock:
            cut = None
            for k in list(self.cut_once):
                if key.endswith(k):
                    cut = self.cut_once.pop(k)
                    break
        if cut is not None and start < cut:
            h.wfile.write(body[: cut - start])
            h.wfile.flush()
            h.close_connection = True
            try:
                import socket

                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return None
        h.wfile.write(body)
        return None

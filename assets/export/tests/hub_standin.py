"""A stand-in for the model hub on 127.0.0.1 (an ephemeral port, a thread), for tests of `download`
without a network.  It answers the requests huggingface_hub makes of the hub (file_download.py's
get_hf_file_metadata and http_get, utils/_http.py's hf_raise_for_status), with its headers:

- HEAD and GET /{repo}/resolve/{revision}/{path}, with X-Repo-Commit on every answer:
  a small file: 200 with ETag (a git blob id) and Content-Length, and on GET its bytes;
  a large file (LFS: .pt, .pth): 302 with X-Linked-Etag (its sha256), X-Linked-Size and a Location
  on another host (`localhost` for `127.0.0.1`), as the hub sends a signed address off the hub
  where no token may go;
- GET /lfs/{sha256} on that host: the bytes; `Range: bytes=N-` gets 206 with Content-Range;
- the hub's errors: 401 with X-Error-Code RepoNotFound (an unknown repository) or GatedRepo (a
  repository that wants a token, without it); 404 with RevisionNotFound or EntryNotFound.

Knobs for the tests: `cut` {(repo, path): N} ends every transfer of that file's bytes at offset N
by closing the connection; `tokens` {repo: token} makes a repository want `Bearer token`;
`missing` {(repo, path)} answers 404; `etags` {(repo, path): text} sends that ETag (X-Linked-Etag
for a large file) in place of the file's own, as a hostile or broken hub might; `trickle`
{(repo, path): seconds} sends that file's bytes one at a time, that many seconds apart, as a
stalled connection does.  `log` has one `Request` per request, in order.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

COMMIT = hashlib.sha1(b"stand-in commit").hexdigest()
LFS_SUFFIXES = (".pt", ".pth")


@dataclass
class Request:
    method: str
    host: str
    path: str
    range: str | None
    authorized: bool
    sent: int = 0  # body bytes written


@dataclass
class Served:
    data: bytes
    sha256: str
    blob: str  # git's blob id, the ETag of a file stored in git


class StandInHub:
    def __init__(self, files: dict):
        """`files`: {(repo, path in the repository): local file}."""
        self.files = {}
        for key, local in files.items():
            data = Path(local).read_bytes()
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            self.files[key] = Served(data, hashlib.sha256(data).hexdigest(), blob)
        self.by_sha = {s.sha256: (key, s) for key, s in self.files.items()}
        self.cut: dict = {}
        self.tokens: dict = {}
        self.missing: set = set()
        self.etags: dict = {}
        self.trickle: dict = {}
        self.log: list[Request] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._answer(self, body=False)

            def do_GET(self):
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def requests(self, method: str | None = None, path_part: str = "") -> list[Request]:
        with self._lock:
            return [r for r in self.log if (method is None or r.method == method) and path_part in r.path]

    # -----------------------------------------------------------------------------------------

    def _answer(self, h: BaseHTTPRequestHandler, body: bool):
        url = urlsplit(h.path)
        host = (h.headers.get("Host") or "").split(":")[0]
        auth = h.headers.get("Authorization")
        req = Request(h.command, host, unquote(url.path), h.headers.get("Range"), auth is not None)
        with self._lock:
            self.log.append(req)
        parts = req.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "lfs" and parts[1] in self.by_sha:
            key, served = self.by_sha[parts[1]]
            return self._bytes(h, req, key, served, {}, body)
        if len(parts) < 5 or parts[2] != "resolve":
            return self._error(h, 404, None, "not a hub address")
        repo, revision, path = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        repos = {r for r, _ in self.files}
        if repo not in repos:
            return self._error(h, 401, "RepoNotFound", "Repository not found")
        want = self.tokens.get(repo)
        if want is not None and auth != f"Bearer {want}":
            return self._error(h, 401, "GatedRepo",
                               f"Access to model {repo} is restricted. You must have access to it and be authenticated "
                               "to access it. Please log in.")
        if revision not in ("main", COMMIT):
            return self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
        key = (repo, path)
        if key not in self.files or key in self.missing:
            return self._error(h, 404, "EntryNotFound", f"{path} does not exist on \"{revision}\"")
        served = self.files[key]
        head = {"X-Repo-Commit": COMMIT}
        etag = self.etags.get(key)
        if path.endswith(LFS_SUFFIXES):
            h.send_response(302)
            for k, v in {**head, "X-Linked-Etag": f'"{etag or served.sha256}"',
                         "X-Linked-Size": str(len(served.data)),
                         "ETag": f'"{served.blob}"',
                         "Location": f"http://localhost:{self.port}/lfs/{served.sha256}",
                         "Content-Length": "0"}.items():
                h.send_header(k, v)
            h.end_headers()
            return
        return self._bytes(h, req, key, served, {**head, "ETag": f'"{etag or served.blob}"'}, body)

    def _bytes(self, h, req: Request, key, served: Served, headers: dict, body: bool):
        data, start = served.data, 0
        if req.range:
            start = int(req.range.removeprefix("bytes=").split("-")[0])
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            h.send_response(200)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data) - start))
        h.send_header("Accept-Ranges", "bytes")
        h.end_headers()
        if not body:
            return
        end = len(data)
        pause = self.trickle.get(key)
        if pause is not None:
            import time

            try:
                for i in range(start, end):
                    h.wfile.write(data[i:i + 1])
                    h.wfile.flush()
                    req.sent += 1
                    time.sleep(pause)
            except OSError:  # the client gave up
                pass
            h.close_connection = True
            return
        cut = self.cut.get(key)
        if cut is not None:
            end = max(start, min(end, cut))
        h.wfile.write(data[start:end])
        h.wfile.flush()
        req.sent = end - start
        if end < len(data):
            h.close_connection = True

    def _error(self, h, status: int, code: str | None, message: str):
        h.send_response(status)
        h.send_header("X-Repo-Commit", COMMIT)
        if code:
            h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Length", "0")
        h.end_headers()

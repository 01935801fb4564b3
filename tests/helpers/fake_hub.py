"""A Hugging Face Hub on 127.0.0.1 serving the endpoints huggingface_hub 2.4.0's downloads use.

Endpoints (as huggingface_hub 2.4.0 calls them: ``hf_api.py`` ``model_info`` / ``list_repo_tree`` /
``auth_check``, ``file_download.py`` ``get_hf_file_metadata`` / ``http_get``):

* ``GET /api/models/REPO/revision/REV[?blobs=True]``: id, sha, siblings (sizes, blob ids, LFS sha256)
* ``GET /api/models/REPO/tree/REV?recursive=True``: the file list
* ``GET /api/models/REPO/auth-check``: 200, or the refusals below
* ``HEAD|GET /REPO/resolve/REV/FILE``: ``ETag`` (git blob id), ``X-Linked-Etag``/``X-Linked-Size`` for
  LFS files (sha256), ``X-Repo-Commit``, ``Content-Length``; ``Range: bytes=N-`` answers 206

Refusals as the Hub sends them (header ``X-Error-Code``, read by ``utils/_http.py`` ``hf_raise_for_status``):
an unknown token -> 401 ``X-Error-Message: Invalid credentials in Authorization header``; a gated repo
without a granted token -> 401 (no token) or 403 (token) ``GatedRepo``; an unknown repo -> 401 ``RepoNotFound``.

Faults: ``drop_after[path] = n`` sends ``n`` bytes of the file's next GET then closes the connection,
and answers 503 for that file until :meth:`FakeHub.heal`; ``stall_after[path] = n`` sends ``n`` bytes
then waits until :meth:`FakeHub.heal` (a download to be killed mid-file). ``served[path]`` counts body
bytes sent.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_THRESHOLD = 100_000  # bytes: larger files are LFS files (sha256 etag), as on the Hub


@dataclass
class FakeRepo:
    """A repository: ``files`` (path -> content), its commit, gated or not, and the tokens granted."""

    repo_id: str
    files: dict[str, bytes]
    gated: bool = False
    granted: set[str] = field(default_factory=set)
    commit: str = ""

    def __post_init__(self):
        self.commit = self.commit or hashlib.sha1(self.repo_id.encode() + b"".join(self.files.values())).hexdigest()

    def entry(self, path: str) -> dict:
        data = self.files[path]
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        lfs = (
            {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            if len(data) > LFS_THRESHOLD
            else None
        )
        return {"type": "file", "path": path, "size": len(data), "oid": blob, "lfs": lfs}


class FakeHub:
    """The server: ``FakeHub(repos, tokens)`` as a context manager; ``endpoint`` is its base URL."""

    def __init__(self, repos: list[FakeRepo], tokens: set[str] = frozenset()):
        self.repos = {r.repo_id: r for r in repos}
        self.tokens = set(tokens)
        self.served: Counter[str] = Counter()
        self.ranges: list[tuple[str, int]] = []  # (path, first byte) of every GET
        self.drop_after: dict[str, int] = {}
        self.broken: set[str] = set()
        self.stall_after: dict[str, int] = {}
        self.released = threading.Event()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def heal(self) -> None:
        """End every fault: files answer again."""
        self.broken.clear()
        self.drop_after.clear()
        self.stall_after.clear()
        self.released.set()

    def reset_counts(self) -> None:
        self.served.clear()
        self.ranges.clear()


def _handler(hub: FakeHub):
    api = re.compile(r"^/api/models/([^/]+/[^/]+)/(revision|tree)/([^/?]+)")
    auth = re.compile(r"^/api/models/([^/]+/[^/]+)/auth-check$")
    resolve = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
            headers = dict(headers or {})
            length = headers.pop("Content-Length", str(len(body)))
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", length)
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _json(self, obj) -> None:
            self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"})

        def _refusal(self, repo: FakeRepo | None, head: bool = False) -> bool:
            """Answer a refusal and return True, or return False when the request may proceed."""
            header = self.headers.get("Authorization", "")
            token = header.removeprefix("Bearer ") if header else None
            if token is not None and token not in hub.tokens:
                self._send(
                    401,
                    b'{"error":"Invalid credentials"}',
                    {"X-Error-Message": "Invalid credentials in Authorization header"},
                    head,
                )
                return True
            if repo is None:
                self._send(401, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"}, head)
                return True
            if repo.gated and token not in repo.granted:
                self._send(
                    401 if token is None else 403,
                    b'{"error":"gated"}',
                    {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to this model is restricted"},
                    head,
                )
                return True
            return False

        def do_HEAD(self) -> None:
            self._resolve(head=True)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if m := auth.match(path):
                if not self._refusal(hub.repos.get(m.group(1))):
                    self._json({})
                return
            if m := api.match(path):
                repo = hub.repos.get(m.group(1))
                if repo is None:
                    self._refusal(None)
                    return
                if m.group(3) not in ("main", repo.commit):
                    self._send(404, b"{}", {"X-Error-Code": "RevisionNotFound"})
                    return
                entries = [repo.entry(p) for p in sorted(repo.files)]
                if m.group(2) == "tree":
                    self._json(entries)
                else:
                    siblings = [
                        {
                            "rfilename": e["path"],
                            "size": e["size"],
                            "blobId": e["oid"],
                            "lfs": {"sha256": e["lfs"]["oid"], "size": e["size"], "pointerSize": 134}
                            if e["lfs"]
                            else None,
                        }
                        for e in entries
                    ]
                    self._json(
                        {
                            "id": repo.repo_id,
                            "sha": repo.commit,
                            "siblings": siblings,
                            "private": False,
                            "gated": "manual" if repo.gated else False,
                        }
                    )
                return
            self._resolve(head=False)

        def _resolve(self, head: bool) -> None:
            m = resolve.match(self.path.split("?")[0])
            if not m:
                self._send(404, b"not found", head=head)
                return
            repo = hub.repos.get(m.group(1))
            if self._refusal(repo, head):
                return
            name = m.group(3)
            if m.group(2) not in ("main", repo.commit) or name not in repo.files:
                self._send(404, b"{}", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit}, head)
                return
            data, entry = repo.files[name], repo.entry(name)
            headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes"}
            if entry["lfs"]:
                headers |= {"X-Linked-Etag": f'"{entry["lfs"]["oid"]}"', "X-Linked-Size": str(len(data))}
            if head:
                self._send(200, b"", headers | {"Content-Length": str(len(data))}, head=True)
                return
            if name in hub.broken:
                self._send(503, b"unavailable", {"X-Repo-Commit": repo.commit})
                return
            start = 0
            if rng := re.match(r"bytes=(\d+)-$", self.headers.get("Range", "")):
                start = int(rng.group(1))
            body = data[start:]
            with hub.lock:
                hub.ranges.append((name, start))
                drop = hub.drop_after.pop(name, None)
                stall = hub.stall_after.pop(name, None)
            status = 206 if start else 200
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if drop is not None:
                hub.broken.add(name)
                body = body[:drop]
            if stall is not None:
                self.wfile.write(body[:stall])
                self.wfile.flush()
                with hub.lock:
                    hub.served[name] += stall
                hub.released.wait(60)
                self.close_connection = True
                return
            self.wfile.write(body)
            with hub.lock:
                hub.served[name] += len(body)
            if drop is not None:
                self.wfile.flush()
                self.close_connection = True

    return Handler

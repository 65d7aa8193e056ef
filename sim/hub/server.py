#!/usr/bin/python3
"""A stand-in of the Hugging Face Hub API for the lab: what `hf download` (huggingface_hub 1.x) calls.

    server.py ROOT [--port 8081] [--rate BYTES_PER_S]

ROOT is what sim/hub/hub.py builds: repos/<org>/<name>.json (refs, commits, files, gated) and blobs/<sha256>.
Standard library only: the lab's mirror container runs it with its own python3. Endpoints and the
behaviours they copy from huggingface.co (huggingface_hub reads the same headers and error codes):

    GET  /api/models/{repo}/revision/{rev}[?blobs=true]   repo info: sha, siblings (sizes with blobs)
    GET  /api/models/{repo}/tree/{rev}[/{path}]            file listing: type, oid, size, path, lfs
    HEAD|GET /{repo}/resolve/{rev}/{path}                  small files: 200, ETag = git blob sha1;
                                                           LFS files: 302 to /_cdn/{sha256}, X-Linked-Etag
                                                           (the sha256) and X-Linked-Size; X-Repo-Commit
    HEAD|GET /_cdn/{sha256}                                the blob, Range requests answered with 206

Failures as the Hub answers them: a gated repo without a token -> 401 X-Error-Code: GatedRepo; a token
the Hub does not know -> 401 "Invalid credentials in Authorization header"; an unknown repo -> 401
RepoNotFound (the Hub does not tell a private repo from a missing one); a revision it does not have ->
404 RevisionNotFound "Invalid rev id"; a missing file -> 404 EntryNotFound; a range past the end -> 416.
Blob bodies are sent at --rate bytes per second (default 8 MiB/s), so a test can watch or stop a download;
--cut-after N drops every whole-file download after N bytes, as a flaky network does (hf resumes with Range).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
CHUNK = 64 * 1024


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class Hub:
    def __init__(self, root: Path, rate: int, cut_after: int = 0):
        self.root, self.rate, self.cut_after = root, rate, cut_after

    def tokens(self) -> set[str]:
        path = self.root / "tokens.json"
        return set(json.loads(path.read_text())) if path.exists() else set()

    def repo(self, repo_id: str, authorization: str | None) -> dict:
        path = self.root / "repos" / f"{repo_id}.json"
        token = None
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or hashlib.sha256(token.encode()).hexdigest() not in self.tokens():
                raise HubError(401, "Invalid credentials in Authorization header")
        if ".." in repo_id or repo_id.count("/") != 1 or not path.is_file():
            raise HubError(401, "Repository not found", "RepoNotFound")
        repo = json.loads(path.read_text())
        if repo.get("gated") and not token:
            raise HubError(401, f"Access to model {repo_id} is restricted. You must have access to it and be "
                                "authenticated to access it. Please log in.", "GatedRepo")
        return repo

    @staticmethod
    def commit(repo: dict, rev: str) -> tuple[str, dict]:
        sha = repo["refs"].get(rev, rev)
        if sha not in repo["commits"]:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return sha, repo["commits"][sha]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: Hub

    def log_message(self, fmt, *args):  # one line per request, never a header (tokens travel in them)
        sys.stderr.write(f"hub: {self.command} {self.path.split('?')[0]} -> {args[1] if len(args) > 1 else ''}\n")

    def do_HEAD(self):
        self.dispatch(body=False)

    def do_GET(self):
        self.dispatch(body=True)

    def send(self, status: int, headers: dict, payload: bytes = b"", body: bool = True):
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, str(value))
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body and payload:
            self.wfile.write(payload)

    def dispatch(self, body: bool):
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        query = urllib.parse.parse_qs(url.query)
        try:
            if path.startswith("/api/models/"):
                self.api(path[len("/api/models/"):], query, body)
            elif path.startswith("/_cdn/"):
                self.blob(path[len("/_cdn/"):], {}, body)
            elif "/resolve/" in path:
                self.resolve(path.lstrip("/"), body)
            else:
                raise HubError(404, "Not Found")
        except HubError as exc:
            headers = {"X-Error-Message": exc.message, "Content-Type": "application/json"}
            if exc.code:
                headers["X-Error-Code"] = exc.code
            self.send(exc.status, headers, json.dumps({"error": exc.message}).encode(), body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def api(self, rest: str, query: dict, body: bool):
        match = re.match(r"^([^/]+/[^/]+)/(revision|tree)/([^/]+)(?:/(.*))?$", rest)
        if not match:
            raise HubError(404, "Not Found")
        repo_id, kind, rev, sub = match.groups()
        repo = self.hub.repo(repo_id, self.headers.get("Authorization"))
        sha, commit = self.hub.commit(repo, rev)
        files = commit["files"]
        if kind == "revision":
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings = [dict({"rfilename": name}, **(self.entry(name, f, with_path=False) if blobs else {}))
                        for name, f in sorted(files.items())]
            info = {"_id": sha[:24], "id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
                    "gated": "manual" if repo.get("gated") else False, "disabled": False, "tags": [],
                    "siblings": siblings}
        else:
            prefix = f"{sub.rstrip('/')}/" if sub else ""
            info = [self.entry(name, f) for name, f in sorted(files.items()) if name.startswith(prefix)]
        self.send(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), body)

    @staticmethod
    def entry(name: str, f: dict, with_path: bool = True) -> dict:
        out = {"type": "file", "oid": f["oid"], "size": f["size"], "path": name} if with_path else \
              {"size": f["size"], "blobId": f["oid"]}
        if f.get("lfs"):
            out["lfs"] = {"oid" if with_path else "sha256": f["sha256"], "size": f["size"], "pointerSize": 134}
        return out

    def resolve(self, rest: str, body: bool):
        match = re.match(r"^([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", rest)
        if not match:
            raise HubError(404, "Not Found")
        repo_id, rev, name = match.groups()
        repo = self.hub.repo(repo_id, self.headers.get("Authorization"))
        sha, commit = self.hub.commit(repo, rev)
        f = commit["files"].get(name)
        if f is None:
            raise HubError(404, f"Entry not found: {name}", "EntryNotFound")
        headers = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        if f.get("lfs"):
            headers.update({"Location": f"http://{self.cdn_host()}/_cdn/{f['sha256']}",
                            "X-Linked-Etag": f'"{f["sha256"]}"', "X-Linked-Size": f["size"], "ETag": f'"{f["oid"]}"'})
            self.send(302, headers, b"", body)
            return
        headers["ETag"] = f'"{f["oid"]}"'
        self.blob(f["sha256"], headers, body)

    def cdn_host(self) -> str:
        """The Hub sends LFS files from a CDN host, which hf does not follow a HEAD to (nor send the token
        to): here the same server under another name, its IP address, or localhost when asked by IP."""
        ip, port = self.connection.getsockname()[:2]
        asked = urllib.parse.urlsplit(f"http://{self.headers.get('Host', '')}").hostname or ""
        return f"{'localhost' if asked == ip else ip}:{port}"

    def blob(self, sha256: str, headers: dict, body: bool):
        if not re.fullmatch(r"[0-9a-f]{64}", sha256) or not (self.hub.root / "blobs" / sha256).is_file():
            raise HubError(404, "Not Found")
        path = self.hub.root / "blobs" / sha256
        size = path.stat().st_size
        start, end, status = 0, size - 1, 200
        wanted = self.headers.get("Range")
        if wanted:
            match = RANGE.match(wanted.strip())
            if not match or int(match.group(1)) >= size:
                raise HubError(416, f"Range Not Satisfiable: {wanted} of {size} bytes")
            start = int(match.group(1))
            end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        headers.setdefault("ETag", f'"{sha256}"')
        self.send_response(status)
        for key, value in dict(headers, **{"Content-Type": "application/octet-stream"}).items():
            self.send_header(key, str(value))
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if not body:
            return
        # --cut-after: a whole-file GET loses its connection after that many bytes (a flaky network).
        cut = self.hub.cut_after if self.hub.cut_after and status == 200 else 0
        with path.open("rb") as handle:
            handle.seek(start)
            left, began, sent = end - start + 1, time.monotonic(), 0
            while left > 0:
                if cut and sent >= cut:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                chunk = handle.read(min(CHUNK, left))
                self.wfile.write(chunk)
                left -= len(chunk)
                sent += len(chunk)
                if self.hub.rate:
                    ahead = sent / self.hub.rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--rate", type=int, default=8 * 1024 * 1024, help="blob bytes per second (0: unlimited)")
    parser.add_argument("--cut-after", type=int, default=0, help="drop whole-file downloads after N bytes")
    args = parser.parse_args()
    if not (args.root / "repos").is_dir():
        sys.exit(f"hub: {args.root} holds no repos/: build it first with sim/hub/hub.py build")
    Handler.hub = Hub(args.root, args.rate, args.cut_after)
    server = ThreadingHTTPServer((args.bind, args.port), Handler)
    server.daemon_threads = True
    print(f"hub: serving {args.root} on {args.bind}:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

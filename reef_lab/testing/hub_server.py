"""A Hugging Face Hub-compatible server on loopback, so release publishing can be tested with the real client.

reef_lab publishes each model release as a revision of a Hub repo through the real `huggingface_hub` client
(`HfApi`, `hf_hub_download`, `snapshot_download`, the `hf` CLI). Nothing here reaches huggingface.co and no
server that accepts pushes can be installed, so this module speaks the part of the Hub's HTTP protocol that
`huggingface_hub` 2.4 uses for models and datasets: create/delete repos, repo info, preupload, ndjson commits
(with `parentCommit` compare-and-swap), branches, tags, refs, commit history, trees, paths-info, whoami and
`resolve` downloads (with Range). Every file is answered `uploadMode: "regular"`, so no LFS or Xet transfer is
ever needed; `lfsFile` operations are accepted only for blobs the server already holds (server-side copies).

Storage under `root` survives restarts: `blobs/<sha256>` (content-addressed bytes) and, per repo,
`repos/<models|datasets>/<owner>/<name>/repo.json` (branches, tags, metadata) plus `commits/<oid>.json` (parent,
message, author, date and the full tree path -> sha256/size/git oid). JSON files are replaced atomically and
every mutation runs under one lock. Refs move only when a commit lands on a branch or a ref is created/deleted.
With a token, every request needs `Authorization: Bearer <token>` (else 401, worded as the Hub words it), except
`GET /api/agent-harnesses`, a public registry the client fetches without one (also exempt from fail_next).
A stale `parentCommit` gets 412, as huggingface.co answers (not 409).

Tests: `server, url = serve_in_thread(tmp_path, token="t")`, then `HfApi(endpoint=url, token="t")` (with
`huggingface_hub.constants.HF_HUB_OFFLINE` False: its offline flag blocks every request, not only downloads);
`server.fail_next(2, status=503)` makes the next two requests fail (`match="POST /api/models/o/n/commit"`
narrows it to requests whose "METHOD /path" contains that text); `server.stop()` then
`serve_in_thread(same_root, token, port=server.port)` restarts it on the same port. Alone:
`python -m reef_lab.testing.hub_server --root DIR --port 8000 [--token T]`, then e.g.
`HF_ENDPOINT=http://127.0.0.1:8000 HF_HUB_DISABLE_XET=1 hf download owner/name --revision v1`.

Not supported: pull requests (`create_pr`), spaces, LFS/Xet uploads, `.gitignore` rules (`shouldIgnore` is
always false), `expand` metadata (last commit, security) in trees, pagination (one page holds everything).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import uuid
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote

from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

log = logging.getLogger(__name__)

KINDS = {"models": "model", "datasets": "dataset"}
PARENT_MISMATCH_STATUS = 412  # what huggingface.co answers when `parentCommit` is no longer the branch head
INVALID_TOKEN = "Invalid credentials in Authorization header"  # the Hub's text; the client keys on it
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n"


class HubError(Exception):
    """An HTTP error answered the way the Hub does: JSON `{"error": ...}` plus X-Error-Code/-Message headers."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None, **extra):
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra
        self.headers = headers or {}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _clean_path(path: str) -> str:
    parts = path.strip("/").split("/")
    if not path.strip("/") or any(p in ("", ".", "..") for p in parts):
        raise HubError(400, f"invalid path in repo: {path!r}")
    return "/".join(parts)


class Store:
    """Blobs, repos, commits and refs on disk; all mutations hold `lock`."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.lock = threading.RLock()
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)

    def _dir(self, kind: str, repo_id: str) -> Path:
        return self.root / "repos" / f"{kind}s" / repo_id

    def put_blob(self, data: bytes) -> dict:
        sha = hashlib.sha256(data).hexdigest()
        path = self.root / "blobs" / sha
        if not path.exists():
            tmp = path.with_name(f".{sha}.{uuid.uuid4().hex}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return {"sha256": sha, "size": len(data), "oid": _git_oid(data)}

    def blob(self, sha: str) -> bytes:
        return (self.root / "blobs" / sha).read_bytes()

    def has_blob(self, sha: str) -> bool:
        return bool(re.fullmatch(r"[0-9a-f]{64}", sha)) and (self.root / "blobs" / sha).is_file()

    def repo(self, kind: str, repo_id: str) -> dict:
        path = self._dir(kind, repo_id) / "repo.json"
        if not path.is_file():
            raise HubError(404, f"{kind} repo {repo_id} not found", "RepoNotFound")
        return json.loads(path.read_text())

    def save_repo(self, meta: dict) -> None:
        _write_json(self._dir(meta["type"], meta["id"]) / "repo.json", meta)

    def create_repo(self, kind: str, repo_id: str, private: bool, author: str) -> bool:
        with self.lock:
            if (self._dir(kind, repo_id) / "repo.json").is_file():
                return False
            now = _now()
            meta = {"id": repo_id, "type": kind, "private": private, "createdAt": now, "branches": {}, "tags": {}}
            tree = {".gitattributes": self.put_blob(_GITATTRIBUTES)}
            meta["branches"]["main"] = self.write_commit(meta, None, tree, "initial commit", "", author)
            self.save_repo(meta)
            return True

    def delete_repo(self, kind: str, repo_id: str) -> None:
        with self.lock:
            self.repo(kind, repo_id)
            shutil.rmtree(self._dir(kind, repo_id))

    def commit(self, meta: dict, oid: str) -> dict:
        path = self._dir(meta["type"], meta["id"]) / "commits" / f"{oid}.json"
        if not path.is_file():
            raise HubError(404, f"commit {oid} not found in {meta['id']}", "RevisionNotFound")
        return json.loads(path.read_text())

    def write_commit(self, meta: dict, parent: str | None, tree: dict, title: str, description: str,
                     author: str) -> str:
        body = {"parent": parent, "tree": tree, "title": title, "description": description, "author": author,
                "date": _now(), "nonce": uuid.uuid4().hex}
        oid = hashlib.sha1(json.dumps(body, sort_keys=True).encode()).hexdigest()
        _write_json(self._dir(meta["type"], meta["id"]) / "commits" / f"{oid}.json", {"id": oid, **body})
        meta["lastModified"] = body["date"]
        return oid

    def resolve(self, meta: dict, revision: str) -> dict:
        """A branch, a tag (also as refs/heads/x, refs/tags/x) or a full commit id -> that commit."""
        for prefix, refs in (("refs/heads/", meta["branches"]), ("refs/tags/", meta["tags"])):
            name = revision.removeprefix(prefix)
            if name in refs and (name == revision or revision.startswith(prefix)):
                return self.commit(meta, refs[name])
        if _HEX40.match(revision):
            return self.commit(meta, revision)
        raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def history(self, meta: dict, commit: dict) -> list[dict]:
        out = [commit]
        while out[-1]["parent"]:
            out.append(self.commit(meta, out[-1]["parent"]))
        return out


def _apply(store: Store, tree: dict, key: str, value: dict) -> None:
    """One ndjson operation of a commit, applied to `tree` in place."""
    path = _clean_path(str(value.get("path", "")))
    if key == "file":
        raw = value.get("content", "")
        data = base64.b64decode(raw) if value.get("encoding") == "base64" else str(raw).encode()
        tree[path] = store.put_blob(data)
    elif key == "lfsFile":
        sha = str(value.get("oid", ""))
        if not store.has_blob(sha):
            raise HubError(400, f"LFS object {sha} for {path} was never uploaded (this server takes regular "
                                "uploads only; it answers uploadMode 'regular')")
        tree[path] = store.put_blob(store.blob(sha))
    elif key == "deletedFile":
        if tree.pop(path, None) is None:
            raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
    elif key == "deletedFolder":
        doomed = [p for p in tree if p.startswith(path + "/")]
        if not doomed:
            raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
        for p in doomed:
            del tree[p]
    else:
        raise HubError(400, f"unsupported commit operation {key!r} (expected file, lfsFile, deletedFile or "
                            "deletedFolder)")


def _tree_entries(tree: dict, paths) -> list[dict]:
    """Tree/paths-info entries (files and directories) for `paths`, in the Hub's JSON shape."""
    out = []
    for p in paths:
        if p in tree:
            out.append({"type": "file", "path": p, "oid": tree[p]["oid"], "size": tree[p]["size"]})
        else:
            inner = sorted(f"{f} {e['oid']}" for f, e in tree.items() if f.startswith(p + "/"))
            if inner:
                oid = hashlib.sha1("\n".join(inner).encode()).hexdigest()
                out.append({"type": "directory", "path": p, "oid": oid, "size": 0})
    return out


def _dirs(tree: dict) -> set[str]:
    return {"/".join(f.split("/")[:i]) for f in tree for i in range(1, f.count("/") + 1)}


class HubApp:
    """The WSGI app. `token`: required bearer token (None accepts anyone); `user`: the account it serves."""

    def __init__(self, root: Path, token: str | None = None, user: str = "reef"):
        self.store = Store(root)
        self.token, self.user = token, user
        self.requests: list[tuple[str, str, int]] = []  # (method, raw path, status), for tests
        self._fail_lock = threading.Lock()
        self._fail_left, self._fail_status, self._fail_match = 0, 503, ""

    def fail_next(self, n: int = 1, status: int = 503, match: str = "") -> None:
        """The next `n` requests whose "METHOD /raw/path" contains `match` answer `status`, touching nothing."""
        with self._fail_lock:
            self._fail_left, self._fail_status, self._fail_match = n, status, match

    def _injected_failure(self, method: str, raw: str) -> int | None:
        with self._fail_lock:
            if self._fail_left <= 0 or self._fail_match not in f"{method} {raw}":
                return None
            self._fail_left -= 1
            return self._fail_status

    def __call__(self, environ, start_response):
        req = Request(environ)
        raw = (environ.get("RAW_URI") or environ.get("REQUEST_URI") or req.path).split("?", 1)[0]
        if raw == "/api/agent-harnesses":  # public telemetry registry the CLI fetches without a token
            return _json({"standardEnvVars": [], "harnesses": {}})(environ, start_response)
        try:
            if (status := self._injected_failure(req.method, raw)) is not None:
                raise HubError(status, f"injected failure ({status}) by fail_next()")
            self._check_auth(req)
            resp = self._route(req, [unquote(s) for s in raw.split("/")[1:]])
        except HubError as e:
            resp = Response(json.dumps({"error": e.message, **e.extra}), e.status, mimetype="application/json")
            resp.headers["X-Error-Message"] = e.message.replace("\n", " ").encode("ascii", "replace").decode()
            if e.code:
                resp.headers["X-Error-Code"] = e.code
            resp.headers.update(e.headers)
        except Exception as e:  # a bug in this server: say so to the client instead of dropping the connection
            log.exception("hub server failed on %s %s", req.method, raw)
            resp = Response(json.dumps({"error": f"hub server bug: {e!r}"}), 500, mimetype="application/json")
        self.requests.append((req.method, raw, resp.status_code))
        if resp.status_code == 404 and "X-Error-Code" not in resp.headers:
            log.warning("hub server has no route for %s %s", req.method, raw)
        return resp(environ, start_response)

    def _check_auth(self, req: Request) -> None:
        if self.token is not None and req.headers.get("Authorization") != f"Bearer {self.token}":
            raise HubError(401, INVALID_TOKEN)

    def _route(self, req: Request, seg: list[str]) -> Response:
        while len(seg) > 1 and seg[-1] == "":
            seg = seg[:-1]
        m = req.method
        if seg[:1] == ["api"]:
            rest = seg[1:]
            if rest == ["whoami-v2"] and m == "GET":
                return self._whoami(req)
            if rest == ["repos", "create"] and m == "POST":
                return self._create_repo(req)
            if rest == ["repos", "delete"] and m == "DELETE":
                return self._delete_repo(req)
            if rest == ["validate-yaml"] and m == "POST":
                return _json({"errors": [], "warnings": []})
            if len(rest) >= 3 and rest[0] in KINDS:
                return self._repo_api(req, KINDS[rest[0]], f"{rest[1]}/{rest[2]}", rest[3:])
        else:
            kind = "dataset" if seg[:1] == ["datasets"] else "model"
            seg = seg[1:] if kind == "dataset" else seg
            if len(seg) >= 5 and seg[2] == "resolve" and m in ("GET", "HEAD"):
                return self._resolve(req, kind, f"{seg[0]}/{seg[1]}", seg[3], "/".join(seg[4:]))
        raise HubError(404, f"no such route on this hub server: {m} {req.path}")

    def _repo_api(self, req: Request, kind: str, repo_id: str, rest: list[str]) -> Response:
        action, args = (rest[0], rest[1:]) if rest else ("", [])
        handler = {("GET", ""): self._info, ("GET", "revision"): self._info, ("POST", "preupload"): self._preupload,
                   ("POST", "commit"): self._commit, ("POST", "tag"): self._create_tag,
                   ("DELETE", "tag"): self._delete_tag, ("POST", "branch"): self._create_branch,
                   ("DELETE", "branch"): self._delete_branch, ("GET", "refs"): self._refs,
                   ("GET", "commits"): self._commits, ("GET", "tree"): self._tree,
                   ("POST", "paths-info"): self._paths_info}.get((req.method, action))
        if handler is None or (action not in ("", "refs") and not args):
            raise HubError(404, f"no such route on this hub server: {req.method} {req.path}")
        return handler(req, self.store.repo(kind, repo_id), args)

    def _url(self, req: Request, meta: dict) -> str:
        prefix = "datasets/" if meta["type"] == "dataset" else ""
        return f"{req.host_url}{prefix}{meta['id']}"

    # --- account and repos -------------------------------------------------------------------------------
    def _whoami(self, req: Request) -> Response:
        if not req.headers.get("Authorization", "").startswith("Bearer "):
            raise HubError(401, INVALID_TOKEN)
        return _json({"type": "user", "id": self.user, "name": self.user, "fullname": self.user, "orgs": [],
                      "auth": {"type": "access_token", "accessToken": {"displayName": "hub_server", "role": "write"}}})

    def _repo_args(self, req: Request) -> tuple[str, str]:
        body = req.get_json(silent=True) or {}
        kind, name, org = body.get("type") or "model", str(body.get("name") or ""), body.get("organization")
        if kind not in KINDS.values():
            raise HubError(400, f"repo type {kind!r} is not supported here (model or dataset)")
        owner = org or self.user
        if not (_NAME.match(name) and _NAME.match(owner)):
            raise HubError(400, f"invalid repo name {owner}/{name}")
        return kind, f"{owner}/{name}"

    def _create_repo(self, req: Request) -> Response:
        kind, repo_id = self._repo_args(req)
        body = req.get_json(silent=True) or {}
        private = bool(body.get("private")) or body.get("visibility") == "private"
        created = self.store.create_repo(kind, repo_id, private, self.user)
        url = self._url(req, {"type": kind, "id": repo_id})
        if not created:
            raise HubError(409, f"You already created this {kind} repo", url=url)
        return _json({"url": url, "name": repo_id})

    def _delete_repo(self, req: Request) -> Response:
        self.store.delete_repo(*self._repo_args(req))
        return _json({})

    # --- reads ---------------------------------------------------------------------------------------------
    def _info(self, req: Request, meta: dict, args: list[str]) -> Response:
        commit = self.store.resolve(meta, args[0] if args else "main")
        blobs = req.args.get("blobs", "").lower() in ("1", "true")
        siblings = [{"rfilename": p, **({"size": e["size"], "blobId": e["oid"]} if blobs else {})}
                    for p, e in sorted(commit["tree"].items())]
        owner = meta["id"].split("/")[0]
        info = {"id": meta["id"], "_id": meta["id"], "author": owner, "sha": commit["id"], "private": meta["private"],
                "gated": False, "disabled": False, "createdAt": meta["createdAt"], "lastModified": commit["date"],
                "downloads": 0, "likes": 0, "tags": [], "siblings": siblings}
        if meta["type"] == "model":
            info["modelId"] = meta["id"]
        return _json(info)

    def _refs(self, req: Request, meta: dict, args: list[str]) -> Response:
        def refs(kind: str, names: dict) -> list[dict]:
            return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": oid} for n, oid in sorted(names.items())]
        out = {"branches": refs("heads", meta["branches"]), "converts": [], "tags": refs("tags", meta["tags"])}
        if req.args.get("include_prs"):
            out["pullRequests"] = []
        return _json(out)

    def _commits(self, req: Request, meta: dict, args: list[str]) -> Response:
        formatted = req.args.get("expand[]") == "formatted"
        items = []
        for c in self.store.history(meta, self.store.resolve(meta, args[0])):
            message = c["title"] + (f"\n\n{c['description']}" if c["description"] else "")
            item = {"id": c["id"], "title": c["title"], "message": message, "date": c["date"],
                    "authors": [{"user": c["author"], "avatar": None}]}
            if formatted:
                item["formatted"] = {"title": c["title"], "message": message}
            items.append(item)
        return _json(items)

    def _tree(self, req: Request, meta: dict, args: list[str]) -> Response:
        tree = self.store.resolve(meta, args[0])["tree"]
        base = "/".join(args[1:]).strip("/")
        dirs = _dirs(tree)
        if base and base not in dirs:
            raise HubError(404, f"{base} is not a folder at revision {args[0]}", "EntryNotFound")
        prefix = f"{base}/" if base else ""
        recursive = req.args.get("recursive", "").lower() in ("1", "true")
        paths = [p for p in sorted(set(tree) | dirs) if p.startswith(prefix)
                 and (recursive or "/" not in p[len(prefix):])]
        return _json(_tree_entries(tree, paths))

    def _paths_info(self, req: Request, meta: dict, args: list[str]) -> Response:
        tree = self.store.resolve(meta, args[0])["tree"]
        paths = req.form.getlist("paths") or (req.get_json(silent=True) or {}).get("paths", [])
        return _json(_tree_entries(tree, [p.strip("/") for p in paths]))

    def _resolve(self, req: Request, kind: str, repo_id: str, revision: str, path: str) -> Response:
        meta = self.store.repo(kind, repo_id)
        commit = self.store.resolve(meta, revision)
        entry = commit["tree"].get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path} at {revision}", "EntryNotFound",
                           headers={"X-Repo-Commit": commit["id"]})
        resp = Response(self.store.blob(entry["sha256"]), mimetype="application/octet-stream")
        resp.headers.update({"X-Repo-Commit": commit["id"], "ETag": f'"{entry["oid"]}"'})
        resp = resp.make_conditional(req, accept_ranges=True, complete_length=entry["size"])  # Range -> 206
        del resp.headers["Date"]  # the server adds its own
        return resp

    # --- writes --------------------------------------------------------------------------------------------
    def _preupload(self, req: Request, meta: dict, args: list[str]) -> Response:
        commit = self.store.resolve(meta, args[0])
        files = (req.get_json(silent=True) or {}).get("files")
        if not isinstance(files, list):
            raise HubError(400, "preupload body must be JSON {'files': [{'path', 'size', 'sample'}]}")
        out = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                "oid": commit["tree"].get(f["path"], {}).get("oid")} for f in files]
        return _json({"files": out, "commitOid": commit["id"]})

    def _branch_name(self, meta: dict, revision: str) -> str:
        branch = revision.removeprefix("refs/heads/")
        if branch not in meta["branches"]:
            self.store.resolve(meta, revision)  # 404 if it is nothing at all
            raise HubError(400, f"cannot commit to {revision!r}: commits go on a branch, not a tag or commit id")
        return branch

    def _commit(self, req: Request, meta: dict, args: list[str]) -> Response:
        if req.args.get("create_pr"):
            raise HubError(400, "pull requests are not supported by this hub server (use create_pr=False)")
        try:
            lines = [json.loads(line) for line in req.get_data().splitlines() if line.strip()]
        except ValueError as e:
            raise HubError(400, f"commit body is not ndjson: {e}") from e
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "commit body must start with a {'key': 'header'} line")
        header = lines[0].get("value") or {}
        with self.store.lock:
            meta = self.store.repo(meta["type"], meta["id"])  # re-read under the lock
            branch = self._branch_name(meta, args[0])
            head = meta["branches"][branch]
            parent = header.get("parentCommit")
            if parent and not head.startswith(str(parent).lower()):
                raise HubError(PARENT_MISMATCH_STATUS, f"A commit has happened since: {branch} is at {head}, "
                                                       f"not at parentCommit {parent}. Please refresh and retry.")
            tree = dict(self.store.commit(meta, head)["tree"])
            for line in lines[1:]:
                _apply(self.store, tree, line.get("key"), line.get("value") or {})
            oid = self.store.write_commit(meta, head, tree, str(header.get("summary") or "commit"),
                                          str(header.get("description") or ""), self.user)
            meta["branches"][branch] = oid
            self.store.save_repo(meta)
        return _json({"success": True, "commitOid": oid, "commitUrl": f"{self._url(req, meta)}/commit/{oid}",
                      "pullRequestUrl": None})

    def _create_tag(self, req: Request, meta: dict, args: list[str]) -> Response:
        tag = str((req.get_json(silent=True) or {}).get("tag") or "")
        if not tag or ".." in tag or tag.startswith(("/", "refs/")) or " " in tag:
            raise HubError(400, f"invalid tag name {tag!r}")
        with self.store.lock:
            meta = self.store.repo(meta["type"], meta["id"])
            target = self.store.resolve(meta, args[0])["id"]
            if tag in meta["tags"]:
                raise HubError(409, f"Tag {tag} already exists (at {meta['tags'][tag]}); tags never move")
            meta["tags"][tag] = target
            self.store.save_repo(meta)
        return _json({"name": tag, "targetCommit": target})

    def _delete_tag(self, req: Request, meta: dict, args: list[str]) -> Response:
        return self._delete_ref(meta, "tags", args[0])

    def _create_branch(self, req: Request, meta: dict, args: list[str]) -> Response:
        branch, body = args[0], req.get_json(silent=True) or {}
        if not branch or ".." in branch or branch.startswith(("/", "refs/")) or " " in branch:
            raise HubError(400, f"invalid branch name {branch!r}")
        with self.store.lock:
            meta = self.store.repo(meta["type"], meta["id"])
            if branch in meta["branches"]:
                raise HubError(409, f"Branch {branch} already exists")
            meta["branches"][branch] = self.store.resolve(meta, body.get("startingPoint") or "main")["id"]
            self.store.save_repo(meta)
        return _json({"name": branch, "targetCommit": meta["branches"][branch]})

    def _delete_branch(self, req: Request, meta: dict, args: list[str]) -> Response:
        if args[0] == "main":
            raise HubError(403, "cannot delete the default branch main")
        return self._delete_ref(meta, "branches", args[0])

    def _delete_ref(self, meta: dict, kind: str, name: str) -> Response:
        with self.store.lock:
            meta = self.store.repo(meta["type"], meta["id"])
            if meta[kind].pop(name, None) is None:
                raise HubError(404, f"no {'tag' if kind == 'tags' else 'branch'} named {name}", "RevisionNotFound")
            self.store.save_repo(meta)
        return _json({})


def _json(obj) -> Response:
    return Response(json.dumps(obj), mimetype="application/json")


class HubServer:
    """A HubApp served by werkzeug on a daemon thread: `url`, `port`, `app`, `fail_next()`, `stop()`.

    werkzeug's server closes every connection after one response (no keep-alive), so once `stop()` returns
    nothing answers on the port until a new server binds it."""

    def __init__(self, app: HubApp, host: str = "127.0.0.1", port: int = 0):
        self.app = app
        self._srv = make_server(host, port, app, threaded=True)
        self.port = self._srv.server_port
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._srv.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)  # stop() waits for one poll
        self._thread.start()

    def fail_next(self, n: int = 1, status: int = 503, match: str = "") -> None:
        self.app.fail_next(n, status, match)

    def stop(self) -> None:
        """Stop serving and free the port (a new server may bind it at once)."""
        self._srv.shutdown()
        self._srv.server_close()
        self._thread.join(timeout=5)

    shutdown = stop  # same verb as the stub provider's werkzeug server


def serve_in_thread(root: Path, token: str | None = None, port: int = 0, user: str = "reef") -> tuple[HubServer, str]:
    """Serve the repos under `root` on 127.0.0.1 (for tests); returns (server, base_url). Reuse `port` to restart."""
    server = HubServer(HubApp(root, token, user), port=port)
    return server, server.url


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, required=True, help="folder holding blobs and repos (created if missing)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' on every request")
    ap.add_argument("--user", default="reef", help="the account name whoami answers and commits carry")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    srv = make_server(a.host, a.port, HubApp(a.root, a.token, a.user), threaded=True)
    print(f"hub server on http://{a.host}:{srv.server_port} (root {a.root})", flush=True)
    srv.serve_forever()

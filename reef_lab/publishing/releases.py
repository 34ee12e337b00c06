"""Releases: the versions of a scenario's trained weights, with their lineage, candidates and the serving pointer.

Layout under the data dir:

    releases/<scenario>/index.json        {"serving": "v2" | null, "releases": [...], "candidates": [...]}
    releases/<scenario>/candidates/c3/    a checkpoint folder (safetensors + config + tokenizer + metadata)
    releases/<scenario>/v2/               an accepted candidate, renamed into place

A candidate is what a recipe produced; the selection policy accepts it (it becomes release vN+1 and serves) or
rejects it (kept for inspection, never served). Rollback points `serving` at an older release; versions never
change once made. The index is replaced atomically (write, fsync, rename) on every change. Release ids on the wire
are `<scenario>:vN` (unique across scenarios, so records name them unambiguously); the base weights are `base`.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import orjson

from reef_lab.errors import BadRequest, NotFound
from reef_lab.files import write_json

BASE = "base"


def release_key(scenario: str, version: str) -> str:
    return f"{scenario}:{version}"


class ReleaseStore:
    """A deployment's releases. Folders under `root` (`<data dir>/releases`, or the shared `--artifacts` folder that
    every service of a shared deployment mounts at the same path); each scenario's index in its `index.json`, or with
    a shared `state` (reef_lab/state/postgres.py) as a `releases` document there, revised on every write: a write
    from a stale read is refused (Conflict), every service hears of it (`release` notices), and `fence(scenario)`
    (a lease name and epoch, or None) makes a learner that lost its lease unable to write."""

    def __init__(self, data_dir: str | Path, state=None, root: str | Path | None = None, fence=None,
                 remote: str | None = None):
        """`remote`: an fsspec URL (s3://bucket/prefix, gs://..., file:///...) the releases are stored in; `root`
        is then this machine's copy of the ones it has used, fetched when first served (an object store)."""
        self.root = Path(root) if root is not None else Path(data_dir) / "releases"
        self._lock = threading.RLock()
        self._state, self._fence = state, fence
        self._revs: dict[str, int] = {}  # scenario -> the revision of the index this process read last
        self._remote = remote.rstrip("/") if remote else None
        self._fs = None

    def folder(self, scenario: str) -> Path:
        return self.root / scenario

    def _index_path(self, scenario: str) -> Path:
        return self.folder(scenario) / "index.json"

    def index(self, scenario: str) -> dict:
        if self._state is not None:
            body, rev = self._state.read_doc("release", scenario)
            with self._lock:
                self._revs[scenario] = rev
            if body is not None and self._remote is not None:
                body["releases"] = [self._paths(r, self._local) for r in body["releases"]]
            return body if body is not None else _empty()
        p = self._index_path(scenario)
        if not p.exists():
            return _empty()
        return orjson.loads(p.read_bytes())

    def _save(self, scenario: str, index: dict) -> None:
        """Lock held, after this process's read of the index (index())."""
        if self._state is not None:
            if self._remote is not None:  # folders relative to the root: every machine has its own copy of it
                index = {**index, "releases": [self._paths(r, self._key) for r in index["releases"]]}
            fence = self._fence(scenario) if self._fence is not None else None
            self._revs[scenario] = self._state.write_doc("release", scenario, index, self._revs.get(scenario, 0),
                                                         fence)
            return
        p = self._index_path(scenario)
        p.parent.mkdir(parents=True, exist_ok=True)
        write_json(p, index, indent=True)

    def serving(self, scenario: str) -> dict | None:
        """The serving release's entry (None: the base weights serve); its files are on this machine."""
        idx = self.index(scenario)
        return self._fetched(next((r for r in idx["releases"] if r["version"] == idx["serving"]), None))

    def release(self, scenario: str, release_id: str) -> dict | None:
        """A release by `vN`, `<scenario>:vN` or `base` (None for base); its files are on this machine."""
        if release_id == BASE:
            return None
        version = release_id.split(":", 1)[1] if release_id.startswith(scenario + ":") else release_id
        for r in self.index(scenario)["releases"]:
            if r["version"] == version:
                return self._fetched(r)
        raise NotFound(f"scenario {scenario!r} has no release {release_id!r}")

    # ---- releases in an object store (remote): stored there, fetched here when served -------------------------
    def _store_fs(self):
        if self._fs is None:
            from fsspec.core import url_to_fs

            self._fs, self._base = url_to_fs(self._remote)
        return self._fs

    def _key(self, folder: str) -> str:
        """A release folder as the index of a remote store keeps it: relative to the root (any machine's)."""
        p = Path(folder)
        return p.relative_to(self.root).as_posix() if p.is_absolute() and p.is_relative_to(self.root) else folder

    def _local(self, folder: str) -> str:
        return folder if Path(folder).is_absolute() else str(self.root / folder)

    def _paths(self, entry: dict, how) -> dict:
        entry = dict(entry)
        if entry.get("folder"):
            entry["folder"] = how(entry["folder"])
        if entry.get("folders"):
            entry["folders"] = {c: how(f) if f else f for c, f in entry["folders"].items()}
        return entry

    def _fetched(self, entry: dict | None) -> dict | None:
        """With a remote store: the entry's release folders (and those of the components it names) copied here
        first if missing, atomically (a partial copy is never taken for a release)."""
        if entry is None or self._remote is None:
            return entry
        for folder in [entry.get("folder"), *(entry.get("folders") or {}).values()]:
            if not folder:
                continue
            key = "/".join(Path(self._key(folder)).parts[:2])  # <scenario>/<version>: one release's folder
            target = self.root / key
            if target.exists():
                continue
            fs = self._store_fs()
            tmp = target.with_name(f".fetch-{target.name}-{os.getpid()}-{threading.get_ident()}")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.parent.mkdir(parents=True, exist_ok=True)
            fs.get(f"{self._base}/{key}/", str(tmp) + "/", recursive=True)
            try:
                os.replace(tmp, target)
            except OSError:  # fetched meanwhile by another thread of this machine
                shutil.rmtree(tmp, ignore_errors=True)
        return entry

    def _ship(self, folder: Path) -> None:
        """Copy a new release folder to the remote store (before the index names it)."""
        if self._remote is None:
            return
        fs = self._store_fs()
        fs.put(str(folder) + "/", f"{self._base}/{self._key(str(folder))}/", recursive=True)

    def new_candidate(self, scenario: str, meta: dict) -> tuple[str, Path]:
        with self._lock:
            idx = self.index(scenario)
            cid = f"c{len(idx['candidates']) + 1}"
            folder = self.folder(scenario) / "candidates" / cid
            if folder.exists():
                shutil.rmtree(folder)  # left by a crash before its index entry was written
            idx["candidates"].append({"id": cid, "status": "training", "created_at": time.time(), **meta})
            self._save(scenario, idx)
            return cid, folder

    def _update(self, scenario: str, table: str, key: str, value: str, fields: dict) -> dict:
        """Update the entry of `table` (candidates or releases) whose `key` is `value`; NotFound if none."""
        with self._lock:
            idx = self.index(scenario)
            entry = next((e for e in idx[table] if e[key] == value), None)
            if entry is None:
                raise NotFound(f"scenario {scenario!r} has no {table[:-1]} {value!r}")
            entry.update(fields)
            self._save(scenario, idx)
            return entry

    def update_candidate(self, scenario: str, cid: str, **fields) -> dict:
        return self._update(scenario, "candidates", "id", cid, fields)

    def candidate(self, scenario: str, cid: str) -> dict:
        cand = next((c for c in self.index(scenario)["candidates"] if c["id"] == cid), None)
        if cand is None:
            raise NotFound(f"scenario {scenario!r} has no candidate {cid!r}")
        return cand

    def next_version(self, scenario: str) -> str:
        return _next_version(self.index(scenario))

    def publish_candidate(self, scenario: str, cid: str) -> dict:
        """Make candidate `cid` the next release and point serving at it. Returns the release entry."""
        with self._lock:
            idx = self.index(scenario)
            cand = _unpublished(idx, scenario, cid)
            version = _next_version(idx)
            src, dst = self.folder(scenario) / "candidates" / cid, self.folder(scenario) / version
            shutil.copytree(src, dst)  # the candidate folder stays as it was, for inspection
            self._ship(dst)
            release = {"version": version, "release_id": release_key(scenario, version), "candidate": cid,
                       "parent": release_key(scenario, idx["serving"]) if idx["serving"] else BASE,
                       "created_at": time.time(), "folder": str(dst),
                       **{k: cand.get(k) for k in ("recipe", "config", "records", "reports", "metrics", "eval",
                                                   "retention", "trainer_step", "gepa", "request")},
                       **({"kind": cand["kind"]} if cand.get("kind") else {})}
            return self._serve_new(scenario, idx, cand, release)

    def publish_component(self, scenario: str, cid: str, component: str, components: list[str]) -> dict:
        """A composite scenario's next release: candidate `cid` as the new version of `component`, every other
        component as the serving release has it. The release folder holds manifest.json and one folder per component
        (the new one copied from the candidate, the others linked to the release that introduced them), so the
        folder is the whole release (what the Hub revision holds). A component's version is named by the release that
        introduced it; the weights' own `trainer_step` and held-out `eval` ride along only while they still serve."""
        with self._lock:
            idx = self.index(scenario)
            cand = _unpublished(idx, scenario, cid)
            prev = next((r for r in idx["releases"] if r["version"] == idx["serving"]), None)
            version = _next_version(idx)
            release_id, dst = release_key(scenario, version), self.folder(scenario) / version
            versions = {c: (prev or {}).get("components", {}).get(c) for c in components}
            folders = {c: (prev or {}).get("folders", {}).get(c) for c in components}
            versions[component], folders[component] = release_id, str(dst / component)
            dropped = [c for c in cand.get("drops") or () if c in components and c != component]
            for c in dropped:  # a release that makes a component unneeded (ctxd: the harness it distilled)
                versions[c], folders[c] = None, None
            if dst.exists():
                shutil.rmtree(dst)  # left by a crash before its index entry was written
            dst.mkdir(parents=True)
            shutil.copytree(self.folder(scenario) / "candidates" / cid, dst / component)
            for c, folder in folders.items():
                if c != component and folder:
                    (dst / c).symlink_to(os.path.relpath(folder, dst))
            manifest = {"release_id": release_id, "components": versions, "changed": component,
                        **({"dropped": dropped} if dropped else {})}
            write_json(dst / "manifest.json", manifest, indent=True)
            self._ship(dst)
            weights_new = component == "weights"
            release = {"version": version, "release_id": release_id, "kind": "composite", "component": component,
                       "components": versions, "folders": folders, "candidate": cid,
                       **({"dropped": dropped} if dropped else {}),
                       "parent": release_key(scenario, idx["serving"]) if idx["serving"] else BASE,
                       "created_at": time.time(), "folder": str(dst),
                       "trainer_step": cand.get("trainer_step") if weights_new else (prev or {}).get("trainer_step"),
                       "eval": cand.get("eval") if weights_new else None, "component_eval": cand.get("eval"),
                       "retention": cand.get("retention") if weights_new else None,
                       **{k: cand.get(k) for k in ("recipe", "config", "records", "reports", "metrics", "gepa")}}
            return self._serve_new(scenario, idx, cand, release)

    def _serve_new(self, scenario: str, idx: dict, cand: dict, release: dict) -> dict:
        """Append `release` (made from `cand`), serve it and mark the candidate accepted, in one index write."""
        idx["releases"].append(release)
        idx["serving"] = release["version"]
        cand.update(status="accepted", release_id=release["release_id"])
        self._save(scenario, idx)
        return release

    def set_serving(self, scenario: str, release_id: str) -> dict | None:
        """Point serving at an existing release (or `base`); returns its entry (None for base)."""
        with self._lock:
            rel = self.release(scenario, release_id)
            idx = self.index(scenario)
            idx["serving"] = rel["version"] if rel else None
            idx.setdefault("rollbacks", []).append({"to": rel["release_id"] if rel else BASE, "at": time.time()})
            self._save(scenario, idx)
            return rel

    def update_release(self, scenario: str, version: str, **fields) -> dict:
        return self._update(scenario, "releases", "version", version, fields)

    def update_index(self, scenario: str, **fields) -> None:
        with self._lock:
            idx = self.index(scenario)
            idx.update(fields)
            self._save(scenario, idx)

    def lineage_records(self, scenario: str) -> set[str]:
        """The records (samples and their reports) named by the lineage of every release and of every candidate
        that may still become one: retention keeps them."""
        idx = self.index(scenario)
        live = [c for c in idx["candidates"] if c.get("status") in ("training", "evaluated", "pending_review")]
        return {rid for entry in idx["releases"] + live for key in ("records", "reports")
                for rid in entry.get(key) or ()}

    def scenarios(self) -> list[str]:
        if self._state is not None:
            return self._state.doc_keys("release")
        return sorted(p.parent.name for p in self.root.glob("*/index.json")) if self.root.exists() else []

    def retire(self, scenario: str, attic: Path) -> None:
        """A deleted scenario's releases and candidates move to `attic` (kept for inspection, never served or listed
        again). What stays is an index with no releases whose numbering goes on where they ended, so a scenario
        created again under the name gets new release ids (`<scenario>:vN`: the engine's keys, the Hub's tags), never
        the old ones."""
        with self._lock:
            folder = self.folder(scenario)
            if not folder.exists() and self._state is None:
                return
            idx = self.index(scenario)
            done = len(idx["releases"]) + idx.get("version_offset", 0)
            if folder.exists():
                attic.mkdir(parents=True, exist_ok=True)
                os.replace(folder, attic / "releases")
            if done:
                self._save(scenario, {"serving": None, "releases": [], "candidates": [], "base_eval": None,
                                      "version_offset": done})


def _empty() -> dict:
    return {"serving": None, "releases": [], "candidates": [], "base_eval": None}


def _next_version(idx: dict) -> str:
    """The next release's version: numbering goes on past the releases of a deleted scenario of the same name."""
    return f"v{len(idx['releases']) + idx.get('version_offset', 0) + 1}"


def _unpublished(idx: dict, scenario: str, cid: str) -> dict:
    """Candidate `cid` of the index, refused when unknown or already a release."""
    cand = next((c for c in idx["candidates"] if c["id"] == cid), None)
    if cand is None:
        raise NotFound(f"scenario {scenario!r} has no candidate {cid!r}")
    if cand["status"] == "accepted":
        raise BadRequest(f"candidate {cid} is already release {cand.get('release_id')}")
    return cand

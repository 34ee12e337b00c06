"""Change requests: a person asks for a harness change in plain words, a proposer model writes it.

`POST /reef/train {text, session?, release_id?}` on a harness scenario starts one. The proposer model (the
scenario's upstream model, or any OpenAI-compatible endpoint named in the recipe config) gets the request, the
harness of the release the person ran (`release_id`, else the serving one), and that session's recorded
conversation and feedback, and answers mutations as JSON: add, edit or remove a skill, a command, a rules entry or
a file. The mutations are checked (names stay inside the tree, sizes, front matter written from name and
description), applied to the serving harness, and the result passes the check every harness release passes
(reef_lab.harness.tree.check_release: front matter within YAML's limits, nothing executable unless the operator starts
the server with --harness-allow-executable 1); it is a candidate. The recipe's selection decides: `review` (the proposer model reviews the diff), `evaluate` (the recipe's
own evaluation, GEPA's validation set), `promote` (a person: POST /reef/scenarios/{s}/promote) or `always`. An
accepted candidate is released as vN (and pushed to the Hub with the request in its card).

Each request is a JSON file `data_dir/requests/<id>.json`, replaced atomically at every state change:
queued -> proposing -> evaluating -> released | rejected (with `why`), or pending_review until promoted.
A restart puts unfinished requests back in the queue. `GET /reef/requests/{id}` reads the file.

The embedded SmolLM2-135M is too small to write skills: it rarely answers valid JSON, and such a request is
rejected with the parse error as its reason. The path is the same with a capable upstream model.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import orjson

from reef_lab.harness import tree as harness_mod
from reef_lab.errors import BadRequest, Conflict, NotFound
from reef_lab.files import write_json
from reef_lab.records.record import ID_RE
from reef_lab.wire.text import request_messages, response_text
from reef_lab.engines.lm import LMSpec
from reef_lab.schema import check_fields

IDLE_EXIT_S = 10.0  # the worker thread ends after this long with no request waiting
log = logging.getLogger("reef_lab.harness.change_requests")

STATES = ("queued", "proposing", "evaluating", "pending_review", "released", "rejected")
OPEN = ("queued", "proposing", "evaluating")
SELECTIONS = ("review", "evaluate", "promote", "always")
BODY_KEYS = {"text", "session", "release_id", "scenario"}
MAX_TEXT = 8000
_ID = re.compile(r"^req_[0-9a-f]{20}$")
SESSION_ID = ID_RE  # a session id (the wrapper's are uuid4): the ids' one rule (reef_lab.records.record)
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
PROPOSER_MARK, REVIEWER_MARK = "You are reef_lab's harness proposer.", "You are reef_lab's harness reviewer."


@dataclass
class RequestConfig:
    """How a harness recipe handles change requests (`requests:` in its config)."""

    selection: str = field(default="review", metadata={
        "help": "who accepts a candidate: review (the proposer model reviews the diff), evaluate (the recipe's "
                "evaluation: GEPA's validation set, no regression), promote (a person) or always"})
    proposer_lm: dict | None = field(default=None, metadata={
        "help": "the proposer (reef_lab.engines.lm.make_lm spec); default: the deployment's own model (the upstream "
                "with --upstream-model)", "schema": LMSpec, "operator": True})
    max_file_bytes: int = field(default=20_000, metadata={"client_max": 200_000,
        "help": "largest file a mutation may write"})
    max_mutations: int = field(default=8, metadata={"client_max": 64, "help": "most mutations one request may make"})
    max_tokens: int = field(default=2000, metadata={"client_max": 8192, "help": "max_tokens of the proposer's answer"})
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature of the proposer"})
    context_chars: int = field(default=12_000, metadata={"client_max": 100_000,
        "help": "most characters of the session shown"})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.selection not in SELECTIONS:
            raise ValueError(f"requests.selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.max_file_bytes < 1 or self.max_mutations < 1 or self.context_chars < 0:
            raise ValueError("requests.max_file_bytes and max_mutations must be >= 1, context_chars >= 0")


class LazyLM:
    """An LM made on first use: a proposer that cannot be built (no --upstream-model) rejects requests with why,
    instead of stopping the scenario's learner from starting."""

    def __init__(self, make: Callable[[], Any]):
        self._make, self._lm = make, None

    def complete(self, messages: list[dict], **params) -> str:
        if self._lm is None:
            self._lm = self._make()
        return self._lm.complete(messages, **params)


class Rejected(Exception):
    """Why a request's candidate cannot be made or is not accepted (its `why`)."""


# ---- the request files ------------------------------------------------------------------------------------------
class RequestStore:
    """The change requests: one file each in the data dir, or (`state`: a shared deployment's PostgreSQL) one
    document each, so a request made at any gateway reaches the learner service of its scenario (`watch`)."""

    def __init__(self, data_dir: str | Path, state=None):
        self.dir = Path(data_dir) / "requests"
        self._lock = threading.Lock()
        self._state = state
        self._revs: dict[str, int] = {}

    def _path(self, rid: str) -> Path:
        if not isinstance(rid, str) or not _ID.match(rid):
            raise NotFound(f"change request {str(rid)[:80]!r} not found (ids look like req_<20 hex digits>)")
        return self.dir / f"{rid}.json"

    def get(self, rid: str) -> dict:
        path = self._path(rid)
        if self._state is not None:
            body, rev = self._state.read_doc("request", rid)
            if body is None:
                raise NotFound(f"change request {rid!r} not found")
            self._revs[rid] = rev
            return body
        if not path.exists():
            raise NotFound(f"change request {rid!r} not found")
        return orjson.loads(path.read_bytes())

    def watch(self, scenario: str, fn: Callable[[str], None]) -> None:
        """Call `fn(request_id)` for each request another service makes for `scenario` (shared state only: in one
        process every request comes through the learner's own `submit`)."""
        if self._state is None:
            return

        def heard(key: str | None) -> None:
            name, _, rid = (key or "").rpartition(":")
            if name == scenario and rid:
                fn(rid)
        self._state.on("request", heard)

    def list(self, scenario: str | None = None, since: float = 0.0) -> list[dict]:
        """Requests, oldest first: all, or one scenario's made since `since` (its creation time)."""
        if self._state is not None:
            out = self._state.find_docs("request", "scenario", scenario) if scenario is not None else [
                self._state.read_doc("request", k)[0] for k in self._state.doc_keys("request")]
        else:
            out = [orjson.loads(p.read_bytes()) for p in sorted(self.dir.glob("req_*.json"))] \
                if self.dir.exists() else []
        out = [r for r in out if (scenario is None or r["scenario"] == scenario) and r["created_at"] >= since]
        return sorted(out, key=lambda r: r["created_at"])

    def create(self, scenario: str, body: dict) -> dict:
        now = time.time()
        req = {"id": "req_" + uuid.uuid4().hex[:20], "scenario": scenario, "text": body["text"],
               "session": body.get("session"), "seen_release": body.get("release_id"), "state": "queued",
               "why": None, "created_at": now, "updated_at": now, "history": [{"state": "queued", "at": now}],
               "summary": None, "mutations": None, "diff": None, "candidate": None, "release": None,
               "review": None, "release_id": None}
        self.save(req)
        return req

    def save(self, req: dict) -> None:
        with self._lock:
            if self._state is not None:
                rid = self._path(req["id"]).stem  # (checks the id)
                self._revs[rid] = self._state.write_doc("request", rid, req, self._revs.get(rid, 0),
                                                        notice=f"{req['scenario']}:{rid}")
                return
            self.dir.mkdir(parents=True, exist_ok=True)
            write_json(self._path(req["id"]), req, indent=True)

    def move(self, req: dict, state: str, why: str | None = None, **fields) -> dict:
        now = time.time()
        req.update(state=state, why=why, updated_at=now, **fields)
        req["history"].append({"state": state, "at": now, **({"why": why} if why else {})})
        self.save(req)
        return req


def create_request(store: RequestStore, releaser, scenario: str, body: Any) -> dict:
    """A new request, checked (its body, the release it names) and stored `queued`: by the scenario's learner, or in
    a shared deployment by a gateway for the learner service that holds the scenario (it hears of it)."""
    fields = check_body(body)
    if fields["release_id"] is not None:
        rel = releaser.release(scenario, fields["release_id"])
        if rel is None or rel.get("kind") != "harness":
            raise BadRequest(f"release {fields['release_id']!r} is not a harness release of {scenario!r}")
        fields["release_id"] = rel["release_id"]
    return store.create(scenario, fields)


def answer(req: dict) -> dict:
    """What POST /reef/train answers for a new request."""
    return {"request_id": req["id"], "scenario": req["scenario"], "state": req["state"],
            "url": f"/reef/requests/{req['id']}"}


def check_body(body: Any) -> dict:
    """A change request's body from a client: {text, session?, release_id?} (scenario may ride along)."""
    if not isinstance(body, dict):
        raise BadRequest("a change request is a JSON object {\"text\": \"...\", \"session\"?: id, \"release_id\"?: vN}")
    unknown = set(body) - BODY_KEYS
    if unknown:
        raise BadRequest(f"unknown field(s) {sorted(unknown)}; a change request has text, session, release_id")
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("'text' must say in words what to change (a non-empty string)")
    if len(text) > MAX_TEXT:
        raise BadRequest(f"'text' holds {len(text)} characters; at most {MAX_TEXT}")
    if body.get("session") is not None and (not isinstance(body["session"], str)
                                            or not SESSION_ID.match(body["session"])):
        raise BadRequest("'session' must be a session id: 1-128 letters, digits, '_', '.', ':' or '-'")
    if body.get("release_id") is not None and not isinstance(body["release_id"], str):
        raise BadRequest("'release_id' must be a release id such as 'v2' or '<scenario>:v2'")
    return {"text": text.strip(), "session": body.get("session"), "release_id": body.get("release_id")}


# ---- prompts and answers ----------------------------------------------------------------------------------------
PROPOSER_SYSTEM = PROPOSER_MARK + """ A coding agent runs with a harness: instructions (system_prompt.md, \
rules.md: one "- " entry per rule), skills (skills/<name>.md: a description saying when to use it, and a body \
saying how) and commands (commands/<name>.md: a prompt a person invokes by name). A person asked for a change in \
plain words. Change the harness as little as it takes to do what they asked, in the agent's voice.

Answer with one JSON object and nothing else:
{"summary": "<one line: what you changed>", "mutations": [<mutation>, ...]}
where each mutation is one of
{"op": "add" | "edit", "kind": "skill", "name": "<lower-case-with-dashes>", "description": "<one line: when to use it>", "text": "<the body, Markdown, no front matter>"}
{"op": "add" | "edit", "kind": "command", "name": "<lower-case-with-dashes>", "description": "<one line>", "text": "<the prompt>"}
{"op": "remove", "kind": "skill" | "command", "name": "<name>"}
{"op": "add", "kind": "rule", "text": "<one rule, one line>"}
{"op": "edit", "kind": "rule", "old": "<the rule as it is>", "text": "<the new rule>"}
{"op": "remove", "kind": "rule", "text": "<the rule as it is>"}
{"op": "add" | "edit", "kind": "file", "path": "<relative path>", "text": "<content>"} or {"op": "remove", "kind": "file", "path": "<path>"}"""

REVIEWER_SYSTEM = REVIEWER_MARK + """ A person asked for a change to a coding agent's harness in plain words, and \
a proposer wrote the diff below. Accept it when it does what they asked and nothing harmful or unrelated. Answer \
with one JSON object and nothing else: {"accept": true | false, "reason": "<one line>"}"""


def proposer_messages(req: dict, files: dict[str, str], release_id: str | None, context: str) -> list[dict]:
    tree = "\n\n".join(f"=== {p} ===\n{t.rstrip()}" for p, t in sorted(files.items())) or "(empty)"
    user = (f"<request>\n{req['text']}\n</request>\n\nThe harness (release {release_id or 'none'}):\n\n{tree}\n\n"
            + (f"The session the person ran, with its feedback:\n\n{context}\n" if context else
               "No session was named.\n"))
    return [{"role": "system", "content": PROPOSER_SYSTEM}, {"role": "user", "content": user}]


def reviewer_messages(req: dict, diff: str) -> list[dict]:
    user = f"<request>\n{req['text']}\n</request>\n\nThe diff:\n\n{diff}\n"
    return [{"role": "system", "content": REVIEWER_SYSTEM}, {"role": "user", "content": user}]


def json_object(text: str, who: str) -> dict:
    """The JSON object a model answered (alone, or fenced, or inside other text)."""
    text = text.strip()
    candidates = [text]
    fence = re.search(r"```(?:json)?\s*(\{.*\})\s*```", text, re.S)
    if fence:
        candidates.append(fence.group(1))
    if "{" in text:
        candidates.append(text[text.index("{"):text.rindex("}") + 1] if "}" in text else text)
    for c in candidates:
        try:
            obj = json.loads(c)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    raise Rejected(f"the {who}'s answer is not a JSON object: {text[:200]!r}")


# ---- mutations --------------------------------------------------------------------------------------------------
def _rule_entries(text: str) -> list[str]:
    entries: list[str] = []
    for line in text.splitlines():
        if line.startswith("- ") or not entries:
            entries.append(line[2:] if line.startswith("- ") else line)
        else:
            entries[-1] += "\n" + line
    return [e.strip() for e in entries if e.strip()]


def _one_line(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Rejected(f"{what} must be a non-empty string")
    out = " ".join(value.split())
    if len(out) > limit:
        raise Rejected(f"{what} holds {len(out)} characters; at most {limit}")
    return out


def apply_mutations(files: dict[str, str], mutations: Any, cfg: RequestConfig,
                    allow_executable: bool = False) -> dict[str, str]:
    """The harness after `mutations` (a model's answer, so every field is checked); Rejected says what is wrong.
    The result passes the check every harness release passes (reef_lab.harness.tree.check_release; `allow_executable`:
    the operator's --harness-allow-executable, as the releaser holds it)."""
    if not isinstance(mutations, list) or not mutations:
        raise Rejected("'mutations' must be a non-empty list")
    if len(mutations) > cfg.max_mutations:
        raise Rejected(f"{len(mutations)} mutations; at most {cfg.max_mutations} per request")
    out = dict(files)
    for i, m in enumerate(mutations):
        try:
            _apply_one(out, m)
        except Rejected as e:
            raise Rejected(f"mutation {i + 1}: {e}") from None
    for path, text in out.items():
        if len(text.encode()) > cfg.max_file_bytes:
            raise Rejected(f"{path!r} would hold {len(text.encode())} bytes; at most {cfg.max_file_bytes}")
    try:
        harness_mod.check_release(out, allow_executable)
    except BadRequest as e:
        raise Rejected(f"the harness would not be valid: {e.message}") from None
    if out == files:
        raise Rejected("the mutations change nothing")
    return out


def _apply_one(out: dict[str, str], m: Any) -> None:
    if not isinstance(m, dict):
        raise Rejected("a mutation must be an object")
    op, kind = m.get("op"), m.get("kind")
    if op not in ("add", "edit", "remove") or kind not in ("skill", "command", "rule", "file"):
        raise Rejected(f"op must be add, edit or remove and kind skill, command, rule or file; got {op!r}, {kind!r}")
    if kind == "rule":
        entries = _rule_entries(out.get(harness_mod.RULES, ""))
        old = " ".join(str(m.get("old") or m.get("text") or "").split()) if op != "add" else None
        if op != "add" and old not in [" ".join(e.split()) for e in entries]:
            raise Rejected(f"no rules entry reads {old[:80]!r}")
        if op == "add":
            entries.append(_one_line(m.get("text"), "a rule", 1000))
        else:
            at = [" ".join(e.split()) for e in entries].index(old)
            if op == "edit":
                entries[at] = _one_line(m.get("text"), "the new rule", 1000)
            else:
                del entries[at]
        out[harness_mod.RULES] = "".join(f"- {e}\n" for e in entries)
        return
    if kind == "file":
        path = m.get("path")
        try:
            harness_mod.check_path(path)
        except BadRequest as e:
            raise Rejected(e.message) from None
    else:
        name = m.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise Rejected(f"{kind} name {str(name)[:80]!r} must be 1-64 lower-case letters, digits and '-'")
        path = f"{harness_mod.SKILLS if kind == 'skill' else harness_mod.COMMANDS}{name}.md"
    if op == "add" and path in out:
        raise Rejected(f"{path!r} exists already; edit it instead")
    if op in ("edit", "remove") and path not in out:
        raise Rejected(f"{path!r} does not exist")
    if op == "remove":
        del out[path]
        return
    text = m.get("text")
    if not isinstance(text, str) or not text.strip():
        raise Rejected(f"{path!r}: 'text' must be the file's content (a non-empty string)")
    if kind != "file":
        if text.lstrip().startswith("---"):
            raise Rejected(f"{path!r}: 'text' is the body only; the front matter is written from name and description")
        desc = _one_line(m.get("description"), f"{path!r}: 'description'", 1024)
        head = (f"name: {name}\n" if kind == "skill" else "") + f"description: {json.dumps(desc, ensure_ascii=False)}\n"
        text = f"---\n{head}---\n\n{text.strip()}\n"
    out[path] = text


def unified_diff(old: dict[str, str], new: dict[str, str]) -> str:
    parts = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        parts += difflib.unified_diff((a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
                                      "/dev/null" if a is None else f"a/{path}", "/dev/null" if b is None else f"b/{path}")
    return "".join(p if p.endswith("\n") else p + "\n" for p in parts)


def session_context(records, session: str | None, limit_chars: int) -> tuple[str, list[str]]:
    """The session's conversation as text (its newest call holds every turn so far) and its feedback; also the
    receipts of its calls. Calls are found by their `session` tag (x-reef-tag-session)."""
    if not session or limit_chars <= 0:
        return "", []
    ids = records.ids("inference")[-5000:]
    calls = [r for r in records.get_many(ids) if (r.get("tags") or {}).get("session") == session]
    if not calls:
        return f"(no call of session {session} is recorded)", []
    receipts = [r["id"] for r in calls]
    last = calls[-1]
    turns = request_messages(last.get("dialect"), last.get("request") or {})
    turns.append({"role": "assistant", "content": response_text(last.get("dialect"), last.get("response"))})
    lines = [f"{t['role']}: {t['content'][:1500]}" for t in turns if t["content"].strip()]
    refs = set(receipts)
    for rep in records.get_many(records.ids("report")[-5000:]):
        if refs & set(rep.get("references") or []):
            fb = rep.get("feedback")
            lines.append(f"feedback: score {rep.get('score')}; {fb if isinstance(fb, str) else json.dumps(fb)}")
    text = "\n".join(lines)
    return (text[-limit_chars:] if len(text) > limit_chars else text), receipts


# ---- the runner -------------------------------------------------------------------------------------------------
class ChangeRequests:
    """One scenario's change requests, worked through one at a time on a thread of their own.

    `releaser` (reef_lab.publishing.releaser) takes candidates to releases, `records` (a RecordsReader) holds the
    scenario's records; `lm` is the proposer; `evaluate(files) -> (accepted, reason)` is the recipe's own evaluation
    (selection `evaluate`)."""

    def __init__(self, scenario: str, releaser, records, data_dir: Path, lm, config: RequestConfig, recipe: str,
                 evaluate: Callable[[dict[str, str]], tuple[bool, str]] | None = None,
                 store: RequestStore | None = None):
        """`store`: where requests are kept (LearnContext.requests; default: the data dir's files)."""
        self.scenario, self.releaser, self.records, self.lm = scenario, releaser, records, lm
        self.config, self.recipe, self.evaluate = config, recipe, evaluate
        self.store = store if store is not None else RequestStore(data_dir)
        self._queue: deque[str] = deque()
        self._seen: set[str] = set()  # every request queued in this process (a late notice queues none twice)
        self._cv = threading.Condition()
        self._stop = False
        since = records.since  # a deleted earlier scenario of this name keeps its requests
        for req in self.store.list(scenario, since):  # a restart: unfinished requests go back in the queue
            if req["state"] in OPEN:
                self.store.move(req, "queued", "queued again after a restart")
                self._queue.append(req["id"])
                self._seen.add(req["id"])
        self._thread: threading.Thread | None = None  # runs only while requests wait (an idle scenario holds none)
        with self._cv:
            if self._queue:
                self._wake()
        self.store.watch(scenario, self.adopt)

    def adopt(self, rid: str) -> None:
        """A request another service of a shared deployment made for this scenario (a gateway took the POST): queued
        here like one of ours."""
        try:
            req = self.store.get(rid)
        except NotFound:
            return
        if req["scenario"] != self.scenario or req["state"] != "queued":
            return
        with self._cv:
            if rid not in self._seen and not self._stop:
                self._seen.add(rid)
                self._queue.append(rid)
                self._wake()

    def _wake(self) -> None:
        """Lock held: a request waits; the worker sees it, started if none runs."""
        self._cv.notify()
        if self._thread is None and not self._stop:
            self._thread = threading.Thread(target=self._run, name=f"reef-requests-{self.scenario}", daemon=True)
            self._thread.start()

    def submit(self, body: Any) -> dict:
        req = create_request(self.store, self.releaser, self.scenario, body)
        with self._cv:
            if req["id"] not in self._seen:  # (its notice may have queued it already)
                self._seen.add(req["id"])
                self._queue.append(req["id"])
            self._wake()
        return answer(req)

    def pending(self) -> int:
        with self._cv:
            return len(self._queue)

    def promote(self, candidate: str) -> dict | None:
        """Release a candidate a request left for review; None when no request owns it."""
        req = next((r for r in self.store.list(self.scenario, self.records.since)
                    if r["state"] == "pending_review" and r["candidate"] == candidate), None)
        if req is None:
            return None
        rel = self._release(candidate, self._lineage(req, "promoted by a person"))
        self.store.move(req, "released", None, release_id=rel["release_id"], release=rel["version"])
        return rel

    def close(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def wait_idle(self, timeout: float = 120.0) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self._cv:
                if not self._queue and not self._busy:
                    return True
            time.sleep(0.05)
        return False

    _busy = False

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._queue and not self._stop:
                    self._cv.wait(IDLE_EXIT_S)
                if self._stop or not self._queue:  # closing, or idle: `_wake` starts another when one comes
                    self._thread = None
                    return
                rid = self._queue.popleft()
                self._busy = True
            try:
                self._work(self.store.get(rid))
            except Exception as e:  # noqa: BLE001 - a request that breaks is rejected with why; the next one runs
                log.exception("scenario %s: change request %s failed", self.scenario, rid)
                self.store.move(self.store.get(rid), "rejected", f"{type(e).__name__}: {e}")
            finally:
                with self._cv:
                    self._busy = False

    def _files(self, release_id: str | None) -> tuple[str | None, dict[str, str]]:
        rel = self.releaser.release(self.scenario, release_id) if release_id else \
            self.releaser.serving_release(self.scenario)
        if rel is None or rel.get("kind") != "harness":
            return None, {}
        return rel["release_id"], harness_mod.read_tree(Path(rel["folder"]))

    def _work(self, req: dict) -> None:
        self.store.move(req, "proposing")
        seen_id, seen = self._files(req["seen_release"])
        base_id, base = self._files(None)
        context, receipts = session_context(self.records, req["session"], self.config.context_chars)
        try:
            answer = self.lm.complete(proposer_messages(req, seen, seen_id, context),
                                      max_tokens=self.config.max_tokens, temperature=self.config.temperature)
        except Exception as e:  # noqa: BLE001 - the proposer is a remote model: its failure is the request's why
            self.store.move(req, "rejected", f"the proposer failed: {type(e).__name__}: {e}")
            return
        try:
            obj = json_object(answer, "proposer")
            files = apply_mutations(base, obj.get("mutations"), self.config, self.releaser.allow_executable)
        except Rejected as e:
            self.store.move(req, "rejected", str(e), answer=answer[:4000])
            return
        diff = unified_diff(base, files)
        meta = {"kind": "harness", "recipe": self.recipe, "parent": base_id or "base",
                "request": self._request_meta(req, receipts)}
        cid = self._stage(files, meta)
        self.store.move(req, "evaluating", None, summary=str(obj.get("summary") or "")[:500],
                        mutations=obj["mutations"], diff=diff, base_release=base_id, candidate=cid,
                        session_calls=len(receipts))
        try:
            verdict, reason = self._select(req, files, diff)
        except Rejected as e:
            verdict, reason = "rejected", str(e)
        if verdict == "rejected":
            self.releaser.annotate(self.scenario, cid, status="rejected", reason=reason)
            self.store.move(req, "rejected", reason, review=reason)
        elif verdict == "review":
            self.releaser.annotate(self.scenario, cid, status="pending_review", reason=reason)
            self.store.move(req, "pending_review", reason, review=reason)
        else:
            rel = self._release(cid, self._lineage(req, reason))
            self.store.move(req, "released", None, review=reason, release_id=rel["release_id"],
                            release=rel["version"])

    def _stage(self, files: dict[str, str], meta: dict) -> str:
        """A harness candidate written whole before it is listed (a failed write leaves none behind); its id."""
        cid, folder = self.releaser.start_candidate(self.scenario, meta)
        staged = folder.parent / f".staged-{cid}"
        try:
            harness_mod.write_tree(staged, harness_mod.check_files(files))
            os.replace(staged, folder)
        except OSError as e:
            shutil.rmtree(staged, ignore_errors=True)
            self.releaser.fail(self.scenario, cid, e)
            raise
        return cid

    def _release(self, cid: str, lineage: dict) -> dict:
        """The candidate becomes the serving release vN (queued for the Hub with its request)."""
        self.releaser.annotate(self.scenario, cid, **lineage)
        return self.releaser.release_candidate(self.scenario, cid)

    def _select(self, req: dict, files: dict[str, str], diff: str) -> tuple[str, str]:
        policy = self.config.selection
        if policy == "always":
            return "accepted", "selection 'always'"
        if policy == "promote":
            return "review", f"waiting for POST /reef/scenarios/{self.scenario}/promote"
        if policy == "evaluate":
            if self.evaluate is None:
                raise Rejected("selection 'evaluate' needs an evaluation task; this recipe has none configured")
            ok, reason = self.evaluate(files)
            return ("accepted" if ok else "rejected"), reason
        answer = self.lm.complete(reviewer_messages(req, diff), max_tokens=300, temperature=0.0)
        obj = json_object(answer, "reviewer")
        reason = f"review: {str(obj.get('reason') or '')[:300]}"
        return ("accepted" if obj.get("accept") is True else "rejected"), reason

    def _request_meta(self, req: dict, receipts: list[str]) -> dict:
        return {"id": req["id"], "text": req["text"], "session": req["session"], "seen_release": req["seen_release"],
                "session_calls": len(receipts)}

    def _lineage(self, req: dict, reason: str) -> dict:
        return {"recipe": self.recipe, "request": {
            "id": req["id"], "text": req["text"], "session": req["session"], "seen_release": req["seen_release"],
            "session_calls": req.get("session_calls", 0), "summary": req.get("summary"), "verdict": reason}}


def refuse_change(recipe: str) -> Conflict:
    return Conflict(f"recipe {recipe!r} evolves no harness; change requests ({{\"text\": ...}} on POST /reef/train) "
                    "are for harness scenarios (recipe gepa)")

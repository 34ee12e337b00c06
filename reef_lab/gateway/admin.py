"""Administration: scenarios (create, inspect, delete), reading records, releases (list, rollback, promote), the
harness by hand, training on request, and the deployment's status.

None of it is on the hot path; every call names its scenario, and every refusal says what to send instead.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from reef_lab.harness import tree as harness_mod
from reef_lab.errors import BadRequest, Conflict, NotFound
from reef_lab.harness.change_requests import SESSION_ID, RequestStore, answer, create_request, refuse_change
from reef_lab.learning.recipe import check_offered, load_recipe
from reef_lab.publishing.releases import BASE
from reef_lab.records.record import KINDS
from reef_lab.scenarios import check_name
from reef_lab.tenants import OPEN, Grant


class Admin:
    def __init__(self, data_dir: Path, engine, store, scenarios, releaser, learners, serving, hub=None,
                 state=None, service: str = "all", requests: RequestStore | None = None):
        self.data_dir, self.engine, self.store, self.scenarios = data_dir, engine, store, scenarios
        self.releaser, self.learners, self.serving, self.hub = releaser, learners, serving, hub
        self.state, self.service = state, service
        self.requests = requests if requests is not None else RequestStore(data_dir)
        self.started_at = time.time()

    # ---- harness releases -----------------------------------------------------------------------------------
    def publish_harness(self, name: str, body: Any, lineage: dict | None = None, creator: str | None = None) -> dict:
        """A new harness release from a file tree (by hand: selection always); it serves the scenario's next
        requests. Checked like every harness release (reef_lab.harness.tree.check_release): 400 before anything is
        written."""
        self.scenarios.ensure(name, creator)
        files = body.get("files") if isinstance(body, dict) else None
        return self.releaser.publish_harness(name, files, lineage)["release"]

    def get_harness(self, scenario: str | None, release_id: str | None = None) -> dict:
        return self.harness_release(scenario, release_id)[0]

    def harness_release(self, scenario: str | None,
                        release_id: str | None = None) -> tuple[dict, harness_mod.Harness]:
        """({scenario, release_id, files, components?}, the parsed tree) of the serving harness (parsed when it was
        released) or of release `release_id` (parsed now, within the same limits)."""
        name = check_name(scenario)
        self.scenarios.get(name)
        if release_id is None:
            serving = self.serving.get(name)
            if serving is None or serving.harness is None:
                raise NotFound(f"scenario {name!r} serves no harness release")
            tree = serving.harness[1]
            out = {"scenario": name, "release_id": serving.release_id, "files": tree.files}
            return ({**out, "components": serving.components} if serving.components else out), tree
        rel = self.releaser.release(name, release_id)
        tree = self.releaser.harness(name, release_id)
        if rel is None or tree is None:
            raise NotFound(f"release {release_id!r} of scenario {name!r} holds no harness")
        out = {"scenario": name, "release_id": rel["release_id"], "files": tree.files}
        return ({**out, "components": rel["components"]} if rel.get("components") else out), tree

    # ---- learning and releases ------------------------------------------------------------------------------
    def train(self, scenario: str | None, body: Any = None) -> dict:
        """One round now; with {"text": ...} a change request in plain words (reef_lab/harness/change_requests.py)."""
        name = check_name(scenario)
        self.scenarios.get(name)
        if name in self.learners.errors:
            raise Conflict(f"scenario {name!r} cannot train: {self.learners.errors[name]}")
        if isinstance(body, dict) and "text" in body:
            if self.learners.elsewhere(name):  # a shared deployment: the learner service holding it takes it up
                recipe = self.learners.recipe(name)
                if recipe.evolves not in ("harness", "composite"):
                    raise refuse_change(recipe.name)
                return answer(create_request(self.requests, self.releaser, name, body))
            return self.learners.learner(name).request_change(body)
        if isinstance(body, dict) and set(body) - {"scenario"}:
            raise BadRequest(f"unknown field(s) {sorted(set(body) - {'scenario'})}: a training round takes "
                             "{\"scenario\"?}; a change request {\"text\", \"session\"?, \"release_id\"?}")
        return self.learners.learner(name).request_training()

    def list_releases(self, name: str) -> dict:
        self.scenarios.get(name)
        idx = self.releaser.index(name)  # read once: a release published in between would show as serving, unlisted
        serving = next((r for r in idx["releases"] if r["version"] == idx["serving"]), None)
        out = {"scenario": name, "serving": serving["release_id"] if serving else BASE,
               "releases": idx["releases"], "candidates": idx["candidates"], "base_eval": idx.get("base_eval"),
               "base_retention": idx.get("base_retention"),
               "hub_main": idx.get("hub_main")}
        ln = self.learners.running(name)
        if ln is not None:
            out["learner"] = ln.status()
        return out

    def rollback(self, name: str, body: Any) -> dict:
        self.scenarios.get(name)
        if not isinstance(body, dict) or not isinstance(body.get("release_id"), str):
            raise BadRequest("the body must be {\"release_id\": \"vN\" | \"<scenario>:vN\" | \"base\"}")
        self.releaser.rollback(name, body["release_id"])
        ln = self.learners.running(name)
        if ln is not None:
            ln.on_rollback()
        return self.list_releases(name)

    def promote(self, name: str, body: Any) -> dict:
        self.scenarios.get(name)
        if not isinstance(body, dict) or not isinstance(body.get("candidate"), str):
            raise BadRequest("the body must be {\"candidate\": \"cN\"} (a candidate waiting for review)")
        cand = self.releaser.candidate(name, body["candidate"])
        if cand["status"] != "pending_review":
            raise Conflict(f"candidate {cand['id']} is {cand['status']}; only candidates pending review can be "
                           "promoted")
        rel = self.learners.learner(name).promote(cand["id"])
        return {"promoted": cand["id"], "release": rel}

    # ---- scenarios and records ------------------------------------------------------------------------------
    def list_records(self, scenario: str, kind: str | None = None, limit: int = 50,
                     after: str | None = None, session: str | None = None) -> dict:
        """A page of the scenario's records; `session` keeps one session's (its `session` tag, which
        `reef-lab agent` sends as x-reef-tag-session), so a client finds a session's calls without reading all."""
        s = self.scenarios.get(scenario)
        if kind is not None and kind not in KINDS:
            raise BadRequest(f"'kind' must be one of {list(KINDS)}")
        if not 1 <= limit <= 1000:
            raise BadRequest("'limit' must be between 1 and 1000")
        if session is None:
            page, nxt = self.store.page(scenario, kind, s.since, after, limit)
            return {"records": [wire_record(r) for r in self.store.get_many(page)], "next": nxt}
        if not SESSION_ID.match(session):
            raise BadRequest("'session' must be a session id: 1-128 letters, digits, '_', '.', ':' or '-'")
        out: list[dict] = []
        while True:
            page, nxt = self.store.page(scenario, kind, s.since, after, 1000)
            for rec in self.store.get_many(page):
                if (rec.get("tags") or {}).get("session") == session:
                    out.append(rec)
                    if len(out) == limit:
                        return {"records": [wire_record(r) for r in out], "next": rec["id"]}
            if nxt is None:
                return {"records": [wire_record(r) for r in out], "next": None}
            after = nxt

    def get_record(self, scenario: str, record_id: str) -> dict:
        s = self.scenarios.get(scenario)
        if not s.owns(self.store.entry(record_id)):
            raise NotFound(f"record {record_id!r} not found in scenario {scenario!r}")
        return wire_record(self.store.get(record_id))

    def scenario_info(self, name: str) -> dict:
        s = self.scenarios.get(name)
        counts = {k: len(self.store.ids(name, k, since=s.since)) for k in KINDS}
        return {"name": s.name, "recipe": s.recipe, "config": s.config, "created_at": s.created_at,
                "records": counts, "error": self.learners.errors.get(name)}

    def create_scenario(self, body: Any, operator: bool = False, creator: str | None = None) -> dict:
        """A new scenario from a client's body; `operator` (in-process callers such as experiments, never HTTP)
        may also set operator-only fields and name code (module:Class) in the recipe's config; `creator`: the
        scoped token it counts against (reef_lab.scenarios.ScenarioLimits)."""
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise BadRequest("the body must be {\"name\": ..., \"recipe\"?: ..., \"config\"?: {...}}")
        config = body.get("config")
        if config is not None and not isinstance(config, dict):
            raise BadRequest("'config' must be an object of the recipe's config fields")
        unknown = set(body) - {"name", "recipe", "config"}
        if unknown:
            raise BadRequest(f"unknown field(s) {sorted(unknown)}; a scenario has name, recipe and config")
        if body.get("recipe") is not None:
            check_offered(body["recipe"], self.learners.offered)
        if body.get("recipe") is not None or config:
            spec = body.get("recipe") or self.scenarios.default_recipe
            if not operator:  # before the recipe ever sees the client's config
                self.learners.check_client_config(spec, config)
            self.learners.check_engine_fits(load_recipe(spec, config))
        s = self.scenarios.create(body["name"], body.get("recipe"), config,
                                  origin="operator" if operator else "client", creator=creator)
        if self.learners.serves_from_start(s.name):
            self.learners.start(s.name)
        return self.scenario_info(s.name)

    def delete_scenario(self, name: str) -> dict:
        """The scenario goes, and everything of it that could serve or answer again: its learner, its releases and
        learner state (moved to `<data dir>/deleted/<name>.<ms>/`, kept for inspection), what the engine holds for
        it; its records are hidden (append-only, they stay on disk) and its change requests are of an earlier
        scenario from now on. A scenario created again under the name starts empty, from the base."""
        s = self.scenarios.delete(name)
        self.learners.forget(name)
        attic = self.data_dir / "deleted" / f"{name}.{int(time.time() * 1000)}"
        self.releaser.forget(name, attic)
        state = self.data_dir / "learn" / name
        if state.exists():
            attic.mkdir(parents=True, exist_ok=True)
            state.replace(attic / "learn")
        hidden = self.store.forget(name)
        return {"deleted": s.name, "records_hidden": hidden}

    def get_request(self, request_id: str, grant: Grant = OPEN) -> dict:
        """A change request, if it is of a scenario that exists now (not of a deleted one of the same name) and
        `grant` may read; any other answers 404 alike, so nothing is told of another tenant's requests."""
        req = self.requests.get(request_id)
        name = req.get("scenario")
        if not (self.scenarios.exists(name) and req["created_at"] >= self.scenarios.get(name).since
                and grant.may("reader", name)):
            raise NotFound(f"change request {request_id!r} not found")
        return req

    def status(self, grant: Grant = OPEN) -> dict:
        """The deployment's state. A token that is not an admin of every scenario sees its own scenarios' part only:
        nothing of the deployment (data dir, engine and its upstream URL, store) nor of other tenants."""
        if not grant.everywhere:
            mine = {s.name for s in self.scenarios.list() if grant.covers(s.name)}
            return {"ok": True, "uptime_s": round(time.time() - self.started_at, 3), "scenarios": len(mine),
                    "learners": {n: v for n, v in self.learners.status().items() if n in mine},
                    "scenario_errors": {n: v for n, v in self.learners.errors.items() if n in mine},
                    "token": _token(grant)}
        return {"ok": True, "uptime_s": round(time.time() - self.started_at, 3), "data_dir": str(self.data_dir),
                "engine": self.engine.info(), "store": self.store.info(),
                "scenarios": len(self.scenarios.list()), "default_recipe": self.scenarios.default_recipe,
                "learners": self.learners.status(),
                "scenario_errors": dict(self.learners.errors),
                "hub": None if self.hub is None else self._hub_status(), "token": _token(grant),
                **self._shared()}

    def _shared(self) -> dict:
        """A shared deployment's part: the database (where, and why it is unavailable if it is), this process's
        service and the learner leases it holds."""
        if self.state is None:
            return {}
        leases = self.learners.leases
        return {"service": self.service, "state": {"backend": "postgresql", "where": self.state.where,
                                                   "problem": self.state.check()},
                "learning_here": sorted(n.split(":", 1)[1] for n in (leases.held if leases else {}))}

    def _hub_status(self) -> dict:
        """The Hub publisher's queue and, per scenario, each release's push state (pending, pushed, failed)."""
        scenarios = {}
        for name in self.releaser.scenarios():
            idx = self.releaser.index(name)
            states = {r["release_id"]: {k: (r.get("hub") or {}).get(k) for k in ("state", "error", "commit")}
                      for r in idx["releases"] if r.get("hub")}
            if states or idx.get("hub_main"):
                scenarios[name] = {"releases": states, "main": idx.get("hub_main")}
        return {"repo": self.hub.config.repo, "queued": self.hub.queued, "scenarios": scenarios}


SERVER_PATH_KEYS = ("folder", "folders")


def for_grant(answer: Any, grant: Grant, data_dir: Path) -> Any:
    """An answer about releases, candidates or change requests as `grant` may see it: an admin of every scenario (and
    auth off) sees it whole; any other token sees no server path (`folder`, `folders`, and the data dir's path
    inside any other text, e.g. an error, shown as `<data dir>`), which docs/api.md keeps for the deployment's
    admin."""
    if grant.everywhere:
        return answer
    root = str(data_dir)

    def scrub(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: scrub(x) for k, x in v.items() if k not in SERVER_PATH_KEYS}
        if isinstance(v, list):
            return [scrub(x) for x in v]
        return v.replace(root, "<data dir>") if isinstance(v, str) else v
    return scrub(answer)


def _token(grant: Grant) -> dict | None:
    """Who the caller is, as it may know: its id on records, its role and scenarios (None: auth is off)."""
    return None if grant.id is None else {"id": grant.id, "role": grant.role, "scenarios": list(grant.scenarios)}


def wire_record(r: dict) -> dict:
    """A record as the API returns it: Reef's names (`agent_record_id`, `artifact_ref.release_id`) beside ours."""
    return {"agent_record_id": r["id"], "artifact_ref": {"release_id": r.get("release_id")}, **r}

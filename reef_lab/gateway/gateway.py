"""The gateway: one in-process code path for serving, recording and reporting.

The Flask server translates HTTP to these calls and back; experiments call them directly, so a notebook run and
live traffic exercise the same code. Every inference becomes a record that is durable before its receipt is
returned; every report is validated (finite score, known receipts of the same scenario, the recipe's schema)
before it is stored.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shutil
import threading
import time
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

import orjson

from reef_lab.gateway import dialects, episodes, unanswered
from reef_lab import harness as harness_mod
from reef_lab.errors import BadRequest, Conflict, NotFound, ReefError
from reef_lab.engines.base import Engine, Generator, Relay, ReleaseHost
from reef_lab.publishing.hub import HubConfig, HubPublisher
from reef_lab.engines.lm import make_lm
from reef_lab.publishing.tracking import Tracker, TrackingConfig
from reef_lab.learning.recipe import LearnContext, Recipe, RecordHolder, RecordOnly, ScenarioLearner, check_offered, \
    load_recipe, shipped_recipes
from reef_lab.publishing.releases import BASE, ReleaseStore
from reef_lab.records.record import KINDS, Record, content_hash, new_record_id
from reef_lab.gateway.scenarios import ScenarioRegistry, check_name
from reef_lab.gateway.relay import RelayCall
from reef_lab.gateway.replies import RECEIPT_HEADER, RELEASE_HEADER, Reply, StreamReply  # noqa: F401 - re-exported
from reef_lab.schema import check_client_fields
from reef_lab.records.retention import RetentionConfig, Retainer
from reef_lab.records.store import RecordStore

log = logging.getLogger("reef_lab.gateway.gateway")

_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
REPORT_KEYS = {"agent_record_id", "id", "score", "feedback", "references", "metadata", "episode"}


class Gateway:
    """Serves, records and reports for one data dir with one engine."""

    def __init__(self, data_dir: str | Path, engine: Engine, default_recipe: str = "basic",
                 default_config: dict | None = None, hub: HubConfig | None = None,
                 tracking: TrackingConfig | None = None, allowed_recipes: list[str] | None = None,
                 retention: RetentionConfig | None = None, roll_records: int = 20_000, roll_bytes: int = 64 << 20):
        self.data_dir = Path(data_dir)
        self.retainer: Retainer | None = None
        self._handoff: dict[object, tuple[str, ...]] = {}  # reports stored but not yet handed to their learner
        self._handoff_lock = threading.Lock()
        # What a scenario may use: the shipped folders and what the operator named (never a client's own path).
        self.offered = {*shipped_recipes(), default_recipe, *(allowed_recipes or [])}
        self._errors: dict[str, str] = {}  # scenario -> why its recipe or learner cannot be built
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.engine = engine
        self._check_engine_fits(load_recipe(default_recipe, default_config))  # fail at start, not on a request
        self.store = RecordStore(self.data_dir, roll_records, roll_bytes)
        self.scenarios = ScenarioRegistry(self.data_dir, default_recipe, default_config)
        self._recipes: dict[str, Recipe] = {}
        self._config_classes: dict[str, type | None] = {}  # recipe spec -> its config dataclass
        self.releases = ReleaseStore(self.data_dir)
        self._learners: dict[str, ScenarioLearner] = {}
        self._learn_lock = threading.Lock()
        self.hub = HubPublisher(hub, self.releases, engine.hub_id or engine.model_name) \
            if hub is not None and hub.repo else None
        self.tracking = tracking
        self._harness: dict[str, tuple[str, dict[str, str]]] = {}  # scenario -> (release id, files) serving
        self.on_change = None  # called after scenarios or serving harnesses change (relay workers re-read them)
        self.scenarios.on_change = self._changed
        self.started_at = time.time()
        self._restore_releases()
        for s in self.scenarios.list():  # resume learning from reports not consumed before a restart
            evolves = self.recipe(s.name).evolves
            if evolves == "harness" or (evolves == "weights" and self.store.ids(s.name, "report")):
                self._start_learner(s.name)
        if retention is not None and retention.active:  # after the learners: they hold what they replayed
            self.retainer = Retainer(self.store, retention, self._retention_pins).start()
            self.store.on_roll = self.retainer.wake

    def _check_engine_fits(self, recipe) -> None:
        if recipe.evolves == "weights" and not isinstance(self.engine, ReleaseHost):
            raise Conflict(f"recipe {recipe.name!r} trains model weights, which this engine (an upstream provider) "
                           "cannot serve: use the embedded model (no --upstream-url) or a recipe that does not "
                           "train weights")

    def _restore_releases(self) -> None:
        """Serve each scenario's serving release again after a restart."""
        for name in self.releases.scenarios():
            rel = self.releases.serving(name)
            if rel is None or name not in {s.name for s in self.scenarios.list()}:
                continue
            if rel.get("kind") == "harness":
                self._set_harness(name, (rel["release_id"], harness_mod.read_tree(Path(rel["folder"]))))
            elif isinstance(self.engine, ReleaseHost):
                self.engine.load_release(rel["release_id"], rel["folder"])
                self.engine.route(name, rel["release_id"])

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _set_harness(self, name: str, serving: tuple[str, dict[str, str]] | None) -> None:
        if serving is None:
            self._harness.pop(name, None)
        else:
            self._harness[name] = serving
        self._changed()

    def serving(self, scenario: str) -> dict | None:
        """What a relay worker needs to serve a scenario's inference itself: the harness release it applies.
        None while the scenario does not exist (the relay hands such a request over, and its creation follows
        the one code path in `infer`)."""
        name = check_name(scenario)
        if not self.scenarios.exists(name):
            return None
        if name not in self._harness and name not in self._errors and self._evolves_harness(name):
            self._start_learner(name)  # its seed harness serves from the first request on
        release, files = self._harness.get(name, (None, None))
        return {"release_id": release, "files": files}

    # ---- harness releases -----------------------------------------------------------------------------------
    def publish_harness(self, name: str, body: Any, lineage: dict | None = None) -> dict:
        """A new harness release from a file tree; it serves the scenario's next requests."""
        self.scenarios.ensure(name)
        files = harness_mod.check_files(body.get("files") if isinstance(body, dict) else None)
        current = self.releases.serving(name)
        if current is not None and current.get("kind") != "harness":
            raise Conflict(f"scenario {name!r} serves trained weights ({current['release_id']}); a scenario "
                           "evolves either its weights or its harness")
        meta = {"kind": "harness", "recipe": (lineage or {}).get("recipe", "manual"),
                "parent": current["release_id"] if current else BASE, **(lineage or {})}
        staged = self.releases.folder(name) / "candidates" / f".staged-{new_record_id()}"
        try:  # written whole before it becomes a candidate: a failed write leaves no candidate behind
            harness_mod.write_tree(staged, files)
        except OSError as e:
            shutil.rmtree(staged, ignore_errors=True)
            raise ReefError(f"the harness could not be written: {e}") from None
        cid, folder = self.releases.new_candidate(name, meta)
        os.replace(staged, folder)
        rel = self.releases.publish(name, cid)
        self.releases.update_release(name, rel["version"], kind="harness")
        self._set_harness(name, (rel["release_id"], files))
        if self.hub is not None:
            self.hub.release(name, rel["version"])
        return {**rel, "kind": "harness"}

    def get_harness(self, scenario: str | None, release_id: str | None = None) -> dict:
        name = check_name(scenario)
        self.scenarios.get(name)
        if release_id is None:
            serving = self._harness.get(name)
            if serving is None:
                raise NotFound(f"scenario {name!r} serves no harness release")
            return {"scenario": name, "release_id": serving[0], "files": serving[1]}
        rel = self.releases.release(name, release_id)
        if rel is None or rel.get("kind") != "harness":
            raise NotFound(f"release {release_id!r} of scenario {name!r} is not a harness release")
        return {"scenario": name, "release_id": rel["release_id"],
                "files": harness_mod.read_tree(Path(rel["folder"]))}

    # ---- inference ------------------------------------------------------------------------------------------
    def infer(self, dialect: str, body: Any, scenario: str | None, tags: dict[str, str] | None = None,
              client_headers: dict[str, str] | None = None) -> Reply | StreamReply:
        try:
            name = check_name(scenario)
        except BadRequest as e:
            unanswered.log_unrecorded(dialect, scenario, e)
            raise
        t0, episode = time.perf_counter(), None
        self.scenarios.ensure(name)  # a new name creates the scenario, refused request or not
        try:  # [episodes hook] a 4xx below is recorded as refused (reef_lab/gateway/unanswered.py)
            episode = episodes.detect(client_headers, body)
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            if name not in self._harness and name not in self._errors and self._evolves_harness(name):
                self._start_learner(name)  # serves the recipe's seed harness from the first request on
            harness = self._harness.get(name)
            sent = harness_mod.apply(dialect, body, harness[1]) if harness else body
            release = harness[0] if harness else None
            if isinstance(self.engine, Relay):
                return self._relay(dialect, body, name, tags or {}, client_headers or {}, sent, release or "upstream")
            return self._generate(dialect, body, name, tags or {}, sent, release, episode)
        except ReefError as e:
            if not unanswered.is_refusal(e):
                raise
            unanswered.record_refused(self, name, dialect, body, tags or {}, t0, e, episode, None)
            raise

    def _inference_record(self, name, dialect, body, tags, response, t0, **kw) -> Record:
        return Record(id=new_record_id(), scenario=name, kind="inference", dialect=dialect, request=body,
                      response=response, tags=tags,
                      timing={"total_ms": round((time.perf_counter() - t0) * 1e3, 3), **kw.pop("timing", {})},
                      **kw)

    def _generate(self, dialect: str, body: dict, name: str, tags: dict, sent: dict,
                  harness: str | None, episode: str | None = None) -> Reply | StreamReply:
        """Generate for `sent` (the body with the scenario's harness applied); record `body` as the client sent
        it. A harness release, when one serves the scenario, is the release named on the record and header."""
        req = dialects.PARSERS[dialect](sent)
        req.scenario = name
        model = body.get("model") if isinstance(body.get("model"), str) else self.engine.model_name
        rid, created, t0 = dialects.new_response_id(dialect), dialects.now(), time.perf_counter()
        try:
            handle = self.engine.submit(req)
        except ValueError as e:  # the engine refuses the request itself (sampling values, prompt too long)
            raise BadRequest(str(e)) from None

        sent_text: list[str] = []  # the text deltas a stream has sent: what a cancelled record keeps
        recorded: list[str] = []  # the record id, once one is written (one record per call, however it ends)

        def cancelled(reason: str) -> str:
            rec = self._inference_record(name, dialect, body, tags, None, t0, status="cancelled", error=reason,
                                         release_id=harness or handle.release_id, episode=episode,
                                         prompt_token_ids=list(handle.prompt_ids),
                                         metadata={"generated_text": "".join(sent_text)})
            self.store.append([rec])
            recorded.append(rec.id)
            unanswered.log_cancelled(name, dialect, rec.id, reason)
            return rec.id

        def finish():
            try:
                gen = handle.result()
            except CancelledError as e:  # the client left (server/httpd.py's hang-up watch cancelled it)
                record_id = cancelled(str(e) or "cancelled by its caller")
                raise ReefError(f"generation cancelled: the client left (record {record_id})") from e
            except Exception as e:
                rec = self._inference_record(name, dialect, body, tags, None, t0, status="error",
                                             error=f"{type(e).__name__}: {e}",
                                             release_id=harness or handle.release_id, episode=episode)
                self.store.append([rec])
                recorded.append(rec.id)
                err = ReefError(f"generation failed: {e} (record {rec.id})")
                if isinstance(e, ReefError):  # e.g. the engine went down: 503 with its retry hint
                    err.status, err.type, err.headers = e.status, e.type, e.headers
                raise err from e
            resp = dialects.render(dialect, gen, model, rid, created, req.tool_use)
            rec = self._inference_record(name, dialect, body, tags, resp, t0, release_id=harness or gen.release_id,
                                         prompt_token_ids=gen.prompt_token_ids, token_ids=gen.token_ids,
                                         logprobs=gen.logprobs, episode=episode,
                                         metadata=dialects.tool_record(dialect, gen, rid, req.tool_use))
            self.store.append([rec])
            recorded.append(rec.id)
            return gen, rec.id, resp

        session = {episodes.EPISODE_HEADER: episode} if episode else {}
        if not body.get("stream"):
            gen, receipt, resp = finish()
            return Reply(200, orjson.dumps(resp), headers={RECEIPT_HEADER: receipt,
                                                           RELEASE_HEADER: harness or gen.release_id, **session})

        def deltas():
            try:
                for delta in handle:
                    sent_text.append(delta)
                    yield delta
            except Exception:  # noqa: BLE001 - handle.result() raises it again in finish(), which records it
                return

        def events():
            done = False
            try:
                prompt_tokens = len(handle.prompt_ids)
                yield from dialects.stream(dialect, deltas(), lambda: finish()[:2], model, rid, created,
                                           prompt_tokens, req.tool_use)
                done = True
            except ReefError as e:  # generation failed mid-stream: the record holds the error, the client too
                done = True
                yield dialects.error_event(dialect, e.message)
            finally:
                if not done:
                    handle.cancel()
                    if not recorded:  # the client closed the stream (the server closed this generator)
                        cancelled(f"the client closed the stream after {len(''.join(sent_text))} characters")
        return StreamReply(events(), headers={RELEASE_HEADER: harness or handle.release_id, **session},
                           cancel=handle.cancel)

    def _relay(self, dialect: str, body: dict, name: str, tags: dict, headers: dict, sent: dict,
               release: str) -> Reply | StreamReply:
        """Pass the body to the provider, translated when it speaks another dialect (reef_lab/gateway/relay.py);
        every call, failed or not, streaming or not, becomes a record."""
        return RelayCall(self, dialect, body, name, tags, headers, sent, release, time.perf_counter()).run()

    def count_tokens(self, body: Any, client_headers: dict[str, str] | None = None) -> Reply:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object {model, messages, system?, tools?}")
        if isinstance(self.engine, Relay):
            if self.engine.upstream_dialect not in (None, dialects.ANTHROPIC):
                raise NotFound("token counting is an Anthropic API; the upstream provider speaks "
                               f"{self.engine.upstream_dialect}, which has none")
            up = self.engine.forward("/v1/messages/count_tokens", body, client_headers or {})
            return Reply(up.status, up.body, up.content_type)
        messages = dialects.parse_count_tokens(body)
        return Reply(200, orjson.dumps({"input_tokens": self.engine.count_tokens(messages)}))

    def models(self) -> Reply:
        if isinstance(self.engine, Relay) and not self.engine.model:
            up = self.engine.get("/v1/models")
            return Reply(up.status, up.body, up.content_type)
        m = self.engine.model_name
        return Reply(200, orjson.dumps({"object": "list", "data": [
            {"id": m, "object": "model", "created": int(self.started_at), "owned_by": "reef_lab",
             "type": "model", "display_name": m, "created_at": time.strftime(
                 "%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at))}]}))

    # ---- reports --------------------------------------------------------------------------------------------
    def recipe(self, name: str) -> Recipe:
        """The scenario's recipe; one that cannot be built (a stored name this deployment does not offer, a config
        it refuses) leaves the scenario serving and recording with the error in /reef/status."""
        r = self._recipes.get(name)
        if r is None:
            s = self.scenarios.get(name)
            try:
                spec = check_offered(s.recipe, self.offered)
                if s.origin != "operator":  # a client's config, read back: as refused as when it was sent
                    self._check_client_config(spec, s.config)
                r = load_recipe(spec, s.config)
            except ReefError as e:
                self._errors[name] = f"recipe {s.recipe!r} cannot be built: {e.message}"
                log.error("scenario %s serves and records without learning: %s", name, self._errors[name])
                r = RecordOnly(self._errors[name])
            self._recipes[name] = r
        return r

    def _check_client_config(self, spec: str, config: dict | None) -> None:
        """BadRequest when a client's recipe config names code or sets an operator-only field (reef_lab.schema)."""
        if spec not in self._config_classes:
            recipe = load_recipe(spec)  # the recipe's defaults: nothing of the client's is read
            self._config_classes[spec] = type(recipe.config) if recipe.config is not None else None
        try:
            check_client_fields(self._config_classes[spec], config or {})
        except ValueError as e:
            raise BadRequest(str(e)) from None

    def _start_learner(self, name: str, record: dict | None = None) -> None:
        """Build (or reach) the scenario's learner and hand it a stored record. The record is stored already, so a
        learner that cannot be built is the scenario's error (in /reef/status), never the client's."""
        try:
            if self.recipe(name).evolves != "nothing":
                ln = self.learner(name)
                if record is not None:
                    ln.on_record(record)
        except Exception as e:  # noqa: BLE001 - kept as the scenario's error; serving and recording go on
            self._errors[name] = f"the learner cannot run: {type(e).__name__}: {e.message if isinstance(e, ReefError) else e}"
            log.exception("scenario %s: %s", name, self._errors[name])

    def report(self, scenario: str | None, body: Any, tags: dict[str, str] | None = None) -> tuple[bool, str]:
        """Validate and store a report; returns (created, record id). A repeated id with the same content is
        not created again."""
        name = check_name(scenario)
        if not isinstance(body, dict):
            raise BadRequest("the report must be a JSON object {score?, feedback?, references?, metadata?}")
        unknown = set(body) - REPORT_KEYS
        if unknown:
            raise BadRequest(f"unknown report field(s) {sorted(unknown)}; a report has score, feedback, "
                             "references, metadata (and optionally a client-chosen agent_record_id)")
        chosen = body.get("agent_record_id", body.get("id"))
        if "agent_record_id" in body and "id" in body and body["id"] != body["agent_record_id"]:
            raise BadRequest("give the report's id once: 'agent_record_id' (Reef's name) or 'id', not both")
        score = body.get("score")
        if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))
                                  or not math.isfinite(score)):
            raise BadRequest(f"'score' must be a finite number, got {shown(score)}")
        feedback = body.get("feedback")
        if feedback is not None and not isinstance(feedback, (str, dict)):
            raise BadRequest("'feedback' must be a string or an object")
        if score is None and feedback is None:
            raise BadRequest("a report needs a 'score' or 'feedback' (or both)")
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise BadRequest("'metadata' must be an object")
        epoch = self.store.epoch  # before the references are looked up: see RecordStore.append
        episode = body.get("episode")
        if episode is not None:  # [episodes hook] a report on a whole episode references all its calls
            body = {**body, "references": self._episode_references(name, episode, body.get("references"))}
        refs = self._check_references(name, body.get("references"))
        self.scenarios.ensure(name)
        self.recipe(name).validate_report(body)
        rec = Record(id=self._client_id(chosen), scenario=name, kind="report", references=refs,
                     score=None if score is None else float(score), feedback=feedback, metadata=metadata,
                     tags=tags or {}, episode=episode)
        if chosen is not None:
            rec.content_hash = content_hash(rec)
        with self._handing_over([rec.id, *refs]):
            created = self.store.append([rec], refs_checked_at=epoch)[0]
            if created and refs and self.recipe(name).evolves != "nothing":
                self._start_learner(name, rec.to_dict())
        return created, rec.id

    # ---- episodes [hooks: the logic is in reef_lab/gateway/episodes.py] -----------------------------------------
    def _episode_references(self, name: str, episode: Any, refs: Any) -> list[str]:
        episodes.check_episode_id(episode, "'episode'")
        if refs is not None:
            raise BadRequest("give a report either 'references' (receipts) or 'episode' (all its calls), not both")
        s = self.scenarios.get(name)
        ids = episodes.episode_ids(self.store, name, episode, s.since)
        if not ids:
            raise BadRequest(f"episode {episode!r} has no calls in scenario {name!r}")
        return ids

    def get_episode(self, scenario: str | None, episode: str) -> dict:
        """An episode's calls in turn order, each with its `turn` (1-based)."""
        s = self.scenarios.get(check_name(scenario))
        episodes.check_episode_id(episode)
        ids = episodes.episode_ids(self.store, s.name, episode, s.since)
        if not ids:
            raise NotFound(f"episode {episode!r} has no calls in scenario {s.name!r}")
        records = episodes.numbered(self.store.get_many(ids))
        return {"scenario": s.name, "episode": episode, "turns": len(records),
                "records": [wire_record(r) for r in records]}

    @contextlib.contextmanager
    def _handing_over(self, ids: list[str]):
        """While a stored record is on its way to its learner, retention sees it (and its references) as held."""
        if self.retainer is None:
            yield
            return
        token = object()
        with self._handoff_lock:
            self._handoff[token] = tuple(ids)
        try:
            yield
        finally:
            with self._handoff_lock:
                del self._handoff[token]

    def _retention_pins(self) -> set[str]:
        """The records retention keeps whatever its limits say (docs/records.md#retention), gathered in the order a
        report moves on: being handed to its learner, held by the learner, named by a candidate's or release's
        lineage; one that moves on while this runs is found at its next stop. A scenario whose learner does not
        say what it holds (not a RecordHolder), or could not be built, keeps all its reports and what they
        reference."""
        with self._handoff_lock:
            pinned = {rid for ids in self._handoff.values() for rid in ids}
        with self._learn_lock:
            learners = dict(self._learners)
        unknown = []
        for s in self.scenarios.list():
            ln = learners.get(s.name)
            if isinstance(ln, RecordHolder):
                pinned |= ln.held_records()
                continue
            try:
                learns = ln is not None or s.name in self._errors or self.recipe(s.name).evolves != "nothing"
            except NotFound:  # deleted meanwhile: its records are hidden, nothing needs them
                continue
            if learns:
                unknown.append(s.name)
        if unknown:
            pinned |= self.store.reports_and_references(unknown)
        for name in self.releases.scenarios():
            pinned |= self.releases.lineage_records(name)
        return pinned

    # ---- learning and releases ------------------------------------------------------------------------------
    def learner(self, name: str) -> ScenarioLearner:
        """The scenario's learner, built by its recipe on first use (a harness recipe's publishes its seed)."""
        ln = self._learners.get(name)
        if ln is None:
            with self._learn_lock:
                ln = self._learners.get(name)
                if ln is None:
                    recipe = self.recipe(name)
                    ln = recipe.learner(LearnContext(
                        scenario=name, data_dir=self.data_dir, store=self.store, releases=self.releases,
                        engine=self.engine, gateway=self, make_lm=self._make_lm,
                        tracker=self._tracker(name, recipe), on_release=self._released))
                    if ln is None:
                        raise BadRequest(f"scenario {name!r} uses recipe {recipe.name!r}, which does not train (it learns nothing)")
                    self._learners[name] = ln
        return ln

    def _evolves_harness(self, name: str) -> bool:
        return self.recipe(name).evolves == "harness"

    def _tracker(self, name: str, recipe) -> Tracker | None:
        """A W&B run for a learning scenario (None when tracking is off)."""
        if self.tracking is None or self.tracking.resolved_mode() == "disabled":
            return None
        from dataclasses import asdict

        tracker = Tracker(self.tracking.name or name, {
            "scenario": name, "recipe": recipe.name, "recipe_config": asdict(recipe.config),
            "engine": self.engine.info().get("model_name"), "data_dir": str(self.data_dir),
            **self.tracking.extra_config}, self.tracking, self.data_dir)
        if self.hub is not None:
            self.hub.links[name] = lambda t=tracker: t.link
        return tracker

    def _make_lm(self, spec: dict | None):
        """An LM a recipe calls (judge, reflection, task model); None: the deployment's own model, i.e. the
        generating engine, or the upstream provider through its OpenAI API."""
        if spec:
            return make_lm(spec, self.engine)
        if isinstance(self.engine, Generator):
            return make_lm({"kind": "engine"}, self.engine)
        if not self.engine.model:
            raise Conflict("the gepa recipe calls the upstream model itself: start with --upstream-model, or give "
                           "the recipe a task_lm {kind: openai, base_url, model}")
        return make_lm({"kind": "openai", "base_url": self.engine.base_url, "model": self.engine.model})

    def _released(self, scenario: str, release: dict) -> dict:
        """A release went live: queue its Hub push; returns what the release's metrics row should add."""
        if self.hub is None:
            return {}
        self.hub.release(scenario, release["version"])
        return {"hub_url": f"{self.hub.api.endpoint}/{self.hub.config.repo_for(scenario)}/tree/{release['version']}"}

    def train(self, scenario: str | None) -> dict:
        name = check_name(scenario)
        self.scenarios.get(name)
        if name in self._errors:
            raise Conflict(f"scenario {name!r} cannot train: {self._errors[name]}")
        return self.learner(name).request_training()

    def list_releases(self, name: str) -> dict:
        self.scenarios.get(name)
        idx = self.releases.index(name)  # read once: a release published in between would show as serving, unlisted
        serving = next((r for r in idx["releases"] if r["version"] == idx["serving"]), None)
        out = {"scenario": name, "serving": serving["release_id"] if serving else BASE,
               "releases": idx["releases"], "candidates": idx["candidates"], "base_eval": idx.get("base_eval"),
               "hub_main": idx.get("hub_main")}
        if name in self._learners:
            out["learner"] = self._learners[name].status()
        return out

    def rollback(self, name: str, body: Any) -> dict:
        self.scenarios.get(name)
        if not isinstance(body, dict) or not isinstance(body.get("release_id"), str):
            raise BadRequest("the body must be {\"release_id\": \"vN\" | \"<scenario>:vN\" | \"base\"}")
        rel = self.releases.release(name, body["release_id"])
        target = rel["release_id"] if rel else BASE
        if (rel or {}).get("kind") == "harness" or (rel is None and name in self._harness):
            self.releases.set_serving(name, target)
            self._set_harness(name, None if rel is None else (target, harness_mod.read_tree(Path(rel["folder"]))))
            if self.hub is not None:
                self.hub.serving(name, rel["version"] if rel else None)
            return self.list_releases(name)
        if not isinstance(self.engine, ReleaseHost):
            raise Conflict("this engine serves no weights of its own (upstream provider)")
        if rel and target not in self.engine.loaded_releases():
            self.engine.load_release(target, rel["folder"])
        self.engine.route(name, target)
        self.releases.set_serving(name, target)
        if self.hub is not None:
            self.hub.serving(name, rel["version"] if rel else None)
        if name in self._learners:
            self._learners[name].on_rollback()
        return self.list_releases(name)

    def promote(self, name: str, body: Any) -> dict:
        self.scenarios.get(name)
        if not isinstance(body, dict) or not isinstance(body.get("candidate"), str):
            raise BadRequest("the body must be {\"candidate\": \"cN\"} (a candidate waiting for review)")
        cand = self.releases.candidate(name, body["candidate"])
        if cand["status"] != "pending_review":
            raise Conflict(f"candidate {cand['id']} is {cand['status']}; only candidates pending review can be "
                           "promoted")
        rel = self.learner(name).promote(cand["id"])
        return {"promoted": cand["id"], "release": rel}

    def _client_id(self, rid: Any) -> str:
        if rid is None:
            return new_record_id()
        if not isinstance(rid, str) or not _ID_RE.match(rid):
            raise BadRequest(f"record id {shown(rid)} is invalid: use 1-128 letters, digits, '_', '.', ':' or '-'")
        return rid

    def _check_references(self, name: str, refs: Any, extra: dict | None = None) -> list[str]:
        if refs is None:
            return []
        owner = self.scenarios.ensure(name)
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            raise BadRequest("'references' must be a list of receipts (x-reef-agent-record-id values)")
        if len(set(refs)) != len(refs):
            dup = next(r for r in refs if refs.count(r) > 1)
            raise BadRequest(f"'references' lists {dup!r} more than once")
        for r in refs:
            e = self.store.entry(r)
            if e is not None and e.scenario == name and not owner.owns(e):
                e = None  # a record of a deleted earlier scenario of the same name
            e = e or (extra or {}).get(r)
            if e is None:
                raise BadRequest(f"reference {r!r} is not a known receipt")
            if e.scenario != name:
                raise BadRequest(f"reference {r!r} belongs to scenario {e.scenario!r}, not {name!r}")
            if e.kind != "inference":
                raise BadRequest(f"reference {r!r} is a {e.kind} record; references name inference receipts")
        return refs

    # ---- records --------------------------------------------------------------------------------------------
    def import_records(self, body: Any, default_scenario: str | None = None) -> tuple[int, dict]:
        """Import records all or nothing: every record is checked before any is written."""
        items = body.get("records") if isinstance(body, dict) else None
        if not isinstance(items, list) or not items:
            raise BadRequest("the body must be {\"records\": [record, ...]} with at least one record")
        if len(items) > 10_000:
            raise BadRequest("at most 10000 records per batch; split the import")
        records, pending = [], {}
        epoch = self.store.epoch  # before the references are looked up: see RecordStore.append
        for i, item in enumerate(items):
            try:
                rec = self._import_one(item, default_scenario, pending)
            except BadRequest as e:
                raise BadRequest(f"records[{i}]: {e.message}") from None
            records.append(rec)
            pending[rec.id] = rec
        for rec in records:
            self.scenarios.ensure(rec.scenario)
        with self._handing_over([rid for r in records for rid in (r.id, *r.references)]):
            created = self.store.append(records, refs_checked_at=epoch)
            for rec, c in zip(records, created, strict=True):
                if c and rec.kind in ("report", "train") and self.recipe(rec.scenario).evolves != "nothing":
                    self._start_learner(rec.scenario, rec.to_dict())
        return (201 if any(created) else 200), {
            "records": [{"id": r.id, "created": c} for r, c in zip(records, created, strict=True)],
            "created": sum(created), "existing": len(created) - sum(created)}

    def _import_one(self, item: Any, default_scenario: str | None, pending: dict) -> Record:
        if not isinstance(item, dict):
            raise BadRequest("a record must be an object")
        allowed = {"id", "scenario", "kind", "dialect", "created_at", "request", "response", "prompt_token_ids",
                   "token_ids", "logprobs", "release_id", "tags", "timing", "references", "score", "feedback",
                   "metadata", "status", "error", "episode"}
        unknown = set(item) - allowed
        if unknown:
            raise BadRequest(f"unknown field(s) {sorted(unknown)}")
        name = check_name(item.get("scenario") or default_scenario)
        kind = item.get("kind", "inference")
        if not isinstance(kind, str) or kind not in KINDS:
            raise BadRequest(f"'kind' must be one of {list(KINDS)}, got {shown(kind)}")
        dialect = item.get("dialect", "")
        if not isinstance(dialect, str) or dialect not in dialects.PARSERS and dialect != "":
            raise BadRequest(f"'dialect' must be one of {list(dialects.PARSERS)} or empty")
        for key in ("prompt_token_ids", "token_ids"):
            v = item.get(key)
            if v is not None and not (isinstance(v, list) and all(type(t) is int and 0 <= t < 2**31 for t in v)):
                raise BadRequest(f"'{key}' must be a list of token ids (integers in 0..2^31-1)")
        lp = item.get("logprobs")
        if lp is not None:
            if not isinstance(lp, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                   and math.isfinite(x) for x in lp):
                raise BadRequest("'logprobs' must be a list of finite numbers")
            if len(lp) != len(item.get("token_ids") or []):
                raise BadRequest("'logprobs' must have one entry per token in 'token_ids'")
        score = item.get("score")
        if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))
                                  or not math.isfinite(score)):
            raise BadRequest(f"'score' must be a finite number, got {shown(score)}")
        for key in ("timing",):
            if item.get(key) is not None and not isinstance(item[key], dict):
                raise BadRequest(f"'{key}' must be an object")
        for key in ("release_id", "status", "error"):
            if item.get(key) is not None and not isinstance(item[key], str):
                raise BadRequest(f"'{key}' must be a string")
        if item.get("feedback") is not None and not isinstance(item["feedback"], (str, dict)):
            raise BadRequest("'feedback' must be a string or an object")
        tags = item.get("tags") or {}
        if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
            raise BadRequest("'tags' must be an object of strings")
        created_at = item.get("created_at")
        if created_at is not None and (isinstance(created_at, bool) or not isinstance(created_at, (int, float))
                                       or not math.isfinite(created_at) or created_at <= 0):
            raise BadRequest("'created_at' must be a positive unix time in seconds")
        refs = self._check_references(name, item.get("references"), extra=pending)
        rec = Record(id=self._client_id(item.get("id")), scenario=name, kind=kind, dialect=item.get("dialect", ""),
                      created_at=float(created_at or 0), request=item.get("request"), response=item.get("response"),
                      prompt_token_ids=item.get("prompt_token_ids"), token_ids=item.get("token_ids"),
                      logprobs=None if lp is None else [float(x) for x in lp], release_id=item.get("release_id"),
                      tags=tags, timing=item.get("timing") or {}, references=refs,
                      score=None if score is None else float(score), feedback=item.get("feedback"),
                      metadata=item.get("metadata"), status=item.get("status") or "ok", error=item.get("error"),
                      episode=None if item.get("episode") is None else episodes.check_episode_id(item["episode"]))
        rec.content_hash = content_hash(rec)
        return rec

    def list_records(self, scenario: str, kind: str | None = None, limit: int = 50,
                     after: str | None = None) -> dict:
        s = self.scenarios.get(scenario)
        if kind is not None and kind not in KINDS:
            raise BadRequest(f"'kind' must be one of {list(KINDS)}")
        if not 1 <= limit <= 1000:
            raise BadRequest("'limit' must be between 1 and 1000")
        page, nxt = self.store.page(scenario, kind, s.since, after, limit)
        return {"records": [wire_record(r) for r in self.store.get_many(page)], "next": nxt}

    def get_record(self, scenario: str, record_id: str) -> dict:
        s = self.scenarios.get(scenario)
        if not s.owns(self.store.entry(record_id)):
            raise NotFound(f"record {record_id!r} not found in scenario {scenario!r}")
        return wire_record(self.store.get(record_id))

    def scenario_info(self, name: str) -> dict:
        s = self.scenarios.get(name)
        counts = {k: len(self.store.ids(name, k, since=s.since)) for k in KINDS}
        return {"name": s.name, "recipe": s.recipe, "config": s.config, "created_at": s.created_at,
                "records": counts, "error": self._errors.get(name)}

    def create_scenario(self, body: Any, operator: bool = False) -> dict:
        """A new scenario from a client's body; `operator` (in-process callers such as experiments, never HTTP)
        may also set operator-only fields and name code (module:Class) in the recipe's config."""
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise BadRequest("the body must be {\"name\": ..., \"recipe\"?: ..., \"config\"?: {...}}")
        config = body.get("config")
        if config is not None and not isinstance(config, dict):
            raise BadRequest("'config' must be an object of the recipe's config fields")
        unknown = set(body) - {"name", "recipe", "config"}
        if unknown:
            raise BadRequest(f"unknown field(s) {sorted(unknown)}; a scenario has name, recipe and config")
        if body.get("recipe") is not None:
            check_offered(body["recipe"], self.offered)
        if body.get("recipe") is not None or config:
            spec = body.get("recipe") or self.scenarios.default_recipe
            if not operator:  # before the recipe ever sees the client's config
                self._check_client_config(spec, config)
            self._check_engine_fits(load_recipe(spec, config))
        s = self.scenarios.create(body["name"], body.get("recipe"), config,
                                  origin="operator" if operator else "client")
        if self._evolves_harness(s.name):
            self._start_learner(s.name)
        return self.scenario_info(s.name)

    def delete_scenario(self, name: str) -> dict:
        s = self.scenarios.delete(name)
        self._recipes.pop(name, None)
        self._errors.pop(name, None)
        ln = self._learners.pop(name, None)
        if ln is not None:
            ln.close()
        hidden = self.store.forget(name)
        return {"deleted": s.name, "records_hidden": hidden}

    def status(self) -> dict:
        return {"ok": True, "uptime_s": round(time.time() - self.started_at, 3), "data_dir": str(self.data_dir),
                "engine": self.engine.info(), "store": self.store.info(),
                "scenarios": len(self.scenarios.list()), "default_recipe": self.scenarios.default_recipe,
                "learners": {n: ln.status() for n, ln in self._learners.items()},
                "scenario_errors": dict(self._errors),
                "hub": None if self.hub is None else self._hub_status(),
                "retention": None if self.retainer is None else self.retainer.status()}

    def _hub_status(self) -> dict:
        """The Hub publisher's queue and, per scenario, each release's push state (pending, pushed, failed)."""
        scenarios = {}
        for name in self.releases.scenarios():
            idx = self.releases.index(name)
            states = {r["release_id"]: {k: (r.get("hub") or {}).get(k) for k in ("state", "error", "commit")}
                      for r in idx["releases"] if r.get("hub")}
            if states or idx.get("hub_main"):
                scenarios[name] = {"releases": states, "main": idx.get("hub_main")}
        return {"repo": self.hub.config.repo, "queued": self.hub._jobs.unfinished_tasks, "scenarios": scenarios}

    def close(self, close_engine: bool = True) -> None:
        if self.retainer is not None:
            self.retainer.close()
        for ln in list(self._learners.values()):
            ln.close()
        if self.hub is not None:
            self.hub.close()
        self.store.close()
        if close_engine:
            self.engine.close()


def shown(value: Any, width: int = 60) -> str:
    """A client's value quoted in an error message: its repr, cut short (a value can be large or deep)."""
    text = repr(value) if isinstance(value, (str, int, float, bool, type(None))) else f"a {type(value).__name__}"
    return text if len(text) <= width else text[:width] + "..."


def wire_record(r: dict) -> dict:
    """A record as the API returns it: Reef's names (`agent_record_id`, `artifact_ref.release_id`) beside ours."""
    return {"agent_record_id": r["id"], "artifact_ref": {"release_id": r.get("release_id")}, **r}

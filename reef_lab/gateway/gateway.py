"""The gateway: a thin facade over the parts that own each job on the data path.

- reef_lab.gateway.inference: a request in, the answer out, every call a durable record first;
- reef_lab.gateway.reports: reports and imported records, validated before they are stored;
- reef_lab.gateway.admin: scenarios, reading records, releases, the harness by hand, status;
- reef_lab.gateway.learners: each scenario's recipe and learner.

The Flask server translates HTTP to these calls and back; experiments call them directly, so a notebook run and
live traffic exercise the same code.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from reef_lab.engines.base import Engine
from reef_lab.errors import NotFound
from reef_lab.gateway import episodes
from reef_lab.gateway.admin import Admin, for_grant, wire_record
from reef_lab.gateway.inference import PATHS, RECEIPT_HEADER, RELEASE_HEADER, Inference, Reply, StreamReply
from reef_lab.gateway.learners import LEASE, Learners
from reef_lab.gateway.reports import Reports, shown
from reef_lab.harness.change_requests import RequestStore
from reef_lab.learning.recipe import LearnContext, RecordHolder, load_recipe, shipped_recipes
from reef_lab.publishing.hub import HubConfig, HubPublisher
from reef_lab.publishing.releaser import Releaser
from reef_lab.publishing.releases import ReleaseStore
from reef_lab.publishing.serving import ServingTable
from reef_lab.publishing.tracking import TrackingConfig
from reef_lab.records.reader import RecordsReader
from reef_lab.records.postgres import PgRecordStore
from reef_lab.records.retention import RetentionConfig, Retainer
from reef_lab.records.store import RecordStore
from reef_lab.scenarios import ScenarioLimits, ScenarioRegistry, check_name
from reef_lab.tenants import OPEN, Grant

log = logging.getLogger("reef_lab.gateway")
SERVICES = ("all", "gateway", "learner")
LEASE_SECONDS = 10.0  # a learner's lease: renewed every third of it; a dead learner's scenarios move within it + a tick

__all__ = ["Gateway", "Reply", "StreamReply", "RECEIPT_HEADER", "RELEASE_HEADER", "PATHS", "shown", "wire_record"]


class Gateway:
    """Serves, records and reports for one data dir with one engine."""

    def __init__(self, data_dir: str | Path, engine: Engine, default_recipe: str = "basic",
                 default_config: dict | None = None, hub: HubConfig | None = None,
                 tracking: TrackingConfig | None = None, allowed_recipes: list[str] | None = None,
                 retention: RetentionConfig | None = None, roll_records: int = 20_000, roll_bytes: int = 64 << 20,
                 harness_allow_executable: bool = False, scenario_limits: ScenarioLimits | None = None,
                 state=None, service: str = "all", artifacts: str | Path | None = None):
        """`state`: a shared deployment's database (reef_lab.state.postgres.PgState, closed with the gateway):
        records, scenarios, release indexes and learners' ledgers there instead of in the data dir, learners by
        lease. `service`: "all" (serve and learn), "gateway" (serve; learners run elsewhere) or "learner" (learn
        only). `artifacts`: the folder releases are written to (default `<data dir>/releases`); in a shared
        deployment one every service mounts at the same path, or an object store's fsspec URL (s3://bucket/x)
        from which each service fetches the releases it serves."""
        if service not in SERVICES:
            raise ValueError(f"service must be one of {SERVICES}, got {service!r}")
        if service != "all" and state is None:
            raise ValueError(f"--service {service} splits a deployment over processes that share its state: give "
                             "--state postgresql://... too (alone, a data dir is one process's)")
        self.service = service
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.engine = engine
        self.tracking = tracking
        self.on_change = None  # called after scenarios or serving harnesses change (relay workers re-read them)
        # What a scenario may use: the shipped folders and what the operator named (never a client's own path).
        offered = {*shipped_recipes(), default_recipe, *(allowed_recipes or [])}
        self.state = state
        self.scenarios = ScenarioRegistry(self.data_dir, default_recipe, default_config, scenario_limits, state)
        self.learners = Learners(engine, self.scenarios, offered, tracking, self._context, self.data_dir,
                                 learns=service != "gateway")
        self.leases = None
        if state is not None and service != "gateway":
            from reef_lab.state.postgres import LeaseKeeper
            self.leases = self.learners.leases = LeaseKeeper(state, LEASE_SECONDS, on_lost=self.learners.lost,
                                                             on_tick=self._take_over)
        self.learners.check_engine_fits(load_recipe(default_recipe, default_config))  # fail at start
        self.store = RecordStore(self.data_dir, roll_records, roll_bytes) if state is None else PgRecordStore(state)
        self.retainer: Retainer | None = None
        self._handoff: dict[object, tuple[str, ...]] = {}  # reports stored but not yet handed to their learner
        self._handoff_lock = threading.Lock()
        self._pending = ThreadPoolExecutor(1, thread_name_prefix="reef-notices")  # reports other gateways stored
        remote = str(artifacts) if artifacts is not None and "://" in str(artifacts) else None
        if remote is not None and state is None:
            raise ValueError(f"--artifacts {remote}: an object store holds the releases of a shared deployment; give "
                             "--state postgresql://... too, or a folder")
        self.requests = RequestStore(self.data_dir, state)  # change requests (a shared deployment's: in it)
        self.releases = ReleaseStore(self.data_dir, state, None if remote else artifacts, fence=self._fence,
                                     remote=remote)
        self.hub = HubPublisher(hub, self.releases, engine.hub_id or engine.model_name) \
            if hub is not None and hub.repo else None
        self.learners.hub = self.hub
        self.serving_table = ServingTable(self._changed)
        self.scenarios.on_change = self._changed
        self.inference = Inference(engine, self.store, self.scenarios, self._serving_of)
        self.releaser = Releaser(self.releases, engine, self.serving_table, self.hub, self.inference.answer,
                                 allow_executable=harness_allow_executable)
        self.reports = Reports(self.store, self.scenarios, self.learners, self._handing_over)
        self.admin = Admin(self.data_dir, engine, self.store, self.scenarios, self.releaser, self.learners,
                           self.serving_table, self.hub, state, service, self.requests)
        self.started_at = time.time()
        self.releaser.restore({s.name for s in self.scenarios.list()})
        for s in self.scenarios.list():  # resume learning from reports not consumed before a restart
            if self.learners.serves_from_start(s.name) or (
                    self.learners.recipe(s.name).evolves == "weights" and self.store.ids(s.name, "report")):
                self.learners.start(s.name)
        if state is not None:
            state.on("release", self._release_notice)
            state.on("scenario", self._scenario_notice)  # after the registry's own (it reads the change first)
            if self.learners.learns:
                state.on("report", self._report_notice)
        if self.leases is not None:
            self.leases.start()
        if retention is not None and retention.active:  # after the learners: they hold what they replayed
            self.retainer = Retainer(self.store, retention, self._retention_pins).start()
            self.store.on_roll = self.retainer.wake

    # ---- a shared deployment (state in PostgreSQL) ------------------------------------------------------------
    def _fence(self, scenario: str):
        """The learner lease a write of the scenario's releases or ledger is fenced by (None: not this process's
        learner's, e.g. a rollback by hand)."""
        return None if self.leases is None else self.leases.fence(LEASE + scenario)

    def _release_notice(self, scenario: str | None) -> None:
        """A release index changed (another service released, rolled back or promoted; or a candidate's entry):
        serve what it says now, off the listener's thread (loading weights takes a while)."""
        self._pending.submit(self._follow, scenario)

    def _follow(self, scenario: str | None) -> None:
        changed = False
        for name in [scenario] if scenario else self.releases.scenarios():
            if self.scenarios.exists(name):
                try:
                    changed |= self.releaser.follow(name)
                except Exception:  # noqa: BLE001 - the release stays unserved here; the next notice retries
                    log.exception("scenario %s: could not serve the release another service made", name)
        if changed:
            self._changed()

    def _scenario_notice(self, name: str | None) -> None:
        """A scenario deleted at another gateway: its learner here stops and gives its lease back."""
        if name and not self.scenarios.exists(name) and name in self.learners.built():
            self._pending.submit(self.learners.forget, name)

    def _report_notice(self, key: str | None) -> None:
        """A report stored by another gateway: to this process's learner of its scenario (off the listener's
        thread: building a learner may take seconds). None: notices were missed; the lease tick finds the work."""
        if not key:
            return
        name, _, rid = key.partition(":")
        if self.store.mine(rid) or not self.scenarios.exists(name):
            return
        self._pending.submit(self._hand_over, name, rid)

    def _hand_over(self, name: str, rid: str) -> None:
        if self.learners.recipe(name).evolves == "nothing":
            return
        rec = self.store.get(rid)
        if rec is not None:
            self.learners.start(name, rec)

    def _take_over(self) -> None:
        """Each lease tick: learn the scenarios with work that no live service learns (its learner died, or none
        has started yet), taking their leases; one query for who holds what."""
        for name in self.learners.built():  # deleted at another gateway: its learner stops here too
            if not self.scenarios.exists(name):
                self.learners.forget(name)
        held = self.state.lease_holders(LEASE)
        for s in self.scenarios.list():
            if LEASE + s.name in held or s.name in self.learners.errors:
                continue
            recipe = self.learners.recipe(s.name)
            if self.learners.serves_from_start(s.name) or (
                    recipe.evolves == "weights" and self.store.page(s.name, "report", s.since, None, 1)[0]):
                self.learners.start(s.name)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _serving_of(self, name: str):
        """What serves a scenario; a harness recipe's learner starts on first use (its seed serves from the first
        request on)."""
        if name not in self.serving_table and name not in self.learners.errors and \
                self.learners.serves_from_start(name):
            self.learners.start(name)
        return self.serving_table.get(name)

    def _context(self, name: str, recipe, tracker) -> LearnContext:
        def infer(body: dict, tags: dict | None = None) -> dict:
            return self.inference.infer_record(body, name, tags)

        def report(body: dict, tags: dict | None = None) -> tuple[bool, str]:
            return self.reports.report(name, body, tags, notify=False)
        return LearnContext(scenario=name, data_dir=self.data_dir, state_dir=self.data_dir / "learn" / name,
                            infer=infer, report=report,
                            releaser=self.releaser, records=RecordsReader(self.store, name,
                                                                          self.scenarios.get(name).since),
                            engine=self.engine, make_lm=self.learners.make_lm, tracker=tracker,
                            ledger=self._shared_ledger(name), requests=self.requests)

    def _shared_ledger(self, name: str):
        """A shared deployment's learner keeps its ledger in the database (the service that takes the scenario over
        replays only what this one did not consume), fenced by its lease."""
        if self.state is None:
            return None
        from reef_lab.state.postgres import SharedDoc
        return SharedDoc(self.state, "ledger", name, lambda: self._fence(name))

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
        built = self.learners.built()
        unknown = []
        for s in self.scenarios.list():
            ln = built.get(s.name)
            if isinstance(ln, RecordHolder):
                pinned |= ln.held_records()
                continue
            try:
                learns = ln is not None or s.name in self.learners.errors or \
                    self.learners.recipe(s.name).evolves != "nothing"
            except NotFound:  # deleted meanwhile: its records are hidden, nothing needs them
                continue
            if learns:
                unknown.append(s.name)
        if unknown:
            pinned |= self.store.reports_and_references(unknown)
        for name in self.releases.scenarios():
            pinned |= self.releases.lineage_records(name)
        return pinned

    def serving(self, scenario: str) -> dict | None:
        """What a relay worker needs to serve a scenario's inference itself: the harness release it applies and its
        system text (`system` None: no harness). None while the scenario does not exist (the relay hands such a
        request over, and its creation follows the one code path in `infer`)."""
        name = check_name(scenario)
        if not self.scenarios.exists(name):
            return None
        serving = self._serving_of(name)
        harness = serving.harness if serving is not None else None
        return {"release_id": harness[0], "system": harness[1].system} if harness else \
            {"release_id": None, "system": None}

    # ---- the data path ------------------------------------------------------------------------------------------
    def infer(self, dialect: str, body: Any, scenario: str | None, tags: dict[str, str] | None = None,
              client_headers: dict[str, str] | None = None, caller: str | None = None,
              creator: str | None = None) -> Reply | StreamReply:
        """`caller`: the id of the client's token (reef_lab/tenants.py), kept on the record; `creator`: the scoped
        token a scenario this call creates counts against (ScenarioLimits)."""
        return self.inference.infer(dialect, body, scenario, tags, client_headers, caller=caller, creator=creator)

    def infer_record(self, body: dict, scenario: str, tags: dict[str, str] | None = None,
                     session: str | None = None) -> dict:
        """One chat completion for an in-process caller; the stored record (reef_lab.gateway.inference).
        `session`: the episode the call belongs to."""
        return self.inference.infer_record(body, scenario, tags, session=session)

    def count_tokens(self, body: Any, client_headers: dict[str, str] | None = None) -> Reply:
        return self.inference.count_tokens(body, client_headers)

    def models(self) -> Reply:
        return self.inference.models()

    def report(self, scenario: str | None, body: Any, tags: dict[str, str] | None = None,
               caller: str | None = None, only_own: bool = False, scoped_ids: bool = False) -> tuple[bool, str]:
        """`only_own`: the references must be receipts `caller` made (agent and reader tokens); `scoped_ids`: the
        caller is a token of some scenarios only, whose chosen ids start with the scenario's name."""
        return self.reports.report(scenario, body, tags, caller=caller, only_own=only_own, scoped_ids=scoped_ids)

    def import_records(self, body: Any, default_scenario: str | None = None, grant: Grant = OPEN) -> tuple[int, dict]:
        """Every record's scenario must be one `grant` administers (403 naming the record otherwise)."""
        return self.reports.import_records(body, default_scenario, grant.id,
                                           None if grant.everywhere else lambda s: grant.check("admin", s))

    # ---- administration -----------------------------------------------------------------------------------------
    def recipe(self, name: str):
        return self.learners.recipe(name)

    def learner(self, name: str):
        return self.learners.learner(name)

    def train(self, scenario: str | None, body: Any = None) -> dict:
        return self.admin.train(scenario, body)

    def list_releases(self, name: str) -> dict:
        return self.admin.list_releases(name)

    def rollback(self, name: str, body: Any) -> dict:
        return self.admin.rollback(name, body)

    def promote(self, name: str, body: Any) -> dict:
        return self.admin.promote(name, body)

    def publish_harness(self, name: str, body: Any, lineage: dict | None = None, creator: str | None = None) -> dict:
        return self.admin.publish_harness(name, body, lineage, creator)

    def get_harness(self, scenario: str | None, release_id: str | None = None) -> dict:
        return self.admin.get_harness(scenario, release_id)

    def harness_release(self, scenario: str | None, release_id: str | None = None):
        return self.admin.harness_release(scenario, release_id)

    def list_records(self, scenario: str, kind: str | None = None, limit: int = 50, after: str | None = None,
                     session: str | None = None) -> dict:
        return self.admin.list_records(scenario, kind, limit, after, session)

    def get_record(self, scenario: str, record_id: str) -> dict:
        return self.admin.get_record(scenario, record_id)

    def get_episode(self, scenario: str | None, episode: str, caller: str | None = None) -> dict:
        """[episodes hook] an agent session's calls in turn order (reef_lab/gateway/episodes.py): those the token
        `caller` made (an episode is its token's own)."""
        out = episodes.read_episode(self.store, self.scenarios, check_name(scenario), episode, caller)
        return {**out, "records": [wire_record(r) for r in out["records"]]}

    def scenario_info(self, name: str) -> dict:
        return self.admin.scenario_info(name)

    def create_scenario(self, body: Any, operator: bool = False, creator: str | None = None) -> dict:
        return self.admin.create_scenario(body, operator, creator)

    def delete_scenario(self, name: str) -> dict:
        return self.admin.delete_scenario(name)

    def get_request(self, request_id: str, grant: Grant = OPEN) -> dict:
        """A change request of a scenario that exists (and `grant` may read); 404 otherwise."""
        return self.admin.get_request(request_id, grant)

    def for_grant(self, answer: Any, grant: Grant) -> Any:
        """An answer on releases, candidates or change requests without server paths, unless `grant` is an admin of
        every scenario (reef_lab.gateway.admin.for_grant)."""
        return for_grant(answer, grant, self.data_dir)

    def status(self, grant: Grant = OPEN) -> dict:
        """The whole state for an admin of every scenario (and with auth off); a token's own scenarios' otherwise."""
        if not grant.everywhere:
            return self.for_grant(self.admin.status(grant), grant)
        return {**self.admin.status(grant), "retention": None if self.retainer is None else self.retainer.status()}

    def close(self, close_engine: bool = True) -> None:
        self._pending.shutdown(wait=False, cancel_futures=True)
        if self.retainer is not None:
            self.retainer.close()
        self.learners.close()
        if self.hub is not None:
            self.hub.close()
        self.store.close()
        if self.state is not None:
            self.state.close()
        if close_engine:
            self.engine.close()

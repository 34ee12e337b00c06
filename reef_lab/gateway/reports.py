"""Reports and imported records: validated before they are stored, handed to the scenario's learner after.

A report is checked in full (its fields, a finite score, known receipts of the same scenario, the recipe's own
schema) before anything is written; an import is all or nothing (every record parsed and its references resolved,
within the batch too, before any is written). A repeated client-chosen id with the same content is not created
again.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

from reef_lab.engines.base import ReleaseHost
from reef_lab.errors import BadRequest, Forbidden
from reef_lab.gateway import episodes
from reef_lab.records.record import Record, check_context, client_id, content_hash, shown
from reef_lab.scenarios import check_name

__all__ = ["Reports", "shown"]
REPORT_KEYS = {"agent_record_id", "id", "score", "feedback", "context", "references", "metadata", "episode"}


def check_scoped_id(scenario: str, chosen: Any) -> None:
    """A record id chosen by a token scoped to some scenarios starts with `<scenario>:`. Record ids are one space for
    the whole deployment, so an id taken in another tenant's scenario would be refused (409): an existence test of
    any id one knows. Ids under the scenario's own name never meet another tenant's; a token of every scenario (and
    auth off) chooses freely, as in Reef."""
    if not (isinstance(chosen, str) and chosen.startswith(f"{scenario}:") and len(chosen) > len(scenario) + 1):
        raise BadRequest(f"record id {shown(chosen)}: a token scoped to some scenarios chooses record ids that start "
                         f"with the scenario's name and ':' (e.g. '{scenario}:my-id'), so one tenant's ids never meet "
                         "another's; or leave the id out and use the one the answer returns")


class Reports:
    def __init__(self, store, scenarios, learners, handing_over=None):
        """`handing_over(ids)`: a context in which retention holds the records on their way to a learner."""
        self.store, self.scenarios, self.learners = store, scenarios, learners
        self.handing_over = handing_over or (lambda ids: contextlib.nullcontext())

    def report(self, scenario: str | None, body: Any, tags: dict[str, str] | None = None,
               notify: bool = True, caller: str | None = None, only_own: bool = False,
               scoped_ids: bool = False) -> tuple[bool, str]:
        """Validate and store a report; returns (created, record id). A repeated id with the same content is
        not created again. `notify`: hand it to the scenario's learner (False for the reports a learner makes on
        its own rollouts: it already knows them). `caller`: the reporting token's id, kept on the report; its
        `episode` is that token's own; `only_own` (agent and reader tokens): every reference must be a receipt
        that token made (reef_lab/tenants.py); `scoped_ids` (a token that is not an admin of every scenario): a
        client-chosen id starts with the scenario's name (`check_scoped_id`)."""
        name = check_name(scenario)
        if not isinstance(body, dict):
            raise BadRequest("the report must be a JSON object {score?, feedback?, context?, references?, metadata?}")
        unknown = set(body) - REPORT_KEYS
        if unknown:
            raise BadRequest(f"unknown report field(s) {sorted(unknown)}; a report has score, feedback, context, "
                             "references, episode, metadata (and optionally a client-chosen agent_record_id)")
        chosen = body.get("agent_record_id", body.get("id"))
        if "agent_record_id" in body and "id" in body and body["id"] != body["agent_record_id"]:
            raise BadRequest("give the report's id once: 'agent_record_id' (Reef's name) or 'id', not both")
        if scoped_ids and chosen is not None:
            check_scoped_id(name, chosen)
        score = body.get("score")
        if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))
                                  or not math.isfinite(score)):
            raise BadRequest(f"'score' must be a finite number, got {shown(score)}")
        feedback = body.get("feedback")
        if feedback is not None and not isinstance(feedback, (str, dict)):
            raise BadRequest("'feedback' must be a string or an object")
        context = body.get("context")
        check_context(context)
        if score is None and feedback is None and context is None:
            raise BadRequest("a report needs a 'score', 'feedback' or 'context' (or several)")
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise BadRequest("'metadata' must be an object")
        epoch = self.store.epoch  # before the references are looked up: see RecordStore.append
        episode = body.get("episode")
        if episode is not None:  # [episodes hook] a report on a whole episode references all its calls
            body = {**body, "references": episodes.episode_references(self.store, self.scenarios, name, episode,
                                                                      body.get("references"), caller)}
        self.scenarios.ensure(name, caller if scoped_ids else None)
        refs = self.check_references(name, body.get("references"))
        if only_own and episode is None:
            self.check_own(refs, caller)
        self.scenarios.ensure(name)
        self.learners.recipe(name).validate_report(body)
        rec = Record(id=client_id(chosen), scenario=name, kind="report", references=refs,
                     score=None if score is None else float(score), feedback=feedback, context=context,
                     metadata=metadata, tags=tags or {}, episode=episode, caller=caller)
        if chosen is not None:
            rec.content_hash = content_hash(rec)
        with self.handing_over([rec.id, *refs]):
            created = self.store.append([rec], refs_checked_at=epoch)[0]
            if notify and created and refs and self.learners.recipe(name).evolves != "nothing":
                self.learners.start(name, rec.to_dict())
        return created, rec.id

    def check_references(self, name: str, refs: Any, extra: dict | None = None) -> list[str]:
        if refs is None:
            return []
        owner = self.scenarios.find(name)  # None: a scenario an import is about to create
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            raise BadRequest("'references' must be a list of receipts (x-reef-agent-record-id values)")
        if len(set(refs)) != len(refs):
            dup = next(r for r in refs if refs.count(r) > 1)
            raise BadRequest(f"'references' lists {dup!r} more than once")
        for r in refs:
            e = self.store.entry(r)
            if e is not None and e.scenario == name and (owner is None or not owner.owns(e)):
                e = None  # a record of a deleted earlier scenario of the same name
            e = e or (extra or {}).get(r)
            if e is None:
                raise BadRequest(f"reference {r!r} is not a known receipt")
            if e.scenario != name:  # which one is not said: it may be another tenant's
                raise BadRequest(f"reference {r!r} belongs to another scenario, not {name!r}")
            if e.kind != "inference":
                raise BadRequest(f"reference {r!r} is a {e.kind} record; references name inference receipts")
        return refs

    def check_own(self, refs: list[str], caller: str | None) -> None:
        """Every reference is a receipt `caller` made (a read of each: only agent and reader tokens pay it)."""
        mine = {r["id"] for r in self.store.get_many(refs) if r.get("caller") == caller}
        for r in refs:
            if r not in mine:
                raise Forbidden(f"reference {r!r} was not made with this token: an agent or reader token reports "
                                "only on its own receipts (an admin token of the scenario reports on any)")

    # ---- records --------------------------------------------------------------------------------------------
    def import_records(self, body: Any, default_scenario: str | None = None, caller: str | None = None,
                       scope: Callable[[str], None] | None = None) -> tuple[int, dict]:
        """Import records all or nothing: every record is checked before any is written. `caller`: the importing
        token's id, kept on each record; `scope(scenario)` raises for a scenario that token may not import into."""
        items = body.get("records") if isinstance(body, dict) else None
        if not isinstance(items, list) or not items:
            raise BadRequest("the body must be {\"records\": [record, ...]} with at least one record")
        if len(items) > 10_000:
            raise BadRequest("at most 10000 records per batch; split the import")
        records, pending = [], {}
        epoch = self.store.epoch  # before the references are looked up: see RecordStore.append
        for i, item in enumerate(items):
            try:
                rec = self._import_one(item, default_scenario, pending, scope, caller)
            except BadRequest as e:
                raise BadRequest(f"records[{i}]: {e.message}") from None
            except Forbidden as e:
                raise Forbidden(f"records[{i}]: {e.message}") from None
            rec.caller = caller
            records.append(rec)
            pending[rec.id] = rec
        # checked, so nothing of a refused batch is made, scenarios included (a limit refuses them all)
        self.scenarios.ensure_all([r.scenario for r in records], caller if scope is not None else None)
        with self.handing_over([rid for r in records for rid in (r.id, *r.references)]):
            created = self.store.append(records, refs_checked_at=epoch)
            for rec, c in zip(records, created, strict=True):
                if c and rec.kind in ("report", "train") and \
                        self.learners.recipe(rec.scenario).evolves != "nothing":
                    self.learners.start(rec.scenario, rec.to_dict())
        return (201 if any(created) else 200), {
            "records": [{"id": r.id, "created": c} for r, c in zip(records, created, strict=True)],
            "created": sum(created), "existing": len(created) - sum(created)}

    def _check_vocabulary(self, rec: Record) -> None:
        """An imported record's token ids lie in the served model's vocabulary, where it has one (an engine that
        trains): a trainer would look them up in its embedding table (issue 38: 2^31-1 dropped a batch on CPU; on
        CUDA such a lookup is a device-side assert that fails every later CUDA call of the process). Both id fields
        a record has reach a trainer (a demonstration's, or a referenced inference's): both are checked."""
        engine = self.learners.engine
        if not isinstance(engine, ReleaseHost):  # a relay serves no model of ours: nothing of it is trained
            return
        size = engine.vocab_size()
        for name, ids in (("prompt_token_ids", rec.prompt_token_ids), ("token_ids", rec.token_ids)):
            if ids and max(ids) >= size:  # (negative ids fail the record's own parse)
                k = next(k for k, t in enumerate(ids) if not 0 <= t < size)
                raise BadRequest(f"'{name}'[{k}] = {ids[k]} is not a token id of the served model: ids must lie in "
                                 f"0..{size - 1} (its tokenizer's vocabulary): tokenize with the served model's "
                                 "tokenizer")

    def _import_one(self, item: Any, default_scenario: str | None, pending: dict,
                    scope: Callable[[str], None] | None = None, caller: str | None = None) -> Record:
        """One record checked; `scope` is set for a token of some scenarios only: its chosen ids start with the
        scenario's name, and a scenario the import creates counts against it."""
        rec = Record.from_client(item, default_scenario)
        if scope is not None:  # before its references are looked up: nothing of another tenant's is told
            scope(rec.scenario)
            if isinstance(item, dict) and item.get("id") is not None:
                check_scoped_id(rec.scenario, rec.id)
        check_name(rec.scenario, new=not self.scenarios.exists(rec.scenario))
        if rec.release_id is not None and ":" in rec.release_id and \
                rec.release_id.split(":", 1)[0] != rec.scenario:  # a recipe reads the release it names (ctxd)
            raise BadRequest(f"'release_id' {shown(rec.release_id)} names a release of another scenario: a record "
                             f"names one of its own scenario ('{rec.scenario}:vN'), 'base' or none; rewrite it "
                             "when moving records between scenarios")
        self._check_vocabulary(rec)
        rec.references = self.check_references(rec.scenario, rec.references or None, extra=pending)
        if rec.kind == "report":  # the recipe's own schema, as on the live route (the teacher's words' limit, ...)
            self.learners.recipe_for(rec.scenario).validate_report(rec.to_dict())
        return rec

"""The one path from a candidate to the serving release, for every recipe: load, evaluate, judge, route, index, Hub.

Weights (reef_lab.learning.learner, recipes/tttd), harnesses (recipes/gepa live and experiments, a harness
published by hand) and composite releases all go through here, so "a candidate becomes what serves" is written
once, with one failure behaviour: any error on the way marks the candidate `failed` with the error, leaves (or
routes back) the scenario on the release it had, and raises. No other module writes the release index
(tests/test_layout.py checks it).

- Evaluation answers a held-out task through the gateway's own inference path (`answer`, given by the gateway):
  each answer is a record of kind `eval`, tagged with the release and candidate it judged, so a candidate's score
  can be traced to the answers it came from.
- The selection policy (`select`) is the one every recipe uses: always, no_regression, strict_gain or review.
- Weights load beside what serves under `<scenario>:cN` to be judged and `<scenario>:vN` to serve; the index is
  written only once the engine serves the new release, so it never names a release that is not serving.
- A harness release (and a composite's harness component) serves through the ServingTable that inference reads.
  Every harness is checked here before it serves, whoever made it (a person's publish, GEPA, a change request):
  its front matter parsed once within YAML's limits and nothing executable unless the operator allows it
  (reef_lab.harness.tree.check_release); serving uses that parsed tree and never reads YAML on a request.
- Every release is queued for the Hub (when a repo is configured); the publisher's push states come back here.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

from reef_lab.harness import tree as harness_mod
from reef_lab.engines.base import ReleaseHost
from reef_lab.errors import BadRequest, Conflict, ReefError
from reef_lab.publishing.judge import HeldOut, judge
from reef_lab.publishing.releases import BASE, ReleaseStore, release_key
from reef_lab.publishing.serving import Serving, ServingTable
from reef_lab.records.record import new_record_id

log = logging.getLogger("reef_lab.publishing.releaser")

SELECTIONS = ("always", "no_regression", "strict_gain", "review")
EVAL_TAG = "reef.eval"  # on every held-out answer's record, with reef.release (and reef.candidate)

# (scenario, release, messages, max_tokens, tags, tools) -> the assistant message (OpenAI chat shape)
Answer = Callable[[str, str, list, int, dict, "list[dict] | None", bool], dict]
Log = Callable[[dict], None]


def select(policy: str, candidate: dict | None, serving: dict | None) -> tuple[str, str]:
    """The selection policy's verdict on a candidate: ("accepted" | "rejected" | "review", reason)."""
    if policy == "always":
        return "accepted", "selection 'always'"
    if policy == "review":
        return "review", "waiting for POST /reef/scenarios/{s}/promote"
    if policy not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {policy!r}")
    c, s = candidate["accuracy"], serving["accuracy"]
    if policy == "no_regression":
        ok = c >= s
        return ("accepted" if ok else "rejected"), f"held-out {c:.4f} {'>=' if ok else '<'} serving {s:.4f}"
    ok = c > s
    return ("accepted" if ok else "rejected"), f"held-out {c:.4f} {'>' if ok else '<='} serving {s:.4f}"


STATUS = {"accepted": "accepted", "rejected": "rejected", "review": "pending_review"}


class Releaser:
    def __init__(self, releases: ReleaseStore, engine, serving: ServingTable, hub=None,
                 answer: Answer | None = None, allow_executable: bool = False):
        self._store, self.engine, self.serving, self.hub = releases, engine, serving, hub
        self._answer = answer
        self.allow_executable = allow_executable  # the operator's --harness-allow-executable
        self._lock = threading.RLock()  # one release at a time per deployment: versions are numbered in order
        self._followed: dict[str, str] = {}  # scenario -> the release follow() or restore() served last
        if hub is not None:
            hub.on_state = self._hub_state

    # ---- reading (anyone) -----------------------------------------------------------------------------------
    def index(self, scenario: str) -> dict:
        return self._store.index(scenario)

    def serving_release(self, scenario: str) -> dict | None:
        """The serving release's index entry (None: the base weights, or no harness, serve)."""
        return self._store.serving(scenario)

    def release(self, scenario: str, release_id: str) -> dict | None:
        return self._store.release(scenario, release_id)

    def candidate(self, scenario: str, cid: str) -> dict:
        return self._store.candidate(scenario, cid)

    def candidate_folder(self, scenario: str, cid: str) -> Path:
        return self._store.folder(scenario) / "candidates" / cid

    def scenarios(self) -> list[str]:
        return self._store.scenarios()

    def components(self, scenario: str) -> list[str] | None:
        """The component names of a composite scenario (None: its releases are of one kind)."""
        return self._store.index(scenario).get("components")

    def serving_folder(self, scenario: str, component: str) -> Path | None:
        """The folder of what serves as `component` (weights or harness); None: the base weights, no harness."""
        rel = self._store.serving(scenario)
        if rel is None:
            return None
        if rel.get("kind") == "composite":
            folder = rel["folders"].get(component)
            return Path(folder) if folder else None
        return Path(rel["folder"]) if (rel.get("kind") == "harness") == (component == "harness") else None

    def harness_files(self, scenario: str, release_id: str | None = None) -> dict[str, str] | None:
        """The harness files of the serving release (or of `release_id`); None when it holds no harness."""
        if release_id is None:
            folder = self.serving_folder(scenario, "harness")
            return harness_mod.read_tree(folder) if folder else None
        try:
            rel = self._store.release(scenario, release_id)
        except ReefError:
            return None
        if rel is None:
            return None
        if rel.get("kind") == "composite":
            folder = rel["folders"].get("harness")
            return harness_mod.read_tree(Path(folder)) if folder else None
        return harness_mod.read_tree(Path(rel["folder"])) if rel.get("kind") == "harness" else None

    def harness(self, scenario: str, release_id: str) -> harness_mod.Harness | None:
        """The parsed harness of release `release_id` (read and parsed now, within the same limits)."""
        files = self.harness_files(scenario, release_id)
        return harness_mod.load(files) if files is not None else None

    def check_harness(self, files: object) -> harness_mod.Harness:
        """The one check every harness passes before it is released (BadRequest says what is wrong)."""
        return harness_mod.check_release(files, self.allow_executable)

    def declare_components(self, scenario: str, names: list[str]) -> None:
        """Make the scenario composite: from now on each release is a manifest of these components' versions."""
        if self.components(scenario) != sorted(names):
            current = self._store.serving(scenario)
            if current is not None and current.get("kind") != "composite":
                raise Conflict(f"scenario {scenario!r} already serves {current['release_id']}, which is not "
                               "composite; create a new scenario for a composite recipe")
            self._store.update_index(scenario, components=sorted(names))

    # ---- candidates -----------------------------------------------------------------------------------------
    def start_candidate(self, scenario: str, lineage: dict) -> tuple[str, Path]:
        """A candidate entry (status `training`) and the folder its files go to; in a composite scenario it is a
        new version of the component its kind says (weights unless `kind: harness`)."""
        if self.components(scenario):
            lineage = {**lineage, "component": "harness" if lineage.get("kind") == "harness" else "weights"}
        return self._store.new_candidate(scenario, lineage)

    def annotate(self, scenario: str, cid: str, **fields) -> dict:
        """Note on a candidate what judged it: a change request's verdict (status rejected or pending_review, with
        the reason) or its lineage (the request) before it is released."""
        return self._store.update_candidate(scenario, cid, **fields)

    def fail(self, scenario: str, cid: str, error: BaseException | str, log_row: Log | None = None,
             event: str = "candidate") -> None:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self._store.update_candidate(scenario, cid, status="failed", error=text)
        if log_row is not None:
            log_row({"event": event, "candidate": cid, "status": "failed", "error": text})

    def submit(self, scenario: str, cid: str, selection: str = "always", held_out: HeldOut | None = None,
               scores: dict | None = None, serving_scores: dict | None = None,
               log_row: Log | None = None, retention: HeldOut | None = None,
               retention_tolerance: float | None = None) -> dict:
        """Judge candidate `cid` and release it when the policy accepts: its held-out `scores` as given (a harness
        search scores its own candidates) or computed on `held_out`. `retention`: a second task the candidate and
        what serves are both scored on (what the release keeps of what it was not trained on); with
        `retention_tolerance` a candidate more than that below the serving release there is rejected.
        Returns the candidate's entry, with `release` set when it serves. Any error: the candidate is `failed`
        with it, serving stays, and it raises."""
        try:
            cand = self._store.candidate(scenario, cid)
            kept = serving_kept = None
            if (scores is None and held_out is not None) or retention is not None:
                computed, kept = self._evaluate_candidate(scenario, cid, cand, held_out if scores is None else None,
                                                          retention)
                scores = computed if scores is None else scores
            if serving_scores is None and held_out is not None:
                serving_scores = self.serving_eval(scenario, held_out, log_row)
            if retention is not None:
                serving_kept = self.serving_eval(scenario, retention, log_row, key="retention")
            verdict, reason = select(selection, scores, serving_scores)
            if verdict == "accepted" and retention_tolerance is not None and kept and serving_kept and \
                    kept["accuracy"] < serving_kept["accuracy"] - retention_tolerance:
                verdict, reason = "rejected", (f"retention {kept['accuracy']:.4f} < serving {serving_kept['accuracy']:.4f}"
                                               f" - tolerance {retention_tolerance} ({reason})")
        except Exception as e:
            self.fail(scenario, cid, e, log_row)
            raise
        status = STATUS[verdict]
        entry = self._store.update_candidate(scenario, cid, status="evaluated" if verdict == "accepted" else status,
                                             eval=scores, serving_eval=serving_scores, reason=reason,
                                             **({"retention": kept, "serving_retention": serving_kept} if kept else {}))
        if log_row is not None:
            log_row({"event": "candidate", "candidate": cid, "status": status, "reason": reason,
                     "trainer_step": cand.get("trainer_step"),
                     "accuracy": scores["accuracy"] if scores else None,
                     "serving_accuracy": serving_scores["accuracy"] if serving_scores else None,
                     **({"retention_accuracy": kept["accuracy"],
                         "serving_retention_accuracy": serving_kept["accuracy"]} if kept else {}),
                     "examples": (scores or {}).get("examples")})
        if verdict == "accepted":
            rel = self.release_candidate(scenario, cid, log_row)
            entry = {**self._store.candidate(scenario, cid), "release": rel}
        return entry

    def _evaluate_candidate(self, scenario: str, cid: str, cand: dict, held_out: HeldOut | None,
                            retention: HeldOut | None = None) -> tuple[dict | None, dict | None]:
        """The candidate's scores on `held_out` and on `retention` (None where not asked), loaded once."""
        if cand.get("kind") == "harness":
            raise Conflict("a harness candidate brings its own scores (the search that made it scored it)")
        key = f"{scenario}:{cid}"
        # judged as it would serve: weights released after a harness serve without it (a composite's keep it
        # unless the candidate drops it: context distillation), so they are evaluated without it too
        harness = bool(self.components(scenario)) and "harness" not in (cand.get("drops") or ())
        self.engine.load_release(key, self.candidate_folder(scenario, cid))
        try:
            return tuple(self.evaluate(scenario, key, h, cid, harness) if h is not None else None
                         for h in (held_out, retention))
        finally:
            self.engine.unload(key)

    # ---- evaluation -----------------------------------------------------------------------------------------
    def evaluate(self, scenario: str, release: str, held_out: HeldOut, candidate: str | None = None,
                 harness: bool = True) -> dict:
        """Accuracy of `release` (loaded in the engine) on the held-out items, answered greedily through the
        gateway's inference path (records of kind `eval`); all items go in at once so the engine batches them.
        `harness`: with the scenario's serving harness in front of each prompt (False: the weights alone)."""
        if self._answer is None:
            raise Conflict("this releaser has no inference path to evaluate on")
        tags = {EVAL_TAG: "1", "reef.release": release, **({"reef.candidate": candidate} if candidate else {})}
        return judge(held_out.task, held_out.items, lambda messages, tools: self._answer(
            scenario, release, messages, held_out.max_tokens, tags, tools, harness), release)

    def serving_eval(self, scenario: str, held_out: HeldOut, log_row: Log | None = None, key: str = "eval") -> dict:
        """Held-out accuracy of what serves now (computed once per release, kept in the index under `key`: the
        release's `eval` or `retention`, the base's `base_eval` or `base_retention`)."""
        serving = self._store.serving(scenario)
        if serving is not None and serving.get(key):
            return serving[key]
        if serving is None:
            idx = self._store.index(scenario)
            if idx.get(f"base_{key}"):
                return idx[f"base_{key}"]
            result = self.evaluate(scenario, BASE, held_out)
            self._store.update_index(scenario, **{f"base_{key}": result})
            if log_row is not None:
                name = "accuracy" if key == "eval" else f"{key}_accuracy"
                log_row({"event": "eval", "release_id": BASE, name: result["accuracy"]})
            return result
        result = self.evaluate(scenario, self._weights_key(serving), held_out)  # the serving harness applies
        self._store.update_release(scenario, serving["version"], **{key: result})
        return result

    # ---- releasing ------------------------------------------------------------------------------------------
    def release_candidate(self, scenario: str, cid: str, log_row: Log | None = None) -> dict:
        """Candidate -> release vN+1: loaded into the engine (weights) or the serving table (a harness), routed,
        then written to the index; queued for the Hub. On any failure the scenario stays on its current release
        and the candidate is `failed` with the error."""
        with self._lock:
            started = time.perf_counter()
            cand = self._store.candidate(scenario, cid)
            if cand["status"] == "accepted":
                raise BadRequest(f"candidate {cid} is already release {cand.get('release_id')}")
            key = release_key(scenario, self._store.next_version(scenario))
            parent, was = self._store.serving(scenario), self.serving.get(scenario)
            components = self.components(scenario)
            try:
                if components:
                    rel = self._release_component(scenario, cid, cand, key, components)
                elif cand.get("kind") == "harness":  # serves first, then the index names it
                    tree = self.check_harness(harness_mod.read_tree(self.candidate_folder(scenario, cid)))
                    self.serving.set(scenario, Serving(key, (key, tree)))
                    rel = self._store.publish_candidate(scenario, cid)
                    if rel["release_id"] != key:
                        raise RuntimeError(f"release index moved to {rel['release_id']} while {key} was loading")
                else:
                    self._host().load_release(key, self.candidate_folder(scenario, cid))
                    self.engine.route(scenario, key)
                    if was is not None:  # weights after a harness (context distillation): served without it now
                        self.serving.set(scenario, None)
                    rel = self._store.publish_candidate(scenario, cid)
                    if rel["release_id"] != key:
                        raise RuntimeError(f"release index moved to {rel['release_id']} while {key} was loading")
            except Exception as e:
                if cand.get("kind") == "harness" or components or was is not None:
                    self.serving.set(scenario, was)
                if cand.get("kind") != "harness" and isinstance(self.engine, ReleaseHost):
                    self.engine.route(scenario, self._weights_key(parent))
                self.fail(scenario, cid, e)
                if log_row is not None:
                    log_row({"event": "release_failed", "release_id": key, "error": str(e)})
                raise
        swap_s = time.perf_counter() - started
        extra = self._queue_hub(scenario, rel)
        if log_row is not None:
            log_row({"event": "release", "release_id": rel["release_id"], "version": rel["version"],
                     "candidate": cid, "trainer_step": rel.get("trainer_step"), "swap_s": round(swap_s, 3),
                     "accuracy": (rel.get("eval") or {}).get("accuracy"), **extra})
        log.info("scenario %s: release %s serving (swap %.2f s)", scenario, rel["release_id"], swap_s)
        return {**rel, **extra}

    def _release_component(self, scenario: str, cid: str, cand: dict, key: str, components: list[str]) -> dict:
        """A composite scenario's next release: the engine serves the new weights (the harness: the serving table)
        before the index names the release."""
        component = cand.get("component") or "weights"
        prev = self._store.serving(scenario) or {}
        versions = {**{c: (prev.get("components") or {}).get(c) for c in components}, component: key}
        versions.update({c: None for c in cand.get("drops") or () if c in components and c != component})
        tree = None
        if component == "weights":
            self._host().load_release(key, self.candidate_folder(scenario, cid))
            self.engine.route(scenario, key)
        else:
            tree = self.check_harness(harness_mod.read_tree(self.candidate_folder(scenario, cid)))
        self.serving.set(scenario, self._serving_of(key, versions, tree, prev))
        rel = self._store.publish_component(scenario, cid, component, components)
        if rel["release_id"] != key:
            raise RuntimeError(f"release index moved to {rel['release_id']} while {key} was loading")
        return rel

    def _serving_of(self, release_id: str, versions: dict, tree: harness_mod.Harness | None,
                    prev: dict | None) -> Serving:
        """What serves a composite release: its id on records, its harness, its components (weights named `base`
        while untrained)."""
        if tree is None and versions.get("harness"):
            folder = (prev or {}).get("folders", {}).get("harness")
            tree = self._load(Path(folder)) if folder else None
        shown = {c: v for c, v in versions.items() if v} | ({"weights": BASE} if "weights" in versions
                                                             and not versions["weights"] else {})
        return Serving(release_id, (versions["harness"], tree) if tree is not None else None, shown)

    @staticmethod
    def _load(folder: Path) -> harness_mod.Harness:
        """A released harness folder, parsed for serving (it passed check_release when it was released)."""
        return harness_mod.load(harness_mod.read_tree(folder))

    @staticmethod
    def _weights_key(rel: dict | None) -> str:
        """The engine release that serves a release's weights (`base` when none was trained)."""
        if rel is None or rel.get("kind") == "harness":
            return BASE
        if rel.get("kind") == "composite":
            return (rel.get("components") or {}).get("weights") or BASE
        return rel["release_id"]

    def publish_harness(self, scenario: str, files: object, lineage: dict | None = None,
                        selection: str = "always", scores: dict | None = None,
                        serving_scores: dict | None = None) -> dict:
        """A harness candidate from a file tree, judged (`selection` on the given scores) and released when
        accepted. Returns the candidate's entry (`release` set when it serves)."""
        current = self._store.serving(scenario)
        if current is not None and current.get("kind") not in ("harness", "composite"):
            raise Conflict(f"scenario {scenario!r} serves trained weights ({current['release_id']}); a scenario "
                           "evolves either its weights or its harness")
        files = self.check_harness(files).files  # refused (400) before anything is written
        meta = {"recipe": (lineage or {}).get("recipe", "manual"),
                "parent": current["release_id"] if current else BASE, **(lineage or {}), "kind": "harness"}
        staged = self._store.folder(scenario) / "candidates" / f".staged-{new_record_id()}"
        try:  # written whole before it becomes a candidate: a failed write leaves no candidate behind
            harness_mod.write_tree(staged, files)
        except OSError as e:
            shutil.rmtree(staged, ignore_errors=True)
            raise ReefError(f"the harness could not be written: {e}") from None
        cid, folder = self.start_candidate(scenario, meta)
        os.replace(staged, folder)
        return self.submit(scenario, cid, selection, scores=scores, serving_scores=serving_scores)

    def rollback(self, scenario: str, release_id: str) -> dict | None:
        """Serve an earlier release (or `base`) again; returns its entry (None for base). The Hub's main moves
        to it."""
        with self._lock:
            rel = self._store.release(scenario, release_id)
            target = rel["release_id"] if rel else BASE
            current = self.serving.get(scenario)
            if self.components(scenario):
                self._serve_composite(scenario, rel)
                self._store.set_serving(scenario, target)
            elif (rel or {}).get("kind") == "harness" or (rel is None and current is not None and current.harness):
                self._store.set_serving(scenario, target)
                self.serving.set(scenario, None if rel is None else Serving(
                    target, (target, self._load(Path(rel["folder"])))))
            else:
                host = self._host("this engine serves no weights of its own (upstream provider)")
                if rel and target not in host.loaded_releases():
                    host.load_release(target, rel["folder"])
                host.route(scenario, target)
                self._store.set_serving(scenario, target)
        if self.hub is not None:
            self.hub.serving(scenario, rel["version"] if rel else None)
        return rel

    def forget(self, scenario: str, attic: Path) -> None:
        """A deleted scenario: nothing of it serves any more (its harness, its weights' route, the releases and
        policies the engine holds for it) and its releases move to `attic` (ReleaseStore.retire), so a scenario
        created again under the name starts from the base, with release ids of its own."""
        with self._lock:
            self.serving.set(scenario, None)
            mine = [k for k in self.engine.loaded_releases() if k.startswith(scenario + ":")] \
                if isinstance(self.engine, ReleaseHost) else []  # its releases and policies (names hold no ':')
            if mine:
                self.engine.route(scenario, BASE)
                for key in mine:
                    self.engine.unload(key)
            self._store.retire(scenario, attic)

    def restore(self, scenarios: set[str]) -> None:
        """After a restart: serve each scenario's serving release again."""
        for name in self._store.scenarios():
            rel = self._store.serving(name)
            if rel is None or name not in scenarios:
                continue
            self._serve_stored(name, rel)

    def follow(self, scenario: str) -> bool:
        """Serve what the index says serves now: in a shared deployment another service released, rolled back or
        promoted (its `release` notice); whether that changed what this process serves."""
        with self._lock:
            rel = self._store.serving(scenario)
            target = rel["release_id"] if rel is not None else BASE
            if self._followed.get(scenario, BASE) == target:
                return False
            self._followed[scenario] = target
            if rel is None:
                self.serving.set(scenario, None)
                if isinstance(self.engine, ReleaseHost):
                    self.engine.route(scenario, BASE)
                return True
            self._serve_stored(scenario, rel)
            return True

    def _serve_stored(self, name: str, rel: dict) -> None:
        """Serve a release the index names (loaded here if this process does not hold it yet)."""
        self._followed[name] = rel["release_id"]
        if rel.get("kind") == "composite":
            self._serve_composite(name, rel)
        elif rel.get("kind") == "harness":
            try:
                tree = self._load(Path(rel["folder"]))
            except BadRequest as e:  # released by an earlier version that did not check it
                log.error("scenario %s: release %s is not served: %s; roll back to another release or publish "
                          "a new one", name, rel["release_id"], e.message)
                return
            self.serving.set(name, Serving(rel["release_id"], (rel["release_id"], tree)))
        elif isinstance(self.engine, ReleaseHost):
            if rel["release_id"] not in self.engine.loaded_releases():
                self.engine.load_release(rel["release_id"], rel["folder"])
            self.engine.route(name, rel["release_id"])

    def _serve_composite(self, scenario: str, rel: dict | None) -> None:
        """Serve a composite release (or, None, the base weights and no harness): every component it names."""
        key = self._weights_key(rel)
        if isinstance(self.engine, ReleaseHost):
            if key != BASE and key not in self.engine.loaded_releases():
                self.engine.load_release(key, rel["folders"]["weights"])
            self.engine.route(scenario, key)
        elif key != BASE:
            raise Conflict("this engine serves no weights of its own (upstream provider)")
        if rel is None:
            self.serving.set(scenario, None)
            return
        folder = rel["folders"].get("harness")
        tree = self._load(Path(folder)) if folder else None
        self.serving.set(scenario, self._serving_of(rel["release_id"], rel["components"], tree, None))

    # ---- on-policy serving between releases (a recipe that samples from its own policy, e.g. TTT) -----------
    def serve_policy(self, scenario: str, key: str, folder: str | Path, previous: str | None = None) -> None:
        """Serve the scenario from weights that are not a release (the policy a loop is training), unloading the
        previous such policy. The index does not change: what serves is a step of the loop, not a release."""
        host = self._host()
        host.load_release(key, folder)
        host.route(scenario, key)
        if previous and previous != key:
            self.drop_policy(previous)

    def drop_policy(self, key: str) -> None:
        try:
            self._host().unload(key)
        except Exception as e:  # noqa: BLE001 - a stale policy costs memory, not correctness
            log.warning("could not unload %s: %s", key, e)

    # ---- the Hub --------------------------------------------------------------------------------------------
    def _queue_hub(self, scenario: str, rel: dict) -> dict:
        if self.hub is None:
            return {}
        self.hub.release(scenario, rel["version"])
        return {"hub_url": f"{self.hub.api.endpoint}/{self.hub.config.repo_for(scenario)}/tree/{rel['version']}"}

    def _hub_state(self, kind: str, scenario: str, version: str | None, **fields) -> None:
        """The Hub publisher's push states, written into the index (its only writer is this module)."""
        if kind == "release":
            rel = self._store.release(scenario, version)
            self._store.update_release(scenario, version, hub={**(rel.get("hub") or {}), **fields})
        else:
            idx = self._store.index(scenario)
            main = {} if fields.get("state") in ("pending", "skipped") else dict(idx.get("hub_main") or {})
            self._store.update_index(scenario, hub_main={**main, **({"version": version} if version else {}),
                                                         **fields})

    def _host(self, why: str | None = None) -> ReleaseHost:
        if not isinstance(self.engine, ReleaseHost):
            raise Conflict(why or "this engine hosts no trained releases (an upstream provider)")
        return self.engine

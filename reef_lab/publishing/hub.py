"""Releases on the Hugging Face Hub: each release of a scenario becomes a tagged commit of a model repo.

Layout of a scenario's repo (one per scenario, `HubConfig.repo` with `{scenario}` filled in): `main` always holds
the serving release (weights as safetensors, config, tokenizer, generation config, and a model card README.md that
says where it came from); each release is the commit tagged `vN`. A rollback is a new commit on `main` with the
older release's files; tags never move. So `hf download <repo> --revision v2` fetches release v2 and
`AutoModelForCausalLM.from_pretrained` loads it.

Publishing goes through `huggingface_hub.HfApi` (HF_ENDPOINT and HF_TOKEN as the client reads them, or the
config's `endpoint`) in one background thread with retries and backoff: it never blocks or breaks serving. Each
release carries its state in the release index (`hub`: pending, pushed with commit and tag, or failed with the
error), which the releases API and /reef/status show; `main`'s state is the index's `hub_main`. The states are
handed to `on_state`, which the releaser (reef_lab.publishing.releaser) writes into the index.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from reef_lab.extras import need
from reef_lab.publishing.releases import BASE, ReleaseStore

log = logging.getLogger("reef_lab.publishing.hub")

_VERSION = re.compile(r"v[1-9][0-9]{0,8}")


def checked_version(version: object) -> str:
    """`version` when it is a release version (v1, v2, ...); it names a staging folder and a Hub tag, so anything
    else (`../x`, a path, a tag of another repo's making) is refused before it is used."""
    if not isinstance(version, str) or _VERSION.fullmatch(version) is None:
        raise ValueError(f"release name {version!r} is not a release version (v1, v2, ...); refused before it names a "
                         "folder or a Hub tag")
    return version


@dataclass
class HubConfig:
    repo: str | None = field(default=None, metadata={
        "help": "Hub model repo per scenario, e.g. 'me/reef-{scenario}' ({scenario} is filled in); none: off"})
    endpoint: str | None = field(default=None, metadata={"help": "Hub URL (default: HF_ENDPOINT or huggingface.co)"})
    private: bool = field(default=False, metadata={"help": "create repos private"})
    retries: int = field(default=5, metadata={"help": "attempts per push before it is marked failed"})
    backoff_s: float = field(default=2.0, metadata={"help": "first wait between attempts (doubles, at most 60 s)"})
    wandb_url: str | None = field(default=None, metadata={"help": "W&B run link for the model card"})

    def __post_init__(self) -> None:
        if self.repo is not None and self.repo.count("/") != 1:
            raise ValueError(f"hub repo must look like 'owner/name' (with {{scenario}} anywhere), got {self.repo!r}")
        if self.repo is not None:  # every scenario name (reef_lab/scenarios.py NEW_NAME_RULE) must make a valid id
            from reef_lab.scenarios import NEW_NAME_MAX

            for sample in ("a", "a" * NEW_NAME_MAX):
                problem = repo_id_problem(self.repo_for(sample))
                if problem:
                    raise ValueError(f"hub repo {self.repo!r} with a scenario name of {len(sample)} characters "
                                     f"gives {self.repo_for(sample)!r}, which the Hub refuses: {problem}")
        if self.retries < 1 or self.backoff_s < 0:
            raise ValueError("retries must be >= 1 and backoff_s >= 0")

    def repo_for(self, scenario: str) -> str:
        return self.repo.replace("{scenario}", scenario)


_REPO_PART = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")


def repo_id_problem(repo_id: str) -> str | None:
    """What the Hub refuses in a repo id (huggingface_hub's validate_repo_id, which is an optional dependency), or
    None."""
    for part in repo_id.split("/"):
        if not _REPO_PART.fullmatch(part):
            return ("each part is 1-96 letters, digits, '_', '.' or '-', starting and ending with a letter, digit "
                    "or '_'")
    if ".." in repo_id or "--" in repo_id:
        return "it may not hold '..' or '--'"
    if repo_id.endswith(".git"):
        return "it may not end in '.git'"
    return None


def harness_card(scenario: str, release: dict) -> str:
    """README.md of a harness release: what it is, and the change request it answers when it came from one."""
    req = release.get("request") or {}
    lines = ["---", yaml.safe_dump({"tags": ["reef_lab", "harness", release.get("recipe") or "manual"]},
                                   sort_keys=False).strip(), "---", "",
             f"# {scenario} {release['version']} (harness)", "",
             f"Harness release `{release['release_id']}` of reef_lab scenario `{scenario}` (parent "
             f"`{release.get('parent')}`, recipe `{release.get('recipe')}`): text files (system prompt, rules, skills, "
             "commands) an agent runs with.", ""]
    if req:
        lines += ["## Change request", "", "> " + str(req.get("text", "")).replace("\n", "\n> "), "",
                  f"Request `{req.get('id')}`; session `{req.get('session')}`; proposer's summary: "
                  f"{req.get('summary')}; verdict: {req.get('verdict')}.", ""]
    lines += [f"Fetch it: `hf download REPO --revision {release['version']}`; install it into an agent: "
              "`reef-lab agent claude install " + release["version"] + "`.", ""]
    return "\n".join(lines)


def model_card(scenario: str, release: dict, base_model: str, wandb_url: str | None) -> str:
    """README.md of a release: where it came from, in the Hub's model-card format (YAML front matter)."""
    if release.get("kind") == "harness":
        return harness_card(scenario, release)
    meta = {"library_name": "transformers", "tags": ["reef_lab", release.get("recipe") or "release"],
            "base_model": base_model}
    ev = release.get("eval") or {}
    records, reports = release.get("records") or [], release.get("reports") or []
    lines = [
        "---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", "",
        f"# {scenario} {release['version']}", "",
        f"Release `{release['release_id']}` of reef_lab scenario `{scenario}`.", "",
        "| | |", "|---|---|",
        f"| base model | {base_model} |",
        f"| recipe | {release.get('recipe')} |",
        f"| parent release | {release.get('parent')} |",
        *([f"| components | {', '.join(f'{k}: {v or BASE}' for k, v in sorted(release['components'].items()))} "
           "(manifest.json; each component in its folder) |"] if release.get("components") else []),
        f"| trainer step | {release.get('trainer_step')} |",
        f"| records consumed | {len(records)} |",
        f"| reports consumed | {len(reports)} |",
        f"| held-out accuracy | {ev.get('accuracy')} ({ev.get('correct')}/{ev.get('n')}) |" if ev else
        "| held-out accuracy | not evaluated |",
        f"| W&B run | {wandb_url} |" if wandb_url else "| W&B run | none |",
        "", "## Recipe config", "", "```yaml", yaml.safe_dump(release.get("config") or {}, sort_keys=True).strip(),
        "```", "", "## Records consumed", "",
        ", ".join(f"`{r}`" for r in records[:50]) + (f" and {len(records) - 50} more" if len(records) > 50 else ""),
        "", "Load it: `AutoModelForCausalLM.from_pretrained(repo, revision=\"" + release["version"] + "\")`.", ""]
    return "\n".join(lines)


class HubPublisher:
    """Pushes releases (and `main` moves) in the background; see the module docstring."""

    def __init__(self, config: HubConfig, releases: ReleaseStore, base_model: str = "unknown"):
        need("hub")
        from huggingface_hub import HfApi

        self.config, self.releases, self.base_model = config, releases, base_model  # the index, read only
        # where push states go: (kind "release" | "main", scenario, version, **fields); the releaser writes them
        # into the index (reef_lab.publishing.releaser), the one module that writes it
        self.on_state = lambda kind, scenario, version, **fields: None
        self.api = HfApi(endpoint=config.endpoint or os.environ.get("HF_ENDPOINT") or None,
                         token=os.environ.get("HF_TOKEN") or None)
        self.links: dict = {}  # scenario -> callable giving its W&B run link, for model cards
        self._jobs: queue.Queue = queue.Queue()
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reef-hub", daemon=True)
        self._thread.start()

    # ---- requests (any thread) --------------------------------------------------------------------------------
    def release(self, scenario: str, version: str) -> None:
        """Queue the push of release `version` (a commit on main, tagged `version`)."""
        checked_version(version)
        self.on_state("release", scenario, version, state="pending", repo=self.config.repo_for(scenario), attempts=0)
        self._jobs.put(("release", scenario, version))

    def serving(self, scenario: str, version: str | None) -> None:
        """Queue moving main to `version`'s files (after a rollback); None (the base weights) is not pushed."""
        if version is None:
            self.on_state("main", scenario, None, state="skipped", reason="base weights serve")
            return
        checked_version(version)
        self.on_state("main", scenario, version, state="pending")
        self._jobs.put(("main", scenario, version))

    @property
    def queued(self) -> int:
        """Pushes queued or running."""
        return self._jobs.unfinished_tasks

    def wait(self, timeout: float = 120.0) -> bool:
        """Block until the queue is empty and no push is running (tests, experiments, shutdown)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.queued == 0:
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(10)

    # ---- the publishing thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                self._attempts(*job)
            finally:
                self._jobs.task_done()

    def _attempts(self, kind: str, scenario: str, version: str) -> None:
        wait = self.config.backoff_s
        for attempt in range(1, self.config.retries + 1):
            try:
                result = self._push(kind, scenario, version)
            except Exception as e:  # noqa: BLE001 - any failure is retried, then recorded; serving never sees it
                error = f"{type(e).__name__}: {e}"
                log.warning("hub push of %s %s (attempt %d/%d) failed: %s", scenario, version, attempt,
                            self.config.retries, error)
                self.on_state(kind, scenario, version, state="failed" if attempt == self.config.retries
                              else "retrying", error=error, attempts=attempt)
                if attempt < self.config.retries:
                    time.sleep(wait)
                    wait = min(60.0, wait * 2)
                continue
            self.on_state(kind, scenario, version, state="pushed", attempts=attempt, error=None, **result)
            return

    def _push(self, kind: str, scenario: str, version: str) -> dict:
        repo = self.config.repo_for(scenario)
        rel = self.releases.release(scenario, checked_version(version))
        self.api.create_repo(repo, repo_type="model", private=self.config.private, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="reef-hub-") as tmp:
            stage = Path(tmp) / checked_version(rel["version"])  # the name the folder and the tag get
            shutil.copytree(rel["folder"], stage)
            link = self.links[scenario]() if scenario in self.links else self.config.wandb_url
            (stage / "README.md").write_text(model_card(scenario, rel, self.base_model, link))
            message = f"release {version}" if kind == "release" else f"serve {version} (rollback)"
            info = self.api.upload_folder(repo_id=repo, folder_path=stage, commit_message=message, revision="main",
                                          delete_patterns="*")
        commit = info.oid
        out = {"repo": repo, "commit": commit, "url": f"{self.api.endpoint}/{repo}/tree/{commit}"}
        if kind == "release":
            self.api.create_tag(repo, tag=version, revision=commit, tag_message=f"reef_lab release {version}",
                                exist_ok=True)
            out["tag"] = version
        return out

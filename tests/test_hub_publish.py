"""Releases published to a Hub repo on loopback through the real huggingface_hub client, pulled back with the real
`hf download` CLI and loaded with transformers; rollback moves main while tags stay; a dead Hub never stops
serving, marks the release failed with the error, and a later push succeeds; a release name that is not a
version never names a folder or a tag."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import requests
from huggingface_hub import HfApi, constants

from reef_lab.engines.base import ChatRequest, SamplingParams
from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.publishing.hub import HubConfig
from reef_lab.tasks.base import make_task
from reef_lab.testing.hub_server import serve_in_thread
from reef_lab.testing.processes import start_server
from tests.conftest import Running

TOKEN = "hub-test-token"
PROMPTS = [it["messages"] for it in make_task().items(3, seed=21)]
SFT = {"batch_size": 2, "mode": "manual", "trainer": {"lr": 3e-3, "micro_batch_size": 2}}


@pytest.fixture(autouse=True)
def online(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)


@pytest.fixture
def hub(tmp_path):
    server, url = serve_in_thread(tmp_path / "hub", token=TOKEN)
    yield server, url
    server.stop()


@pytest.fixture
def live(hub, tiny_model_dir, tmp_path):
    _, url = hub
    gw = Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir)),
                 hub=HubConfig(repo="me/reef-{scenario}", endpoint=url, retries=2, backoff_s=0.2))
    running = Running(gw)
    yield running
    running.stop()


def chat(u, messages):
    r = requests.post(u + "/v1/chat/completions", headers={"x-reef-scenario": "s"}, timeout=60,
                      json={"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    return r


def train_release(u, version):
    for i in range(2):
        r = requests.post(u + "/v1/chat/completions", headers={"x-reef-scenario": "s"}, timeout=60,
                          json={"model": "tiny", "messages": PROMPTS[i], "max_tokens": 6, "seed": i})
        requests.post(u + "/reef/report", headers={"x-reef-scenario": "s"},
                      json={"score": 1.0, "references": [r.headers["x-reef-agent-record-id"]]}).raise_for_status()
    assert requests.post(u + "/reef/train", json={"scenario": "s"}).status_code == 202
    deadline = time.time() + 120
    while time.time() < deadline:
        if requests.get(u + "/reef/scenarios/s/releases").json()["serving"] == f"s:{version}":
            return
        time.sleep(0.1)
    raise AssertionError(f"{version} never served")


def hub_settled(u, gw, releases: int) -> None:
    """Wait until the first `releases` releases have their Hub pushes queued and every push has ended. A learner
    writes a release into the index (it serves) just before it queues the push, so `hub.wait` alone can return in
    between."""
    deadline = time.time() + 60
    while not all("hub" in r for r in requests.get(u + "/reef/scenarios/s/releases").json()["releases"][:releases]):
        assert time.time() < deadline, "a release's Hub push was never queued"
        time.sleep(0.05)
    assert gw.hub.wait(60)


def hf_download(url, revision, dest: Path):
    env = {**os.environ, "HF_ENDPOINT": url, "HF_TOKEN": TOKEN, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1",
           "HF_HOME": str(dest.parent / "hf-home")}
    hf = Path(sys.executable).parent / "hf"
    out = subprocess.run([str(hf), "download", "me/reef-s", "--revision", revision, "--local-dir", str(dest)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return dest


def greedy(engine, release=None, scenario=None):
    return [engine.submit(ChatRequest(p, SamplingParams(max_tokens=8, temperature=0), release=release,
                                      scenario=scenario)).result(60).token_ids for p in PROMPTS]


@pytest.mark.heavy
def test_releases_on_the_hub_download_load_and_rollback(live, hub, tmp_path):
    _, url = hub
    u, gw = live.url, live.gateway
    requests.post(u + "/reef/scenarios", json={"name": "s", "recipe": "sft", "config": SFT}).raise_for_status()
    train_release(u, "v1")
    train_release(u, "v2")
    hub_settled(u, gw, 2)
    rels = requests.get(u + "/reef/scenarios/s/releases").json()
    assert [r["hub"]["state"] for r in rels["releases"]] == ["pushed", "pushed"]
    api = HfApi(endpoint=url, token=TOKEN)
    refs = api.list_repo_refs("me/reef-s")
    tags = {t.name: t.target_commit for t in refs.tags}
    assert tags == {"v1": rels["releases"][0]["hub"]["commit"], "v2": rels["releases"][1]["hub"]["commit"]}
    main = next(b.target_commit for b in refs.branches if b.name == "main")
    assert main == tags["v2"]  # main holds the serving release

    # hf download v2 into an empty folder: transformers loads it, and it answers as the serving v2 does
    folder = hf_download(url, "v2", tmp_path / "v2")
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_pretrained(folder)
    card = (folder / "README.md").read_text()
    assert "base_model:" in card and "| recipe | sft |" in card and "| parent release | s:v1 |" in card
    assert "| records consumed | 2 |" in card
    serving = greedy(gw.engine, scenario="s")
    with EmbeddedEngine.from_path(str(folder)) as pulled:
        assert greedy(pulled) == serving

    # rollback: a new commit on main with v1's files; the tags do not move
    requests.post(u + "/reef/scenarios/s/rollback", json={"release_id": "v1"}).raise_for_status()
    assert gw.hub.wait(60)
    refs = api.list_repo_refs("me/reef-s")
    assert {t.name: t.target_commit for t in refs.tags} == tags
    new_main = next(b.target_commit for b in refs.branches if b.name == "main")
    assert new_main not in tags.values()
    main_files = hf_download(url, "main", tmp_path / "main")
    v1_files = hf_download(url, "v1", tmp_path / "v1")
    assert (main_files / "model.safetensors").read_bytes() == (v1_files / "model.safetensors").read_bytes()
    assert requests.get(u + "/reef/scenarios/s/releases").json()["hub_main"]["state"] == "pushed"


@pytest.mark.heavy
def test_a_dead_hub_never_stops_serving(live, hub, tmp_path):
    server, url = hub
    u, gw = live.url, live.gateway
    requests.post(u + "/reef/scenarios", json={"name": "s", "recipe": "sft", "config": SFT}).raise_for_status()
    port = server.port
    server.stop()
    train_release(u, "v1")  # trains, releases and serves with the Hub gone
    assert chat(u, PROMPTS[0]).headers["x-reef-release-id"] == "s:v1"
    hub_settled(u, gw, 1)
    rel = requests.get(u + "/reef/scenarios/s/releases").json()["releases"][0]
    assert rel["hub"]["state"] == "failed" and rel["hub"]["attempts"] == 2 and rel["hub"]["error"]
    status = requests.get(u + "/reef/status").json()["hub"]["scenarios"]["s"]["releases"]["s:v1"]
    assert status["state"] == "failed" and status["error"] == rel["hub"]["error"]
    restarted, _ = serve_in_thread(tmp_path / "hub", token=TOKEN, port=port)
    try:
        train_release(u, "v2")
        hub_settled(u, gw, 2)
        rel2 = requests.get(u + "/reef/scenarios/s/releases").json()["releases"][1]
        assert rel2["hub"]["state"] == "pushed"
        assert {t.name for t in HfApi(endpoint=url, token=TOKEN).list_repo_refs("me/reef-s").tags} == {"v2"}
    finally:
        restarted.stop()


@pytest.mark.heavy
def test_records_as_datasets_pushed_to_a_dataset_repo(live, hub, tmp_path):
    import datasets
    import polars as pl
    from huggingface_hub import hf_hub_download

    from reef_lab.publishing.export import export_parquet, push_records, scenario_datasets

    _, url = hub
    u, gw = live.url, live.gateway
    requests.post(u + "/reef/scenarios", json={"name": "s", "recipe": "sft", "config": SFT}).raise_for_status()
    train_release(u, "v1")
    chat(u, PROMPTS[2])  # one more inference, never reported
    ds = scenario_datasets(gw.data_dir, "s")
    assert ds["inferences"].num_rows == 3 and ds["reports"].num_rows == 2 and ds["training"].num_rows == 2
    row = ds["training"][0]
    assert row["release_id"] == "s:v1" and row["score"] == 1.0 and row["token_ids"] and len(row["logprobs"]) == len(
        row["token_ids"])
    paths = export_parquet(gw.data_dir, "s", tmp_path / "export")
    assert pl.read_parquet(paths["reports"])["references"].list.len().to_list() == [1, 1]
    pushed = push_records(gw.data_dir, "s", "me/s-records", api=HfApi(endpoint=url, token=TOKEN))
    assert pushed["tag"] == "records-7" and pushed["counts"] == {"inferences": 3, "reports": 2, "training": 2}
    f = hf_hub_download("me/s-records", "training.parquet", repo_type="dataset", revision="records-7",
                        endpoint=url, token=TOKEN, cache_dir=tmp_path / "cache")
    again = datasets.load_dataset("parquet", data_files=f, split="train")
    assert again.num_rows == 2 and set(again["record_id"]) == set(ds["training"]["record_id"])


def test_harness_release_is_a_file_tree_on_the_hub(live, hub, tmp_path):
    _, url = hub
    u, gw = live.url, live.gateway
    files = {"system_prompt.md": "Be brief.", "skills/sum.md": "Add the numbers."}
    r = requests.post(u + "/reef/scenarios/s/harness", json={"files": files})
    assert r.status_code == 201
    assert chat(u, PROMPTS[0]).headers["x-reef-release-id"] == "s:v1"  # the embedded model serves it
    assert gw.hub.wait(60)
    rel = requests.get(u + "/reef/scenarios/s/releases").json()["releases"][0]
    assert rel["kind"] == "harness" and rel["hub"]["state"] == "pushed"
    folder = hf_download(url, "v1", tmp_path / "h1")
    assert (folder / "system_prompt.md").read_text() == "Be brief."
    assert (folder / "skills" / "sum.md").read_text() == "Add the numbers."
    card = (folder / "README.md").read_text()  # a harness card: no weights to load, how to install it instead
    assert "recipe `manual`" in card and "reef-lab agent claude install v1" in card
    assert "from_pretrained" not in card


@pytest.mark.heavy
def test_serve_py_pushes_with_only_the_environment_the_readme_names(hub, tiny_model_dir, tmp_path):
    """`HF_ENDPOINT=... HF_TOKEN=... python scripts/serve.py --hub-repo me/reef-{scenario}`, nothing else set: the
    local model loads without the Hub and each release is pushed (serve.py once forced the Hub client offline)."""
    _, url = hub
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_ENDPOINT=url, HF_TOKEN=TOKEN, HF_HOME=str(tmp_path / "hf-home"))
    srv = start_server("--model-path", str(tiny_model_dir), "--hub-repo", "me/reef-{scenario}", "--log-level",
                       "warning", data_dir=tmp_path / "data", log=tmp_path / "serve.log", base_env=env)
    try:
        u = srv.url
        r = requests.post(u + "/reef/scenarios/s/harness", json={"files": {"system_prompt.md": "Be brief."}})
        assert r.status_code == 201, r.text
        deadline = time.time() + 60
        while True:
            rel = requests.get(u + "/reef/scenarios/s/releases").json()["releases"][0]
            state = (rel.get("hub") or {}).get("state")
            if state in ("pushed", "failed"):
                break
            assert time.time() < deadline, f"the push never ended: {rel}"
            time.sleep(0.1)
        assert state == "pushed", rel["hub"]
        tags = {t.name for t in HfApi(endpoint=url, token=TOKEN).list_repo_refs("me/reef-s").tags}
        assert tags == {"v1"}
        out = subprocess.run([str(Path(sys.executable).parent / "hf"), "download", "me/reef-s", "--revision", "v1",
                              "--local-dir", str(tmp_path / "v1")], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        assert (tmp_path / "v1" / "system_prompt.md").read_text() == "Be brief."
    finally:
        srv.stop()


def test_a_release_name_that_is_not_a_version_never_names_a_folder_or_a_tag(hub, tmp_path):
    """A release index whose version reads `../<x>` (a corrupt or hostile index): the publisher refuses it where the
    name is used (the staging folder inside its temporary directory, the tag), so nothing is written outside."""
    from reef_lab.publishing.hub import HubPublisher
    from reef_lab.publishing.releases import ReleaseStore

    _, url = hub
    releases = ReleaseStore(tmp_path / "data")
    cid, folder = releases.new_candidate("s", {"recipe": "sft"})
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"w")
    releases.publish_candidate("s", cid)
    escape = Path(tempfile.gettempdir()) / f"reef-escape-{uuid.uuid4().hex[:8]}"
    index = releases.index("s")
    index["releases"][0]["version"] = f"../{escape.name}"
    releases._save("s", index)
    pub = HubPublisher(HubConfig(repo="me/reef-{scenario}", endpoint=url, retries=1, backoff_s=0), releases)
    try:
        with pytest.raises(ValueError, match="not a release version"):
            pub.release("s", f"../{escape.name}")
        with pytest.raises(ValueError, match="not a release version"):
            pub.serving("s", f"../{escape.name}")
        with pytest.raises(ValueError, match="not a release version"):  # where it is used, whoever calls
            pub._push("release", "s", f"../{escape.name}")
        assert pub.wait(60)
    finally:
        pub.close()
        written = escape.exists()
        shutil.rmtree(escape, ignore_errors=True)
    assert not written, "the publisher staged a release outside its temporary directory"

"""The loopback Hub server against the real huggingface_hub client and the real `hf` CLI (release publishing).

Each model release is a commit on main plus a tag that never moves; a rollback is a new commit on main with
the old release's files. conftest.py sets HF_HUB_OFFLINE=1 for the session, so these tests switch the client
online for themselves and point every call at the server with `endpoint=` (constants are read at import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import (CommitOperationAdd, CommitOperationDelete, HfApi, constants, hf_hub_download,
                             snapshot_download)
from huggingface_hub.errors import HfHubHTTPError, RevisionNotFoundError

from reef_lab.testing.hub_server import PARENT_MISMATCH_STATUS, serve_in_thread

TOKEN = "hf_reef_test_token"
REPO = "reef/tiny-llama"


@pytest.fixture(autouse=True)
def online(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hub(tmp_path):
    server, _ = serve_in_thread(tmp_path / "hub", token=TOKEN)
    yield server
    server.stop()


@pytest.fixture
def api(hub):
    return HfApi(endpoint=hub.url, token=TOKEN)


def release_folder(path: Path, version: int) -> Path:
    """A small model release: text files, a safetensors-like binary, a nested file that only v1 has."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "release": version}))
    (path / "tokenizer.txt").write_text("same tokenizer in every release\n")
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    weights = bytes(range(version, version + 16))
    (path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + weights + b"\x00\xff")
    if version == 1:
        (path / "notes").mkdir()
        (path / "notes" / "v1.txt").write_text("only in v1\n")
    else:
        (path / "extra.txt").write_text(f"new in v{version}\n")
    return path


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".cache" not in p.relative_to(folder).parts}


@pytest.fixture
def history(api, tmp_path):
    """v1, v2 (both tagged), then main rolled back to v1's content by a third commit."""
    v1, v2 = release_folder(tmp_path / "v1", 1), release_folder(tmp_path / "v2", 2)
    api.create_repo(REPO)
    c1 = api.upload_folder(repo_id=REPO, folder_path=v1, commit_message="release v1", delete_patterns="*")
    api.create_tag(REPO, tag="v1", revision=c1.oid)
    c2 = api.upload_folder(repo_id=REPO, folder_path=v2, commit_message="release v2", delete_patterns="*")
    api.create_tag(REPO, tag="v2", revision=c2.oid)
    c3 = api.upload_folder(repo_id=REPO, folder_path=v1, commit_message="roll back to v1", delete_patterns="*")
    return {"v1": v1, "v2": v2, "c1": c1.oid, "c2": c2.oid, "c3": c3.oid}


def test_create_repo_model_and_dataset(api, hub, tmp_path):
    assert api.whoami()["name"] == "reef"
    url = api.create_repo(REPO)
    assert (url.repo_id, url.repo_type) == (REPO, "model")
    assert api.create_repo(REPO, exist_ok=True).repo_id == REPO  # 409 turned into success by the client
    with pytest.raises(HfHubHTTPError) as err:
        api.create_repo(REPO)
    assert err.value.response.status_code == 409
    ds = api.create_repo("reef/evals", repo_type="dataset", private=True)
    assert ds.repo_type == "dataset"
    info = api.dataset_info("reef/evals")
    assert info.private and len(info.sha) == 40 and [s.rfilename for s in info.siblings] == [".gitattributes"]
    data = tmp_path / "data"
    data.mkdir()
    (data / "scores.jsonl").write_text('{"score": 1}\n')
    (data / "README.md").write_text("---\nlicense: mit\n---\n# evals\n")  # the client validates its YAML first
    api.upload_folder(repo_id="reef/evals", repo_type="dataset", folder_path=data)
    path = hf_hub_download("reef/evals", "scores.jsonl", repo_type="dataset", endpoint=hub.url, token=TOKEN,
                           cache_dir=tmp_path / "cache")
    assert Path(path).read_text() == '{"score": 1}\n'
    assert ("HEAD", "/datasets/reef/evals/resolve/main/scores.jsonl", 200) in hub.app.requests
    api.delete_repo("reef/evals", repo_type="dataset")
    assert not api.repo_exists("reef/evals", repo_type="dataset") and api.repo_exists(REPO)


def test_release_history_refs_and_commits(api, history):
    refs = api.list_repo_refs(REPO)
    assert {t.name: t.target_commit for t in refs.tags} == {"v1": history["c1"], "v2": history["c2"]}
    assert [(b.name, b.target_commit) for b in refs.branches] == [("main", history["c3"])]
    assert history["c3"] not in (history["c1"], history["c2"])  # a rollback is a new commit; tags stay put
    commits = api.list_repo_commits(REPO)
    assert [c.title for c in commits] == ["roll back to v1", "release v2", "release v1", "initial commit"]
    assert [c.commit_id for c in commits[:3]] == [history["c3"], history["c2"], history["c1"]]
    assert commits[0].authors == ["reef"] and commits[0].created_at >= commits[1].created_at
    assert [c.title for c in api.list_repo_commits(REPO, revision="v1")] == ["release v1", "initial commit"]
    v1_files = [".gitattributes", "config.json", "model.safetensors", "notes/v1.txt", "tokenizer.txt"]
    assert sorted(api.list_repo_files(REPO, revision="v1")) == v1_files
    assert sorted(api.list_repo_files(REPO, revision="v2")) == [".gitattributes", "config.json", "extra.txt",
                                                                "model.safetensors", "tokenizer.txt"]
    assert sorted(api.list_repo_files(REPO)) == v1_files
    assert api.model_info(REPO, revision="v2").sha == history["c2"]
    top = {e.path: type(e).__name__ for e in api.list_repo_tree(REPO, revision="v1")}
    assert top["notes"] == "RepoFolder" and top["config.json"] == "RepoFile" and "notes/v1.txt" not in top
    with pytest.raises(RevisionNotFoundError):
        api.list_repo_files(REPO, revision="v3")


def test_hf_hub_download_at_tags_and_commits(hub, history, tmp_path):
    def get(name, revision):
        return Path(hf_hub_download(REPO, name, revision=revision, endpoint=hub.url, token=TOKEN,
                                    cache_dir=tmp_path / "cache")).read_bytes()
    v1, v2 = files_of(history["v1"]), files_of(history["v2"])
    assert v1["model.safetensors"] != v2["model.safetensors"]
    for name in ("config.json", "model.safetensors"):
        assert get(name, "v1") == v1[name]
        assert get(name, "v2") == v2[name]
        assert get(name, "main") == v1[name]  # rolled back
        assert get(name, history["c2"]) == v2[name]
    assert get("notes/v1.txt", "v1") == b"only in v1\n"


def test_snapshot_download_at_v1(hub, history, tmp_path):
    folder = Path(snapshot_download(REPO, revision="v1", endpoint=hub.url, token=TOKEN, cache_dir=tmp_path / "c"))
    assert folder.name == history["c1"]
    got = files_of(folder)
    assert got.pop(".gitattributes").startswith(b"*.safetensors")
    assert got == files_of(history["v1"])


def test_cli_download_v2_into_local_dir(hub, history, tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_TOKEN": TOKEN,
           "HF_HUB_DISABLE_XET": "1", "HF_HOME": str(tmp_path / "hf_home")}
    hf = Path(sys.executable).parent / "hf"
    run = subprocess.run([str(hf), "download", REPO, "--revision", "v2", "--local-dir", str(target)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    got = files_of(target)
    got.pop(".gitattributes")
    assert got == files_of(history["v2"])


def test_parent_commit_mismatch_is_refused(api, history):
    add = CommitOperationAdd(path_in_repo="late.txt", path_or_fileobj=b"late")
    with pytest.raises(HfHubHTTPError) as err:
        api.create_commit(REPO, [add], commit_message="stale", parent_commit=history["c2"])
    assert err.value.response.status_code == PARENT_MISMATCH_STATUS
    assert "A commit has happened since" in str(err.value)
    assert api.list_repo_refs(REPO).branches[0].target_commit == history["c3"]
    ok = api.create_commit(REPO, [CommitOperationAdd(path_in_repo="late.txt", path_or_fileobj=b"late")],
                           commit_message="fresh", parent_commit=history["c3"])
    assert api.model_info(REPO).sha == ok.oid
    api.create_commit(REPO, [CommitOperationDelete("late.txt")], commit_message="drop late.txt")
    assert "late.txt" not in api.list_repo_files(REPO)


def test_concurrent_commits_on_one_parent_exactly_one_wins(api, history):
    def attempt(i: int):
        try:
            return api.create_commit(REPO, [CommitOperationAdd(path_in_repo="race.txt", path_or_fileobj=b"%d" % i)],
                                     commit_message=f"racer {i}", parent_commit=history["c3"]).oid
        except HfHubHTTPError as e:
            return e.response.status_code
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(attempt, range(8)))
    winners = [r for r in results if isinstance(r, str)]
    assert len(winners) == 1 and sorted(r for r in results if isinstance(r, int)) == [PARENT_MISMATCH_STATUS] * 7
    assert api.list_repo_refs(REPO).branches[0].target_commit == winners[0]
    assert api.list_repo_commits(REPO)[1].commit_id == history["c3"]


def test_wrong_or_missing_token_is_401(hub, api):
    api.create_repo(REPO)
    for token in ("hf_wrong", False):
        with pytest.raises(HfHubHTTPError) as err:
            HfApi(endpoint=hub.url, token=token).list_repo_refs(REPO)
        assert err.value.response.status_code == 401
        assert "Invalid credentials" in str(err.value)
    with pytest.raises(HfHubHTTPError) as err:
        HfApi(endpoint=hub.url, token="hf_wrong").whoami()
    assert err.value.response.status_code == 401


def test_fail_next_surfaces_then_retry_succeeds(hub, api, tmp_path):
    api.create_repo(REPO)
    hub.fail_next(1, status=503)
    with pytest.raises(HfHubHTTPError) as err:
        api.create_tag(REPO, tag="v1")
    assert err.value.response.status_code == 503
    api.create_tag(REPO, tag="v1")  # the retry goes through
    with pytest.raises(HfHubHTTPError) as err:
        api.create_tag(REPO, tag="v1")
    assert err.value.response.status_code == 409  # tags never move
    hub.fail_next(1, status=500, match=f"POST /api/models/{REPO}/commit/")
    add = CommitOperationAdd(path_in_repo="a.txt", path_or_fileobj=b"a")
    with pytest.raises(HfHubHTTPError) as err:
        api.create_commit(REPO, [add], commit_message="a")  # create_commit posts the commit once, no retry
    assert err.value.response.status_code == 500
    assert "a.txt" not in api.list_repo_files(REPO)
    api.create_commit(REPO, [CommitOperationAdd(path_in_repo="a.txt", path_or_fileobj=b"a")], commit_message="a")
    assert "a.txt" in api.list_repo_files(REPO)
    hub.fail_next(1, status=503)  # a download's HEAD is retried at once on a 5xx
    path = hf_hub_download(REPO, "a.txt", endpoint=hub.url, token=TOKEN, cache_dir=tmp_path / "cache")
    assert Path(path).read_bytes() == b"a"
    assert [s for m, p, s in hub.app.requests if m == "HEAD"] == [503, 200]


def test_upload_folder_rides_out_one_503(hub, api, tmp_path):
    """upload_folder's preupload and commit calls go through the client's backoff (1 s, then retry)."""
    api.create_repo(REPO)
    hub.fail_next(1, status=503, match=f"POST /api/models/{REPO}/commit/")
    info = api.upload_folder(repo_id=REPO, folder_path=release_folder(tmp_path / "v1", 1))
    assert api.model_info(REPO).sha == info.oid
    assert [s for _, p, s in hub.app.requests if "/commit/" in p] == [503, 200]


def test_restart_on_same_root_keeps_repos(hub, api, history, tmp_path):
    refs_before = api.list_repo_refs(REPO)
    hub.stop()
    with pytest.raises(httpx2.ConnectError):  # nothing answers while it is down
        api.list_repo_refs(REPO)
    again, url = serve_in_thread(tmp_path / "hub", token=TOKEN, port=hub.port)
    try:
        assert url == hub.url
        assert api.list_repo_refs(REPO) == refs_before
        path = hf_hub_download(REPO, "config.json", revision="v2", endpoint=url, token=TOKEN,
                               cache_dir=tmp_path / "cache")
        assert json.loads(Path(path).read_text())["release"] == 2
        api.create_commit(REPO, [CommitOperationAdd(path_in_repo="b.txt", path_or_fileobj=b"b")],
                          commit_message="after restart")
        assert api.list_repo_commits(REPO)[1].commit_id == history["c3"]
    finally:
        again.stop()


def test_branches_with_slashes_and_ref_deletion(hub, api, history, tmp_path):
    api.create_branch(REPO, branch="release/v1", revision="v1")
    assert sorted(api.list_repo_files(REPO, revision="release/v1")) == sorted(api.list_repo_files(REPO,
                                                                                                revision="v1"))
    api.upload_file(repo_id=REPO, path_or_fileobj=b"hotfix", path_in_repo="HOTFIX", revision="release/v1",
                    commit_message="hotfix on the release branch")
    path = hf_hub_download(REPO, "HOTFIX", revision="release/v1", endpoint=hub.url, token=TOKEN,
                           cache_dir=tmp_path / "cache")
    assert Path(path).read_bytes() == b"hotfix"
    assert "HOTFIX" not in api.list_repo_files(REPO) and api.list_repo_refs(REPO).tags[0].target_commit == \
        history["c1"]
    api.delete_branch(REPO, branch="release/v1")
    api.delete_tag(REPO, tag="v2")
    refs = api.list_repo_refs(REPO)
    assert [b.name for b in refs.branches] == ["main"] and [t.name for t in refs.tags] == ["v1"]
    with pytest.raises(HfHubHTTPError):
        api.delete_tag(REPO, tag="v2")
    assert api.list_repo_commits(REPO, revision=history["c2"])[0].title == "release v2"  # commits outlive tags

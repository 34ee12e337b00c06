"""Records as datasets: a scenario's records, reports and training batches as `datasets.Dataset` or Parquet,
optionally pushed as a revision of a Hub dataset repo.

    python scripts/export_records.py --data-dir .reef_lab --scenario my-agent --out exports/my-agent \
        [--push me/my-agent-records]

Three tables per scenario, in the Parquet layout of the store (JSON-valued fields as JSON text, token ids and
logprobs as lists): `inferences`, `reports` (with their references), and `training` (one row per sample a release
consumed: release, record, prompt and completion token ids, the engine's logprobs, score). Only records the API
shows are exported (those of the scenario as it exists now, not of a deleted earlier one of the same name).
Records a retention round evicted are not in an export made after it; an export made before is a copy and stays
as it was (docs/records.md#retention). A push is one commit on the dataset repo's main with the three Parquet files
and a card, tagged `records-<n>` with n the number of records, so every export stays reachable.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import polars as pl

from reef_lab.errors import NotFound
from reef_lab.extras import need
from reef_lab.publishing.releases import ReleaseStore
from reef_lab.records.postgres import PgRecordStore
from reef_lab.records.segments import collect_records
from reef_lab.scenarios import Scenario, shared_scenarios, stored_scenarios

TABLES = ("inferences", "reports", "training")


def scenario_frames(data_dir: str | Path, scenario: str, state=None) -> dict[str, pl.DataFrame]:
    """The three tables of a scenario as polars DataFrames, from a data dir or (`state`: a shared deployment's
    PostgreSQL, reef_lab.state.open_state) from the database every service writes to."""
    data_dir = Path(data_dir)
    stored = stored_scenarios(data_dir) if state is None else shared_scenarios(state)
    found = [d for d in stored or [] if d["name"] == scenario]
    if not found:
        raise NotFound(f"scenario {scenario!r} does not exist in {data_dir if state is None else state.where}")
    born = Scenario(**found[0]).since
    # one read of the records, so inferences and reports come from the same view (a retention round may run)
    if state is None:
        records = collect_records(data_dir, lambda lf: lf.filter((pl.col("scenario") == scenario)
                                                                 & (pl.col("stored_at") >= born)).sort("created_at"))
    else:
        records = PgRecordStore(state).frame(scenario, born).sort("created_at")
    inferences = records.filter(pl.col("kind") == "inference")
    reports = records.filter(pl.col("kind") == "report")
    rows = []
    for rel in ReleaseStore(data_dir, state).index(scenario)["releases"]:
        for rid in rel.get("records") or []:
            rows.append({"release_id": rel["release_id"], "record_id": rid})
    consumed = pl.DataFrame(rows, schema={"release_id": pl.String, "record_id": pl.String})
    score = (reports.select("references", "score").explode("references")
             .group_by("references").agg(pl.col("score").last()).rename({"references": "record_id"}))
    training = (consumed
                .join(inferences.select(pl.col("id").alias("record_id"), "prompt_token_ids", "token_ids",
                                        "logprobs", pl.col("release_id").alias("rollout_release_id")),
                      on="record_id", how="left")
                .join(score, on="record_id", how="left"))
    return {"inferences": inferences, "reports": reports, "training": training}


def scenario_datasets(data_dir: str | Path, scenario: str, state=None):
    """The three tables as `datasets.Dataset`s (a DatasetDict)."""
    need("tasks", "records as datasets")
    import datasets

    return datasets.DatasetDict({k: datasets.Dataset.from_polars(v)
                                 for k, v in scenario_frames(data_dir, scenario, state).items()})


def export_parquet(data_dir: str | Path, scenario: str, out_dir: str | Path, state=None) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    frames = scenario_frames(data_dir, scenario, state)
    for name, frame in frames.items():
        paths[name] = out / f"{name}.parquet"
        frame.write_parquet(paths[name])
    counts = {k: v.height for k, v in frames.items()}
    (out / "README.md").write_text(_card(scenario, counts))
    (out / "export.json").write_bytes(orjson.dumps({"scenario": scenario, "exported_at": time.time(),
                                                    "counts": counts}, option=orjson.OPT_INDENT_2))
    return paths


def push_records(data_dir: str | Path, scenario: str, repo_id: str, api=None, private: bool = False,
                 state=None) -> dict:
    """Export and push as one commit on the dataset repo's main, tagged records-<n>. Returns commit and tag."""
    import tempfile

    need("hub")
    from huggingface_hub import HfApi

    api = api or HfApi()
    with tempfile.TemporaryDirectory(prefix="reef-export-") as tmp:
        export_parquet(data_dir, scenario, tmp, state)
        counts = orjson.loads((Path(tmp) / "export.json").read_bytes())["counts"]
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, repo_type="dataset", folder_path=tmp,
                                 commit_message=f"records of {scenario}: {counts}")
    tag = f"records-{sum(counts.values())}"
    api.create_tag(repo_id, repo_type="dataset", tag=tag, revision=info.oid, exist_ok=True)
    return {"repo": repo_id, "commit": info.oid, "tag": tag, "counts": counts}


def _card(scenario: str, counts: dict) -> str:
    configs = "\n".join(f"- config_name: {k}\n  data_files: {k}.parquet" for k in TABLES)
    return (f"---\nconfigs:\n{configs}\ntags:\n- reef_lab\n---\n\n# Records of reef_lab scenario `{scenario}`\n\n"
            + "\n".join(f"- `{k}`: {v} rows" for k, v in counts.items())
            + "\n\nLoad: `datasets.load_dataset(repo, 'inferences')` (or 'reports', 'training').\n")

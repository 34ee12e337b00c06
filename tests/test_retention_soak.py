"""Retention under the soak's load: the real server (scripts/serve.py, a primary and a relay worker in front of the
stub provider) with small segments and tight limits, driven by scripts/bench/soak.py, which reads back every acknowledged
record that is still stored and the eviction counts of /reef/status (docs/records.md#retention)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Minutes of load each: not in the default run (.ci/run runs `pytest -m heavy`).
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[1]


def soak(tmp_path, *flags) -> dict:
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "scripts/bench/soak.py", "--warmup-minutes", "0", "--minutes", "1.5", "--rate", "120",
                        "--reads", "50", "--roll-records", "1000", "--out", str(out), *flags], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads((out / "soak.json").read_text())
    assert r["errors"] == 0, r["error_kinds"]
    ret = r["retention"]
    ev = ret["evicted"]
    # every acknowledged record is either stored or counted as evicted, and each evicted segment was logged once
    assert ret["stored"] + ev["records"] == ret["acknowledged"] > 5000
    assert ret["log_lines"] == ev["segments"] + ev["rewritten"] and ev["segments"] >= 3
    assert ret["by_scenario"]["soak"]["records"] == ev["records"]
    return ret


def test_the_newest_and_the_young_records_all_stay(tmp_path):
    ret = soak(tmp_path, "--retain-max-records", "4000", "--retain-max-age", "60s")
    assert ret["n_missing"] == 0, ret["missing"]
    assert ret["must_keep"] >= 2000  # the check covered real numbers of records


def test_the_records_stay_under_the_size_limit(tmp_path):
    # The soak's records compress about 20x in Parquet: a log of 1,000 (JSON, with 1 MB written ahead) is about
    # 2 MB, its segment about 60 KB; two workers keep two logs open.
    ret = soak(tmp_path, "--retain-max-bytes", "3MB")
    cap, final = ret["cap_bytes"], ret["final_size"]
    unit = max(ret["max_segment_bytes"], ret["max_log_bytes"])  # what one worker's straddling piece can be
    # after the last round (the load is over): less than one segment or log per worker over the limit
    assert final["total"] < cap + 2 * unit, final
    # and not far under it: a round keeps at least the limit as the disk holds it then; only the logs rolled since
    # (two at most, one per worker) shrank
    assert final["total"] >= cap - 2 * ret["max_log_bytes"], final
    # while the load ran, also what the logs gained between rounds (a round follows every roll)
    assert ret["max_over_cap_bytes"] < 2 * unit + 2 * ret["max_log_bytes"], ret

"""Export a scenario's records, reports and training batches as Parquet (and push them to a Hub dataset repo).

    python scripts/export_records.py --data-dir .reef_lab --scenario my-agent --out exports/my-agent
    python scripts/export_records.py --state postgresql://reef@db:5432/reef --scenario my-agent --out exports/x
    HF_ENDPOINT=... HF_TOKEN=... python scripts/export_records.py --scenario my-agent --push me/my-agent-records
"""

from __future__ import annotations

import argparse
import json


from reef_lab.publishing.export import export_parquet, push_records  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="./.reef_lab")
    p.add_argument("--state", help="a shared deployment's PostgreSQL URL (postgresql://user@host:port/db): its "
                                   "records, scenarios and releases instead of the data dir's")
    p.add_argument("--scenario", required=True)
    p.add_argument("--out", help="folder for the Parquet files")
    p.add_argument("--push", metavar="REPO", help="push to this Hub dataset repo (HF_ENDPOINT, HF_TOKEN)")
    args = p.parse_args()
    if not args.out and not args.push:
        p.error("give --out, --push or both")
    state = None
    if args.state:
        from reef_lab.state import check_spec, open_state

        state = open_state(check_spec(args.state), "export")
    try:
        if args.out:
            for name, path in export_parquet(args.data_dir, args.scenario, args.out, state).items():
                print(f"{name}: {path}")
        if args.push:
            print(json.dumps(push_records(args.data_dir, args.scenario, args.push, state=state), indent=2))
    finally:
        if state is not None:
            state.close()


if __name__ == "__main__":
    main()

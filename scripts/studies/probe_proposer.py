"""Can a model be the change-request proposer? Ask it the proposer prompt for a few requests and check its answers.

    .venv/bin/python scripts/studies/probe_proposer.py                       # the embedded SmolLM2-135M (the default)
    .venv/bin/python scripts/studies/probe_proposer.py --base-url URL --model M   # any OpenAI-compatible endpoint

For each request: the answer (cut), the seconds it took, and whether it is a mutation list reef_lab would accept
(reef_lab/harness/change_requests.py: json_object, apply_mutations). docs/harness.md quotes what SmolLM2 answered.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from reef_lab.engines.lm import make_lm
from reef_lab.harness.change_requests import RequestConfig, Rejected, apply_mutations, json_object, proposer_messages

HARNESS = {"system_prompt.md": "You are a careful engineer.", "rules.md": "- Run the tests before you stop.\n"}
REQUESTS = ["Always add a CHANGELOG entry when you change behaviour", "Add a skill for writing commit messages",
            "Stop using emojis in answers"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="an OpenAI-compatible endpoint (default: the embedded SmolLM2)")
    ap.add_argument("--model", help="its model name")
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("-n", type=int, default=len(REQUESTS), help="how many of the requests to ask")
    a = ap.parse_args()
    engine = None
    if a.base_url:
        lm = make_lm({"kind": "openai", "base_url": a.base_url, "model": a.model})
    else:
        from reef_lab.engines.embedded import EmbeddedEngine

        engine = EmbeddedEngine.from_path()
        lm = make_lm({"kind": "engine"}, engine)
    try:
        for text in REQUESTS[:a.n]:
            t0 = time.perf_counter()
            answer = lm.complete(proposer_messages({"text": text}, HARNESS, "s:v1", ""), max_tokens=a.max_tokens,
                                 temperature=0.0)
            try:
                apply_mutations(HARNESS, json_object(answer, "proposer").get("mutations"), RequestConfig())
                verdict = "usable"
            except Rejected as e:
                verdict = f"rejected: {e}"
            print(json.dumps({"request": text, "seconds": round(time.perf_counter() - t0, 1),
                              "answer": answer[:300], "verdict": verdict[:200]}), flush=True)
    finally:
        if engine is not None:
            engine.close()


if __name__ == "__main__":
    main()
